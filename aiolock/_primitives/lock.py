"""AsyncLock: a reentrant distributed lock, Redisson's RLock made asyncio-native."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .._core.errors import LockTimeoutError
from .._core.futures import Outcome
from .._core.holds.lease import Hold, Lease
from .._core.observe.observer import CURRENT_ATTEMPT, DEBUG, Attempt, Observer, answers, outcome_of
from .._core.protocol.keys import LockKeys
from .._core.validate import check_lease, check_timeout, to_ms
from .._core.waiting.parking import Parked, ParkingLot
from .base import Entry, SingleHolder, compete, ttl_hint

if TYPE_CHECKING:
    from .._core.holds.undo import Call
    from .._core.view import EngineView
    from .._core.waiting.notify import Waiter

__all__ = ["AsyncLock", "LocalQueue"]

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

    def __init__(self, engine: EngineView, key: str, lock: AsyncLock | None = None) -> None:
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


def _acquired(attempt: Attempt | None, lease: Lease) -> Lease:
    """An observed acquisition succeeded (see ``AsyncLock._acquire``)."""
    if attempt is not None:
        attempt.observer.finished(attempt, "acquired", lease)
    return lease


class AsyncLock(SingleHolder):
    """A reentrant distributed lock on Redis or Valkey, shared by any number of tasks.

    * **Who may release:** the task that acquired it, with ``release()``; or
      anyone holding the returned :class:`Lease`, with ``lease.release()``
      (a handoff between tasks).
    * **Reentrant** per asyncio Task: the holder may acquire again (no round
      trip) and must release as many times; a re-entry returns the holder's
      fencing token.
    * **Fairness:** tasks of one Client queue FIFO locally and only the head
      of that queue competes in Redis; across Clients it is not fair (use
      the fair lock for strict FIFO).
    * **Wake-ups and grants** (``notify="pubsub"``): the task of a Client
      that waits (one per Client; its other tasks queue behind it) is
      registered in Redis, and a release hands the lock to the next
      registered task (about the one that has waited longest) in the same
      script, telling only that task's Client, on its own channel: the
      grantee takes the lock without a round trip, and no Client is woken
      only to lose the race. A waiter with a fixed ``lease=`` is woken
      instead and takes the lock with its own try. A release costs the same
      whether 1 or 100 Clients wait. A waiter that gives up (cancelled,
      timed out, Client closed) leaves at once, and a grant or wake-up sent
      to it goes to its Client's next task or is passed on. A Client that
      no longer listens (dead, disconnected) is skipped; one that hangs
      while still connected keeps a grant for at most its Client's lease.
    * **Lease expiry:** without ``lease=`` the hold has the Client's lease
      time and the watchdog renews it while held. With ``lease=`` it simply
      expires then. Either way, a hold that ends without a release is
      *lost*: ``lease.lost`` turns true, ``on_lost`` callbacks run, and
      inside ``async with`` the body is cancelled and LockLostError is
      raised from the ``async with`` (unless ``on_lost="ignore"``).
    * **Cancellation:** an acquire cancelled at any await, even after Redis
      granted the lock but before the reply was read, leaves no hold and no
      waiter behind; a cancelled release still completes; ``async with``
      releases when its body raised or was cancelled.
    * **Fencing:** every fresh acquisition gets a token strictly greater than
      every token issued before for this name; a token handed to a local
      waiter without a round trip is never lower than one the server issued
      since (see the README on restarts and failovers).
    * **Restarts:** when a connection to the server is lost, every hold is
      checked as soon as the server answers again; a hold it no longer has
      is lost at once.
    """

    __slots__ = ("_entry_map", "_wait_channel", "_what")

    _keys_type = LockKeys
    _names: LockKeys

    #: The acquire script; the spin lock shares everything but the waiting.
    _acquire_script = "acquire"
    #: Whether a waiter in pub/sub mode registers for a targeted wake-up
    #: (see scripts/_wake.lua); the spin lock only polls.
    _targeted = True

    def __init__(self, engine: EngineView, name: str) -> None:
        super().__init__(engine, name)
        self._wait_channel = self._names.wait_channel(engine.id)
        self._entry_map: dict[asyncio.Task[Any], list[Entry]] = {}
        self._what = f"lock {self.name!r}"

    def _entries(self) -> dict[asyncio.Task[Any], list[Entry]]:
        return self._entry_map

    # -- acquire -----------------------------------------------------------------------

    def acquire(
        self,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        max_hold: float | None = None,
    ) -> Coroutine[Any, Any, Lease]:
        """Wait for the lock and return its lease (see ``Acquirable.acquire``).

        The plain lock observes the attempt (statistics, telemetry) inside
        ``_acquire`` rather than through ``observed()``: one coroutine frame
        less per waiting task (0.69 of 1.82 KiB per waiter) and on every
        resumption (issue 20 item 8)."""
        # (The checks and the observer inline when no argument is given: the
        # common call, made once per acquisition.)
        if max_hold is not None:  # (max_hold.py)
            return super().acquire(timeout=timeout, lease=lease, max_hold=max_hold)
        return self._acquire(
            None if timeout is None else check_timeout(timeout),
            None if lease is None else check_lease(lease),
            self._engine.observer,
        )

    def _observed(self, timeout: float | None, lease: float | None) -> Coroutine[Any, Any, Lease]:
        # try_acquire and ``async with`` too: observed inside _acquire (see acquire).
        return self._acquire(timeout, lease, self._engine.observer)

    async def _acquire(
        self, timeout: float | None, lease: float | None, observer: Observer | None = None
    ) -> Lease:
        # Observed here, as observed() would, if an observer is given (the
        # callers that go through observed() give none). An Attempt is made
        # only to compete in Redis, where it is in the context (for
        # note_waiting); a task parked in the local queue counts itself as
        # waiting and is handed the lock with none (Observer.ended): no
        # object and no context entry per waiting task.
        attempt = token = None
        started = perf_counter() if observer is not None else 0.0
        waited = False
        try:
            engine = self._engine
            task = engine.enter_task()
            loop = task.get_loop()
            state: LocalQueue | None = engine.peek_state(self._key)
            if state is None:
                state = engine.state(self._key, new_queue, self)
            else:
                hold = state.hold
                if hold is not None and hold.task is task:
                    if hold.releasing is None:
                        lease_ = hold.new_lease()
                        if observer is not None:
                            observer.ended(self.kind, self.name, started, False, "acquired", lease_)
                        return lease_
                    # Our release of it is still on its way (its caller was
                    # cancelled, or another task released the lease): no re-entry
                    # into a hold being released; queue up (the lock is busy) and
                    # get a new hold after it.
                if state.lock is None:
                    state.lock = self
            deadline = None if timeout is None else loop.time() + timeout
            if state.busy:
                if observer is not None and not waited:  # (note_waiting)
                    waited = True
                    observer.began_waiting_for(self.kind, self.name)
                # state.turn(), inline: one coroutine frame less per waiting task.
                # (Counted as waiting above if observed here: the lot need not
                # look for an attempt in the context; observed() callers' it finds.)
                if deadline is not None and deadline <= loop.time():
                    raise LockTimeoutError("the lock is busy and the timeout allowed no wait")
                fut: asyncio.Future[bool | Hold] = loop.create_future()
                noted = observer is not None
                timer = state.lot.park(_Turn(fut, task, lease), deadline, noted=noted)
                try:
                    got = await fut
                except asyncio.CancelledError:
                    state.gave_up(fut)
                    raise
                finally:
                    state.lot.unparked(timer)
                if isinstance(got, Hold):  # (state.took(), inline)
                    lease_ = got.new_lease()
                    if observer is not None:
                        observer.ended(self.kind, self.name, started, waited, "acquired", lease_)
                    return lease_
                if not got:
                    raise LockTimeoutError("timed out waiting for the lock")
                if state.yield_next:
                    # Another Client's task waits: give it a moment to take the lock.
                    state.yield_next = False
                    try:
                        await asyncio.sleep(COHORT_YIELD)
                    except BaseException:
                        state.pass_turn()
                        raise
            else:
                state.busy = True
            if observer is not None:
                attempt = Attempt(observer, self.kind, self.name, started, waited)
                token = CURRENT_ATTEMPT.set(attempt)
            try:
                hold = await self._compete(state, task, lease, deadline, loop)
            except BaseException:
                state.pass_turn()  # (which leaves the waiting set if no local task waits on)
                raise
            return _acquired(attempt, hold.new_lease())
        except BaseException as exc:
            if attempt is not None:
                if not attempt.done:
                    attempt.observer.finished(attempt, outcome_of(exc), None)
            elif observer is not None:
                observer.ended(self.kind, self.name, started, waited, outcome_of(exc), None)
            raise
        finally:
            if token is not None:
                CURRENT_ATTEMPT.reset(token)

    async def _compete(
        self,
        state: LocalQueue,
        task: asyncio.Task[Any],
        lease: float | None,
        deadline: float | None,
        loop: asyncio.AbstractEventLoop,
    ) -> Hold:
        engine = self._engine
        owner = engine.owner(task)
        lease_s = engine.lease if lease is None else lease
        keys = self._names.acquire
        attempt_id = engine.attempt_id()
        base = (owner, to_ms(lease_s), engine.retention_ms, TOKEN_RESERVE, attempt_id)
        tail = (self._channel, self._names.wait_prefix)
        # Not with replicas acknowledging: a grant by another Client's release
        # is taken without a round trip, so nothing would wait for the replicas.
        targeted = self._targeted and engine.notify == "pubsub" and engine.grants_by_release
        # This task's entry in the waiting set: a watchdog hold may be granted
        # to it by a release (for one Client lease, renewed as any other); a
        # fixed lease is only woken (see scripts/_wake.lua).
        member = f"{owner}|{attempt_id}|{engine.lease_ms if lease is None else 0}"
        names = self._names
        undo = engine.undo(
            (
                (
                    "release",
                    names.free,
                    (owner, "", names.channel, names.wait_prefix, engine.retention_ms, attempt_id),
                ),
            ),
            undo_granted,
        )
        script = self._acquire_script
        granted: tuple[int, int, float, int] | None = None
        # The connection epoch in which the server granted the hold (-1: unknown).
        confirmed = -1

        async def attempt() -> tuple[int | None, float | None]:
            nonlocal granted, confirmed
            granted = state.take_grant(member)
            if granted is not None:
                return granted[0], None  # granted by a release: no round trip
            # Register for a wake-up only if this call may wait; a try that
            # will not wait ("-") flags nothing (nobody waits on its account).
            will_wait = deadline is None or deadline > loop.time()
            entry = (member if targeted else "") if will_wait else "-"
            prev = state.registered(member if entry == member else "")
            args = (*base, entry, engine.lease_ms, prev, *tail)
            epoch = engine.epoch
            reply = await engine.eval(script, keys, args, undo)
            if reply[0] == 1:
                state.registered("")
                confirmed = epoch if engine.epoch == epoch else -1
                return int(reply[1]), None
            granted = state.take_grant(member)  # granted while the try was on the wire
            if granted is not None:
                return granted[0], None
            return None, ttl_hint(int(reply[1]))

        token, sent = await compete(
            engine,
            what=self._what,
            deadline=deadline,
            attempt=attempt,
            waiter=self._targeted_waiter if targeted else self._waiter,
            abandon=undo.abandon,
            parked=state.set_competing,
            warm=self._warm_waiter if targeted else None,
        )
        reserve = TOKEN_RESERVE
        if granted is not None:
            # The lease runs from the grant's arrival (the release ran a
            # one-way trip earlier; the watchdog renews long before it matters).
            _, reserve, sent, confirmed = granted
        hold = self._install(state, task, owner, token, lease, lease_s, sent, confirmed)
        hold.reserve = reserve - 1
        return hold

    def _targeted_waiter(self) -> Waiter:
        waiter = self._engine.pubsub_waiter(self._wait_channel)
        self._sink_grants()
        return waiter

    def _warm_waiter(self) -> Waiter | None:
        """This Client's channel of the lock, if it is still subscribed (lingering)."""
        engine = self._engine
        channel = engine.subscribed(self._wait_channel)
        if channel is None or not channel.is_confirmed or channel.closed:
            return None
        waiter = engine.pubsub_waiter(self._wait_channel)
        self._sink_grants()
        return waiter

    def _sink_grants(self) -> None:
        channel = self._engine.subscribed(self._wait_channel)
        if channel is not None and channel.grant_sink is None:
            channel.grant_sink = self._on_grant

    def _on_grant(self, message: bytes) -> None:
        state = self._engine.peek_state(self._key)
        if isinstance(state, LocalQueue):
            state.on_grant(message)

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
    ) -> Hold:
        """Make a new hold of ``task`` (``Engine.new_hold``) and record it as the local one.

        ``redis_identity``: a hold passed on locally keeps the Redis entry
        (owner and token) of the hold it came from, for release and renewal.
        ``handed_from``: the hold this one takes over locally (see ``new_hold``).
        """
        engine = self._engine
        if redis_identity is not None:
            release = (
                redis_identity.release_script,
                redis_identity.release_keys,
                redis_identity.release_args,
            )
            renew = (
                redis_identity.renew_script,
                redis_identity.renew_key,
                redis_identity.renew_args,
            )
        else:
            names = self._names
            release = (
                "release",
                names.free,
                (owner, token, self._channel, names.wait_prefix, engine.retention_ms),
            )
            renew = ("renew", self._key, (owner, token))
        hold = state.hold = engine.new_hold(
            self.name,
            owner,
            token,
            task,
            lease,
            lease_s,
            sent,
            release=release,
            renew=renew,
            on_detach=state.hold_ended,
            on_release=state.release,
            confirmed=confirmed,
            kind=self.kind,
            handed_from=handed_from,
        )
        return hold

    # -- release -------------------------------------------------------------------------

    def _my_hold(self) -> Hold | None:
        state: LocalQueue | None = self._engine.peek_state(self._key)
        if state is None or state.hold is None:
            return None
        task = asyncio.current_task()
        return state.hold if state.hold.task is task else None

    # -- queries ----------------------------------------------------------------------------

    async def force_release(self) -> bool:
        """Delete the lock whoever holds it; True if it was held.

        The evicted holder's lease is lost: at once if it is in this Client;
        else its Client is told at once, through its eviction channel (pub/sub
        mode, connected: within about a round trip); otherwise its watchdog
        finds the hold gone within its Client's ``lease / 3``, fixed leases
        included.
        Fencing tokens keep increasing.
        """
        engine = self._engine
        engine.enter()
        deleted = int(
            await engine.eval(
                "force_release",
                self._names.free,
                (
                    self._channel,
                    self._names.wait_prefix,
                    engine.retention_ms,
                    await engine.evictions.template(self._key),
                ),
            )
        )
        state: LocalQueue | None = engine.peek_state(self._key)
        if state is not None and state.hold is not None:
            state.hold.mark_lost("force-released")
        return deleted == 1

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        state: LocalQueue | None = self._engine.peek_state(self._key)
        if state is None:
            return (), 0
        hold = state.hold
        return ((hold,) if hold is not None else ()), state.waiting()


def new_queue(lock: AsyncLock) -> LocalQueue:
    """The local state of ``lock``'s name (``Engine.state``'s factory)."""
    return LocalQueue(lock._engine, lock._key, lock)


def undo_granted(reply: Any, calls: tuple[Call, ...]) -> tuple[Call, ...]:
    """The undo of an acquire whose reply came after its caller gave up: release
    the hold it took, by its token (see ``Engine.undo``; ``calls``: the release
    by attempt id, for when it is unknown whether the script ran)."""
    if reply and int(reply[0]) == 1:
        name, keys, (owner, _, channel, wait_prefix, retention, _) = calls[0]
        return ((name, keys, (owner, int(reply[1]), channel, wait_prefix, retention)),)
    return ()
