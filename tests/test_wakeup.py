"""Targeted wake-ups of the plain lock across Clients (pub/sub mode).

A release wakes one waiting Client, not every Client that waits: the lock
keeps a set of waiting Clients in Redis (see ``scripts/_wake.lua``). These
tests check that a release wakes exactly one, and that a wake-up aimed at a
Client whose waiter gave up (cancelled, timed out, closed) is passed on at
once rather than waiting for the holder's TTL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from aiolock import Client, ClientClosedError, Lease
from tests.core_util import assert_clean, evalsha_calls, eventually
from tests.servers import RedisServer

PREFIX = "wk"
# Long leases: a waiter's own bound (the holder's TTL) is then far longer
# than any wake-up these tests expect, and no renewal runs during a test.
LEASE = 60.0


@pytest.fixture
async def clients(url: str) -> AsyncIterator[list[Client]]:
    async with AsyncExitStack() as stack:
        made = [
            await stack.enter_async_context(Client.from_url(url, prefix=PREFIX, lease=LEASE))
            for _ in range(5)
        ]
        yield made


def waiting_set(server: RedisServer, name: str) -> list[str]:
    return list(server.execute("ZRANGE", f"{PREFIX}:{{{name}}}:wq", 0, -1))


async def park(clients: list[Client], server: RedisServer) -> list[asyncio.Task[Lease]]:
    """One waiting task per Client on lock "n", each registered in Redis and parked.

    Each waiter tries twice (once, then again once its subscription is
    confirmed) and then parks: the count of script calls tells when all have.
    """
    before = evalsha_calls(server)
    tasks = [asyncio.create_task(c.lock("n").acquire()) for c in clients]
    await eventually(
        lambda: evalsha_calls(server) - before >= 2 * len(clients), what="every waiter parked"
    )
    assert set(waiting_set(server, "n")) == {c.id for c in clients}
    assert all(c.statistics().waiting == 1 for c in clients)
    return tasks


async def serve_all(lease: Lease, pending: set[asyncio.Task[Lease]]) -> None:
    """Release, and let the waiters take the lock one after another (in any order)."""
    while pending:
        await lease.release()
        done, pending = await asyncio.wait(pending, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "each release woke one Client"
        lease = done.pop().result()
    await lease.release()


async def test_a_release_wakes_exactly_one_waiting_client(
    clients: list[Client], server: RedisServer
) -> None:
    holder, *waiters = clients
    held = await holder.lock("n").acquire()
    tasks = await park(waiters, server)
    before = evalsha_calls(server)
    await held.release()
    done, pending = await asyncio.wait(tasks, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1, "the release woke one waiter"
    # Give a herd time to show itself: any other woken Client would try now.
    await asyncio.sleep(0.5)
    assert evalsha_calls(server) - before == 2, "one release, one acquire: nobody else woken"
    assert all(not t.done() for t in pending)
    assert len(waiting_set(server, "n")) == len(waiters) - 1
    # Each later release wakes the next Client, until none waits.
    await serve_all(done.pop().result(), pending)
    assert waiting_set(server, "n") == []
    assert server.execute("KEYS", f"{PREFIX}:{{n}}:wq") == []
    await assert_clean(*clients)


async def _first_registered(clients: list[Client], server: RedisServer) -> int:
    first = waiting_set(server, "n")[0]
    return next(i for i, c in enumerate(clients) if c.id == first)


async def test_a_cancelled_waiter_leaves_the_waiting_set(
    clients: list[Client], server: RedisServer
) -> None:
    holder, *waiters = clients
    held = await holder.lock("n").acquire()
    tasks = await park(waiters, server)
    i = await _first_registered(waiters, server)
    tasks[i].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[i]
    await eventually(lambda: waiters[i].id not in waiting_set(server, "n"), what="it left")
    await held.release()
    rest = [t for k, t in enumerate(tasks) if k != i]
    done, pending = await asyncio.wait(rest, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1, "the release woke a Client that still waits"
    await serve_all(done.pop().result(), pending)
    assert waiting_set(server, "n") == []
    await assert_clean(*clients)


@pytest.mark.parametrize("how", ["cancelled", "closed"])
async def test_a_wake_up_aimed_at_a_client_that_gave_up_is_passed_on(
    clients: list[Client], server: RedisServer, how: str
) -> None:
    """The release targets the first Client, which gives up before it can try:
    the next Client gets the lock at once, not after the holder's 60 s TTL."""
    holder, *waiters = clients
    held = await holder.lock("n").acquire()
    tasks = await park(waiters, server)
    i = await _first_registered(waiters, server)
    target = waiters[i]
    loop = asyncio.get_running_loop()
    release = asyncio.create_task(held.release())
    await asyncio.sleep(0)  # the release is on the wire
    # Block the loop: Redis runs the release and aims the wake-up at `target` ...
    time.sleep(0.1)  # noqa: ASYNC251
    # ... which gives up before it could try.
    if how == "cancelled":
        tasks[i].cancel()
    else:
        await target.aclose()
    started = loop.time()
    await release
    rest = [t for k, t in enumerate(tasks) if k != i]
    done, pending = await asyncio.wait(rest, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1, "the wake-up was passed on to another Client"
    assert loop.time() - started < 10, "woken by the pass-on, not by the 60 s TTL"
    with pytest.raises(BaseException) as gave_up:
        await tasks[i]
    assert isinstance(gave_up.value, asyncio.CancelledError | ClientClosedError)
    await serve_all(done.pop().result(), pending)
    assert waiting_set(server, "n") == []
    await assert_clean(*(c for c in clients if c is not target))


async def test_cancelling_every_local_waiter_at_once_leaves_the_waiting_set(
    clients: list[Client], server: RedisServer
) -> None:
    """All tasks of a Client waiting on a name are cancelled together: the
    head's turn passes to tasks that are already cancelled, and the last one
    out takes the Client out of the waiting set."""
    holder, waiter = clients[0], clients[1]
    held = await holder.lock("n").acquire()
    before = evalsha_calls(server)
    tasks = [asyncio.create_task(waiter.lock("n").acquire()) for _ in range(50)]
    await eventually(lambda: evalsha_calls(server) - before >= 2, what="the head parked")
    assert waiting_set(server, "n") == [waiter.id]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(task.cancelled() for task in tasks)
    await eventually(lambda: waiting_set(server, "n") == [], what="the Client left the set")
    assert server.execute("EXISTS", f"{PREFIX}:{{n}}:wq") == 0
    await held.release()
    await assert_clean(*clients)


@pytest.mark.parametrize("where", ["parked", "first try in flight"])
async def test_a_warm_waiter_cancelled_leaves_nothing(
    clients: list[Client], server: RedisServer, where: str
) -> None:
    """A waiter whose channel is still subscribed from an earlier wait parks
    after one try (no confirming retry); cancelled while parked or during that
    try, it leaves no registration, subscription or waiting-set entry."""
    holder, waiter = clients[0], clients[1]
    waiter._listener.LINGER = 60.0  # keep the channel warm however slow the machine
    held = await holder.lock("n").acquire()
    first = asyncio.create_task(waiter.lock("n").acquire())
    await eventually(lambda: waiting_set(server, "n") == [waiter.id], what="a waiter")
    await held.release()
    lease = await asyncio.wait_for(first, 20)
    behind = asyncio.create_task(holder.lock("n").acquire())
    await eventually(lambda: holder.statistics().waiting == 1, what="the holder waiting")
    await lease.release()
    held = await asyncio.wait_for(behind, 20)
    # The waiter's channel lingers, subscribed: the next wait starts warm.
    assert waiter.statistics().subscriptions == 0 and waiter._listener.channels
    before = evalsha_calls(server)
    task = asyncio.create_task(waiter.lock("n").acquire())
    if where == "parked":
        await eventually(lambda: waiter.statistics().waiting == 1, what="parked")
        await asyncio.sleep(0.2)  # a confirming retry, if any, would run now
        assert evalsha_calls(server) - before == 1, "parked after one try"
        assert waiting_set(server, "n") == [waiter.id]
    else:
        await asyncio.sleep(0)  # the first try is on the wire
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: waiting_set(server, "n") == [], what="the waiter left the set")
    assert waiter.statistics().subscriptions == 0 and waiter.statistics().waiting == 0
    await held.release()
    assert server.execute("EXISTS", f"{PREFIX}:{{n}}:wq") == 0
    await assert_clean(*clients)
