"""Cohort locking: the lock passes among one Client's tasks with few round
trips, tokens still increase, and other Clients are not starved."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolock import Client, LockLostError
from aiolock._primitives.lock_queue import COHORT_BOUND
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually
from tests.servers import RedisServer

#: Renewed every 1.5 s: a hold survives 3 s of scheduling stall on a loaded machine.
LEASE = 4.5


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "co", "lease": LEASE}


async def test_local_handoffs_save_round_trips(client: Client, server: RedisServer) -> None:
    lock = client.lock("c")
    tokens: list[int] = []
    inside = 0

    async def worker() -> None:
        nonlocal inside
        for _ in range(5):
            async with lock as lease:
                inside += 1
                assert inside == 1
                tokens.append(lease.fencing_token)
                await asyncio.sleep(0)
                inside -= 1

    server.execute("CONFIG", "RESETSTAT")
    await asyncio.gather(*(worker() for _ in range(40)))
    calls = server.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert len(tokens) == 200
    assert tokens == sorted(tokens) and len(set(tokens)) == 200, "tokens strictly increase"
    assert calls <= 200 / COHORT_BOUND * 2 + 5, f"{calls} script calls for 200 acquisitions"
    await assert_clean(client)
    assert server.execute("EXISTS", "co:{c}") == 0


async def test_next_fresh_acquisition_is_above_the_reserved_tokens(
    client: Client, other_client: Client
) -> None:
    lock = client.lock("r")
    first = await lock.acquire()
    waiter = asyncio.create_task(lock.acquire())
    await eventually(lambda: client.statistics().waiting == 1)
    await first.release()
    passed = await waiter  # passed on locally: first.token + 1
    assert passed.fencing_token == first.fencing_token + 1
    await passed.release()
    fresh = await other_client.lock("r").acquire()
    assert fresh.fencing_token > passed.fencing_token
    await fresh.release()
    await assert_clean(client, other_client)


async def test_other_client_is_not_starved(client: Client, other_client: Client) -> None:
    """One Client's 30 tasks hammer a lock; another Client's task still gets in."""
    lock = client.lock("fair-ish")
    stop = asyncio.Event()
    count = 0

    async def hammer() -> None:
        nonlocal count
        while not stop.is_set():
            async with lock:
                count += 1
                await asyncio.sleep(0)

    hammers = [asyncio.create_task(hammer()) for _ in range(30)]
    await eventually(lambda: count > 50, what="the hammer to run")
    # The hammers never stop on their own: only a bounded cohort makes room.
    lease = await other_client.lock("fair-ish").acquire(timeout=30)
    assert all(not h.done() for h in hammers)
    await lease.release()
    stop.set()
    await asyncio.gather(*hammers)
    await assert_clean(client, other_client)


async def test_handed_waiter_cancelled_passes_it_on(client: Client) -> None:
    lock = client.lock("h")
    held = await lock.acquire()
    first = asyncio.create_task(lock.acquire())
    second = asyncio.create_task(lock.acquire())
    await eventually(lambda: client.statistics().waiting == 2)
    await held.release()  # handed to `first` (locally) ...
    first.cancel()  # ... which is cancelled before it runs
    lease = await asyncio.wait_for(second, 10)
    assert first.cancelled()
    assert lease.fencing_token > held.fencing_token
    await lease.release()
    await assert_clean(client)


async def test_locally_passed_hold_is_renewed_and_can_be_lost(
    client: Client, other_client: Client
) -> None:
    lock = client.lock("l")
    held = await lock.acquire()
    got = asyncio.Event()

    async def second() -> None:
        async with lock:
            got.set()
            rounds = seam.watchdog_rounds(client)
            await eventually(lambda: seam.watchdog_rounds(client) >= rounds + 4, timeout=30)
            assert await lock.is_owned(), "renewed past the 4.5 s lease (4 rounds: 6 s)"
            await other_client.lock("l").force_release()
            await asyncio.sleep(30)

    task = asyncio.create_task(second())
    await eventually(lambda: client.statistics().waiting == 1)
    await held.release()
    await got.wait()
    with pytest.raises(LockLostError):
        await task
    await assert_clean(client, other_client)


async def test_local_handoffs_do_not_wake_the_watchdog(client: Client) -> None:
    """A lock passed on in this Client ends one hold and begins the next: the
    watchdog must not be woken for it (issue 20 item 8: a wake-up of the
    watchdog task per acquisition halved contended throughput). It is woken
    only when it idles with nothing to renew, or for a hold due sooner than
    its next round (never here: every hold has the Client's lease)."""
    kick = seam.watchdog(client)._kick  # (the watchdog task may be waiting on it)
    kicks = 0
    set_kick = kick.set

    def counting_set() -> None:
        nonlocal kicks
        kicks += 1
        set_kick()

    kick.set = counting_set  # type: ignore[method-assign]
    lock = client.lock("w")
    acquisitions = 0

    async def worker() -> None:
        nonlocal acquisitions
        for _ in range(5):
            async with lock:
                acquisitions += 1
                await asyncio.sleep(0)

    await asyncio.gather(*(worker() for _ in range(40)))
    assert acquisitions == 200
    # At most one wake-up from idle per round interval (LEASE / 3) of the run.
    assert kicks < 20, f"the watchdog was woken {kicks} times for 200 acquisitions"
    await assert_clean(client)
