"""The libraries under test, each behind the same small interface.

An adapter opens whatever clients or pools its library needs for a given
number of concurrent tasks, hands each task a *handle* (``lock(name)``), and
acquires and releases through it. ``acquire`` returns the fencing token when
the library issues one. Thread-based libraries (python-redis-lock) have the
``*_sync`` variants and are driven by OS threads instead of tasks.

``DIRECT`` says which commands each library sends itself; every other command
seen in ``INFO commandstats`` during a run was called from inside a Lua script
(that is how ``requests`` and ``inner calls`` are told apart).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
from typing import Any
from urllib.parse import urlparse

#: Display order. "floor" is not a lock: it is the raw round trips.
LIBS = (
    "aiolock",
    "redis-py",
    "redis-py-10ms",
    "python-redis-lock",
    "pottery",
    "aioredlock",
    "redis-fifo-lock",
    "asyncio.Lock",
)
THREAD_LIBS = frozenset({"python-redis-lock"})
#: The libraries that run on a Redis Cluster (the cluster section runs these only).
CLUSTER_LIBS = ("aiolock", "redis-py")
NO_REDIS = frozenset({"asyncio.Lock"})
#: Pool headroom on top of one connection per task, for redis-py based peers.
POOL_HEADROOM = 16

_MODULES = {
    "aiolock": ("aiolock", "aiolock"),
    "redis-py": ("redis.asyncio.lock", "redis"),
    "redis-py-10ms": ("redis.asyncio.lock", "redis"),
    "python-redis-lock": ("redis_lock", "python-redis-lock"),
    "pottery": ("pottery", "pottery"),
    "aioredlock": ("aioredlock", "aioredlock"),
    "redis-fifo-lock": ("redis_fifo_lock", "redis-fifo-lock"),
    "asyncio.Lock": ("asyncio", None),
}

#: Connection set-up and health commands: requests, but not per acquisition.
SETUP = frozenset(
    {"client|setinfo", "client|setname", "hello", "select", "auth", "ping", "script|load",
     "cluster|slots", "cluster|shards", "command", "readonly"}
)  # fmt: skip
DIRECT: dict[str, frozenset[str]] = {
    # WAIT / WAITAOF: replica acknowledgements (``replicas=N``), sent on their own connection.
    "aiolock": frozenset(
        {
            "evalsha",
            "eval",
            "subscribe",
            "unsubscribe",
            "ssubscribe",
            "sunsubscribe",
            "asking",
            "wait",
            "waitaof",
        }
    ),
    "redis-py": frozenset({"set", "evalsha", "eval"}),
    "redis-py-10ms": frozenset({"set", "evalsha", "eval"}),
    "python-redis-lock": frozenset({"set", "get", "blpop", "evalsha", "eval"}),
    "pottery": frozenset({"set", "evalsha", "eval"}),
    "aioredlock": frozenset({"evalsha", "eval"}),
    "redis-fifo-lock": frozenset({"evalsha", "eval", "blpop", "config|get"}),
    "asyncio.Lock": frozenset(),
    "floor": frozenset({"evalsha", "eval"}),
}

DESCRIPTION = {
    "aiolock": "this library: `Client.from_url(url)`, `lease = await lock.acquire()`, "
    "`await lease.release()`; one multiplexed command connection, one pub/sub connection, "
    "and the watchdog's own connection once it renews",
    "redis-py": "`redis.asyncio.lock.Lock` (default `sleep=0.1`), one Lock object per task, "
    "`timeout=30`; pool `max_connections` = tasks + 16",
    "redis-py-10ms": "`redis.asyncio.lock.Lock(sleep=0.01)`, otherwise as redis-py",
    "python-redis-lock": "`redis_lock.Lock(expire=30)` (sync, SET NX + BLPOP), one OS thread "
    "per task; sync pool `max_connections` = threads + 16",
    "pottery": "`pottery.AIORedlock(masters={redis})`, one object per task, "
    "`auto_release_time=30`; pool `max_connections` = tasks + 16",
    "aioredlock": "`aioredlock.Aioredlock` (aioredis 1.3), `lock_timeout=30`, retried until "
    "acquired (`retry_count=10**9`, 0.1-0.3 s delays); pool `maxsize` = tasks + 16",
    "redis-fifo-lock": "`redis_fifo_lock.FifoLock(lease_ms=30000)` (scripts + BLPOP doorbell), "
    "one FifoLock per name; pool `max_connections` = tasks + 16 (a waiter blocks a connection)",
    "asyncio.Lock": "in-process `asyncio.Lock`: the ceiling of the harness, no Redis at all",
}


def unavailable_reason(lib: str) -> str | None:
    """None if ``lib`` imports here, else why not."""
    module, _dist = _MODULES[lib]
    try:
        importlib.import_module(module)
    except Exception as exc:  # any import failure makes the peer unavailable
        return f"import {module} failed: {type(exc).__name__}: {exc}"
    return None


def version_of(lib: str) -> str:
    _module, dist = _MODULES.get(lib, (None, None))
    if dist is None:
        import platform

        return f"Python {platform.python_version()}"
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def make(lib: str) -> Any:
    if lib == "aiolock":
        return AiolockLib()
    if lib == "redis-py":
        return RedisPyLib(0.1)
    if lib == "redis-py-10ms":
        return RedisPyLib(0.01)
    if lib == "python-redis-lock":
        return PythonRedisLockLib()
    if lib == "pottery":
        return PotteryLib()
    if lib == "aioredlock":
        return AioredlockLib()
    if lib == "redis-fifo-lock":
        return FifoLib()
    if lib == "asyncio.Lock":
        return AsyncioLib()
    raise ValueError(f"unknown library {lib!r}")


class _Handle:
    __slots__ = ("held", "lock")

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.held: Any = None


class AiolockLib:
    thread = False
    #: CLIENT LIST name prefix of the library's own connections (None: all but the harness').
    conn_prefix = None

    async def open(
        self,
        url: str,
        tasks: int,
        lease: float = 30.0,
        cluster: bool | None = False,
        *,
        masters: list[str] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """One Client on ``url``; with ``masters``, a ``Redlock`` over one Client per master.

        ``options``: more ``Client`` options (e.g. ``replicas``), passed only when given.
        """
        import aiolock

        # `cluster` only when asked for: an older aiolock (--aiolock-ref) has no such option.
        opts: dict[str, Any] = {} if cluster is False else {"cluster": cluster}
        opts.update(options or {})
        self._locks: dict[str, Any] = {}
        self.redlock: Any = None
        self.clients: list[Any] = []
        for u in masters or [url]:
            client = aiolock.Client.from_url(u, prefix="bench", lease=lease, **opts)
            await client.__aenter__()
            self.clients.append(client)
        self.client = self.clients[0]
        if masters:
            self.redlock = aiolock.Redlock(self.clients)  # type: ignore[attr-defined,unused-ignore]
            if hasattr(self.redlock, "__aenter__"):
                await self.redlock.__aenter__()

    def lock(self, name: str) -> _Handle:
        lk = self._locks.get(name)
        if lk is None:
            owner = self.redlock if self.redlock is not None else self.client
            lk = self._locks[name] = owner.lock(name)
        return _Handle(lk)

    async def acquire(self, h: _Handle) -> int | None:
        h.held = await h.lock.acquire()
        token: int = h.held.fencing_token
        return token

    async def release(self, h: _Handle) -> None:
        held, h.held = h.held, None
        await held.release()

    def waiting(self) -> int | None:
        return int(self.client.statistics().waiting)

    async def prewarm(self, tasks: int) -> None:
        """Connect (and load the scripts) before the clock starts."""
        for client in self.clients:
            await client.lock("bench-prewarm").is_locked()

    async def close(self) -> None:
        try:
            if self.redlock is not None and hasattr(self.redlock, "aclose"):
                await self.redlock.aclose()
        finally:
            for client in self.clients:
                await client.aclose()


class RedisPyLib:
    thread = False
    conn_prefix = None

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    async def open(
        self,
        url: str,
        tasks: int,
        lease: float = 30.0,
        cluster: bool = False,
        *,
        masters: list[str] | None = None,
    ) -> None:
        import redis.asyncio as aioredis

        self.lease = lease
        self.pool: Any = None
        self.redis: Any
        #: One client per independent master (Redlock peers); ``[self.redis]`` otherwise.
        self.masters: list[Any] = []
        if masters:
            self.pools = [
                aioredis.ConnectionPool.from_url(u, max_connections=tasks + POOL_HEADROOM)
                for u in masters
            ]
            self.masters = [aioredis.Redis(connection_pool=pool) for pool in self.pools]
            self.redis = self.masters[0]
            return
        if cluster:  # a pool per node, made by the cluster client itself
            self.redis = aioredis.RedisCluster.from_url(url, max_connections=tasks + POOL_HEADROOM)
            await self.redis.initialize()
            return
        self.pool = aioredis.ConnectionPool.from_url(url, max_connections=tasks + POOL_HEADROOM)
        self.redis = aioredis.Redis(connection_pool=self.pool)

    def lock(self, name: str) -> Any:
        return self.redis.lock(name, timeout=self.lease, sleep=self.sleep, thread_local=False)

    async def prewarm(self, tasks: int) -> None:
        """Open one connection per task before the clock starts (as a warm service would have)."""
        pools = self.pools if self.masters else [self.pool]
        for pool in pools:
            if pool is None:  # a cluster: its per-node pools fill up in the warm-up
                continue
            conns = await asyncio.gather(*(pool.get_connection() for _ in range(tasks)))
            for conn in conns:
                await pool.release(conn)

    async def acquire(self, h: Any) -> int | None:
        await h.acquire()
        return None

    async def release(self, h: Any) -> None:
        await h.release()

    def waiting(self) -> int | None:
        return None

    async def close(self) -> None:
        if self.masters:
            for r, pool in zip(self.masters, self.pools, strict=True):
                await r.aclose()
                await pool.aclose()
            return
        await self.redis.aclose()
        if self.pool is not None:
            await self.pool.aclose()


class PotteryLib(RedisPyLib):
    def __init__(self) -> None:
        super().__init__(0.0)

    def lock(self, name: str) -> Any:
        from pottery import AIORedlock

        masters = set(self.masters) if self.masters else {self.redis}
        return AIORedlock(key=name, masters=masters, auto_release_time=self.lease)


class AioredlockLib:
    thread = False
    conn_prefix = None

    async def open(
        self, url: str, tasks: int, lease: float = 30.0, *, masters: list[str] | None = None
    ) -> None:
        from aioredlock import Aioredlock

        hosts = [urlparse(u) for u in masters or [url]]
        self.manager = Aioredlock(
            [{"host": u.hostname, "port": u.port, "maxsize": tasks + POOL_HEADROOM} for u in hosts],
            retry_count=10**9,
        )
        self.lease = lease

    def lock(self, name: str) -> _Handle:
        return _Handle(name)

    async def prewarm(self, tasks: int) -> None:
        for instance in self.manager.redis.instances:
            with await instance.connect():  # creates the pool and loads the scripts
                pass
            pool = instance._pool.connection  # aioredis 1.x ConnectionsPool
            conns = await asyncio.gather(*(pool.acquire() for _ in range(tasks)))
            for conn in conns:
                pool.release(conn)

    async def acquire(self, h: _Handle) -> int | None:
        h.held = await self.manager.lock(h.lock, lock_timeout=self.lease)
        return None

    async def release(self, h: _Handle) -> None:
        held, h.held = h.held, None
        await self.manager.unlock(held)

    def waiting(self) -> int | None:
        return None

    async def close(self) -> None:
        await self.manager.destroy()


class FifoLib(RedisPyLib):
    def __init__(self) -> None:
        super().__init__(0.0)
        self._locks: dict[str, Any] = {}

    def lock(self, name: str) -> _Handle:
        from redis_fifo_lock import FifoLock

        lk = self._locks.get(name)
        if lk is None:
            lk = self._locks[name] = FifoLock(self.redis, name, lease_ms=int(self.lease * 1000))
        return _Handle(lk)

    async def acquire(self, h: _Handle) -> int | None:  # type: ignore[override]
        h.held = await h.lock.acquire()
        return int(h.held.fence)

    async def release(self, h: _Handle) -> None:  # type: ignore[override]
        held, h.held = h.held, None
        await h.lock.release(held)


class AsyncioLib:
    thread = False
    conn_prefix = None

    async def open(self, url: str, tasks: int, lease: float = 30.0) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, name: str) -> asyncio.Lock:
        lk = self._locks.get(name)
        if lk is None:
            lk = self._locks[name] = asyncio.Lock()
        return lk

    async def acquire(self, h: asyncio.Lock) -> int | None:
        await h.acquire()
        return None

    async def prewarm(self, tasks: int) -> None:
        pass

    async def release(self, h: asyncio.Lock) -> None:
        h.release()

    def waiting(self) -> int | None:
        return None

    async def close(self) -> None:
        pass


class PythonRedisLockLib:
    thread = True
    conn_prefix = None

    def open_sync(self, url: str, tasks: int, lease: float = 30.0) -> None:
        import redis

        self.pool = redis.ConnectionPool.from_url(url, max_connections=tasks + POOL_HEADROOM)
        self.redis = redis.StrictRedis(connection_pool=self.pool)
        self.lease = lease

    def lock(self, name: str) -> Any:
        import redis_lock

        return redis_lock.Lock(self.redis, name, expire=int(self.lease))

    def prewarm_sync(self, tasks: int) -> None:
        conns = [self.pool.get_connection() for _ in range(tasks)]
        for conn in conns:
            self.pool.release(conn)

    def acquire_sync(self, h: Any) -> int | None:
        h.acquire()
        return None

    def release_sync(self, h: Any) -> None:
        h.release()

    def close_sync(self) -> None:
        self.redis.close()
        self.pool.disconnect()
