"""FairLock: strict FIFO across Clients, handoffs, crashed and live waiters, cancellation.

Every test runs against both servers and, unless it is about messages, under
every notify mode ("pubsub", "list", "poll"). Clients stand for processes;
the crashed waiter is a real process, killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import sys
import time
from typing import Any

import pytest

from aiolock import (
    Backoff,
    Client,
    ClientClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Lease,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
)
from aiolock._core.waiting.listener import WAKE_ALL, Channel
from aiolock._core.waiting.notify import ListWaiter
from aiolock._primitives.fair import FairLock, _FairState
from aiolock.testing import seam
from tests.conftest import MakeClient
from tests.core_util import (
    Exclusive,
    assert_clean,
    assert_refuses_bad_arguments,
    blocked_clients,
    cancel_at_random,
    eventually,
    pubsub_subscribers,
    use_exclusively,
)
from tests.servers import RedisServer

PREFIX = "f"
#: Poll-mode waiters notice a handoff within this (the default caps at 0.5 s).
FAST_POLL = Backoff(initial=0.002, maximum=0.05)
#: The shortest lease of a Client whose watchdog must keep a hold or a queue
#: entry alive: renewed every 1.5 s, it survives 3 s of scheduling stall (a
#: loaded 2-core machine). Tests that need a lease to run out use a fixed one,
#: or wait for it with a bound derived from it.
SHORT = 4.5


@pytest.fixture
def make(make_client: MakeClient, notify: str) -> MakeClient:
    """``await make(lease=...)``: a started Client (one "process"), closed after the test."""
    return functools.partial(
        make_client, prefix=PREFIX, lease=30.0, notify=notify, backoff=FAST_POLL
    )


@pytest.fixture
async def clients(make: MakeClient) -> list[Client]:
    return [await make() for _ in range(3)]


def queued(server: RedisServer, name: str) -> list[str]:
    """The waiter ids queued in Redis for ``name``, in order."""
    entries: list[str] = server.execute("ZRANGEBYSCORE", f"{PREFIX}:{{{name}}}:q", 1, "+inf")
    return entries


async def enqueue(lock: FairLock, coro: Any, count: int) -> asyncio.Task[Any]:
    """Start ``coro`` as a task and wait until the queue holds ``count`` entries."""
    task = asyncio.create_task(coro)
    await queue_reaches(lock, count)
    return task


async def queue_reaches(lock: FairLock, count: int, *, timeout: float = 10.0) -> None:
    """Wait until the queue of ``lock`` holds exactly ``count`` entries."""

    async def reached() -> bool:
        return await lock.queue_length() == count

    await eventually(reached, timeout=timeout, what=f"{count} entries in the queue")


def parked(client: Client) -> int:
    """Waiting calls of ``client`` parked right now: past their confirming
    retry, waiting for a message or their bound."""
    return sum(
        1
        for state in seam.local_states(client).values()
        if isinstance(state, _FairState)
        for _ in state.lot  # (the live entries: tickets parked right now)
    )


def assert_no_keys(server: RedisServer, name: str) -> None:
    """Nothing of ``name`` is left but the fence counter (and expiring signal lists)."""
    keys = set(server.execute("KEYS", f"{PREFIX}:{{{name}}}*"))
    keys.discard(f"{PREFIX}:{{{name}}}:fence")
    for key in list(keys):
        if ":sig:" in key:  # list mode: a message nobody popped any more; it expires
            assert 0 < int(server.execute("PTTL", key)) <= 60_000, key
            keys.discard(key)
    assert not keys, f"keys left behind: {sorted(keys)}"


# --------------------------------------------------------------------------- the API


async def test_acquire_release_queries_and_tokens(
    clients: list[Client], server: RedisServer
) -> None:
    a, b, _ = clients
    lock = a.fair_lock("api")
    assert isinstance(lock, FairLock)
    lease = await lock.acquire()
    assert isinstance(lease, Lease) and lease.name == "api" and not lease.lost
    assert await lock.is_locked() and await lock.is_owned()
    assert await lock.hold_count() == 1
    ttl = await lock.remaining_ttl()
    assert ttl is not None and 0 < ttl <= a.lease
    assert await b.fair_lock("api").try_acquire() is None  # no waiting: no queue entry
    assert not await b.fair_lock("api").is_owned()
    assert server.execute("EXISTS", f"{PREFIX}:{{api}}:q") == 0
    assert "api" in repr(lock)
    await lock.release()
    assert not await lock.is_locked() and await lock.remaining_ttl() is None
    with pytest.raises(LockNotOwnedError):
        await lock.release()
    second = await b.fair_lock("api").acquire()
    assert second.fencing_token > lease.fencing_token
    assert await a.fair_lock("api").force_release()
    assert not await a.fair_lock("api").force_release()
    with pytest.raises(LockNotOwnedError):
        await second.release()  # evicted: its release finds the hold gone
    assert second.lost
    third = await a.fair_lock("api").acquire(lease=15)
    assert third.fencing_token > second.fencing_token
    ttl = await lock.remaining_ttl()
    assert ttl is not None and 5 < ttl <= 15  # its own lease, not the Client's 30 s
    await third.release()
    await assert_clean(*clients)
    assert_no_keys(server, "api")


async def test_reentrant_per_task(clients: list[Client], server: RedisServer) -> None:
    a, b, _ = clients
    lock = a.fair_lock("re")
    async with lock as outer:
        async with lock as inner:  # no round trip, no queueing
            assert inner.fencing_token == outer.fencing_token
            assert await lock.hold_count() == 2
            assert server.execute("EXISTS", f"{PREFIX}:{{re}}:q") == 0
        assert await lock.hold_count() == 1
        assert await lock.is_owned()
        assert await b.fair_lock("re").try_acquire() is None
    assert await lock.hold_count() == 0
    lease = await b.fair_lock("re").try_acquire()
    assert lease is not None
    await lease.release()
    await assert_clean(*clients)


async def test_decorator_and_options(clients: list[Client]) -> None:
    a, b, _ = clients
    lock = a.fair_lock("deco")
    seen: list[int] = []

    @lock
    async def guarded(i: int) -> int:
        seen.append(i)
        return i

    assert await guarded(3) == 3
    async with lock(timeout=1, lease=20) as lease:
        ttl = await lock.remaining_ttl()
        assert ttl is not None and ttl <= 20
        with pytest.raises(LockTimeoutError):
            await b.fair_lock("deco").acquire(timeout=0.1)
        assert not lease.lost
    assert seen == [3]
    await assert_clean(*clients)


async def test_bad_input_is_refused_before_any_round_trip(url: str) -> None:
    async with Client.from_url(url, prefix=PREFIX) as client:
        with pytest.raises(InvalidArgumentError):
            client.fair_lock("")
        with pytest.raises(InvalidArgumentTypeError):
            client.fair_lock(7)  # type: ignore[arg-type]
        await assert_refuses_bad_arguments(client.fair_lock("bad"))
        assert client.statistics().command_connects == 0


# --------------------------------------------------------------------------- fairness


async def test_strict_fifo_across_clients(clients: list[Client], server: RedisServer) -> None:
    """Tasks queued in a known order, over three Clients, acquire in exactly that order."""
    locks = [c.fair_lock("fifo") for c in clients]
    holder = await locks[0].acquire()
    order: list[int] = []
    tokens: list[int] = []

    async def contender(i: int) -> None:
        async with locks[i % 3] as lease:
            order.append(i)
            tokens.append(lease.fencing_token)
            await asyncio.sleep(0.001)

    tasks = [await enqueue(locks[0], contender(i), i + 1) for i in range(9)]
    # A burst from one Client, created back to back: pipelined, they keep their order.
    tasks += [asyncio.create_task(contender(9 + 3 * k)) for k in range(4)]
    await queue_reaches(locks[0], 13)
    assert [w.split(":")[0] for w in queued(server, "fifo")][:3] == [c.id for c in clients]
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert order == [*range(9), 9, 12, 15, 18]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert tokens[0] > holder.fencing_token
    await assert_clean(*clients)
    assert_no_keys(server, "fifo")


async def test_free_lock_is_not_taken_past_a_waiter(
    clients: list[Client], server: RedisServer
) -> None:
    """The hold vanished (as if expired); a newcomer finds the lock free but a waiter first."""
    a, b, c = clients
    holder = await a.fair_lock("nb").acquire()
    waiter = await enqueue(a.fair_lock("nb"), b.fair_lock("nb").acquire(), 1)
    server.execute("DEL", f"{PREFIX}:{{nb}}")  # the holder's hold is gone
    started = time.monotonic()
    assert await c.fair_lock("nb").try_acquire() is None  # ... and hands it to the waiter
    lease = await asyncio.wait_for(waiter, 10)
    # Handed over by the newcomer's script, not found by the waiter's bound (30 s).
    assert time.monotonic() - started < b.lease / 3
    await lease.release()
    with pytest.raises(LockNotOwnedError):
        await holder.release()
    await assert_clean(*clients)


@pytest.mark.parametrize("notify", ["pubsub", "list"])  # "poll" sends no messages at all
async def test_handoff_wakes_only_the_next_waiter(
    make: MakeClient, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One handoff costs the same two scripts with 1 or 20 waiters over 4 Clients."""
    # No watchdog round and no list-mode self-check (every PARK_MAX) may fall
    # into the measured window, however slowly a loaded machine gets through it.
    monkeypatch.setattr(ListWaiter, "PARK_MAX", 600.0)
    clients = [await make(lease=600) for _ in range(4)]
    locks = [c.fair_lock("cost") for c in clients]

    async def one_handoff(waiting: int) -> dict[str, int]:
        holder = await locks[0].acquire()
        got = [asyncio.Event() for _ in range(waiting)]
        go = asyncio.Event()

        async def waiter(i: int) -> None:
            lease = await locks[i % 4].acquire()
            got[i].set()
            await go.wait()
            await lease.release()

        tasks = [asyncio.create_task(waiter(i)) for i in range(waiting)]
        await queue_reaches(locks[0], waiting)
        waiting_clients = clients[: min(waiting, 4)]

        def all_parked() -> bool:  # every waiter parked, every subscription / BLPOP live
            if sum(parked(c) for c in clients) != waiting:
                return False
            if any(c.statistics().in_flight for c in clients):
                return False
            if clients[0].notify == "list":
                return blocked_clients(server) >= len(waiting_clients)
            return all(
                pubsub_subscribers(server, f"{PREFIX}:{{cost}}:ch:{c.id}") == 1
                for c in waiting_clients
            )

        await eventually(all_parked, what="every waiter parked")
        server.execute("CONFIG", "RESETSTAT")
        await holder.release()
        await asyncio.wait_for(got[0].wait(), 10)
        await asyncio.sleep(0.05)  # whatever else would happen, happens now
        stats = server.info("commandstats")
        assert not any(e.is_set() for e in got[1:]), "only the next waiter got it"
        go.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}

    few, many = await one_handoff(1), await one_handoff(20)
    # The release script, then the next waiter's confirmation: nobody else runs anything.
    assert few["evalsha"] == many["evalsha"] == 2, (few, many)
    sent = "publish" if clients[0].notify == "pubsub" else "rpush"
    assert few[sent] == 1  # the handoff message, to the next waiter's Client only
    assert many[sent] == 2  # ... and "check back by then" to the next other Client
    await assert_clean(*clients)


async def test_many_local_waiters_cost_one_subscription_and_one_renewal(
    make: MakeClient,
) -> None:
    a, b = await make(), await make(lease=SHORT)
    holder = await a.fair_lock("crowd").acquire()
    tasks = [asyncio.create_task(b.fair_lock("crowd").acquire()) for _ in range(30)]
    await queue_reaches(a.fair_lock("crowd"), 30)
    await eventually(lambda: b.statistics().waiting == 30, what="30 waiters queued")
    stats = b.statistics()
    assert stats.waiting == 30 and stats.watched == 1
    assert stats.subscriptions == (0 if b.notify == "poll" else 1)
    calls, rounds = seam.watchdog_calls(b), seam.watchdog_rounds(b)
    await eventually(lambda: seam.watchdog_rounds(b) >= rounds + 3, what="3 renewal rounds")
    assert (seam.watchdog_calls(b) - calls) / (seam.watchdog_rounds(b) - rounds) <= 1.5
    await holder.release()
    lease = await asyncio.wait_for(tasks[0], 10)
    for task in tasks[1:]:
        task.cancel()
    await lease.release()
    await assert_clean(a, b)


# ------------------------------------------------------------------ dead and patient waiters

_CRASHER = """
import asyncio, sys
from aiolock import Client
async def main():
    client = Client.from_url(sys.argv[1], prefix=sys.argv[2], lease=float(sys.argv[3]),
                             notify=sys.argv[4])
    await client.fair_lock("crash").acquire(lease=60)
asyncio.run(main())
"""


async def test_crashed_waiter_delays_the_queue_at_most_one_lease(
    make: MakeClient, server: RedisServer, url: str
) -> None:
    """A waiter process killed while queued (asking a 60 s lease) costs about one lease.

    The release comes right after the kill, while the dead Client's entries
    still count as live, so the lock is handed to the dead waiter: the worst case.
    """
    # Long enough that the crasher's watchdog keeps its entry alive through
    # scheduling stalls until the kill, short enough for a quick test.
    lease = 6.0
    # The holder's Client has a long lease: the survivor's own bound (the holder's
    # TTL) is then 30 s, and only the "check back" message gets it going in time.
    a, b = await make(lease=30), await make(lease=lease)
    lock = a.fair_lock("crash")
    holder = await lock.acquire()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHER, url, PREFIX, str(lease), a.notify, cwd=os.getcwd()
    )
    try:
        await queue_reaches(lock, 1, timeout=20)
        survivor = await enqueue(lock, b.fair_lock("crash").acquire(), 2)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    started = time.monotonic()
    await holder.release()  # handed to the dead waiter (its entries are still live)
    owners = [k for k in server.execute("HKEYS", f"{PREFIX}:{{crash}}") if k != "~fence"]
    assert len(owners) == 1 and not owners[0].startswith((a.id, b.id)), owners  # the worst case
    got = await asyncio.wait_for(survivor, 10)
    elapsed = time.monotonic() - started
    # Redisson would stall here for the dead waiter's wait timeout (5 minutes).
    # About one lease; the slack is for a loaded machine, not for a second lease.
    assert elapsed < lease + 3, f"the queue stalled {elapsed:.2f} s for a dead waiter"
    assert elapsed > lease / 2  # the dead waiter's hold did run out first
    assert got.fencing_token > holder.fencing_token
    await got.release()
    await assert_clean(a, b)
    await eventually(lambda: server.execute("EXISTS", f"{PREFIX}:{{crash}}:q") == 0)


async def test_live_waiter_is_never_dropped(make: MakeClient, server: RedisServer) -> None:
    """Waiting for many leases: the watchdog keeps the entries alive, the order holds."""
    lease = SHORT
    a, b, c = await make(), await make(lease=lease), await make(lease=lease)
    lock = a.fair_lock("patient")
    holder = await lock.acquire()
    first = await enqueue(lock, b.fair_lock("patient").acquire(), 1)
    second = await enqueue(lock, c.fair_lock("patient").acquire(), 2)
    entries = queued(server, "patient")
    await asyncio.sleep(2 * lease)  # unrenewed, the entries would be gone by now
    assert queued(server, "patient") == entries  # nobody dropped, nobody re-queued
    assert not first.done() and not second.done()
    await holder.release()
    lease1 = await asyncio.wait_for(first, 10)
    assert not second.done()
    await lease1.release()
    lease2 = await asyncio.wait_for(second, 10)
    assert lease2.fencing_token > lease1.fencing_token > holder.fencing_token
    await lease2.release()
    await assert_clean(a, b, c)


async def test_waiter_queues_up_again_if_its_entry_vanished(
    make: MakeClient, server: RedisServer
) -> None:
    a, b = await make(), await make(lease=SHORT)
    lock = a.fair_lock("lapse")
    holder = await lock.acquire()
    waiter = await enqueue(lock, b.fair_lock("lapse").acquire(), 1)
    server.execute("DEL", f"{PREFIX}:{{lapse}}:q")  # as if its liveness had lapsed
    await queue_reaches(lock, 1)  # the watchdog saw it: queued again
    await holder.release()
    got = await asyncio.wait_for(waiter, 10)
    await got.release()
    await assert_clean(a, b)


@pytest.mark.parametrize("notify", ["pubsub", "list"])  # "poll" has no connection to lose
async def test_handoff_message_lost_in_a_reconnect_is_not_waited_out(
    clients: list[Client], server: RedisServer
) -> None:
    """The waiter's notification connection drops around the handoff: it still goes on.

    On reconnecting, the listener (or BLPOP loop) wakes every waiter of the
    Client, which then confirms the handoff: no waiting out the 30 s bound.
    """
    a, b, _ = clients
    lock = a.fair_lock("drop")
    holder = await lock.acquire()
    waiter = await enqueue(lock, b.fair_lock("drop").acquire(), 1)
    if b.notify == "pubsub":  # parked on a live subscription / BLPOP
        channel = f"{PREFIX}:{{drop}}:ch:{b.id}"
        await eventually(lambda: pubsub_subscribers(server, channel) == 1, what="subscribed")
    else:
        await eventually(lambda: blocked_clients(server) >= 1, what="BLPOP parked")
    if b.notify == "pubsub":
        assert server.kill_pubsub_clients() >= 1
    else:
        assert server.kill_normal_clients() >= 1
    started = time.monotonic()
    await holder.release()
    got = await asyncio.wait_for(waiter, 10)
    assert time.monotonic() - started < b.lease / 3  # not the waiter's 30 s bound
    await got.release()
    await assert_clean(*clients)


# --------------------------------------------------------------------------- leaving


async def test_cancelled_waiter_leaves_the_queue_at_once(
    clients: list[Client], server: RedisServer
) -> None:
    a, b, c = clients
    lock = a.fair_lock("leave")
    holder = await lock.acquire()
    w1 = await enqueue(lock, b.fair_lock("leave").acquire(), 1)
    w2 = await enqueue(lock, c.fair_lock("leave").acquire(), 2)
    w3 = await enqueue(lock, b.fair_lock("leave").acquire(), 3)
    gone = queued(server, "leave")[1]
    w2.cancel()
    started = time.monotonic()
    await queue_reaches(lock, 2)
    assert time.monotonic() - started < a.lease / 3  # not after a lease (30 s)
    assert gone not in queued(server, "leave")
    await holder.release()
    lease1 = await asyncio.wait_for(w1, 10)
    await lease1.release()
    lease3 = await asyncio.wait_for(w3, 10)
    assert w2.cancelled()
    w4 = await enqueue(lock, c.fair_lock("leave").acquire(), 1)
    w4.cancel()
    await eventually(lambda: server.execute("EXISTS", f"{PREFIX}:{{leave}}:q") == 0)
    await lease3.release()
    await assert_clean(*clients)
    assert_no_keys(server, "leave")


async def test_waiter_cancelled_after_the_handoff_passes_the_lock_on(
    clients: list[Client], server: RedisServer
) -> None:
    a, b, c = clients
    lock = a.fair_lock("pass")
    holder = await lock.acquire()
    first = await enqueue(lock, b.fair_lock("pass").acquire(), 1)
    second = await enqueue(lock, c.fair_lock("pass").acquire(), 2)
    release = asyncio.create_task(holder.release())
    await asyncio.sleep(0)  # the release is on the wire
    # Block the loop until Redis has handed the lock to `first` (a token issued) ...
    fence = f"{PREFIX}:{{pass}}:fence"
    await eventually(
        lambda: int(server.execute("HGET", fence, "t")) > holder.fencing_token,
        block_loop=True,
        what="a token issued to `first`",
    )
    first.cancel()  # ... which gives up before it could confirm it
    started = time.monotonic()
    await release
    lease = await asyncio.wait_for(second, 10)
    assert time.monotonic() - started < a.lease / 3  # passed on, not expired (30 s lease)
    assert first.cancelled()
    # `first` did hold it in between: its token was issued, then released by its leave.
    released = int(server.execute("HGET", f"{PREFIX}:{{pass}}:fence", "r"))
    assert holder.fencing_token < released < lease.fencing_token
    await lease.release()
    await assert_clean(*clients)


async def test_cancel_after_grant_before_reply_read(
    clients: list[Client], server: RedisServer
) -> None:
    """Redis granted the lock, the task was cancelled before reading the reply."""
    a, b, _ = clients
    lock = a.fair_lock("late")
    await lock.is_locked()  # connect first
    task = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)  # the script is on the wire
    # Block the loop until Redis granted it: the reply arrives, unread.
    await eventually(
        lambda: server.execute("EXISTS", f"{PREFIX}:{{late}}") == 1,
        block_loop=True,
        what="the grant",
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    lease = await asyncio.wait_for(b.fair_lock("late").acquire(), 10)
    assert lease.fencing_token > int(server.execute("HGET", f"{PREFIX}:{{late}}:fence", "r"))
    await lease.release()
    await assert_clean(*clients)
    assert_no_keys(server, "late")


async def test_timeouts_leave_no_entry(clients: list[Client], server: RedisServer) -> None:
    a, b, _ = clients
    holder = await a.fair_lock("to").acquire()
    with pytest.raises(LockTimeoutError):
        await b.fair_lock("to").acquire(timeout=0.2)
    assert await b.fair_lock("to").try_acquire(0.1) is None
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await b.fair_lock("to").acquire()
    await eventually(lambda: server.execute("EXISTS", f"{PREFIX}:{{to}}:q") == 0)
    await assert_clean(b)
    await holder.release()
    await assert_clean(*clients)
    assert_no_keys(server, "to")


async def test_closing_a_client_takes_its_waiters_out(
    make: MakeClient, server: RedisServer
) -> None:
    a, b, c = await make(), await make(), await make()
    lock = a.fair_lock("close")
    holder = await lock.acquire()
    doomed = await enqueue(lock, b.fair_lock("close").acquire(), 1)
    later = await enqueue(lock, c.fair_lock("close").acquire(), 2)
    await b.aclose()
    with pytest.raises(ClientClosedError):
        await doomed
    await queue_reaches(c.fair_lock("close"), 1)
    await a.aclose()  # the holder's Client: its hold is released, and handed on
    assert holder.lost
    lease = await asyncio.wait_for(later, a.lease / 3)  # at once, not after a 30 s lease
    await lease.release()
    await assert_clean(c)
    assert_no_keys(server, "close")


# --------------------------------------------------------------------------- leases


async def test_lost_lease_cancels_the_body_and_the_next_waiter_gets_it(
    make: MakeClient,
) -> None:
    a, b, c = await make(lease=SHORT), await make(lease=SHORT), await make()
    lock = a.fair_lock("lost")
    reached_end = False
    next_up = None
    with pytest.raises(LockLostError):
        async with lock as lease:
            next_up = await enqueue(lock, b.fair_lock("lost").acquire(), 1)
            assert await c.fair_lock("lost").force_release()  # ... handed to b's waiter
            await asyncio.sleep(30)  # cancelled within one renewal interval (1.5 s)
            reached_end = True
    assert not reached_end and lease.lost
    assert next_up is not None
    got = await asyncio.wait_for(next_up, 10)
    assert got.fencing_token > lease.fencing_token
    await got.release()
    await assert_clean(a, b, c)


async def test_fixed_lease_expires_and_the_queue_moves_on(make: MakeClient) -> None:
    a, b, c = await make(), await make(lease=SHORT), await make()
    lock = a.fair_lock("fixed")
    # Both queue behind c's hold first: the fixed lease starts when the lock is
    # handed to a, with b already queued behind it, however long queueing took.
    first = await c.fair_lock("fixed").acquire()
    reached_end = False

    async def hold_until_lost() -> None:
        nonlocal reached_end
        async with lock(lease=3):
            await asyncio.sleep(30)
            reached_end = True

    holder = await enqueue(lock, hold_until_lost(), 1)
    waiter = await enqueue(lock, b.fair_lock("fixed").acquire(lease=60), 2)
    await first.release()  # handed to a; its fixed lease runs out, unreleased
    with pytest.raises(LockLostError, match="fixed lease"):
        await holder
    assert not reached_end
    got = await asyncio.wait_for(waiter, 10)
    ttl = await lock.remaining_ttl()
    # The waiter's own fixed lease once confirmed: not the grace (its Client's 4.5 s).
    assert ttl is not None and 50 < ttl <= 60
    await got.release()
    await assert_clean(a, b, c)


# --------------------------------------------------------------------------- fuzz


async def test_random_cancellation_fuzz(clients: list[Client], server: RedisServer) -> None:
    """Cancel acquires and bodies at random points; nothing may be left behind.

    Mutual exclusion holds throughout; every delivered cancellation ends its
    task cancelled; afterwards no hold, queue entry, waiter, subscription,
    renewal or key is left (list-mode signal lists expire by themselves).
    """
    rng = random.Random(4)
    section = Exclusive()

    async def contender(client: Client) -> None:
        await use_exclusively(client.fair_lock("fuzz"), rng, section)

    cancelled = await cancel_at_random(rng, lambda: contender(rng.choice(clients)), rounds=20)
    assert section.entered > 20 and cancelled > 20, (section.entered, cancelled)
    await assert_clean(*clients)
    assert server.execute("EXISTS", f"{PREFIX}:{{fuzz}}") == 0
    await eventually(lambda: server.execute("EXISTS", f"{PREFIX}:{{fuzz}}:q") == 0)
    assert_no_keys(server, "fuzz")


# --------------------------------------------------------------------------- pure


def test_channel_handler_gets_messages_and_resync() -> None:
    async def main() -> None:
        seen: list[bytes] = []
        channel = Channel(b"ch")
        channel.refs = 1
        channel.handler = seen.append
        channel.wake(b"abc:1:2:3:4:p")
        channel.wake_all()
        assert seen == [b"abc:1:2:3:4:p", WAKE_ALL]
        assert await channel.wait(0.01) is False  # nothing went to the parking lot

    asyncio.run(main())
