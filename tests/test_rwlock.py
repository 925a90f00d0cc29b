"""ReadWriteLock: many readers or one writer, on both servers, under every notify mode.

Two (or three) Clients stand for processes; a SIGKILLed subprocess stands
for a crashed reader. Every test ends with the local state clean.
"""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import sys
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from aiolock import (
    Client,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Lease,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    LockUpgradeError,
    ServerRefusedError,
)
from aiolock._client import Notify
from aiolock._primitives.rwlock import ReadLock, ReadWriteLock, WriteLock
from aiolock.testing import seam
from tests.conftest import NOTIFY_MODES, MakeClient
from tests.core_util import (
    assert_clean,
    assert_refuses_bad_arguments,
    blocked_clients,
    cancel_at_random,
    cancel_release,
    evalsha_calls,
    eventually,
    parked_on_channels,
)
from tests.servers import RedisServer

T = TypeVar("T")


@pytest.fixture
def client_options(notify: Notify) -> dict[str, Any]:
    # The default 30 s lease: a waiter woken only by a TTL bound would be slow.
    return {"prefix": "rw", "notify": notify}


#: The shortest watchdog lease in these tests: renewed every 1.5 s, a hold
#: survives 3 s of scheduling stall on a loaded machine.
SHORT = 4.5


@pytest.fixture
def other_client_options(notify: Notify) -> dict[str, Any]:
    # A short lease: its watchdog renews every 1.5 s and finds a lost hold fast.
    return {"prefix": "rw", "notify": notify, "lease": SHORT}


@pytest.fixture
async def plain(make_client: MakeClient) -> Client:
    """For tests that never wait (so the notify mode plays no part)."""
    return await make_client(prefix="rw")


async def in_task(coro: Awaitable[T]) -> T:
    """Run ``coro`` in a task of its own: ownership is per task."""

    async def run() -> T:
        return await coro

    return await asyncio.create_task(run())


def _gone(server: RedisServer, key: str) -> bool:
    return int(server.execute("EXISTS", key)) == 0


def _waiting(client: Client, count: int) -> bool:
    return client.statistics().waiting == count


def rw_keys(server: RedisServer, name: str) -> set[str]:
    return set(server.execute("KEYS", f"rw:{{{name}}}*"))


def side_of(rw: ReadWriteLock, side: str) -> ReadLock | WriteLock:
    return rw.read if side == "read" else rw.write


async def settled(
    server: RedisServer, notify: Notify, blpops: int, *waiters: tuple[Client, int]
) -> None:
    """Let parked waiters settle, so that only the wake-up under test can free them.

    A new subscription or BLPOP loop wakes its waiters once when it starts
    (messages may have been missed before): wait until each Client of
    ``waiters`` has its count of tasks parked on a channel after that (and, in
    list mode, ``blpops`` BLPOPs block on the server). Pollers (poll mode) retry
    on their own backoff: there is nothing to settle.
    """
    if notify == "poll":
        return

    def parked() -> bool:
        if notify == "list" and blocked_clients(server) < blpops:
            return False
        return all(parked_on_channels(c) == count for c, count in waiters)

    await eventually(parked, what=f"{blpops} BLPOPs and waiters parked: {waiters}")


def assert_nothing_held(server: RedisServer, name: str) -> None:
    """No hold, no waiting writer; whatever is left is bounded and expires."""
    keys = rw_keys(server, name)
    assert f"rw:{{{name}}}" not in keys, server.execute("HGETALL", f"rw:{{{name}}}")
    assert f"rw:{{{name}}}:wq" not in keys, server.execute("ZRANGE", f"rw:{{{name}}}:wq", 0, -1)
    for key in keys:
        assert int(server.execute("PTTL", key)) > 0, f"{key} has no TTL"


# ------------------------------------------------------------------------ the basics


async def test_readers_share_across_two_clients(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    rws = [client.rw_lock("share"), other_client.rw_lock("share")]
    assert isinstance(rws[0], ReadWriteLock)
    assert isinstance(rws[0].read, ReadLock) and isinstance(rws[0].write, WriteLock)
    inside = 0
    all_in = asyncio.Event()
    leave = asyncio.Event()

    async def reader(rw: ReadWriteLock) -> int:
        nonlocal inside
        async with rw.read as lease:
            inside += 1
            if inside == 6:
                all_in.set()
            await leave.wait()
            inside -= 1
            return lease.fencing_token

    tasks = [asyncio.create_task(reader(rws[i % 2])) for i in range(6)]
    await asyncio.wait_for(all_in.wait(), 10)
    assert await rws[0].read.is_locked()
    assert not await rws[0].write.is_locked()
    assert await in_task(rws[1].write.try_acquire()) is None
    fields = server.execute("HGETALL", "rw:{share}")
    assert fields["mode"] == "read" and fields["rc"] == "6"
    assert sum(1 for f in fields if f.startswith("r:" + other_client.id)) == 3
    leave.set()
    tokens = await asyncio.gather(*tasks)
    assert len(set(tokens)) == 6, "every reader got a fresh token"
    lease = await in_task(rws[1].write.try_acquire())
    assert lease is not None and lease.fencing_token > max(tokens)
    await lease.release()
    await assert_clean(client, other_client)
    assert_nothing_held(server, "share")


async def test_writer_excludes_readers_and_writers(client: Client, other_client: Client) -> None:
    writers_in = readers_in = most_readers = 0
    write_tokens: list[int] = []

    async def writer(c: Client) -> None:
        nonlocal writers_in
        for _ in range(6):
            async with c.rw_lock("mx").write as lease:
                writers_in += 1
                assert writers_in == 1 and readers_in == 0
                write_tokens.append(lease.fencing_token)
                await asyncio.sleep(0)
                writers_in -= 1

    async def reader(c: Client) -> None:
        nonlocal readers_in, most_readers
        for _ in range(6):
            async with c.rw_lock("mx").read:
                readers_in += 1
                most_readers = max(most_readers, readers_in)
                assert writers_in == 0
                await asyncio.sleep(0.002)
                readers_in -= 1

    await asyncio.wait_for(
        asyncio.gather(
            *(writer(c) for c in (client, other_client) for _ in range(2)),
            *(reader(c) for c in (client, other_client) for _ in range(3)),
        ),
        30,
    )
    assert len(write_tokens) == 24
    assert write_tokens == sorted(write_tokens) and len(set(write_tokens)) == 24
    assert most_readers >= 2, "readers never overlapped"
    await assert_clean(client, other_client)


async def test_reentrancy_of_both_sides_without_round_trips(
    client: Client, server: RedisServer
) -> None:
    rw = client.rw_lock("re")
    w1 = await rw.write.acquire()
    calls = evalsha_calls(server)
    w2 = await rw.write.acquire()
    w3 = await rw.write.acquire(timeout=0)
    assert evalsha_calls(server) == calls, "a re-entry made a round trip"
    assert w1.fencing_token == w2.fencing_token == w3.fencing_token
    assert await rw.write.hold_count() == 3
    r1 = await rw.read.acquire()  # a downgrade: a fresh read hold
    calls = evalsha_calls(server)
    r2 = await rw.read.acquire()
    async with rw.read as r3:
        assert await rw.read.hold_count() == 3
    assert evalsha_calls(server) == calls, "a re-entry made a round trip"
    assert r1.fencing_token == r2.fencing_token == r3.fencing_token > w1.fencing_token
    await rw.write.release()
    await rw.write.release()
    assert await rw.write.is_locked() and await rw.write.hold_count() == 1
    await w3.release()  # released already by rw.write.release(): a no-op
    assert await rw.write.hold_count() == 1
    await w1.release()
    assert not await rw.write.is_locked()
    with pytest.raises(LockNotOwnedError):
        await rw.write.release()
    assert await rw.read.is_locked() and await rw.read.hold_count() == 2
    await rw.read.release()
    await r1.release()
    assert not await rw.read.is_locked()
    with pytest.raises(LockNotOwnedError):
        await rw.read.release()
    await assert_clean(client)


async def test_downgrade(client: Client, other_client: Client, server: RedisServer) -> None:
    rw, rw2 = client.rw_lock("down"), other_client.rw_lock("down")
    w = await rw.write.acquire()
    r = await rw.read.acquire()
    assert r.fencing_token > w.fencing_token
    assert await in_task(rw2.read.try_acquire()) is None
    assert await in_task(rw2.write.try_acquire()) is None
    assert server.execute("HGET", "rw:{down}", "mode") == "write"
    await w.release()  # still holding read: the lock is now in read mode
    assert server.execute("HGET", "rw:{down}", "mode") == "read"
    assert await rw.read.is_owned() and not await rw.write.is_locked()
    joined = await in_task(rw2.read.acquire(timeout=5))
    assert joined.fencing_token > r.fencing_token
    assert await in_task(rw2.write.try_acquire()) is None
    with pytest.raises(LockUpgradeError):
        await rw.write.acquire()  # holds read only now: no upgrade
    await joined.release()
    await r.release()
    w2 = await in_task(rw2.write.acquire(timeout=5))
    await w2.release()
    await assert_clean(client, other_client)
    assert_nothing_held(server, "down")


async def test_upgrade_is_refused_at_once_without_touching_redis(
    client: Client, server: RedisServer
) -> None:
    rw = client.rw_lock("up")
    read = await rw.read.acquire()
    before = (server.execute("HGETALL", "rw:{up}"), rw_keys(server, "up"), evalsha_calls(server))
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.timeout(5):  # a deadlock would hang here
        with pytest.raises(LockUpgradeError, match="read lock"):
            await rw.write.acquire()
        with pytest.raises(LockUpgradeError):
            await rw.write.try_acquire(10)
        with pytest.raises(LockUpgradeError):
            async with rw.write(timeout=10):
                pytest.fail("entered the write lock while holding read")
    assert loop.time() - start < 3
    after = (server.execute("HGETALL", "rw:{up}"), rw_keys(server, "up"), evalsha_calls(server))
    assert after == before, "the refused upgrade changed Redis or made a round trip"
    assert client.statistics().waiting == 0
    assert await rw.read.hold_count() == 1 and not read.lost
    await read.release()
    await assert_clean(client)


# ------------------------------------------------------------------------ fairness, crashes


async def test_writer_not_starved_by_overlapping_readers(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    """Readers overlap: each leaves only once another reader is in (or after
    0.2 s), so without writer preference the read count would never drop to
    zero. Yet a writer gets in, and the readers go on afterwards."""
    stop = asyncio.Event()
    readers_in = reads = most_readers = 0
    writer_in = False
    loop = asyncio.get_running_loop()
    company = asyncio.Condition()

    def has_company() -> bool:
        return readers_in >= 2

    async def reader(c: Client) -> None:
        nonlocal readers_in, reads, most_readers
        rw = c.rw_lock("starve")
        while not stop.is_set():
            async with rw.read:
                readers_in += 1
                most_readers = max(most_readers, readers_in)
                assert not writer_in
                reads += 1
                async with company:
                    company.notify_all()
                await asyncio.sleep(0.02)
                try:
                    async with asyncio.timeout(0.2), company:
                        await company.wait_for(has_company)
                except TimeoutError:
                    pass
                readers_in -= 1

    readers = [asyncio.create_task(reader((client, other_client)[i % 2])) for i in range(6)]
    await eventually(lambda: reads >= 20, what="a stream of readers")
    start = loop.time()
    async with client.rw_lock("starve").write(timeout=10):
        writer_in = True
        waited = loop.time() - start
        assert readers_in == 0
        await asyncio.sleep(0.01)
        writer_in = False
    after = reads
    await eventually(lambda: reads >= after + 6, what="readers to go on after the writer")
    stop.set()
    await asyncio.wait_for(asyncio.gather(*readers), 10)
    assert waited < 5 and most_readers >= 3, (waited, most_readers)
    await assert_clean(client, other_client)
    assert_nothing_held(server, "starve")


CRASHER = """
import asyncio, sys
from aiolock import Client

async def main():
    async with Client.from_url(sys.argv[1], prefix="rw", lease=float(sys.argv[2])) as c:
        await c.rw_lock("crash").read.acquire()
        print(c.id, flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_crashed_reader_does_not_pin_the_lock(
    url: str, client: Client, other_client: Client, server: RedisServer
) -> None:
    """A SIGKILLed reader (watchdog lease 4.5 s) is gone within its lease, while
    other readers keep the lock busy, and then a writer gets in."""
    stop = asyncio.Event()
    reads = 0

    async def reader(c: Client, delay: float) -> None:
        nonlocal reads
        await asyncio.sleep(delay)
        while not stop.is_set():
            async with c.rw_lock("crash").read:
                reads += 1
                await asyncio.sleep(0.03)

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHER, url, str(SHORT), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        crashed_id = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        readers = [
            asyncio.create_task(reader((client, other_client)[i % 2], i * 0.01)) for i in range(4)
        ]
        await eventually(lambda: reads >= 10, what="readers alongside the doomed one")
        proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    def crashed_fields() -> list[str]:
        fields = server.execute("HGETALL", "rw:{crash}")
        return [f for f in fields if f.startswith(("r:" + crashed_id, "x:" + crashed_id))]

    assert crashed_fields(), "the crashed reader's hold should still be there"
    at_kill = reads
    await eventually(lambda: not crashed_fields(), timeout=SHORT + 10, what="the crashed hold")
    gone_after = time.monotonic() - killed_at
    assert gone_after < SHORT + 3, f"the crashed reader pinned the lock for {gone_after:.2f} s"
    assert reads > at_kill + 5, "other readers did not go on"
    stop.set()
    await asyncio.wait_for(asyncio.gather(*readers), 10)
    lease = await in_task(client.rw_lock("crash").write.acquire(timeout=3))
    await lease.release()
    await assert_clean(client, other_client)
    assert_nothing_held(server, "crash")


async def test_fixed_lease_reader_expires_while_others_renew(
    client: Client, other_client: Client
) -> None:
    short = await in_task(other_client.rw_lock("fixed").read.acquire(lease=0.3))
    renewed = await in_task(client.rw_lock("fixed").read.acquire())
    await eventually(lambda: short.lost, what="the fixed lease to run out")
    await renewed.release()
    lease = await in_task(other_client.rw_lock("fixed").write.acquire(timeout=3))
    assert lease.fencing_token > renewed.fencing_token > short.fencing_token
    await lease.release()
    with pytest.raises(LockNotOwnedError):
        await short.release()
    await assert_clean(client, other_client)


async def test_cancelled_waiting_writer_lets_readers_in_at_once(
    client: Client, other_client: Client, server: RedisServer, notify: Notify
) -> None:
    held = await in_task(other_client.rw_lock("wq").read.acquire())
    writer = asyncio.create_task(client.rw_lock("wq").write.acquire())
    await eventually(lambda: server.execute("EXISTS", "rw:{wq}:wq") == 1, what="waiting writer")
    # A new reader is refused while the writer waits (the writer's 30 s lease
    # bounds its wait: only the wake-up can let it in early).
    parked = asyncio.create_task(other_client.rw_lock("wq").read.acquire())
    await eventually(lambda: other_client.statistics().waiting == 1, what="the reader to park")
    await settled(server, notify, 2, (client, 1), (other_client, 1))  # writer, reader
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    lease = await asyncio.wait_for(parked, 5)
    assert server.execute("EXISTS", "rw:{wq}:wq") == 0
    await lease.release()
    await held.release()
    await assert_clean(client, other_client)
    assert_nothing_held(server, "wq")


async def test_write_release_wakes_readers_of_every_client(
    url: str, notify: Notify, client: Client, server: RedisServer
) -> None:
    """Parked readers in two other Clients are woken by the release, not by a TTL."""
    async with (
        Client.from_url(url, prefix="rw", notify=notify) as b,
        Client.from_url(url, prefix="rw", notify=notify) as c,
    ):
        held = await client.rw_lock("wake").write.acquire()  # 30 s lease
        readers = [asyncio.create_task(x.rw_lock("wake").read.acquire()) for x in (b, c, b, c)]
        await eventually(
            lambda: b.statistics().waiting == 2 and c.statistics().waiting == 2,
            what="readers to park",
        )
        await settled(server, notify, 2, (b, 2), (c, 2))
        await held.release()
        leases = await asyncio.wait_for(asyncio.gather(*readers), 5)
        for lease in leases:
            await lease.release()
        await assert_clean(client, b, c)
    assert_nothing_held(server, "wake")


# ------------------------------------------------------------------------ fencing, leases


async def test_fencing_tokens_increase(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    rw, rw2 = client.rw_lock("fence"), other_client.rw_lock("fence")
    tokens: list[int] = []
    r1 = await in_task(rw.read.acquire())
    r2 = await in_task(rw2.read.acquire())
    tokens += [r1.fencing_token, r2.fencing_token]
    await r1.release()
    await r2.release()

    async def write_then_read() -> None:
        w = await rw.write.acquire()
        r = await rw.read.acquire()
        tokens.extend([w.fencing_token, r.fencing_token])
        await w.release()
        await r.release()

    await in_task(write_then_read())
    expiring = await in_task(rw2.write.acquire(lease=0.05))
    tokens.append(expiring.fencing_token)
    await eventually(lambda: expiring.lost, what="the fixed lease to expire")
    evicted = await in_task(rw2.read.acquire())
    tokens.append(evicted.fencing_token)
    assert await rw.read.force_release()
    r3 = await in_task(rw.read.acquire())
    tokens.append(r3.fencing_token)
    await r3.release()
    await eventually(lambda: evicted.lost, what="the evicted reader to be found lost")
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
    assert int(server.execute("PTTL", "rw:{fence}:fence")) > 0, "fence counters must expire"
    await assert_clean(client, other_client)


SIDES = ("read", "write")


async def test_lost_lease_cancels_the_body(client: Client, other_client: Client) -> None:
    """Evicted by another Client: its Client is told (or, in list and poll mode,
    the watchdog finds out), the body is cancelled."""
    loop = asyncio.get_running_loop()
    for side in SIDES:
        view = side_of(other_client.rw_lock("lost"), side)
        seen: list[Lease] = []
        with pytest.raises(LockLostError, match="lost"):
            async with view as lease:
                lease.on_lost(seen.append)
                start = loop.time()  # (told at once: maybe before the call returns)
                assert await side_of(client.rw_lock("lost"), side).force_release()
                await asyncio.sleep(30)
        assert loop.time() - start < SHORT, side  # one renewal round (1.5 s), not a lease
        assert lease.lost and seen == [lease], side
    await assert_clean(client, other_client)


async def test_watchdog_renews_read_and_write_holds(url: str, notify: Notify) -> None:
    async with Client.from_url(url, prefix="rw", notify=notify, lease=SHORT) as other:
        await _renew_both(other)


async def _renew_both(other_client: Client) -> None:
    rw = other_client.rw_lock("renew")

    async def hold_both() -> None:
        w = await rw.write.acquire()
        r = await rw.read.acquire()
        rounds = seam.watchdog_rounds(other_client)
        await eventually(
            lambda: seam.watchdog_rounds(other_client) >= rounds + 4, what="4", timeout=30
        )
        # 4 renewals at 1.5 s > the 4.5 s lease: only the watchdog kept them.
        assert await rw.write.is_owned() and await rw.read.is_owned()
        assert not w.lost and not r.lost
        ttl = await rw.read.remaining_ttl()
        assert ttl is not None and 0 < ttl <= SHORT  # the Client's lease, not 30 s
        await w.release()
        await r.release()

    await in_task(hold_both())
    await assert_clean(other_client)


# ------------------------------------------------------------------------ cancellation


async def test_cancel_after_script_ran_before_reply_read(
    client: Client, server: RedisServer
) -> None:
    """Redis granted it, but the task was cancelled before it read the reply."""
    for side in SIDES:
        name = f"late-{side}"
        view = side_of(client.rw_lock(name), side)
        await view.is_locked()  # connect first
        task = asyncio.create_task(view.acquire())
        await asyncio.sleep(0)  # the acquire is now on the wire
        # Block the loop until the script ran: the reply arrives, unread.
        fence = f"rw:{{{name}}}:fence"
        await eventually(
            lambda fence=fence: server.execute("EXISTS", fence) == 1,
            block_loop=True,
            what="the script",
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await assert_clean(client)
        await eventually(functools.partial(_gone, server, f"rw:{{{name}}}"), what="the undo")
        assert_nothing_held(server, name)


async def test_reacquire_after_a_cancelled_acquire_keeps_the_new_hold(
    client: Client, other_client: Client
) -> None:
    """The undo of a cancelled acquire must not remove the same task's next hold.

    The task is cancelled after its acquire ran in Redis (reply unread) and
    acquires again at once, before the undo of the first call has run.
    """
    for side in SIDES:
        await _reacquire_after_cancel(client, other_client, side)
    await assert_clean(client, other_client)


async def _reacquire_after_cancel(client: Client, other_client: Client, side: str) -> None:
    view = side_of(client.rw_lock("again"), side)
    await view.is_locked()  # connect first
    loop = asyncio.get_running_loop()

    async def cancelled_then_again() -> Lease:
        me = asyncio.current_task()
        assert me is not None

        def block_then_cancel() -> None:
            time.sleep(0.1)  # the reply arrives, unread
            me.cancel()

        loop.call_soon(block_then_cancel)
        try:
            await view.acquire()
        except asyncio.CancelledError:
            me.uncancel()
        else:
            pytest.fail("the first acquire was not cancelled")
        return await view.acquire()

    lease = await asyncio.create_task(cancelled_then_again())
    await eventually(lambda: client.statistics().background == 0, what="the undo to run")
    assert not lease.lost, side
    assert await side_of(other_client.rw_lock("again"), side).is_locked(), side
    assert await in_task(other_client.rw_lock("again").write.try_acquire()) is None
    await lease.release()  # it was still ours


async def test_cancelled_release_still_completes(client: Client, server: RedisServer) -> None:
    rw = client.rw_lock("rel")
    for view in (rw.read, rw.write):
        lease = await view.acquire()
        await cancel_release(lease, server, "rw:{rel}")
        await lease.release()  # a retry: idempotent, no error
    await assert_clean(client)


async def test_random_cancellation_fuzz(
    client: Client, other_client: Client, server: RedisServer, notify: Notify
) -> None:
    """Readers and writers of two Clients, cancelled at random points.

    Many readers or one writer throughout; every delivered cancellation ends
    its task cancelled; afterwards no hold, waiting writer, local waiter,
    subscription or lease is left anywhere.
    """
    rng = random.Random(NOTIFY_MODES.index(notify))
    readers_in = writers_in = 0
    entered = 0

    def enter(write: bool) -> None:
        nonlocal readers_in, writers_in, entered
        if write:
            writers_in += 1
        else:
            readers_in += 1
        entered += 1
        assert writers_in <= 1 and not (writers_in and readers_in), (writers_in, readers_in)

    def leave(write: bool) -> None:
        nonlocal readers_in, writers_in
        if write:
            writers_in -= 1
        else:
            readers_in -= 1

    async def contender(c: Client) -> None:
        rw = c.rw_lock("fuzz")
        write = rng.random() < 0.4
        view = rw.write if write else rw.read
        mode = rng.random()
        if mode < 0.5:
            async with view:
                enter(write)
                try:
                    await asyncio.sleep(rng.choice([0, 0, 0.001]))
                finally:
                    leave(write)
        elif mode < 0.8:
            lease = await view.try_acquire(rng.choice([0.0, 0.002, 0.05]))
            if lease is not None:
                enter(write)
                leave(write)
                await lease.release()
        else:
            lease = await view.acquire(timeout=rng.choice([0.001, 0.01, 1.0]))
            enter(write)
            leave(write)
            await lease.release()

    cancelled = await cancel_at_random(
        rng,
        lambda: contender(rng.choice((client, other_client))),
        rounds=30,
        delay=lambda rng: rng.choice([0.0, rng.uniform(0, 0.002), rng.uniform(0, 0.01)]),
    )
    assert entered > 20 and cancelled > 30, (entered, cancelled)
    await assert_clean(client, other_client)
    await eventually(
        lambda: server.execute("EXISTS", "rw:{fuzz}", "rw:{fuzz}:wq") == 0,
        what="no hold and no waiting writer in Redis",
    )
    assert_nothing_held(server, "fuzz")


# ------------------------------------------------------------------------ the rest of the API


async def test_try_acquire_and_timeouts(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    held = await in_task(other_client.rw_lock("busy").write.acquire())
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await client.rw_lock("busy").read.try_acquire() is None
    assert await client.rw_lock("busy").write.try_acquire() is None
    with pytest.raises(LockTimeoutError) as info:
        await client.rw_lock("busy").read.acquire(timeout=0.1)
    assert isinstance(info.value, TimeoutError)
    with pytest.raises(LockTimeoutError):
        await client.rw_lock("busy").write.acquire(timeout=0.1)
    assert loop.time() - start < 5
    await held.release()
    # A writer's try_acquire that finds readers does not register as waiting.
    reader = await in_task(other_client.rw_lock("busy").read.acquire())
    assert await client.rw_lock("busy").write.try_acquire() is None
    assert server.execute("EXISTS", "rw:{busy}:wq") == 0
    await reader.release()
    await assert_clean(client, other_client)


async def test_local_writers_queue_fifo(client: Client) -> None:
    rw = client.rw_lock("fifo")
    first = await rw.write.acquire()
    order: list[int] = []

    async def writer(i: int) -> None:
        async with rw.write:
            order.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(writer(i)))
        await eventually(functools.partial(_waiting, client, i + 1), what="queued")
    await first.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == [0, 1, 2, 3, 4]
    await assert_clean(client)


async def test_queries_and_force_release(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    rw, rw2 = client.rw_lock("q"), other_client.rw_lock("q")
    assert not await rw.is_locked()
    assert await rw.read.remaining_ttl() is None and await rw.write.remaining_ttl() is None
    assert not await rw.write.force_release() and not await rw.force_release()

    async def writer_and_reader() -> tuple[Lease, Lease]:
        return await rw.write.acquire(), await rw.read.acquire()

    w, r = await in_task(writer_and_reader())
    assert await rw.is_locked() and await rw.write.is_locked() and await rw.read.is_locked()
    assert not await rw.write.is_owned()  # the main task holds nothing
    assert await rw.write.hold_count() == 0
    ttl = await rw2.write.remaining_ttl()
    assert ttl is not None and 25 < ttl <= 30
    text = repr(rw)  # the writer holds both sides (a downgrade)
    assert "write: held by task" in text and "; read: held by task" in text
    assert await rw.write.force_release()  # evicts the writer only
    assert w.lost and not r.lost
    assert server.execute("HGET", "rw:{q}", "mode") == "read"
    assert not await rw.write.is_locked() and await rw.read.is_locked()
    assert await rw.read.force_release()
    assert r.lost and not await rw.is_locked()
    assert server.execute("EXISTS", "rw:{q}") == 0
    r2 = await in_task(rw2.read.acquire())
    assert await rw.force_release()
    await eventually(lambda: r2.lost, what="the other Client's watchdog to notice")
    with pytest.raises(LockNotOwnedError):
        await w.release()
    await assert_clean(client, other_client)


async def test_context_forms_and_decorators(plain: Client) -> None:
    rw = plain.rw_lock("forms")

    @rw.read
    async def read_it() -> int:
        return await rw.read.hold_count()

    @rw.write(timeout=5)
    async def write_it() -> int:
        return await rw.write.hold_count()

    assert await read_it() == 1 and await write_it() == 1
    async with rw.write(timeout=5, lease=5) as lease:
        assert isinstance(lease, Lease) and not lease.lost
        async with rw.read(on_lost="ignore") as read_lease:
            assert read_lease.fencing_token > lease.fencing_token
    await assert_clean(plain)


async def test_bad_input_is_refused_before_any_round_trip(
    plain: Client, server: RedisServer
) -> None:
    calls = evalsha_calls(server)
    with pytest.raises(InvalidArgumentTypeError):
        plain.rw_lock(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        plain.rw_lock("")
    rw = plain.rw_lock("bad")
    for view in (rw.read, rw.write):
        await assert_refuses_bad_arguments(view)
        with pytest.raises(InvalidArgumentTypeError):
            view(lambda: None)  # type: ignore[arg-type, return-value]
    assert evalsha_calls(server) == calls
    await assert_clean(plain)


async def test_a_name_used_by_another_kind_of_lock_is_refused(plain: Client) -> None:
    held = await plain.lock("kind").acquire()
    with pytest.raises(ServerRefusedError, match="another kind of lock"):
        await in_task(plain.rw_lock("kind").read.acquire())
    with pytest.raises(ServerRefusedError, match="another kind of lock"):
        await in_task(plain.rw_lock("kind").write.acquire())
    assert await plain.lock("kind").is_locked()
    await held.release()
    await assert_clean(plain)
