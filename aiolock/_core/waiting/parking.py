"""The one local wait queue: every task that waits in this process parks in a `ParkingLot`.

Why one type
------------
A task of this process waits for one of a few things: its turn in the plain
lock's local FIFO (only the head of a Client's queue deals with Redis), its
turn among the rw lock's local writers, a message on a channel (the
listener's `Channel`, also used in list mode by the `SignalHub`), or the
fair lock's word that its ticket came up. These used to be four structures
with the same tricks written out each time. They are now one: `ParkingLot`
holds the waiters in order, wakes the next one or all of them, times them
out, and drops the ones that left. Each owner keeps only its policy: what a
wake-up means (a turn, a Hold, "try again") and what to do with one nobody
took.

What a waiter costs
-------------------
A parked waiter is one asyncio future, which its task awaits itself (the
plain lock awaits it inline in ``acquire``: no coroutine frame of ours per
waiter), one entry object holding that future, one reference in a deque
and, when it has a timeout, one TimerHandle. The entry is a `Parked`, 40
bytes with its one slot; an owner that must know more about a waiter
subclasses it with ``__slots__`` (the plain lock's `_Turn` adds the task
and its lease: 56 bytes). With 100,000 tasks waiting, the lot adds nothing
else: no dict, no closure, no callback per waiter. Parking is an append and
waking the head a popleft: O(1), with no extra await and no extra loop turn
(the woken task runs on the loop's next turn, as after any ``set_result``).

Why removal is lazy
-------------------
A waiter that leaves (cancelled, timed out, Client closed) is not searched
for and removed: its future is done, so its entry is *dead*, and it stays in
the deque until it reaches the head, where `first`/`unpark` drop it in
passing. Removing it at once would cost O(n) per waiter (a deque has no
O(1) removal from the middle), and cancelling 100,000 waiters would be
quadratic. Dead entries cost memory only, so `unparked` counts the live
ones and, once the dead outnumber them (more than twice the live plus a
small constant), rebuilds the deque with only the live: each rebuild is
paid for by the departures since the last, so removal stays O(1) amortised.

Why a wake-up passes on
-----------------------
In asyncio, waking a task is ``fut.set_result(value)``; the task runs later.
If it is cancelled in between, it will never act on the wake-up, and the
wake-up would be lost: with a lock, every other waiter would hang. trio
does not need this (a task its lot has rescheduled takes what it was given,
and a cancellation waits for its next checkpoint); asyncio does, since
``task.cancel()`` of a task whose future is already done throws
CancelledError into it before it has seen the result. So a cancelled
waiter asks ``handed`` whether a wake-up reached it, and if so its owner
passes it on: a turn goes to the next
waiter (or frees the lock), a Hold handed over is released (which hands it
on in turn), a channel's wake-up wakes the next parked task or becomes a
permit. The lot says *whether* something was handed; the owner decides
what passing it on means, since only the owner knows.

Cancellation
------------
Cancelling a parked task cancels the future it awaits, which makes the
entry dead at once; nothing else is needed while parked. The owner's
``except CancelledError`` checks `handed` (above), and its ``finally`` calls
`unparked` to cancel the timer and count the waiter out. A timeout is a
timer that resolves the future with False: the waiter wakes, sees False,
and raises its own timeout error; a timer that fires after a wake-up finds
the future done and does nothing.

Who uses it
-----------
`AsyncLock`'s `LocalQueue` (turns and cohort handoffs of a Hold), the rw
lock's queue of local writers, the fair lock's tickets (woken one by one by
id, through `wake`), and the listener's `Channel` (and so every pub/sub or
list-mode wait of every primitive).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from ..errors import ClientClosedError
from ..futures import expire
from ..observe.observer import note_waiting

__all__ = ["Parked", "ParkingLot"]


class Parked:
    """One waiter's entry in a `ParkingLot`: the future its task awaits.

    Subclass it (with ``__slots__``) to carry what the lot's owner needs to
    know about a waiter; the future may be replaced between parks (a fair
    lock ticket parks again and again).
    """

    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[Any]) -> None:
        self.fut = fut


E = TypeVar("E", bound=Parked)


class ParkingLot(Generic[E]):
    """Waiters in FIFO order; see the module doc for how and why.

    ``len(lot)`` is the number of waiters parked and not yet running again
    (including one woken whose task has not run yet).
    """

    __slots__ = ("_entries", "_live")

    #: Dead entries tolerated beyond twice the live ones before a compaction.
    SLACK = 32

    def __init__(self) -> None:
        self._entries: deque[E] = deque()
        self._live = 0

    def __len__(self) -> int:
        return self._live

    @property
    def size(self) -> int:
        """Entries held, dead ones included (what compaction bounds)."""
        return len(self._entries)

    def __iter__(self) -> Iterator[E]:
        """The live entries, in order (for inspection; do not park or wake meanwhile)."""
        return (entry for entry in self._entries if not entry.fut.done())

    # -- the waiter's side ----------------------------------------------------------------

    def park(
        self, entry: E, deadline: float | None = None, *, noted: bool = False
    ) -> asyncio.TimerHandle | None:
        """Queue ``entry`` (its future not done); at loop time ``deadline`` its
        future gets False. Returns the timer, for `unparked`. The caller then
        awaits ``entry.fut`` itself (it counts as waiting: see observe/observer.py;
        ``noted``: the caller counted it already)."""
        if not noted:
            note_waiting()
        self._entries.append(entry)
        self._live += 1
        if deadline is None:
            return None
        fut = entry.fut
        return fut.get_loop().call_at(deadline, expire, fut)

    def unparked(self, timer: asyncio.TimerHandle | None) -> None:
        """The waiter runs again, however its wait ended: cancel its timer,
        count it out, and compact if the dead entries outnumber the live."""
        self._live -= 1
        if timer is not None:
            timer.cancel()
        entries = self._entries
        if len(entries) > 2 * self._live + self.SLACK:
            self._entries = deque(entry for entry in entries if not entry.fut.done())

    @staticmethod
    def handed(fut: asyncio.Future[Any]) -> Any:
        """For a waiter cancelled after its park: what a wake-up handed it
        before the cancellation reached it (the owner must pass it on), or
        None if nothing did (cancelled while parked, timed out, failed)."""
        if fut.cancelled() or not fut.done() or fut.exception() is not None:
            return None
        return fut.result() or None

    # -- the waker's side -----------------------------------------------------------------

    def first(self) -> E | None:
        """The next live waiter, left in place (dead entries before it are dropped)."""
        entries = self._entries
        while entries and entries[0].fut.done():
            entries.popleft()
        return entries[0] if entries else None

    def unpark(self, value: Any = True) -> E | None:
        """Wake the next live waiter with ``value``; None if nobody waits."""
        entries = self._entries
        while entries:
            entry = entries.popleft()
            fut = entry.fut
            if not fut.done():
                fut.set_result(value)
                return entry
        return None

    def hand(self, entry: E, value: Any) -> bool:
        """Wake ``entry`` (normally the head, then O(1)) with ``value`` and take
        it out; False if it had left already (nothing is handed)."""
        fut = entry.fut
        if fut.done():
            return False
        entries = self._entries
        if entries and entries[0] is entry:
            entries.popleft()
        else:
            try:
                entries.remove(entry)
            except ValueError:
                pass
        fut.set_result(value)
        return True

    def wake(self, entry: E, value: Any = True) -> bool:
        """Wake ``entry`` wherever it is, leaving its dead entry to be dropped
        lazily; False if it is not parked."""
        fut = entry.fut
        if fut.done():
            return False
        fut.set_result(value)
        return True

    def unpark_all(self, value: Any = True) -> int:
        """Wake every live waiter with ``value``; how many were woken."""
        entries, self._entries = self._entries, deque()
        woken = 0
        for entry in entries:
            fut = entry.fut
            if not fut.done():
                fut.set_result(value)
                woken += 1
        return woken

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """Raise ``error()`` (a new exception for each) in every live waiter."""
        entries, self._entries = self._entries, deque()
        for entry in entries:
            fut = entry.fut
            if not fut.done():
                fut.set_exception(error())

    def close(self) -> None:
        """The Client is closing: every live waiter gets ClientClosedError."""
        self.fail_all(_client_closed)

    def __repr__(self) -> str:
        return f"<ParkingLot {self._live} parked, {len(self._entries)} entries>"


def _client_closed() -> ClientClosedError:
    return ClientClosedError("the aiolock Client was closed while waiting")
