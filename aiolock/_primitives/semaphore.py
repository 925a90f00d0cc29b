"""Semaphore: at most N permits held at once, every permit a lease.

Redisson's RSemaphore keeps a bare counter: a holder that crashes never
gives its permits back. Here every acquisition is a *hold* of its own, with
its own fencing token and its own lease, recorded in Redis as a member
``"<permits>|<holder id>"`` of a sorted set scored by its expiry (server
clock). Every script run first purges the expired members, so a crashed
holder's permits come back within its lease, however the crash happened.
The layout and the claim rule are described in ``scripts/_sem.lua``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from .._core.errors import InvalidArgumentError, LockNotOwnedError
from .._core.holds.lease import Hold
from .._core.observe.observer import observed
from .._core.options import LockStatistics
from .._core.protocol.keys import SemaphoreKeys
from .._core.validate import check_lease, check_timeout, to_ms
from .base import (
    Entry,
    LockContext,
    LockLike,
    OnLost,
    Primitive,
    check_on_lost,
    current_task,
)
from .compete import compete
from .max_hold import cap_lease, check_max_hold, maybe
from .permit import MAX_PERMITS, Permit, SemState, check_permits, permits_of
from .stats import describe_holders, lock_statistics

if TYPE_CHECKING:
    from .._core.holds.undo import Call
    from .._core.view import EngineView

__all__ = ["MAX_PERMITS", "Permit", "Semaphore"]

P = ParamSpec("P")
R = TypeVar("R")

class SemaphoreContext(LockContext[Permit]):
    """``sem(permits=..., timeout=..., lease=..., on_lost=...)``: context manager, decorator."""

    __slots__ = ("_permits", "_sem")

    def __init__(
        self,
        sem: Semaphore,
        permits: int,
        timeout: float | None,
        lease: float | None,
        on_lost: OnLost,
        max_hold: float | None = None,
    ) -> None:
        super().__init__(sem, timeout, lease, on_lost, max_hold)
        self._sem = sem
        self._permits = permits

    async def __aenter__(self) -> Permit:
        return await self._sem._enter_permits(
            self._permits, self._timeout, self._lease, self._on_lost, self._max_hold
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._sem._exit_ctx(exc_type, exc)


class Semaphore(Primitive, LockLike[Permit]):
    """A distributed semaphore: at most N permits held at once, across all Clients.

    ``client.semaphore(name, permits)``; ``permits`` is the N the semaphore
    gets on first use (N lives in Redis; change it with :meth:`set_permits`).

    * **Every permit is a lease.** Each acquisition is its own hold, with its
      own fencing token (strictly increasing per name) and its own lease:
      renewed by the watchdog when ``lease=None``, fixed otherwise. When a
      holder crashes (or its lease is lost), its permits come back by
      themselves once its lease expires: every script run purges expired
      holders by the server's clock.
    * **Who may release:** the returned :class:`Permit`, from any task
      (``permit.release()`` gives back exactly what it took, once); or
      ``sem.release()``, which releases the current task's most recent
      acquisition. An operator may evict every holder at once with
      :meth:`force_release` (``aiolock force-release NAME``).
    * **Not reentrant:** a semaphore counts permits, not owners. A task that
      acquires twice holds two acquisitions and must release both; it can
      deadlock itself by asking for more than is left.
    * **Wake-ups:** a release of k permits wakes k waiting tasks per Client
      (``notify`` mode permitting). Expired holders purged by any call wake
      waiters too; without any message a waiter re-checks when the first
      holder's lease would expire (at most every ``client.lease``).
    * **Fairness:** none is promised, locally or across Clients, except that
      a waiter asking for many permits is not starved by a stream of small
      ones: the waiter that has waited longest (on any Client) holds a
      *claim* on its permits; while the claim lives, others are granted
      only what leaves room for the claimant. An older waiter takes the
      claim over on its next try, so a stream of small waiters that retry
      often cannot keep it from a big one. The claimant refreshes its claim
      on every try (at least every ``client.lease / 2``); a claimant that
      crashed blocks the room it claimed for at most one ``client.lease``;
      a cancelled or timed-out claimant drops its claim at once.
    * **Bad input:** ``permits`` must be an int from 1 to MAX_PERMITS
      (checked before any round trip). Asking for more than N (which lives
      in Redis and may change) raises InvalidArgumentError after the first
      try, and also for a waiter when N is lowered below what it asks for.
    * **Lost leases:** ``lease.lost`` turns true and ``on_lost`` callbacks
      run; inside ``async with`` the body is cancelled and LockLostError is
      raised (unless ``on_lost="ignore"``). ``max_hold=`` ends a permit at
      that age, as a lost lease (max_hold.py).
    * **Handing over:** ``permit.handle`` and ``client.adopt(handle)`` move
      one acquisition (its permits, its token, its expiry) to a task of
      another Client; this permit then reports released (adopt.py).
    * **Cancellation:** an acquire cancelled at any await, even after Redis
      granted it but before the reply was read, leaves no hold, claim or
      waiter behind; a cancelled release still completes.
    * **Keys:** everything has a TTL, and an idle semaphore (nothing held,
      nobody claiming) whose N is the one given to the constructor has no
      key at all but its fencing counter (and, for 120 s after a release,
      the record that makes a retried release idempotent). An N changed by
      :meth:`set_permits` is kept for the Client's fence retention (24 h)
      after the last call that touched the semaphore, and at least as long
      as its last holder's lease; then the semaphore starts again from the
      N given to the constructor. (Clients that construct the same name
      with different N see the N of whoever used it first since it was
      idle.)
    """

    __slots__ = ("_entry_map", "_permits")

    _keys_type = SemaphoreKeys
    _names: SemaphoreKeys
    kind = "semaphore"

    def __init__(self, engine: EngineView, name: str, permits: int) -> None:
        super().__init__(engine, name)
        self._permits = check_permits(permits)
        self._entry_map: dict[asyncio.Task[Any], list[Entry]] = {}

    def _entries(self) -> dict[asyncio.Task[Any], list[Entry]]:
        return self._entry_map

    @property
    def permits(self) -> int:
        """The N this object gives the semaphore on first use (or last set through it).

        No round trip: the N in Redis may differ (see :meth:`get_permits`).
        """
        return self._permits

    # -- acquire ------------------------------------------------------------------------

    async def acquire(
        self,
        permits: int = 1,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        max_hold: float | None = None,
    ) -> Permit:
        """Wait for ``permits`` permits and return a :class:`Permit` that holds them.

        ``timeout``: seconds to wait at most (None: for ever); raises
        LockTimeoutError (a TimeoutError) when it runs out. ``lease``: a
        fixed lease in seconds with no renewal (None: the watchdog renews it).
        ``max_hold``: the permit is lost (and given back) when it is that old
        (see max_hold.py).
        """
        n, checked_timeout, checked_lease = (
            check_permits(permits),
            check_timeout(timeout),
            check_lease(lease),
        )
        limit = check_max_hold(max_hold)
        return await maybe(
            observed(
                self._engine.observer,
                self.kind,
                self.name,
                self._acquire_permits,
                n,
                checked_timeout,
                cap_lease(checked_lease, limit),
            ),
            limit,
            checked_lease,
        )

    async def try_acquire(
        self,
        permits: int = 1,
        *,
        wait: float = 0.0,
        lease: float | None = None,
        max_hold: float | None = None,
    ) -> Permit | None:
        """Acquire if possible within ``wait`` seconds (default: one try, no waiting).

        Returns the Permit, or None if not enough permits came free.
        """
        checked = check_permits(permits)
        checked_wait = check_timeout(wait, "wait")
        checked_lease = check_lease(lease)
        limit = check_max_hold(max_hold)
        try:
            return await maybe(
                observed(
                    self._engine.observer,
                    self.kind,
                    self.name,
                    self._acquire_permits,
                    checked,
                    checked_wait,
                    cap_lease(checked_lease, limit),
                ),
                limit,
                checked_lease,
            )
        except TimeoutError:
            return None

    async def _acquire(self, timeout: float | None, lease: float | None) -> Permit:
        return await self._acquire_permits(1, timeout, lease)

    async def _acquire_permits(
        self, permits: int, timeout: float | None, lease: float | None
    ) -> Permit:
        engine = self._engine
        loop = engine.enter()
        task = current_task()
        state = engine.state(self._names.local, new_state, self)
        deadline = None if timeout is None else loop.time() + timeout
        state.active += 1
        try:
            return await self._compete(state, task, permits, lease, deadline)
        finally:
            state.active -= 1
            state.drop_if_idle()

    async def _compete(
        self,
        state: SemState,
        task: asyncio.Task[Any],
        permits: int,
        lease: float | None,
        deadline: float | None,
    ) -> Permit:
        engine = self._engine
        # A try that will not wait takes no claim (it would only hold others back).
        timeout_allows_wait = deadline is None or deadline > asyncio.get_running_loop().time()
        owner = engine.owner(task)
        member = f"{permits}|{owner}:{engine.attempt_id()}"
        lease_s = engine.lease if lease is None else lease
        keys = self._names.acquire
        claim_ms = engine.lease_ms if timeout_allows_wait else 0
        since_ms = 0  # when this acquisition first failed, by the server's clock

        release_keys = self._names.release
        release_args = (member, self._permits, engine.retention_ms, self._channel)
        claimed = False
        # Return whatever this member may hold, and drop its claim (not once
        # the Client is closing: its aclose() releases the holds itself).
        undo = engine.undo(
            (("sem_release", release_keys, release_args),), _sem_replied, while_open=True
        )

        async def attempt() -> tuple[int | None, float | None]:
            nonlocal claimed, since_ms
            args = (
                member,
                self._permits,
                to_ms(lease_s),
                engine.retention_ms,
                self._channel,
                claim_ms,
                since_ms,
            )
            reply = await engine.eval("sem_acquire", keys, args, undo)
            code = int(reply[0])
            if code == 1:
                return int(reply[1]), None
            if code == -1:
                raise InvalidArgumentError(
                    f"semaphore {self.name!r} has {int(reply[1])} permits in all; "
                    f"{permits} can never be acquired at once"
                )
            wait_ms = int(reply[1])
            since_ms = int(reply[3])
            bound = engine.lease
            if int(reply[2]) == 1:
                claimed = True
                bound = engine.lease / 2  # refresh the claim before it lapses
            elif claimed:
                claimed = False  # our claim lapsed and another waiter took it
            if wait_ms > 0:
                bound = min(bound, wait_ms / 1000.0)
            return None, bound

        try:
            token, sent = await compete(
                engine,
                what=f"{permits} permit(s) of semaphore {self.name!r}",
                deadline=deadline,
                attempt=attempt,
                waiter=self._waiter,
                abandon=undo.abandon,
                parked=state.set_parked,
            )
        except BaseException:
            if claimed:
                undo.now()
            raise
        hold = engine.new_hold(
            self.name,
            owner,
            token,
            task,
            lease,
            lease_s,
            sent,
            release=("sem_release", release_keys, release_args),
            renew=("sem_renew", self._names.holders, (member,)),
            on_detach=state.hold_ended,
            kind=self.kind,
        )
        permit = Permit(hold, permits)
        hold.leases.append(permit)
        state.held[hold] = None
        return permit

    # -- async with ------------------------------------------------------------------------

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(
        self,
        fn: None = None,
        /,
        *,
        permits: int = 1,
        timeout: float | None = None,
        lease: float | None = None,
        on_lost: OnLost = "cancel",
        max_hold: float | None = None,
    ) -> SemaphoreContext: ...

    def __call__(
        self,
        fn: Callable[P, Coroutine[Any, Any, R]] | None = None,
        /,
        *,
        permits: int = 1,
        timeout: float | None = None,
        lease: float | None = None,
        on_lost: OnLost = "cancel",
        max_hold: float | None = None,
    ) -> Callable[P, Coroutine[Any, Any, R]] | SemaphoreContext:
        """``async with sem(permits=2, timeout=..., lease=..., on_lost=...)``; ``@sem(...)``."""
        context = SemaphoreContext(
            self,
            check_permits(permits),
            check_timeout(timeout),
            check_lease(lease),
            check_on_lost(on_lost),
            check_max_hold(max_hold),
        )
        if fn is None:
            return context
        return context(fn)

    async def _enter_permits(
        self,
        permits: int,
        timeout: float | None,
        lease: float | None,
        on_lost: OnLost,
        max_hold: float | None = None,
    ) -> Permit:
        observer = self._engine.observer
        got = await maybe(
            observed(
                observer,
                self.kind,
                self.name,
                self._acquire_permits,
                permits,
                timeout,
                cap_lease(lease, max_hold),
            ),
            max_hold,
            lease,
        )
        task = current_task()
        entry = Entry(got, task, on_lost)
        self._entry_map.setdefault(task, []).append(entry)
        got._watch(entry)
        return got

    # -- release ---------------------------------------------------------------------------

    async def release(self) -> None:
        """Release the current task's most recent acquisition still held here.

        An acquisition whose lease was lost is gone already (its loss was
        reported: LockLostError, ``on_lost``), so it is skipped. Raises
        LockNotOwnedError if the current task holds none. If cancelled while
        the release is on the wire, the release still completes.
        """
        self._engine.check_usable()
        state: SemState | None = self._engine.peek_state(self._names.local)
        task = asyncio.current_task()
        if state is not None:
            for hold in reversed(list(state.held)):
                if hold.task is task and hold.leases:
                    await hold.leases[-1].release()
                    return
        raise LockNotOwnedError(
            f"semaphore {self.name!r}: the current task holds no permits; "
            "release them from the task that acquired them, or call permit.release()"
        )

    # -- N and queries -------------------------------------------------------------------------

    async def _state(self) -> tuple[int, int]:
        engine = self._engine
        engine.enter()
        reply = await engine.eval(
            "sem_state",
            self._names.state,
            (self._permits, engine.retention_ms, self._channel),
        )
        return int(reply[0]), int(reply[1])

    async def available(self) -> int:
        """Permits free right now (N minus those in use; 0 if N was lowered below that).

        A pending claim (see the class docstring) is not subtracted.
        """
        n, used = await self._state()
        return max(0, n - used)

    async def get_permits(self) -> int:
        """N, as Redis has it (initialised to this object's ``permits`` on first use)."""
        n, _ = await self._state()
        return n

    async def in_use(self) -> int:
        """Permits held right now, by every Client (expired holders not counted)."""
        _, used = await self._state()
        return used

    async def set_permits(self, permits: int) -> None:
        """Change N, safely while permits are held.

        Holders keep their permits; after lowering N, new acquisitions wait
        until the permits in use plus theirs fit in the new N; raising N
        wakes waiters. A waiter that asks for more than the new N gets
        InvalidArgumentError. This object's ``permits`` becomes the new N too.
        """
        n = check_permits(permits)
        engine = self._engine
        engine.enter()
        await engine.eval(
            "sem_set_permits",
            self._names.state,
            (n, self._permits, engine.retention_ms, self._channel),
        )
        self._permits = n

    # -- force release ---------------------------------------------------------------------

    async def force_release(self) -> bool:
        """Evict every holder of the semaphore, whoever they are; True if there was one.

        For an operator's use (``aiolock force-release NAME``), when holders are
        stuck. Every permit held, by any task of any Client, returns at once:

        * **Who is evicted:** every acquisition alive in Redis when the call
          runs (expired ones are purged and do not count). Acquisitions made
          after it are not touched.
        * **What they see:** their lease is lost, with reason
          ``"force-released"`` at once for the holds of this Client; another
          holder's Client is told at once through its eviction channel
          (pub/sub mode, connected: about a round trip), else its watchdog
          finds the hold gone within that Client's ``lease / 3`` (fixed
          leases are checked too): ``lease.lost`` turns true, ``on_lost``
          callbacks run, and the body of ``async with`` is cancelled with
          LockLostError. Its release then raises LockNotOwnedError, never
          gives back permits it no longer has.
        * **Waiters** are woken as by a release of all those permits (as many
          as came free, per Client); a pending claim is kept.
        * **Nothing else changes:** N (as Redis has it; this object's
          ``permits`` is not written), the fencing counter (tokens keep
          increasing), the keys' expiry times.
        """
        engine = self._engine
        engine.enter()
        reply = await engine.eval(
            "sem_force_release",
            self._names.force_release,
            (self._channel, await engine.evictions.template(self._names.main)),
        )
        evicted = {m.decode() if isinstance(m, bytes) else str(m) for m in reply}
        state: SemState | None = engine.peek_state(self._names.local)
        if state is not None:
            # Only the holds the script evicted: a task of this Client may have
            # acquired again since (woken by this very call).
            for hold in list(state.held):
                if hold.renew_args and hold.renew_args[0] in evicted:
                    hold.mark_lost("force-released")
        return bool(evicted)

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        state: SemState | None = self._engine.peek_state(self._names.local)
        if state is None:
            return (), 0
        return tuple(state.held), state.parked

    def statistics(self) -> LockStatistics:
        """This Client's view of the semaphore: its local holders (one per
        acquisition), the permits they hold (``hold_count``), the highest
        fencing token, the first lease to expire, and its waiting tasks.

        Local only, no round trip: permits held by other Clients are not
        seen; ``await sem.available()`` asks the server.
        """
        holds, waiting = self._local_view()
        return lock_statistics(
            self.kind, self.name, self._engine.loop, holds, waiting, count=permits_of
        )

    def __repr__(self) -> str:
        # Plain attributes and the loop's clock only: valid from any thread.
        head = f"<Semaphore {self.name!r} N={self._permits}"
        if self._engine.loop is None:
            return f"{head} not used yet>"
        stats = self.statistics()
        return f"{head}: {describe_holders(stats, 'permit')}, {stats.waiting} waiting>"


def new_state(semaphore: Semaphore) -> SemState:
    """The local state of ``semaphore``'s name (``Engine.state``'s factory)."""
    return SemState(semaphore._engine, semaphore._names.local)


def _sem_replied(reply: Any, calls: tuple[Call, ...]) -> tuple[Call, ...]:
    """The undo of a sem_acquire whose reply came after its caller gave up (see
    ``Engine.undo``): give back what it took, or drop the claim it made."""
    if reply and (int(reply[0]) == 1 or (int(reply[0]) == 0 and int(reply[2]) == 1)):
        return calls
    return ()
