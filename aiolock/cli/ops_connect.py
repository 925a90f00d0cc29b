"""Connecting for the operator commands: the common options, the server.

``connection_options`` is the parent parser of every operator command
(``ls``, ``inspect``, ``top``, ``force-release``, ``doctor``): ``--url``,
``--prefix``, ``--cluster``, TLS, ``--timeout``. ``Target.of`` resolves them;
``Server.open`` connects to a standalone server or to every master of a
cluster (``INFO cluster`` decides unless ``--cluster`` says) and reads what
aiolock keeps for names (``SCAN``, then one pipelined round trip per batch of
names; never ``KEYS``, never a write). ``arun`` runs a coroutine and turns a
connection failure into a one-line ``OpsError`` (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
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
    RawKey,
    RawName,
    describe,
    glob_match,
    name_of_key,
)
from aiolock.cli.ops_text import shown_url

__all__ = ["OpsError", "Server", "Target", "arun", "connection_options", "with_server"]

T = TypeVar("T")

_GLOB_SPECIAL = re.compile(r"[*?\[\]\\]")

#: Names read per pipeline (each is len(KEY_SUFFIXES) * 3 commands).
_BATCH = 64


class OpsError(Exception):
    """A failure reported as one line, with the exit code to leave with."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def connection_options() -> argparse.ArgumentParser:
    """The connection options every operator command takes (a parent parser)."""
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
    return common


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


def arun(make: Callable[[], Coroutine[Any, Any, T]], target: Target) -> T:
    """Run ``make()``; turn connection failures into a one-line OpsError (exit 2)."""
    shown = shown_url(target.url)
    try:
        return asyncio.run(make())
    except AuthenticationError as exc:
        raise OpsError(
            f"aiolock: {shown} refused the login: {sentence(exc)} Check the URL's user and password"
        ) from None
    except (ConnectionError, TimeoutError, OSError) as exc:
        raise OpsError(cannot_connect(shown, exc)) from None
    except RedisClusterException as exc:  # e.g. --cluster on a standalone server
        raise OpsError(f"aiolock: {shown} as a cluster: {sentence(exc)} Check --cluster") from None
    except RedisError as exc:
        if isinstance(exc, ResponseError):
            raise OpsError(f"aiolock: {shown} refused a command: {exc}") from None
        raise OpsError(cannot_connect(shown, exc)) from None


def cannot_connect(shown: str, exc: BaseException) -> str:
    reason = clause(str(exc).strip()) or type(exc).__name__
    found = re.match(r"Error (\d+) connecting to \S+?\. ", reason)
    if found is not None:  # redis-py's "Error 111 connecting to h:p. <detail>"
        reason = os.strerror(int(found[1]))
    return f"aiolock: cannot connect to {shown}: {sentence(reason)} Check --url or REDIS_URL"


async def with_server(target: Target, body: Callable[[Server], Coroutine[Any, Any, T]]) -> T:
    server = await Server.open(target)
    try:
        return await body(server)
    finally:
        await server.aclose()
