"""Replica-acknowledged acquisitions: one WAIT per loop turn on a connection of their own.

With ``Client(..., replicas=N)`` (or ``wait_aof=True``) an acquisition is
returned only once N replicas acknowledged it. Redis' ``WAIT numreplicas
timeout`` counts the replicas that acknowledged the replication offset of
the *calling connection's* last write, so it must run on the connection that
ran the acquire script; it cannot run inside a script (Redis 7.0 refuses it;
Valkey 8 accepts it there but it returns at once and proves nothing); and it
blocks every later command on its connection until it answers. Hence:

* ``AckedConnection``: the acquisitions' own connection to each master
  (``Engine.acked_lane``: one standalone, a ``ClusterMux`` of them in
  cluster mode), used by acquisitions only (the main lane keeps serving
  releases, queries and renewals meanwhile). The acquire scripts of one
  loop turn are written on it, followed by **one** ``WAIT N timeout_ms``
  (group commit: a hundred concurrent acquisitions cost a handful of
  WAITs, not a hundred), or ``WAITAOF 1 N timeout_ms`` with ``wait_aof``
  (the master fsynced the write to its append-only file, and N replicas to
  theirs: it needs ``appendonly yes`` on the master and on those replicas,
  and Redis/Valkey 7.2+; a replica often reports its fsync only with its
  next once-a-second acknowledgement, so give it a ``replica_timeout`` over
  one second).
* Every script of a batch resolves when that WAIT answers. Acknowledged by
  at least N (and the AOF, with ``wait_aof``), or a reply that grants
  nothing (busy: ``granted``): the caller gets the script's reply. Fewer:
  the acquisition is undone (the script runner calls the caller's ``orphan``,
  an ``Undo``, with the script's reply, so it releases exactly what the
  script took) and the caller gets ``ReplicationError(acknowledged,
  required)`` at once. The WAIT failed (connection lost, no reply within
  the command timeout, WAITAOF refused): undone too, and the caller gets
  that error.
* A caller cancelled while its script or its WAIT is in flight: the batch
  goes on, and the acquisition is undone when the reply comes (the orphan,
  whatever the WAIT said: its caller will not take it).

A WAIT answers at the latest after ``replica_timeout``, so the lane's
liveness bound (no reply for that long: the connection is closed, see
connection.py) is ``command_timeout + replica_timeout``: a master that stops
answering (paused) fails the batch like any command.

**Releases need no WAIT.** A release that a promoted replica missed leaves
the lock held there by its last holder until its TTL runs out: the lock is
unavailable for at most one lease, never granted twice. Only a write that
*grants* (an acquisition, a handoff to a new owner, a renewal that extends a
confirmed lifetime) must be acknowledged.

**Renewals**: with acknowledgement on, the watchdog's lane is made of
``AckedConnection``s too (``renewals=True``): each round's renewal calls are
followed by a WAIT, and a renewal that is not acknowledged reports the
ReplicationError for every item it found alive, so the hold's confirmed
expiry (``Hold.expires_at``) is not extended: a hold whose renewals stay
unacknowledged is lost at its last acknowledged expiry (the watchdog retries
until then). ``Lease.extend`` runs on the acquisitions' lane: acknowledged,
or ReplicationError and the expiry kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..capabilities import STANDALONE, Capabilities
from ..errors import (
    AiolockError,
    ReplicationError,
    ServerRefusedError,
    UnsupportedServerError,
)
from ..validate import to_ms
from .connection import CommandConnection, Loadable, Orphan, reply_future
from .redis_compat import ConnectionFactory

log = logging.getLogger("aiolock.lock")

__all__ = ["AckedConnection", "Acknowledgement", "Unacknowledged", "acked_node", "granted"]


class Acknowledgement:
    """What "acknowledged" means for one Client: the WAIT (or WAITAOF) command
    to send after a batch of writes, and how to read its reply."""

    __slots__ = ("command", "replicas", "timeout", "wait_aof")

    def __init__(self, replicas: int, timeout: float, wait_aof: bool) -> None:
        self.replicas = replicas
        self.timeout = timeout
        self.wait_aof = wait_aof
        ms = max(1, to_ms(timeout))  # never 0: WAIT 0 blocks for ever
        self.command: tuple[Any, ...] = (
            (b"WAITAOF", 1, replicas, ms) if wait_aof else (b"WAIT", replicas, ms)
        )

    @property
    def probe(self) -> tuple[Any, ...]:
        """A command that says at once whether this server can acknowledge
        (the capability probe's, topology/probe.py): the same WAIT or WAITAOF
        asking for no replica within 1 ms. Its refusal, through ``refusal``,
        is the error an acquisition would meet. (Numbers as text: a cluster
        routes a command by its first argument.)"""
        return (b"WAITAOF", b"1", b"0", b"1") if self.wait_aof else (b"WAIT", b"0", b"1")

    def refusal(self, error: BaseException) -> UnsupportedServerError | None:
        """The UnsupportedServerError an acquisition would meet for the WAIT's
        ``error`` (no WAIT, no WAITAOF, no append-only file), else None."""
        clear = self._explain(error, "nothing was changed in Redis")
        return clear if isinstance(clear, UnsupportedServerError) else None

    def check(self, reply: Any, error: BaseException | None, what: str) -> AiolockError | None:
        """None if the WAIT's ``reply`` says the write was acknowledged, else the
        error to raise (``error``: the WAIT's own failure, made clear)."""
        if error is not None:
            return self._explain(error)
        if self.wait_aof:
            local, acknowledged = int(reply[0]), int(reply[1])
            if local < 1:
                return ReplicationError(
                    f"the master did not fsync {what} to its append-only file in time "
                    f"(WAITAOF answered local={local}, replicas={acknowledged}): {what} was "
                    "undone. Check the master's disk (INFO persistence: aof_delayed_fsync)",
                    acknowledged=acknowledged,
                    required=self.replicas,
                )
        else:
            acknowledged = int(reply)
        if acknowledged >= self.replicas:
            return None
        return ReplicationError(
            f"{acknowledged} replica(s) acknowledged {what} in time, {self.replicas} required "
            f"(replicas={self.replicas}): it was undone and is not held. Retry later, or check "
            "the replicas (INFO replication on the master: connected_slaves and their lag)",
            acknowledged=acknowledged,
            required=self.replicas,
        )

    def _explain(
        self, error: BaseException, done: str = "the acquisition was undone"
    ) -> AiolockError:
        message = str(error)
        if isinstance(error, ServerRefusedError) and "appendonly" in message.lower():
            clear: AiolockError = UnsupportedServerError(
                "wait_aof=True needs the master's append-only file: the server answered "
                f"{message!r}. Turn it on (CONFIG SET appendonly yes, or appendonly yes in "
                "redis.conf), or use wait_aof=False"
            )
        elif isinstance(error, ServerRefusedError) and "unknown command" in message.lower():
            if self.wait_aof:
                clear = UnsupportedServerError(
                    "wait_aof=True needs WAITAOF, which Redis and Valkey have from 7.2 on; this "
                    f"server answered {message!r}. Upgrade it, or use wait_aof=False"
                )
            else:  # a compatible server without WAIT (Garnet), or one that renamed it
                clear = UnsupportedServerError(
                    f"replicas={self.replicas} needs the WAIT command, which this server does "
                    f"not have: it answered {message!r}. Use a server with WAIT (Redis, "
                    f"Valkey), or replicas=0 ({done})"
                )
        elif isinstance(error, AiolockError):
            return error
        else:
            clear = ReplicationError(
                f"the replicas' acknowledgement failed: {message}", required=self.replicas
            )
        clear.__cause__ = error
        return clear


class Unacknowledged(Exception):
    """An acquire script granted, and its WAIT did not acknowledge it (an
    internal signal, never seen by users): ``reply`` says what to undo (the
    caller's orphan), ``error`` is what to raise (the runner, runner.py)."""

    def __init__(self, reply: Any, error: AiolockError) -> None:
        super().__init__(str(error))
        self.reply = reply
        self.error = error


class AckedConnection(CommandConnection):
    """A command connection whose scripts are acknowledged (a command is a
    script when the runner says so: ``script=``, see connection.py).

    The scripts sent in one loop turn are followed by one WAIT (or WAITAOF);
    each script's reply is delivered (``send``'s callback, ``submit``'s
    future) only once that WAIT answered, as:

    * acquisitions (``renewals=False``): the reply if acknowledged or if it
      grants nothing (``granted``), else the error ``Unacknowledged(reply,
      ReplicationError)`` (or the WAIT's own failure, made clear), for the
      caller to undo what it took (the runner, runner.py);
    * renewals (``renewals=True``): the reply, with the ReplicationError in
      place of each 1 (alive) if not acknowledged: that item's confirmed
      expiry is not extended.

    Any other command (a script's load, ``ASKING``, ``INFO``) is sent plainly.
    The liveness bound is ``command_timeout + replica_timeout`` (a WAIT
    answers within ``replica_timeout``). In cluster mode a ``ClusterMux`` has
    one per master (``node_connection``); a redirected script is followed by
    the WAIT of the node it finally ran on.
    """

    def __init__(
        self,
        factory: ConnectionFactory,
        *,
        ack: Acknowledgement,
        renewals: bool,
        command_timeout: float,
        on_connect: Callable[[], Iterable[tuple[Any, ...]]] = tuple,
        on_reset: Callable[[], None] | None = None,
        redirects: bool = False,
        capabilities: Capabilities = STANDALONE,
        role: str = "command",
    ) -> None:
        super().__init__(
            factory,
            command_timeout=command_timeout + ack.timeout,
            on_connect=on_connect,
            on_reset=on_reset,
            redirects=redirects,
            capabilities=capabilities,
            role=role,
        )
        self.ack = ack
        self.renewals = renewals
        self._batch: list[tuple[list[Any], Orphan]] | None = None
        #: WAITs sent (one per batch).
        self.waits = 0

    def send(
        self,
        *args: Any,
        callback: Orphan,
        script: Loadable | None = None,
        reload: bool = False,
        before: tuple[Any, ...] | None = None,
    ) -> None:
        if script is None:  # a plain command (INFO...): not acknowledged
            super().send(*args, callback=callback, before=before)
            return
        got: list[Any] = [None, None]  # the script's reply, its error

        def keep(reply: Any, error: BaseException | None) -> None:
            got[0], got[1] = reply, error

        super().send(*args, callback=keep, script=script, reload=reload, before=before)
        batch = self._batch
        if batch is None:
            batch = self._batch = []
            asyncio.get_running_loop().call_soon(self._flush)
        batch.append((got, callback))

    def submit(
        self,
        *args: Any,
        orphan: Orphan | None = None,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> asyncio.Future[Any]:
        if script is None:
            return super().submit(*args, orphan=orphan)
        fut, done = reply_future(orphan)
        self.send(*args, callback=done, script=script, reload=reload)
        return fut

    def _flush(self) -> None:
        batch, self._batch = self._batch, None
        if not batch:
            return
        self.waits += 1
        ack, renewals = self.ack, self.renewals

        def answered(reply: Any, error: BaseException | None) -> None:
            failure = ack.check(reply, error, "the renewal" if renewals else "the acquisition")
            for (script_reply, script_error), callback in batch:
                try:
                    callback(*_outcome(script_reply, script_error, failure, renewals))
                except Exception:
                    log.exception("reply handler of an acknowledged script failed")

        CommandConnection.send(self, *ack.command, callback=answered)

    async def aclose(self) -> None:
        self._flush()
        await super().aclose()


def acked_node(
    ack: Acknowledgement, factory: ConnectionFactory, *, renewals: bool, **options: Any
) -> CommandConnection:
    """A cluster lane's acknowledged connection to one master (``ClusterMux``'s
    ``node_connection``, with ``ack`` and ``renewals`` bound)."""
    return AckedConnection(factory, ack=ack, renewals=renewals, **options)


def _outcome(
    reply: Any, error: BaseException | None, failure: AiolockError | None, renewals: bool
) -> tuple[Any, BaseException | None]:
    """What one script of a batch delivers once its WAIT answered (``failure``:
    None if acknowledged; see ``AckedConnection``)."""
    if error is not None or failure is None:
        return reply, error  # failed (it changed nothing, or unknown: the orphan's
        # business), or acknowledged
    if renewals:
        return [_own(failure) if alive == 1 else alive for alive in reply], None
    if not granted(reply):
        # Nothing granted (busy): the caller waits on, and its next try is
        # acknowledged or refused in turn.
        return reply, None
    return None, Unacknowledged(reply, _own(failure))


def granted(reply: Any) -> bool:
    """Whether an acquire script's reply grants a hold: every acquire script's
    reply opens with 1 when it did (``{1, token, ...}``), with 0, 2 or -1 when
    it did not (busy, waiting writer, too many permits: see their headers)."""
    try:
        return int(reply[0]) == 1
    except (TypeError, ValueError, IndexError):
        return True  # an unknown shape: take it for a grant (refused, never waved through)


def _own(error: AiolockError) -> AiolockError:
    """A fresh copy of a batch's error for one caller (an exception object is
    never shared by the tasks that raise it)."""
    if isinstance(error, ReplicationError):
        copy: AiolockError = ReplicationError(
            str(error), acknowledged=error.acknowledged, required=error.required
        )
    else:
        try:
            copy = type(error)(*error.args)
        except Exception:
            return error
    copy.__cause__ = error.__cause__
    return copy
