"""Replica-acknowledged acquisitions: one WAIT per loop turn on a connection of their own.

With ``Client(..., replicas=N)`` (or ``wait_aof=True``) an acquisition is
returned only once N replicas acknowledged it. Redis' ``WAIT numreplicas
timeout`` counts the replicas that acknowledged the replication offset of
the *calling connection's* last write, so it must run on the connection that
ran the acquire script; it cannot run inside a script (Redis 7.0 refuses it;
Valkey 8 accepts it there but it returns at once and proves nothing); and it
blocks every later command on its connection until it answers. Hence:

* ``AckedLane``: one ``CommandConnection`` per master, used by acquisitions
  only (the main lane keeps serving releases, queries and renewals
  meanwhile). The acquire scripts of one loop turn are written on it,
  followed by **one** ``WAIT N timeout_ms`` (group commit: a hundred
  concurrent acquisitions cost a handful of WAITs, not a hundred), or
  ``WAITAOF 1 N timeout_ms`` with ``wait_aof`` (the master fsynced the
  write to its append-only file, and N replicas to theirs: it needs
  ``appendonly yes`` on the master and on those replicas, and Redis/Valkey
  7.2+).
* Every script of a batch resolves when that WAIT answers. Acknowledged by
  at least N (and the AOF, with ``wait_aof``), or a reply that grants
  nothing (busy: ``granted``): the caller gets the script's reply. Fewer:
  the acquisition is undone (the caller's ``orphan``, an ``Undo``, is
  called with the script's reply, so it releases exactly what the script
  took) and the caller gets ``ReplicationError(acknowledged, required)`` at
  once. The WAIT failed (connection lost, no reply within the command
  timeout, WAITAOF refused): undone too, and the caller gets that error.
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

**Renewals** (``acked_renewal``): the watchdog's renewal call is followed by
a WAIT on its own lane; a renewal that is not acknowledged reports an error
for every item it found alive, so the hold's confirmed expiry
(``Hold.expires_at``) is not extended: a hold whose renewals stay
unacknowledged is lost at its last acknowledged expiry (the watchdog retries
until then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import NoScriptError

from .connection import CommandConnection, Lane, Orphan
from .errors import (
    AiolockError,
    ReplicationError,
    ServerRefusedError,
    UnsupportedServerError,
)
from .redis_compat import ConnectionFactory
from .validate import to_ms

__all__ = ["AckedLane", "Acknowledgement", "acked_renewal"]


class Acknowledgement:
    """What "acknowledged" means for one Client: the WAIT (or WAITAOF) command
    to send after a batch of writes, and how to read its reply."""

    __slots__ = ("command", "replicas", "wait_aof")

    def __init__(self, replicas: int, timeout: float, wait_aof: bool) -> None:
        self.replicas = replicas
        self.wait_aof = wait_aof
        ms = max(1, to_ms(timeout))  # never 0: WAIT 0 blocks for ever
        self.command: tuple[Any, ...] = (
            (b"WAITAOF", 1, replicas, ms) if wait_aof else (b"WAIT", replicas, ms)
        )

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

    def _explain(self, error: BaseException) -> AiolockError:
        message = str(error)
        if isinstance(error, ServerRefusedError) and "appendonly" in message.lower():
            clear: AiolockError = UnsupportedServerError(
                "wait_aof=True needs the master's append-only file: the server answered "
                f"{message!r}. Turn it on (CONFIG SET appendonly yes, or appendonly yes in "
                "redis.conf), or use wait_aof=False"
            )
        elif isinstance(error, ServerRefusedError) and "unknown command" in message.lower():
            clear = UnsupportedServerError(
                "wait_aof=True needs WAITAOF, which Redis and Valkey have from 7.2 on; this "
                f"server answered {message!r}. Upgrade it, or use wait_aof=False"
            )
        elif isinstance(error, AiolockError):
            return error
        else:
            clear = ReplicationError(
                f"the replicas' acknowledgement failed: {message}", required=self.replicas
            )
        clear.__cause__ = error
        return clear


class _Entry:
    """One acquire script of a batch: its caller's future and its reply."""

    __slots__ = ("error", "fut", "orphan", "reply", "settled")

    def __init__(self, fut: asyncio.Future[Any], orphan: Orphan | None) -> None:
        self.fut = fut
        self.orphan = orphan
        self.reply: Any = None
        self.error: BaseException | None = None
        # True once the orphan ran or the caller was given the outcome for good.
        self.settled = False

    def got(self, reply: Any, error: BaseException | None) -> None:
        self.reply, self.error = reply, error


class AckedLane:
    """The acknowledged acquisitions of one master (see the module docstring).

    ``call`` sends a plain command (``SCRIPT LOAD`` after a NOSCRIPT: not
    acknowledged, it grants nothing); ``acked`` sends an acquire script, which
    resolves only once the batch's WAIT answered.
    """

    def __init__(
        self,
        factory: ConnectionFactory,
        ack: Acknowledgement,
        *,
        command_timeout: float,
        replica_timeout: float,
        on_connect: Callable[[], Iterable[tuple[Any, ...]]] = tuple,
        on_reset: Callable[[], None] | None = None,
    ) -> None:
        self.ack = ack
        self.conn = CommandConnection(
            factory,
            command_timeout=command_timeout + replica_timeout,
            on_connect=on_connect,
            on_reset=on_reset,
        )
        self._batch: list[_Entry] | None = None
        #: WAITs sent (one per batch).
        self.waits = 0

    @property
    def connects(self) -> int:
        return self.conn.connects

    @property
    def in_flight(self) -> int:
        return self.conn.in_flight

    async def call(self, *args: Any, orphan: Orphan | None = None) -> Any:
        return await self.conn.call(*args, orphan=orphan)

    async def acked(self, *args: Any, orphan: Orphan | None = None) -> Any:
        """Send an acquire script now; return its reply once the batch's WAIT
        acknowledged it. Not acknowledged: undone (``orphan(reply, None)``) and
        ReplicationError. Cancelled: undone when the replies come (the orphan)."""
        loop = asyncio.get_running_loop()
        entry = _Entry(loop.create_future(), orphan)
        self.conn.send(*args, callback=entry.got)
        batch = self._batch
        if batch is None:
            batch = self._batch = []
            loop.call_soon(self._flush)
        batch.append(entry)
        try:
            return await entry.fut
        except asyncio.CancelledError:
            # The outcome may have been set in the same loop turn as the
            # cancellation: a granted acquisition nobody will take is undone.
            if not entry.settled and orphan is not None:
                fut = entry.fut
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    entry.settled = True
                    orphan(fut.result(), None)
            raise

    def _flush(self) -> None:
        batch, self._batch = self._batch, None
        if not batch:
            return
        self.waits += 1
        ack = self.ack

        def answered(reply: Any, error: BaseException | None) -> None:
            failure = ack.check(reply, error, "the acquisition")
            for entry in batch:
                _resolve(entry, failure)

        self.conn.send(*ack.command, callback=answered)

    async def drain(self, seconds: float) -> None:
        await self.conn.drain(seconds)

    async def aclose(self) -> None:
        self._flush()
        await self.conn.aclose()


def _resolve(entry: _Entry, failure: AiolockError | None) -> None:
    """Settle one acquire script of a batch once its WAIT answered (``failure``:
    None if acknowledged). Runs from the reply's parse: it must not raise."""
    fut, orphan = entry.fut, entry.orphan
    if entry.error is not None:
        # The script failed: it changed nothing (a refusal), or it is unknown
        # whether it ran (the connection was lost): the orphan knows which.
        if fut.cancelled() or fut.done():
            if orphan is not None and not entry.settled:
                entry.settled = True
                orphan(None, entry.error)
        else:
            fut.set_exception(entry.error)
        return
    if fut.cancelled() or fut.done():
        if orphan is not None and not entry.settled:
            entry.settled = True
            orphan(entry.reply, None)  # nobody takes it: undo what it took
        return
    if failure is None or not granted(entry.reply):
        # Acknowledged, or nothing was granted (busy: the caller waits on, and
        # its next try is acknowledged or refused in turn).
        fut.set_result(entry.reply)
        return
    # Not acknowledged: undo exactly what the script took, then tell the caller.
    entry.settled = True
    if orphan is not None:
        orphan(entry.reply, None)
    fut.set_exception(_own(failure))


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


async def acked_renewal(
    lane: Lane, ack: Acknowledgement, evalsha: tuple[Any, ...], reload: tuple[Any, ...]
) -> list[Any]:
    """One renewal call on the watchdog's lane, followed by a WAIT on that lane.

    Returns the script's per-item results, except that if fewer replicas than
    required acknowledged, every item the script found alive gets the
    ReplicationError instead of 1: its confirmed expiry is not extended (the
    watchdog retries until it, then the hold is lost). ``reload``: the
    ``SCRIPT LOAD`` to send on NOSCRIPT.
    """
    script = lane.submit(*evalsha)
    wait = lane.submit(*ack.command)
    try:
        reply = await script
    except NoScriptError:
        await _settle(wait)
        await lane.call(*reload)
        script = lane.submit(*evalsha)
        wait = lane.submit(*ack.command)
        reply = await script
    except BaseException:
        wait.cancel()
        raise
    try:
        answer: Any = await wait
        error: BaseException | None = None
    except AiolockError as exc:
        answer, error = None, exc
    failure = ack.check(answer, error, "the renewal")
    if failure is None:
        return list(reply)
    return [_own(failure) if alive == 1 else alive for alive in reply]


async def _settle(fut: asyncio.Future[Any]) -> None:
    try:
        await fut
    except AiolockError:
        pass
