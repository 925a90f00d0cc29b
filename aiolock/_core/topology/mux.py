"""Redis Cluster and Valkey Cluster: one command lane per master, routing by slot.

In cluster mode the Engine's command connection and its renewal connection
are each a :class:`ClusterMux`: one pipelined, cancellation-safe
``CommandConnection`` per master (made on first use), with the same
``submit`` / ``send`` / ``call`` interface as a single connection. A command
goes to the master of its key's slot (the key is the first key of a script,
else the command's first argument), computed locally with
redis-py's ``key_slot``; the slot map is ``cluster.py``'s ``Topology``.

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
import re
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from ..errors import (
    ClientClosedError,
    ConnectionFailedError,
    ServerRefusedError,
    from_redis,
)
from ..protocol.slots import slot_of
from ..transport.connection import CommandConnection, Loadable, Orphan, SafeCalls, reply_future
from .cluster import RESEND_CAP, Topology, check_version

__all__ = ["MAX_REDIRECTS", "ClusterMux", "check_versions", "command_key"]

log = logging.getLogger("aiolock.cluster")

#: Redirections (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) one command follows at most.
MAX_REDIRECTS = 16
_REDIRECT = re.compile(r"\b(MOVED|ASK) (\d+) (\S+):(\d+)")
_ASKING = (b"ASKING",)


def command_key(args: tuple[Any, ...], script: bool = False) -> Any:
    """The key a command is routed by: a script's first key (``script``: the
    command runs one; its arguments are the script's name or digest, the number
    of keys, the keys, its arguments), else the command's first argument."""
    if script:
        return args[3] if int(args[2]) > 0 else None
    return args[1] if len(args) > 1 else None


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
