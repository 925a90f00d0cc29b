"""The cancellation contract, at every await of acquire and release.

An acquire cancelled anywhere leaves no hold and no waiter; a cancelled
release still completes; a delivered cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import random
from contextlib import AsyncExitStack
from typing import Any

import pytest

from aiolock import Client
from aiolock._core.waiting.listener import Channel
from tests.core_util import (
    Exclusive,
    assert_clean,
    cancel_at_random,
    cancel_release,
    eventually,
    parked_on_channels,
    use_exclusively,
)
from tests.servers import RedisServer


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "c", "lease": 5}


async def test_cancel_after_script_ran_before_reply_read(
    client: Client, server: RedisServer
) -> None:
    """Redis granted the lock, but the task was cancelled before it read the reply."""
    lock = client.lock("late")
    await lock.is_locked()  # connect first
    task = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)  # the acquire is now on the wire
    # Block the loop until the script ran: the reply arrives, unread.
    await eventually(
        lambda: server.execute("EXISTS", "c:{late}:fence") == 1, block_loop=True, what="the script"
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_clean(client)
    assert server.execute("EXISTS", "c:{late}") == 0, "the undo released the hold"


async def test_cancel_while_queued_locally(client: Client) -> None:
    lock = client.lock("q")
    held = await lock.acquire()
    waiters = [asyncio.create_task(lock.acquire()) for _ in range(5)]
    await eventually(lambda: client.statistics().waiting == 5, what="5 local waiters")
    for task in waiters[1:4]:
        task.cancel()
    await held.release()
    lease0 = await waiters[0]
    await lease0.release()
    lease4 = await waiters[4]
    await lease4.release()
    for task in waiters[1:4]:
        assert task.cancelled()
    await assert_clean(client)


async def test_cancel_while_parked_on_channel(client: Client, other_client: Client) -> None:
    held = await other_client.lock("p").acquire()
    task = asyncio.create_task(client.lock("p").acquire())
    # Parked: subscribed, past its confirming retry, waiting for a message.
    await eventually(lambda: parked_on_channels(client) == 1, what="the task parked")
    assert client.statistics().subscriptions == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert parked_on_channels(client) == 0
    await assert_clean(client)
    await held.release()


async def test_woken_head_cancelled_passes_turn_on(client: Client) -> None:
    lock = client.lock("pass")
    held = await lock.acquire()
    first = asyncio.create_task(lock.acquire())
    second = asyncio.create_task(lock.acquire())
    await eventually(lambda: client.statistics().waiting == 2, what="2 waiters")
    await held.release()  # hands the turn to `first` ...
    first.cancel()  # ... which is cancelled before it runs
    lease = await asyncio.wait_for(second, 10)
    assert first.cancelled()
    await lease.release()
    await assert_clean(client)


async def test_cancelled_release_still_completes(client: Client, server: RedisServer) -> None:
    lock = client.lock("rel")
    lease = await lock.acquire()
    await cancel_release(lease, server, "c:{rel}")
    await assert_clean(client)
    await lease.release()  # a retry after the cancelled call: idempotent, no error


async def test_a_cancelled_release_does_not_cancel_another_caller_waiting_for_it(
    client: Client, server: RedisServer
) -> None:
    """Two tasks wait for the same release; cancelling one leaves the other's
    wait, and the release itself, untouched."""
    lease = await client.lock("rel").acquire()
    first = asyncio.create_task(lease.release())
    second = asyncio.create_task(lease.release())
    await asyncio.sleep(0)  # both wait for the one release on the wire
    first.cancel()
    await asyncio.wait_for(second, 10)  # returns normally
    assert first.cancelled()
    assert server.execute("EXISTS", "c:{rel}") == 0
    await assert_clean(client)


async def test_acquire_inside_asyncio_timeout(client: Client, other_client: Client) -> None:
    held = await other_client.lock("to").acquire()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await client.lock("to").acquire()
    await assert_clean(client)
    await held.release()


def test_channel_wake_passes_on_when_woken_waiter_is_cancelled() -> None:
    async def main() -> None:
        channel = Channel(b"ch")
        channel.refs = 2
        a = asyncio.create_task(channel.wait(10))
        b = asyncio.create_task(channel.wait(10))
        await asyncio.sleep(0)
        channel.wake_one()  # wakes a ...
        a.cancel()  # ... which is cancelled before running: b must get it
        assert await asyncio.wait_for(b, 5) is True
        assert a.cancelled()

    asyncio.run(main())


def test_channel_keeps_a_permit_for_a_waiter_not_yet_parked() -> None:
    async def main() -> None:
        channel = Channel(b"ch")
        channel.refs = 1
        channel.wake_one()  # message arrives while the waiter is retrying
        assert await channel.wait(10) is True  # returns at once
        assert await channel.wait(0.01) is False  # only one permit was kept
        channel.wake_all()
        assert await channel.wait(0.01) is True

    asyncio.run(main())


@pytest.mark.parametrize(
    ("seed", "modes"),
    [
        (1, ("pubsub", "pubsub")),
        (2, ("pubsub", "pubsub")),
        (3, ("pubsub", "pubsub", "pubsub")),
        # Untargeted waiters beside granted ones (the "~n" flag, see _wake.lua).
        (4, ("pubsub", "list", "poll")),
    ],
)
async def test_random_cancellation_fuzz(
    url: str, server: RedisServer, seed: int, modes: tuple[str, ...]
) -> None:
    """Cancel acquires and bodies at random points, thousands of times, with
    the Clients waiting in the given notify modes.

    Mutual exclusion holds throughout; every delivered cancellation ends its
    task cancelled; afterwards no key, waiter, queue entry, subscription or
    lease is left anywhere.
    """
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                Client.from_url(url, prefix="c", lease=5, notify=mode)  # type: ignore[arg-type]
            )
            for mode in modes
        ]
        await _fuzz(clients, server, seed)


async def _fuzz(clients: list[Client], server: RedisServer, seed: int) -> None:
    rng = random.Random(seed)
    section = Exclusive()

    async def contender(c: Client) -> None:
        # A fixed lease is woken, a watchdog lease granted (scripts/_wake.lua).
        await use_exclusively(c.lock("fuzz"), rng, section, leases=[None, 30.0])

    cancelled = await cancel_at_random(
        rng,
        lambda: contender(rng.choice(clients)),
        rounds=250,
        share=0.7,
        delay=lambda rng: rng.choice([0.0, rng.uniform(0, 0.002), rng.uniform(0, 0.01)]),
    )
    assert section.entered > 100 and cancelled > 300, (section.entered, cancelled)
    await assert_clean(*clients)
    assert server.execute("EXISTS", "c:{fuzz}") == 0
    # Every waiter that gave up left the waiting set (and released any grant).
    await eventually(lambda: server.execute("EXISTS", "c:{fuzz}:wq") == 0, what="no waiting set")


def test_channel_waiters_that_give_up_leave_in_constant_time() -> None:
    """10,000 waiters parked on one channel (a semaphore's tasks all park) are
    cancelled: the queue is compacted, counts stay right, wake-ups still work."""

    async def main() -> None:
        channel = Channel(b"ch")
        channel.refs = 10_002
        waiters = [asyncio.create_task(channel.wait(60)) for _ in range(10_000)]
        await asyncio.sleep(0)
        assert channel.parked == 10_000
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert channel.parked == 0
        assert channel._lot.size < 64, "the dead waiters were compacted away"
        late = asyncio.create_task(channel.wait(60))
        timed_out = await channel.wait(0.001)
        assert timed_out is False
        channel.wake_one()
        assert await asyncio.wait_for(late, 5) is True
        assert channel.parked == 0

    asyncio.run(main())


async def test_waiters_cancelled_together_unsubscribe_in_one_command(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    """20 tasks waiting on 20 names are cancelled at once: their Client leaves
    all 20 channels with one UNSUBSCRIBE, not 20."""
    names = [f"batch{i}" for i in range(20)]
    channels = [f"c:{{{name}}}:w:{client.id}" for name in names]

    def subscribers() -> list[int]:
        return list(server.execute("PUBSUB", "NUMSUB", *channels)[1::2])

    held = [await other_client.lock(name).acquire() for name in names]
    tasks = [asyncio.create_task(client.lock(name).acquire()) for name in names]
    await eventually(lambda: subscribers() == [1] * 20, what="20 channels subscribed")
    await eventually(lambda: client.statistics().waiting == 20, what="20 waiters")
    before = server.info("commandstats").get("cmdstat_unsubscribe", {}).get("calls", 0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await eventually(lambda: subscribers() == [0] * 20, what="every channel left")
    calls = server.info("commandstats").get("cmdstat_unsubscribe", {}).get("calls", 0)
    assert calls - before == 1, "one UNSUBSCRIBE for every channel"
    for lease in held:
        await lease.release()
    await assert_clean(client, other_client)
