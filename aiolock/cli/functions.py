"""``aiolock functions load --url URL``: load aiolock's Functions library, as an operator.

A Client with ``scripting="functions"`` (or ``"auto"`` where the ACL forbids
EVAL) loads its library itself the first time a server lacks it. A Redis
user that may only ``FCALL`` cannot: an operator runs this once per server
(and again after a ``FUNCTION FLUSH`` or a restart without persistence).

It loads the library of *this* aiolock version (its name carries the version
and a digest of its text, as the Clients of this version call it: the
standalone text on a server, the cluster text on every master of a cluster),
with ``FUNCTION LOAD`` without ``REPLACE``: a library already there is left
as it is (success), another version's library is never touched. It prints the
library's name and, per server, ``loaded`` or ``already loaded``.

Exit codes: 0 loaded (or already there) everywhere; 2 a usage, connection
or server error, reported in one line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from aiolock._core.errors import clause
from aiolock._core.protocol.functions import library_text
from aiolock._core.protocol.scripts import load_scripts

__all__ = ["add_arguments", "load", "run"]

_DEFAULT_URL = "redis://localhost:6379"


def add_arguments(sub: Any) -> None:
    """Add ``functions load`` to the ``aiolock`` command's subcommands ``sub``."""
    functions = sub.add_parser(
        "functions",
        help="load aiolock's Redis Functions library (for users that may only FCALL)",
        description="Manage aiolock's Redis Functions library (scripting='functions').",
    )
    actions = functions.add_subparsers(dest="action", metavar="ACTION")
    load_cmd = actions.add_parser(
        "load",
        help="load this aiolock version's library on the server (every master of a cluster)",
        description="Load this aiolock version's Functions library with FUNCTION LOAD "
        "(never REPLACE: a library already there is success, another version's is left "
        "alone). Prints the library's name. Run it once per server as a user that may "
        "FUNCTION LOAD; then Clients whose user may only FCALL work.",
    )
    load_cmd.add_argument(
        "--url",
        default=None,
        help=f"the server, or any node of a cluster (default: $REDIS_URL, else {_DEFAULT_URL})",
    )
    load_cmd.add_argument(
        "--cluster",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the URL is a Redis Cluster node: load on every master (default: ask the "
        "server, INFO cluster)",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``aiolock functions ...``; the exit status."""
    if getattr(args, "action", None) != "load":
        print("usage: aiolock functions load [--url URL]", file=sys.stderr)
        return 2
    url = args.url or os.environ.get("REDIS_URL") or _DEFAULT_URL
    try:
        name, done = asyncio.run(load(url, args.cluster))
    except (RedisError, RedisClusterException, OSError, ValueError) as exc:
        print(f"aiolock functions load: {clause(exc)}", file=sys.stderr)
        return 2
    print(name)
    for node, what in done:
        print(f"  {node}: {what}")
    return 0


async def load(url: str, cluster: bool | None = None) -> tuple[str, list[tuple[str, str]]]:
    """Load the library on ``url``'s server (every master of a cluster).
    Returns its name and, per server, ``"loaded"`` or ``"already loaded"``."""
    if cluster is None:
        probe = aioredis.Redis.from_url(url)
        try:
            info = await probe.info("cluster")
        finally:
            await probe.aclose()
        cluster = bool(info.get("cluster_enabled"))
    text = library_text(load_scripts(cluster=cluster))
    done: list[tuple[str, str]] = []
    if not cluster:
        redis = aioredis.Redis.from_url(url)
        try:
            pool = redis.connection_pool.connection_kwargs
            done.append(
                (
                    f"{pool.get('host', '?')}:{pool.get('port', '?')}",
                    await _load(redis, text.source),
                )
            )
        finally:
            await redis.aclose()
        return text.name, done
    nodes = RedisCluster.from_url(url)
    try:
        await nodes.initialize()
        for node in nodes.get_primaries():
            done.append((node.name, await _load(nodes, text.source, node)))
    finally:
        await nodes.aclose()
    return text.name, done


async def _load(redis: aioredis.Redis | RedisCluster, source: str, node: Any = None) -> str:
    """``FUNCTION LOAD`` (without ``REPLACE``) on ``redis`` (``node`` of a cluster)."""
    extra = {} if node is None else {"target_nodes": node}
    try:
        await redis.execute_command("FUNCTION", "LOAD", source, **extra)
    except ResponseError as exc:
        if "already exists" in str(exc):
            return "already loaded"
        raise
    return "loaded"
