"""``max_hold=seconds``: a hold ends when it is that old, renewed or not."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

import aiolock
from aiolock import Client, LockLostError
from aiolock._primitives import max_hold as max_hold_module
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually
from tests.servers import RedisServer

#: The max_hold of these tests: short, so a test costs little; every wait
#: for its end is bounded by it times a large factor (a loaded machine).
MAX_HOLD = 0.3
#: The bound of a wait for the end of a hold: what a stalled loop could add.
BOUND = MAX_HOLD + 20.0


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "mh"}


def lost_event(lease: Any) -> asyncio.Event:
    lost = asyncio.Event()
    lease.on_lost(lambda _: lost.set())
    return lost


async def test_max_hold_ends_a_renewed_hold(client: Client, other_client: Client) -> None:
    from tests.test_otel import LOSSES, Otel  # (the test image has the OpenTelemetry SDK)

    otel = Otel()
    otel.instrument(client)
    lock = client.lock("renewed")
    losses = client.statistics().losses
    loop = asyncio.get_running_loop()
    began = loop.time()
    lost: list[object] = []
    with pytest.raises(LockLostError, match="max_hold"):
        async with lock(max_hold=MAX_HOLD) as lease:
            lease.on_lost(lost.append)
            await asyncio.wait_for(asyncio.Event().wait(), BOUND)  # cancelled at max_hold
    assert loop.time() - began >= MAX_HOLD - 0.01
    assert lease.lost and lease.lost_reason is not None and "max_hold" in lease.lost_reason
    assert lost == [lease]
    assert client.statistics().losses == losses + 1
    assert otel.value(LOSSES, kind="lock", outcome="max_hold") == 1
    assert seam.watched(client) == []  # no longer renewed
    # Released in Redis at once: another Client takes it well before a lease.
    other = await other_client.lock("renewed").acquire(timeout=BOUND)
    await other.release()
    await assert_clean(client, other_client)


async def test_fixed_lease_is_cut_to_max_hold(client: Client, server: RedisServer) -> None:
    # The key's TTL is min(lease, max_hold), and extend() does not move the end.
    long = await client.lock("fixed1").acquire(lease=60.0, max_hold=30.0)
    assert 0 < int(server.execute("PTTL", "mh:{fixed1}")) <= 30_000
    end = max_hold_module._ends[long._hold][0]
    await long.extend(60.0)
    assert max_hold_module._ends[long._hold][0] == end and long._hold.timer is None
    await long.release()
    # Cut to max_hold, it ends with a reason naming max_hold...
    cut = await client.lock("fixed").acquire(lease=60.0, max_hold=MAX_HOLD)
    # ... and a fixed lease shorter than max_hold by its own reason.
    short = await client.lock("fixed2").acquire(lease=MAX_HOLD, max_hold=60.0)
    await asyncio.wait_for(lost_event(cut).wait(), BOUND)
    assert "max_hold" in (cut.lost_reason or "")
    await asyncio.wait_for(lost_event(short).wait(), BOUND)
    assert "max_hold" not in (short.lost_reason or "")


def acquirers(client: Client) -> list[tuple[str, Callable[..., Any]]]:
    rw = client.rw_lock("rw")
    sem = client.semaphore("sem", 2)
    multi = client.multi_lock(client.lock("m1"), client.lock("m2"))
    return [
        ("lock", client.lock("l").acquire),
        ("fair", client.fair_lock("f").acquire),
        ("read", rw.read.acquire),
        ("write", client.rw_lock("rw2").write.acquire),
        ("semaphore", sem.acquire),
        ("spin", client.spin_lock("s").acquire),
        ("multi", multi.acquire),
        ("try", client.lock("t").try_acquire),
    ]


async def test_every_primitive_accepts_max_hold(client: Client) -> None:
    leases = [await acquire(max_hold=MAX_HOLD) for _, acquire in acquirers(client)]
    redlock = aiolock.Redlock([client])
    leases.append(await redlock.lock("red").acquire(max_hold=MAX_HOLD))
    async with client.semaphore("sem2", 1)(max_hold=60.0) as permit:
        assert not permit.lost

    @client.fair_lock("deco")(max_hold=60.0)
    async def decorated() -> int:
        return 7

    assert await decorated() == 7
    events = [lost_event(lease) for lease in leases]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), BOUND)
    for lease in leases:
        assert "max_hold" in (lease.lost_reason or ""), lease
    await assert_clean(client)


BAD = [
    (0, aiolock.InvalidArgumentError),
    (-1.0, aiolock.InvalidArgumentError),
    (math.inf, aiolock.InvalidArgumentError),
    (math.nan, aiolock.InvalidArgumentError),
    ("1", aiolock.InvalidArgumentTypeError),
    (True, aiolock.InvalidArgumentTypeError),
]


async def test_bad_max_hold_is_refused_before_redis(client: Client, server: RedisServer) -> None:
    for value, error in BAD:
        assert issubclass(error, ValueError | TypeError)
        for _, acquire in acquirers(client):
            with pytest.raises(error, match="max_hold"):
                await acquire(max_hold=value)
        with pytest.raises(error, match="max_hold"):
            client.lock("c")(max_hold=value)
        with pytest.raises(error, match="max_hold"):
            client.semaphore("c", 1)(max_hold=value)
    assert server.execute("KEYS", "mh:*") == []


async def test_max_hold_of_a_handed_hold_is_not_a_loss(
    client: Client, other_client: Client
) -> None:
    lock = client.lock("handed")
    given = await lock.acquire()
    losses = client.statistics().losses
    taken = await other_client.adopt(given.handle)
    # A re-entry with a max_hold, armed after the handoff (the giver has not
    # learned yet): at its end the giver asks first, finds the hold handed
    # over, and reports released, not lost.
    again = await lock.acquire(max_hold=MAX_HOLD)
    await eventually(lambda: again.released, what="released at max_hold", timeout=BOUND)
    assert given.released and not given.lost and client.statistics().losses == losses
    assert await other_client.lock("handed").is_owned() and not taken.lost
    await taken.release()
