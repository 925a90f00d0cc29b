"""The one local wait queue (aiolock/_core/waiting/parking.py), on its own: no server.

Order, timeouts, a wake-up passed on by a waiter cancelled after it was
woken, and compaction that keeps removal O(1) amortised (asserted on sizes
and counts, never on timings).
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any

import pytest

from aiolock import ClientClosedError
from aiolock._core.waiting.parking import Parked, ParkingLot
from aiolock._primitives.lock_queue import _Turn


async def wait(lot: ParkingLot[Parked], deadline: float | None = None) -> Any:
    """A waiter as every owner writes it: park, await, pass on, count out."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    timer = lot.park(Parked(fut), deadline)
    try:
        return await fut
    except asyncio.CancelledError:
        handed = ParkingLot.handed(fut)
        if handed is not None:
            lot.unpark(handed)  # we were woken but will not run: pass it on
        raise
    finally:
        lot.unparked(timer)


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_unpark_wakes_in_fifo_order() -> None:
    lot: ParkingLot[Parked] = ParkingLot()
    woken: list[int] = []

    async def one(i: int) -> None:
        await wait(lot)
        woken.append(i)

    tasks = [asyncio.create_task(one(i)) for i in range(5)]
    await settle()
    assert len(lot) == 5
    for expected in range(5):
        assert lot.unpark() is not None
        await settle()
        assert woken == list(range(expected + 1))
    assert lot.unpark() is None, "nobody left to wake"
    await asyncio.gather(*tasks)
    assert len(lot) == 0


async def test_unpark_passes_its_value_and_unpark_all_wakes_everyone() -> None:
    lot: ParkingLot[Parked] = ParkingLot()
    tasks = [asyncio.create_task(wait(lot)) for _ in range(4)]
    await settle()
    lot.unpark("first")
    assert lot.unpark_all("rest") == 3
    assert await asyncio.gather(*tasks) == ["first", "rest", "rest", "rest"]
    assert lot.unpark_all() == 0
    assert len(lot) == 0 and lot.size == 0


async def test_a_woken_waiter_counts_until_it_runs() -> None:
    lot: ParkingLot[Parked] = ParkingLot()
    task = asyncio.create_task(wait(lot))
    await settle()
    lot.unpark()
    assert len(lot) == 1, "woken, but its task has not run yet"
    assert list(lot) == [], "... and it is no longer parked"
    await task
    assert len(lot) == 0


async def test_timeout_resolves_false_and_the_timer_is_cancelled_on_wake() -> None:
    loop = asyncio.get_running_loop()
    lot: ParkingLot[Parked] = ParkingLot()
    assert await wait(lot, loop.time() + 0.01) is False
    assert len(lot) == 0

    fut: asyncio.Future[Any] = loop.create_future()
    timer = lot.park(Parked(fut), loop.time() + 3600)
    assert timer is not None
    lot.unpark(True)
    lot.unparked(timer)
    assert timer.cancelled()
    assert fut.result() is True


async def test_a_timed_out_waiter_is_skipped_by_unpark() -> None:
    loop = asyncio.get_running_loop()
    lot: ParkingLot[Parked] = ParkingLot()
    early = asyncio.create_task(wait(lot, loop.time() + 0.01))
    later = asyncio.create_task(wait(lot))
    assert await early is False
    lot.unpark("yours")
    assert await later == "yours"


async def test_a_cancelled_waiter_passes_its_wake_up_on() -> None:
    lot: ParkingLot[Parked] = ParkingLot()
    first = asyncio.create_task(wait(lot))
    second = asyncio.create_task(wait(lot))
    await settle()
    lot.unpark("turn")  # reaches `first` ...
    first.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 5) == "turn", "the wake-up was not lost"
    assert len(lot) == 0


async def test_a_waiter_cancelled_while_parked_hands_nothing_on() -> None:
    lot: ParkingLot[Parked] = ParkingLot()
    first = asyncio.create_task(wait(lot))
    second = asyncio.create_task(wait(lot))
    await settle()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await settle()
    assert not second.done()
    assert len(lot) == 1
    assert lot.unpark() is not None
    assert await second is True


async def test_handed_tells_what_reached_a_cancelled_waiter() -> None:
    loop = asyncio.get_running_loop()

    def fut_with(setup: str) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = loop.create_future()
        if setup == "cancelled":
            fut.cancel()
        elif setup == "timed out":
            fut.set_result(False)
        elif setup == "failed":
            fut.set_exception(ClientClosedError("closed"))
            with suppress(ClientClosedError):
                fut.result()
        elif setup == "woken":
            fut.set_result(True)
        elif setup == "handed":
            fut.set_result("a hold")
        return fut

    assert ParkingLot.handed(fut_with("pending")) is None
    assert ParkingLot.handed(fut_with("cancelled")) is None
    assert ParkingLot.handed(fut_with("timed out")) is None
    assert ParkingLot.handed(fut_with("failed")) is None
    assert ParkingLot.handed(fut_with("woken")) is True
    assert ParkingLot.handed(fut_with("handed")) == "a hold"


async def test_first_and_hand_take_a_chosen_waiter_out() -> None:
    loop = asyncio.get_running_loop()
    lot: ParkingLot[Parked] = ParkingLot()
    entries = [Parked(loop.create_future()) for _ in range(3)]
    for entry in entries:
        lot.park(entry)
    entries[0].fut.cancel()  # left: dead at the head
    head = lot.first()
    assert head is entries[1]
    assert lot.size == 2, "first() dropped the dead head"
    assert lot.hand(head, "hold") is True
    assert head.fut.result() == "hold"
    assert lot.first() is entries[2] and lot.size == 1
    entries[2].fut.cancel()
    assert lot.hand(entries[2], "hold") is False, "nothing is handed to a waiter that left"


async def test_wake_targets_one_waiter_and_leaves_its_entry_to_lazy_removal() -> None:
    loop = asyncio.get_running_loop()
    lot: ParkingLot[Parked] = ParkingLot()
    entries = [Parked(loop.create_future()) for _ in range(3)]
    for entry in entries:
        lot.park(entry)
    assert lot.wake(entries[1], "you") is True
    assert lot.wake(entries[1], "again") is False
    assert lot.size == 3
    assert lot.unpark("a") is entries[0]
    assert lot.unpark("c") is entries[2], "the woken middle entry was skipped"
    assert [entry.fut.result() for entry in entries] == ["a", "you", "c"]
    assert lot.size == 0


async def test_close_fails_every_parked_waiter_with_its_own_error() -> None:
    lot: ParkingLot[Parked] = ParkingLot()
    tasks = [asyncio.create_task(wait(lot)) for _ in range(3)]
    await settle()
    lot.close()
    errors = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(error, ClientClosedError) for error in errors)
    assert len({id(error) for error in errors}) == 3
    assert len(lot) == 0


async def test_compaction_bounds_dead_entries_and_keeps_removal_amortised_o1() -> None:
    """2,000 waiters leave one by one (the last stays): the lot never holds
    more than about twice the live entries, and all compactions together
    scan a small multiple of the waiters (amortised O(1) per departure)."""
    n = 2_000  # many times SLACK: compactions happen all the way down
    lot: ParkingLot[Parked] = ParkingLot()
    tasks = [asyncio.create_task(wait(lot)) for _ in range(n)]
    await settle()
    assert len(lot) == n and lot.size == n
    scanned = 0
    for task in tasks[:-1]:
        before = lot.size
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
        if lot.size < before:
            scanned += before  # a compaction looked at every entry once
        assert lot.size <= 2 * len(lot) + ParkingLot.SLACK + 1
    assert len(lot) == 1
    assert lot.size <= ParkingLot.SLACK + 3
    assert scanned <= 3 * n, f"compactions scanned {scanned} entries for {n} departures"
    lot.unpark("last")
    assert await tasks[-1] == "last"


async def test_cancelling_all_at_once_leaves_a_small_lot() -> None:
    lot: ParkingLot[Parked] = ParkingLot()
    tasks = [asyncio.create_task(wait(lot)) for _ in range(1_000)]
    await settle()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(lot) == 0
    assert lot.size <= ParkingLot.SLACK
    late = asyncio.create_task(wait(lot))
    await settle()
    assert lot.unpark("late") is not None
    assert await late == "late"


def test_entries_carry_no_dict() -> None:
    """A parked waiter costs its future plus a few slots, never a __dict__."""
    loop = asyncio.new_event_loop()
    try:
        fut: asyncio.Future[Any] = loop.create_future()
        assert not hasattr(Parked(fut), "__dict__")
        assert not hasattr(_Turn(fut, None, None), "__dict__")  # type: ignore[arg-type]
        assert not hasattr(ParkingLot(), "__dict__")
    finally:
        loop.close()
