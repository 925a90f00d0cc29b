"""The operator commands: ``aiolock ls | inspect | top | force-release``.

They read what aiolock keeps in Redis (``SCAN``, then per name one pipelined
round trip of ``TYPE`` / ``PTTL`` / ``HGETALL`` / ``ZRANGE`` / ``LRANGE`` /
``GET`` and the server's ``TIME``; never ``KEYS``, never a write), describe
it (``aiolock.cli.ops_state``) and print it as text or JSON. In a Redis
Cluster every master is scanned. Only ``force-release`` writes, through the
library's own force-release of the kind it found (the kind's declared
``Release``: ``client.lock(name)``, ``client.fair_lock(name)``,
``client.rw_lock(name)``, ``client.semaphore(name, n)``), which keeps the
fencing counter (and a semaphore's N) and wakes the waiters. What a kind
keeps, how it reads and how it is worded come from its declaration
(``aiolock._core.protocol.kinds``, ``aiolock._primitives.KINDS``): no code here
names a kind.

Exit codes: 0 done; 1 nothing found or nothing done (``inspect`` of an
unknown name, ``force-release`` of a name nobody holds, or declined); 2 a
usage or connection error, reported in one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from aiolock.cli.ops_connect import (
    OpsError,
    Server,
    Target,
    arun,
    connection_options,
    with_server,
)
from aiolock.cli.ops_explain import explain, primitive_json, state_json, table, told
from aiolock.cli.ops_state import NameState, Primitive
from aiolock.cli.ops_text import holder_text, latch_text, ls_rows, waiting_legend

# Server, Target and state_json are imported from here by the tests (their
# home is ops_connect and ops_explain).
__all__ = ["OpsError", "Server", "Target", "add_arguments", "run", "state_json"]


# --------------------------------------------------------------------------- arguments


def add_arguments(sub: Any) -> None:
    """Add the ``ls``, ``inspect``, ``top`` and ``force-release`` subcommands to ``sub``."""
    common = connection_options()

    ls = sub.add_parser(
        "ls",
        parents=[common],
        help="list held and contended locks of every kind",
        description="List the held and contended primitives of every kind (lock, spin lock, "
        "fair lock, read-write lock, semaphore, counting latch, this server's Redlock keys) "
        "whose name matches PATTERN: holder (<client id>:<task serial>), holds, time "
        "left, fencing token, waiters. Found with SCAN, never KEYS.",
    )
    ls.add_argument("pattern", nargs="?", default="*", metavar="PATTERN", help="glob on the name")
    ls.add_argument("--all", action="store_true", help="also list free primitives")
    ls.add_argument("--json", action="store_true", help="print JSON (fields: see README)")
    ls.add_argument("--count", type=int, default=500, help="SCAN COUNT hint (default: 500)")

    inspect = sub.add_parser(
        "inspect",
        parents=[common],
        help="explain everything aiolock keeps for one name",
        description="Read every key aiolock keeps for NAME (main key, fencing counter, "
        "queues, waiting sets, semaphore holders, Redlock keys) and explain it. "
        "Exits 1 if there is none.",
    )
    inspect.add_argument("name", metavar="NAME")
    inspect.add_argument("--json", action="store_true", help="print JSON (fields: see README)")

    top = sub.add_parser(
        "top",
        parents=[common],
        help="a live view of held and contended locks",
        description="Refresh the list of held and contended locks every --interval "
        "seconds: a live table on a terminal (with rich), plain lines otherwise. "
        "Ctrl-C quits.",
    )
    top.add_argument("pattern", nargs="?", default="*", metavar="PATTERN", help="glob on the name")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--iterations", type=int, default=None, help="stop after N refreshes")
    top.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    top.add_argument("--count", type=int, default=500, help="SCAN COUNT hint (default: 500)")

    force = sub.add_parser(
        "force-release",
        parents=[common],
        help="release a lock whoever holds it (asks first)",
        description="Force-release the lock, fair lock, read-write lock or semaphore NAME "
        "through the library (every holder is evicted; the fencing counter and a "
        "semaphore's N are kept, waiters are woken; the holders' watchdogs report "
        "LockLostError). Asks for confirmation unless --yes. Exits 1 if nothing "
        "is held or the answer is not yes.",
    )
    force.add_argument("name", metavar="NAME")
    force.add_argument("-y", "--yes", action="store_true", help="do not ask")


# --------------------------------------------------------------------------- commands


def run(args: argparse.Namespace) -> int:
    """Run the subcommand ``args.command``; the exit code (see the module docstring)."""
    try:
        target = Target.of(args)
        if args.command == "ls":
            return _ls(args, target)
        if args.command == "inspect":
            return _inspect(args, target)
        if args.command == "top":
            return _top(args, target)
        return _force_release(args, target)
    except OpsError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code


def _listed(states: list[NameState], everything: bool) -> list[Primitive]:
    return [p for s in states for p in s.primitives if everything or p.active]


def _ls(args: argparse.Namespace, target: Target) -> int:
    async def body(server: Server) -> tuple[list[NameState], bool, int]:
        return await server.collect(args.pattern, args.count), server.cluster, len(server.nodes)

    states, cluster, nodes = arun(lambda: with_server(target, body), target)
    listed = _listed(states, args.all)
    if args.json:
        doc = {
            "prefix": target.prefix,
            "pattern": args.pattern,
            "cluster": cluster,
            "masters": nodes,
            "locks": [primitive_json(p) for p in listed],
        }
        print(json.dumps(doc, indent=2))
        return 0
    if not listed:
        print(f"no held or contended locks match {args.pattern!r} under prefix {target.prefix!r}")
        return 0
    table([row for p in listed for row in ls_rows(p)], sys.stdout)
    for line in waiting_legend(listed):
        print(line)
    return 0


def _inspect(args: argparse.Namespace, target: Target) -> int:
    async def body(server: Server) -> NameState:
        return await server.state(args.name)

    state = arun(lambda: with_server(target, body), target)
    if args.json:
        print(json.dumps(state_json(state), indent=2))
    else:
        print("\n".join(explain(state)))
    return 0 if state.exists else 1


def _force_release(args: argparse.Namespace, target: Target) -> int:
    name = args.name

    async def look(server: Server) -> tuple[NameState, bool]:
        return await server.state(name), server.cluster

    state, cluster = arun(lambda: with_server(target, look), target)
    held = [p for p in state.primitives if p.held]
    kinds = [p for p in held if p.spec.release is not None]
    others = [p for p in held if p.spec.release is None]
    latches = [p for p in state.primitives if p.counting_down]
    for p in latches:
        words = p.spec.words
        print(
            f"aiolock: {words} {name!r} is {latch_text(p)}; a {words} has no holder to "
            f"force-release ({p.spec.cannot_release})",
            file=sys.stderr,
        )
    for p in others:
        why = p.spec.cannot_release
        print(
            f"aiolock: {p.spec.words} {name!r} is held by {holder_text(p)}, but cannot "
            "be force-released from here" + (f" ({why})" if why else ""),
            file=sys.stderr,
        )
    if not kinds:
        if not others and not latches:
            print(f"no lock named {name!r} is held (prefix {target.prefix!r}); nothing done")
        return 1
    p = kinds[0]
    how = p.spec.release
    assert how is not None
    what = f"{p.spec.words} {name!r} held by {holder_text(p)}"
    if not args.yes:
        sys.stdout.write(f"force-release {what}? [y/N] ")
        sys.stdout.flush()
        try:
            answer = sys.stdin.readline().strip().lower()
        except KeyboardInterrupt:
            answer = ""
            print()
        if answer not in ("y", "yes"):
            print("not confirmed; nothing done")
            return 1

    async def release() -> bool:
        from aiolock import Client

        redis: aioredis.Redis | RedisCluster = target.redis_cluster() if cluster else target.redis()
        client = Client(redis, prefix=target.prefix)
        try:
            primitive = getattr(client, how.factory)(name, *how.args(p))
            return bool(await primitive.force_release())
        finally:
            await client.aclose()
            await redis.aclose()

    try:
        done = arun(release, target)
    except Exception as exc:  # an AiolockError from the library: one line, exit 2
        if isinstance(exc, OpsError):
            raise
        raise OpsError(f"aiolock: force-release of {name!r} failed: {exc}") from None
    if not done:
        print(f"{p.spec.words} {name!r} was no longer held; nothing done")
        return 1
    if how.done is not None:
        print(how.done(p, holder_text(p)))
    else:
        print(f"force-released {what} (fencing counter kept, waiters woken)")
    print(told(p))
    return 0


def _top(args: argparse.Namespace, target: Target) -> int:
    from aiolock.cli.ops_view import make_view

    if args.interval <= 0:
        raise OpsError("aiolock: --interval must be positive")

    async def body(server: Server) -> None:
        view = make_view(target, plain=args.plain, out=sys.stdout)
        try:
            n = 0
            while args.iterations is None or n < args.iterations:
                started = time.monotonic()
                states = await server.collect(args.pattern, args.count)
                view.update(_listed(states, False))
                n += 1
                if args.iterations is not None and n >= args.iterations:
                    break
                await asyncio.sleep(max(0.0, args.interval - (time.monotonic() - started)))
        finally:
            view.close()

    try:
        arun(lambda: with_server(target, body), target)
    except KeyboardInterrupt:
        pass
    return 0
