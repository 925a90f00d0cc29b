"""Leader election (``client.election(name)``, issue 24 item 1), on real servers.

Two Clients stand for two processes. Every wait is on an event (a task's
end, an observer's next value, a registration); the few time bounds are
multiples of the lease of the Client whose loss is awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from aiolock import (
    Client,
    Election,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Leader,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    Term,
)
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually
from tests.sentinel_servers import SERVICE, SentinelSet
from tests.servers import TcpProxy

#: The lease of a Client whose leader is cut off: its loss comes within it.
LEASE = 1.0
#: How long, at most, a loss or a succession may take on a busy machine: many
#: leases (the hold's TTL is at most one lease when it is cut off).
BOUND = 10 * LEASE


class Watch:
    """An ``observe()`` iterator run in a task: ``await next()`` is its next value."""

    def __init__(self, election: Election) -> None:
        self.queue: asyncio.Queue[Leader | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(election.observe()))

    async def _run(self, values: AsyncIterator[Leader | None]) -> None:
        async for value in values:
            self.queue.put_nowait(value)

    async def next(self, timeout: float = BOUND) -> Leader | None:
        async with asyncio.timeout(timeout):
            return await self.queue.get()

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def leading(election: Election, value: str) -> tuple[asyncio.Task[None], Term]:
    """``async with election.leadership(value)`` in a task whose body leads until
    it is cancelled: that task, and its term once it leads."""
    got: asyncio.Future[Term] = asyncio.get_running_loop().create_future()

    async def lead() -> None:
        async with election.leadership(value) as term:
            got.set_result(term)
            await asyncio.Event().wait()

    task = asyncio.create_task(lead())
    await asyncio.wait({task, got}, return_when=asyncio.FIRST_COMPLETED)
    if not got.done():
        task.result()  # (its error)
    return task, got.result()


async def test_campaign_leader_proclaim_resign(client: Client, other_client: Client) -> None:
    """A term: its value and token as leader() and observe() see them; proclaim
    changes the value (a duplicate is not yielded again); resign makes it None;
    every term gets a greater token; resign is idempotent."""
    election, seen = client.election("basics"), other_client.election("basics")
    watch = Watch(seen)
    try:
        assert await watch.next() is None
        term = await election.campaign("a")
        assert isinstance(term, Term) and term.value == "a" and not term.lost
        assert await seen.leader() == Leader("a", term.fencing_token)
        assert await watch.next() == Leader("a", term.fencing_token)
        await term.proclaim("b")
        await term.proclaim("b")  # no change: not yielded twice
        assert term.value == "b"
        assert await seen.leader() == Leader("b", term.fencing_token)
        assert await watch.next() == Leader("b", term.fencing_token)
        await term.resign()
        await term.resign()
        assert await watch.next() is None  # (not a second Leader("b", ...))
        assert await seen.leader() is None
        with pytest.raises(LockNotOwnedError):
            await term.proclaim("c")

        tokens = [term.fencing_token]
        async with seen.leadership("c") as other:
            assert await watch.next() == Leader("c", other.fencing_token)
            tokens.append(other.fencing_token)
        assert await watch.next() is None
        again = await election.campaign()
        tokens.append(again.fencing_token)
        assert await election.leader() == Leader("", again.fencing_token)
        await again.resign()
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
    finally:
        await watch.stop()
    await assert_clean(client, other_client)


async def test_the_next_candidate_takes_over_on_resign(
    client: Client, other_client: Client
) -> None:
    """A second candidate waits (registered, woken by the release) and leads
    once the first resigns; a third that gives up leaves nothing behind."""
    first = await client.election("next").campaign("one")
    waiting = asyncio.create_task(other_client.election("next").campaign("two"))
    await eventually(lambda: other_client.statistics().waiting == 1, what="the waiting candidate")
    with pytest.raises(RuntimeError, match="leads it already"):
        await client.election("next").campaign()  # a term is never re-entered
    with pytest.raises(LockTimeoutError):  # (another task of the leader's Client)
        await asyncio.create_task(client.election("next").campaign(timeout=0))
    await first.resign()
    second = await asyncio.wait_for(waiting, BOUND)
    assert second.fencing_token > first.fencing_token
    assert await client.election("next").leader() == Leader("two", second.fencing_token)
    await second.resign()
    await assert_clean(client, other_client)


async def test_candidates_of_one_client_and_a_cancelled_resign(
    client: Client, other_client: Client
) -> None:
    """Two candidates of one Client: the lock passes between them (maybe with
    no round trip, on a reserved token), and each term announces its own
    greater token. A resign whose caller is cancelled still completes."""
    election = client.election("local")
    first = await election.campaign("one")
    waiting = asyncio.create_task(election.campaign("two"))
    await eventually(lambda: client.statistics().waiting == 1, what="the local candidate")
    await first.resign()
    second = await asyncio.wait_for(waiting, BOUND)
    assert second.fencing_token > first.fencing_token
    assert await other_client.election("local").leader() == Leader("two", second.fencing_token)

    watch = Watch(other_client.election("local"))
    try:
        assert await watch.next() == Leader("two", second.fencing_token)
        resigning = asyncio.create_task(second.resign())
        await asyncio.sleep(0)  # (one loop turn: the task starts the step down)
        assert second.resigned
        resigning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await resigning
        assert await watch.next() is None
        await second.resign()  # (waits for the first, idempotent)
        third = await other_client.election("local").campaign(timeout=0)
        await third.resign()
    finally:
        await watch.stop()
    await assert_clean(client, other_client)


async def test_a_leader_whose_client_closes_is_seen_to_go(client: Client, make_client: Any) -> None:
    """A Client closed while it leads releases the term and its observers are
    told at once (not at the end of the term's 30 s TTL: BOUND is shorter)."""
    closing = await make_client()
    term = await closing.election("closing").campaign("bye")
    watch = Watch(client.election("closing"))
    try:
        assert await watch.next() == Leader("bye", term.fencing_token)
        await closing.aclose()
        assert await watch.next() is None
    finally:
        await watch.stop()


@pytest.mark.parametrize("server", ["redis"], indirect=True)
@pytest.mark.parametrize("mode", ["list", "poll"])
async def test_other_notify_modes(make_client: Any, mode: str) -> None:
    """Candidates wait by the Client's notify mode; observe() listens on
    pub/sub whatever the mode."""
    one, two = await make_client(notify=mode), await make_client(notify=mode)
    watch = Watch(two.election("modes"))
    try:
        assert await watch.next() is None
        first = await one.election("modes").campaign("one")
        assert await watch.next() == Leader("one", first.fencing_token)
        waiting = asyncio.create_task(two.election("modes").campaign("two"))
        await first.resign()
        second = await asyncio.wait_for(waiting, BOUND)
        while (seen := await watch.next()) != Leader("two", second.fencing_token):
            assert seen is None
        await second.resign()
        assert await watch.next() is None
    finally:
        await watch.stop()


async def test_observers_of_one_client_each_see_every_change(
    client: Client, other_client: Client
) -> None:
    """Two observers in one Client: one that was busy when a change came sees
    it at its next iteration, even though the other read the change (and
    waited again) meanwhile: no wake-up taken from one by the other."""
    term = await client.election("two").campaign("v1")
    now = Leader("v1", term.fencing_token)
    fast = Watch(other_client.election("two"))
    slow = other_client.election("two").observe()
    try:
        assert await fast.next() == now
        assert await anext(slow) == now
        await term.proclaim("v2")
        assert await fast.next() == Leader("v2", term.fencing_token)
        await term.proclaim("v3")
        assert await fast.next() == Leader("v3", term.fencing_token)
        for _ in range(3):  # (behind the fast observer's reads on the one connection:
            await other_client.election("two").leader()  # it has read and waited again)
        async with asyncio.timeout(BOUND):  # (not the term's 30 s TTL)
            assert await anext(slow) == Leader("v3", term.fencing_token)
    finally:
        await fast.stop()
        await slow.aclose()
    await term.resign()
    await assert_clean(client, other_client)


async def test_a_cancelled_campaign_leaves_nothing(
    client: Client, other_client: Client, url: str
) -> None:
    """Cancelled while waiting: no waiter in Redis or in the Client. Cancelled
    after the announcement ran but before its reply was read: the announcement
    is withdrawn (observers see it go) and the hold released."""
    leader = await client.election("cancel").campaign("holder")
    waiting = asyncio.create_task(other_client.election("cancel").campaign("w"))
    await eventually(lambda: other_client.statistics().waiting == 1, what="the waiting candidate")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    admin = aioredis.Redis.from_url(url)
    try:
        await assert_clean(other_client)
        assert await admin.zcard("aiolock:{cancel}:el:wq") == 0
    finally:
        await admin.aclose()
    await leader.resign()

    engine = seam.engine(other_client)
    real_eval = engine.eval

    async def cancelled_after_the_announcement(
        name: str, keys: tuple[Any, ...], args: tuple[Any, ...], orphan: Any = None
    ) -> Any:
        reply = await real_eval(name, keys, args, orphan)
        if name == "election_proclaim":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)  # the reply is lost to the cancellation here
        return reply

    watch = Watch(client.election("cancel"))
    try:
        assert await watch.next() is None
        engine.eval = cancelled_after_the_announcement
        campaign = asyncio.create_task(other_client.election("cancel").campaign("ghost"))
        with pytest.raises(asyncio.CancelledError):
            await campaign
        engine.eval = real_eval
        announced = await watch.next()
        assert announced is not None and announced.value == "ghost"
        assert await watch.next() is None  # withdrawn
        term = await client.election("cancel").campaign(timeout=BOUND)  # released
        assert term.fencing_token > announced.fencing_token
        await term.resign()
    finally:
        engine.eval = real_eval
        await watch.stop()
    await assert_clean(client, other_client)


# The runs that wait for a lease to run out, and the other deployments: on one
# backend each (the suite's time budget), alternating.
@pytest.mark.parametrize("server", ["redis"], indirect=True)
async def test_a_leader_cut_off_is_succeeded(proxy: TcpProxy, client: Client) -> None:
    """A leader whose connection is cut cannot renew: its body is cancelled
    with LockLostError, and the waiting candidate leads within the lease."""
    async with Client.from_url(proxy.url, lease=LEASE, command_timeout=5) as cut:
        lead, first = await leading(cut.election("cut"), "a")
        successor = asyncio.create_task(client.election("cut").campaign("b"))
        await eventually(lambda: client.statistics().waiting == 1, what="the waiting candidate")
        proxy.blackhole()
        with pytest.raises(LockLostError):
            await asyncio.wait_for(lead, BOUND)
        term = await asyncio.wait_for(successor, BOUND)
        assert first.lost
        assert term.fencing_token > first.fencing_token
        assert await client.election("cut").leader() == Leader("b", term.fencing_token)
        await term.resign()
        proxy.restore()


@pytest.mark.parametrize("server", ["valkey"], indirect=True)
async def test_an_observer_sees_a_dead_leader_go(proxy: TcpProxy, client: Client) -> None:
    """A leader that dies says nothing: the observer reads again when the TTL
    it read runs out, and yields None."""
    async with Client.from_url(proxy.url, lease=LEASE, command_timeout=5) as cut:
        term = await cut.election("dead").campaign("gone")
        watch = Watch(client.election("dead"))
        try:
            assert await watch.next() == Leader("gone", term.fencing_token)
            proxy.blackhole()
            assert await watch.next() is None
            await eventually(lambda: term.lost, what="the cut-off leader's loss", timeout=BOUND)
        finally:
            await watch.stop()
        proxy.restore()


async def test_force_release_deposes_the_leader(client: Client, other_client: Client) -> None:
    """The kind's force release: the leader's body is cancelled with
    LockLostError, observers see None, the next term's token is greater."""
    lead, first = await leading(client.election("force"), "x")
    watch = Watch(other_client.election("force"))
    try:
        assert await watch.next() == Leader("x", first.fencing_token)
        assert await other_client.election("force").force_release()
        with pytest.raises(LockLostError):
            await asyncio.wait_for(lead, BOUND)
        assert await watch.next() is None
        assert not await other_client.election("force").force_release()
        term = await other_client.election("force").campaign()
        assert term.fencing_token > first.fencing_token
        await term.resign()
    finally:
        await watch.stop()
    await assert_clean(client, other_client)


async def test_bad_input_is_refused_before_any_round_trip(client: Client) -> None:
    unreachable = Client.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(InvalidArgumentError):
        unreachable.election("")
    with pytest.raises(InvalidArgumentTypeError):
        unreachable.election(7)  # type: ignore[arg-type]
    election = unreachable.election("bad")
    with pytest.raises(InvalidArgumentTypeError):
        await election.campaign(b"v")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await election.campaign(timeout=-1)
    with pytest.raises(InvalidArgumentTypeError):
        election.leadership(None)  # type: ignore[arg-type]
    term = await client.election("bad").campaign("ok")
    with pytest.raises(InvalidArgumentTypeError):
        await term.proclaim(3)  # type: ignore[arg-type]
    assert await client.election("bad").leader() == Leader("ok", term.fencing_token)
    await term.resign()


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
async def test_on_a_cluster(cluster_url: str) -> None:
    async with Client.from_url(cluster_url) as one, Client.from_url(cluster_url) as two:
        watch = Watch(two.election("cl"))
        try:
            assert await watch.next() is None
            first = await one.election("cl").campaign("one")
            assert await watch.next() == Leader("one", first.fencing_token)
            waiting = asyncio.create_task(two.election("cl").campaign("two"))
            await eventually(lambda: two.statistics().waiting == 1, what="the waiting candidate")
            await first.resign()
            second = await asyncio.wait_for(waiting, BOUND)
            assert second.fencing_token > first.fencing_token
            now = Leader("two", second.fencing_token)
            while (seen := await watch.next()) != now:
                assert seen is None  # (between the terms, if read then)
            await second.resign()
        finally:
            await watch.stop()


@pytest.mark.parametrize("_shared_sentinel_set", ["valkey"], indirect=True)
async def test_under_sentinel_with_an_acknowledging_replica(sentinel_set: SentinelSet) -> None:
    """Under Sentinel with ``replicas=1``: a term is on a replica when campaign()
    returns; the next candidate takes over on resign."""
    sentinels = sentinel_set.sentinel_addresses
    async with (
        Client.from_sentinel(sentinels, SERVICE, replicas=1) as one,
        Client.from_sentinel(sentinels, SERVICE, replicas=1) as two,
    ):
        first = await one.election("rep").campaign("one")
        key = "aiolock:{rep}:el"
        assert any(r.execute("EXISTS", key) == 1 for r in sentinel_set.replicas)
        waiting = asyncio.create_task(two.election("rep").campaign("two"))
        await eventually(lambda: two.statistics().waiting == 1, what="the waiting candidate")
        await first.resign()
        second = await asyncio.wait_for(waiting, BOUND)
        assert second.fencing_token > first.fencing_token
        assert await one.election("rep").leader() == Leader("two", second.fencing_token)
        await second.resign()
