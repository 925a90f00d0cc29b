"""The acquire paths of a read-write lock, read and write, locally and in Redis.

``ReadWriteCore`` is the part of ``ReadWriteLock`` (``rwlock.py``) that
acquires: re-entries, the refusal of an upgrade, the local FIFO of writers,
the scripts' calls through ``compete``, the waiting writer's entry, and the
undo of an acquire whose reply was lost. ``ReadWriteLock`` adds the two
views, the queries and the repr.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._core.errors import LockUpgradeError
from .._core.holds.lease import Hold, Lease
from .._core.protocol.keys import RWKeys
from .._core.validate import to_ms
from .._core.waiting.notify import Waiter
from .base import Primitive, current_task
from .compete import compete
from .rwlock_state import RWState, WaitEntry, wait_released

if TYPE_CHECKING:
    from .._core.holds.undo import Call

__all__ = ["ReadWriteCore"]


class ReadWriteCore(Primitive):
    """The acquire paths of :class:`ReadWriteLock` (see its contract there)."""

    __slots__ = ()

    _keys_type = RWKeys
    _names: RWKeys

    # -- local state ------------------------------------------------------------------------

    def _local(self) -> RWState | None:
        state: RWState | None = self._engine.peek_state(self._names.local)
        return state

    def _local_or_new(self) -> RWState:
        return self._engine.state(self._names.local, _new_state, self)

    def _writer_waiter(self) -> Waiter:
        return self._engine.waiter(self._names.wchannel, self._names.wsignal)

    # -- script calls in the background ------------------------------------------------

    def _unwait_call(self, owner: str, nonce: str) -> Call:
        args = (f"{owner}#{nonce}", self._channel, self._names.wchannel)
        return ("rw_unwait", self._names.unwait, args)

    def _write_replied(self, reply: Any, calls: tuple[Call, ...]) -> tuple[Call, ...]:
        """The undo of a write acquire whose reply came after its caller gave up
        (see ``Engine.undo``): release the hold it took, or leave the writers'
        queue it joined."""
        code = int(reply[0]) if reply else 0
        name, keys, (owner, _, channel, wchannel, nonce) = calls[0]
        if code == 1:
            return ((name, keys, (owner, int(reply[1]), channel, wchannel, nonce)),)
        if code == 2:
            return (self._unwait_call(owner, nonce),)
        return ()

    # -- acquire ---------------------------------------------------------------------------

    async def _acquire_read(self, timeout: float | None, lease: float | None) -> Lease:
        engine = self._engine
        loop = engine.enter()
        task = current_task()
        state = self._local()
        if state is not None:
            held = state.reads.get(task)
            if held is not None:
                if held.releasing is None:
                    return held.new_lease()
                await wait_released(held)  # no re-entry into a hold being released
        state = self._local_or_new()
        deadline = None if timeout is None else loop.time() + timeout
        state.pending_reads += 1
        try:
            hold = await self._compete_read(state, task, lease, deadline)
        finally:
            state.pending_reads -= 1
            state.drop_if_idle()
        return hold.new_lease()

    async def _compete_read(
        self,
        state: RWState,
        task: asyncio.Task[Any],
        lease: float | None,
        deadline: float | None,
    ) -> Hold:
        engine = self._engine
        owner = engine.owner(task)
        lease_s = engine.lease if lease is None else lease
        keys = self._names.acquire_read
        nonce = str(engine.attempt_id())
        names = self._names
        args = (
            owner,
            to_ms(lease_s),
            engine.retention_ms,
            engine.id,
            nonce,
            names.channel,
            names.wchannel,
        )
        # Unknown whether it ran: release this call's read hold, if any.
        undo = engine.undo(
            (
                (
                    "rw_release_read",
                    self._names.release_read,
                    (owner, "", self._names.wchannel, nonce),
                ),
            ),
            _read_replied,
        )

        loop = asyncio.get_running_loop()
        tried = (*args[:3], "", *args[4:])  # a try that will not wait: not recorded as parked

        async def attempt() -> tuple[int | None, float | None]:
            will_wait = deadline is None or deadline > loop.time()
            reply = await engine.eval("rw_acquire_read", keys, args if will_wait else tried, undo)
            if int(reply[0]) == 1:
                return int(reply[1]), None
            return None, max(int(reply[1]), 1) / 1000.0

        token, sent = await compete(
            engine,
            what=f"read lock {self.name!r}",
            deadline=deadline,
            attempt=attempt,
            waiter=self._waiter,
            abandon=undo.abandon,
            parked=state.set_reader_parked,
        )
        hold = state.reads[task] = engine.new_hold(
            self.name,
            owner,
            token,
            task,
            lease,
            lease_s,
            sent,
            release=(
                "rw_release_read",
                self._names.release_read,
                (owner, token, self._names.wchannel, nonce),
            ),
            renew=("rw_renew", self._key, ("r", owner, token)),
            on_detach=state.hold_ended,
            kind="read_lock",
        )
        return hold

    async def _acquire_write(self, timeout: float | None, lease: float | None) -> Lease:
        engine = self._engine
        loop = engine.enter()
        task = current_task()
        state = self._local()
        if state is not None:
            held = state.hold
            if held is not None and held.task is task and held.releasing is None:
                return held.new_lease()
            # (A write hold being released is not re-entered: the lock is busy,
            # so this task queues up below and gets a new hold after it.)
            read = state.reads.get(task)
            if read is not None and read.releasing is not None:
                await wait_released(read)
            elif read is not None:
                raise LockUpgradeError(
                    f"read-write lock {self.name!r}: this task holds the read lock and asked "
                    "for the write lock, which would wait for itself for ever; release the "
                    "read lock first (or take the write lock first, then read: a downgrade)"
                )
        state = self._local_or_new()
        deadline = None if timeout is None else loop.time() + timeout
        if state.busy:
            await state.turn(deadline)
        else:
            state.busy = True
        try:
            hold = await self._compete_write(state, task, lease, deadline)
        except BaseException:
            state.pass_turn()
            raise
        return hold.new_lease()

    async def _compete_write(
        self,
        state: RWState,
        task: asyncio.Task[Any],
        lease: float | None,
        deadline: float | None,
    ) -> Hold:
        engine = self._engine
        loop = asyncio.get_running_loop()
        owner = engine.owner(task)
        lease_s = engine.lease if lease is None else lease
        keys = self._names.acquire_write
        lease_ms = to_ms(lease_s)
        nonce = str(engine.attempt_id())
        # Unknown whether it ran: drop this call's write hold and waiting entry, if any.
        undo = engine.undo(
            (
                (
                    "rw_release_write",
                    self._names.release_write,
                    (owner, "", self._channel, self._names.wchannel, nonce),
                ),
            ),
            self._write_replied,
        )
        entry = WaitEntry(engine, self._names.wq, f"{owner}#{nonce}")
        wchannel = self._names.wchannel

        async def attempt() -> tuple[int | None, float | None]:
            sent = loop.time()
            # Register as a waiting writer only if we may wait after this try.
            wait_ms = engine.lease_ms if deadline is None or deadline > sent else 0
            args = (owner, lease_ms, engine.retention_ms, wait_ms, nonce, self._channel, wchannel)
            reply = await engine.eval("rw_acquire_write", keys, args, undo)
            code = int(reply[0])
            if code == 1:
                return int(reply[1]), None
            if code == 2:
                entry.added(sent)
            return None, max(int(reply[1]), 1) / 1000.0

        try:
            token, sent = await compete(
                engine,
                what=f"write lock {self.name!r}",
                deadline=deadline,
                attempt=attempt,
                waiter=self._writer_waiter,
                abandon=undo.abandon,
                parked=state.set_competing,
            )
        except BaseException:
            if entry.registered:
                engine.clean_up(*self._unwait_call(owner, nonce))
            raise
        finally:
            entry.stop()
        hold = state.hold = engine.new_hold(
            self.name,
            owner,
            token,
            task,
            lease,
            lease_s,
            sent,
            release=(
                "rw_release_write",
                self._names.release_write,
                (owner, token, self._channel, self._names.wchannel, nonce),
            ),
            renew=("rw_renew", self._key, ("w", owner, token)),
            on_detach=state.hold_ended,
            kind="write_lock",
        )
        return hold


def _new_state(core: ReadWriteCore) -> RWState:
    """The local state of ``core``'s name (``Engine.state``'s factory)."""
    return RWState(core._engine, core._names.local)


def _read_replied(reply: Any, calls: tuple[Call, ...]) -> tuple[Call, ...]:
    """The undo of a read acquire whose reply came after its caller gave up
    (see ``Engine.undo``): release the hold it took, by its token."""
    if reply and int(reply[0]) == 1:
        name, keys, (owner, _, wchannel, nonce) = calls[0]
        return ((name, keys, (owner, int(reply[1]), wchannel, nonce)),)
    return ()
