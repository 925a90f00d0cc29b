"""lock.statistics() (local, no round trip), Client.statistics()'s counters, and
reprs that work from any thread, against real servers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aiolock import Client, LockStatistics, LockTimeoutError, Redlock, WrongTypeError
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually, off_thread
from tests.servers import RedisServer


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "st"}


async def reprs(*objects: object) -> list[str]:
    """The reprs of ``objects`` from another thread (twice: a plain thread and
    asyncio.to_thread), checked equal but for the clock, while the loop runs."""
    texts = off_thread(lambda: "\n".join(repr(o) for o in objects)).split("\n")
    again = (await asyncio.to_thread(lambda: "\n".join(repr(o) for o in objects))).split("\n")
    assert len(texts) == len(again) == len(objects)
    return texts


def owner_of(client: Client, task: asyncio.Task[Any] | None) -> str:
    """The owner id of a live task: "<client id>:<task serial>"."""
    assert task is not None and not task.done()
    return seam.engine(client).owner(task)


# -- lock.statistics() ---------------------------------------------------------------------


async def test_lock_statistics_holder_reentry_waiters(client: Client, other_client: Client) -> None:
    lock = client.lock("orders:42")
    empty = lock.statistics()
    assert empty == LockStatistics("lock", "orders:42", False, None, None, (), 0, None, None, 0, ())
    first = await lock.acquire()
    await lock.acquire()  # a re-entry
    me = asyncio.current_task()
    stats = lock.statistics()
    assert stats.locked and stats.kind == "lock" and stats.name == "orders:42"
    assert stats.task is me and stats.task_name == me.get_name()  # type: ignore[union-attr]
    assert stats.owner == owner_of(client, me) and stats.owner.startswith(client.id + ":")
    assert stats.holders == (stats.owner,)
    assert stats.hold_count == 2
    assert stats.fencing_token == first.fencing_token
    assert stats.lease_left is not None and 0 < stats.lease_left <= 30
    assert stats.waiting == 0

    # A local waiter counts; another Client's does not (it sees the lock as not held here).
    local = asyncio.create_task(lock.acquire())
    remote = asyncio.create_task(other_client.lock("orders:42").acquire())
    await eventually(lambda: lock.statistics().waiting == 1, what="the local waiter")
    await eventually(
        lambda: other_client.lock("orders:42").statistics().waiting == 1, what="the remote waiter"
    )
    theirs = other_client.lock("orders:42").statistics()
    assert not theirs.locked and theirs.task is None and theirs.hold_count == 0
    assert lock.statistics().tasks_waiting == 1  # anyio's name for it
    text = repr(lock)
    assert f"'orders:42' held by task {stats.owner.rpartition(':')[2]} (x2)" in text
    assert f"token {first.fencing_token}, lease " in text and "s left, 1 waiting>" in text

    local_owner = owner_of(client, local)
    await lock.release()
    await lock.release()
    handed = await asyncio.wait_for(local, 10)  # handed to the local waiter first
    stats = lock.statistics()
    assert stats.task is local and stats.hold_count == 1 and stats.waiting == 0
    assert stats.owner == local_owner  # its own, though the hold may keep our Redis entry
    await handed.release()
    await (await asyncio.wait_for(remote, 10)).release()
    assert lock.statistics().locked is False
    assert "not held here, 0 waiting" in repr(lock)
    await assert_clean(client, other_client)


async def test_read_lock_several_holders_and_write_waiters(client: Client) -> None:
    rw = client.rw_lock("doc")
    go = asyncio.Event()

    async def reader() -> None:
        async with rw.read:
            await go.wait()

    readers = [asyncio.create_task(reader()) for _ in range(2)]
    await eventually(lambda: len(rw.read.statistics().holders) == 2, what="two readers")
    writer = asyncio.create_task(rw.write.acquire())
    await eventually(lambda: rw.write.statistics().waiting == 1, what="a waiting writer")
    read = rw.read.statistics()
    assert read.kind == "read_lock" and read.locked and read.hold_count == 2
    assert read.task is readers[0] and read.holders[1] == owner_of(client, readers[1])
    assert rw.write.statistics().locked is False
    text = repr(rw)
    assert "write: not held here, 1 waiting; read: held by 2 tasks" in text
    go.set()
    lease = await asyncio.wait_for(writer, 10)
    write = rw.write.statistics()
    assert write.kind == "write_lock" and write.locked and write.task is writer
    assert write.fencing_token == lease.fencing_token and not rw.read.statistics().locked
    await lease.release()
    await asyncio.gather(*readers)
    await assert_clean(client)


async def test_semaphore_counts_permits_held_here(client: Client) -> None:
    sem = client.semaphore("pool", 5)
    two = await sem.acquire(permits=2)
    one = await asyncio.create_task(sem.acquire())
    stats = sem.statistics()
    assert stats.kind == "semaphore" and stats.locked
    assert stats.hold_count == 3 and len(stats.holders) == 2
    assert stats.fencing_token == max(two.fencing_token, one.fencing_token)
    assert "N=5: held by 2 tasks" in repr(sem) and "(3 permits)" in repr(sem)
    await two.release()
    assert sem.statistics().hold_count == 1
    await one.release()
    assert not sem.statistics().locked
    await assert_clean(client)


async def test_latch_counts_local_waiters(client: Client) -> None:
    latch = client.latch("gate", 1)
    assert await latch.try_set_count()
    waiter = asyncio.create_task(latch.wait())
    await eventually(lambda: latch.statistics().waiting == 1, what="the waiter parked")
    stats = latch.statistics()
    assert stats.kind == "latch" and not stats.locked and stats.hold_count == 0
    assert client.statistics().waiting == 1
    assert "1 waiting here" in repr(latch)
    await latch.count_down()
    assert await asyncio.wait_for(waiter, 10)
    assert latch.statistics().waiting == 0
    await assert_clean(client)


async def test_multi_lock_aggregates_its_parts(client: Client) -> None:
    a, b = client.lock("a"), client.lock("b")
    multi = client.multi_lock(a, b)
    lease = await multi.acquire()
    stats = multi.statistics()
    assert stats.kind == "multi_lock" and stats.name == "a+b" and stats.locked
    assert stats.task is asyncio.current_task() and stats.hold_count == 1
    assert stats.fencing_token == lease.fencing_token
    assert [p.name for p in stats.parts] == ["a", "b"] and all(p.locked for p in stats.parts)
    await lease.release()
    held_by_other = await asyncio.create_task(b.acquire())  # one part held, by another task
    stats = multi.statistics()
    assert not stats.locked and stats.task is None and stats.parts[1].locked
    await held_by_other.release()
    await assert_clean(client)


# -- reprs from any thread -----------------------------------------------------------------


async def test_repr_of_every_kind_from_other_threads(client: Client, url: str) -> None:
    unused = Client.from_url(url)
    try:
        never = (
            unused.lock("x"),
            unused.spin_lock("x"),
            unused.fair_lock("x"),
            unused.rw_lock("x"),
            unused.rw_lock("x").read,
            unused.semaphore("x", 1),
            unused.multi_lock(unused.lock("y")),
            Redlock([unused]).lock("x"),
            unused.latch("x", 1),
        )
        texts = off_thread(lambda: "\n".join(repr(o) for o in never)).split("\n")
        assert all("not used yet" in text for text in texts), texts
        assert not never[0].statistics().locked
    finally:
        await unused.aclose()

    rw = client.rw_lock("rw")
    redlock = Redlock([client])
    objects: dict[str, Any] = {
        "lock": client.lock("l"),
        "spin_lock": client.spin_lock("s"),
        "fair_lock": client.fair_lock("f"),
        "write_lock": rw.write,  # (then the read lock: a downgrade, allowed)
        "read_lock": rw.read,
        "semaphore": client.semaphore("sem", 2),
        "multi_lock": client.multi_lock(client.lock("m1"), client.lock("m2")),
        "redlock": redlock.lock("red"),
        "latch": client.latch("latch", 1),
    }
    for kind, obj in objects.items():
        assert obj.statistics().kind == kind
    free = await reprs(*objects.values(), rw, redlock, client)
    for text in free[:-3]:
        assert ("not held here" in text or "waiting here" in text) and "not used" not in text

    leases = []
    for kind, obj in objects.items():
        if kind == "latch":
            continue
        lease = await obj.acquire()
        leases.append(lease)
        stats = obj.statistics()
        assert stats.locked and stats.task is asyncio.current_task(), kind
        assert stats.owner is not None and stats.owner.startswith(client.id + ":"), kind
        assert stats.hold_count == 1 and stats.holders == (stats.owner,), kind
        assert stats.fencing_token == lease.fencing_token, kind
        assert stats.lease_left is not None and 0 < stats.lease_left <= 30, kind
    held = await reprs(*objects.values(), rw, redlock, client, *leases)
    by_kind = dict(zip(objects, held, strict=False))
    for kind, text in by_kind.items():
        if kind != "latch":
            assert "held by task" in text and " s left" in text, text
    assert by_kind["lock"].startswith("<AsyncLock 'l' held by task")
    assert by_kind["spin_lock"].startswith("<SpinLock 's' held by")
    assert by_kind["write_lock"].startswith("<WriteLock 'rw' held by")
    assert by_kind["multi_lock"].startswith("<MultiLock 'm1+m2' held by")
    assert by_kind["redlock"].startswith("<RedlockLock 'red' held by")
    assert "write: held by task" in held[len(objects)]
    assert "1 held here" in held[len(objects) + 1]
    assert "holds=" in held[len(objects) + 2]
    assert all(" held>" in text for text in held[len(objects) + 3 :])
    for lease in reversed(leases):
        await lease.release()
    await assert_clean(client)


# -- Client.statistics(): cumulative counters ----------------------------------------------


async def test_counters_acquisitions_timeouts_cancellations_failures(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    base = client.statistics()
    lock = client.lock("c")
    lease = await lock.acquire()
    await lock.acquire()  # a re-entry counts
    s = client.statistics()
    assert (s.acquisitions - base.acquisitions, s.timeouts, s.cancellations) == (2, 0, 0)
    await lock.release()
    await lock.release()

    # Busy elsewhere: try_acquire() counts as a timeout, and so does a timed-out wait.
    theirs = await other_client.lock("c").acquire()
    assert await lock.try_acquire() is None
    with pytest.raises(LockTimeoutError):
        await lock.acquire(timeout=0.2)
    s = client.statistics()
    assert s.timeouts == 2 and s.acquisitions - base.acquisitions == 2
    assert s.wait_time - base.wait_time >= 0.19  # the timed-out wait, at least

    # A cancelled waiter.
    waiter = asyncio.create_task(lock.acquire())
    await eventually(lambda: client.statistics().waiting == 1, what="the waiter parked")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert client.statistics().cancellations == 1
    await theirs.release()

    # A failure: the key holds a value aiolock did not write.
    server.execute("SET", "st:{wrong}", "x")
    with pytest.raises(WrongTypeError):
        await client.lock("wrong").acquire()
    s = client.statistics()
    assert (s.failures, s.cancellations, s.timeouts, s.losses) == (1, 1, 2, 0)
    assert s.acquisitions - base.acquisitions == 2
    assert lease.released
    await assert_clean(client, other_client)


async def test_losses_counted_when_the_watchdog_finds_a_hold_gone(
    make_client: Callable[..., Awaitable[Client]], other_client: Client
) -> None:
    # A 4.5 s lease: renewed every 1.5 s, so the eviction is found within seconds.
    holder = await make_client(prefix="st", lease=4.5)
    lease = await holder.lock("evicted").acquire()
    assert holder.statistics().losses == 0
    assert await other_client.lock("evicted").force_release()
    await eventually(lambda: lease.lost, timeout=10, what="the watchdog to find the hold gone")
    s = holder.statistics()
    assert s.losses == 1 and s.holds == 0
    assert not holder.lock("evicted").statistics().locked
    assert other_client.statistics().losses == 0
