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
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from aiolock._core.errors import clause, sentence
from aiolock.cli.ops_state import (
    KEY_SUFFIXES,
    NameState,
    Primitive,
    RawKey,
    RawName,
    describe,
    glob_match,
    name_of_key,
)
from aiolock.cli.ops_text import (
    LS_HEADER,
    UNTRACKED_TEXT,
    holder_text,
    latch_text,
    ls_rows,
    shown_url,
    waiting_legend,
)
from aiolock.cli.ops_text import secs as _secs

__all__ = ["add_arguments", "run"]

T = TypeVar("T")

_GLOB_SPECIAL = re.compile(r"[*?\[\]\\]")

#: Names read per pipeline (each is len(KEY_SUFFIXES) * 3 commands).
_BATCH = 64


class OpsError(Exception):
    """A failure reported as one line, with the exit code to leave with."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- arguments


def add_arguments(sub: Any) -> None:
    """Add the ``ls``, ``inspect``, ``top`` and ``force-release`` subcommands to ``sub``."""
    common = argparse.ArgumentParser(add_help=False)
    conn = common.add_argument_group("connection")
    conn.add_argument(
        "--url",
        default=None,
        help="the server, or any node of a cluster (default: $REDIS_URL, else "
        "redis://localhost:6379); rediss:// for TLS",
    )
    conn.add_argument(
        "--prefix", default="aiolock", help="the Clients' key prefix (default: aiolock)"
    )
    conn.add_argument(
        "--cluster",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the URL is a Redis Cluster node: scan every master (default: ask the "
        "server, INFO cluster)",
    )
    conn.add_argument("--tls", action="store_true", help="use TLS (as a rediss:// URL does)")
    conn.add_argument("--tls-ca-cert", metavar="FILE", help="CA bundle to verify the server with")
    conn.add_argument("--tls-cert", metavar="FILE", help="client certificate (mutual TLS)")
    conn.add_argument("--tls-key", metavar="FILE", help="the client certificate's private key")
    conn.add_argument(
        "--tls-insecure",
        action="store_true",
        help="do not verify the server's certificate or host name",
    )
    conn.add_argument(
        "--timeout", type=float, default=5.0, help="connect and command timeout, s (default: 5)"
    )

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


# --------------------------------------------------------------------------- connecting


@dataclass(frozen=True, slots=True)
class Target:
    """Where to connect and how (the common options, resolved)."""

    url: str
    prefix: str
    cluster: bool | None
    kwargs: dict[str, Any]

    @classmethod
    def of(cls, args: argparse.Namespace) -> Target:
        url = args.url or os.environ.get("REDIS_URL") or "redis://localhost:6379"
        kwargs: dict[str, Any] = {
            "socket_connect_timeout": args.timeout,
            "socket_timeout": args.timeout,
        }
        tls = args.tls or args.tls_ca_cert or args.tls_cert or args.tls_key or args.tls_insecure
        if tls:
            if url.startswith("redis://"):
                url = "rediss://" + url[len("redis://") :]
            elif not url.startswith("rediss://"):
                raise OpsError(
                    f"aiolock: TLS options need a redis:// or rediss:// URL, got {shown_url(url)}"
                )
        if args.tls_ca_cert:
            kwargs["ssl_ca_certs"] = args.tls_ca_cert
        if args.tls_cert:
            kwargs["ssl_certfile"] = args.tls_cert
        if args.tls_key:
            kwargs["ssl_keyfile"] = args.tls_key
        if args.tls_insecure:
            kwargs["ssl_cert_reqs"] = "none"
            kwargs["ssl_check_hostname"] = False
        return cls(url, args.prefix, args.cluster, kwargs)

    def redis(self, url: str | None = None, **extra: Any) -> aioredis.Redis:
        try:
            return aioredis.Redis.from_url(url or self.url, **self.kwargs, **extra)
        except (ValueError, TypeError) as exc:
            raise OpsError(f"aiolock: invalid URL {shown_url(self.url)}: {exc}") from None

    def redis_cluster(self, **extra: Any) -> RedisCluster:
        try:
            return RedisCluster.from_url(self.url, **self.kwargs, **extra)
        except (ValueError, TypeError, RedisClusterException) as exc:
            raise OpsError(f"aiolock: invalid URL {shown_url(self.url)}: {exc}") from None

    def node_url(self, host: str, port: int) -> str:
        parts = urlsplit(self.url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
        return urlunsplit(parts._replace(netloc=netloc))


class Server:
    """Connections (decoded replies) to a standalone server or to every master of a cluster."""

    def __init__(
        self,
        target: Target,
        nodes: list[aioredis.Redis],
        addresses: list[tuple[str, int]],
        slots: RedisCluster | None,
    ) -> None:
        self.target = target
        self.nodes = nodes
        self.addresses = addresses
        self.slots = slots  # cluster mode: the discovered slot map (its connections unused)
        self.cluster = slots is not None

    @classmethod
    async def open(cls, target: Target) -> Server:
        seed = target.redis(decode_responses=True)
        try:
            cluster = target.cluster
            if cluster is None:
                try:
                    info = await seed.info("cluster")
                    cluster = bool(info.get("cluster_enabled"))
                except AuthenticationError:
                    raise
                except ResponseError:  # INFO refused (ACL, renamed): take it as standalone
                    cluster = False
            if not cluster:
                await seed.ping()
                return cls(target, [seed], [], None)
            await seed.aclose()
            rc = target.redis_cluster(decode_responses=True)
            try:
                await rc.initialize()
            except BaseException:
                await rc.aclose()
                raise
            masters = [(n.host, int(n.port)) for n in rc.get_primaries()]
            nodes = [target.redis(target.node_url(h, p), decode_responses=True) for h, p in masters]
            return cls(target, nodes, masters, rc)
        except BaseException:
            await seed.aclose()
            raise

    async def aclose(self) -> None:
        for node in self.nodes:
            await node.aclose()
        if self.slots is not None:
            await self.slots.aclose()

    async def names(self, node: aioredis.Redis, pattern: str, count: int) -> set[str]:
        """The names matching ``pattern`` that have a key on ``node`` (SCAN, MATCH, COUNT)."""
        prefix = self.target.prefix
        escaped = _GLOB_SPECIAL.sub(r"\\\g<0>", prefix)
        match = f"{escaped}:{{{pattern}}}*"
        found: set[str] = set()
        async for key in node.scan_iter(match=match, count=count):
            name = name_of_key(prefix, key)
            if name is not None and glob_match(pattern, name):
                found.add(name)
        return found

    async def read(self, node: aioredis.Redis, names: Sequence[str]) -> list[NameState]:
        """The state of each name (all on ``node``), described."""
        return [describe(raw) for raw in await self.read_raw(node, names)]

    async def read_raw(self, node: aioredis.Redis, names: Sequence[str]) -> list[RawName]:
        """The keys of each name (all on ``node``) as read: one pipelined round trip
        per batch of names, with the server's clock; no write."""
        states: list[RawName] = []
        prefix = self.target.prefix
        for start in range(0, len(names), _BATCH):
            batch = names[start : start + _BATCH]
            pipe = node.pipeline(transaction=False)
            pipe.time()
            for name in batch:
                main = f"{prefix}:{{{name}}}"
                for suffix, kind in KEY_SUFFIXES.items():
                    key = main + suffix
                    pipe.type(key)
                    pipe.pttl(key)
                    if kind == "hash":
                        pipe.hgetall(key)
                    elif kind == "zset":
                        pipe.zrange(key, 0, -1, withscores=True)
                    elif kind == "list":
                        pipe.lrange(key, 0, -1)
                    else:
                        pipe.get(key)
            replies = await pipe.execute(raise_on_error=False)
            for reply in replies:
                if isinstance(reply, ResponseError) and not _wrong_type(reply):
                    raise reply
            seconds, micros = replies[0]
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            at = 1
            for name in batch:
                main = f"{prefix}:{{{name}}}"
                keys: dict[str, RawKey] = {}
                for suffix in KEY_SUFFIXES:
                    kind, pttl, value = replies[at : at + 3]
                    at += 3
                    if isinstance(value, Exception) or kind == "none":
                        value = None
                    keys[suffix] = RawKey(main + suffix, str(kind), int(pttl), value)
                states.append(RawName(prefix, name, now_ms, keys))
        return states

    async def collect(self, pattern: str, count: int = 500) -> list[NameState]:
        """Every name matching ``pattern`` on every node, described, sorted by name."""

        async def one(node: aioredis.Redis) -> list[NameState]:
            names = sorted(await self.names(node, pattern, count))
            return await self.read(node, names)

        per_node = await asyncio.gather(*(one(node) for node in self.nodes))
        return sorted((s for states in per_node for s in states), key=lambda s: s.name)

    async def state(self, name: str) -> NameState:
        """The state of one name (read on the node that serves it)."""
        node = self.nodes[0]
        if self.cluster:
            node = await self._node_for(f"{self.target.prefix}:{{{name}}}")
        return (await self.read(node, [name]))[0]

    async def _node_for(self, key: str) -> aioredis.Redis:
        assert self.slots is not None
        node = self.slots.get_node_from_key(key)
        if node is None:
            raise OpsError(f"aiolock: no master known serves the slot of {key!r}; try again")
        host, port = node.name.rsplit(":", 1)
        for candidate, address in zip(self.nodes, self.addresses, strict=True):
            if address == (host, int(port)):
                return candidate
        raise OpsError(f"aiolock: no master known serves the slot of {key!r}; try again")


def _wrong_type(exc: ResponseError) -> bool:
    return str(exc).startswith("WRONGTYPE")


def _arun(make: Callable[[], Coroutine[Any, Any, T]], target: Target) -> T:
    """Run ``make()``; turn connection failures into a one-line OpsError (exit 2)."""
    shown = shown_url(target.url)
    try:
        return asyncio.run(make())
    except AuthenticationError as exc:
        raise OpsError(
            f"aiolock: {shown} refused the login: {sentence(exc)} Check the URL's user and password"
        ) from None
    except (ConnectionError, TimeoutError, OSError) as exc:
        raise OpsError(_cannot_connect(shown, exc)) from None
    except RedisClusterException as exc:  # e.g. --cluster on a standalone server
        raise OpsError(f"aiolock: {shown} as a cluster: {sentence(exc)} Check --cluster") from None
    except RedisError as exc:
        if isinstance(exc, ResponseError):
            raise OpsError(f"aiolock: {shown} refused a command: {exc}") from None
        raise OpsError(_cannot_connect(shown, exc)) from None


def _cannot_connect(shown: str, exc: BaseException) -> str:
    reason = clause(str(exc).strip()) or type(exc).__name__
    found = re.match(r"Error (\d+) connecting to \S+?\. ", reason)
    if found is not None:  # redis-py's "Error 111 connecting to h:p. <detail>"
        reason = os.strerror(int(found[1]))
    return f"aiolock: cannot connect to {shown}: {sentence(reason)} Check --url or REDIS_URL"


async def _with_server(target: Target, body: Callable[[Server], Coroutine[Any, Any, T]]) -> T:
    server = await Server.open(target)
    try:
        return await body(server)
    finally:
        await server.aclose()


# --------------------------------------------------------------------------- formatting


def primitive_json(p: Primitive) -> dict[str, Any]:
    """A primitive as JSON (the fields the README documents)."""
    return {
        "name": p.name,
        "kind": p.kind,
        "key": p.key,
        "state": p.state,
        "held": p.held,
        "ttl_ms": p.ttl_ms,
        "holders": [asdict(h) for h in p.holders],
        "waiters": [asdict(w) for w in p.waiters],
        "untracked_waiters": p.untracked_waiters,
        "waiters_not_shown": p.not_shown,
        "last_token": p.last_token,
        "last_released": p.last_released,
        "details": dict(p.details),
    }


def state_json(s: NameState) -> dict[str, Any]:
    """A name's state as JSON (``inspect --json``)."""
    return {
        "prefix": s.prefix,
        "name": s.name,
        "exists": s.exists,
        "last_token": s.last_token,
        "last_released": s.last_released,
        "primitives": [primitive_json(p) for p in s.primitives],
        "keys": [asdict(k) for k in s.keys],
    }


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in [LS_HEADER, *rows]) for i in range(len(LS_HEADER))]
    for row in [LS_HEADER, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def explain(s: NameState) -> list[str]:
    """``inspect``'s text: what is kept for the name, in sentences."""
    lines: list[str] = []
    if not s.exists:
        return [f"nothing is kept for {s.name!r} under prefix {s.prefix!r}."]
    for p in s.primitives:
        lines.append(f"{p.spec.words} {p.name!r} (key {p.key}):")
        lines.extend("  " + line for line in _explain_primitive(p))
    if not s.primitives:
        lines.append(f"{s.name!r} is not held; only its fencing counter is kept.")
    if s.last_token is not None:
        released = f"; last released {s.last_released}" if s.last_released is not None else ""
        lines.append(
            f"fencing counter: last token issued {s.last_token} (counting tokens a Client "
            f"reserved for local handoffs){released}."
        )
    lines.append("keys:")
    lines.extend(f"  {k.key}  {k.type}, {_secs(k.ttl_ms)}" for k in s.keys)
    return lines


def _who(client_id: str, task: int | None) -> str:
    if task is None:
        return f"client {client_id}"
    return f"task {task} of client {client_id}"


def _explain_primitive(p: Primitive) -> list[str]:
    spec = p.spec
    if spec.foreign:
        return [f"holds a {p.details.get('type')} aiolock did not write; aiolock refuses to use it"]
    if spec.gate:
        return [
            f"{latch_text(p)}; opened {p.details.get('generation', 0)} time(s); kept "
            f"{_secs(p.ttl_ms)} more",
            f"waiting: {p.not_shown}",
        ]
    out: list[str] = []
    if spec.summary:
        out.append(spec.summary.format(**p.details))
    for h in p.holders:
        role = {"exclusive": "held", "write": "held for writing", "read": "held for reading"}.get(
            h.role, f"{h.permits} permit(s) held"
        )
        token = f", fencing token {h.token}" if h.token is not None else ""
        holds = ""
        if h.role in ("exclusive", "write", "read") and spec.holds_counted:
            holds = f", {h.count} hold recorded (re-entries are counted in its Client)"
        out.append(
            f"{role} by {_who(h.client_id, h.task)} (owner {h.owner}){holds}, "
            f"{_secs(h.ttl_ms)} left{token}"
        )
    if not p.holders and not spec.summary:
        out.append("free: nobody holds it")
    if spec.counter_note and p.last_token is not None:
        out.append(spec.counter_note.format(last_token=p.last_token))
    if spec.holder_note and p.holders:
        out.append(spec.holder_note)
    if not spec.waiters_recorded:
        out.append(f"waiting: {p.not_shown}")
    elif p.waiters:
        clients = len({w.client_id for w in p.waiters})
        out.append(
            f"waiting: {len(p.waiters)} recorded in Redis ({clients} "
            f"Client{'s' if clients != 1 else ''}):"
        )
        for i, w in enumerate(p.waiters, 1):
            what = {
                "task": f"{_who(w.client_id, w.task)} (its Client's other tasks queue behind it)",
                "queued": f"#{i} {_who(w.client_id, w.task)}",
                "writer": f"writer {_who(w.client_id, w.task)}",
                "readers": f"readers of client {w.client_id}",
                "claim": f"{_who(w.client_id, w.task)} claims {w.permits} permit(s) "
                "(it has waited longest)",
            }[w.role]
            out.append(f"  {what}; entry lapses in {_secs(w.ttl_ms)} unless renewed")
    else:
        out.append("waiting: none recorded in Redis")
    if p.untracked_waiters:
        out.append(f"and possibly more: {UNTRACKED_TEXT}; the release wakes them")
    if p.not_shown and spec.waiters_recorded:
        out.append(f"not visible from Redis: {p.not_shown}")
    return out


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

    states, cluster, nodes = _arun(lambda: _with_server(target, body), target)
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
    _table([row for p in listed for row in ls_rows(p)], sys.stdout)
    for line in waiting_legend(listed):
        print(line)
    return 0


def _inspect(args: argparse.Namespace, target: Target) -> int:
    async def body(server: Server) -> NameState:
        return await server.state(args.name)

    state = _arun(lambda: _with_server(target, body), target)
    if args.json:
        print(json.dumps(state_json(state), indent=2))
    else:
        print("\n".join(explain(state)))
    return 0 if state.exists else 1


def _force_release(args: argparse.Namespace, target: Target) -> int:
    name = args.name

    async def look(server: Server) -> tuple[NameState, bool]:
        return await server.state(name), server.cluster

    state, cluster = _arun(lambda: _with_server(target, look), target)
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
        done = _arun(release, target)
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
    print(_told(p))
    return 0


def _told(p: Primitive) -> str:
    """What a force release did to the holders, and how long one may still run."""
    ttls = [h.ttl_ms for h in p.holders if h.ttl_ms is not None and h.ttl_ms >= 0]
    if not ttls and p.ttl_ms is not None and p.ttl_ms >= 0:
        ttls = [p.ttl_ms]
    left = f"{max(ttls) / 1000:.1f} s" if ttls else "its lease"
    return (
        "The holder's Client was told on its eviction channel: if connected (pub/sub mode) "
        "it marks the lease lost now, its `async with` body is cancelled and raises "
        "LockLostError. A Client that did not hear it (list or poll mode, or not subscribed "
        "yet) finds the hold gone at its watchdog's next check, within lease/3 of its Client "
        f"lease (10 s by default). A holder cut off from Redis may run on until its own lease "
        f"ends: at most {left} from when it was looked up (the hold's remaining TTL)."
    )


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
        _arun(lambda: _with_server(target, body), target)
    except KeyboardInterrupt:
        pass
    return 0
