"""Leases: the watchdog renews, a lost lease cancels the body, callbacks run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolock import Client, Lease, LockLostError, LockNotOwnedError
from aiolock._core.holds.watchdog import plan_batches
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually
from tests.servers import RedisServer

#: The shortest watchdog lease in these tests: renewed every 1.5 s, a hold
#: survives 3 s of scheduling stall on a loaded machine.
SHORT = 4.5


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "l", "lease": SHORT}


@pytest.fixture
def other_client_options() -> dict[str, Any]:
    return {"prefix": "l"}


async def test_watchdog_renews_past_the_lease(client: Client) -> None:
    lock = client.lock("renewed")
    async with lock as lease:
        rounds = seam.watchdog_rounds(client)
        await eventually(
            lambda: seam.watchdog_rounds(client) >= rounds + 4, what="4", timeout=30
        )
        # 4 renewals at lease/3 = 6 s > the 4.5 s lease: only renewal kept it alive.
        assert await lock.is_owned()
        assert not lease.lost
    await assert_clean(client)


async def test_watchdog_batches_renewals(client: Client) -> None:
    leases = [await client.lock(f"b{i}").acquire() for i in range(1200)]
    calls, rounds = seam.watchdog_calls(client), seam.watchdog_rounds(client)
    await eventually(lambda: seam.watchdog_rounds(client) >= rounds + 2, what="2 rounds")
    per_round = (seam.watchdog_calls(client) - calls) / (
        seam.watchdog_rounds(client) - rounds
    )
    assert per_round <= 3, f"{per_round} script calls per round for 1200 holds"
    assert not any(lease.lost for lease in leases)
    for lease in leases:
        await lease.release()
    await assert_clean(client)


def test_plan_batches_is_pure() -> None:
    items = list(range(1201))
    batches = plan_batches(items, 500)  # type: ignore[arg-type]
    assert [len(b) for b in batches] == [500, 500, 201]
    assert [x for b in batches for x in b] == items
    assert plan_batches([], 500) == []


async def test_lost_lease_cancels_body_and_raises(client: Client, other_client: Client) -> None:
    lock = client.lock("lost")
    reached_end = False
    lost_seen: list[Lease] = []
    with pytest.raises(LockLostError, match="lost"):
        async with lock as lease:
            lease.on_lost(lost_seen.append)
            await other_client.lock("lost").force_release()
            await asyncio.sleep(30)  # cancelled within one renewal interval
            reached_end = True
    assert not reached_end
    assert lease.lost and lost_seen == [lease]
    # The task is not left cancelled: it goes on normally.
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0)
    await assert_clean(client)


async def test_on_lost_ignore_runs_on(client: Client, other_client: Client) -> None:
    lock = client.lock("ign")
    called = asyncio.Event()
    async with lock(on_lost="ignore") as lease:
        lease.on_lost(lambda _: called.set())
        await other_client.lock("ign").force_release()
        await called.wait()
        assert lease.lost
    # exited without raising
    await assert_clean(client)


async def test_async_callback_runs(client: Client, other_client: Client) -> None:
    done = asyncio.Event()

    async def callback(lease: Lease) -> None:
        await asyncio.sleep(0)
        done.set()

    lease = await client.lock("acb").acquire()
    lease.on_lost(callback)
    await other_client.lock("acb").force_release()
    await asyncio.wait_for(done.wait(), 10)
    with pytest.raises(LockNotOwnedError, match="lost"):
        await lease.release()
    # A callback registered after the loss still runs.
    late = asyncio.Event()
    lease.on_lost(lambda _: late.set())
    await asyncio.wait_for(late.wait(), 10)
    await assert_clean(client)


async def test_fixed_lease_expiry_is_a_loss(client: Client) -> None:
    with pytest.raises(LockLostError, match="fixed lease"):
        async with client.lock("fx")(lease=0.2):
            await asyncio.sleep(30)
    await assert_clean(client)


async def test_body_that_swallows_cancellation_still_gets_lock_lost(
    client: Client, other_client: Client
) -> None:
    with pytest.raises(LockLostError):
        async with client.lock("sw"):
            await other_client.lock("sw").force_release()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass  # a badly behaved body
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0.01)  # no stray cancellation arrives later


async def test_outer_cancellation_wins_over_loss(client: Client, other_client: Client) -> None:
    inside = asyncio.Event()

    async def body() -> None:
        async with client.lock("both"):
            inside.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await inside.wait()
    task.cancel()
    await other_client.lock("both").force_release()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_renewal_failure_loses_lease_within_its_expiry(fresh_server: RedisServer) -> None:
    """The server stops answering: the lease is lost, at the latest when it expires."""
    async with Client.from_url(fresh_server.url, prefix="l", lease=SHORT) as client:
        lock = client.lock("paused")
        loop = asyncio.get_running_loop()
        with pytest.raises(LockLostError, match="could not renew"):
            async with lock:
                with fresh_server.paused():
                    paused_at = loop.time()
                    await asyncio.sleep(30)
        # Lost no later than the lease after the pause (plus scheduling slack).
        assert loop.time() - paused_at < SHORT + 5
