"""Everything aiolock relies on from redis-py's connection objects, in one place.

aiolock uses redis-py for what it does well and what users configure through
it: the connection settings of the ``redis.asyncio.Redis`` they pass in (host
or unix socket, TLS, username and password or a credential provider, db), and
the handshake those settings call for (AUTH or HELLO, CLIENT SETNAME, SELECT,
the TLS handshake). Once that ran, aiolock takes the socket's transport and
reads it with its own protocols (see ``dialer``): redis-py's command retries,
socket timeouts and reader task are never on aiolock's paths.

The contact:

* ``connection_factory``: the pool's ``connection_class`` and
  ``connection_kwargs`` (public), with aiolock's overrides (keyword names of
  ``AbstractConnection.__init__``);
* ``connect``: ``AbstractConnection.connect()`` (public) runs the handshake,
  then the **private** ``_writer`` attribute gives the transport. This is the
  one place that reads a private attribute of redis-py;
* ``disconnect``: ``AbstractConnection.disconnect(nowait=True)`` (public).
* Sentinel mode (``SentinelService``): a ``redis.asyncio.Sentinel(...).
  master_for(service)`` client's pool is a ``SentinelConnectionPool``
  (public class) whose ``service_name``, ``sentinel_manager`` (its
  ``sentinels``: one ``Redis`` per Sentinel) and ``master_address`` (the
  master its last connect was sent to) are public attributes, and whose
  ``connection_kwargs`` carry ``connection_pool``: a
  ``SentinelManagedConnection`` asks that pool (so the Sentinels) for the
  master's address on every ``connect()``, so it must be kept. ``connect``
  checks such a connection's ROLE after the handshake (a Sentinel may name
  a master that has just been demoted, or not yet be told of a failover),
  and puts back in the ``Sentinel``'s public ``sentinels`` list any client
  that concurrent discoveries dropped from it (``_members``), so that
  ``Sentinel.aclose()`` closes every one and discovery asks every one.

* Cluster mode (``cluster``'s ``Topology``): a ``redis.asyncio.RedisCluster``'s
  ``nodes_manager`` (public attribute, undocumented) gives the node settings
  (``connection_kwargs``) and, after ``initialize()``, the slot map
  (``slots_cache``: slot -> [primary, replicas...]). ``cluster_node`` and
  ``read_slot_map`` are the only readers of them.

``tests/test_redis_compat.py`` checks each of these against real servers, so
that a redis-py release that changes one fails there, naming it, rather than
somewhere deep in a lock test.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from ..errors import MasterChangedError

__all__ = [
    "NOT_MASTER",
    "Connection",
    "ConnectionFactory",
    "SentinelService",
    "address",
    "connect",
    "connection_factory",
    "disconnect",
    "node_connection_factory",
    "sentinel_service",
]

#: What a Sentinel-managed connect raises while no master can be reached
#: *as a master* (the Sentinels name none, or name one that says it is a
#: replica): worth another try soon, within the caller's time bound.
NOT_MASTER = (MasterChangedError, MasterNotFoundError)

#: Builds a new, unconnected redis-py connection with aiolock's settings.
#: A redis-py connection, as the rest of aiolock names it (not importing redis-py's module).
Connection = AbstractConnection
ConnectionFactory = Callable[[], AbstractConnection]


def connection_factory(client: aioredis.Redis, client_name: str) -> ConnectionFactory:
    """A factory of connections with ``client``'s settings, as aiolock needs them:
    raw bytes, RESP2, no socket read timeout (aiolock checks liveness itself),
    never retried behind aiolock's back, and named ``client_name`` on the server.

    The pool's settings are read at each call, as the pool would.
    """
    pool = client.connection_pool

    def new_connection() -> AbstractConnection:
        return _new(pool.connection_class, pool.connection_kwargs, client_name)

    return new_connection


def node_connection_factory(node: ClusterNode, client_name: str) -> ConnectionFactory:
    """``connection_factory`` for one node of a ``redis.asyncio.RedisCluster``: its
    ``ClusterNode``'s ``connection_class`` and ``connection_kwargs`` (public), the
    cluster client's credentials and TLS settings."""

    def new_connection() -> AbstractConnection:
        return _new(node.connection_class, node.connection_kwargs, client_name)

    return new_connection


def address(conn: AbstractConnection) -> str:
    """Where ``conn`` connects, for messages: ``host:port``, a Unix socket's
    path, or (a Sentinel-managed connection before it asked) its service."""
    path = getattr(conn, "path", None)
    if path:
        return str(path)
    where = f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
    if isinstance(conn, SentinelManagedConnection):
        service = getattr(conn.connection_pool, "service_name", "?")
        if where == "localhost:6379":  # redis-py's default: not asked yet
            return f"the master of {service!r}"
        return f"{where} (master of {service!r})"
    return where


def _new(cls: type[AbstractConnection], settings: dict[str, Any], name: str) -> AbstractConnection:
    kwargs = dict(settings)
    kwargs.update(
        socket_timeout=None,
        decode_responses=False,
        protocol=2,
        retry=None,
        client_name=name,
    )
    if not issubclass(cls, SentinelManagedConnection):
        # A Sentinel-managed connection asks its pool for the master's
        # address on every connect(): it keeps the pool (a weak proxy).
        kwargs.pop("connection_pool", None)
    kwargs.pop("connection_class", None)
    return cls(**kwargs)


#: Per Sentinel manager and service: the master the watching Engine last heard
#: the Sentinels name, and the masters it saw replaced since. A connect that
#: lands on a replaced one (a lagging Sentinel named the old master, which
#: stays a writable master for seconds after a manual failover) is refused
#: like one on a replica. (One the watch has not heard of yet is not: it is
#: newer, and the watch's switch will follow.)
_masters: weakref.WeakKeyDictionary[Any, dict[str, _Masters]] = weakref.WeakKeyDictionary()


class _Masters:
    __slots__ = ("current", "epoch", "retired")

    def __init__(self) -> None:
        self.current: tuple[str, int] | None = None
        self.epoch = -1  # the Sentinels' config epoch of ``current`` (-1: unknown)
        self.retired: set[tuple[str, int]] = set()


#: Per Sentinel manager, its Sentinels' clients as aiolock first saw them.
#: redis-py's ``Sentinel.discover_master`` moves the Sentinel that answered
#: to the front of ``manager.sentinels`` by a swap at an index it took before
#: its await: two discoveries at once (a Client's connections reconnecting
#: together) that both passed over the first Sentinel (it named no usable
#: master, or refused) can put the one that answered there twice and drop the
#: first. Then ``Sentinel.aclose()`` never closes the dropped client (its
#: connections stay open, found unclosed at garbage collection) and no
#: discovery asks it again. ``connect`` puts it back (``_keep_sentinels``).
_members: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def _unique(clients: list[Any]) -> list[Any]:
    """``clients`` without repeats (by identity), in order."""
    seen: set[int] = set()
    out = []
    for client in clients:
        if id(client) not in seen:
            seen.add(id(client))
            out.append(client)
    return out


def _sentinels_of(manager: aioredis.Sentinel) -> tuple[Any, ...]:
    """The Sentinels' clients of ``manager`` (recorded the first time)."""
    members = _members.get(manager)
    if members is None:
        members = _members[manager] = tuple(_unique(list(manager.sentinels)))
    return members


def _keep_sentinels(manager: aioredis.Sentinel) -> None:
    """Put back in ``manager.sentinels`` (in place, at the end) every client of
    it that concurrent discoveries dropped, and drop the repeats (``_members``)."""
    members = _members.get(manager)
    current = manager.sentinels
    if members is None or (
        len(current) == len(members) and len({id(s) for s in current}) == len(members)
    ):
        return
    kept = _unique(list(current))
    have = {id(s) for s in kept}
    current[:] = kept + [s for s in members if id(s) not in have]


class SentinelService:
    """What aiolock needs of a Sentinel-managed client (``Sentinel.master_for``):
    the service's name, its Sentinels (to watch ``+switch-master`` and ask
    ``SENTINEL get-master-addr-by-name``), where the last connect went, and
    closing the Sentinels' clients (``Client.from_sentinel`` owns them)."""

    __slots__ = ("_pool", "_sentinels", "manager", "name")

    def __init__(self, pool: SentinelConnectionPool) -> None:
        self._pool = pool
        self.name: str = pool.service_name
        self.manager: aioredis.Sentinel = pool.sentinel_manager
        #: Every Sentinel's client, whatever order discovery leaves them in.
        self._sentinels = _sentinels_of(self.manager)

    @property
    def addresses(self) -> list[str]:
        """The Sentinels as ``host:port``, for messages."""
        out = []
        for sentinel in self._sentinels:
            kwargs = sentinel.connection_pool.connection_kwargs
            out.append(f"{kwargs.get('host')}:{kwargs.get('port')}")
        return out

    def factories(self, client_name: str) -> list[ConnectionFactory]:
        """One connection factory per Sentinel, with its own settings (``sentinel_kwargs``)."""
        return [connection_factory(s, client_name) for s in self._sentinels]

    @property
    def master_address(self) -> tuple[str, int] | None:
        """The master the last connect of the client's pool was sent to (None before any)."""
        address = self._pool.master_address
        if address is None:
            return None
        host, port = cast("tuple[Any, Any]", address)
        return (host.decode() if isinstance(host, bytes) else str(host), int(port))

    def expect(self, address: tuple[str, int], epoch: int = -1) -> None:
        """The Sentinels name ``address`` the master now, at config epoch
        ``epoch`` (-1: unknown): a connect to a master they named before it is
        refused (see ``_masters``). Forward only: ignored if ``epoch`` is
        below the one recorded (another Engine on the same Sentinels may hear
        a lagging one), so a retired master is not brought back by it."""
        masters = _masters.setdefault(self.manager, {}).setdefault(self.name, _Masters())
        if epoch >= 0 and (
            epoch < masters.epoch or (epoch == masters.epoch and address != masters.current)
        ):
            return
        masters.epoch = max(masters.epoch, epoch)
        if masters.current is not None and masters.current != address:
            masters.retired.add(masters.current)
        masters.retired.discard(address)
        masters.current = address

    async def aclose(self) -> None:
        """Close the Sentinels' clients (not the master's): every one of them
        (``_keep_sentinels`` first: ``Sentinel.aclose`` closes those listed)."""
        _keep_sentinels(self.manager)
        await self.manager.aclose()


def sentinel_service(client: aioredis.Redis) -> SentinelService | None:
    """The Sentinel service behind ``client``, or None if its pool is not Sentinel-managed."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool) and getattr(pool, "is_master", True):
        return SentinelService(pool)
    return None


async def connect(conn: AbstractConnection) -> asyncio.WriteTransport:
    """Connect ``conn`` with its handshake and hand over its socket's transport.

    The caller sets its own protocol on the transport (the replies to the
    handshake have all been read) and closes it with :func:`disconnect`, also
    when this raised.
    Raises redis-py's exceptions as its ``connect()`` does over TCP
    (``ConnectionError``, ``AuthenticationError``, ``ResponseError``...).
    """
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
    except RedisConnectionError as exc:
        # A unix socket connection runs its handshake inside its socket
        # connect, where redis-py wraps any error in a plain ConnectionError:
        # a refused AUTH (or SELECT) is a refusal there too, as over TCP.
        cause = exc.__cause__
        if type(exc) is RedisConnectionError and isinstance(cause, RedisError):
            raise cause from None
        raise
    finally:
        if isinstance(conn, SentinelManagedConnection):
            # Its discovery may have raced another one (see _members).
            _keep_sentinels(conn.connection_pool.sentinel_manager)
    if isinstance(conn, SentinelManagedConnection):
        await _check_master(conn)
    # redis-py offers no public way to the transport: its stream writer is
    # the private `_writer` (set by every connection class's `_connect`).
    writer = getattr(conn, "_writer", None)
    if not isinstance(writer, asyncio.StreamWriter):
        raise RedisConnectionError(
            f"redis-py {redis.__version__}: {type(conn).__name__}._writer is "
            f"{type(writer).__name__} after connect(), not an asyncio.StreamWriter; "
            "this aiolock does not support this redis-py version"
        )
    return writer.transport


async def _check_master(conn: SentinelManagedConnection) -> None:
    """Sentinel mode: the server the Sentinels named must say it is the master
    (ROLE), else ``MasterChangedError`` (the caller tries again soon). A ROLE
    refused (an ACL user without it) is taken for a yes: a READONLY reply
    still tells a replica later."""
    await conn.send_command("ROLE")
    try:
        reply = await conn.read_response()
    except ResponseError:
        return
    role = reply[0] if isinstance(reply, list) and reply else reply
    pool = conn.connection_pool
    if role in (b"master", "master"):
        manager = pool.sentinel_manager
        masters = _masters.get(manager, {}).get(pool.service_name)
        # (Sentinel(force_master_ip=...) connects to that address, whatever
        # the Sentinels name: no telling masters apart. A private attribute.)
        if (
            masters is None
            or masters.current is None
            or getattr(manager, "_force_master_ip", None) is not None
            or (str(conn.host), int(conn.port)) not in masters.retired
        ):
            return
        current = masters.current
        raise MasterChangedError(
            f"READONLY {conn.host}:{conn.port} says it is a master, but the Sentinels "
            f"now name {current[0]}:{current[1]} the master of {pool.service_name!r} "
            "(it is the old master of a failover)"
        )
    if isinstance(role, bytes):
        role = role.decode(errors="replace")
    raise MasterChangedError(
        f"READONLY the Sentinels named {conn.host}:{conn.port} the master of "
        f"{conn.connection_pool.service_name!r}, and it says it is a {role} "
        "(a failover is under way)"
    )


async def disconnect(conn: AbstractConnection) -> None:
    """Close ``conn``'s socket. ``nowait``: once another protocol took the
    transport, redis-py's stream never learns that it closed, so waiting for
    that would wait for ever."""
    await conn.disconnect(nowait=True)


def cluster_node(cluster: RedisCluster, host: str, port: int) -> ClusterNode:
    """A ``ClusterNode`` for ``host:port`` with the cluster client's settings
    (TLS, credentials, timeouts): for a node its slot map does not list yet."""
    return ClusterNode(host, port, **cluster.nodes_manager.connection_kwargs)


async def read_slot_map(cluster: RedisCluster, first: bool) -> dict[int, ClusterNode]:
    """Ask the cluster for its slot map (``CLUSTER SLOTS`` on the known nodes);
    returns each served slot's master. ``first``: the public ``initialize()``
    (a no-op if the user's client ran it), which also marks the client
    initialized so that its ``aclose()`` closes the connections discovery
    opened; later: the nodes manager's own ``initialize()`` (reads it again)."""
    manager = cluster.nodes_manager
    if first:
        await cluster.initialize()
    else:
        await manager.initialize()
    return {slot: nodes[0] for slot, nodes in manager.slots_cache.items() if nodes}
