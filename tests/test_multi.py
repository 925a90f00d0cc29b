"""MultiLock: all or nothing, fixed order, one script per server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolock import (
    Client,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockLostError,
    LockTimeoutError,
)
from aiolock._primitives.multi import MultiLease, MultiLock
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually, parked_on_channels
from tests.servers import RedisServer

#: Renewed every 1.5 s: a hold survives 3 s of scheduling stall on a loaded machine.
LEASE = 4.5


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "m", "lease": LEASE}


async def test_takes_all_in_one_script(client: Client, server: RedisServer) -> None:
    multi = client.multi_lock(client.lock("b"), client.lock("a"), client.lock("c"))
    assert isinstance(multi, MultiLock)
    assert multi.name == "a+b+c"  # the fixed order
    await seam.engine(client).is_cluster()  # (settled: the capability probe is not counted)
    server.execute("CONFIG", "RESETSTAT")
    lease = await multi.acquire()
    stats = server.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1, "one script for every lock of one server"
    assert isinstance(lease, MultiLease)
    assert set(lease.fencing_tokens) == {"a", "b", "c"}
    for name in "abc":
        assert await client.lock(name).is_locked()
    assert await multi.is_owned()
    await lease.release()
    assert not await multi.is_locked()
    await assert_clean(client)


async def test_all_or_nothing(client: Client, other_client: Client) -> None:
    held = await other_client.lock("y").acquire()
    multi = client.multi_lock(client.lock("x"), client.lock("y"))
    assert await multi.try_acquire() is None
    assert not await client.lock("x").is_locked(), "nothing taken when one is busy"
    waiter = asyncio.create_task(multi.acquire(timeout=20))
    # Parked (past its tries), waiting for y: x is still not taken.
    await eventually(lambda: parked_on_channels(client) == 1, what="the multi-lock parked")
    assert not await client.lock("x").is_locked()
    await held.release()
    lease = await waiter
    assert await client.lock("x").is_locked() and await client.lock("y").is_locked()
    await lease.release()
    await assert_clean(client, other_client)


async def test_across_clients_no_deadlock(client: Client, other_client: Client) -> None:
    """Two multi-locks over the same names, given in opposite orders, on two
    Clients each holding a lock of the set: no deadlock, mutual exclusion."""
    inside = 0
    done = 0

    async def worker(order: tuple[Client, Client]) -> None:
        nonlocal inside, done
        first, second = order
        multi = first.multi_lock(first.lock("p"), second.lock("q"))
        for _ in range(10):
            async with multi:
                inside += 1
                assert inside == 1
                await asyncio.sleep(0)
                inside -= 1
                done += 1

    await asyncio.wait_for(
        asyncio.gather(*(worker(o) for o in [(client, other_client), (other_client, client)] * 3)),
        60,
    )
    assert done == 60
    await assert_clean(client, other_client)


async def test_timeout_releases_what_was_taken(client: Client, other_client: Client) -> None:
    held = await asyncio.create_task(other_client.lock("t2").acquire())  # another task holds it
    multi = client.multi_lock(client.lock("t1"), other_client.lock("t2"))  # two Clients
    with pytest.raises(LockTimeoutError):
        await multi.acquire(timeout=0.2)
    assert not await client.lock("t1").is_locked()
    await held.release()
    await assert_clean(client, other_client)


async def test_reentrant_and_lost(client: Client, other_client: Client) -> None:
    multi = client.multi_lock(client.lock("r1"), client.lock("r2"))
    with pytest.raises(LockLostError):
        async with multi as lease:
            async with multi as inner:
                assert inner.fencing_tokens == lease.fencing_tokens
                assert await multi.hold_count() == 2
            await other_client.lock("r2").force_release()
            await asyncio.sleep(30)
    await eventually(lambda: lease.lost)
    await assert_clean(client, other_client)


async def test_cancelled_multi_acquire_leaves_nothing(client: Client, other_client: Client) -> None:
    held = await other_client.lock("c2").acquire()
    multi = client.multi_lock(client.lock("c1"), client.lock("c2"), client.lock("c3"))
    for delay in (0.0, 0.001, 0.003, 0.01, 0.03):
        task = asyncio.create_task(multi.acquire())
        await asyncio.sleep(delay)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await held.release()
    await assert_clean(client, other_client)
    assert not await multi.is_locked()


async def test_bad_arguments(client: Client) -> None:
    with pytest.raises(InvalidArgumentError):
        client.multi_lock()
    with pytest.raises(InvalidArgumentError, match="twice"):
        client.multi_lock(client.lock("a"), client.lock("a"))
    with pytest.raises(InvalidArgumentTypeError):
        client.multi_lock("a")  # type: ignore[arg-type]
