"""SpinLock: the AsyncLock protocol by polling, never sleeping past the deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolock import Backoff, Client, InvalidArgumentError, LockTimeoutError
from aiolock._primitives.spin import SpinLock
from tests.core_util import assert_clean, evalsha_calls, eventually
from tests.servers import RedisServer


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "s"}


async def test_spin_lock_never_subscribes(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    spin = client.spin_lock("k")
    assert isinstance(spin, SpinLock)
    held = await other_client.lock("k").acquire()  # one lock: same keys as AsyncLock
    before = evalsha_calls(server)
    waiter = asyncio.create_task(spin.acquire(timeout=20))
    # Waiting: it tried, found the lock busy and tried again, all without a channel.
    await eventually(lambda: evalsha_calls(server) - before >= 3, what="3 tries of the spin lock")
    assert client.statistics().waiting == 1
    assert client.statistics().subscriptions == 0
    assert client.statistics().pubsub_connects == 0
    await held.release()
    lease = await waiter
    assert lease.fencing_token > held.fencing_token
    await lease.release()
    await assert_clean(client, other_client)


async def test_last_sleep_is_cut_to_the_deadline(client: Client, other_client: Client) -> None:
    """The issue's case, stretched so that scheduling stalls of a loaded
    machine (seconds) cannot decide it: a backoff from 0.5 s, x4, tries at
    0, 0.5 and 2.5 s; its next sleep, 8 s, would end at 10.5 s. The lock is
    freed at 2.6 s and the wait is 6 s: a naive spinner gives up at 6 s (or
    gets the lock at 10.5 s); ours sleeps only to the deadline and makes one
    last attempt there, and gets the lock.
    """
    backoff = Backoff(initial=0.5, factor=4.0, maximum=100.0, jitter=0.0)
    spin = client.spin_lock("deadline", backoff=backoff)
    held = await other_client.lock("deadline").acquire()
    loop = asyncio.get_running_loop()
    start = loop.time()
    loop.call_later(2.6, lambda: asyncio.ensure_future(held.release()))
    lease = await spin.try_acquire(6)
    elapsed = loop.time() - start
    assert lease is not None, "gave up although the lock was free before the deadline"
    assert elapsed < 6 + 3  # at the deadline (plus slack), not after the 8 s sleep (10.5 s)
    await lease.release()
    await assert_clean(client, other_client)


async def test_spin_timeout_is_honoured(client: Client, other_client: Client) -> None:
    held = await other_client.lock("busy").acquire()
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(LockTimeoutError):
        # Tries at 0 and 1.5 s; the next sleep (6 s) would end at 7.5 s.
        await client.spin_lock("busy", backoff=Backoff(initial=1.5, factor=4, maximum=60)).acquire(
            timeout=2
        )
    assert loop.time() - start < 2 + 3  # at the timeout (plus slack), not at 7.5 s
    await held.release()


def test_backoff_validation_and_shape() -> None:
    b = Backoff(initial=0.01, factor=2, maximum=0.05, jitter=0)
    assert [b.delay(i) for i in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    jittered = Backoff(initial=0.1, maximum=0.1, jitter=0.5)
    assert all(0.05 <= jittered.delay(3) <= 0.1 for _ in range(100))
    with pytest.raises(InvalidArgumentError):
        Backoff(initial=-1)
    with pytest.raises(InvalidArgumentError):
        Backoff(factor=0.5)
    with pytest.raises(InvalidArgumentError):
        Backoff(jitter=2)
    with pytest.raises(InvalidArgumentError):
        Backoff(initial=1, maximum=0.5)


def test_ttl_hint_never_waits_a_lease_for_an_expiring_holder() -> None:
    """PTTL 0 (under a millisecond left) once made a waiter sleep a whole lease."""
    from aiolock._primitives.compete import ttl_hint

    assert ttl_hint(-1) is None  # no TTL: wait for the release message
    assert ttl_hint(0) == 0.001
    assert ttl_hint(-2) == 0.001  # gone: retry at once
    assert ttl_hint(1500) == 1.5
