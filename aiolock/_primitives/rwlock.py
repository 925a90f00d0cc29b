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

The local state per name is in ``rwlock_state.py``, the acquire paths
(``ReadWriteCore``, which ``ReadWriteLock`` extends) in ``rwlock_core.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._core.errors import LockNotOwnedError
from .._core.holds.lease import Hold, Lease
from .._core.observe.observer import Observer
from .base import Acquirable, Entry
from .rwlock_core import ReadWriteCore
from .stats import describe_holders

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["ReadLock", "ReadWriteLock", "WriteLock"]


class ReadWriteLock(ReadWriteCore):
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
    * **max_hold / handing over:** ``max_hold=`` on both sides (max_hold.py);
      a write hold can be handed to another Client (``lease.handle``,
      ``client.adopt``: adopt.py), a read hold cannot (one of many shared
      ones: InvalidArgumentError), and a writer's own read hold stays with it.

    Do not use one name for a read-write lock and another kind of lock: the
    scripts refuse a name held by another kind with a WrongTypeError.
    """

    __slots__ = ("read", "write")

    def __init__(self, engine: EngineView, name: str) -> None:
        super().__init__(engine, name)
        #: The shared side: many holders at once.
        self.read = ReadLock(self)
        #: The exclusive side.
        self.write = WriteLock(self)

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
