"""Redis Cluster and Valkey Cluster: the slot map, and one command lane per master.

In cluster mode the Engine's command connection and its renewal connection
are each a :class:`ClusterMux`: one pipelined, cancellation-safe
``CommandConnection`` per master (made on first use), with the same
``submit`` / ``send`` / ``call`` interface as a single connection. A command
goes to the master of its key's slot (the key is the first key of a script,
else the command's first argument), computed locally with
redis-py's ``key_slot``; the slot map comes from redis-py's cluster
discovery (``NodesManager.initialize``: CLUSTER SLOTS on the seed nodes,
with the user's credentials and TLS settings), never from its command path.

Every reply that says "this command did not run here" is handled here, and
re-sending is safe for each since the script did not run:

* ``MOVED <slot> <host:port>``: the slot has a new owner; the map is
  corrected for that slot at once (and refreshed in the background) and the
  command re-sent there;
* ``ASK <slot> <host:port>``: the slot is migrating and the key is already
  on the target: ``ASKING`` and the command, written together on the
  target's connection (nothing can come between them: writes are
  synchronous);
* ``TRYAGAIN`` (a multi-key command during a migration), ``CLUSTERDOWN``
  (a failover in progress, a slot not served): re-sent after a capped
  exponential backoff, the map refreshed meanwhile;
* a script the node lacks: not this module's business. Each node's
  connection loads a script before the first command that runs it there
  (connection.py's ``Loadable``), so a promoted replica, a slot's new owner
  or a restarted node gets it with the first command sent to it; a node
  that lost it mid-connection (SCRIPT FLUSH) is the script runner's to
  recover from (runner.py: it sends the command again with ``reload``);
* a connection to the slot's master that cannot be opened (refused, timed
  out: the node died, a failover is under way): the command was never
  written, so it is re-sent like CLUSTERDOWN, the map re-read meanwhile,
  and at once when a refresh shows the promoted replica (``Topology.watch``;
  no reconnect backoff towards a dead node).

Failover (tests/test_cluster_failover.py): a master's death resets its
connections, which bumps the Engine's connection epoch, so the verifier
re-checks every hold at once (riding out the failover as above); a hold the
promoted replica has is kept and renewed there, one it lacks (asynchronous
replication lost the acquire) is reported lost (LockLostError). Another
Client may take the lock on the promoted replica before the old holder's
check lands (measured: tens to a couple of hundred milliseconds); its fencing
token is the higher one (see scripts/_fence.lua). A script is loaded on each
node's connection when first run there, so a promoted replica serves them.

All of it is bounded: at most ``MAX_REDIRECTS`` redirections in a row
(MOVED, ASK) and at most ``command_timeout`` seconds of backoff (TRYAGAIN,
CLUSTERDOWN, an unreachable master; e.g. mid-migration a script whose keys
are only partly on the importing node gets ASK then TRYAGAIN from Redis
until the migration ends: it waits that out); then the caller gets the last error
as a ``ServerUnavailableError`` (the command did not run: acquires and
releases ride it out as they ride out an outage). A lost connection is not
re-sent: the script may have run. It fails like a single connection's (the
caller's undo and retry logic applies) and triggers a map refresh, since
the node may be gone for good (a failover).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import ChainMap
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

from ..errors import (
    AiolockError,
    ClientClosedError,
    ConnectionFailedError,
    ServerRefusedError,
    UnsupportedServerError,
    clause,
    from_redis,
)
from ..futures import retrieve, stop
from ..outage import Outage
from ..protocol.slots import slot_of
from ..transport.connection import CommandConnection, Loadable, Orphan, SafeCalls, reply_future
from ..transport.redis_compat import (
    ConnectionFactory,
    cluster_node,
    node_connection_factory,
    read_slot_map,
)
from ..waiting.listener import Channel, Listener

__all__ = [
    "MAX_REDIRECTS",
    "ClusterMux",
    "ShardedListener",
    "Topology",
    "check_version",
    "check_versions",
    "server_version",
]

log = logging.getLogger("aiolock.cluster")

#: Redirections (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) one command follows at most.
MAX_REDIRECTS = 16
#: Seconds a MOVED outranks a slot map read from a node that disagrees.
MOVE_MEMORY = 1.0
#: The oldest server a cluster-mode Client runs on (Valkey 7.2 reports 7.2.x).
MIN_VERSION = (7, 0)
#: The longest pause before re-sending a command that did not run (CLUSTERDOWN,
#: TRYAGAIN, an unreachable master): a failover is noticed this soon after it ends.
RESEND_CAP = 0.25
_REDIRECT = re.compile(r"\b(MOVED|ASK) (\d+) (\S+):(\d+)")
_ASKING = (b"ASKING",)


def command_key(args: tuple[Any, ...], script: bool = False) -> Any:
    """The key a command is routed by: a script's first key (``script``: the
    command runs one; its arguments are the script's name or digest, the number
    of keys, the keys, its arguments), else the command's first argument."""
    if script:
        return args[3] if int(args[2]) > 0 else None
    return args[1] if len(args) > 1 else None


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
            raise ConnectionFailedError(
                f"could not read the cluster's slot map from any known node: {clause(exc)}. "
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
        run = self.outage.ended()
        if run is not None:
            log.info(
                "read the cluster's slot map again after %.1f s; %d refreshes failed meanwhile",
                run.seconds,
                run.failures,
            )
        if changed:
            if self.on_change is not None:
                self.on_change()
            for callback in self._watchers:
                callback()

    async def aclose(self) -> None:
        self.closed = True
        await stop(self._refreshing)


class ClusterMux(SafeCalls):
    """One lane (the commands, or the renewals) over every master of a cluster.

    The same interface as one ``CommandConnection`` (``submit``, ``send``,
    ``call``, ``connects``, ``in_flight``, ``drain``, ``aclose``), routing
    each command by its key's slot and following redirections (see the
    module docstring).
    """

    def __init__(
        self,
        topology: Topology,
        *,
        command_timeout: float,
        on_reset: Callable[[], None] | None = None,
        node_connection: Callable[..., CommandConnection] | None = None,
        role: str = "command",
    ) -> None:
        # node_connection(factory, **CommandConnection's options): how a node's
        # connection is made (replication.py's acknowledged ones); default plain.
        # role: the connections' name in log messages ("command", "renewal"...).
        self.topology = topology
        self._role = role
        self._node_connection = node_connection or CommandConnection
        self._command_timeout = command_timeout
        self._on_reset = on_reset
        self._connections: dict[str, CommandConnection] = {}
        # Commands waiting to be re-sent (CLUSTERDOWN, TRYAGAIN, a dead master),
        # with their timers: a map change re-sends them at once.
        self._waiting: dict[_Command, tuple[asyncio.TimerHandle, BaseException]] = {}
        topology.watch(self._resend_waiting)
        self._closed = False
        self._connects_closed = 0
        self.redirects = 0

    # -- connections -------------------------------------------------------------------------

    def connection(self, name: str) -> CommandConnection:
        """The command connection to node ``name`` (made on first use)."""
        conn = self._connections.get(name)
        if conn is None:
            conn = self._connections[name] = self._node_connection(
                self.topology.factory(name),
                command_timeout=self._command_timeout,
                on_reset=self._lost,
                redirects=True,
                role=self._role,
            )
        return conn

    def _lost(self) -> None:
        # A node's connection was lost: it may be gone for good (a failover).
        self.topology.refresh_soon()
        if self._on_reset is not None:
            self._on_reset()

    @property
    def connects(self) -> int:
        return self._connects_closed + sum(c.connects for c in tuple(self._connections.values()))

    @property
    def in_flight(self) -> int:
        return sum(c.in_flight for c in tuple(self._connections.values()))

    @property
    def nodes(self) -> list[str]:
        """The nodes this lane has a connection to."""
        return sorted(self._connections)

    # -- commands ----------------------------------------------------------------------------

    def submit(
        self,
        *args: Any,
        orphan: Orphan | None = None,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> asyncio.Future[Any]:
        fut, done = reply_future(orphan)
        self._dispatch(args, done, fut.cancelled, script, reload)
        return fut

    def send(
        self,
        *args: Any,
        callback: Orphan,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> None:
        self._dispatch(args, callback, None, script, reload)

    def _dispatch(
        self,
        args: tuple[Any, ...],
        done: Orphan,
        gone: Callable[[], bool] | None,
        script: Loadable | None,
        reload: bool,
    ) -> None:
        if self._closed:
            done(None, ClientClosedError("the aiolock Client was closed; create a new one"))
            return
        key = command_key(args, script is not None)
        if key is None:
            raise ValueError(f"aiolock: a cluster command needs a key: {args[:2]!r}")
        _Command(self, args, slot_of(key), done, gone, script, reload).send()

    def _resend_waiting(self) -> None:
        """The map changed (a replica was promoted, a slot moved): re-send every
        waiting command now, to its slot's master in the new map."""
        waiting, self._waiting = self._waiting, {}
        for command, (timer, error) in waiting.items():
            timer.cancel()
            command._again(error)

    async def drain(self, seconds: float) -> None:
        await asyncio.gather(*(c.drain(seconds) for c in self._connections.values()))

    async def aclose(self) -> None:
        self._closed = True
        waiting, self._waiting = self._waiting, {}
        for command, (timer, error) in waiting.items():
            timer.cancel()
            command._again(error)  # fails it: the lane is closed
        connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            self._connects_closed += conn.connects
        await asyncio.gather(*(c.aclose() for c in connections))


class _Command:
    """One command in cluster mode, following redirections until it runs.

    Each re-send happens only while somebody waits for the reply: if the
    caller gave up (its future was cancelled, e.g. by its own timeout) or the
    Client closed meanwhile, the command ends with the last error (it did not
    run, so an orphan handler has nothing to undo) instead of running for
    nobody.
    """

    __slots__ = (
        "_args",
        "_deadline",
        "_delay",
        "_done",
        "_gone",
        "_mux",
        "_reload",
        "_script",
        "_slot",
        "_tries",
    )

    def __init__(
        self,
        mux: ClusterMux,
        args: tuple[Any, ...],
        slot: int,
        done: Orphan,
        gone: Callable[[], bool] | None,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> None:
        self._mux = mux
        self._args = args
        self._slot = slot
        self._done = done
        self._gone = gone  # True once the caller stopped waiting (None: send()'s callback)
        self._tries = 0
        self._delay = 0.0
        self._deadline = 0.0
        self._script = script  # the script it runs (loaded per node: connection.py)
        self._reload = reload

    def send(self, target: str | None = None, asking: bool = False) -> None:
        mux = self._mux
        if mux._closed:
            self._done(None, ClientClosedError("the aiolock Client was closed; create a new one"))
            return
        name = target or mux.topology.node(self._slot)
        if name is None:  # the slot is not served (yet): as CLUSTERDOWN
            mux.topology.refresh_soon()
            self._later(
                from_redis(
                    ResponseError(
                        f"CLUSTERDOWN slot {self._slot} is not served by any known master"
                    )
                )
            )
            return
        conn = mux.connection(name)
        # ASKING and the command are written back to back on one connection
        # (in one write, or queued as one until it connects; a script's load,
        # if that node's connection lacks it, comes before both), so ASKING
        # applies to this command and no other.
        conn.send(
            *self._args,
            callback=self._reply,
            script=self._script,
            reload=self._reload,
            before=_ASKING if asking else None,
        )

    def _reply(self, reply: Any, error: BaseException | None) -> None:
        if error is None:
            self._done(reply, None)
            return
        mux = self._mux
        if isinstance(error, ConnectionFailedError) and error.not_sent:
            # The node could not be reached, so the command was never written:
            # re-sending is safe. The node may be gone for good (a failover in
            # progress): re-read the map and re-send to the slot's master then,
            # polling until the cluster has promoted a replica (not counted as
            # a redirection: bounded by command_timeout only).
            mux.topology.refresh_soon()
            self._later(error)
            return
        code = getattr(error, "code", "")
        if code not in ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"):
            self._done(None, error)
            return
        self._tries += 1
        mux.redirects += 1
        if self._tries > MAX_REDIRECTS:
            self._done(None, error)
            return
        if code in ("MOVED", "ASK"):
            match = _REDIRECT.search(str(error.__cause__ or error))
            if match is None:
                self._done(None, error)
                return
            target = f"{match.group(3)}:{match.group(4)}"
            if code == "MOVED":
                mux.topology.moved(int(match.group(2)), target)
            if self._given_up(error):
                return
            if code == "MOVED":
                self.send()
            else:
                self.send(target, asking=True)
            return
        mux.topology.refresh_soon()
        self._later(error)

    def _given_up(self, error: BaseException) -> bool:
        """End the command here (with ``error``: it did not run) if its caller
        stopped waiting or the Client closed; say whether it did."""
        if self._gone is not None and self._gone():
            self._done(None, from_redis(error))
            return True
        if self._mux._closed:
            self._done(None, ClientClosedError("the aiolock Client was closed; create a new one"))
            return True
        return False

    def _later(self, error: BaseException) -> None:
        """Re-send after a capped backoff, within ``command_timeout`` in all."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._deadline == 0.0:
            self._deadline = now + self._mux._command_timeout
        self._delay = min(max(self._delay * 2, 0.02), RESEND_CAP)
        if now + self._delay > self._deadline:
            self._done(None, error)
            return
        if self._given_up(error):
            return
        # A wait bounded by the deadline: the redirections count starts again
        # (mid-migration, a multi-key script some of whose keys are not on the
        # target yet goes ASK -> TRYAGAIN -> ASK... until SETSLOT NODE).
        self._tries = 0
        self._mux._waiting[self] = (loop.call_later(self._delay, self._again, error), error)

    def _again(self, error: BaseException) -> None:
        self._mux._waiting.pop(self, None)
        if not self._given_up(error):
            self.send()


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


async def check_versions(mux: ClusterMux) -> None:
    """``check_version`` on every master (one ``INFO server`` each, on the
    command lane's connections: they are made now, as they will be used), all
    at once. A master that cannot be reached is skipped (a Client may start
    while one is dead and its replica not promoted yet: the nodes of one
    cluster run one version); if none can be, its error is raised."""
    names = mux.topology.masters()
    replies = await asyncio.gather(
        *(mux.connection(name).call(b"INFO", b"server") for name in names),
        return_exceptions=True,
    )
    if replies and all(isinstance(r, ConnectionFailedError) for r in replies):
        raise replies[0]
    for name, info in zip(names, replies, strict=True):
        if isinstance(info, ServerRefusedError) and info.code == "NOPERM":
            # An ACL user without INFO: SSUBSCRIBE and SPUBLISH fail on an old
            # server with their own clear error; nothing to check here.
            log.debug("INFO refused on %s; the server's version is not checked", name)
            return
        if isinstance(info, ConnectionFailedError):
            continue
        if isinstance(info, BaseException):
            raise info
        check_version(name, info.decode() if isinstance(info, bytes) else str(info))


class ShardedListener:
    """The one pub/sub listener of a cluster-mode Client: one sharded
    ``Listener`` per master it listens on, each channel on its slot's master.

    The same interface as a ``Listener`` (``register``, ``unregister``,
    ``channels``, ``active``, ``connects``, ``start``, ``aclose``). When a
    slot changes owner (a failover, a migration: the server drops the
    channel with a ``sunsubscribe``, refuses it with ``MOVED``, or a slot map
    refresh shows it), its channels move, waiters and all, to the new
    master's listener; once subscribed there, their waiters are woken to try
    again, since a release may have been published meanwhile. A channel that
    was refused or dropped and that the map (which may lag the cluster for a
    moment) keeps where it is, is subscribed again, at most a second apart,
    until a node takes it; a lingering channel (nobody waits on it) whose slot
    moved is dropped. No waiter hangs: every wait is bounded by the holder's
    TTL besides.

    Safety: a grant goes to a Client only if the script's ``SPUBLISH`` counts
    it, and SPUBLISH counts the subscribers of the node that ran it, a
    master. A replica accepts ``SSUBSCRIBE`` for its master's slots and
    relays the master's messages, uncounted; so each sharded link asks its
    node ``ROLE`` first and subscribes (and acts on messages) only on a
    master (see ``Listener._master``): this listener never takes a grant the
    script did not count (classic pub/sub would: see ``_cluster_source`` in
    scripts.py and tests/test_cluster_primitives.py).
    """

    def __init__(self, topology: Topology, *, on_reset: Callable[[], None] | None = None) -> None:
        self._topology = topology
        self._on_reset = on_reset
        self._listeners: dict[str, Listener] = {}
        self._started = False
        self._closed = False
        self._rehoming: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        topology.watch(self._changed.set)
        self._connects_closed = 0
        self._last_round = -math.inf  # loop time of the last re-homing round
        self._pause = 0.0

    def _listener(self, name: str) -> Listener:
        listener = self._listeners.get(name)
        if listener is None:
            listener = self._listeners[name] = Listener(
                self._topology.factory(name),
                on_reset=self._lost,
                sharded=True,
                on_moved=self.moved,
                on_unreachable=self._unreachable,
            )
            if self._started:
                listener.start()
        return listener

    def _home(self, channel: bytes) -> str:
        name = self._topology.node(slot_of(channel))
        if name is None:  # not served right now: the first master; re-homed on refresh
            self._topology.refresh_soon()
            masters = self._topology.masters()
            if not masters:
                raise ConnectionFailedError("the cluster serves no slot right now; retry")
            name = masters[0]
        return name

    def _lost(self) -> None:
        self._unreachable()
        if self._on_reset is not None:
            self._on_reset()

    def _unreachable(self) -> None:
        """A node's pub/sub link was lost, or could not be opened (the node died
        before this listener reached it: nothing was lost, but its channels
        wait there all the same): watch the map for the promoted replica."""
        self._topology.refresh_soon()
        if not self._closed and (self._watching is None or self._watching.done()):
            self._watching = asyncio.get_running_loop().create_task(
                self._await_failover(), name="aiolock-cluster-watch"
            )
            self._watching.add_done_callback(retrieve)

    async def _await_failover(self) -> None:
        """A node's pub/sub link was lost or could not be opened: the node may be
        dead and its replica about to be promoted. Nothing else may ask for the map meanwhile (its
        waiters are parked, its listener only retries the dead node), so re-read
        it every ``RESEND_CAP`` until it changes (``on_change`` then re-homes the
        channels to the promoted replica) or for the topology's timeout (the
        node came back as it was)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self._topology.timeout
        self._changed.clear()
        while not self._closed and not self._changed.is_set() and loop.time() < end:
            try:
                await self._topology.refresh()
            except AiolockError:
                pass  # (logged by the refresh) tried again
            if self._changed.is_set():
                return
            await asyncio.sleep(RESEND_CAP)

    # -- the Listener interface -------------------------------------------------------------

    @property
    def channels(self) -> ChainMap[bytes, Channel]:
        return ChainMap(*(listener.channels for listener in self._listeners.values()))

    @property
    def active(self) -> int:
        return sum(listener.active for listener in tuple(self._listeners.values()))

    @property
    def connects(self) -> int:
        return self._connects_closed + sum(lst.connects for lst in tuple(self._listeners.values()))

    @property
    def nodes(self) -> list[str]:
        """The masters this listener has a (sharded) listener for."""
        return sorted(self._listeners)

    def start(self) -> None:
        self._started = True
        for listener in self._listeners.values():
            listener.start()

    def register(self, name: bytes) -> Channel:
        if self._closed:
            raise ClientClosedError("the aiolock Client is closed")
        for listener in self._listeners.values():
            if name in listener.channels:
                return listener.register(name)
        return self._listener(self._home(name)).register(name)

    def unregister(self, channel: Channel, *, linger: bool = False) -> None:
        for listener in self._listeners.values():
            if listener.channels.get(channel.name) is channel:
                listener.unregister(channel, linger=linger)
                return
        channel.refs -= 1  # (moved away while no listener had it: nothing to drop)

    # -- moves --------------------------------------------------------------------------------

    def moved(self) -> None:
        """A node dropped or refused a channel: refresh the map, then re-home."""
        if self._closed:
            return
        if self._rehoming is None or self._rehoming.done():
            self._rehoming = asyncio.get_running_loop().create_task(
                self._refresh_and_rehome(), name="aiolock-cluster-rehome"
            )
            self._rehoming.add_done_callback(retrieve)

    async def _refresh_and_rehome(self) -> None:
        """Refresh the map, move the channels whose slot moved, and subscribe
        again those a node refused or dropped that stay where they are: no
        channel is left unsubscribed while its slot is served. Refused again
        within a second of the last round (the nodes do not agree yet: a slot's
        new owner still being gossiped, a failover under way), it first waits,
        longer each time, at most a second: one round a second at most."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_round < 1.0:
            self._pause = min(max(self._pause * 2, 0.05), 1.0)
            await asyncio.sleep(self._pause)
        else:
            self._pause = 0.0
        delay = 0.05
        while not self._closed:
            try:
                await self._topology.refresh()
            except AiolockError:  # (logged by the refresh) tried again
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self.rehome()
            listeners = list(self._listeners.values())
            for listener in listeners:
                listener.resubscribe()
            self._last_round = loop.time()
            if any(listener.replica and listener.channels for listener in listeners):
                loop.call_soon(self.moved)  # another round, until the map moves them
            return

    def rehome(self) -> None:
        """Move every channel whose slot another master serves now to that master."""
        if self._closed:
            return
        for node, listener in list(self._listeners.items()):
            for name, channel in list(listener.channels.items()):
                home = self._topology.node(slot_of(name))
                if home is not None and home != node:
                    listener.disown(channel)
                    if channel.refs > 0:  # (a lingering one nobody waits on is dropped)
                        self._listener(home).adopt(channel)

    async def aclose(self) -> None:
        self._closed = True
        await stop(self._rehoming)
        await stop(self._watching)
        listeners = list(self._listeners.values())
        for listener in listeners:
            self._connects_closed += listener.connects
        await asyncio.gather(*(listener.aclose() for listener in listeners))
