"""MultiLock: all or nothing over several locks, possibly on several Clients or cluster nodes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._core.errors import (
    ConnectionFailedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockNotOwnedError,
    LockTimeoutError,
)
from .._core.holds.lease import Hold, Lease, LostCallback
from .._core.observe.observer import Observer
from .._core.options import LockStatistics
from .._core.protocol.slots import slot_of
from .._core.validate import check_seconds, to_ms
from .base import Acquirable, Entry, current_task
from .compete import compete, ttl_hint
from .lock import AsyncLock, new_queue
from .lock_queue import LocalQueue
from .spin import SpinLock

if TYPE_CHECKING:
    from .._core.holds.undo import Call
    from .._core.view import EngineView

__all__ = ["MultiLease", "MultiLock"]


class MultiLease:
    """The leases of one multi-lock acquisition, one per lock, handled as one.

    ``fencing_tokens`` maps each name to its token; ``fencing_token`` is the
    largest of them, which also increases strictly from one acquisition of
    the same set of names to the next. ``lost`` is true as soon as any one
    lease is lost; ``release()`` releases every lease (idempotent).
    """

    __slots__ = ("_forget", "_leases", "_released")

    def __init__(
        self, leases: Sequence[Lease], forget: Callable[[MultiLease], None] | None = None
    ) -> None:
        self._leases = list(leases)
        self._released = False
        self._forget = forget

    @property
    def name(self) -> str:
        return "+".join(lease.name for lease in self._leases)

    @property
    def leases(self) -> list[Lease]:
        return list(self._leases)

    @property
    def handle(self) -> str:
        """Not for a multi-lock (several holds): InvalidArgumentError. Each
        part's ``leases[i].handle`` hands that one lock over (client.adopt)."""
        raise InvalidArgumentError(
            f"multi-lock {self.name!r}: several holds cannot be handed over as one; "
            "hand a part over with its own lease (multi_lease.leases[i].handle)"
        )

    @property
    def fencing_tokens(self) -> dict[str, int]:
        return {lease.name: lease.fencing_token for lease in self._leases}

    @property
    def fencing_token(self) -> int:
        return max(lease.fencing_token for lease in self._leases)

    @property
    def lost(self) -> bool:
        return any(lease.lost for lease in self._leases)

    @property
    def lost_reason(self) -> str | None:
        for lease in self._leases:
            if lease.lost:
                return f"{lease.name!r}: {lease.lost_reason}"
        return None

    @property
    def released(self) -> bool:
        return self._released

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(multi_lease)`` once, when the first of its leases is lost."""
        if not callable(callback):
            raise TypeError(f"on_lost() takes a callable, got {type(callback).__name__}")
        fired = False

        def once(_: Lease) -> object:
            nonlocal fired
            if fired:
                return None
            fired = True
            return callback(self)  # type: ignore[arg-type]

        for lease in self._leases:
            lease.on_lost(once)

    async def release(self) -> None:
        """Release every lock (all attempted even if one fails; the first error is raised).

        Every release is on the wire before the first await, so a cancelled
        call still releases them all.
        """
        if self._released:
            return
        self._released = True
        if self._forget is not None:
            self._forget(self)
        await _release_all(self._leases, raise_first=True)

    async def extend(self, seconds: float) -> None:
        check_seconds(seconds, "extend seconds", allow_zero=False)
        await asyncio.gather(*(lease.extend(seconds) for lease in self._leases))

    def _watch(self, context: Entry) -> None:
        for lease in self._leases:
            lease._watch(context)

    def _unwatch(self, context: Entry) -> None:
        for lease in self._leases:
            lease._unwatch(context)

    def __repr__(self) -> str:
        state = "released" if self._released else ("lost" if self.lost else "held")
        return f"<MultiLease {self.name!r} tokens={self.fencing_tokens} {state}>"


class MultiLock(Acquirable[MultiLease]):
    """All or nothing over several locks, possibly on different Clients, servers or cluster nodes.

    * **Parts and order:** the locks are split into parts, each taken by one
      call: all the locks of one standalone Client form one part (one script
      takes them all at once); in a Cluster, a script may only declare keys
      of one slot, so the locks of one Client whose names share a slot form
      one part (names of their own, the usual case, are a part each, taken
      by their lock's own acquire on their slot's master). Parts are always
      taken one after the other in one global order that every Client
      agrees on and that no failover or resharding changes: standalone
      locks first, by key then Client id (as before Cluster support); then
      cluster locks by slot, key and Client id.
    * **All or nothing, deadlock-free:** the first part is waited for; a
      later part is only tried (a single lock: once, without waiting). If it
      is busy, or its node cannot be reached (a failover under way), the
      parts taken are released at once, the task waits until the part that
      was in the way is free (or its node is back), and it starts again from
      the first part, within the caller's deadline. A task therefore never
      waits for a lock while it holds one (no hold-and-wait: no deadlock,
      whatever the order of the names given, also with plain locks taken
      elsewhere in any order), and holds nothing while it waits (a waiting
      multi-lock does not block single-lock users of its other names). A
      later part of several locks of one slot or server (one script) is the
      exception: it is waited for while the earlier parts are held, which
      is deadlock-free since every multi-lock waits in the same global order.
    * **Liveness:** because parts are taken in one global order, of two
      multi-locks over overlapping names the one that takes the first name
      they share never backs off because of the other (the other holds none
      of the shared names before it); so two multi-locks never livelock one
      another. A multi-lock can be starved by a stream of single-lock users
      of a later name (each of its tries finds the name busy); Redisson's
      RedissonMultiLock has the same trade-off (it gives back what it took
      when a lock's wait time runs out and retries, in the caller's order,
      so two of them can livelock where these cannot). Holding while
      waiting instead would starve the single-lock users.
    * **Cancellation and failures:** cancelled at any await, or failing
      with an error, an acquire releases the parts it took (each release is
      on the wire before the first await) and the part in flight undoes
      itself as a lock's acquire does (a reply lost to a cancellation or a
      timeout is undone when it arrives): the caller gets all the locks or
      none. Each part is an ordinary hold of its lock: renewed by the
      watchdog like any other, released on its own node, lost on its own.
    * **Reentrant** per task, like each of its locks; **who may release**:
      the acquiring task with ``release()``, or anyone with the MultiLease.
    * **Lease expiry and cancellation:** as for :class:`AsyncLock`, lock by
      lock; the MultiLease is lost when any of its leases is.
    """

    __slots__ = ("_engine", "_entry_map", "_groups", "_held", "_locks", "_reorder", "name")

    def __init__(self, engine: EngineView, *locks: AsyncLock) -> None:
        if not locks:
            raise InvalidArgumentError("multi_lock() needs at least one lock")
        seen: set[tuple[str, str]] = set()
        for lock in locks:
            if not isinstance(lock, AsyncLock):
                raise InvalidArgumentTypeError(
                    f"multi_lock() takes locks made by client.lock() or client.spin_lock(), "
                    f"got {type(lock).__name__}"
                )
            ident = (lock._engine.id, lock._key)
            if ident in seen:
                raise InvalidArgumentError(f"lock {lock.name!r} is given twice to multi_lock()")
            seen.add(ident)
        self._engine = engine
        self._locks = sorted(locks, key=lambda lock: (lock._key, lock._engine.id))
        self.name = "+".join(lock.name for lock in self._locks)
        self._entry_map: dict[asyncio.Task[Any], list[Entry]] = {}
        self._held: dict[asyncio.Task[Any], list[MultiLease]] = {}
        self._groups: list[list[AsyncLock]] | None = None
        # Where each taken lease goes in ``locks`` order (None: the same order).
        self._reorder: list[int] | None = None

    kind = "multi_lock"

    def _observer(self) -> Observer:
        return self._engine.observer

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self._engine.loop

    def statistics(self) -> LockStatistics:
        """This Client's view of the multi-lock, from its locks' (each in ``parts``,
        in ``locks`` order; no round trip, safe from any thread).

        Held (``locked``) when one task of this process holds every lock; then
        ``task``, ``owner`` and ``holders`` name it, ``hold_count`` is how many
        times it holds them all, ``fencing_token`` the highest of their tokens
        (as ``MultiLease.fencing_token``) and ``lease_left`` the first lease to
        run out. ``waiting`` sums the tasks waiting for any of its locks (a
        task waiting for the multi-lock waits for one of them at a time).
        Locks held by other tasks, or by other Clients, show in ``parts`` only.
        """
        parts = tuple(lock.statistics() for lock in self._locks)
        waiting = sum(part.waiting for part in parts)
        tasks = {part.task for part in parts}
        first = parts[0]
        if not all(part.locked and len(part.holders) == 1 for part in parts) or len(tasks) != 1:
            return LockStatistics(
                self.kind, self.name, False, None, None, (), 0, None, None, waiting, parts
            )
        lefts = [part.lease_left for part in parts if part.lease_left is not None]
        return LockStatistics(
            self.kind,
            self.name,
            True,
            first.task,
            first.owner,
            first.holders,
            min(part.hold_count for part in parts),
            max(part.fencing_token or 0 for part in parts),
            min(lefts) if lefts else None,
            waiting,
            parts,
        )

    def _entries(self) -> dict[asyncio.Task[Any], list[Entry]]:
        return self._entry_map

    @property
    def locks(self) -> list[AsyncLock]:
        return list(self._locks)

    async def release(self) -> None:
        """Release the current task's most recent acquisition of this multi-lock."""
        task = current_task()
        stack = self._held.get(task)
        if not stack:
            raise LockNotOwnedError(
                f"multi-lock {self.name!r} is not held by the current task; "
                "release it from the task that acquired it, or call lease.release()"
            )
        await stack[-1].release()

    def _forget(self, multi: MultiLease) -> None:
        for task, stack in list(self._held.items()):
            if multi in stack:
                stack.remove(multi)
                if not stack:
                    del self._held[task]

    async def is_locked(self) -> bool:
        """True if any of the locks is held by anyone."""
        results = await asyncio.gather(*(lock.is_locked() for lock in self._locks))
        return any(results)

    async def is_owned(self) -> bool:
        """True if the current task holds every one of the locks."""
        for lock in self._locks:  # in this task: ownership is per task
            if not await lock.is_owned():
                return False
        return True

    async def hold_count(self) -> int:
        stack = self._held.get(current_task())
        return len(stack) if stack else 0

    async def remaining_ttl(self) -> float | None:
        """The shortest remaining TTL among the held locks; None if none is held."""
        ttls = [t for t in await asyncio.gather(*(lock.remaining_ttl() for lock in self._locks))]
        held = [t for t in ttls if t is not None]
        return min(held) if held else None

    async def force_release(self) -> bool:
        results = await asyncio.gather(*(lock.force_release() for lock in self._locks))
        return any(results)

    # -- acquisition ------------------------------------------------------------------------

    async def _parts(self) -> list[list[AsyncLock]]:
        """The parts, in the global order (see the class docstring); known once
        every Client's mode is (a Client finds out on its first command)."""
        if self._groups is not None:
            return self._groups
        modes: dict[str, bool] = {}
        for lock in self._locks:
            engine = lock._engine
            if engine.id not in modes:
                modes[engine.id] = await engine.is_cluster()

        def slot(lock: AsyncLock) -> int:
            return slot_of(lock._key) if modes[lock._engine.id] else -1

        groups: list[list[AsyncLock]] = []
        for lock in sorted(self._locks, key=lambda x: (slot(x), x._key, x._engine.id)):
            if (
                groups
                and groups[-1][0]._engine is lock._engine
                and slot(groups[-1][0]) == slot(lock)
            ):
                groups[-1].append(lock)
            else:
                groups.append([lock])
        taken = [lock for group in groups for lock in group]
        if taken != self._locks:
            position = {id(lock): i for i, lock in enumerate(self._locks)}
            self._reorder = [position[id(lock)] for lock in taken]
        self._groups = groups
        return groups

    async def _acquire(self, timeout: float | None, lease: float | None) -> MultiLease:
        for lock in self._locks:
            lock._engine.enter()
        loop = asyncio.get_running_loop()
        task = current_task()
        deadline = None if timeout is None else loop.time() + timeout
        groups = self._groups if self._groups is not None else await self._parts()
        while True:
            taken: list[Lease] = []
            blocker: AsyncLock | None = None
            try:
                for group in groups:
                    remaining = _remaining(deadline, loop)
                    if len(group) > 1 and not any(isinstance(x, SpinLock) for x in group):
                        taken.extend(await self._acquire_group(group, task, lease, remaining))
                        continue
                    for lock in group:
                        wait = remaining if not taken else 0.0
                        try:
                            taken.append(await lock._acquire(wait, lease))
                        except (LockTimeoutError, ConnectionFailedError):
                            # Busy, or its node unreachable (a failover): not
                            # waited for while holding the others (see above).
                            if not taken:
                                raise
                            blocker = lock
                            break
                    if blocker is not None:
                        break
            except BaseException:
                await _release_all(taken)
                raise
            if blocker is None:
                if self._reorder is not None:  # the leases in the order of ``locks``
                    ordered = taken[:]
                    for lease_of, at in zip(taken, self._reorder, strict=True):
                        ordered[at] = lease_of
                    taken = ordered
                multi = MultiLease(taken, self._forget)
                self._held.setdefault(task, []).append(multi)
                return multi
            # All or nothing: give back what we took, wait for the lock that
            # was in the way, and start again in the fixed order.
            await _release_all(taken)
            waited = await blocker._acquire(_remaining(deadline, loop), lease)
            await waited.release()

    async def _acquire_group(
        self,
        group: list[AsyncLock],
        task: asyncio.Task[Any],
        lease: float | None,
        timeout: float | None,
    ) -> list[Lease]:
        """Several locks of one Client (of one slot, in a cluster): local turns
        in order, then one script. The leases come in the group's order."""
        engine = group[0]._engine
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        states: list[LocalQueue] = []
        held: list[Lease] = []
        at: dict[int, Lease] = {}  # position in the group -> lease, for those held already
        try:
            fresh: list[AsyncLock] = []
            for i, lock in enumerate(group):
                state: LocalQueue | None = engine.peek_state(lock._key)
                if state is None:
                    state = engine.state(lock._key, new_queue, lock)
                elif (
                    state.hold is not None
                    and state.hold.task is task
                    and state.hold.releasing is None  # (else: queue up, as AsyncLock)
                ):
                    held.append(state.hold.new_lease())  # re-entry: no round trip
                    at[i] = held[-1]
                    continue
                if state.busy:
                    handed = await state.turn(deadline, task, lease)
                    if handed is not None:
                        held.append(handed.new_lease())  # handed over to us: held
                        at[i] = held[-1]
                        continue
                else:
                    state.busy = True
                states.append(state)
                fresh.append(lock)
            if not fresh:
                return held
            holds = await _compete_group(engine, fresh, states, task, lease, deadline)
        except BaseException:
            for state in states:
                state.pass_turn()
            await _release_all(held)
            raise
        new = iter(holds)
        return [at[i] if i in at else next(new).new_lease() for i in range(len(group))]


async def _compete_group(
    engine: EngineView,
    locks: list[AsyncLock],
    states: list[LocalQueue],
    task: asyncio.Task[Any],
    lease: float | None,
    deadline: float | None,
) -> list[Hold]:
    owner = engine.owner(task)
    lease_s = engine.lease if lease is None else lease
    keys = tuple(k for lock in locks for k in lock._names.multi)
    attempt_id = engine.attempt_id()
    channels = tuple(x for lock in locks for x in (lock._channel, lock._names.wait_prefix))
    args = (owner, to_ms(lease_s), engine.retention_ms, attempt_id)
    blocker = [locks[0]]
    # Unknown whether it ran: release the hold this attempt may have taken of each lock.
    undo = engine.undo(
        tuple(
            (
                "release",
                lock._names.free,
                (
                    owner,
                    "",
                    lock._channel,
                    lock._names.wait_prefix,
                    engine.retention_ms,
                    attempt_id,
                ),
            )
            for lock in locks
        ),
        _undo_granted,
    )

    loop = asyncio.get_running_loop()

    async def attempt() -> tuple[list[int] | None, float | None]:
        # A try that will not wait flags no busy lock as waited for ("0").
        will_wait = "1" if deadline is None or deadline > loop.time() else "0"
        reply = await engine.eval("multi_acquire", keys, (*args, will_wait, *channels), undo)
        if reply[0] == 1:
            return [int(token) for token in reply[1:]], None
        blocker[0] = locks[int(reply[1]) - 1]
        ttl = int(reply[2])
        return None, ttl_hint(ttl)

    tokens, sent = await compete(
        engine,
        what=f"locks {'+'.join(lock.name for lock in locks)!r}",
        deadline=deadline,
        attempt=attempt,
        waiter=lambda: blocker[0]._waiter(),
        abandon=undo.abandon,
        parked=states[0].set_competing,
    )
    return [
        lock._install(state, task, owner, token, lease, lease_s, sent, -1)
        for lock, state, token in zip(locks, states, tokens, strict=True)
    ]


def _undo_granted(reply: Any, calls: tuple[Call, ...]) -> tuple[Call, ...]:
    """The undo of a multi_acquire whose reply came after its caller gave up:
    release every lock it took, by its token (see ``Engine.undo``)."""
    if reply and int(reply[0]) == 1:
        return tuple(
            (name, keys, (owner, int(token), channel, wait_prefix, retention, ""))
            for (name, keys, (owner, _, channel, wait_prefix, retention, _)), token in zip(
                calls, reply[1:], strict=True
            )
        )
    return ()


def _remaining(deadline: float | None, loop: asyncio.AbstractEventLoop) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - loop.time())


async def _release_all(leases: list[Lease], *, raise_first: bool = False) -> None:
    """Start every release at once (cancellation-proof), then wait for them all."""
    started: list[tuple[Lease, asyncio.Future[int]]] = []
    errors: list[BaseException] = []
    for lease in leases:
        try:
            outcome = lease._begin_release()
        except LockNotOwnedError as exc:
            errors.append(exc)
            continue
        if outcome is not None:
            started.append((lease, outcome))
    for lease, outcome in started:
        try:
            lease._check_outcome(await asyncio.shield(outcome))
        except LockNotOwnedError as exc:
            errors.append(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors.append(exc)
    if raise_first and errors:
        raise errors[0]
