"""No false loss: a hold its owner released is never reported lost.

The race (issue 9): the watchdog renews on its own connection, releases go
over the command connection. So a release can run in Redis before a renewal
that covers the same hold, and the renewal's reply ("gone") can be read
before the release's reply: the hold is still registered then, and used to
be marked lost, so ``async with`` raised LockLostError just after its body
ended normally. These tests build that interleaving deterministically:

* the renewal lane is gated in Redis (``BLPOP`` on a key nobody pushes to,
  pipelined ahead of the renewal on the watchdog's connection) when the
  renewal must be sent before the release;
* the command connection's replies are held back by pausing the Client's
  reading of its socket, so the release runs in Redis (seen from an admin
  connection) but its reply stays unread until the renewal's verdict is in.

A loss that is real (the hold deleted by someone else, no release of ours
in flight; or before our release ran) is still reported.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from aiolock import Client, Lease, LockLostError, LockNotOwnedError
from aiolock._core.transport.connection import CommandConnection
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually, primitive
from tests.servers import RedisServer

#: Long enough that the watchdog's own rounds (every lease / 3) never run during a test.
LEASE = 120.0
#: Replies are held back for up to a fixed lease (5 s) here: no liveness drop meanwhile.
TIMEOUT = 60.0
PREFIX = "fl"
GATE = "fl-test:gate"

KINDS = ["lock", "fair_lock", "write", "read", "semaphore"]


def entry_key(kind: str, name: str = "res") -> str:
    """The Redis key that holds the (only) hold's entry: gone once it is released."""
    key = f"{PREFIX}:{{{name}}}"
    return f"{key}:h" if kind == "semaphore" else key


def exists(server: RedisServer, key: str) -> bool:
    return int(server.execute("EXISTS", key)) == 1


@contextlib.contextmanager
def replies_held(mux: CommandConnection) -> Iterator[None]:
    """Leave the connection's replies unread (in the socket) inside the block.

    Commands are still written; Redis runs them and answers; the Client only
    reads the answers when the block ends.
    """
    link = mux._link
    assert link is not None, "connect the command connection first"
    transport = link.transport
    transport.pause_reading()
    try:
        yield
    finally:
        if not transport.is_closing():
            transport.resume_reading()


async def gate_renewals(client: Client) -> asyncio.Future[Any]:
    """Block the watchdog's connection in Redis until ``open_gate``: a renewal
    sent now reaches Redis but runs only after the gate opens."""
    mux = seam.renewal_lane(client)
    before = mux.in_flight
    gate = mux.submit(b"BLPOP", GATE, 0)
    await eventually(lambda: mux.in_flight == before + 1, what="the gate on the wire")
    return gate


def open_gate(server: RedisServer) -> None:
    server.execute("LPUSH", GATE, "go")


class Body:
    """An ``async with`` over a primitive in its own task, whose body ends on request."""

    def __init__(self, cm: Any) -> None:
        self.cm = cm
        self.entered = asyncio.Event()
        self.may_end = asyncio.Event()
        self.lease: Lease | None = None
        self.task = asyncio.create_task(self.run())

    async def run(self) -> Lease:
        async with self.cm as lease:
            self.lease = lease
            self.entered.set()
            await self.may_end.wait()
        return lease


async def held_and_queued(client: Client, held: Any, queued: Any) -> tuple[Body, Any, Body]:
    """A task holds ``held`` in an ``async with``, then a second task of the
    same Client queues for ``queued``: the two Bodies, and the first one's Hold."""
    first = Body(held)
    await first.entered.wait()
    old = first.lease._hold  # type: ignore[union-attr]
    second = Body(queued)
    await eventually(lambda: client.statistics().waiting == 1, what="the second task queued")
    return first, old, second


async def taken_over(first: Body, second: Body) -> None:
    """``second`` took the lock over from ``first``: neither saw a loss, and
    the new hold's fencing token is the higher."""
    lease = await first.task
    assert not lease.lost
    await second.entered.wait()
    assert second.lease is not None and not second.lease.lost
    assert second.lease.fencing_token > lease.fencing_token
    second.may_end.set()
    assert not (await second.task).lost


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("renewal", ["sent-after-the-release", "sent-before-the-release"])
async def test_a_release_racing_a_renewal_is_not_a_loss(
    url: str, server: RedisServer, kind: str, renewal: str
) -> None:
    """The release runs in Redis before the renewal; the renewal's "gone" is
    read before the release's reply. The body ended normally: no loss."""
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client:
        watchdog = seam.watchdog(client)
        body = Body(primitive(client, kind))
        await body.entered.wait()
        hold = body.lease._hold  # type: ignore[union-attr]
        assert await watchdog.renew_all()  # connects the renewal lane; the hold is alive
        assert hold in watchdog and exists(server, entry_key(kind))
        pending: asyncio.Task[bool] | None = None
        gate: asyncio.Future[Any] | None = None
        if renewal == "sent-before-the-release":
            gate = await gate_renewals(client)
            pending = asyncio.create_task(watchdog.renew_all())
            await eventually(
                lambda: seam.renewal_lane(client).in_flight == 2, what="the renewal sent"
            )
        with replies_held(seam.command_lane(client)):
            body.may_end.set()  # the body ends normally; __aexit__ sends the release
            await eventually(lambda: not exists(server, entry_key(kind)), what="the release run")
            if pending is None:
                pending = asyncio.create_task(watchdog.renew_all())
            else:
                open_gate(server)
            assert await pending
            # The renewal found the hold gone (else the watchdog would still renew it) ...
            assert hold not in watchdog
            # ... while the release's reply is still unread.
            assert not body.task.done()
        lease = await body.task  # used to raise LockLostError
        assert not lease.lost and lease.released
        if gate is not None:
            assert gate.done()
        await assert_clean(client)
    assert not exists(server, entry_key(kind))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_hold_deleted_by_someone_else_is_lost(
    url: str, server: RedisServer, kind: str
) -> None:
    """A real loss (no release of ours in flight) is still reported by the watchdog."""
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client:
        body = Body(primitive(client, kind))
        await body.entered.wait()
        server.execute("DEL", entry_key(kind))
        assert await seam.renew_now(client)
        with pytest.raises(LockLostError, match="watchdog found the hold gone"):
            await body.task
        assert body.lease is not None and body.lease.lost
        await assert_clean(client)


async def test_a_lock_force_released_by_another_client_is_lost(url: str) -> None:
    # Poll mode: no eviction channel (evict.py), so the watchdog is what finds
    # out (test_force_told.py has the Client told at once in pub/sub mode).
    async with (
        Client.from_url(
            url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT, notify="poll"
        ) as client,
        Client.from_url(url, prefix=PREFIX) as other,
    ):
        body = Body(client.lock("res"))
        await body.entered.wait()
        assert await other.lock("res").force_release()
        assert await seam.renew_now(client)
        with pytest.raises(LockLostError, match="watchdog found the hold gone"):
            await body.task
        await assert_clean(client, other)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_hold_deleted_before_our_release_ran_is_lost(
    url: str, server: RedisServer, kind: str
) -> None:
    """Someone else deleted the hold; then our release runs (and finds nothing)
    and a renewal's "gone" is read first. The loss is real: the release's
    reply reports it, so ``async with`` still raises LockLostError."""
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client:
        watchdog = seam.watchdog(client)
        body = Body(primitive(client, kind))
        await body.entered.wait()
        hold = body.lease._hold  # type: ignore[union-attr]
        assert await watchdog.renew_all()
        calls = _script_calls(server)
        with replies_held(seam.command_lane(client)):
            server.execute("DEL", entry_key(kind))
            body.may_end.set()
            await eventually(lambda: _script_calls(server) > calls, what="the release run")
            assert await watchdog.renew_all()
            assert hold not in watchdog
            assert not body.task.done()
        with pytest.raises(LockLostError):
            await body.task
        assert body.lease is not None and body.lease.lost
        await assert_clean(client)


def _script_calls(server: RedisServer) -> int:
    stats = server.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_handoff_racing_a_renewal_is_not_a_loss(url: str, server: RedisServer) -> None:
    """A release that hands the lock to the next local task (one script: a new
    owner and token in Redis) runs before a renewal of the old hold, whose
    "gone" is read first. Neither task sees a loss; the next one holds the lock."""
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client:
        watchdog = seam.watchdog(client)
        lock = client.lock("res")
        # A fixed lease: the lock is handed over through Redis, not passed locally.
        first, old, second = await held_and_queued(client, lock, lock(lease=LEASE))
        assert await watchdog.renew_all()
        owner_field = old.owner
        with replies_held(seam.command_lane(client)):
            first.may_end.set()
            await eventually(
                lambda: server.execute("HEXISTS", entry_key("lock"), owner_field) == 0,
                what="the handoff run",
            )
            assert exists(server, entry_key("lock"))  # held: by the second task now
            assert await watchdog.renew_all()
            assert old not in watchdog
            assert not first.task.done()
        await taken_over(first, second)
        await assert_clean(client)


async def test_a_local_pass_then_a_release_racing_renewals_is_not_a_loss(
    url: str, server: RedisServer
) -> None:
    """A renewal of the first hold is sent; the lock passes to the next local
    task with no round trip (the same entry in Redis, a new Hold); that task
    releases, and the release runs before the renewal and before a renewal of
    the new Hold, both of whose "gone" are read first. No loss for either."""
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client:
        watchdog = seam.watchdog(client)
        lock = client.lock("res")
        first, old, second = await held_and_queued(client, lock, lock)
        assert await watchdog.renew_all()
        gate = await gate_renewals(client)
        stale = asyncio.create_task(watchdog.renew_all())  # renews the first hold
        await eventually(
            lambda: seam.renewal_lane(client).in_flight == 2, what="the renewal sent"
        )
        first.may_end.set()
        await second.entered.wait()  # passed locally: no round trip
        new = second.lease._hold  # type: ignore[union-attr]
        assert new is not old and new.renew_args == old.renew_args
        assert not (await first.task).lost
        with replies_held(seam.command_lane(client)):
            second.may_end.set()
            await eventually(lambda: not exists(server, entry_key("lock")), what="the release run")
            open_gate(server)
            assert await stale
            assert await watchdog.renew_all()  # renews the new hold
            assert new not in watchdog
            assert not second.task.done()
        assert gate.done()
        lease = await second.task
        assert not lease.lost and lease.released
        await assert_clean(client)


async def test_a_grant_racing_a_renewal_is_not_a_loss(url: str, server: RedisServer) -> None:
    """The release grants the lock to another Client's waiting task in Redis
    (a new owner and token) before a renewal of the old hold, whose "gone"
    is read first. The releasing task sees no loss; the other one holds."""
    async with (
        Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client,
        Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as other,
    ):
        watchdog = seam.watchdog(client)
        first = Body(client.lock("res"))
        await first.entered.wait()
        old = first.lease._hold  # type: ignore[union-attr]
        theirs = other.lock("res")
        second = Body(theirs)

        def parked() -> bool:
            channel = seam.listener_channels(other).get(theirs._wait_channel)
            return channel is not None and channel.is_confirmed and other.statistics().waiting == 1

        await eventually(parked, what="the other Client's task parked")
        await eventually(
            lambda: int(server.execute("ZCARD", f"{entry_key('lock')}:wq")) == 1,
            what="its entry in the waiting set",
        )
        assert await watchdog.renew_all()
        with replies_held(seam.command_lane(client)):
            first.may_end.set()
            await eventually(
                lambda: server.execute("HEXISTS", entry_key("lock"), old.owner) == 0,
                what="the release run",
            )
            assert await watchdog.renew_all()
            assert old not in watchdog
            assert not first.task.done()
        await taken_over(first, second)
        await assert_clean(client, other)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fixed_lease_running_out_while_its_release_is_in_flight_is_not_a_loss(
    url: str, server: RedisServer, kind: str
) -> None:
    """The release ran in Redis well before the lease's end; the local timer of
    the fixed lease fires before the release's reply is read. No loss."""
    lease_s = 5.0  # the release runs in Redis long before this (slack for a loaded machine)
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client:
        body = Body(primitive(client, kind)(lease=lease_s))
        await body.entered.wait()
        hold = body.lease._hold  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        with replies_held(seam.command_lane(client)):
            body.may_end.set()
            await eventually(lambda: not exists(server, entry_key(kind)), what="the release run")
            # The fixed lease's timer fires (the reply is still unread).
            await eventually(
                lambda: loop.time() > hold.expires_at + 0.05, timeout=3 * lease_s, what="expiry"
            )
            await asyncio.sleep(0)
            assert not body.task.done()
        lease = await body.task  # used to raise LockLostError ("the fixed lease expired")
        assert not lease.lost and lease.released
        await assert_clean(client)


async def test_an_extend_after_the_release_is_not_a_loss(url: str, server: RedisServer) -> None:
    """extend() sent after the lease's release (from another task) runs after it
    in Redis and finds nothing: the extend fails, but the hold is not lost."""
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client:
        lease = await client.lock("res").acquire()
        lost: list[Lease] = []
        lease.on_lost(lost.append)
        with replies_held(seam.command_lane(client)):
            releasing = asyncio.create_task(lease.release())
            await eventually(lambda: not exists(server, entry_key("lock")), what="the release run")
            extending = asyncio.create_task(lease.extend(LEASE))
            await eventually(
                lambda: seam.command_lane(client).in_flight == 2, what="the extend sent"
            )
        await releasing
        with pytest.raises(LockNotOwnedError):
            await extending
        await asyncio.sleep(0)  # (a lost-callback would have run by now)
        assert not lease.lost and lost == []
        await assert_clean(client)


@pytest.mark.parametrize("kind", ["lock", "write", "read"])
async def test_acquire_again_while_the_release_is_in_flight(
    url: str, server: RedisServer, kind: str
) -> None:
    """A task whose release is still on its way (another task released its
    lease, or its own release call was cancelled) and that acquires the same
    lock again gets a new hold after that release, not a re-entry into the
    hold being released (which would then be neither held nor reported lost)."""
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE, command_timeout=TIMEOUT) as client:
        prim = primitive(client, kind)
        leases: list[Lease] = []
        held, go, again = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def holder() -> tuple[bool, int]:
            leases.append(await prim.acquire())
            held.set()
            await go.wait()
            leases.append(await prim.acquire())  # the same task: used to re-enter
            again.set()
            owned, count = await prim.is_owned(), await prim.hold_count()
            await leases[-1].release()
            return owned, count

        task = asyncio.create_task(holder())
        await held.wait()
        with replies_held(seam.command_lane(client)):
            releasing = asyncio.create_task(leases[0].release())  # from another task
            await eventually(lambda: not exists(server, entry_key(kind)), what="the release run")
            go.set()
            # Its reply is unread: the acquire waits for it (a re-entry would not).
            waiter = asyncio.create_task(again.wait())
            done, _ = await asyncio.wait([waiter], timeout=0.05)
            assert not done
        await releasing
        await waiter
        owned, count = await task
        assert owned and count == 1
        assert leases[1].fencing_token > leases[0].fencing_token
        assert not leases[0].lost and not leases[1].lost
        await assert_clean(client)
