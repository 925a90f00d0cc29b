"""``lease.handle`` and ``client.adopt(handle)``: a hold handed to another Client."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import aiolock
from aiolock import Client, Lease, LockNotOwnedError
from aiolock.testing import seam
from tests.core_util import assert_clean, evalsha_calls, eventually
from tests.servers import RedisServer

Acquire = Callable[[Client, str], Awaitable[Any]]

#: One acquire per kind whose holds can be handed over.
KINDS: dict[str, Acquire] = {
    "lock": lambda c, n: c.lock(n).acquire(),
    "fair_lock": lambda c, n: c.fair_lock(n).acquire(),
    "write_lock": lambda c, n: c.rw_lock(n).write.acquire(),
    "semaphore": lambda c, n: c.semaphore(n, 2).acquire(),
    "spin_lock": lambda c, n: c.spin_lock(n).acquire(),
}


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "ad"}


def watch_losses(lease: Any) -> list[object]:
    lost: list[object] = []
    lease.on_lost(lost.append)
    return lost


async def test_adopt_across_clients(client: Client, other_client: Client) -> None:
    for kind, acquire in KINDS.items():
        given = await acquire(client, kind)
        losses = client.statistics().losses
        lost = watch_losses(given)
        taken = await other_client.adopt(given.handle)
        assert (taken.name, taken.fencing_token) == (given.name, given.fencing_token), kind
        assert not taken.lost and not taken.released
        # The giver learns at its next watchdog round: released, not lost.
        await seam.renew_now(client)
        await eventually(lambda g=given: g.released, what=f"{kind}: the giver's release")
        assert not given.lost and lost == [] and client.statistics().losses == losses
        await given.release()  # a no-op: it was released
        # The adopter renews it, and releases it.
        assert await seam.renew_now(other_client)
        assert not taken.lost
        await taken.release()
        again = await acquire(client, kind)  # free again
        assert again.fencing_token > given.fencing_token
        await again.release()
    await assert_clean(client, other_client)


async def test_async_with_hands_over_without_loss(client: Client, other_client: Client) -> None:
    lock = client.lock("w")
    async with lock as given:
        taken = await other_client.adopt(given.handle)
    # The release at the end of `async with` found the hold handed over: no error.
    assert given.released and not given.lost
    assert await other_client.lock("w").is_owned()
    await taken.release()
    assert not await lock.is_locked()


async def test_local_handoffs_and_handles(client: Client, other_client: Client) -> None:
    """A hold passed on locally (cohort: same entry in Redis, the next token)
    is handed over with its own token; a handle taken before a local handoff
    goes stale instead of taking the lock from the next local holder."""
    lock = client.lock("cohort")
    loop = asyncio.get_running_loop()

    async def next_holder(got: asyncio.Future[Lease], done: asyncio.Event) -> None:
        got.set_result(await lock.acquire())
        await done.wait()

    first = await lock.acquire()
    for step in ("pass", "stale"):
        got: asyncio.Future[Lease] = loop.create_future()
        done = asyncio.Event()
        task = asyncio.ensure_future(next_holder(got, done))
        await eventually(lambda: lock.statistics().waiting == 1, what="the next holder parked")
        handle = first.handle if step == "stale" else None
        await first.release()
        second = await got
        if step == "pass":
            assert second.fencing_token == first.fencing_token + 1  # passed on locally
            taken = await other_client.adopt(second.handle)
            assert taken.fencing_token == second.fencing_token
            await seam.renew_now(client)
            await eventually(lambda s=second: s.released, what="released")
            await taken.release()
            first = await lock.acquire()
        else:
            with pytest.raises(LockNotOwnedError):
                await other_client.adopt(handle)
            assert await lock.is_locked() and not second.lost
            await second.release()
        done.set()
        await task
    await assert_clean(client, other_client)


async def test_adopted_fixed_lease_keeps_its_expiry(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    given = await client.lock("f").acquire(lease=60.0)
    taken = await other_client.adopt(given.handle)
    assert 0 < int(server.execute("PTTL", "ad:{f}")) <= 60_000
    assert seam.watched(other_client) != []  # checked each round, not renewed
    await taken.release()
    await seam.renew_now(client)
    await eventually(lambda: given.released, what="released")


async def test_handle_is_adopted_once(client: Client, other_client: Client) -> None:
    given = await client.lock("once").acquire()
    handle = given.handle
    taken = await other_client.adopt(handle)
    with pytest.raises(LockNotOwnedError):
        await other_client.adopt(handle)
    assert await other_client.lock("once").is_owned()
    await taken.release()
    with pytest.raises(LockNotOwnedError):  # stale: released
        await other_client.adopt(handle)
    permit = await client.semaphore("stale", 1).acquire()
    handle = permit.handle
    await permit.release()
    with pytest.raises(LockNotOwnedError):
        await other_client.adopt(handle)
    await seam.renew_now(client)  # the giver learns now, not at its next round
    await eventually(lambda: given.released, what="released")
    await assert_clean(client, other_client)


def _encode(body: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()


async def test_malformed_handles_are_refused_before_redis(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    given = await client.lock("m").acquire()
    good = json.loads(base64.urlsafe_b64decode(given.handle + "=" * (-len(given.handle) % 4)))
    calls = evalsha_calls(server)
    bad = [
        "",
        "not a handle",
        "!!!",
        _encode({**good, "v": 2}),
        _encode({**good, "k": "read_lock"}),
        _encode({**good, "t": "7"}),
        _encode({**good, "t": 0}),
        _encode({**good, "n": ""}),
        _encode({**good, "l": -1}),
        _encode({**good, "p": "other"}),  # another prefix
        given.handle,  # made by this very Client
    ]
    for text in bad:
        adopter = client if text == given.handle else other_client
        with pytest.raises(aiolock.InvalidArgumentError):
            await adopter.adopt(text)
    with pytest.raises(aiolock.InvalidArgumentTypeError):
        await other_client.adopt(b"bytes")  # type: ignore[arg-type]
    assert evalsha_calls(server) == calls
    assert not given.lost and await client.lock("m").is_owned()
    for refused in (
        await client.rw_lock("r").read.acquire(),
        await aiolock.Redlock([client]).lock("red").acquire(),
        await client.multi_lock(client.lock("m1"), client.lock("m2")).acquire(),
    ):
        with pytest.raises(aiolock.InvalidArgumentError, match="cannot be handed over"):
            _ = refused.handle
        await refused.release()
    await given.release()


def owners(server: RedisServer, key: str) -> list[str]:
    """The holders in a lock hash (its fields but the "~" ones)."""
    return [str(f) for f in server.execute("HKEYS", key) if not str(f).startswith("~")]


async def test_cancelled_adopt_leaves_one_owner(
    client: Client, other_client: Client, server: RedisServer
) -> None:
    await other_client.lock("warm").is_locked()  # connected: the next command is sent at once
    for when in ("before", "after"):
        given = await client.lock("c").acquire()
        before = owners(server, "ad:{c}")
        assert len(before) == 1
        calls = evalsha_calls(server)
        task = asyncio.ensure_future(other_client.adopt(given.handle))
        if when == "after":
            await asyncio.sleep(0)  # the adopt script is written; its reply is not read
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        if when == "after":
            # The adopt ran, then its undo gave the hold back (the giver had not learned).
            await eventually(lambda c=calls: evalsha_calls(server) >= c + 3, what="the undo")
        else:
            assert evalsha_calls(server) == calls
        assert owners(server, "ad:{c}") == before, when
        assert await seam.renew_now(client)
        assert not given.lost and not given.released and await client.lock("c").is_owned()
        await given.release()
    await assert_clean(client, other_client)


async def test_adopt_on_a_cluster(cluster_url: str) -> None:
    async with (
        Client.from_url(cluster_url, prefix="adc") as giver,
        Client.from_url(cluster_url, prefix="adc") as taker,
    ):
        leases: list[Lease] = [await giver.lock(f"k{i}").acquire() for i in range(3)]
        taken = [await taker.adopt(lease.handle) for lease in leases]
        assert [t.fencing_token for t in taken] == [g.fencing_token for g in leases]
        await seam.renew_now(giver)
        await eventually(lambda: all(g.released for g in leases), what="released")
        assert not any(g.lost for g in leases)
        for t in taken:
            await t.release()
