"""A force release reaches the holder at once; a fixed lease is checked.

Issue 20, item 2. Client A holds (renewed or fixed lease), Client B force-
releases: A's Client is told on its eviction channel, so its lease is lost
and its ``async with`` body cancelled (LockLostError) at once, with the
eviction's reason, not the watchdog's. A's Client lease is long (LONG), so
its watchdog cannot be what finds out during the test. Every primitive with a
``force_release()``, on one server and on a cluster.

A fixed lease deleted any other way (an operator's DEL) is found by the
watchdog's check within its Client's ``lease / 3`` (a short Client lease
here); before, only its own expiry ended it.

A newer hold of the same Client is never marked lost by an older eviction
(matched by fencing token).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from aiolock import Client, LockLostError
from aiolock._core.holds.evict import FORCE_RELEASED, slot_tag
from aiolock._core.protocol.keys import lost_prefix
from aiolock.testing import seam
from tests.core_util import eventually, primitive

#: A's Client lease: its watchdog runs every LONG / 3, longer than any test here.
LONG = 90.0
#: A fixed lease that outlives the test by far.
FIXED = 60.0
#: A short Client lease: the watchdog checks every SHORT / 3.
SHORT = 1.5

KINDS = ("lock", "fair_lock", "read", "write", "semaphore", "spin_lock")


def renew_key(kind: str, name: str, prefix: str = "aiolock") -> str:
    main = f"{prefix}:{{{name}}}"
    return f"{main}:h" if kind == "semaphore" else main


class Body:
    """``async with`` the primitive in a task; ``entered`` once inside."""

    def __init__(self, cm: Any) -> None:
        self.entered = asyncio.Event()
        self.lease: Any = None
        self.task = asyncio.create_task(self._run(cm))

    async def _run(self, cm: Any) -> None:
        async with cm as lease:
            self.lease = lease
            self.entered.set()
            await asyncio.Event().wait()


async def listening(client: Client) -> None:
    """Waits until the Client's eviction channels are confirmed (a connected holder)."""
    evictions = seam.engine(client).evictions

    def confirmed() -> bool:
        channels = list(evictions._channels.values())
        return bool(channels) and all(c.is_confirmed for c in channels)

    await eventually(confirmed, what="the eviction channel confirmed")


async def told_at_once(a: Client, b: Client, kind: str, name: str, lease: float | None) -> None:
    # A connected holder: its eviction channel (of this name's slot) is
    # confirmed before the hold (a hold taken before that is checked by the
    # watchdog at the confirmation, which could find it gone first).
    await (await primitive(a, kind, name).acquire()).release()
    await listening(a)
    body = Body(primitive(a, kind, name)(lease=lease))
    await body.entered.wait()
    assert await primitive(b, kind, name).force_release()
    # Told at once: well within the watchdog's interval (LONG / 3), by the eviction.
    async with asyncio.timeout(LONG / 6):
        with pytest.raises(LockLostError):
            await body.task
    assert body.lease.lost and body.lease.lost_reason == FORCE_RELEASED
    # B takes it; A's Client holds nothing and renews nothing of it.
    other = await primitive(b, kind, name).acquire(timeout=LONG / 6)
    await other.release()
    assert not seam.watched(a)


@pytest.mark.parametrize("lease", [None, FIXED], ids=["renewed", "fixed"])
@pytest.mark.parametrize("kind", KINDS)
async def test_force_release_tells_the_holder_at_once(
    url: str, kind: str, lease: float | None
) -> None:
    async with Client.from_url(url, lease=LONG) as a, Client.from_url(url) as b:
        await told_at_once(a, b, kind, f"job-{kind}", lease)


@pytest.mark.parametrize("lease", [None, FIXED], ids=["renewed", "fixed"])
@pytest.mark.parametrize("kind", ("lock", "fair_lock", "read", "write", "semaphore"))
async def test_force_release_tells_the_holder_at_once_on_a_cluster(
    cluster_url: str, kind: str, lease: float | None
) -> None:
    async with (
        Client.from_url(cluster_url, lease=LONG) as a,
        Client.from_url(cluster_url) as b,
    ):
        # Names on different slots (and masters): one eviction channel per slot.
        for name in ("job-a", "job-b", "job-c"):
            await told_at_once(a, b, kind, f"{name}-{kind}", lease)
        assert len(seam.engine(a).evictions._channels) == 3


async def test_both_sides_of_a_rw_lock_held_by_one_client(url: str) -> None:
    """Evicting the writer side tells nothing to readers (another name, same Client)
    and the whole lock evicts both; each side by its own message."""
    async with Client.from_url(url, lease=LONG) as a, Client.from_url(url) as b:
        await (await a.rw_lock("warm").read.acquire()).release()
        await listening(a)
        reader = Body(a.rw_lock("r1").read)
        writer = Body(a.rw_lock("w1").write)
        await reader.entered.wait()
        await writer.entered.wait()
        assert await b.rw_lock("w1").write.force_release()
        with pytest.raises(LockLostError):
            await writer.task
        assert not await b.rw_lock("r1").write.force_release()  # no writer there
        assert not reader.lease.lost
        assert await b.rw_lock("r1").force_release()
        with pytest.raises(LockLostError):
            await reader.task


async def test_a_newer_hold_of_the_same_client_is_not_marked_lost(url: str) -> None:
    """An eviction message names the last token of the evicted holds: a hold the
    Client took after it (a larger token) stays, even if the message comes again."""
    async with (
        Client.from_url(url, lease=LONG) as a,
        Client.from_url(url) as b,
        aioredis.Redis.from_url(url) as raw,
    ):
        await (await a.lock("again").acquire()).release()
        await listening(a)
        first = Body(a.lock("again")(lease=FIXED))
        await first.entered.wait()
        assert await b.lock("again").force_release()
        with pytest.raises(LockLostError):
            await first.task
        recent = seam.engine(a).evictions._recent
        bound, _, heard = recent["aiolock:{again}"]
        assert bound >= first.lease.fencing_token
        message = f"x {bound} * aiolock:{{again}}"
        lease = await a.lock("again").acquire(lease=FIXED)  # just after: a remembered eviction
        assert lease.fencing_token > bound
        channel = lost_prefix("aiolock") + a.id
        assert await raw.publish(channel, message.replace(" * ", " w ")) == 1
        assert await raw.publish(channel, message) == 1  # the same eviction, late
        await eventually(lambda: recent["aiolock:{again}"][2] > heard, what="message read")
        assert not lease.lost and await a.lock("again").is_owned()
        await lease.release()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fixed_lease_deleted_by_an_operator_is_reported(url: str, kind: str) -> None:
    """Not a force release: the keys are deleted (DEL). The watchdog checks the
    fixed lease every SHORT / 3 (checked, not renewed: its TTL never moves)."""
    name = f"del-{kind}"
    async with (
        Client.from_url(url, lease=SHORT) as a,
        aioredis.Redis.from_url(url) as raw,
    ):
        body = Body(primitive(a, kind, name)(lease=FIXED))
        await body.entered.wait()
        key = renew_key(kind, name)
        ttl = await raw.pttl(key)
        await asyncio.sleep(0)
        checks = seam.watchdog_rounds(a)
        await eventually(lambda: seam.watchdog_rounds(a) > checks + 1, what="two checks")
        assert await raw.pttl(key) <= ttl  # checked, never extended
        assert not body.lease.lost
        assert await raw.delete(key) == 1
        deleted = asyncio.get_running_loop().time()
        # Found within one interval (SHORT / 3) plus a round trip; SHORT allows for load.
        async with asyncio.timeout(SHORT * 2):
            with pytest.raises(LockLostError):
                await body.task
        assert asyncio.get_running_loop().time() - deleted < SHORT * 2
        assert "watchdog found the hold gone" in body.lease.lost_reason


async def test_a_fixed_lease_deleted_on_a_cluster_is_reported(cluster_url: str) -> None:
    async with (
        Client.from_url(cluster_url, lease=SHORT) as a,
        aioredis.RedisCluster.from_url(cluster_url) as raw,
    ):
        bodies = [Body(a.lock(f"del-{i}")(lease=FIXED)) for i in range(3)]
        for body in bodies:
            await body.entered.wait()
        for i in range(3):
            assert await raw.delete(f"aiolock:{{del-{i}}}") == 1
        async with asyncio.timeout(SHORT * 2):
            for body in bodies:
                with pytest.raises(LockLostError, match="watchdog found the hold gone"):
                    await body.task


def test_every_slot_has_a_tag() -> None:
    from redis.crc import key_slot

    check: Callable[[int], bool] = lambda s: key_slot(f"{{{slot_tag(s)}}}".encode()) == s  # noqa: E731
    assert all(check(s) for s in range(16384))
    assert all("{" not in slot_tag(s) and "}" not in slot_tag(s) for s in range(0, 16384, 97))
