"""The Client: one per event loop, the public face of aiolock.

A Client is a thin facade over its Engine (``aiolock._core.engine``), which
owns every shared resource: the connections, the one pub/sub listener, the
one watchdog, the scripts and the local state of every primitive. The
Client validates what users pass (``check_options``, the one place that
checks the options), makes the Engine, and hands out primitives, each a
cheap view (a name and a protocol) over that Engine.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from ._core.engine import Engine
from ._core.errors import InvalidArgumentError, InvalidArgumentTypeError, sentence
from ._core.holds.lease import Lease
from ._core.observe.observer import LockLabel
from ._core.options import ClientStatistics, Notify, Scripting, check_options, check_sentinels
from ._core.protocol.keys import main_key
from ._core.waiting.notify import Backoff
from ._primitives import fenced
from ._primitives.adopt import adopt
from ._primitives.election import Election
from ._primitives.fair import FairLock
from ._primitives.latch import Latch
from ._primitives.lock import AsyncLock
from ._primitives.multi import MultiLock
from ._primitives.rwlock import ReadWriteLock
from ._primitives.semaphore import Semaphore
from ._primitives.singleflight import DEFAULT_MAX_SIZE, Serializer, Singleflight
from ._primitives.spin import SpinLock

__all__ = ["Client", "ClientStatistics", "Notify", "engine_of"]

#: ``from_sentinel``: the socket timeouts of each question to a Sentinel, in seconds.
SENTINEL_TIMEOUT = 2.0


class Client:
    """One Client per event loop: the connection, listener and watchdog of aiolock.

    ``Client(redis)`` wraps a ``redis.asyncio.Redis`` you already have (its
    connection settings are reused for aiolock's own connections; your
    client is not closed by ``aclose()``). A Client opens three, each when
    first needed: commands, pub/sub (when a task first waits, in the
    ``"pubsub"`` notify mode) and the watchdog's renewals; ``notify="list"``
    adds one per name being waited on.
    ``Client.from_url(url)`` makes its own Redis client.

    * ``prefix``: the first part of every key, ``<prefix>:{<name>}``.
    * ``lease``: the lease time, in seconds, of holds taken without an explicit
      lease; the watchdog renews them every ``lease / 3``.
    * ``notify``: how waiters learn of a release: ``"pubsub"`` (one shared
      pub/sub connection), ``"list"`` (BLPOP on a signal list, for servers
      without pub/sub) or ``"poll"`` (capped exponential backoff). See
      ``aiolock._core.waiting.notify``. ``backoff`` tunes the ``"poll"`` mode.
    * ``command_timeout``: a connection that answers nothing for this long
      while commands are pending is closed and reconnected; connecting is
      bounded by it too, and a wait without a timeout whose first contact
      gets no reply gives up after it (ConnectionFailedError).
    * ``telemetry``: record OpenTelemetry metrics and spans when
      ``opentelemetry-api`` is installed (the ``otel`` extra), with the global
      meter and tracer providers; False: none. ``lock_label``: a function
      from a lock name to a label from a bounded set (or None), the only way
      lock names reach metric attributes (``order:<id>`` names must not
      explode cardinality); without it no name is recorded.
    * ``scripting``: how aiolock runs its Lua scripts. ``"eval"``: the server's
      script cache (each connection loads a script with its first run). ``"functions"``:
      one Redis Functions library (Redis 7.0+, Valkey 7.2+) named after
      aiolock's version and its text, loaded once per server (per master)
      when a call finds it missing, never replaced or deleted; a user that
      may not ``FUNCTION LOAD`` gets ``ServerRefusedError`` (NOPERM) naming
      ``aiolock functions load --url ...``, for an operator to run once.
      ``"auto"`` (the default): the script cache, and Functions from the
      first time the ACL refuses running or loading a cached script (that
      call did not run; it is sent again as an FCALL). A server without Functions raises
      ``UnsupportedServerError`` at the first call that needs them.

    A Client is bound to the event loop it first runs on, and started on
    first use or by ``async with``. ``aclose()`` is idempotent. On close,
    tasks waiting for a lock get ClientClosedError; locks still held are
    marked lost (their ``async with`` bodies are cancelled, their on_lost
    callbacks run) and released in Redis, so that other processes do not
    wait out the lease.
    """

    def __init__(
        self,
        redis: aioredis.Redis | RedisCluster,
        *,
        prefix: str = "aiolock",
        lease: float = 30.0,
        notify: Notify = "pubsub",
        command_timeout: float = 10.0,
        backoff: Backoff | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        wait_aof: bool = False,
        telemetry: bool = True,
        lock_label: LockLabel | None = None,
        scripting: Scripting = "auto",
    ) -> None:
        options = check_options(
            redis,
            prefix=prefix,
            lease=lease,
            notify=notify,
            command_timeout=command_timeout,
            backoff=backoff,
            replicas=replicas,
            replica_timeout=replica_timeout,
            wait_aof=wait_aof,
            telemetry=telemetry,
            lock_label=lock_label,
            scripting=scripting,
        )
        self._engine = Engine(redis, options, cluster=None, cluster_client=None)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "aiolock",
        lease: float = 30.0,
        notify: Notify = "pubsub",
        command_timeout: float = 10.0,
        backoff: Backoff | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        wait_aof: bool = False,
        telemetry: bool = True,
        lock_label: LockLabel | None = None,
        scripting: Scripting = "auto",
        cluster: bool | None = None,
    ) -> Client:
        """A Client with its own connections to ``url`` (``redis://``, ``rediss://``, ``unix://``).

        ``cluster``: ``None`` (the default) asks the server on first use
        (one ``INFO cluster``) and, if it is a Redis Cluster or Valkey
        Cluster node, discovers the cluster from it and runs in cluster
        mode; ``True`` treats ``url`` as a seed node of a cluster (no
        question asked); ``False`` treats it as a standalone server. Cluster
        mode needs Redis 7.0 or Valkey 7.2 or newer on every node
        (``UnsupportedServerError`` at the first command otherwise).
        ``UnsupportedServerError`` also when the mode does not match the
        server: ``True`` on a standalone server (at the first command), or
        ``False`` on a cluster node (at the first command for a key another
        node serves: the node answers MOVED, which a standalone Client does
        not follow). A ``cluster`` that is not a bool or None raises
        ``InvalidArgumentTypeError`` here, before any I/O.
        """
        if not isinstance(url, str) or not url:
            raise InvalidArgumentTypeError(f"url must be a non-empty str, got {url!r}")
        if cluster is not None and not isinstance(cluster, bool):
            raise InvalidArgumentTypeError(
                f"cluster must be True, False or None (find out), got {cluster!r}"
            )
        try:
            redis: aioredis.Redis | RedisCluster = (
                RedisCluster.from_url(url) if cluster else aioredis.Redis.from_url(url)
            )
        except (ValueError, RedisClusterException) as exc:  # redis-py's parse: scheme, port...
            shown = re.sub(r"//[^/@]*@", "//***@", url)  # no password in messages
            raise InvalidArgumentError(
                f"invalid Redis URL {shown!r}: {sentence(exc)} "
                "Use redis://[[user]:password@]host[:port][/db], rediss://... (TLS) "
                "or unix://[[user]:password@]/path/to/socket[?db=N], with a numeric "
                "port and db, and query arguments of the right type "
                "(e.g. ?socket_connect_timeout=5)"
            ) from exc
        options = check_options(
            redis,
            prefix=prefix,
            lease=lease,
            notify=notify,
            command_timeout=command_timeout,
            backoff=backoff,
            replicas=replicas,
            replica_timeout=replica_timeout,
            wait_aof=wait_aof,
            telemetry=telemetry,
            lock_label=lock_label,
            scripting=scripting,
        )
        client = cls.__new__(cls)
        client._engine = Engine(
            redis,
            options,
            cluster=cluster,
            cluster_client=lambda: RedisCluster.from_url(url),
        )
        client._engine.owns_redis = True
        return client

    @classmethod
    def from_sentinel(
        cls,
        sentinels: Sequence[tuple[str, int]],
        service: str,
        *,
        prefix: str = "aiolock",
        lease: float = 30.0,
        notify: Notify = "pubsub",
        command_timeout: float = 10.0,
        backoff: Backoff | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        wait_aof: bool = False,
        telemetry: bool = True,
        lock_label: LockLabel | None = None,
        scripting: Scripting = "auto",
        username: str | None = None,
        password: str | None = None,
        db: int = 0,
        ssl: bool = False,
        sentinel_username: str | None = None,
        sentinel_password: str | None = None,
        sentinel_ssl: bool = False,
    ) -> Client:
        """A Client on the master of ``service``, as the Sentinels at ``sentinels`` name it.

        ``sentinels``: ``(host, port)`` pairs of the service's Sentinels (one
        is enough; more keep discovery working while some are down).
        ``username``, ``password``, ``db``, ``ssl``: the master's (and its
        replicas') settings; ``sentinel_username``, ``sentinel_password``,
        ``sentinel_ssl``: the Sentinels' own. The other options are
        ``Client``'s.

        The master is asked of the Sentinels on every connect, and each
        connection checks that the server says it is the master (ROLE). The
        Client follows a failover: a ``READONLY`` reply (that command fails
        with ``ServerUnavailableError``, code ``READONLY``: retryable, waits
        ride it out), a lost connection, or a change of the master the
        Sentinels name (their ``+switch-master``, watched on one Sentinel, and
        asked every watchdog round, at most 2 s apart) drops every connection;
        the next ones go to the new master, and every hold is verified there
        (a hold it lacks is lost: ``LockLostError`` in ``async with``, the
        ``on_lost`` callbacks). The old master of a manual failover stays a
        writable master for seconds: nothing is granted there once the
        Sentinels switched. Each question to a Sentinel times out after 2 s.
        The same holds for ``Client(Sentinel(...).master_for(service))``.

        Bad arguments raise ``InvalidArgumentError`` /
        ``InvalidArgumentTypeError`` here, before any I/O; a service the
        Sentinels do not monitor raises ``InvalidArgumentError`` (naming it)
        at the first use.
        """
        pairs = check_sentinels(sentinels)
        if not isinstance(service, str):
            raise InvalidArgumentTypeError(
                f"service must be the str name the Sentinels monitor (e.g. 'mymaster'), "
                f"got {service!r}"
            )
        if not service:
            raise InvalidArgumentError(
                "service must be the non-empty name the Sentinels monitor (e.g. 'mymaster'), got ''"
            )
        master_kwargs: dict[str, Any] = {"db": db}
        sentinel_kwargs: dict[str, Any] = {}
        for kwargs, user, secret, tls, what in (
            (master_kwargs, username, password, ssl, ""),
            (sentinel_kwargs, sentinel_username, sentinel_password, sentinel_ssl, "sentinel_"),
        ):
            if user is not None and not isinstance(user, str):
                raise InvalidArgumentTypeError(
                    f"{what}username must be a str or None, got {user!r}"
                )
            if secret is not None and not isinstance(secret, str):
                raise InvalidArgumentTypeError(f"{what}password must be a str or None")
            if not isinstance(tls, bool):
                raise InvalidArgumentTypeError(f"{what}ssl must be True or False, got {tls!r}")
            if user is not None:
                kwargs["username"] = user
            if secret is not None:
                kwargs["password"] = secret
            if tls:
                kwargs["ssl"] = True
        if isinstance(db, bool) or not isinstance(db, int):
            raise InvalidArgumentTypeError(f"db must be an int >= 0, got {db!r}")
        if db < 0:
            raise InvalidArgumentError(f"db must be an int >= 0, got {db!r}")
        # A Sentinel that stops answering (paused, black-holed) must not stall
        # discovery: redis-py asks the Sentinels in turn, each within this.
        sentinel_kwargs.setdefault("socket_timeout", SENTINEL_TIMEOUT)
        sentinel_kwargs.setdefault("socket_connect_timeout", SENTINEL_TIMEOUT)
        sentinel = aioredis.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            pairs, sentinel_kwargs=sentinel_kwargs, **master_kwargs
        )
        redis = sentinel.master_for(service)
        options = check_options(
            redis,
            prefix=prefix,
            lease=lease,
            notify=notify,
            command_timeout=command_timeout,
            backoff=backoff,
            replicas=replicas,
            replica_timeout=replica_timeout,
            wait_aof=wait_aof,
            telemetry=telemetry,
            lock_label=lock_label,
            scripting=scripting,
        )
        client = cls.__new__(cls)
        client._engine = Engine(redis, options, cluster=False, cluster_client=None)
        client._engine.owns_redis = True
        return client

    # -- primitives ------------------------------------------------------------------

    def lock(self, name: str) -> AsyncLock:
        """A reentrant distributed lock (see :class:`aiolock.AsyncLock`). Cheap: no I/O."""
        return AsyncLock(self._engine, name)

    def fair_lock(self, name: str) -> FairLock:
        """A reentrant lock granted in strict FIFO order across all Clients."""

        return FairLock(self._engine, name)

    def rw_lock(self, name: str) -> ReadWriteLock:
        """A read-write lock: ``.read`` (shared) and ``.write`` (exclusive)."""

        return ReadWriteLock(self._engine, name)

    def semaphore(self, name: str, permits: int) -> Semaphore:
        """At most ``permits`` holders at once; every permit is a lease."""

        return Semaphore(self._engine, name, permits)

    def spin_lock(self, name: str, *, backoff: Backoff | None = None) -> SpinLock:
        """The AsyncLock protocol without pub/sub: capped exponential backoff."""

        return SpinLock(self._engine, name, backoff=backoff)

    def multi_lock(self, *locks: AsyncLock) -> MultiLock:
        """All or nothing over several locks, taken in a fixed order."""

        return MultiLock(self._engine, *locks)

    def latch(self, name: str, count: int) -> Latch:
        """A distributed count-down latch."""

        return Latch(self._engine, name, count)

    async def adopt(self, handle: str) -> Lease:
        """Take over a hold another Client gave out as ``lease.handle`` (in any
        process): a Lease of the same hold (same name, same fencing token),
        owned by the calling task, renewed by this Client if the original was
        renewed, and released through it. The giving Client's lease then
        reports ``released``, not lost. A handle is adopted once: a stale or
        already adopted one raises LockNotOwnedError; a malformed one
        InvalidArgumentError (a ValueError), before any round trip. See
        ``aiolock/_primitives/adopt.py`` and the README ("Handing a hold over")."""
        return await adopt(self._engine, handle)

    def singleflight(
        self,
        name: str,
        *,
        ttl: float = 0.0,
        serializer: Serializer | None = None,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> Singleflight:
        """Concurrent calls of ``name``, in any process, run a function once:
        ``await sf.run(fn, ...)`` or ``@client.singleflight(name)`` (see Singleflight)."""

        return Singleflight(self._engine, name, ttl=ttl, serializer=serializer, max_size=max_size)

    def election(self, name: str) -> Election:
        """Leader election over a lock of its own kind (see :class:`aiolock.Election`)."""

        return Election(self._engine, name)

    # -- fenced writes -------------------------------------------------------------------

    async def fenced_set(
        self, key: str | bytes, value: str | bytes, token: int, *, ttl: float | None = None
    ) -> bool:
        """Write ``value`` at ``key`` unless a newer fencing token wrote there; True if written.

        The resource side of fencing, for data kept in Redis: pass the
        ``lease.fencing_token`` of the lock that guards ``key``. The write
        happens only if ``token`` is not lower than the newest token ``key``
        has accepted (equal is accepted: the same holder writing again, or a
        retry); a lower token changes nothing and returns False. Compare and
        write are one script: atomic, on one cluster node.

        * The value is a plain string at ``key`` (read it with ``GET``); the
          newest accepted token is kept at ``fence_key(key)``, in the same
          cluster slot. Writers of one key must use one Client ``prefix`` and
          tokens of one lock name (tokens of two names are not comparable).
        * ``ttl``: seconds the value lives (``SET ... PX``); None: no expiry.
          The fence gets the same TTL at every accepted write, so it lives as
          long as the value. A value deleted by other means (``DEL``) leaves
          its fence, which goes on refusing older tokens until deleted too.
        * Bad arguments (``key`` not a non-empty str/bytes, ``value`` not
          str/bytes, ``token`` not an int from 0 to 2**63 - 1, a bad ``ttl``)
          raise ``InvalidArgumentTypeError`` / ``InvalidArgumentError`` before
          any round trip. Either key holding another type of value:
          ``WrongTypeError``, nothing written.
        * Cancelled while the script is on the wire: it may have written or
          not (all or nothing). Calling again with the same token is safe.
        * With ``replicas=N`` the write is not waited for on replicas (only
          acquisitions are): a failover may lose it, as any unacknowledged
          write.
        """
        return await fenced.fenced_set(self._engine, key, value, token, ttl)

    def fence_key(self, key: str | bytes) -> str | bytes:
        """The key where ``fenced_set`` keeps ``key``'s newest accepted token
        (``<prefix>:fenced:{<tag of key's slot>}:<key>``; no I/O)."""
        return fenced.fence_key(self._engine.prefix, fenced.check_key(key))

    # -- options -------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """This Client's random 128-bit id (hex): the first part of every owner id."""
        return self._engine.id

    @property
    def prefix(self) -> str:
        return self._engine.prefix

    @property
    def lease(self) -> float:
        return self._engine.lease

    @property
    def notify(self) -> Notify:
        return self._engine.notify

    @property
    def command_timeout(self) -> float:
        return self._engine.command_timeout

    @property
    def replicas(self) -> int:
        """Replicas that acknowledge every acquisition and renewal (0: none asked)."""
        return self._engine.replicas

    @property
    def replica_timeout(self) -> float:
        return self._engine.replica_timeout

    @property
    def wait_aof(self) -> bool:
        return self._engine.wait_aof

    @property
    def backoff(self) -> Backoff:
        return self._engine.backoff

    def key(self, name: str) -> str:
        """The main key of ``name`` in Redis, ``<prefix>:{<name>}`` (no I/O)."""
        return main_key(self._engine.prefix, name)

    def owner(self, task: asyncio.Task[Any]) -> str:
        """The owner id of ``task``'s holds in this Client, ``<client id>:<task serial>``."""
        return self._engine.owner(task)

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._engine.enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        return self._engine.closed

    async def aclose(self) -> None:
        """Close the Client. Idempotent. See the class docstring for what happens to holds."""
        await self._engine.aclose()

    # -- introspection -------------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        """A snapshot of this Client's local state (no round trip)."""
        return self._engine.statistics()

    def __repr__(self) -> str:
        engine = self._engine
        if engine.closed:
            return f"<aiolock.Client {engine.id[:8]} closed>"
        s = engine.statistics()
        return (
            f"<aiolock.Client {engine.id[:8]} prefix={engine.prefix!r} lease={engine.lease:g}s "
            f"holds={s.holds} waiting={s.waiting} subscriptions={s.subscriptions}>"
        )


def engine_of(client: Client) -> Engine:
    """The Engine of ``client``. Internal to the package (not exported, not
    public API): the seam for what composes Clients, such as Redlock's
    quorum engine (aiolock/_redlock/), which runs over each Client's Engine."""
    return client._engine
