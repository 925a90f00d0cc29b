"""Semaphore: at most N, permits as leases, set_permits, wake-ups, claims, cancellation.

Every test runs on both servers and under every notify mode, with two or
three Clients standing for processes (one test uses a real process, killed).
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

import pytest

from aiolock import (
    Client,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockLostError,
    LockNotOwnedError,
    WrongTypeError,
)
from aiolock._primitives.semaphore import Permit, Semaphore
from aiolock.testing import seam
from tests.core_util import assert_clean, cancel_at_random, eventually
from tests.servers import RedisServer

#: The shortest watchdog lease in these tests (renewed every 1.5 s).
SHORT = 4.5


@pytest.fixture
def client_options(notify: str) -> dict[str, Any]:
    # A short lease: the watchdog notices a lost hold within 1.5 s, and a
    # hold survives 3 s of scheduling stall on a loaded machine.
    return {"prefix": "s", "lease": SHORT, "notify": notify}


@pytest.fixture
def other_client_options(notify: str) -> dict[str, Any]:
    # A long lease: waiters that are not woken would wait (up to) 30 s.
    return {"prefix": "s", "lease": 30, "notify": notify}


def redis_state(server: RedisServer, name: str) -> tuple[int, list[str], str | None]:
    """(permits in use, holder members, claimant) as Redis has them."""
    used = server.execute("HGET", f"s:{{{name}}}", "u")
    members = server.execute("ZRANGE", f"s:{{{name}}}:h", 0, -1)
    claimant = server.execute("HGET", f"s:{{{name}}}", "c")
    return int(used or 0), list(members), claimant


def assert_nothing_held(server: RedisServer, name: str) -> None:
    used, members, claimant = redis_state(server, name)
    assert (used, members, claimant) == (0, [], None)
    assert server.execute("EXISTS", f"s:{{{name}}}:h") == 0


# --------------------------------------------------------------------------- basics


async def test_acquire_k_and_the_permit_releases_exactly_k(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    sem = client.semaphore("k", 5)
    assert isinstance(sem, Semaphore) and sem.permits == 5
    three = await sem.acquire(3)
    assert isinstance(three, Permit) and three.permits == 3 and three.name == "k"
    assert not three.lost and three.fencing_token > 0
    assert await sem.available() == 2
    one = await other_client.semaphore("k", 5).acquire()
    assert one.permits == 1
    assert await sem.available() == 1 and await sem.in_use() == 4
    used, members, _ = redis_state(server, "k")
    assert used == 4 and sorted(m.split("|")[0] for m in members) == ["1", "3"]
    for key in ("s:{k}", "s:{k}:h", "s:{k}:fence"):
        assert server.execute("PTTL", key) > 0, f"{key} has a TTL"
    await three.release()
    assert await sem.available() == 4
    await three.release()  # idempotent: never gives back twice
    assert await sem.available() == 4
    await one.release()
    assert await sem.available() == 5
    assert_nothing_held(server, "k")
    # Idle at its default N: no key but the fence and the (120 s) release record.
    assert server.execute("EXISTS", "s:{k}") == 0
    for key in ("s:{k}:r", "s:{k}:fence"):
        assert 0 < server.execute("PTTL", key) <= seam.retention_ms(client), f"{key} has a TTL"
    with pytest.raises(LockNotOwnedError):
        await sem.release()
    await assert_clean(client, other_client)


async def test_release_from_task_releases_its_latest_acquisition(client: Client) -> None:
    sem = client.semaphore("latest", 4)
    first = await sem.acquire(1)
    second = await sem.acquire(2)  # not reentrant: a second, separate acquisition
    assert second.fencing_token > first.fencing_token
    assert await sem.available() == 1
    await sem.release()
    assert second.released and not first.released
    assert await sem.available() == 3

    async def elsewhere() -> None:
        with pytest.raises(LockNotOwnedError):
            await sem.release()  # another task holds nothing

    await asyncio.create_task(elsewhere())
    await sem.release()
    assert first.released and await sem.available() == 4
    await assert_clean(client)


async def test_async_with_decorator_and_context_arguments(client: Client) -> None:
    sem = client.semaphore("ctx", 3)
    async with sem as permit:
        assert permit.permits == 1 and await sem.available() == 2
    async with sem(permits=3, timeout=5, lease=10) as permit:
        assert permit.permits == 3 and await sem.available() == 0
    assert await sem.available() == 3

    @sem
    async def one() -> int:
        return await sem.available()

    @sem(permits=2)
    async def two() -> int:
        return await sem.available()

    assert await one() == 2 and await two() == 1
    assert await sem.available() == 3
    await assert_clean(client)


async def test_bad_input_is_refused_before_any_round_trip(client: Client) -> None:
    with pytest.raises(InvalidArgumentTypeError):
        client.semaphore("bad", "3")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        client.semaphore("bad", 0)
    with pytest.raises(InvalidArgumentError):
        client.semaphore("", 1)
    sem = client.semaphore("bad", 2)
    for value in (0, -1):
        with pytest.raises(InvalidArgumentError):
            await sem.acquire(value)
    for wrong in (1.5, True, "1", None):
        with pytest.raises(InvalidArgumentTypeError):
            await sem.acquire(wrong)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await sem.try_acquire(1, wait=-1)
    with pytest.raises(InvalidArgumentError):
        sem(permits=0)
    with pytest.raises(InvalidArgumentError):
        await sem.set_permits(0)
    assert client.statistics().command_connects == 0, "no round trip was made"
    # More than N can never be granted: refused at the first try, not waited for.
    with pytest.raises(InvalidArgumentError, match="2 permits in all"):
        await sem.acquire(3, timeout=5)
    await assert_clean(client)


# --------------------------------------------------------------------------- at most N


async def test_never_more_than_n_holders_across_clients(
    client: Client, other_client: Client, third_client: Client, server: RedisServer
) -> None:
    n = 3
    in_use = 0
    peak = 0
    tokens: list[int] = []
    rng = random.Random(7)

    async def worker(c: Client) -> None:
        nonlocal in_use, peak
        sem = c.semaphore("n", n)
        for _ in range(3):
            k = rng.choice((1, 1, 2))
            async with sem(permits=k, timeout=20) as permit:
                tokens.append(permit.fencing_token)
                in_use += k
                peak = max(peak, in_use)
                assert in_use <= n, f"{in_use} permits held with N={n}"
                await asyncio.sleep(rng.uniform(0, 0.01))
                in_use -= k

    await asyncio.wait_for(
        asyncio.gather(
            *(worker(c) for c in (client, other_client, third_client) for _ in range(3))
        ),
        30,
    )
    assert peak == n, "the test never reached contention"
    assert len(set(tokens)) == len(tokens) == 27
    assert_nothing_held(server, "n")
    await assert_clean(client, other_client, third_client)


async def test_try_acquire_never_blocks(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    held = await other_client.semaphore("try", 2).acquire(2)
    sem = client.semaphore("try", 2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await sem.try_acquire() is None
    assert loop.time() - started < 5, "one try, not a wait for the holder (30 s)"
    started = loop.time()
    assert await sem.try_acquire(1, wait=0.2) is None
    assert 0.2 <= loop.time() - started < 5, "its 0.2 s, not a wait for the holder (30 s)"
    await eventually(
        lambda: redis_state(server, "try")[2] is None, what="the claim of the try dropped"
    )
    await held.release()
    got = await sem.try_acquire(2)
    assert got is not None and got.permits == 2
    await got.release()
    await assert_clean(client, other_client)


async def test_available_and_set_permits_while_held(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    sem = client.semaphore("setn", 2)
    remote = other_client.semaphore("setn", 2)
    a = await sem.acquire()
    b = await remote.acquire()
    assert await sem.available() == 0
    waiter = asyncio.create_task(remote.acquire(timeout=20))
    await eventually(lambda: other_client.statistics().waiting == 1, what="a parked waiter")
    # Raise N: the waiter is woken (its own bound is 30 s away) and gets the new permit.
    await sem.set_permits(3)
    c = await asyncio.wait_for(waiter, 10)
    assert await remote.get_permits() == 3 and sem.permits == 3
    # Lower N below what is held: holders keep theirs, nobody new gets in.
    await sem.set_permits(1)
    assert not (a.lost or b.lost or c.lost)
    assert await sem.in_use() == 3 and await sem.available() == 0
    assert await remote.try_acquire() is None
    late = asyncio.create_task(remote.acquire(timeout=20))
    await b.release()
    await c.release()
    await asyncio.sleep(0.2)
    assert not late.done(), "1 permit in use and N=1: still full"
    await a.release()
    d = await asyncio.wait_for(late, 10)
    # A waiter asking for more than N is told so when N is lowered below what it asks.
    await sem.set_permits(2)
    too_big = asyncio.create_task(remote.acquire(2, timeout=20))
    await eventually(lambda: other_client.statistics().waiting == 1, what="the big waiter parked")
    await sem.set_permits(1)
    with pytest.raises(InvalidArgumentError, match="1 permits in all"):
        await asyncio.wait_for(too_big, 10)
    await d.release()
    assert_nothing_held(server, "setn")
    # A changed N outlives the holders (for the retention time), idle or not.
    assert server.execute("HGET", "s:{setn}", "n") == "1"
    assert 0 < server.execute("PTTL", "s:{setn}") <= seam.retention_ms(client)
    assert await client.semaphore("setn", 2).get_permits() == 1
    await assert_clean(client, other_client)


# --------------------------------------------------------------------------- wake-ups


async def test_release_of_k_permits_wakes_k_waiters(
    client: Client, other_client: Client, third_client: Client
) -> None:
    holder = await client.semaphore("wake", 3).acquire(3, lease=30)  # expires far away
    waiters = [
        asyncio.create_task(c.semaphore("wake", 3).acquire(timeout=20))
        for c in (other_client, other_client, third_client, third_client)
    ]
    await eventually(
        lambda: other_client.statistics().waiting + third_client.statistics().waiting == 4,
        what="4 parked",
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    await holder.release()
    # Three were granted quickly (woken, not by their 30 s bound); the fourth still waits.
    await eventually(lambda: sum(t.done() for t in waiters) == 3, what="3 granted")
    assert loop.time() - started < 5
    await asyncio.sleep(0.2)
    assert sum(t.done() for t in waiters) == 3
    granted = [t.result() for t in waiters if t.done()]
    await granted[0].release()  # one permit back: the fourth gets it
    await asyncio.wait_for(asyncio.gather(*waiters), 10)
    for task in waiters:
        if not task.result().released:
            await task.result().release()
    await assert_clean(client, other_client, third_client)


async def test_big_waiter_is_not_starved_by_small_ones(
    client: Client, other_client: Client, third_client: Client, server: RedisServer
) -> None:
    n = 4
    stop = asyncio.Event()
    small_grants = 0

    async def small(c: Client) -> None:
        nonlocal small_grants
        sem = c.semaphore("starve", n)
        while not stop.is_set():
            async with sem(timeout=20):
                small_grants += 1
                await asyncio.sleep(rng.uniform(0.01, 0.03))

    # Eight small ones keep all four permits busy: they are never all free at once.
    rng = random.Random(3)
    smalls = [asyncio.create_task(small(c)) for c in (other_client, third_client) for _ in range(4)]
    await eventually(lambda: small_grants > 20, what="the small ones running")
    big = await client.semaphore("starve", n).acquire(n, timeout=5)
    assert big.permits == n and await client.semaphore("starve", n).available() == 0
    before = small_grants
    await asyncio.sleep(0.1)
    assert small_grants == before, "nobody else got in while the big waiter held all"
    await big.release()
    await eventually(lambda: small_grants > before, what="the small ones resumed")
    stop.set()
    await asyncio.wait_for(asyncio.gather(*smalls), 20)
    assert_nothing_held(server, "starve")
    await assert_clean(client, other_client, third_client)


async def test_the_longest_waiter_takes_the_claim_over(
    client: Client, other_client: Client, third_client: Client, server: RedisServer
) -> None:
    holder = await client.semaphore("old", 2).acquire(2)
    first = asyncio.create_task(other_client.semaphore("old", 2).acquire(1))
    await eventually(lambda: (redis_state(server, "old")[2] or "").startswith("1|"), what="a claim")
    # The big waiter fails while the small one holds the claim: it waits unclaimed.
    big = asyncio.create_task(third_client.semaphore("old", 2).acquire(2))
    await eventually(lambda: third_client.statistics().waiting == 1, what="the big waiter waiting")
    assert (redis_state(server, "old")[2] or "").startswith("1|")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    # A younger small waiter may take the free claim, but the big one, older,
    # takes it over on its next try.
    young = asyncio.create_task(other_client.semaphore("old", 2).acquire(1))
    await eventually(
        lambda: (redis_state(server, "old")[2] or "").startswith("2|"), what="the big one's claim"
    )
    await holder.release()
    permit = await asyncio.wait_for(big, 20)
    assert permit.permits == 2 and not young.done()
    await permit.release()
    small = await asyncio.wait_for(young, 20)
    await small.release()
    assert_nothing_held(server, "old")
    await assert_clean(client, other_client, third_client)


async def test_a_cancelled_claimant_gives_way_at_once(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    held = await other_client.semaphore("claim", 3).acquire(2)
    big = asyncio.create_task(client.semaphore("claim", 3).acquire(3))
    await eventually(lambda: redis_state(server, "claim")[2] is not None, what="a claim")
    # The claim keeps the free permit for the big waiter ...
    assert await other_client.semaphore("claim", 3).try_acquire() is None
    big.cancel()
    with pytest.raises(asyncio.CancelledError):
        await big
    # ... and is dropped as soon as it gives up.
    await eventually(lambda: redis_state(server, "claim")[2] is None, what="claim dropped")
    small = await other_client.semaphore("claim", 3).try_acquire()
    assert small is not None
    await small.release()
    await held.release()
    await assert_clean(client, other_client)


# --------------------------------------------------------------------------- leases


async def test_fencing_tokens_strictly_increase(client: Client, other_client: Client) -> None:
    tokens = []
    for i in range(6):
        c = (client, other_client)[i % 2]
        permit = await c.semaphore("fence", 2).acquire(1 + i % 2)
        tokens.append(permit.fencing_token)
        await permit.release()
    a = await client.semaphore("fence", 2).acquire()
    b = await other_client.semaphore("fence", 2).acquire()
    tokens += [a.fencing_token, b.fencing_token]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    await a.release()
    await b.release()
    await assert_clean(client, other_client)


async def test_fixed_lease_holder_that_never_releases_gives_permits_back(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    sem = other_client.semaphore("fixed", 2)
    stale = await sem.acquire(2, lease=2)
    await stale.extend(6)  # a fixed lease is moved, never shortened
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await client.semaphore("fixed", 2).acquire(2, timeout=20)
    # Past the first lease (2 s), and when the extended one ran out (slack: a loaded machine).
    assert 3 < loop.time() - started < 6 + 5, "granted when the extended lease ran out"
    await eventually(lambda: stale.lost, what="the fixed lease to be marked lost")
    with pytest.raises(LockNotOwnedError):
        await stale.release()
    assert got.fencing_token > stale.fencing_token
    await got.release()
    assert_nothing_held(server, "fixed")
    await assert_clean(client, other_client)


_HOLDER = """
import asyncio, sys
from aiolock import Client

async def main():
    client = Client.from_url(sys.argv[1], prefix="s", lease=float(sys.argv[2]))
    await client.semaphore("crash", 3).acquire(2)
    print("held", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_sigkilled_holder_permits_come_back_within_its_lease(
    client: Client, url: str, server: RedisServer
) -> None:
    """A real process holds 2 of 3 permits under its watchdog and is SIGKILLed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, url, str(SHORT), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line.strip() == b"held"
        sem = client.semaphore("crash", 3)
        await asyncio.sleep(SHORT + 0.5)  # longer than its lease: only its watchdog kept it
        assert await sem.available() == 1 and await sem.try_acquire(2) is None
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)
        killed = time.monotonic()
        permit = await sem.acquire(3, timeout=20)
        assert time.monotonic() - killed < SHORT + 3, "back within one lease plus slack"
        await permit.release()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert_nothing_held(server, "crash")
    await assert_clean(client)


async def test_lost_lease_cancels_the_body(client: Client, server: RedisServer) -> None:
    sem = client.semaphore("lost", 2)
    reached_end = False
    with pytest.raises(LockLostError):
        async with sem(permits=2) as permit:
            server.execute("DEL", "s:{lost}:h")  # the hold vanishes from Redis
            await asyncio.sleep(30)  # cancelled at the next renewal (1.5 s)
            reached_end = True
    assert not reached_end and permit.lost
    with pytest.raises(LockLostError, match="fixed lease"):
        async with sem(lease=0.2):
            await asyncio.sleep(30)
    assert current_cancelling() == 0
    await assert_clean(client)


def current_cancelling() -> int:
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling()


# --------------------------------------------------------------------------- cancellation


async def test_cancel_after_the_grant_before_the_reply_was_read(
    client: Client, server: RedisServer
) -> None:
    sem = client.semaphore("late", 2)
    await sem.available()  # connect first
    task = asyncio.create_task(sem.acquire(2))
    await asyncio.sleep(0)  # the acquire is on the wire
    # Block the loop until the script ran: the reply arrives, unread.
    await eventually(
        lambda: server.execute("EXISTS", "s:{late}:fence") == 1, block_loop=True, what="the script"
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert server.execute("EXISTS", "s:{late}:fence") == 1, "the script did run"
    await assert_clean(client)
    assert_nothing_held(server, "late")


async def test_cancelled_release_still_completes(client: Client, server: RedisServer) -> None:
    permit = await client.semaphore("rel", 1).acquire()
    task = asyncio.create_task(permit.release())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: redis_state(server, "rel")[1] == [], what="released in Redis")
    await permit.release()  # a retry: idempotent
    await assert_clean(client)


async def test_random_cancellation_fuzz_leaves_nothing_behind(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    n = 3
    rng = random.Random(11)
    in_use = 0
    granted = cancelled = 0

    async def contender(c: Client) -> None:
        nonlocal in_use, granted
        sem = c.semaphore("fuzz", n)
        k = rng.choice((1, 1, 2, 3))
        mode = rng.random()
        permit: Permit | None
        if mode < 0.5:
            async with sem(permits=k) as permit:
                in_use += k
                try:
                    assert in_use <= n
                    granted += 1
                    await asyncio.sleep(0)
                finally:
                    in_use -= k
            return
        if mode < 0.8:
            permit = await sem.try_acquire(k, wait=rng.choice([0.0, 0.002, 0.05]))
        else:
            permit = await sem.acquire(k, timeout=rng.choice([0.001, 0.01, 1.0]))
        if permit is not None:
            in_use += k
            assert in_use <= n
            granted += 1
            in_use -= k
            await permit.release()

    cancelled = await cancel_at_random(
        rng, lambda: contender(rng.choice((client, other_client))), rounds=40
    )
    assert granted > 25 and cancelled > 40, (granted, cancelled)
    await assert_clean(client, other_client)
    assert_nothing_held(server, "fuzz")


# --------------------------------------------------------------------------- force release


async def hold_until_lost(sem: Semaphore, permits: int, entered: asyncio.Event) -> BaseException:
    """``async with sem(permits=...)`` until the hold is lost; what it raised."""
    try:
        async with sem(permits=permits):
            entered.set()
            await asyncio.sleep(3600)
    except LockLostError as exc:
        return exc
    raise AssertionError("the body ended without losing its permits")


async def test_force_release_evicts_local_and_remote_holders(
    make_client: Any, server: RedisServer
) -> None:
    # Own Clients (no notify param): the remote holder's loss is seen at its
    # next renewal (every SHORT / 3 s), once per backend only.
    local, remote = (
        await make_client(prefix="s", lease=SHORT),
        await make_client(prefix="s", lease=SHORT),
    )
    sem = local.semaphore("fr", 3)
    await sem.set_permits(5)  # an N that differs from the constructors'
    mine = await sem.acquire(2)
    entered = asyncio.Event()
    theirs = asyncio.create_task(hold_until_lost(remote.semaphore("fr", 3), 3, entered))
    await entered.wait()
    fence = server.execute("HGET", "s:{fr}:fence", "t")
    main_ttl = server.execute("PTTL", "s:{fr}")
    assert await sem.in_use() == 5

    # Any N will do for the call: it writes none.
    assert await local.semaphore("fr", 1).force_release() is True
    assert mine.lost and mine._hold.lost_reason == "force-released", "local: at once"
    assert isinstance(await asyncio.wait_for(theirs, 2 * SHORT), LockLostError)
    assert_nothing_held(server, "fr")
    assert server.execute("HGET", "s:{fr}", "n") == "5", "N unchanged"
    assert server.execute("HGET", "s:{fr}:fence", "t") == fence, "fencing counter kept"
    assert 0 < server.execute("PTTL", "s:{fr}") <= main_ttl, "no expiry moved"
    with pytest.raises(LockNotOwnedError, match="force-released"):
        await mine.release()

    # Free now: False, nothing changes; tokens go on increasing.
    assert await sem.force_release() is False
    assert await remote.semaphore("fr", 3).get_permits() == 5
    again = await sem.acquire(5)
    assert again.fencing_token > mine.fencing_token and not again.lost
    await again.release()
    await assert_clean(local, remote)


async def test_force_release_wakes_waiters_and_spares_later_holders(
    client: Client, other_client: Client, third_client: Client, server: RedisServer
) -> None:
    sem = client.semaphore("frw", 3)
    held = await sem.acquire(3, lease=30)  # a fixed lease, far from expiring
    waiters = [
        asyncio.create_task(c.semaphore("frw", 3).acquire(timeout=20))
        for c in (other_client, third_client, client)
    ]
    await eventually(
        lambda: sum(c.statistics().waiting for c in (client, other_client, third_client)) == 3,
        what="3 parked",
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await sem.force_release() is True
    assert held.lost
    # Woken by the force release (3 permits came free), not by their 30 s bound.
    granted = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert loop.time() - started < 30 / 3
    # This Client's own waiter got a permit after the eviction: it is not lost.
    assert not any(p.lost for p in granted)
    assert await sem.in_use() == 3 and await sem.get_permits() == 3
    for permit in granted:
        await permit.release()
    await assert_clean(client, other_client, third_client)
    assert_nothing_held(server, "frw")


async def test_force_release_refuses_a_foreign_key_and_changes_nothing(
    make_client: Any, server: RedisServer
) -> None:
    client = await make_client(prefix="s", lease=SHORT)
    sem = client.semaphore("frx", 2)
    permit = await sem.acquire(lease=60)
    server.execute("SET", "s:{frx}:signal", "not a list")

    def keyspace() -> list[Any]:
        return [
            server.execute("HGETALL", "s:{frx}"),
            server.execute("ZRANGE", "s:{frx}:h", 0, -1, "WITHSCORES"),
            server.execute("HGETALL", "s:{frx}:fence"),
            server.execute("GET", "s:{frx}:signal"),
            sorted(server.execute("KEYS", "*")),
        ]

    before = keyspace()
    with pytest.raises(WrongTypeError, match=r"s:\{frx\}:signal"):
        await sem.force_release()
    assert keyspace() == before
    assert not permit.lost
    server.execute("DEL", "s:{frx}:signal")
    assert await sem.force_release() is True and permit.lost
    await assert_clean(client)


async def test_force_release_in_cluster_mode(cluster_url: str) -> None:
    async with AsyncExitStack() as stack:

        async def make(lease: float) -> Client:
            client = Client.from_url(cluster_url, cluster=True, prefix="s", lease=lease)
            return await stack.enter_async_context(client)

        # (A watchdog-kept holder elsewhere learns it as in standalone mode: the
        # renewal scripts are the same; see the test above.)
        local, remote, waiting = await make(SHORT), await make(SHORT), await make(30)
        sem = local.semaphore("frc", 2)
        # Fixed 30 s leases: a waiter granted within 10 s was woken by the eviction.
        mine = await sem.acquire(lease=30)
        fixed = await remote.semaphore("frc", 2).acquire(lease=30)
        waiter = asyncio.create_task(waiting.semaphore("frc", 2).acquire(2, timeout=20))
        await eventually(lambda: waiting.statistics().waiting == 1, what="the waiter parked")
        assert await sem.force_release() is True
        assert mine.lost
        # Woken through the master's sharded pub/sub (SPUBLISH).
        got = await asyncio.wait_for(waiter, 10)
        assert got.permits == 2 and not got.lost
        await got.release()
        # A fixed lease elsewhere is not told; its release gives nothing back.
        with pytest.raises(LockNotOwnedError):
            await fixed.release()
        assert await sem.force_release() is False
        assert await sem.in_use() == 0
        await assert_clean(local, remote, waiting)


# --------------------------------------------------------------------------- keys
