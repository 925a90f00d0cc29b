"""Targeted wake-ups and grants of the plain lock across Clients (pub/sub mode).

A release wakes one waiting Client, not every Client that waits: the lock
keeps a set of waiting tasks in Redis, one per Client (see
``scripts/_wake.lua``), and grants the lock to the next one in the release
itself. These tests check that a release wakes exactly one, that the grant
costs no acquire round trip, and that a grant or wake-up aimed at a Client
whose waiter gave up (cancelled, timed out, closed) is passed on at once
rather than waiting for the holder's TTL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from contextlib import AsyncExitStack

import pytest

from aiolock import Client, ClientClosedError, Lease
from aiolock._core.waiting.notify import ListWaiter
from aiolock.testing import seam
from tests.conftest import MakeClient
from tests.core_util import assert_clean, evalsha_calls, eventually, parked_on_channels
from tests.servers import RedisServer, TcpProxy

PREFIX = "wk"
# Long leases: a waiter's own bound (the holder's TTL) is then far longer
# than any wake-up these tests expect, and no renewal runs during a test.
LEASE = 60.0


@pytest.fixture
async def clients(make_client: MakeClient) -> list[Client]:
    made = [await make_client(prefix=PREFIX, lease=LEASE) for _ in range(5)]
    for client in made:  # settled (the capability probe ran): counted scripts are the locks'
        await seam.engine(client).is_cluster()
    return made


def waiting_set(server: RedisServer, name: str) -> list[str]:
    """The ids of the Clients in the lock's waiting set, in the order it wakes them."""
    members = server.execute("ZRANGE", f"{PREFIX}:{{{name}}}:wq", 0, -1)
    return [member.split(":", 1)[0] for member in members]


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
    # The release granted the lock to the woken Client's task in the same
    # script: no acquire round trip, and nobody else woken.
    assert evalsha_calls(server) - before == 1, "one release, no acquire, nobody else woken"
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
    calls = evalsha_calls(server)
    release = asyncio.create_task(held.release())
    await asyncio.sleep(0)  # the release is on the wire
    # Block the loop: Redis runs the release and aims the wake-up at `target` ...
    await eventually(
        lambda: evalsha_calls(server) > calls, block_loop=True, what="the release script"
    )
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
    seam.listener(waiter).LINGER = 60.0  # keep the channel warm however slow the machine
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
    assert waiter.statistics().subscriptions == 0 and seam.listener_channels(waiter)
    before = evalsha_calls(server)
    task = asyncio.create_task(waiter.lock("n").acquire())
    if where == "parked":
        # Parked on its channel: past any confirming retry, which would have run first.
        await eventually(lambda: parked_on_channels(waiter) == 1, what="parked")
        assert waiter.statistics().waiting == 1
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


async def test_a_grant_to_a_task_that_gave_up_goes_to_the_next_local_task(
    clients: list[Client], server: RedisServer
) -> None:
    """The release grants the lock to the Client's head task, which is cancelled
    before it takes it up: the next local task takes the grant over with its
    own try, at once (not after the holder's 60 s TTL), and leaves nothing."""
    holder, waiter = clients[0], clients[1]
    held = await holder.lock("n").acquire()
    before = evalsha_calls(server)
    head = asyncio.create_task(waiter.lock("n").acquire())
    await eventually(lambda: evalsha_calls(server) - before >= 2, what="the head parked")
    behind = asyncio.create_task(waiter.lock("n").acquire())
    await eventually(lambda: waiter.statistics().waiting == 2, what="a second local waiter")
    loop = asyncio.get_running_loop()
    calls = evalsha_calls(server)
    release = asyncio.create_task(held.release())
    await asyncio.sleep(0)  # the release is on the wire
    # Block the loop until Redis ran the release (it grants the lock to `head`).
    await eventually(
        lambda: evalsha_calls(server) > calls, block_loop=True, what="the release script"
    )
    head.cancel()
    started = loop.time()
    await release
    got = await asyncio.wait_for(behind, 20)
    assert loop.time() - started < 10, "taken over at once, not after the 60 s TTL"
    assert head.cancelled()
    assert got.fencing_token > held.fencing_token
    assert waiting_set(server, "n") == []
    await got.release()
    assert server.execute("EXISTS", f"{PREFIX}:{{n}}") == 0
    await assert_clean(*clients)


async def test_a_fixed_lease_waiter_is_woken_not_granted(
    clients: list[Client], server: RedisServer
) -> None:
    """A task that asked for a fixed lease is woken and takes the lock with its
    own try (its lease then runs from a time it knows)."""
    holder, waiter = clients[0], clients[1]
    held = await holder.lock("n").acquire()
    before = evalsha_calls(server)
    task = asyncio.create_task(waiter.lock("n").acquire(lease=30))
    await eventually(lambda: evalsha_calls(server) - before >= 2, what="the waiter parked")
    assert waiting_set(server, "n") == [waiter.id]
    before = evalsha_calls(server)
    await held.release()
    got = await asyncio.wait_for(task, 20)
    assert evalsha_calls(server) - before == 2, "the release, then the woken waiter's try"
    assert 0 < server.execute("PTTL", f"{PREFIX}:{{n}}") <= 30_000
    await got.release()
    await assert_clean(*clients)


async def test_untargeted_waiters_are_woken_after_a_grant(
    url: str, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter that is not in the waiting set (a list-mode Client's) waits
    beside a registered one: the release grants the lock to the registered
    waiter, and that waiter's release then wakes the other at once (the
    grant carried the "someone else waits" flag on)."""
    # A list-mode waiter re-checks every PARK_MAX seconds: make that longer
    # than the test's bound, so only the wake-up can get it going in time.
    monkeypatch.setattr(ListWaiter, "PARK_MAX", 2 * LEASE)
    async with AsyncExitStack() as stack:
        holder, targeted, other = [
            await stack.enter_async_context(
                Client.from_url(url, prefix=PREFIX, lease=LEASE, notify=notify)
            )
            for notify in ("pubsub", "pubsub", "list")
        ]
        held = await holder.lock("n").acquire()
        before = evalsha_calls(server)
        first = asyncio.create_task(targeted.lock("n").acquire())
        await eventually(lambda: evalsha_calls(server) - before >= 2, what="pub/sub waiter parked")
        before = evalsha_calls(server)
        second = asyncio.create_task(other.lock("n").acquire())
        # It tries once, registers, tries again, and once its BLPOP connection
        # is up (which wakes it, as any reconnect does) a third time; then parks.
        await eventually(lambda: "cmd=blpop" in server.execute("CLIENT", "LIST"), what="its BLPOP")
        await eventually(lambda: evalsha_calls(server) - before >= 3, what="list waiter parked")
        assert server.execute("HEXISTS", f"{PREFIX}:{{n}}", "~n") == 1
        await held.release()
        got = await asyncio.wait_for(first, 20)
        assert not second.done()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await got.release()
        last = await asyncio.wait_for(second, 20)
        assert loop.time() - started < 10, "woken by the release, not by the 60 s TTL"
        await last.release()
        await assert_clean(holder, targeted, other)


_CRASHER = """
import asyncio, sys
from aiolock import Client
async def main():
    client = Client.from_url(sys.argv[1], prefix=sys.argv[2], lease=float(sys.argv[3]))
    await client.lock("n").acquire()
asyncio.run(main())
"""


async def test_a_dead_waiting_client_is_skipped(
    clients: list[Client], server: RedisServer, url: str
) -> None:
    """A waiter process killed while first in the waiting set (its entry is
    still live) is not granted the lock: nobody hears its channel, so the
    release passes it over, and the next Client gets the lock at once."""
    holder = clients[0]
    # A longer lease than the dead one's: its entry lapses later, so it is
    # second in the waiting set (entries are ordered by when they lapse).
    survivor = Client.from_url(url, prefix=PREFIX, lease=2 * LEASE)
    held = await holder.lock("n").acquire()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHER, url, PREFIX, str(LEASE), cwd=os.getcwd()
    )
    try:
        await eventually(lambda: len(waiting_set(server, "n")) == 1, timeout=30, what="crasher")
        channel = f"{PREFIX}:{{n}}:w:{waiting_set(server, 'n')[0]}"
        await eventually(
            lambda: server.execute("PUBSUB", "NUMSUB", channel)[1] == 1, what="it listens"
        )
        task = asyncio.create_task(survivor.lock("n").acquire())
        await eventually(lambda: len(waiting_set(server, "n")) == 2, what="the survivor waits")
        assert waiting_set(server, "n")[1] == survivor.id, "the dead one comes first"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    await eventually(
        lambda: server.execute("PUBSUB", "NUMSUB", channel)[1] == 0, what="its channel gone"
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    await held.release()
    got = await asyncio.wait_for(task, 20)
    assert loop.time() - started < 10, "granted at once, not after the dead one's 60 s"
    assert waiting_set(server, "n") == []
    await got.release()
    assert server.execute("EXISTS", f"{PREFIX}:{{n}}") == 0
    await survivor.aclose()
    await assert_clean(*clients, survivor)


async def test_a_grant_lost_with_its_connection_is_taken_up_after_reconnecting(
    proxy: TcpProxy, server: RedisServer, url: str
) -> None:
    """Redis grants the lock to a waiter whose connections are black-holed, so
    the grant's message never arrives; the connections are then reset. Once
    they are back, the waiter's resynchronising try takes the grant up (the
    same attempt: idempotent), instead of waiting out the 60 s lease."""
    async with (
        Client.from_url(url, prefix=PREFIX, lease=LEASE) as holder,
        Client.from_url(proxy.url, prefix=PREFIX, lease=LEASE) as waiter,
    ):
        held = await holder.lock("n").acquire()
        task = asyncio.create_task(waiter.lock("n").acquire())
        await eventually(lambda: waiting_set(server, "n") == [waiter.id], what="registered")
        channel = f"{PREFIX}:{{n}}:w:{waiter.id}"
        await eventually(
            lambda: server.execute("PUBSUB", "NUMSUB", channel)[1] == 1, what="it listens"
        )
        proxy.blackhole()
        await held.release()
        owners = [f for f in server.execute("HKEYS", f"{PREFIX}:{{n}}") if not f.startswith("~")]
        assert [o.split(":", 1)[0] for o in owners] == [waiter.id], "granted to the waiter"
        proxy.cut()
        await asyncio.sleep(0.2)
        assert not task.done()
        loop = asyncio.get_running_loop()
        started = loop.time()
        proxy.restore()
        got = await asyncio.wait_for(task, 30)
        assert loop.time() - started < 15, "taken up after reconnecting, not after the lease"
        assert got.fencing_token > held.fencing_token
        await got.release()
        assert server.execute("EXISTS", f"{PREFIX}:{{n}}") == 0
        await assert_clean(holder, waiter)
