"""One lock name in one Client: the local hold, the local FIFO queue, cohort handoffs.

``LocalQueue`` is the plain lock's local state (``Engine.state``): only one
local task at a time deals with Redis, the others park here in FIFO order,
and a release hands the lock straight to the next local task (cohort
locking, bounded by ``COHORT_BOUND``). ``AsyncLock`` (``lock.py``) is the
lock it serves; what it needs of it is ``QueuedLock``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from .._core.errors import LockTimeoutError
from .._core.futures import Outcome
from .._core.holds.lease import Hold
from .._core.observe.observer import DEBUG, answers
from .._core.protocol.keys import LockKeys
from .._core.validate import to_ms
from .._core.waiting.parking import Parked, ParkingLot

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["COHORT_BOUND", "COHORT_YIELD", "TOKEN_RESERVE", "LocalQueue", "QueuedLock"]

#: The DEBUG trace of grants and handoffs (acquisitions and releases:
#: observe/observer.py, holds/lifecycle.py).
log = logging.getLogger("aiolock.lock")
log_answers = answers(log)  # (observe.answers: no isEnabledFor call per local handoff)


#: How many times in a row a Client may hand a lock among its own tasks
#: while another Client's task waits for it (cohort locking's bound).
COHORT_BOUND = 16
#: Fencing tokens an acquisition reserves for local handoffs (1 + 15 more).
TOKEN_RESERVE = COHORT_BOUND
#: After yielding to other Clients, the next local task waits this long
#: before it competes, so a remote waiter woken by the release can win.
COHORT_YIELD = 0.002


class QueuedLock(Protocol):
    """What a LocalQueue needs of its lock (``AsyncLock``): its names, and
    ``_install``, which records a hold handed over by one script."""

    @property
    def name(self) -> str: ...

    @property
    def _channel(self) -> bytes: ...

    @property
    def _names(self) -> LockKeys: ...

    def _install(
        self,
        state: LocalQueue,
        task: asyncio.Task[Any],
        owner: str,
        token: int,
        lease: float | None,
        lease_s: float,
        sent: float,
        confirmed: int,
        *,
        redis_identity: Hold | None = None,
        handed_from: Hold | None = None,
    ) -> Hold: ...


class _Turn(Parked):
    """A task waiting in a LocalQueue: its future gets True (your turn: go
    and compete), a Hold (the lock was handed to you), or False (timeout)."""

    __slots__ = ("lease", "task")

    def __init__(
        self, fut: asyncio.Future[bool | Hold], task: asyncio.Task[Any], lease: float | None
    ) -> None:
        self.fut = fut
        self.task = task
        self.lease = lease


class LocalQueue:
    """One lock name in one Client: the local hold and the local FIFO queue.

    Only one local task at a time (the holder, or the head of the queue)
    deals with Redis; the others wait their turn here, so a thousand local
    waiters cost one subscription and no connections.

    Cohort locking: when the holder releases and a local task waits, the
    lock goes straight to that task:

    * without a round trip, if both use watchdog leases and the hold still
      has fencing tokens reserved (each acquisition in Redis reserves
      ``TOKEN_RESERVE`` consecutive tokens for this Client, so tokens keep
      increasing strictly whoever gets the next one), and the server
      confirmed the hold since the Client's connections were last
      (re)established (``Hold.confirmed``: after a restart that lost the
      hold, its release goes to Redis, which finds it gone); the hold in
      Redis stays as it is (same owner entry, same TTL), which is the same
      lock held by the same Client;
    * otherwise with one script call that releases and re-grants the lock
      to that task (new tokens, its lease).

    After ``COHORT_BOUND`` handoffs in a row the handoff goes through Redis,
    and if another Client waits (its failed acquire flagged the lock), the
    lock is released normally and the next local task waits
    ``COHORT_YIELD`` before competing, so other Clients are not starved.
    """

    __slots__ = (
        "busy",
        "competing",
        "engine",
        "grant",
        "handoffs",
        "hold",
        "key",
        "lock",
        "lot",
        "member",
        "passed",
        "yield_next",
    )

    def __init__(self, engine: EngineView, key: str, lock: QueuedLock | None = None) -> None:
        self.engine = engine
        self.key = key
        self.lock = lock
        self.hold: Hold | None = None
        self.busy = False
        self.competing = False
        self.handoffs = 0
        self.yield_next = False
        # This Client's entry in the lock's waiting set in Redis, if it may
        # have one ("" if not; see scripts/_wake.lua).
        self.member = ""
        # A grant to that entry, received but not taken up yet: (token,
        # tokens reserved, member, when it arrived, connection epoch then).
        self.grant: tuple[int, int, str, float, int] | None = None
        # The waiting turns, FIFO (see _core/waiting/parking.py: a turn whose task gave
        # up is dropped lazily, O(1) for each of 100,000 waiters cancelled at once).
        self.lot: ParkingLot[_Turn] = ParkingLot()
        # The outcome of every release passed on locally: released (1), known
        # at once; made once (a done future, shared: nobody resolves it again).
        self.passed: Outcome | None = None

    def holds(self) -> list[Hold]:
        return [self.hold] if self.hold is not None else []

    def waiting(self) -> int:
        return len(self.lot) + (1 if self.competing else 0)

    def set_competing(self, value: bool) -> None:
        self.competing = value

    async def turn(
        self, deadline: float | None, task: asyncio.Task[Any], lease: float | None
    ) -> Hold | None:
        """Wait, FIFO, until this task may deal with Redis (None), or until the
        lock is handed to it (the Hold)."""
        loop = asyncio.get_running_loop()
        fut, timer = self.enqueue(loop, deadline, task, lease)
        try:
            got = await fut
        except asyncio.CancelledError:
            self.gave_up(fut)
            raise
        finally:
            self.left(timer)
        return self.took(got)

    # turn(), in steps: AsyncLock._acquire awaits the future itself, so that each
    # of 100,000 waiting tasks has one coroutine frame less (memory, cancellation).

    def enqueue(
        self,
        loop: asyncio.AbstractEventLoop,
        deadline: float | None,
        task: asyncio.Task[Any],
        lease: float | None,
    ) -> tuple[asyncio.Future[bool | Hold], asyncio.TimerHandle | None]:
        """Join the queue: the future to await, and its timeout's timer."""
        if deadline is not None and deadline <= loop.time():
            raise LockTimeoutError("the lock is busy and the timeout allowed no wait")
        fut: asyncio.Future[bool | Hold] = loop.create_future()
        return fut, self.lot.park(_Turn(fut, task, lease), deadline)

    def gave_up(self, fut: asyncio.Future[bool | Hold]) -> None:
        """The waiting task was cancelled: pass on what may have reached it."""
        handed = ParkingLot.handed(fut)  # (None, the common case: cancelled while queued)
        if isinstance(handed, Hold):
            # The lock was handed to us, but we will not take it.
            self.engine.spawn(handed.new_lease().release())
        elif handed:
            self.pass_turn()  # our turn came, but we will not take it

    def left(self, timer: asyncio.TimerHandle | None) -> None:
        self.lot.unparked(timer)

    @staticmethod
    def took(got: bool | Hold) -> Hold | None:
        """What the wait gave: a Hold (handed over), None (go and compete)."""
        if isinstance(got, Hold):
            return got
        if not got:
            raise LockTimeoutError("timed out waiting for the lock")
        return None

    def pass_turn(self) -> None:
        if self.lot.unpark(True) is not None:
            return
        if self.member:
            # Nobody here waits on: leave the waiting set in Redis, and pass on
            # a grant or wake-up that may have been aimed at this Client meanwhile.
            self._leave_soon()
        self.busy = False
        self.handoffs = 0
        if self.hold is None and not self.competing:
            self.engine.drop_state(self.key, self)

    def hold_ended(self, hold: Hold) -> None:
        if self.hold is hold:
            self.hold = None
            self.pass_turn()

    def release(self, hold: Hold) -> asyncio.Future[int]:
        """Release ``hold`` in Redis, handing the lock to the next local task if one waits."""
        engine = self.engine
        turn = self.lot.first()
        lock = self.lock
        if turn is None or lock is None or self.hold is not hold:
            self.handoffs = 0
            return engine.release_hold(hold)
        if (
            hold.reserve > 0
            and hold.watchdog
            and turn.lease is None
            and self.handoffs < COHORT_BOUND
            and hold.confirmed == engine.epoch
        ):
            return self._pass_locally(hold, turn)
        loop = asyncio.get_running_loop()
        if not engine.grants_by_release:
            # Replicas must acknowledge every grant, and the handoff script
            # grants on the main lane: release plainly instead, and the next
            # local task competes on the acknowledged lane (release_hold's end
            # unparks it, see hold_ended).
            self.handoffs = 0
            return engine.release_hold(hold)
        outcome = Outcome(loop=loop)
        hold.releasing = outcome
        next_owner = engine.owner(turn.task)
        next_lease = engine.lease if turn.lease is None else turn.lease
        sent = loop.time()
        epoch = engine.epoch
        args = (
            hold.release_args[0],  # the hold's entry in Redis (after local passes,
            hold.release_args[1],  # not its own fencing token)
            next_owner,
            to_ms(next_lease),
            engine.retention_ms,
            "1" if self.handoffs >= COHORT_BOUND else "0",
            lock._channel,
            lock._names.wait_prefix,
            TOKEN_RESERVE,
        )
        checked_others = args[5] == "1"

        def done(result: Any, error: BaseException | None) -> None:
            if error is not None:
                engine.spawn(self._handoff_failed(hold, outcome, next_owner))
                return
            code = int(result[0])
            if code == 1:
                if checked_others:
                    self.handoffs = 0  # nobody else waits: a new cohort round may begin
                confirmed = epoch if engine.epoch == epoch else -1
                self._handed(
                    hold, outcome, turn, next_owner, int(result[1]), next_lease, sent, confirmed
                )
            else:
                if code == 2:
                    self.yield_next = True
                engine.release_finished(hold, outcome, code)

        engine.send_script("handoff", lock._names.free, args, done)
        return outcome

    def _pass_locally(self, hold: Hold, turn: _Turn) -> asyncio.Future[int]:
        """Hand the lock to the next local task with no round trip (see the class doc)."""
        on_detach, hold.on_detach = hold.on_detach, None
        self.handoffs += 1
        # The same hold in Redis, a new hold here (Holds.pass_on: as detach()
        # then _install(redis_identity=hold), without rebuilding what it keeps).
        new = self.hold = self.engine.pass_on(hold, turn.task)
        new.on_detach = on_detach
        if log_answers.get(DEBUG) is not False and log.isEnabledFor(DEBUG):
            log.debug(
                "lock %r: handed from %s to %s in this Client, no round trip (fencing token "
                "%d, handoff %d of at most %d in a row)",
                hold.name,
                hold.owner if hold.task is None else self.engine.owner(hold.task),
                self.engine.owner(turn.task),
                new.token,
                self.handoffs,
                COHORT_BOUND,
            )
        if not self.lot.hand(turn, new):
            # Not reached today (release() picks a live waiter and hands with
            # no await between), but a hold nobody takes must not stay held.
            self.engine.spawn(new.new_lease().release())
        done = self.passed
        if done is None:
            done = self.passed = Outcome(loop=asyncio.get_running_loop())
            done.set_result(1)
        return done

    def _handed(
        self,
        hold: Hold,
        outcome: asyncio.Future[int],
        turn: _Turn,
        owner: str,
        token: int,
        lease_s: float,
        sent: float,
        confirmed: int,
    ) -> None:
        assert self.lock is not None
        hold.on_detach = None  # the lock stays busy: no pass_turn
        hold.detach(observed=False)  # (the new hold tells the observer: _install)
        self.hold = None
        self.handoffs += 1
        new = self.lock._install(
            self, turn.task, owner, token, turn.lease, lease_s, sent, confirmed, handed_from=hold
        )
        new.reserve = TOKEN_RESERVE - 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "lock %r: handed from %s to %s in this Client by one script (fencing token %d)",
                hold.name,
                hold.owner,
                owner,
                token,
            )
        if not outcome.done():
            outcome.set_result(1)
        if not self.lot.hand(turn, new):
            # The waiter gave up meanwhile: release what was handed to it
            # (which hands it on, if someone else waits).
            self.engine.spawn(new.new_lease().release())

    async def _handoff_failed(
        self, hold: Hold, outcome: asyncio.Future[int], next_owner: str
    ) -> None:
        """The handoff's reply was lost: release the old hold plainly (idempotent),
        clean up whatever may have been handed over, then go on normally."""
        assert self.lock is not None
        lock, engine = self.lock, self.engine
        try:
            code = int(
                await engine.retry(hold.release_script, hold.release_keys, hold.release_args)
            )
            names = lock._names
            await engine.retry(
                "release",
                names.free,
                # "": the handed hold (it carries no attempt id)
                (next_owner, "", lock._channel, names.wait_prefix, engine.retention_ms, ""),
            )
        except BaseException as exc:
            engine.release_failed(hold, outcome, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        engine.release_finished(hold, outcome, code)

    def registered(self, member: str) -> str:
        """A try of the competing task is about to register ``member`` ("" for
        none): return the entry it replaces in Redis (see acquire.lua)."""
        prev, self.member, self.grant = self.member, member, None
        return prev

    def on_grant(self, message: bytes) -> None:
        """The listener got "g <token> <reserve> <member>": the lock was granted
        to this Client's entry ``member``. Kept if that entry is still this
        Client's; otherwise it was already taken over by a later try or
        released by leave(), and the message is stale."""
        try:
            _, token, reserve, member = message.decode().split(" ", 3)
            engine = self.engine
            grant = (int(token), int(reserve), member, engine.loop_time(), engine.epoch)
        except ValueError:
            return
        if member == self.member:
            self.grant = grant
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "lock %r: granted by a release to this Client's waiting entry %s "
                    "(fencing token %s)",
                    self.key if self.lock is None else self.lock.name,
                    member,
                    token,
                )

    def take_grant(self, member: str) -> tuple[int, int, float, int] | None:
        """The grant to ``member``, if one arrived: (token, reserve, arrival
        time, the connection epoch it arrived in)."""
        grant = self.grant
        if grant is None or grant[2] != member or self.member != member:
            return None
        self.grant = None
        self.member = ""
        return grant[0], grant[1], grant[3], grant[4]

    def leave(self) -> asyncio.Future[Any] | None:
        """Take this Client out of the lock's waiting set in Redis, if it may be
        in it, releasing a grant to it that no task took up.

        The command is on the wire when this returns, so it runs before any
        later try of a local task (same connection, in order).
        """
        if not self.member or self.lock is None:
            return None
        member = self.registered("")
        return self.engine.submit_script("unwait", *self._unwait_call(member))

    def _unwait_call(self, member: str) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        lock = self.lock
        assert lock is not None
        names = lock._names
        return names.free, (member, self.engine.retention_ms, lock._channel, names.wait_prefix)

    def _leave_soon(self) -> None:
        """leave(), retried in the background if its reply is lost (not on close:
        aclose() leaves every waiting set itself)."""
        engine = self.engine
        if engine.closed:
            return
        member = self.member
        reply = self.leave()
        if reply is None:
            return

        def done(reply: asyncio.Future[Any]) -> None:
            if (reply.cancelled() or reply.exception() is not None) and not engine.closed:
                engine.clean_up("unwait", *self._unwait_call(member))

        reply.add_done_callback(done)

    def close(self) -> None:
        self.lot.close()
