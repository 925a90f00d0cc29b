"""AsyncLock: acquire, release, reentrancy, fencing, queries, against real servers."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from aiolock import (
    AsyncLock,
    Client,
    Lease,
    LockNotOwnedError,
    LockTimeoutError,
)
from tests.core_util import assert_clean, eventually
from tests.servers import RedisServer


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "t"}


@pytest.fixture
def other_client_options() -> dict[str, Any]:
    # A short lease, so that its watchdog notices an evicted hold within 1.5 s;
    # its holds survive 3 s of scheduling stall on a loaded machine.
    return {"prefix": "t", "lease": 4.5}


async def test_acquire_release_roundtrip(client: Client, server: RedisServer) -> None:
    lock = client.lock("res")
    assert isinstance(lock, AsyncLock)
    lease = await lock.acquire()
    assert isinstance(lease, Lease)
    assert lease.name == "res"
    assert not lease.lost
    assert await lock.is_locked()
    assert await lock.is_owned()
    assert await lock.hold_count() == 1
    ttl = await lock.remaining_ttl()
    assert ttl is not None and 0 < ttl <= client.lease
    # Redisson's shape: a hash of owner -> hold count under <prefix>:{<name>}.
    fields = server.execute("HGETALL", "t:{res}")
    owners = {k: v for k, v in fields.items() if not k.startswith("~")}
    assert list(owners.values()) == ["1"]
    assert next(iter(owners)).startswith(client.id + ":")
    assert int(fields["~fence"]) == lease.fencing_token
    await lock.release()
    assert not await lock.is_locked()
    assert await lock.remaining_ttl() is None
    assert not await lock.is_owned()
    assert await lock.hold_count() == 0
    await assert_clean(client)


async def test_reentrant_per_task_no_round_trip(client: Client) -> None:
    lock = client.lock("re")
    first = await lock.acquire()
    connects_and_inflight = client.statistics()
    second = await lock.acquire()
    third = await lock.acquire(timeout=0)
    assert second.fencing_token == first.fencing_token == third.fencing_token
    assert await lock.hold_count() == 3
    after = client.statistics()
    # No round trip: the same connections, nothing in flight; two more acquisitions counted.
    assert after.acquisitions == connects_and_inflight.acquisitions + 2
    assert dataclasses.replace(
        after, acquisitions=connects_and_inflight.acquisitions, wait_time=0.0
    ) == dataclasses.replace(connects_and_inflight, wait_time=0.0)
    await lock.release()
    await lock.release()
    assert await lock.is_locked()
    assert await lock.hold_count() == 1
    await lock.release()
    assert not await lock.is_locked()
    with pytest.raises(LockNotOwnedError):
        await lock.release()


async def test_other_task_of_same_client_waits(client: Client) -> None:
    lock = client.lock("x")
    lease = await lock.acquire()
    entered = asyncio.Event()

    async def other() -> Lease:
        got = await lock.acquire()
        entered.set()
        return got

    task = asyncio.create_task(other())
    await eventually(lambda: client.statistics().waiting == 1, what="the other task queued")
    assert await lock.try_acquire() is not None  # re-entry by the holder: fine
    await lock.release()
    # Only the re-entry was undone: the hold stays, here and in Redis (a round
    # trip, in which a wrongly woken task would have run), the other task waits.
    stats = lock.statistics()
    assert stats.locked and stats.hold_count == 1 and stats.task is asyncio.current_task()
    assert await lock.is_locked()
    assert not entered.is_set() and not task.done()
    assert client.statistics().waiting == 1
    await lease.release()
    other_lease = await asyncio.wait_for(task, 10)
    assert other_lease.fencing_token > lease.fencing_token
    await other_lease.release()
    await assert_clean(client)


async def test_mutual_exclusion_two_clients(client: Client, other_client: Client) -> None:
    counter = 0
    inside = 0
    tokens: list[int] = []

    async def worker(c: Client) -> None:
        nonlocal counter, inside
        lock = c.lock("mx")
        for _ in range(10):
            async with lock as lease:
                inside += 1
                assert inside == 1
                tokens.append(lease.fencing_token)
                value = counter
                await asyncio.sleep(0)
                counter = value + 1
                inside -= 1

    await asyncio.gather(*(worker(c) for c in (client, other_client) for _ in range(8)))
    assert counter == 160
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    await assert_clean(client, other_client)


async def test_fencing_tokens_increase_across_expiry_and_force_release(
    client: Client, other_client: Client
) -> None:
    lock1, lock2 = client.lock("f"), other_client.lock("f")
    a = await lock1.acquire(lease=0.05)
    await eventually(lambda: a.lost, what="fixed lease to expire")
    b = await lock2.acquire()
    assert b.fencing_token > a.fencing_token
    assert await lock1.force_release()
    await eventually(lambda: b.lost, what="force-released lease to be found lost")
    c = await lock1.acquire()
    assert c.fencing_token > b.fencing_token
    await c.release()
    d = await lock2.acquire()
    assert d.fencing_token > c.fencing_token
    await d.release()
    with pytest.raises(LockNotOwnedError):
        await a.release()


async def test_fencing_survives_counter_loss(client: Client, server: RedisServer) -> None:
    """The counter of a name may expire (or a restart may lose it): tokens still grow."""
    lock = client.lock("gone")
    first = await lock.acquire()
    await first.release()
    server.execute("DEL", "t:{gone}:fence")
    second = await lock.acquire()
    assert second.fencing_token > first.fencing_token
    await second.release()
    assert int(server.execute("PTTL", "t:{gone}:fence")) > 0, "fence counters must expire"


async def test_try_acquire_does_not_wait(client: Client, other_client: Client) -> None:
    held = await client.lock("busy").acquire()
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await other_client.lock("busy").try_acquire() is None
    assert await other_client.lock("busy").try_acquire(0.05) is None
    assert loop.time() - start < 5
    await held.release()
    got = await other_client.lock("busy").try_acquire()
    assert got is not None
    await got.release()
    await assert_clean(client, other_client)


async def test_timeout_raises_lock_timeout_error(client: Client, other_client: Client) -> None:
    held = await client.lock("t").acquire()
    with pytest.raises(LockTimeoutError) as info:
        await other_client.lock("t").acquire(timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    # A local waiter queued behind the holder times out too.
    with pytest.raises(TimeoutError):
        await asyncio.create_task(client.lock("t").acquire(timeout=0.1))
    await held.release()
    await assert_clean(client, other_client)


async def test_waiter_wakes_on_release_not_on_ttl(client: Client, other_client: Client) -> None:
    """A waiter is woken by the release message, long before the holder's TTL."""
    held = await client.lock("w").acquire()  # 30 s watchdog lease
    waiter = asyncio.create_task(other_client.lock("w").acquire(timeout=20))
    await eventually(lambda: other_client.statistics().subscriptions == 1, what="subscription")
    loop = asyncio.get_running_loop()
    released_at = loop.time()
    await held.release()
    lease = await waiter
    assert loop.time() - released_at < 5  # far below the 30 s TTL
    await lease.release()
    await assert_clean(client, other_client)


async def test_lease_release_from_another_task(client: Client) -> None:
    lock = client.lock("handoff")
    lease = await lock.acquire()

    async def releaser() -> None:
        with pytest.raises(LockNotOwnedError):
            await lock.release()  # this task holds nothing
        await lease.release()

    await asyncio.create_task(releaser())
    assert lease.released
    assert not await lock.is_locked()
    await lease.release()  # idempotent
    await assert_clean(client)


async def test_async_with_and_decorator(client: Client) -> None:
    lock = client.lock("deco")
    seen: list[int] = []

    @lock
    async def plain(x: int) -> int:
        assert await lock.is_owned()
        seen.append(x)
        return x * 2

    @lock(timeout=5, lease=10)
    async def configured(x: int) -> int:
        ttl = await lock.remaining_ttl()
        assert ttl is not None and ttl <= 10
        return x + 1

    assert await plain(2) == 4
    assert await configured(2) == 3
    assert plain.__name__ == "plain"
    async with lock as lease:
        assert lease.fencing_token > 0
        async with lock(timeout=1) as inner:
            assert inner.fencing_token == lease.fencing_token
            assert await lock.hold_count() == 2
    assert not await lock.is_locked()
    with pytest.raises(RuntimeError):
        async with lock:
            raise RuntimeError("boom")
    assert not await lock.is_locked()
    await assert_clean(client)


async def test_async_with_releases_when_body_cancelled(client: Client) -> None:
    lock = client.lock("cb")
    inside = asyncio.Event()

    async def body() -> None:
        async with lock:
            inside.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await lock.is_locked()
    await assert_clean(client)


async def test_force_release(client: Client, other_client: Client) -> None:
    assert not await client.lock("fr").force_release()
    lease = await other_client.lock("fr").acquire()
    assert await client.lock("fr").force_release()
    assert not await client.lock("fr").is_locked()
    await eventually(lambda: lease.lost, what="evicted lease to be lost")
    with pytest.raises(LockNotOwnedError):
        await lease.release()
    await assert_clean(client, other_client)


async def test_fixed_lease_has_fixed_ttl(client: Client) -> None:
    lock = client.lock("fixed")
    lease = await lock.acquire(lease=15)
    ttl = await lock.remaining_ttl()
    assert ttl is not None and 5 < ttl <= 15  # its own lease, not the Client's 30 s
    await lease.extend(60)
    ttl = await lock.remaining_ttl()
    assert ttl is not None and 50 < ttl <= 60
    await lease.release()


async def test_many_local_waiters_share_two_connections(
    client: Client, server: RedisServer
) -> None:
    """A thousand tasks on one name: no connection per waiter (one for commands,
    one for pub/sub, one for the watchdog's renewals)."""
    lock = client.lock("crowd")
    holder = await lock.acquire()
    done = 0

    async def waiter() -> None:
        nonlocal done
        async with lock:
            done += 1

    tasks = [asyncio.create_task(waiter()) for _ in range(1000)]
    await eventually(lambda: client.statistics().waiting == 1000, what="1000 waiters")
    stats = client.statistics()
    assert stats.subscriptions <= 1
    assert stats.command_connects == 1
    clients = str(server.execute("CLIENT", "LIST"))
    mine = [line for line in clients.splitlines() if f"name=aiolock:{client.id[:12]}" in line]
    assert len(mine) <= 3, mine  # commands, pub/sub, and the watchdog's lane
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert done == 1000
    await assert_clean(client)


async def test_repr_and_statistics(client: Client) -> None:
    lock = client.lock("r")
    async with lock:
        text = repr(lock)
        assert "'r'" in text and "token" in text
        # From a thread with no event loop too (on uvloop as on asyncio).
        assert (await asyncio.to_thread(repr, lock)).startswith("<AsyncLock 'r' held by task")
        assert client.statistics().holds == 1
        assert "holds=1" in repr(client)
    assert "not held" in repr(lock)


async def test_fresh_acquire_after_local_loss_gets_a_new_token(client: Client) -> None:
    """A fixed lease declared lost locally may still linger in Redis for a few
    ms: the same task's next acquire is still a fresh one with a larger token."""
    lock = client.lock("again")
    for _ in range(5):
        first = await lock.acquire(lease=0.05)
        await eventually(lambda first=first: first.lost, what="the fixed lease to run out")
        again = await lock.acquire(lease=0.05)
        assert again.fencing_token > first.fencing_token
        await eventually(lambda again=again: again.lost, what="the fixed lease to run out")


async def test_runs_on_the_parametrised_event_loop(request: pytest.FixtureRequest) -> None:
    """The [uvloop] copies of the core suite really run on uvloop (conftest)."""
    uvloop = pytest.importorskip("uvloop")
    factory = request.node.callspec.params["_asyncio_loop_factory"]
    on_uvloop = isinstance(asyncio.get_running_loop(), uvloop.Loop)
    assert on_uvloop == (factory is uvloop.new_event_loop)
    assert request.node.callspec.id in ("asyncio", "uvloop")
    assert on_uvloop == (request.node.callspec.id == "uvloop")
