"""AsyncLock: a reentrant distributed lock, Redisson's RLock made asyncio-native.

Its local state per name (the local queue and cohort handoffs) is
``LocalQueue`` in ``lock_queue.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .._core.errors import LockTimeoutError
from .._core.holds.lease import Hold, Lease
from .._core.observe.observer import CURRENT_ATTEMPT, Attempt, Observer, outcome_of
from .._core.protocol.keys import LockKeys
from .._core.validate import check_lease, check_timeout, to_ms
from .base import Entry, SingleHolder
from .compete import compete, ttl_hint
from .lock_queue import COHORT_YIELD, TOKEN_RESERVE, LocalQueue, _Turn

if TYPE_CHECKING:
    from .._core.holds.undo import Call
    from .._core.view import EngineView
    from .._core.waiting.notify import Waiter

__all__ = ["AsyncLock"]


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
      since (docs/semantics.md, "Restarts and failovers").
    * **Restarts:** when a connection to the server is lost, every hold is
      checked as soon as the server answers again; a hold it no longer has
      is lost at once.
    * **max_hold / handing over:** ``max_hold=`` ends a hold at that age
      (lost, reason naming max_hold: max_hold.py); ``lease.handle`` and
      ``client.adopt(handle)`` move the whole hold (re-entries included,
      same token) to a task of another Client, and this lease reports
      released (adopt.py).
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
