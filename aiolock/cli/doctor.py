"""``aiolock doctor``: check a deployment against what aiolock needs and promises.

It connects as an application would (``--url``: a server or any node of a
cluster, as ``aiolock ls`` does, ``ops_connect``; or ``--sentinel HOST:PORT
--service NAME``: the master the Sentinels name), reads each master and the
Sentinels (``INFO``, ``CONFIG GET``, ``CLUSTER INFO``, ``SENTINEL ...``,
``ACL WHOAMI`` / ``ACL DRYRUN``, timed ``PING``\\ s) and tries what aiolock
does (``SCRIPT LOAD`` and ``EVALSHA`` of a one-line script on a key under the
prefix, a script that publishes on a channel under it, ``FCALL``, ``WAIT 0
0``). It writes no key: the probes leave two one-line scripts in the script
cache and publish one empty message on ``<prefix>:{aiolock-doctor}:ch``.
What it reads is ``doctor_facts``'s vocabulary, the judgement ``doctor_checks``'s.

Output: one line per check (``ok   name  detail``), then what the deployment
promises; ``--json``: ``{"checks": [{"name", "status", "detail"}],
"verdict"}``. Exit status 1 when a check fails (a server that cannot be
reached is the failed check ``connect``), else 0; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import sys
import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, NoScriptError, RedisError, ResponseError

from aiolock._core.errors import clause
from aiolock._core.protocol.functions import library_text
from aiolock._core.protocol.scripts import load_scripts
from aiolock.cli.doctor_checks import merge, node_checks, promise, sentinel_check, verdict
from aiolock.cli.doctor_facts import (
    Check,
    NodeFacts,
    Reply,
    SentinelFacts,
    Settings,
    acl_probes,
)
from aiolock.cli.ops_connect import OpsError, Server, Target, arun, connection_options

__all__ = ["DEFAULT_LEASE", "add_arguments", "run"]

#: The Client's default lease (``Client(lease=30.0)``), which --lease defaults to.
DEFAULT_LEASE = 30.0
PINGS = 9
_PROBE = "return 1"
_TAG = "aiolock-doctor"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def add_arguments(sub: Any) -> None:
    """Add the ``doctor`` subcommand to ``sub``."""
    doctor = sub.add_parser(
        "doctor",
        parents=[connection_options()],
        help="check a deployment against what aiolock needs and promises",
        description="Check the server(s) as an application connects: version and "
        "capabilities (scripts, Functions, PUBLISH in scripts, sharded pub/sub, WAIT, "
        "cluster), maxmemory-policy, persistence, replicas, Sentinel quorum, PING latency "
        "against the lease, and the ACL user's permission for every command aiolock "
        "sends. Writes no key. Exits 1 if a check fails.",
    )
    doctor.add_argument("--json", action="store_true", help='print {"checks": [...], "verdict"}')
    doctor.add_argument(
        "--lease",
        type=_positive,
        default=DEFAULT_LEASE,
        help=f"the Clients' lease, s, to judge latency by (default: {DEFAULT_LEASE:g})",
    )
    doctor.add_argument(
        "--sentinel",
        type=_address,
        action="append",
        metavar="HOST:PORT",
        help="connect through these Sentinels (repeat for each) to --service's master; "
        "--url then gives only the master's user, password and TLS",
    )
    doctor.add_argument(
        "--service", default="mymaster", help="the Sentinels' service (default: mymaster)"
    )


# --------------------------------------------------------------------------- reading


async def _ask(call: Awaitable[Any]) -> Reply:
    """A command's reply as a ``Reply``; connection failures propagate."""
    try:
        return Reply("ok", await call)
    except NoPermissionError as exc:
        return Reply("refused", detail=str(exc))
    except NoScriptError as exc:  # (redis-py drops the code from the text)
        return Reply("error", detail=f"NOSCRIPT {exc}")
    except ResponseError as exc:
        text = str(exc)
        if text.lower().startswith(("unknown command", "unknown subcommand")):
            return Reply("missing", detail=text)
        return Reply("error", detail=text)


def _command(conn: Any, *args: Any) -> Awaitable[Any]:
    """``conn.execute_command(*args)``, which redis-py leaves untyped."""
    return conn.execute_command(*args)  # type: ignore[no-any-return]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _libraries(reply: Any) -> list[str]:
    """The library names in a FUNCTION LIST reply (RESP2 lists or RESP3 maps)."""
    names = []
    for entry in reply or []:
        if isinstance(entry, dict):
            names.append(_text(entry.get("library_name", entry.get(b"library_name", ""))))
        elif isinstance(entry, list | tuple):
            fields = [_text(x) if isinstance(x, bytes | str) else x for x in entry]
            if "library_name" in fields:
                names.append(str(fields[fields.index("library_name") + 1]))
    return names


def _fields(reply: Any) -> dict[str, Any]:
    """A flat ``[field, value, ...]`` reply (or a map, or ``a:b`` lines) as a dict."""
    if isinstance(reply, dict):
        return {_text(k): v for k, v in reply.items()}
    if isinstance(reply, str | bytes):
        lines = (line.partition(":") for line in _text(reply).splitlines())
        return {k: v.strip() for k, _, v in lines if k}
    items = list(reply or [])
    return {_text(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


async def _read_node(
    node: aioredis.Redis, address: str, tag: str, prefix: str, settings: Settings
) -> NodeFacts:
    key, channel = f"{prefix}:{{{tag}}}", f"{prefix}:{{{tag}}}:ch"
    info: dict[str, Any] = {}
    info_reply = Reply("ok", info)
    for section in ("server", "memory", "persistence", "replication", "cluster"):
        reply = await _ask(node.info(section))
        if not reply.ok:
            info_reply = reply
            break
        info.update(reply.value)
    config = await _ask(node.config_get("*"))
    pings: list[float] = []
    for _ in range(PINGS):
        started = time.perf_counter()
        await node.ping()
        pings.append((time.perf_counter() - started) * 1000)
    script_load = await _ask(node.script_load(_PROBE))
    evalsha = await _ask(node.evalsha(hashlib.sha1(_PROBE.encode()).hexdigest(), 1, key))
    if evalsha.outcome == "error" and "NOSCRIPT" in evalsha.detail:
        evalsha = Reply("ok", detail="NOSCRIPT")  # permitted; the script was not loaded
    publish = Reply("error", detail="not tried: scripts refused")
    if script_load.ok and evalsha.ok:
        command = "SPUBLISH" if settings.cluster else "PUBLISH"
        loaded = await _ask(node.script_load(f"return redis.call('{command}', ARGV[1], '')"))
        publish = await _ask(node.evalsha(loaded.value, 1, key, channel)) if loaded.ok else loaded
    fcall = await _ask(_command(node, "FCALL", "aiolock_doctor_absent", 1, key))
    if fcall.outcome == "error" and "not found" in fcall.detail.lower():
        fcall = Reply("ok", detail="permitted")
    # (a library without functions is refused either way: nothing is loaded)
    function_load = await _ask(
        _command(node, "FUNCTION", "LOAD", "#!lua name=aiolock_doctor_probe\n")
    )
    if function_load.outcome == "error":
        function_load = Reply("ok", detail="permitted")
    functions = await _ask(_command(node, "FUNCTION", "LIST"))
    if functions.ok:
        functions = Reply("ok", _libraries(functions.value))
    wait = await _ask(_command(node, "WAIT", 0, 0))
    cluster_info = None
    if settings.cluster:
        cluster_info = await _ask(_command(node, "CLUSTER", "INFO"))
        if cluster_info.ok:
            cluster_info = Reply("ok", _fields(cluster_info.value))
    whoami = await _ask(_command(node, "ACL", "WHOAMI"))
    facts = NodeFacts(
        address, info_reply, config, pings, script_load, evalsha, publish, fcall,
        function_load, functions, wait, cluster_info, whoami,
    )  # fmt: skip
    if not whoami.ok:
        facts.dryrun_error = f"ACL WHOAMI: {whoami.detail or whoami.outcome}"
        return facts
    user = _text(whoami.value)
    first = await _ask(_command(node, "ACL", "DRYRUN", user, "PING"))
    if not first.ok:
        facts.dryrun_error = f"ACL DRYRUN {first.outcome}: {first.detail}"
        return facts
    probes = acl_probes(settings)
    pipe = node.pipeline(transaction=False)
    for probe in probes:
        args = [key if a == "K" else channel if a == "C" else a for a in probe.args]
        _command(pipe, "ACL", "DRYRUN", user, probe.name, *args)
    replies = await pipe.execute(raise_on_error=False)
    facts.dryrun = {
        probe.name: Reply("error", detail=str(r)) if isinstance(r, Exception) else Reply("ok", r)
        for probe, r in zip(probes, replies, strict=True)
    }
    return facts


def _tags(server: Server) -> list[str]:
    """A hash tag per node that the node serves (a cluster's masters each own
    some slots): the probes' key must live on the node they run on."""
    if server.slots is None:
        return [_TAG]
    wanted = {f"{host}:{port}": i for i, (host, port) in enumerate(server.addresses)}
    tags = [_TAG] * len(server.nodes)
    found: set[int] = set()
    for n in range(100_000):
        tag = f"{_TAG}-{n}"
        node = server.slots.get_node_from_key(f"{{{tag}}}")
        i = wanted.get(node.name) if node is not None else None
        if i is not None and i not in found:
            found.add(i)
            tags[i] = tag
            if len(found) == len(tags):
                break
    return tags


async def _read_sentinels(
    target: Target, sentinels: list[tuple[str, int]], service: str
) -> list[SentinelFacts]:
    out = []
    for host, port in sentinels:
        conn = aioredis.Redis(host=host, port=port, decode_responses=True, **target.kwargs)
        try:
            try:
                master = await _ask(_command(conn, "SENTINEL", "get-master-addr-by-name", service))
            except (RedisError, OSError) as exc:  # (ResponseError: _ask's)
                lost = Reply("error", detail=f"cannot connect: {clause(exc)}")
                out.append(SentinelFacts(f"{host}:{port}", lost, lost, lost))
                continue
            if master.ok and not master.value:
                master = Reply("error", detail=f"no service {service!r}")
            elif master.ok:
                master = Reply("ok", (_text(master.value[0]), int(master.value[1])))
            quorum = await _ask(_command(conn, "SENTINEL", "CKQUORUM", service))
            state = await _ask(_command(conn, "SENTINEL", "MASTER", service))
            if state.ok:
                state = Reply("ok", _fields(state.value))
            out.append(SentinelFacts(f"{host}:{port}", master, quorum, state))
        finally:
            await conn.aclose()
    return out


async def _examine(args: argparse.Namespace, target: Target, checks: list[Check]) -> str:
    """Append the checks to ``checks`` (kept if connecting then fails); the promise."""
    if args.sentinel:
        sentinels = await _read_sentinels(target, args.sentinel, args.service)
        named = next((s.master.value for s in sentinels if s.master.ok), None)
        if named is None:
            why = "; ".join(f"{s.address}: {s.master.detail}" for s in sentinels)
            checks.append(Check("sentinel", "fail", f"no Sentinel named the master ({why})"))
            return ""
        target = replace(target, url=target.node_url(*named), cluster=False)
        checks.append(sentinel_check(sentinels, f"{named[0]}:{named[1]}"))
    server = await Server.open(target)
    try:
        library = library_text(load_scripts(cluster=server.cluster)).name
        settings = Settings(args.lease, server.cluster, bool(args.sentinel), library)
        if server.cluster:
            addresses = [f"{host}:{port}" for host, port in server.addresses]
        else:
            parts = urlsplit(target.url)
            addresses = [f"{parts.hostname}:{parts.port or 6379}"]
        facts = await asyncio.gather(
            *(
                _read_node(node, address, tag, target.prefix, settings)
                for node, address, tag in zip(server.nodes, addresses, _tags(server), strict=True)
            )
        )
    finally:
        await server.aclose()
    per_node = {f.address: node_checks(f, settings) for f in facts}
    checks.extend(merge(per_node))
    return promise(checks, facts, settings)


# --------------------------------------------------------------------------- command


def run(args: argparse.Namespace) -> int:
    """``aiolock doctor``: print the checks; 1 if one failed, else 0 (2: usage)."""
    try:
        target = Target.of(args)
    except OpsError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    checks: list[Check] = []
    try:
        statement = arun(lambda: _examine(args, target, checks), target)
    except OpsError as exc:
        checks.append(Check("connect", "fail", str(exc).removeprefix("aiolock: ")))
        statement = ""
    except KeyboardInterrupt:
        return 130
    result = verdict(checks)
    if args.json:
        doc = {"checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in checks]}
        print(json.dumps({**doc, "verdict": result}, indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{c.status:<5}{c.name:<{width}}  {c.detail}")
        print()
        print(statement or "Nothing is promised: the deployment could not be checked.")
    return 1 if result == "fail" else 0
