"""A read-write lock's local state in one Client: its holds, its waiters, a waiting writer's entry.

``RWState`` is what ``Engine.state`` keeps per read-write lock name (the
local write hold and FIFO of writers, the read holds, the readers under
way); ``WaitEntry`` is a waiting writer's entry in ``<key>:wq``, kept alive
by the watchdog; ``wait_released`` waits for a release under way.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._core.errors import LockTimeoutError
from .._core.holds.lease import Hold
from .._core.waiting.parking import Parked, ParkingLot

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["RWState", "WaitEntry", "wait_released"]


class RWState:
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


async def wait_released(hold: Hold) -> None:
    """Wait until the release of ``hold`` under way has finished, however it
    ends. Cancelling the wait does not stop the release."""
    releasing = hold.releasing
    if releasing is not None:
        try:
            await asyncio.shield(releasing)
        except Exception:
            pass  # the release reported its own failure (the hold is lost)


class WaitEntry:
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
