"""Latch: count down to zero, every waiter on every Client wakes at once.

Every test runs on both servers and under every notify mode, with two or
three Clients standing for processes.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from aiolock import Client, InvalidArgumentError, InvalidArgumentTypeError, LockTimeoutError
from aiolock._primitives.latch import Latch
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually
from tests.servers import RedisServer


# Long leases: a waiter that is not woken re-checks only every 30 s.
@pytest.fixture
def client_options(notify: str) -> dict[str, Any]:
    return {"prefix": "d", "lease": 30, "notify": notify}


def parked(*clients: Client) -> int:
    return sum(c.statistics().waiting for c in clients)


async def test_zero_wakes_every_waiter_on_every_client(
    client: Client, other_client: Client, third_client: Client
) -> None:
    latch = client.latch("go", 2)
    assert isinstance(latch, Latch)
    assert await latch.try_set_count()
    waiters = [
        asyncio.create_task(c.latch("go", 0).wait())
        for c in (client, other_client, third_client)
        for _ in range(3)
    ]
    await eventually(
        lambda: parked(client, other_client, third_client) == 9, what="9 parked waiters"
    )
    assert await other_client.latch("go", 0).count_down() == 1
    await asyncio.sleep(0.1)
    assert not any(t.done() for t in waiters), "one count down is not zero"
    loop = asyncio.get_running_loop()
    opened = loop.time()
    assert await third_client.latch("go", 0).count_down() == 0
    assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == [True] * 9
    assert loop.time() - opened < 5, "woken by the opening, not by the 30 s re-check"
    assert await latch.count() == 0
    await assert_clean(client, other_client, third_client)


async def test_wait_after_zero_and_on_a_latch_never_set_returns_at_once(
    client: Client, other_client: Client
) -> None:
    assert await client.latch("never", 3).wait() is True
    latch = client.latch("once", 1)
    assert await latch.try_set_count()
    assert await other_client.latch("once", 0).count_down() == 0
    assert await other_client.latch("once", 0).count_down() == 0, "an open latch stays open"
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await latch.wait() is True
    assert await latch.wait(timeout=0) is True
    assert loop.time() - started < 5  # not the 30 s re-check
    await assert_clean(client, other_client)


async def test_timeout_raises_lock_timeout_error(client: Client) -> None:
    latch = client.latch("slow", 1)
    await latch.try_set_count()
    with pytest.raises(LockTimeoutError):
        await latch.wait(timeout=0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):  # LockTimeoutError is a TimeoutError
        await latch.wait(timeout=0.2)
    assert 0.2 <= loop.time() - started < 3
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await latch.wait()
    assert await latch.count() == 1
    await assert_clean(client)


async def test_try_set_count_semantics(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    latch = client.latch("set", 3)
    assert latch.initial_count == 3
    assert await latch.count() == 0
    assert await latch.try_set_count() is True  # the constructor's count
    assert await latch.count() == 3
    assert await other_client.latch("set", 0).try_set_count(7) is False, "already counting"
    assert await latch.count() == 3
    ttl = server.execute("PTTL", "d:{set}")
    assert 0 < ttl <= seam.retention_ms(client), "a latch key always has a TTL"
    for _ in range(3):
        await other_client.latch("set", 0).count_down()
    assert await latch.count() == 0
    assert await other_client.latch("set", 0).try_set_count(2) is True, (
        "an open latch may be set again"
    )
    assert await latch.count() == 2
    with pytest.raises(InvalidArgumentError):
        await other_client.latch("set", 0).try_set_count()  # created with 0: nothing to set
    for bad in (0, -1):
        with pytest.raises(InvalidArgumentError):
            await latch.try_set_count(bad)
    for wrong in (1.5, True, "2"):
        with pytest.raises(InvalidArgumentTypeError):
            await latch.try_set_count(wrong)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        client.latch("set", "3")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        client.latch("set", -1)
    with pytest.raises(InvalidArgumentError):
        await latch.wait(timeout=-1)
    await assert_clean(client, other_client)


async def test_a_waiter_never_misses_an_opening_even_if_set_again(
    client: Client, other_client: Client
) -> None:
    latch = other_client.latch("aba", 1)
    await latch.try_set_count()
    waiter = asyncio.create_task(client.latch("aba", 0).wait())
    await eventually(lambda: parked(client) == 1, what="a parked waiter")
    # Open and set counting again back to back, before the waiter can look.
    opened, reset = await asyncio.gather(latch.count_down(), latch.try_set_count(5))
    assert (opened, reset) == (0, True)
    assert await asyncio.wait_for(waiter, 10) is True, "it saw the latch open"
    assert await latch.count() == 5
    await assert_clean(client, other_client)


async def test_a_waited_latch_is_kept_alive(client: Client, server: RedisServer) -> None:
    latch = client.latch("alive", 1)
    await latch.try_set_count()
    server.execute("PEXPIRE", "d:{alive}", 200)
    with pytest.raises(TimeoutError):
        await latch.wait(timeout=0)  # a waiter's check refreshes the TTL
    assert server.execute("PTTL", "d:{alive}") > 1000
    await assert_clean(client)


async def test_cancelled_wait_leaves_nothing_behind(client: Client, other_client: Client) -> None:
    latch = client.latch("cw", 1)
    await latch.try_set_count()
    waiters = [asyncio.create_task(latch.wait()) for _ in range(3)]
    await eventually(lambda: parked(client) == 3, what="3 parked")
    waiters[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiters[0]
    assert parked(client) == 2
    await other_client.latch("cw", 0).count_down()
    assert await asyncio.wait_for(asyncio.gather(*waiters[1:]), 10) == [True, True]
    await assert_clean(client, other_client)


async def test_a_cancelled_count_down_still_completes(client: Client) -> None:
    latch = client.latch("cd", 2)
    await latch.try_set_count()
    task = asyncio.create_task(latch.count_down())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await latch.count() == 1, "it ran (before this later command)"
    await assert_clean(client)


async def test_random_cancellation_fuzz_leaves_nothing_behind(
    client: Client, other_client: Client
) -> None:
    rng = random.Random(5)
    loop = asyncio.get_running_loop()
    opened = cancelled = 0
    for round_no in range(25):
        name = f"fz{round_no}"
        assert await client.latch(name, 2).try_set_count()
        waiters = [
            asyncio.create_task(rng.choice((client, other_client)).latch(name, 0).wait())
            for _ in range(6)
        ]
        for task in waiters:
            if rng.random() < 0.5:
                loop.call_later(rng.choice([0.0, rng.uniform(0, 0.003), 0.01]), task.cancel)
        await asyncio.sleep(rng.choice([0.0, 0.002, 0.01]))
        await other_client.latch(name, 0).count_down()
        await client.latch(name, 0).count_down()
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
        for result in results:
            if isinstance(result, asyncio.CancelledError):
                cancelled += 1
            elif result is True:
                opened += 1
            else:
                raise AssertionError(result)
    assert opened > 30 and cancelled > 30, (opened, cancelled)
    await assert_clean(client, other_client)
