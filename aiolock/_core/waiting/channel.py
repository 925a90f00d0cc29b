"""A waited-on channel: a reference-counted subscription and its wake-up policy.

Channels
--------
A waiting primitive (lock, fair lock, semaphore, latch, ...) registers
interest in its channel, tries, and if that failed it parks on the channel
until a message (or the holder's TTL) says "try again". The parked tasks of a
`Channel` are kept in a `ParkingLot` (see ``_core/waiting/parking.py``), the one wait
queue every local wait uses; the channel adds only its wake-up policy.

A `Channel` is reference counted: the listener subscribes when the first
waiter registers and unsubscribes after the last one leaves. One dedicated
connection carries every channel of the Client, whatever the number of waiting
tasks. A waiter must `await channel.confirmed(...)` before its retry attempt,
so a release that happens between "try" and "subscribe" is never missed.

Wake-ups are permits, not edges: a message that arrives while no waiter is
parked (it is busy retrying) is kept, and the next `wait()` returns at once.
A message "1" wakes one waiter, "*" wakes all, a number n wakes n, "b <ms>" wakes
all (a new hold that may expire within <ms>, before the bound they park on:
they try again and learn its TTL; see wake_bounds in scripts/_wake.lua). A woken waiter that is
cancelled before it ran passes its wake-up on. Lost messages cost at most one
wait bound (the holder's TTL), never a hang: every `wait()` has a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from ..errors import ClientClosedError
from .parking import Parked, ParkingLot

__all__ = ["WAKE_ALL", "WAKE_BOUND", "WAKE_ONE", "Channel", "Subscriber"]

WAKE_ONE = b"1"
WAKE_ALL = b"*"
#: "b <ms>": a new hold may expire before the bound the waiters park on.
WAKE_BOUND = b"b "


class Channel:
    """A reference-counted subscription and the local tasks parked on it."""

    __slots__ = (
        "_confirmed",
        "_lot",
        "_permits",
        "closed",
        "grant_sink",
        "handler",
        "name",
        "refs",
        "resync",
    )

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.refs = 0
        self._confirmed: asyncio.Event | None = None
        # Parked waiters, FIFO (O(1) per waiter that gives up, even with
        # 100,000 parked at once: see _core/waiting/parking.py).
        self._lot: ParkingLot[Parked] = ParkingLot()
        self._permits = 0
        self.closed = False
        self.resync = False
        # If set, messages go to it instead of waking parked waiters (see above).
        self.handler: Callable[[bytes], None] | None = None
        # If set, a grant message ("g ...", see scripts/_wake.lua) is given to
        # it before it wakes a waiter as "1" does.
        self.grant_sink: Callable[[bytes], None] | None = None

    # -- subscription state (driven by the Listener) ---------------------------

    def _confirm_event(self) -> asyncio.Event:
        if self._confirmed is None:
            self._confirmed = asyncio.Event()
        return self._confirmed

    @property
    def is_confirmed(self) -> bool:
        return self._confirmed is not None and self._confirmed.is_set()

    def set_confirmed(self, value: bool) -> None:
        event = self._confirm_event()
        if value:
            event.set()
        else:
            event.clear()

    async def confirmed(self, timeout: float | None) -> bool:
        """Wait until the server confirmed the subscription (at most ``timeout`` s).

        Returns False on timeout: the caller goes on with TTL-bounded retries.
        """
        event = self._confirm_event()
        if event.is_set():
            return True
        if self.closed:
            raise ClientClosedError("the aiolock Client was closed while waiting")
        if timeout is not None and timeout <= 0:
            return False
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        if self.closed:
            raise ClientClosedError("the aiolock Client was closed while waiting")
        return True

    # -- parking ------------------------------------------------------------------

    @property
    def parked(self) -> int:
        return len(self._lot)

    async def wait(self, timeout: float | None) -> bool:
        """Park until woken (True) or until ``timeout`` seconds passed (False).

        Raises ClientClosedError if the Client is closed meanwhile.
        """
        if self._permits:
            self._permits -= 1
            return True
        if self.closed:
            raise ClientClosedError("the aiolock Client was closed while waiting")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        lot = self._lot
        timer = lot.park(Parked(fut), None if timeout is None else loop.time() + max(timeout, 0.0))
        try:
            woken = await fut
        except asyncio.CancelledError:
            if ParkingLot.handed(fut):
                self.wake_one()  # we were woken but will not run: pass it on
            raise
        finally:
            lot.unparked(timer)
        return woken

    def wake_one(self) -> None:
        if self._lot.unpark(True) is not None:
            return
        # Nobody parked right now: keep a permit for the next wait(), but never
        # more than there are registered waiters.
        if self._permits < self.refs:
            self._permits += 1

    def wake(self, message: bytes) -> None:
        """Dispatch a release message: "1" wakes one, "*" and "b <ms>" wake all, "<n>" wakes n,
        "g ..." (a lock granted to this Client) goes to ``grant_sink`` and wakes one."""
        if message[:2] == b"g " and self.grant_sink is not None:
            self.grant_sink(message)
            self.wake_one()
        elif self.handler is not None:
            self.handler(message)
        elif message == WAKE_ONE:
            self.wake_one()
        elif message == WAKE_ALL or message[:2] == WAKE_BOUND:
            self.wake_all()
        elif message.isdigit():
            for _ in range(min(int(message), max(self.refs, 1))):
                self.wake_one()
        else:
            self.wake_one()

    def wake_all(self) -> None:
        if self.handler is not None:
            self.handler(WAKE_ALL)
            return
        self._lot.unpark_all(True)
        self._permits = self.refs

    def close(self) -> None:
        """Fail every parked waiter with ClientClosedError."""
        self.closed = True
        self._lot.close()
        if self._confirmed is not None:
            self._confirmed.set()


class Subscriber(Protocol):
    """What a waiter needs of a listener: a ``Listener`` or, in cluster mode,
    a ``ShardedListener`` (topology/sharded.py)."""

    def register(self, name: bytes) -> Channel: ...

    def unregister(self, channel: Channel, *, linger: bool = False) -> None: ...
