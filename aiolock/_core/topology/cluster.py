"""Redis Cluster and Valkey Cluster: the slot map (discovery, refreshes), the servers' versions.

The slot map comes from redis-py's cluster discovery
(``NodesManager.initialize``: CLUSTER SLOTS on the seed nodes, with the
user's credentials and TLS settings), never from its command path. The
commands are routed over it by ``mux.py`` (``ClusterMux``, one command lane
per master); the sharded pub/sub listens over it in ``sharded.py``
(``ShardedListener``).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

from ..errors import (
    ConnectionFailedError,
    UnsupportedServerError,
    clause,
    from_redis,
)
from ..futures import retrieve, stop
from ..outage import Outage
from ..protocol.slots import slot_of
from ..transport.redis_compat import (
    ConnectionFactory,
    cluster_node,
    node_connection_factory,
    read_slot_map,
)

__all__ = [
    "MIN_VERSION",
    "RESEND_CAP",
    "Topology",
    "check_version",
    "server_version",
]

log = logging.getLogger("aiolock.cluster")

#: Seconds a MOVED outranks a slot map read from a node that disagrees.
MOVE_MEMORY = 1.0
#: The oldest server a cluster-mode Client runs on (Valkey 7.2 reports 7.2.x).
MIN_VERSION = (7, 0)
#: The longest pause before re-sending a command that did not run (CLUSTERDOWN,
#: TRYAGAIN, an unreachable master): a failover is noticed this soon after it ends.
RESEND_CAP = 0.25


class Topology:
    """The slot map of one cluster, from redis-py's discovery, and its refreshes.

    ``node(slot)`` is the name (``host:port``) of the slot's master; a
    ``MOVED`` corrects one slot at once; ``refresh()`` asks the cluster again
    (one refresh at a time; callers share it).
    """

    def __init__(self, cluster: RedisCluster, client_name: str, timeout: float = 10.0) -> None:
        self._cluster = cluster
        self.timeout = timeout
        self._client_name = client_name
        self._slots: list[str | None] = [None] * 16384
        self._nodes: dict[str, ClusterNode] = {}
        self._factories: dict[str, ConnectionFactory] = {}
        self.closed = False
        # slot -> (the master a MOVED named, when): see _refresh.
        self._recent_moves: dict[int, tuple[str, float]] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self.refreshes = 0
        #: The run of failed refreshes under way (one WARNING, one INFO).
        self.outage = Outage()
        #: Called with the node names whose slots changed owner, after a refresh.
        self.on_change: Callable[[], None] | None = None
        # Also called after a refresh that changed the map (see ``watch``).
        self._watchers: list[Callable[[], None]] = []

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every refresh that changed the map (each
        ``ClusterMux`` re-sends its commands waiting out a failover at once)."""
        self._watchers.append(callback)

    def node(self, slot: int) -> str | None:
        return self._slots[slot]

    def masters(self) -> list[str]:
        return sorted({name for name in self._slots if name is not None})

    def factory(self, name: str) -> ConnectionFactory:
        """Connections to node ``name`` with the cluster client's settings (one
        factory per node: the same object each time)."""
        factory = self._factories.get(name)
        if factory is not None:
            return factory
        node = self._nodes.get(name)
        if node is None:
            host, _, port = name.rpartition(":")
            node = self._nodes[name] = cluster_node(self._cluster, host, int(port))
        factory = self._factories[name] = node_connection_factory(node, self._client_name)
        return factory

    def factory_for(self, key: bytes) -> ConnectionFactory:
        """``factory`` of the master of ``key``'s slot (any master while it has none)."""
        name = self.node(slot_of(key))
        if name is None:
            masters = self.masters()
            if not masters:
                raise ConnectionFailedError("the cluster serves no slot right now; retry")
            name = masters[0]
        return self.factory(name)

    def moved(self, slot: int, name: str) -> None:
        """A MOVED said ``slot`` is served by ``name`` now: ``on_change`` runs at
        once (the refresh that follows compares with the corrected map, so it
        would not report this slot's change)."""
        self._recent_moves[slot] = (name, asyncio.get_running_loop().time())
        if self._slots[slot] != name:
            self._slots[slot] = name
            self.refresh_soon()
            if self.on_change is not None:
                self.on_change()

    def refresh_soon(self) -> None:
        """Refresh the map in the background (a no-op while one runs). A failure
        is logged by the refresh; the map stays as it was until the next one."""
        self._start_refresh()

    async def refresh(self) -> None:
        """Ask the cluster for its slot map now (sharing a refresh under way).
        Raises ConnectionFailedError if no known node answered with a map."""
        await asyncio.shield(self._start_refresh())

    def _refresh_unless_closed(self) -> None:
        if not self.closed:
            self._start_refresh()

    def _start_refresh(self) -> asyncio.Task[None]:
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.get_running_loop().create_task(
                self._refresh(), name="aiolock-cluster-refresh"
            )
            task.add_done_callback(retrieve)  # a background refresh's failure is logged
        return task

    async def _refresh(self) -> None:
        try:
            # Bounded: a paused seed node would hold redis-py's discovery for ever.
            async with asyncio.timeout(self.timeout):
                masters = await read_slot_map(self._cluster, first=self.refreshes == 0)
        except Exception as exc:  # redis-py's RedisClusterException is no RedisError
            refusal = _refusal(exc)
            if isinstance(refusal, NoPermissionError):
                raise from_redis(ResponseError(f"NOPERM {refusal}")) from refusal
            if "Cluster mode is not enabled" in str(exc):
                raise UnsupportedServerError(
                    f"this server is not a Redis Cluster node ({exc}), and this Client "
                    "was told it is one (cluster=True, or a redis.asyncio.RedisCluster). "
                    "Use cluster=None (finds out) or False, or a redis.asyncio.Redis"
                ) from exc
            if self.outage.failed():
                log.warning(
                    "could not read the cluster's slot map from any known node (%r); "
                    "retrying on each command that needs it",
                    exc,
                )
            # (A TimeoutError says nothing by itself: name the bound.)
            why = clause(exc) or f"no answer within {self.timeout:g} s (command_timeout)"
            raise ConnectionFailedError(
                f"could not read the cluster's slot map from any known node: {why}. "
                "Check that the cluster is up and reachable from here; aiolock retries"
            ) from exc
        slots: list[str | None] = [None] * 16384
        for slot, node in masters.items():
            slots[slot] = node.name
            self._nodes.setdefault(node.name, node)
        # A MOVED of the last second beats a map that says otherwise: the node
        # the map was read from may not have heard of the move yet (a slot's
        # new owner spreads by gossip). Read again a moment later.
        loop = asyncio.get_running_loop()
        now, stale = loop.time(), False
        for slot, (name, seen) in list(self._recent_moves.items()):
            if now - seen > MOVE_MEMORY:
                del self._recent_moves[slot]
            elif slots[slot] != name:
                slots[slot] = name
                stale = True
        if stale:
            loop.call_later(MOVE_MEMORY / 2, self._refresh_unless_closed)
        changed = slots != self._slots
        self._slots = slots
        self.refreshes += 1
        self.outage.ended_logged(
            log, "read the cluster's slot map again after %.1f s; %d refreshes failed meanwhile"
        )
        if changed:
            if self.on_change is not None:
                self.on_change()
            for callback in self._watchers:
                callback()

    async def aclose(self) -> None:
        self.closed = True
        await stop(self._refreshing)


def _refusal(exc: BaseException) -> ResponseError | None:
    """The server's error reply behind redis-py's discovery error, if any
    (redis-py reports any refusal of CLUSTER SLOTS as "Cluster mode is not
    enabled": the reply is in the exception's context)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ResponseError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def server_version(info: str) -> tuple[int, int] | None:
    """The ``(major, minor)`` of ``redis_version`` in the text of ``INFO server``
    (Valkey reports the Redis version it is compatible with there: 7.2.x), or
    None if there is no such line."""
    match = re.search(r"^redis_version:(\d+)\.(\d+)", info, re.M)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def check_version(name: str, info: str) -> None:
    """Raise UnsupportedServerError if node ``name``'s ``INFO server`` text says
    it is older than Redis 7.0 / Valkey 7.2 (no sharded pub/sub)."""
    version = server_version(info)
    if version is not None and version < MIN_VERSION:
        raise UnsupportedServerError(
            f"cluster node {name} runs Redis {version[0]}.{version[1]}; aiolock's cluster "
            "mode needs Redis 7.0 or Valkey 7.2 or newer (sharded pub/sub, SPUBLISH from "
            "scripts). Upgrade the cluster, or use a standalone server. Nothing was "
            "changed in Redis"
        )
