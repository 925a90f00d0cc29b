"""ReadWriteLock: many readers or one writer; reentrant; writers are not starved.

One core (:class:`ReadWriteLock`) holds the name, the keys and the protocol;
two thin views, ``rw.read`` and ``rw.write``, give each side the full
AsyncLock API (the shape of aiorwlock's ``.reader`` / ``.writer``).

How it works
------------
Redis keeps every hold of one name in one hash (see
``scripts/_rw_common.lua`` for the layout): the writer with its token and
expiry, and one token and expiry per reader. Each hold expires on its own,
and every script first drops the expired ones, so a crashed reader pins the
lock for no longer than its own lease however busy the other readers are.
The watchdog renews read and write holds alike (``rw_renew``).

Writer preference: a writer that finds readers in the way registers as a
*waiting writer* (``<key>:wq``, an entry the watchdog keeps alive while it
waits, so a crashed waiter blocks nobody for longer than one lease). While
one waits, new readers are refused (re-entries and downgrades are not new
readers), so the readers drain and the writer gets in. A release of the write
lock wakes every parked reader ("*" on the readers' channel) and, if the lock
is then free, one writer; the release of the last read hold wakes one writer
(on the writers' own channel, so a wake-up meant for a writer never lands on
a reader).

Locally, per Client and name, writers queue FIFO and only the head competes
in Redis (like AsyncLock); readers each compete, since many may hold at once.
Re-entries never make a round trip, and neither does the refusal of an
upgrade (a task holding read that asks for write gets LockUpgradeError at
once: waiting would deadlock, as Redisson does in its issue #4796).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._core.errors import LockNotOwnedError, LockTimeoutError, LockUpgradeError
from .._core.holds.lease import Hold, Lease
from .._core.observe.observer import Observer
from .._core.protocol.keys import RWKeys
from .._core.validate import to_ms
from .._core.waiting.notify import Waiter
from .._core.waiting.parking import Parked, ParkingLot
from .base import Acquirable, Entry, Primitive, compete, current_task, describe_holders

if TYPE_CHECKING:
    from .._core.holds.undo import Call
    from .._core.view import EngineView

__all__ = ["ReadLock", "ReadWriteLock", "WriteLock"]


class _RWState:
    """One read-write lock name in one Client: its local holds and waiters.

    ``hold`` is the local write hold and ``writers`` the local FIFO of
    writers (a ParkingLot): only one local writer at a time (the holder, or
    the head of the queue, ``busy``) deals with Redis. ``reads`` maps each task to its read hold;
    readers each compete in Redis. Removes itself from ``client.states``
    when idle.
    """

    __slots__ = (
        "busy",
        "competing",
        "engine",
        "hold",
        "key",
        "parked_reads",
        "pending_reads",
        "reads",
        "writers",
    )

    def __init__(self, engine: EngineView, key: str) -> None:
        self.engine = engine
        self.key = key
        self.hold: Hold | None = None
        self.busy = False
        self.competing = False
        # Waiting writers, FIFO (see _core/waiting/parking.py).
        self.writers: ParkingLot[Parked] = ParkingLot()
        self.reads: dict[asyncio.Task[Any], Hold] = {}
        self.pending_reads = 0  # read acquires under way
        self.parked_reads = 0  # of which parked, waiting for a wake-up

    # -- what the Client asks of a local state -------------------------------------------

    def holds(self) -> list[Hold]:
        held = list(self.reads.values())
        if self.hold is not None:
            held.insert(0, self.hold)
        return held

    def waiting(self) -> int:
        return len(self.writers) + (1 if self.competing else 0) + self.parked_reads

    def close(self) -> None:
        self.writers.close()

    # -- parking hooks for compete() ------------------------------------------------------

    def set_competing(self, value: bool) -> None:
        self.competing = value

    def set_reader_parked(self, value: bool) -> None:
        self.parked_reads += 1 if value else -1

    # -- the local FIFO of writers --------------------------------------------------------

    async def turn(self, deadline: float | None) -> None:
        """Wait, FIFO, until this writer may deal with Redis."""
        loop = asyncio.get_running_loop()
        if deadline is not None and deadline <= loop.time():
            raise LockTimeoutError("the write lock is busy and the timeout allowed no wait")
        fut: asyncio.Future[bool] = loop.create_future()
        writers = self.writers
        timer = writers.park(Parked(fut), deadline)
        try:
            got = await fut
        except asyncio.CancelledError:
            if ParkingLot.handed(fut):
                self.pass_turn()  # our turn came, but we will not take it
            raise
        finally:
            writers.unparked(timer)
        if not got:
            raise LockTimeoutError("timed out waiting for the write lock")

    def pass_turn(self) -> None:
        if self.writers.unpark(True) is not None:
            return
        self.busy = False
        self.drop_if_idle()

    def hold_ended(self, hold: Hold) -> None:
        if self.hold is hold:
            self.hold = None
            self.pass_turn()
            return
        task = hold.task
        if task is not None and self.reads.get(task) is hold:
            del self.reads[task]
        self.drop_if_idle()

    def drop_if_idle(self) -> None:
        if (
            self.hold is None
            and not self.busy
            and not self.writers
            and not self.reads
            and not self.competing
            and self.pending_reads == 0
            and self.parked_reads == 0
        ):
            self.engine.drop_state(self.key, self)


async def _released(hold: Hold) -> None:
    """Wait until the release of ``hold`` under way has finished, however it
    ends. Cancelling the wait does not stop the release."""
    releasing = hold.releasing
    if releasing is not None:
        try:
            await asyncio.shield(releasing)
        except Exception:
            pass  # the release reported its own failure (the hold is lost)


class _WaitEntry:
    """A waiting writer's entry in ``<key>:wq``, kept alive by the watchdog (Renewable)."""

    __slots__ = (
        "engine",
        "expires_at",
        "registered",
        "renew_args",
        "renew_key",
        "renew_script",
        "watched",
    )

    def __init__(self, engine: EngineView, wq_key: str, member: str) -> None:
        self.engine = engine
        self.renew_script = "rw_renew_wait"
        self.renew_key = wq_key
        self.renew_args: tuple[Any, ...] = (member,)
        self.expires_at = 0.0
        self.registered = False  # it may be in Redis: undo it when giving up
        self.watched = False

    def added(self, sent: float) -> None:
        self.registered = True
        self.expires_at = max(self.expires_at, sent + self.engine.lease)
        if not self.watched:
            self.watched = True
            self.engine.renew(self)

    def renewed(self, sent: float, lease: float) -> None:
        self.expires_at = max(self.expires_at, sent + lease)

    def gone(self, reason: str) -> None:
        # Expired or dropped: the next refused attempt registers it again.
        self.stop()

    def stop(self) -> None:
        if self.watched:
            self.watched = False
            self.engine.untrack(self)


class ReadWriteLock(Primitive):
    """A distributed read-write lock: ``rw.read`` (shared) and ``rw.write`` (exclusive).

    Both views have the full :class:`AsyncLock` API (``acquire``,
    ``try_acquire``, ``release``, ``async with``, ``(timeout=, lease=,
    on_lost=)``, ``@decorator``, ``is_locked``, ``is_owned``, ``hold_count``,
    ``remaining_ttl``, ``force_release``).

    * **Many readers or one writer**, across every Client and process.
    * **Who may release:** the task that acquired, with ``rw.read.release()``
      / ``rw.write.release()``; or anyone holding the :class:`Lease`.
    * **Reentrant** per asyncio Task, each side separately, without a round
      trip; a re-entry returns the hold's fencing token.
    * **Downgrade:** the writer may take the read lock; when it then releases
      the write lock it goes on holding read (and other readers may join).
    * **No upgrade:** a task holding the read lock (and not the write lock)
      that asks for the write lock gets :class:`LockUpgradeError` at once,
      before any round trip: it would otherwise wait for itself for ever.
    * **Fairness:** writers are preferred: a writer that finds readers in the
      way registers as waiting, and from then on no new reader is let in
      (re-entries and downgrades still are), so a steady stream of readers
      cannot starve it. A crashed waiting writer stops blocking readers
      after one lease of its Client. Writers of one Client queue FIFO
      locally; otherwise there is no FIFO order. Readers have no such
      guarantee against a steady stream of writers: they compete with the
      next writer at every write release (the readers of all Clients are
      woken, and once one is in, the next writer waits for the readers).
      As with any writer-preferring lock, a task that holds the read lock
      and waits for another task's *fresh* read acquisition can deadlock
      with a waiting writer.
    * **Lease expiry:** every read and write hold is a lease: renewed by the
      watchdog when taken without ``lease=``, fixed otherwise. Each expires
      on its own, so a crashed reader pins the lock no longer than its own
      lease while other readers come and go. A hold that ends without a
      release is *lost*: ``lease.lost``, ``on_lost`` callbacks, and inside
      ``async with`` the body is cancelled and LockLostError raised.
    * **Cancellation:** an acquire cancelled at any await (even after Redis
      granted it, before the reply was read) leaves no hold, no waiting-writer
      entry and no local waiter behind; a cancelled release still completes.
    * **Fencing:** every fresh acquisition, read or write (a downgrade's
      read too), gets a token strictly greater than every token issued
      before for this name.

    Do not use one name for a read-write lock and another kind of lock: the
    scripts refuse a name held by another kind with a WrongTypeError.
    """

    __slots__ = ("read", "write")

    _keys_type = RWKeys
    _names: RWKeys

    def __init__(self, engine: EngineView, name: str) -> None:
        super().__init__(engine, name)
        #: The shared side: many holders at once.
        self.read = ReadLock(self)
        #: The exclusive side.
        self.write = WriteLock(self)

    # -- local state ------------------------------------------------------------------------

    def _local(self) -> _RWState | None:
        state: _RWState | None = self._engine.peek_state(self._names.local)
        return state

    def _local_or_new(self) -> _RWState:
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
                await _released(held)  # no re-entry into a hold being released
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
        state: _RWState,
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
                await _released(read)
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
        state: _RWState,
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
        entry = _WaitEntry(engine, self._names.wq, f"{owner}#{nonce}")
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

    # -- queries shared by the views ------------------------------------------------------

    async def _state(self) -> tuple[int, int, int]:
        engine = self._engine
        engine.enter()
        reply = await engine.eval("rw_state", (self._key,), ())
        return int(reply[0]), int(reply[1]), int(reply[2])

    async def _force(self, what: str) -> bool:
        engine = self._engine
        engine.enter()
        names = self._names
        evicted = int(
            await engine.eval(
                "rw_force_release",
                names.force_release,
                (what, names.channel, names.wchannel, await engine.evictions.template(names.main)),
            )
        )
        state = self._local()
        if state is not None:
            lost: list[Hold] = []
            if what in ("write", "all") and state.hold is not None:
                lost.append(state.hold)
            if what in ("read", "all"):
                lost.extend(state.reads.values())
            for hold in lost:
                hold.mark_lost("force-released")
        return evicted == 1

    async def is_locked(self) -> bool:
        """True if anyone (any client) holds the read or the write lock (one round trip)."""
        writer_ms, readers, _ = await self._state()
        return writer_ms != -2 or readers > 0

    async def force_release(self) -> bool:
        """Evict the writer and every reader, whoever they are; True if any was there.

        Their leases are lost: at once in this Client; in another, its Client
        is told at once through its eviction channel (pub/sub mode,
        connected), else its watchdog finds them gone within its ``lease / 3``.
        Waiting writers stay; fencing tokens keep increasing.
        """
        return await self._force("all")

    def __repr__(self) -> str:
        # Plain attributes and the loop's clock only: valid from any thread.
        loop = self._engine.loop
        if loop is None:
            return f"<ReadWriteLock {self.name!r} not used yet>"
        write, read = self.write.statistics(), self.read.statistics()
        return (
            f"<ReadWriteLock {self.name!r} write: {describe_holders(write)}, "
            f"{write.waiting} waiting; read: {describe_holders(read)}, {read.waiting} waiting>"
        )


class _Side(Acquirable[Lease]):
    """What the two views share: the AsyncLock API over one side of the core."""

    __slots__ = ("_core", "_entry_map", "name")

    _kind = ""  # "r" or "w": the hold kind in the scripts
    _what = ""  # "read" or "write"

    def __init__(self, core: ReadWriteLock) -> None:
        self._core = core
        self.name = core.name
        self._entry_map: dict[asyncio.Task[Any], list[Entry]] = {}

    def _entries(self) -> dict[asyncio.Task[Any], list[Entry]]:
        return self._entry_map

    def _observer(self) -> Observer:
        return self._core._engine.observer

    @property
    def lock(self) -> ReadWriteLock:
        """The read-write lock this is a side of."""
        return self._core

    def _my_hold(self) -> Hold | None:
        raise NotImplementedError

    async def release(self) -> None:
        """Release the current task's most recent acquisition of this side.

        Raises LockNotOwnedError if the current task does not hold it (or its
        lease was lost). If cancelled while the release is on the wire, the
        release still completes.
        """
        self._core._engine.check_usable()
        hold = self._my_hold()
        if hold is None or not hold.leases:
            raise LockNotOwnedError(
                f"the {self._what} lock of {self.name!r} is not held by the current task; "
                "release it from the task that acquired it, or call lease.release()"
            )
        await hold.leases[-1].release()

    async def is_owned(self) -> bool:
        """True if the current task holds this side, confirmed by Redis."""
        engine = self._core._engine
        engine.enter()
        hold = self._my_hold()
        if hold is None:
            return False
        left = int(
            await engine.eval("rw_owned", (self._core._key,), (self._kind, hold.owner, hold.token))
        )
        if left == -2:
            hold.gone("the hold was gone when checked")
            return False
        return True

    async def hold_count(self) -> int:
        """How many times the current task holds this side (0 if not). No round trip."""
        self._core._engine.enter()
        hold = self._my_hold()
        return hold.count if hold is not None else 0

    async def force_release(self) -> bool:
        """Evict every holder of this side, whoever they are; True if there was one.

        The evicted leases are lost: at once in this Client; in another, its
        Client is told at once through its eviction channel (pub/sub mode,
        connected), else its watchdog finds them gone within its ``lease / 3``.
        Fencing tokens keep increasing.
        """
        return await self._core._force(self._what)

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self._core._engine.loop


class ReadLock(_Side):
    """The shared side of a :class:`ReadWriteLock`: ``rw.read``.

    Many tasks of many Clients may hold it at once, unless a writer holds
    the lock or waits for it (writers are not starved). Reentrant per task
    without a round trip. The writer may take it too (a downgrade). See
    :class:`ReadWriteLock` for releasing, leases, cancellation and fencing.
    """

    __slots__ = ()

    _kind = "r"
    kind = "read_lock"
    _what = "read"

    async def _acquire(self, timeout: float | None, lease: float | None) -> Lease:
        return await self._core._acquire_read(timeout, lease)

    def _my_hold(self) -> Hold | None:
        state = self._core._local()
        task = asyncio.current_task()
        if state is None or task is None:
            return None
        return state.reads.get(task)

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        """Every local reader's hold (one per task), and the readers parked."""
        state = self._core._local()
        if state is None:
            return (), 0
        return tuple(state.reads.values()), state.parked_reads

    async def is_locked(self) -> bool:
        """True if anyone (any client) holds the read lock right now (one round trip)."""
        _, readers, _ = await self._core._state()
        return readers > 0

    async def remaining_ttl(self) -> float | None:
        """Seconds until the last read hold expires unless renewed; None if nobody reads."""
        _, readers, readers_ms = await self._core._state()
        if readers == 0 or readers_ms < 0:
            return None
        return readers_ms / 1000.0


class WriteLock(_Side):
    """The exclusive side of a :class:`ReadWriteLock`: ``rw.write``.

    One holder at a time, and no reader meanwhile (except the writer itself,
    which may take the read lock: a downgrade). Reentrant per task without a
    round trip. A task that holds only the read lock gets LockUpgradeError
    at once. Writers of one Client queue FIFO; a writer that finds readers
    stops new readers from entering until it is in. See
    :class:`ReadWriteLock` for releasing, leases, cancellation and fencing.
    """

    __slots__ = ()

    _kind = "w"
    kind = "write_lock"
    _what = "write"

    async def _acquire(self, timeout: float | None, lease: float | None) -> Lease:
        return await self._core._acquire_write(timeout, lease)

    def _my_hold(self) -> Hold | None:
        state = self._core._local()
        if state is None or state.hold is None:
            return None
        return state.hold if state.hold.task is asyncio.current_task() else None

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        """The local write hold, and the writers queued locally or competing."""
        state = self._core._local()
        if state is None:
            return (), 0
        hold = state.hold
        held = (hold,) if hold is not None else ()
        return held, len(state.writers) + (1 if state.competing else 0)

    async def is_locked(self) -> bool:
        """True if anyone (any client) holds the write lock right now (one round trip)."""
        writer_ms, _, _ = await self._core._state()
        return writer_ms != -2

    async def remaining_ttl(self) -> float | None:
        """Seconds until the write hold expires unless renewed; None if nobody writes."""
        writer_ms, _, _ = await self._core._state()
        if writer_ms < 0:
            return None
        return writer_ms / 1000.0


def _new_state(core: ReadWriteLock) -> _RWState:
    """The local state of ``core``'s name (``Engine.state``'s factory)."""
    return _RWState(core._engine, core._names.local)


def _read_replied(reply: Any, calls: tuple[Call, ...]) -> tuple[Call, ...]:
    """The undo of a read acquire whose reply came after its caller gave up
    (see ``Engine.undo``): release the hold it took, by its token."""
    if reply and int(reply[0]) == 1:
        name, keys, (owner, _, wchannel, nonce) = calls[0]
        return ((name, keys, (owner, int(reply[1]), wchannel, nonce)),)
    return ()
