"""Deployments: how one Client reaches the server or servers behind it.

The Engine holds one ``Deployment``, chosen once from what the user gave
(``deployment_for``), and asks it, never a mode flag, how to reach a key:

* ``Standalone``: one server (or a proxy in front of one). The Engine's
  lanes are one command connection each; nothing to discover.
* ``Sentinel``: a master that Sentinels name (a ``Sentinel.master_for``
  client). The lanes are standalone ones whose ``READONLY`` reply means the
  master was demoted (``Capabilities.follows_master``); a ``SentinelWatch``
  follows the Sentinels, and a change of master drops every connection and
  verifies every hold on the new master (``master_switched``).
* ``Cluster``: a Redis Cluster. Discovery reads the slot map; the lanes
  become ``ClusterMux`` routers (one connection per master), pub/sub becomes
  sharded (``ShardedListener``), the signal lists follow their slot's
  master, the watchdog batches renewals per master, and every script runs
  in its cluster variant.
* ``Discover``: not known yet (``Client(redis)`` with a plain client, or
  ``Client.from_url(url)``). The first command asks ``INFO cluster`` and the
  deployment becomes a ``Standalone`` or a ``Cluster``.

Each deployment owns its discovery (``settle``), its routing (``shard``,
and the lanes it installs, which route by key), its pub/sub (the listener
and signal hub it installs) and its failover behaviour, and describes what
the server can do (``capabilities``). A Redis-compatible server with one
quirk is one more capability read where the quirk matters, or one more
subclass here: nothing else changes (see ARCHITECTURE.md's walk-throughs).

A deployment reaches the Engine only through ``Wiring``, the Protocol
below, which the Engine satisfies structurally: this module does not
import the Engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any, ClassVar, Protocol

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ..capabilities import STANDALONE, Capabilities
from ..errors import ServerRefusedError, UnsupportedServerError, clause
from ..protocol.scripts import Script, load_scripts
from ..protocol.slots import slot_of
from ..transport.connection import CommandConnection, Lane
from ..transport.redis_compat import ConnectionFactory, SentinelService, sentinel_service
from ..transport.replication import AckedConnection, Acknowledgement, acked_node
from ..waiting.listener import Listener
from ..waiting.notify import SignalHub
from .cluster import Topology
from .mux import ClusterMux, check_versions
from .sentinel import SentinelWatch
from .sharded import ShardedListener

__all__ = [
    "Capabilities",
    "Cluster",
    "Deployment",
    "Discover",
    "Sentinel",
    "Standalone",
    "Wiring",
    "deployment_for",
]

conn_log = logging.getLogger("aiolock.connection")
sentinel_log = logging.getLogger("aiolock.sentinel")




class Closable(Protocol):
    """A redis-py client (``Redis``, ``RedisCluster``), as far as closing it goes."""

    async def aclose(self) -> None: ...


class Rounds(Protocol):
    """The watchdog, as a deployment sees it: its round (the Sentinel watch
    asks as often), and its batching of renewals per server."""

    interval: float

    def shard_by(self, slot: Callable[[Any], int], node: Callable[[int], Hashable]) -> None: ...


class Wiring(Protocol):
    """What a deployment sets up on the Engine, and reads of it.

    The Engine satisfies it structurally: the lanes and the listener a
    deployment installs, the options that shape them, and the hooks they
    call back (a lost connection resets the epoch: ``connection_reset``).
    """

    mux: Lane
    renew_mux: Lane
    acked_lane: Lane | None
    listener: Listener | ShardedListener
    signals: SignalHub
    ack: Acknowledgement | None
    command_timeout: float
    closed: bool
    started: bool

    @property
    def watchdog(self) -> Rounds: ...

    scripts: dict[str, Script]
    client_name: str
    new_connection: ConnectionFactory

    def connection_reset(self) -> None: ...

    def reprobe(self) -> None: ...


class Deployment:
    """One way to reach the server(s); the base is a single server's behaviour."""

    #: What the deployment is called (logs, ``repr``).
    name: ClassVar[str] = "standalone"
    #: The mode's capabilities, then what the probe found (the Engine sets it).
    capabilities: Capabilities = STANDALONE
    #: The slot map (``Cluster`` only, once discovered).
    topology: Topology | None = None
    #: Whether ``settle`` ran (or none was needed): commands go straight to the lanes.
    settled: bool = True

    @property
    def cluster(self) -> bool | None:
        """Cluster mode: True, False, or None while not known (``Discover``)."""
        return False

    def install(self, engine: Wiring) -> None:
        """Make the Engine's first lanes, listener and signal hub: standalone
        ones, over ``engine.new_connection`` (``Cluster`` replaces them once
        it knows the slot map)."""
        engine.mux = self.lane(engine, role="command")
        # The watchdog's own lane: renewals never queue behind a burst of acquires.
        engine.renew_mux = self.lane(engine, role="renewal", renewals=True)
        engine.acked_lane = (
            self.lane(engine, role="acknowledged command", renewals=False, acked=True)
            if engine.ack is not None
            else None
        )
        engine.listener = Listener(engine.new_connection, on_reset=engine.connection_reset)
        engine.signals = SignalHub(
            engine.new_connection,
            command_timeout=engine.command_timeout,
            capabilities=self.capabilities,
        )

    def lane(
        self, engine: Wiring, *, role: str, renewals: bool = True, acked: bool = False
    ) -> Lane:
        """A standalone lane; acknowledged (``AckedConnection``) for the
        renewals and the acknowledged acquisitions when replicas must ack."""
        ack = engine.ack
        if ack is None or (role == "command" and not acked):
            return CommandConnection(
                engine.new_connection,
                command_timeout=engine.command_timeout,
                on_reset=engine.connection_reset,
                capabilities=self.capabilities,
                role=role,
            )
        return AckedConnection(
            engine.new_connection,
            ack=ack,
            renewals=renewals,
            command_timeout=engine.command_timeout,
            on_reset=engine.connection_reset,
            capabilities=self.capabilities,
            role=role,
        )

    async def settle(self, engine: Wiring) -> Deployment:
        """Discover what must be discovered and install it on ``engine``; the
        deployment that serves from now on (``self``, or what ``Discover``
        found). Fails like a command; the next command calls it again."""
        return self

    def shard(self, key: Any) -> Hashable:
        """Which server serves ``key``: None, one server serves every key."""
        return None

    async def aclose(self, owned: Closable | None) -> None:
        """Close what the deployment made, and ``owned`` (the user-level client
        the Client made itself: from_url, from_sentinel) in its place in that
        order; None: the user's client is the user's to close."""
        if owned is not None:
            await owned.aclose()


class Standalone(Deployment):
    """One server: nothing to discover, every key on the one connection."""


class Sentinel(Deployment):
    """A master named by Sentinels, followed through failovers (sentinel.py)."""

    name = "sentinel"
    capabilities = Capabilities(follows_master=True)

    def __init__(self, service: SentinelService) -> None:
        self.service = service
        self.settled = False
        self.watch: SentinelWatch | None = None
        self._engine: Wiring | None = None

    async def settle(self, engine: Wiring) -> Deployment:
        """Check that the Sentinels know the service, then watch them for a
        change of master (``SentinelWatch``). Once: the settling after a
        failover (the probe's, ``reprobe``) finds it watching."""
        if self.settled:
            return self
        self._engine = engine
        watch = SentinelWatch(
            self.service,
            client_name=engine.client_name,
            command_timeout=engine.command_timeout,
            interval=engine.watchdog.interval,
            on_switch=self.master_switched,
        )
        try:
            await watch.start()
        except BaseException:
            await watch.aclose()
            raise
        self.watch = watch
        self.settled = True
        return self

    def master_switched(self, reason: str) -> None:
        """The Sentinels name another master: drop every connection (each
        reconnects to the master named now) and verify every hold there (a
        hold the new master lacks is lost). The old master may stay a
        writable master for seconds: nothing may be granted there any more."""
        engine = self._engine
        if engine is None or engine.closed:
            return
        sentinel_log.warning("%s; following the new master (every hold is verified there)", reason)
        for lane in (engine.mux, engine.renew_mux, engine.acked_lane):
            if isinstance(lane, CommandConnection):
                lane.reset(f"the master changed: {reason}")
        if isinstance(engine.listener, Listener):
            engine.listener.reset()
        engine.signals.reset(f"the master changed: {reason}")
        engine.connection_reset()
        # Another server: what it is and allows is asked again before the
        # next command (it may refuse what the old master allowed).
        engine.reprobe()

    async def aclose(self, owned: Closable | None) -> None:
        if self.watch is not None:  # (a switch it reports now finds the Client closed)
            await self.watch.aclose()
        if owned is not None:
            # The master's client first (its pool asks the Sentinels' clients),
            # then, from_sentinel, the Sentinels' clients.
            await owned.aclose()
            await self.service.aclose()


class Cluster(Deployment):
    """A Redis Cluster: keys routed to their slot's master (mux.py)."""

    name = "cluster"
    capabilities = Capabilities(sharded=True)

    def __init__(self, client: RedisCluster, *, owns_client: bool) -> None:
        self.client = client
        self.owns_client = owns_client
        self.settled = False

    @property
    def cluster(self) -> bool | None:
        return True

    async def settle(self, engine: Wiring) -> Deployment:
        """Discover the slot map, then install one lane of connections per
        master for commands and one for renewals, sharded pub/sub, and the
        cluster variant of every script. Once (a cluster's nodes run one
        version: ``check_versions``; it is not probed again on failover)."""
        if self.settled:
            return self
        topology = Topology(self.client, engine.client_name, engine.command_timeout)
        try:
            await topology.refresh()
        except BaseException:  # (cancelled too: aclose() stopped us)
            await topology.aclose()
            raise
        engine.scripts = load_scripts(cluster=True)  # (each node's connection loads them)
        reset = engine.connection_reset
        lane = partial(ClusterMux, topology, command_timeout=engine.command_timeout, on_reset=reset)
        mux = lane()
        try:
            await check_versions(mux)
        except BaseException:
            await mux.aclose()  # the next command starts over
            await topology.aclose()
            raise
        self.topology = topology
        engine.watchdog.shard_by(slot_of, topology.node)
        engine.mux = mux
        ack = engine.ack
        engine.renew_mux = lane(
            node_connection=None if ack is None else partial(acked_node, ack, renewals=True),
            role="renewal",
        )
        if ack is not None:
            # One acknowledged connection per master for the acquisitions.
            old_acked, engine.acked_lane = (
                engine.acked_lane,
                lane(
                    node_connection=partial(acked_node, ack, renewals=False),
                    role="acknowledged command",
                ),
            )
            if old_acked is not None:
                await old_acked.aclose()
        listener = ShardedListener(topology, on_reset=reset)

        def changed() -> None:
            # A slot has another master: its channels move, and the holds are
            # checked (a replica promoted without any connection lost here, a
            # FAILOVER FORCE or TAKEOVER, may lack the last writes).
            listener.rehome()
            reset()

        topology.on_change = changed
        old, engine.listener = engine.listener, listener
        if engine.started:
            listener.start()
        await old.aclose()
        old_signals, engine.signals = (
            engine.signals,
            SignalHub(
                engine.new_connection,
                command_timeout=engine.command_timeout,
                factory_for=topology.factory_for,
                on_failure=topology.refresh_soon,
            ),
        )
        await old_signals.aclose()
        self.settled = True
        return self

    def shard(self, key: Any) -> Hashable:
        """The name (``host:port``) of the master of ``key``'s slot by the
        current slot map (None while no master serves it)."""
        topology = self.topology
        return None if topology is None else topology.node(slot_of(key))

    async def aclose(self, owned: Closable | None) -> None:
        if self.topology is not None:
            await self.topology.aclose()
        if owned is not None:
            await owned.aclose()
        if self.owns_client:
            await self.client.aclose()


class Discover(Deployment):
    """Not known yet: the first command asks ``INFO cluster`` and becomes a
    ``Standalone`` or a ``Cluster`` (made by ``cluster_client()``)."""

    name = "discovering"

    def __init__(self, cluster_client: Callable[[], RedisCluster] | None) -> None:
        self.settled = False
        self._make_cluster_client = cluster_client
        self._found: Deployment | None = None

    @property
    def cluster(self) -> bool | None:  # (a cluster node, even if its discovery failed)
        return None if self._found is None else self._found.cluster

    async def settle(self, engine: Wiring) -> Deployment:
        if self._found is None:
            self._found = await self._probe(engine)
        return await self._found.settle(engine)

    async def _probe(self, engine: Wiring) -> Deployment:
        try:
            info = await engine.mux.call(b"INFO", b"cluster")
        except ServerRefusedError as exc:
            # INFO refused (an ACL user without it, a renamed command, a
            # proxy): take it for a standalone server; a cluster node would
            # answer MOVED, which says so (from_url(..., cluster=True)).
            conn_log.info("INFO refused (%s); taking the server for a standalone one", exc)
            info = b""
        if b"cluster_enabled:1" not in info:
            return Standalone()
        if self._make_cluster_client is None:
            raise UnsupportedServerError(
                "this server is a Redis Cluster node, and this Client was given a "
                "plain redis.asyncio.Redis: pass a redis.asyncio.RedisCluster "
                "(Client(RedisCluster(host=..., port=...))) or use "
                "Client.from_url(url), which finds the cluster by itself"
            )
        try:
            client = self._make_cluster_client()
        except Exception as exc:  # redis-py refuses the URL for a cluster (e.g. a db)
            raise UnsupportedServerError(
                f"this server is a Redis Cluster node, but its URL cannot make a "
                f"cluster client: {clause(exc)}. Fix the URL (a cluster has database 0 only), "
                "or pass a redis.asyncio.RedisCluster"
            ) from exc
        await engine.mux.aclose()
        # Known now: if discovery fails, the next command retries discovery
        # (not the INFO, on the connection just closed).
        return Cluster(client, owns_client=True)

    async def aclose(self, owned: Closable | None) -> None:
        if self._found is not None:
            await self._found.aclose(owned)
        elif owned is not None:
            await owned.aclose()


def deployment_for(
    redis: aioredis.Redis | RedisCluster,
    *,
    cluster: bool | None,
    cluster_client: Callable[[], RedisCluster] | None,
) -> Deployment:
    """The deployment of a Client made on ``redis``.

    ``cluster``: False (a standalone server, as given), or None: ask
    the server on first use and switch to cluster mode if it is a cluster
    node, discovering the cluster from ``cluster_client()`` (None: say that
    a RedisCluster is needed). A ``RedisCluster`` is a Cluster, and a
    ``Sentinel.master_for`` client the Sentinels' master, whatever ``cluster``.
    """
    if isinstance(redis, RedisCluster):
        return Cluster(redis, owns_client=False)
    service = sentinel_service(redis)
    if service is not None:
        return Sentinel(service)
    if cluster is None:
        return Discover(cluster_client)
    return Standalone()
