"""Redlock over three independent masters (real servers started here).

Three ``ServerProcess`` masters for the module (one set per xdist worker),
flushed before each test; a test that stops, pauses or restarts one leaves
it to the ``masters`` fixture to bring back. Clients of one Redlock stand
for one process; two Redlocks over the same masters for two processes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

import aiolock
from aiolock import (
    Client,
    ConnectionFailedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockLostError,
    LockTimeoutError,
    Redlock,
)
from aiolock._redlock import ATTEMPT_LIMIT, MASTER_TIMEOUT, UNDO_WAIT, QuorumEngine, quorum_of
from aiolock._redlock.calls import Master
from tests.core_util import assert_refuses_bad_arguments, cancel_at_random, eventually, take_briefly
from tests.servers import ServerProcess, TcpProxy, binary_for, find_free_port

pytestmark = pytest.mark.timeout(90)

MakeRedlock = Callable[..., Awaitable[Redlock]]


def _lock_key(name: str) -> str:
    return f"aiolock:{{{name}}}:rl"


def _fence_key(name: str) -> str:
    return f"aiolock:{{{name}}}:rl:fence"


def _set_counter(server: ServerProcess, name: str, token: int) -> None:
    """Sets ``name``'s fence counter on ``server`` to ``token``, written in the
    server's current generation (a counter of another one counts as absent)."""
    generation = server.execute("GET", "aiolock:redlock:gen")
    assert generation, "no generation yet: run a Redlock script on the server first"
    server.execute("HSET", _fence_key(name), "t", token, "g", generation.split("/", 1)[0])


@pytest.fixture(scope="module")
def _three_masters() -> Iterator[list[ServerProcess]]:
    if os.environ.get("AIOLOCK_TEST_REDIS_URL") or os.environ.get("AIOLOCK_TEST_BACKEND"):
        pytest.skip("Redlock tests start their own three servers (process mode only)")
    binary = binary_for("redis")
    if binary is None:
        pytest.skip("redis-server not found")
    servers = [ServerProcess("redis", binary) for _ in range(3)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def masters(_three_masters: list[ServerProcess]) -> Iterator[list[ServerProcess]]:
    """The three masters, running and empty (a new deployment) for each test."""
    for server in _three_masters:
        server.resume()
        if not server.running:
            server.restart()
        server.reset()
    yield _three_masters
    for server in _three_masters:
        server.resume()


@pytest.fixture
async def make_redlock(masters: list[ServerProcess]) -> AsyncIterator[MakeRedlock]:
    made: list[Client] = []

    async def make(*, lease: float = 30.0, drift: float = 0.01) -> Redlock:
        clients = [Client.from_url(s.url, lease=lease, command_timeout=3.0) for s in masters]
        made.extend(clients)
        return Redlock(clients, drift=drift)

    yield make
    for server in masters:
        server.resume()
    for client in made:
        await client.aclose()


def _held_on(server: ServerProcess, name: str) -> bool:
    return bool(server.execute("EXISTS", _lock_key(name)))


async def _nothing_held(masters: list[ServerProcess], name: str, *redlocks: Redlock) -> None:
    """No key of ``name`` on any running master, no local hold (undo runs in the background)."""
    up = [s for s in masters if s.running]
    await eventually(
        lambda: not any(_held_on(s, name) for s in up),
        what=f"no key of {name!r} left: {[s.execute('GET', _lock_key(name)) for s in up]}",
    )
    await eventually(
        lambda: (
            not any(_held_on(s, name) for s in up)
            and not any(quorum_of(rl).holds for rl in redlocks)
        ),
        what=f"no key of {name!r} left, no hold",
    )


async def _seeds_sent(rl: Redlock) -> None:
    """Waits for the seeds ``rl`` has under way (its background ``_quietly`` calls)."""
    for master in quorum_of(rl).masters:
        seeds = [t for t in master.engine.background if "_quietly" in repr(t.get_coro())]
        await asyncio.gather(*seeds)


def _server_clock_us(server: ServerProcess) -> int:
    sec, usec = server.execute("TIME")
    return int(sec) * 1_000_000 + int(usec)


# -- API ------------------------------------------------------------------------------------


async def test_api_basics(make_redlock: MakeRedlock, masters: list[ServerProcess]) -> None:
    rl = await make_redlock()
    lock = rl.lock("basics")
    assert isinstance(lock, aiolock.RedlockLock)
    assert not await lock.is_locked()
    assert await lock.remaining_ttl() is None
    lease = await lock.acquire()
    assert lease.name == "basics" and not lease.lost
    assert await lock.is_locked() and await lock.is_owned()
    assert await lock.hold_count() == 1
    ttl = await lock.remaining_ttl()
    assert ttl is not None and 25 < ttl <= 30
    assert all(_held_on(s, "basics") for s in masters)
    # The token was written back to every master (a majority at least).
    assert all(
        int(s.execute("HGET", _fence_key("basics"), "t")) == lease.fencing_token for s in masters
    )
    assert await lock.try_acquire() is not None  # re-entry
    await lock.release()
    await lease.release()
    await lease.release()  # idempotent
    assert not await lock.is_locked() and not await lock.is_owned()
    await _nothing_held(masters, "basics", rl)

    async with lock(timeout=5, lease=10) as fixed:
        assert 8 < (await lock.remaining_ttl() or 0) <= 10
        assert fixed.fencing_token > lease.fencing_token

    calls: list[int] = []

    @lock
    async def guarded() -> int:
        calls.append(await lock.hold_count())
        return 7

    assert await guarded() == 7 and calls == [1]

    # force_release: the holder's lease is lost; the next token is higher still.
    held = await lock.acquire()
    assert await lock.force_release()
    assert held.lost
    assert not await lock.is_locked()
    again = await lock.acquire()
    assert again.fencing_token > held.fencing_token
    await again.release()
    await _nothing_held(masters, "basics", rl)


async def test_reentrancy_per_task(make_redlock: MakeRedlock) -> None:
    rl = await make_redlock()
    lock = rl.lock("reentrant")
    outer = await lock.acquire()
    inner = await lock.acquire()
    assert inner.fencing_token == outer.fencing_token
    assert await lock.hold_count() == 2

    async def other_task() -> Any:
        return await lock.try_acquire(0.2)

    assert await asyncio.create_task(other_task()) is None  # another task waits
    await inner.release()
    assert await lock.is_owned()
    await outer.release()
    got = await asyncio.create_task(other_task())
    assert got is not None and got.fencing_token > outer.fencing_token
    await got.release()


async def test_mutual_exclusion_between_two_redlocks(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    a, b = await make_redlock(), await make_redlock()
    inside = 0
    tokens: list[int] = []

    async def worker(rl: Redlock) -> None:
        nonlocal inside
        for _ in range(5):
            async with rl.lock("shared") as lease:
                inside += 1
                assert inside == 1, "two holders at once"
                tokens.append(lease.fencing_token)
                await asyncio.sleep(0.002)
                inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker(rl) for rl in (a, b, a, b))), 30)
    assert len(tokens) == 20
    assert tokens == sorted(tokens) and len(set(tokens)) == 20
    await _nothing_held(masters, "shared", a, b)


def _subscribers(server: ServerProcess, channel: bytes) -> int:
    return int(server.execute("PUBSUB", "NUMSUB", channel)[1])


async def test_waiter_wakes_on_release_not_by_polling(
    make_redlock: MakeRedlock, masters: list[ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    holder, waiter = await make_redlock(), await make_redlock()
    lease = await holder.lock("wake").acquire()  # watchdog lease: 30 s TTL, renewed every 10 s
    channel = f"{_lock_key('wake')}:ch".encode()
    attempts: list[asyncio.Future[Any]] = []  # the waiter's attempts (one round each)
    attempt = QuorumEngine.attempt

    def counted(self: QuorumEngine, *args: Any) -> asyncio.Future[Any]:
        future = asyncio.ensure_future(attempt(self, *args))
        if self is quorum_of(waiter):
            attempts.append(future)
        return future

    monkeypatch.setattr(QuorumEngine, "attempt", counted)
    got: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def wait_for_it() -> None:
        mine = await waiter.lock("wake").acquire(timeout=20)
        got.set_result(time.monotonic())
        await mine.release()

    task = asyncio.create_task(wait_for_it())
    # Parked: subscribed on every master, after its two tries (one before
    # subscribing, one after: a release in between is not missed). Its next
    # try is the holder's TTL (30 s) away.
    await eventually(
        lambda: (
            all(_subscribers(s, channel) == 1 for s in masters)
            and len(attempts) == 2
            and attempts[1].done()
        ),
        what="the waiter parked",
    )
    assert not got.done()
    released = time.monotonic()
    await lease.release()
    woke = await asyncio.wait_for(got, 10)
    await task
    # One try after parking, the one that succeeded: it did not poll.
    assert len(attempts) == 3
    # Woken by the release's message: within the release and one attempt's
    # round (each bounded by MASTER_TIMEOUT), far sooner than its next try (30 s).
    assert woke - released < 2 * MASTER_TIMEOUT


# -- fencing when the quorum changes ----------------------------------------------------------


async def _processes(make_redlock: MakeRedlock, count: int) -> list[Redlock]:
    """``count`` Redlocks (processes) that have seen the masters (they know the
    roster, so they propose tokens) but none of the names the test uses: each
    knows of a name's tokens only what the masters tell it."""
    redlocks = [await make_redlock() for _ in range(count)]
    for rl in redlocks:
        await (await rl.lock("warm-up").acquire(timeout=10)).release()
    return redlocks


async def test_token_written_back_when_the_largest_counter_is_missing(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    a, _b, c = masters
    p1, p2, p3 = await _processes(make_redlock, 3)
    # A's counter runs far ahead of the clocks (reservations, a skewed clock).
    ahead = _server_clock_us(a) + 10**12
    _set_counter(a, "wb", ahead)
    c.pause()
    first = await p1.lock("wb").acquire(timeout=10)  # quorum {A, B}
    assert first.fencing_token > ahead
    await first.release()
    c.resume()
    a.pause()
    second = await p2.lock("wb").acquire(timeout=10)  # quorum {B, C}: A (the largest) missing
    # Without the write-back, B and C know only their clocks: far below `ahead`.
    assert second.fencing_token > first.fencing_token
    await second.release()
    a.resume()
    third = await p3.lock("wb").acquire(timeout=10)
    assert third.fencing_token > second.fencing_token
    await third.release()
    await _nothing_held(masters, "wb", p1, p2, p3)


async def test_master_back_empty_is_not_trusted_for_lost_counters(
    make_redlock: MakeRedlock, masters: list[ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, c = masters
    p1, p2, p3, p4 = await _processes(make_redlock, 4)
    ahead = _server_clock_us(a) + 10**12
    _set_counter(a, "empty", ahead)
    c.pause()
    first = await p1.lock("empty").acquire(timeout=10)  # accepted by A and B only
    assert first.fencing_token > ahead
    await first.release()
    c.resume()
    b.restart()  # B comes back empty: its copy of the token is gone
    a.pause()  # the quorum left is {B, C}: neither knows the token any more
    # B's counter is absent and B's generation is new: it may not vouch for it.
    # Without the rule this would be granted with a clock token below `first`.
    assert await p2.lock("empty").try_acquire(1.5) is None
    await _nothing_held([b, c], "empty", p2)
    assert b.execute("HGET", _fence_key("empty"), "t") is None
    a.resume()
    second = await p2.lock("empty").acquire(timeout=10)  # A is back: it carries the token
    assert second.fencing_token > first.fencing_token
    await second.release()
    # B refused it as untrusted, but is not seeded with it: second began less
    # than ATTEMPT_LIMIT after B's new life did, and could have overlapped an
    # attempt that reached B's previous life (its token maybe below theirs).
    await _seeds_sent(p2)
    assert b.execute("HGET", _fence_key("empty"), "t") is None
    # Once B's generation is ATTEMPT_LIMIT old, a hand-out seeds it. Which one
    # is not exact: the attempt cannot tell when, between its start and its
    # handling of B's reply, B read its clock, so it counts the generation's
    # age at its start as (age at the read) - (its time so far), short of the
    # true age by the reply's latency (and, on the write-back path, by the
    # second round). Under load that is tens of ms, so an attempt begun just
    # after ATTEMPT_LIMIT may not seed B (safety over liveness). Tokens are
    # handed out until one seeds B; one whose attempt began when the
    # generation was 2 * ATTEMPT_LIMIT old must: its reply would otherwise be
    # more than ATTEMPT_LIMIT late, longer than an attempt may take.
    read_b: list[int] = []  # tokens whose attempt by p3 has handled B's reply
    real_seed = QuorumEngine.seed

    def seed(self: QuorumEngine, name: str, token: int, i: int, reply: Any, *rest: Any) -> None:
        if self is quorum_of(p3) and i == 1 and isinstance(reply, list):
            read_b.append(token)
        real_seed(self, name, token, i, reply, *rest)

    monkeypatch.setattr(QuorumEngine, "seed", seed)
    created = int(b.execute("GET", "aiolock:redlock:gen").split("/")[1])
    await eventually(
        lambda: _server_clock_us(b) - created > ATTEMPT_LIMIT * 1_000_000,
        what="B's generation ATTEMPT_LIMIT old",
    )
    last = second.fencing_token
    while True:
        began = _server_clock_us(b) - created
        third = await p3.lock("empty").acquire(timeout=10)
        assert third.fencing_token > last
        last = third.fencing_token
        await third.release()
        await eventually(lambda t=last: t in read_b, what="p3's attempt handled B's reply")
        await _seeds_sent(p3)
        seeded = b.execute("HGET", _fence_key("empty"), "t")
        if seeded is not None:
            # A majority accepted that token: B, refusing it as untrusted, was
            # seeded with it (its generation unchanged since read): it vouches
            # for it now.
            assert seeded == str(third.fencing_token)
            break
        assert began < 2 * ATTEMPT_LIMIT * 1_000_000, "an old enough attempt did not seed B"
    a.pause()
    fourth = await p4.lock("empty").acquire(timeout=10)
    assert fourth.fencing_token > third.fencing_token
    await fourth.release()
    a.resume()
    fifth = await p1.lock("empty").acquire(timeout=10)
    assert fifth.fencing_token > fourth.fencing_token
    await fifth.release()
    await _nothing_held(masters, "empty", p1, p2, p3, p4)


@pytest.mark.parametrize("path", ["proposal", "write-back"])
async def test_a_read_that_comes_before_the_hand_out_still_seeds(
    make_redlock: MakeRedlock,
    masters: list[ServerProcess],
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    """A master's first-round reply that comes after the round decided but
    before the token is handed out is handled at the hand-out, as one that
    comes after it: B, in a new life old enough to be seeded, refused the
    token as untrusted, so it is seeded with it. B's reply comes in the loop
    turn of the deciding one, before the attempt resumes (``proposal``: the
    token proposed, one round), or during the write-back round (``write-back``:
    the counters run ahead of the clocks)."""
    a, b, c = masters
    await _processes(make_redlock, 1)  # founds the roster over A, B, C
    b.restart()  # B comes back empty: a new generation, not in the roster
    p = await make_redlock()
    q = quorum_of(p)
    await q.settle()
    await eventually(
        lambda: all(m.engine.cluster is not None for m in q.masters), what="every master reached"
    )
    await (await p.lock("warm-up").acquire(timeout=10)).release()  # sent to B too
    await eventually(
        lambda: b.execute("GET", "aiolock:redlock:gen") is not None, what="B's new generation"
    )
    created = int(b.execute("GET", "aiolock:redlock:gen").split("/")[1])
    ahead = _server_clock_us(a) + 10**12
    if path == "write-back":
        for server in (a, c):  # the proposal is refused: the token is written back
            _set_counter(server, "early", ahead)
    else:  # p handed out `ahead` before: it proposes above it, however late it arrives
        q.accepted("early", ahead)

    def forward(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
        # (As Master.script's own: the round may have cancelled a call it no longer waits for.)
        error = None if source.cancelled() else source.exception()
        if target.done():
            return
        if source.cancelled():
            target.cancel()
        elif error is not None:
            target.set_exception(error)
        else:
            target.set_result(source.result())

    # Each first round's calls (A, B, C) as they come, and as the attempt gets
    # them: A's and C's once all three came (so the round decides on them),
    # then B's after them (proposal), or once the write-back round is sent.
    came: list[list[asyncio.Future[Any]]] = []
    got: list[list[asyncio.Future[Any]]] = []
    write_backs: list[asyncio.Future[Any]] = []
    real_script = Master.script

    def deliver(came: list[asyncio.Future[Any]], got: list[asyncio.Future[Any]]) -> None:
        if all(call.done() for call in came) and not got[0].done():  # once
            forward(came[0], got[0])
            forward(came[2], got[2])
            if path == "proposal":  # in the same turn: B's reply is handled after C's
                forward(came[1], got[1])

    def script(
        self: Master, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]
    ) -> asyncio.Future[Any]:
        call = real_script(self, name, keys, args)
        if self not in q.masters:
            return call
        i = q.masters.index(self)
        loop = asyncio.get_running_loop()
        if name == "redlock_acquire":
            if i == 0:
                came.append([])
                got.append([])
            came[-1].append(call)
            got[-1].append(loop.create_future())
            if i == 2:
                for each in came[-1]:
                    each.add_done_callback(lambda _, c=came[-1], g=got[-1]: deliver(c, g))
            return got[-1][-1]
        if name == "redlock_fence":
            write_backs.append(call)
            b_reply = got[-1][1]
            if i == 0:  # the first round decided without B: B's reply comes now
                forward(came[-1][1], b_reply)
            # This round's replies reach the attempt only after B's first-round
            # reply did (a future's callbacks run in order: the attempt's first).
            fenced = loop.create_future()
            b_reply.add_done_callback(
                lambda _: call.add_done_callback(lambda f: forward(f, fenced))
            )
            return fenced
        return call

    monkeypatch.setattr(Master, "script", script)
    await eventually(
        lambda: _server_clock_us(b) - created > 2 * ATTEMPT_LIMIT * 1_000_000,
        timeout=2 * ATTEMPT_LIMIT + 10,
        what="B's generation 2 * ATTEMPT_LIMIT old",
    )
    # Any attempt from now on begins when B's generation is more than
    # 2 * ATTEMPT_LIMIT old: more than ATTEMPT_LIMIT before its read, whenever
    # the reply is handled (a hand-out comes within ATTEMPT_LIMIT of the start).
    lease = await p.lock("early").acquire(timeout=10)
    if path == "write-back":
        assert lease.fencing_token > ahead and write_backs
    else:
        assert lease.fencing_token == ahead + 1 and not write_backs
    assert got[-1][1].done(), "B's reply did not reach the attempt"
    await lease.release()
    await _seeds_sent(p)
    assert b.execute("HGET", _fence_key("early"), "t") == str(lease.fencing_token)
    await _nothing_held(masters, "early", p)


async def test_master_back_from_a_stale_snapshot_keeps_tokens_increasing(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    """As ``test_master_back_empty_is_not_trusted_for_lost_counters``, but B
    comes back with its data of before the first acquisition (an RDB snapshot:
    Redis' default persistence; an ``appendfsync everysec`` AOF; a replica
    promoted by a failover), not empty: its generation marker is the old one,
    so the generation rule does not see that it lost the token."""
    a, b, c = masters
    (p2,) = await _processes(make_redlock, 1)  # founds the roster over A, B, C
    b.execute("SAVE")  # B's snapshot: its generation and roster, no counter for the name
    dump = b.directory / "dump.rdb"
    # p1 reaches A and B only (C is cut off from it: a partition), so C never
    # hears of p1's token, and stays in its trusted generation.
    cut_off = Client.from_url(f"redis://127.0.0.1:{find_free_port()}", command_timeout=1.0)
    near = [Client.from_url(s.url, command_timeout=3.0) for s in (a, b)]
    try:
        p1 = Redlock([*near, cut_off])
        ahead = _server_clock_us(a) + 10**12
        _set_counter(a, "stale", ahead)
        first = await p1.lock("stale").acquire(timeout=10)  # accepted by A and B only
        assert first.fencing_token > ahead
        await first.release()
    finally:
        for client in (*near, cut_off):
            await client.aclose()
    try:
        b.restart()  # B loads its snapshot: the token it accepted is gone
    finally:
        dump.unlink(missing_ok=True)  # the next restarts of B come back empty
    assert b.execute("HGET", _fence_key("stale"), "t") is None
    assert c.execute("HGET", _fence_key("stale"), "t") is None
    a.pause()  # the quorum left is {B, C}: neither knows the token any more
    second = await p2.lock("stale").try_acquire(5)
    a.resume()
    if second is not None:
        await second.release()
        assert second.fencing_token > first.fencing_token
    await _nothing_held(masters, "stale", p2)


# -- masters down -----------------------------------------------------------------------------


async def test_one_master_down_acquisitions_still_work(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    rl = await make_redlock()
    lock = rl.lock("one-down")
    before = await lock.acquire()
    await before.release()
    masters[1].kill()
    tokens = [before.fencing_token]
    for _ in range(3):
        async with lock(timeout=10) as lease:
            tokens.append(lease.fencing_token)
            assert await lock.is_locked()
    assert tokens == sorted(tokens) and len(set(tokens)) == 4
    await _nothing_held(masters, "one-down", rl)


async def test_two_masters_down_acquire_fails_and_leaves_nothing(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    rl = await make_redlock()
    lock = rl.lock("two-down")
    await (await lock.acquire()).release()
    masters[0].kill()
    masters[2].pause()
    start = time.monotonic()
    timeout = 1.0
    with pytest.raises((LockTimeoutError, ConnectionFailedError)):
        await lock.acquire(timeout=timeout)
    # The timeout, then the attempt under way at most: its round (MASTER_TIMEOUT
    # for the paused master) and its undo (UNDO_WAIT), with 1 s of slack for a
    # loaded CI box.
    assert time.monotonic() - start < timeout + MASTER_TIMEOUT + UNDO_WAIT + 1.0
    await _nothing_held([masters[1]], "two-down", rl)


async def test_holder_gets_lock_lost_when_the_quorum_is_lost(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    rl = await make_redlock(lease=1.5)
    lock = rl.lock("lost")
    lost_seen: list[bool] = []
    start = 0.0
    with pytest.raises(LockLostError):
        async with lock as lease:
            lease.on_lost(lambda lease: lost_seen.append(lease.lost))
            start = time.monotonic()
            masters[0].kill()
            masters[1].pause()
            await asyncio.sleep(30)
    # Lost within its lease (1.5 s from the last renewal), with some slack.
    assert time.monotonic() - start < 1.5 + 1.5
    await eventually(lambda: lost_seen == [True], what="the on_lost callback")
    assert quorum_of(rl).holds == {}


# -- cancellation -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["proposal", "write-back"])
async def test_cancelled_acquire_at_every_await_leaves_nothing(
    make_redlock: MakeRedlock, masters: list[ServerProcess], path: str
) -> None:
    """Cancelled after 0, 1, 2... loop turns, until an acquire completes: the
    one-round path (a proposed token accepted), and the two-round path (the
    counters run ahead of the clocks, so every proposal is refused and the
    token is written back in a second round)."""
    rl = (await _processes(make_redlock, 1))[0]
    lock = rl.lock("cancel")
    if path == "write-back":
        for server in masters:
            _set_counter(server, "cancel", _server_clock_us(server) + 10**12)
    steps = 0
    while True:
        task = asyncio.create_task(lock.acquire(timeout=5))
        for _ in range(steps):
            await asyncio.sleep(0)
        if task.done():
            await (await task).release()
            break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _nothing_held(masters, "cancel", rl)
        steps += 1
    assert steps >= 2  # cancelled before its reply, and after it
    await _nothing_held(masters, "cancel", rl)
    if path == "write-back":  # it did take the second round
        assert all(
            int(s.execute("HGET", _fence_key("cancel"), "t")) > _server_clock_us(s) + 10**11
            for s in masters
        )


async def test_cancelled_waiter_and_cancelled_release(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    holder, other = await make_redlock(), await make_redlock()
    lease = await holder.lock("cr").acquire()
    for steps in (0, 1, 3, 10, 30):
        waiting = asyncio.create_task(other.lock("cr").acquire(timeout=10))
        for _ in range(steps):
            await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    assert quorum_of(other).holds == {}
    # A release cancelled at any step still completes.
    for steps in (1, 2, 3, 5):  # (at 0 the release would not have begun)
        releasing = asyncio.create_task(lease.release())
        for _ in range(steps):
            await asyncio.sleep(0)
        releasing.cancel()
        try:
            await releasing
        except asyncio.CancelledError:
            pass
        await _nothing_held(masters, "cr", holder, other)
        await eventually(lambda lease=lease: lease.released, what="the lease marked released")
        lease = await holder.lock("cr").acquire()
    await lease.release()
    await _nothing_held(masters, "cr", holder, other)


# -- arguments --------------------------------------------------------------------------------


async def test_bad_arguments_are_typed_errors_before_any_io() -> None:
    # Nothing listens there: any I/O would fail with ConnectionFailedError instead.
    clients = [Client.from_url(f"redis://127.0.0.1:1/{db}") for db in range(4)]
    try:
        c1, c2, c3, c4 = clients
        with pytest.raises(InvalidArgumentError):
            Redlock([c1, c2])
        with pytest.raises(InvalidArgumentError):
            Redlock([])
        with pytest.raises(InvalidArgumentError):
            Redlock([c1, c1, c2])
        with pytest.raises(InvalidArgumentTypeError):
            Redlock("abc")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentTypeError):
            Redlock([c1, "x", c2])  # type: ignore[list-item]
        for drift in (0.5, -0.1, float("nan")):
            with pytest.raises(InvalidArgumentError):
                Redlock([c1, c2, c3], drift=drift)
        for bad in ("0.1", True, None):
            with pytest.raises(InvalidArgumentTypeError):
                Redlock([c1, c2, c3], drift=bad)  # type: ignore[arg-type]
        rl = Redlock([c1, c2, c3], drift=0.0)
        with pytest.raises(InvalidArgumentError):
            rl.lock("")
        with pytest.raises(InvalidArgumentTypeError):
            rl.lock(3)  # type: ignore[arg-type]
        lock = rl.lock("x")
        await assert_refuses_bad_arguments(lock)
        with pytest.raises(InvalidArgumentError):
            await lock.acquire(lease=0.001)  # nothing of it would be valid
        assert isinstance(Redlock([c1, c2, c3, c4][:3]), Redlock)
        acked = Client.from_url("redis://127.0.0.1:1/5", replicas=1)
        clients.append(acked)
        with pytest.raises(InvalidArgumentError, match="replicas=1"):
            Redlock([c1, c2, acked])
    finally:
        for client in clients:
            await client.aclose()


def test_names_are_pinned() -> None:
    """The names data is found by (a version that changed them would not see the
    locks of the one before): apart from the plain lock's, one hash tag per name."""
    from aiolock._core.protocol.keys import RedlockKeys

    keys = RedlockKeys.of("pp", "n")
    assert (keys.lock, keys.fence, keys.channel) == (
        "pp:{n}:rl",
        "pp:{n}:rl:fence",
        b"pp:{n}:rl:ch",
    )
    assert (keys.generation, keys.roster) == ("pp:redlock:gen", "pp:redlock:roster")
    assert keys.acquire == (keys.lock, keys.fence, keys.generation, keys.roster)
    assert keys.write_back == (keys.fence, keys.generation, keys.roster)


async def test_two_clients_of_one_server_are_refused(
    masters: list[ServerProcess], make_redlock: MakeRedlock
) -> None:
    """Two Clients that reach the same server would make one master count twice:
    found by its generation marker on first use, refused, nothing left held."""
    clients = [Client.from_url(masters[0].url), Client.from_url(masters[0].url)]
    clients.append(Client.from_url(masters[1].url))
    try:
        rl = Redlock(clients)
        with pytest.raises(InvalidArgumentError, match="same server"):
            await rl.lock("twice").acquire(timeout=5)
        await _nothing_held(masters, "twice", rl)
    finally:
        for client in clients:
            await client.aclose()


# -- the README ---------------------------------------------------------------------------------


def test_readme_redlock_example_runs_as_written(masters: list[ServerProcess]) -> None:
    """The README's Redlock example, with its three URLs pointed at the three
    masters, runs as written: it takes the lock on all three and prints a token."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs/deployment/redlock.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "Redlock(" in b]
    assert len(blocks) == 1, "docs/deployment/redlock.md has one Redlock example"
    code, count = re.subn(r"URLS = \[.*?\]", f"URLS = {[s.url for s in masters]!r}", blocks[0])
    assert count == 1
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "held on a majority, fencing token" in done.stdout


async def test_release_retries_a_master_that_had_not_answered(
    masters: list[ServerProcess],
) -> None:
    """A release returns once a majority confirmed it; a master that had not
    answered by then (its reply lost: a black-holed connection) is released
    again in the background, so its key does not stay until its TTL."""
    a, b, c = masters
    async with TcpProxy.to(c) as proxy:
        clients = [
            Client.from_url(a.url, command_timeout=1.0),
            Client.from_url(b.url, command_timeout=1.0),
            Client.from_url(proxy.url, command_timeout=1.0),
        ]
        try:
            lease = await Redlock(clients).lock("again").acquire(timeout=10)
            await eventually(lambda: all(_held_on(s, "again") for s in masters), what="held")
            proxy.blackhole()
            await lease.release()  # confirmed by A and B
            assert _held_on(c, "again")
            proxy.cut()  # the request held in the black hole is lost
            proxy.restore()
            # Well before the key's TTL (the Client's lease, 30 s).
            await eventually(lambda: not _held_on(c, "again"), what="released on C", timeout=10)
        finally:
            for client in clients:
                await client.aclose()


# -- busy or unreachable: decided from the answers received -----------------------------------


@pytest.mark.parametrize("fault", ["pause", "kill"])
async def test_busy_on_the_live_majority_is_busy_not_a_connection_failure(
    make_redlock: MakeRedlock, masters: list[ServerProcess], fault: str
) -> None:
    """Master C restarted empty once, then paused (or killed); r1 holds the
    name on A and B. A fresh r2's tries find it busy on both live masters:
    each returns None (never ConnectionFailedError, whichever of C's error and
    B's "busy" comes first), and a wait with a timeout ends in LockTimeoutError."""
    r0 = await make_redlock()
    await (await r0.lock("job").acquire()).release()  # the deployment's roster is founded
    masters[2].restart()
    getattr(masters[2], fault)()
    r1 = await make_redlock(lease=5.0)
    held = await r1.lock("job").acquire(timeout=10)
    assert _held_on(masters[0], "job") and _held_on(masters[1], "job")
    r2 = await make_redlock(lease=5.0)
    lock = r2.lock("job")
    for _ in range(10):
        assert await lock.try_acquire() is None
    start = time.monotonic()
    with pytest.raises(LockTimeoutError):
        await lock.acquire(timeout=1.0)
    assert time.monotonic() - start < 1.0 + MASTER_TIMEOUT + UNDO_WAIT + 1.0
    await held.release()


async def test_too_few_answers_to_tell_is_a_connection_failure(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    """Two of three masters down: no query answers from the one left as if it
    knew. Each raises ConnectionFailedError, with redis-py's error as its
    ``__cause__``; with two up, each answers."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    rl = await make_redlock()
    lock = rl.lock("few")
    lease = await lock.acquire()
    masters[0].kill()
    masters[2].kill()
    queries: list[Callable[[], Awaitable[Any]]] = [
        lock.is_locked,
        lock.is_owned,
        lock.remaining_ttl,
        lambda: lease.extend(10),
        rl.lock("free").force_release,  # deleted nothing where it answered
    ]
    for query in queries:
        with pytest.raises(ConnectionFailedError, match="of 3 masters") as info:
            await query()
        assert isinstance(info.value.__cause__, RedisConnectionError), repr(info.value.__cause__)
        assert not isinstance(info.value.__cause__, aiolock.AiolockError)
    other = await make_redlock()  # another process: its try must reach the masters
    with pytest.raises(ConnectionFailedError, match="of 3 masters") as info:
        await other.lock("few").try_acquire()
    assert isinstance(info.value.__cause__, RedisConnectionError), repr(info.value.__cause__)
    assert not lease.lost  # not found gone: it stands until its validity ends
    masters[0].restart()  # back empty: held on one answer, free on the other
    with pytest.raises(ConnectionFailedError, match="only 2 of 3 masters answered"):
        await lock.is_locked()
    masters[2].restart()
    assert not await lock.is_locked() and await lock.remaining_ttl() is None


# -- force release reaches the holder (issue 20, item 2) -------------------------------------


async def _redlock_body(lock: Any, entered: asyncio.Event) -> None:
    async with lock:
        entered.set()
        await asyncio.Event().wait()


@pytest.mark.parametrize("lease", [None, 60.0], ids=["renewed", "fixed"])
async def test_force_release_tells_the_holder_at_once(
    make_redlock: MakeRedlock, lease: float | None
) -> None:
    """Another Redlock force-releases: every master tells the holder's Client
    there (its eviction channel), and the holder loses the lease once a
    majority did, long before its own rounds (every 90 / 3 s) could."""
    holder = await make_redlock(lease=90.0)
    other = await make_redlock()
    await (await holder.lock("warm").acquire()).release()
    await eventually(
        lambda: all(
            m.engine.evictions._channels
            and all(c.is_confirmed for c in m.engine.evictions._channels.values())
            for m in quorum_of(holder).masters
        ),
        what="the eviction channels confirmed on every master",
    )
    entered = asyncio.Event()
    body = asyncio.create_task(_redlock_body(holder.lock("job")(lease=lease), entered))
    await entered.wait()
    assert await other.lock("job").force_release()
    with pytest.raises(LockLostError, match="force-released"):
        await asyncio.wait_for(body, 10.0)  # the holder's own round: 30 s
    lease2 = await other.lock("job").acquire(timeout=10.0)
    await lease2.release()


async def test_a_fixed_lease_deleted_on_the_masters_is_reported(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    """A fixed Redlock lease is checked every lease / 3 (not renewed): deleted
    on every master by an operator, it is reported lost."""
    holder = await make_redlock(lease=1.5)
    entered = asyncio.Event()
    body = asyncio.create_task(_redlock_body(holder.lock("fx")(lease=60.0), entered))
    await entered.wait()
    ttl = masters[0].execute("PTTL", _lock_key("fx"))
    for server in masters:
        assert server.execute("DEL", _lock_key("fx")) == 1
    with pytest.raises(LockLostError, match="gone on a majority"):
        await asyncio.wait_for(body, 3.0)  # one round (0.5 s) and a round trip, under load
    assert int(ttl) > 50_000  # (a fixed lease of 60 s: never extended by the check)


# -- the contract suite's clauses, for RedlockLock (tests/test_contract.py) ---------------------


def _quiet(*redlocks: Redlock) -> bool:
    """No hold, waiter, subscription, command in flight or background task left."""
    for rl in redlocks:
        q = quorum_of(rl)
        if q.holds or q.waiting:
            return False
        for master in q.masters:
            s = master.engine.statistics()
            if s.waiting or s.subscriptions or s.in_flight or s.background:
                return False
    return True


async def _assert_clean(*redlocks: Redlock) -> None:
    await eventually(lambda: _quiet(*redlocks), what="the Redlocks to be quiet")


async def test_contract_exclusion(make_redlock: MakeRedlock) -> None:
    a, b = await make_redlock(), await make_redlock()
    inside = peak = 0

    async def worker(rl: Redlock) -> None:
        nonlocal inside, peak
        lock = rl.lock("x")
        for _ in range(4):
            async with lock:
                inside += 1
                peak = max(peak, inside)
                assert inside == 1
                await asyncio.sleep(0.001)
                inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker(rl) for rl in (a, b) for _ in range(4))), 120)
    assert peak == 1
    await _assert_clean(a, b)


async def test_contract_try_acquire_never_blocks_and_timeout_honoured(
    make_redlock: MakeRedlock,
) -> None:
    a, b = await make_redlock(), await make_redlock()
    held = await b.lock("t").acquire()
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await a.lock("t").try_acquire() is None
    assert loop.time() - start < 10.0  # one round (the holder's lease is 30 s)
    assert quorum_of(a).waiting == {}
    start = loop.time()
    with pytest.raises(LockTimeoutError):
        await a.lock("t").acquire(timeout=0.3)
    assert 0.25 <= loop.time() - start < 0.3 + 3.0
    await held.release()
    got = await a.lock("t").try_acquire()
    assert got is not None
    await got.release()
    await _assert_clean(a, b)


async def test_contract_lost_lease_cancels_body(make_redlock: MakeRedlock) -> None:
    rl = await make_redlock()
    finished = False
    with pytest.raises(LockLostError):
        async with rl.lock("lost")(lease=0.2):
            await asyncio.sleep(30)
            finished = True
    assert not finished
    await _assert_clean(rl)


async def test_contract_fencing_tokens_increase(make_redlock: MakeRedlock) -> None:
    redlocks = (await make_redlock(), await make_redlock())
    tokens = []
    for i in range(6):
        lease = await redlocks[i % 2].lock("f").acquire()
        tokens.append(lease.fencing_token)
        await lease.release()
    assert all(x < y for x, y in itertools.pairwise(tokens)), tokens
    await _assert_clean(*redlocks)


async def test_contract_random_cancellation_leaves_nothing(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    rng = random.Random(7)
    redlocks = (await make_redlock(), await make_redlock())
    await cancel_at_random(
        rng,
        lambda: take_briefly(rng.choice(redlocks).lock("z"), rng),
        rounds=20,
        share=0.7,
        delay=lambda rng: rng.uniform(0, 0.004),
        tasks=6,
    )
    await _assert_clean(*redlocks)
    await _nothing_held(masters, "z", *redlocks)
    # Every key left expires by itself (the fence counter), but the masters'
    # generation and roster, which are kept for ever by design.
    for server in masters:
        for key in server.execute("KEYS", "aiolock:*"):
            if key in ("aiolock:redlock:gen", "aiolock:redlock:roster"):
                continue
            assert int(server.execute("PTTL", key)) > 0, f"{key} is left behind with no TTL"


async def test_the_watchdog_keeps_a_hold_past_its_lease(
    make_redlock: MakeRedlock, masters: list[ServerProcess]
) -> None:
    """A hold without ``lease=`` outlives its lease: the plain Watchdog renews
    it on every master (QuorumEngine.renew_batch), every validity / 3."""
    rl = await make_redlock(lease=1.5)
    lock = rl.lock("kept")
    lease = await lock.acquire()
    loop = asyncio.get_running_loop()
    start = loop.time()
    renewals = 0
    last = 1500

    def alive_and_renewed() -> bool:
        nonlocal renewals, last
        ttl = min(int(s.execute("PTTL", _lock_key("kept"))) for s in masters)
        assert ttl > 0, "the hold expired on a master"
        if ttl > last + 200:  # its TTL went back up: a renewal round
            renewals += 1
        last = ttl
        return loop.time() - start > 3 * 1.5 and renewals >= 2

    await eventually(alive_and_renewed, timeout=20, what="two lease lengths renewed")
    assert not lease.lost and await lock.is_owned()
    await lease.release()
    await _nothing_held(masters, "kept", rl)
