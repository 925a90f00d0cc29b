"""Replica-acknowledged acquisitions (``Client(..., replicas=N)``), on real servers.

A master and a replica that replicates through a ``TcpProxy`` (the
``replicated_pair`` fixture, tests/replication_servers.py): ``stall()``
black-holes the replication stream, so the replica neither receives nor
acknowledges anything, as a replica lagging behind a congested link would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis

from aiolock import (
    Client,
    LockLostError,
    LockTimeoutError,
    ReplicationError,
    UnsupportedServerError,
)
from aiolock._primitives.base import LockLike
from aiolock.testing import seam
from tests.cluster_servers import ClusterProcess
from tests.core_util import assert_clean, eventually
from tests.replication_servers import ReplicatedPair
from tests.servers import RedisServer, ServerProcess

#: WAIT's timeout in these tests: a stalled acquisition is refused after about this.
RT = 0.25


def client_for(pair: ReplicatedPair, **options: Any) -> Client:
    options.setdefault("replicas", 1)
    options.setdefault("replica_timeout", RT)
    return Client.from_url(pair.master.url, **options)


def lock_keys(server: RedisServer) -> list[str]:
    """The keys of the server but the fencing counters (they outlive every hold, by design)."""
    keys = [k.decode() if isinstance(k, bytes) else k for k in server.execute("KEYS", "*")]
    return sorted(k for k in keys if not k.endswith(":fence"))


async def no_hold(server: RedisServer, key: str = "aiolock:{a}") -> None:
    """The lock's main key (its holder) is gone from ``server`` (the undo ran)."""
    await eventually(lambda: server.execute("EXISTS", key) == 0, what=f"no hold of {key}")


# Every kind of primitive: (id, make(client) -> what `async with` acquires, its main key).
Maker = Callable[[Client], LockLike]
KINDS: list[tuple[str, Maker, str]] = [
    ("lock", lambda c: c.lock("k"), "aiolock:{k}"),
    ("spin", lambda c: c.spin_lock("k"), "aiolock:{k}"),
    ("fair", lambda c: c.fair_lock("k"), "aiolock:{k}"),
    ("read", lambda c: c.rw_lock("k").read, "aiolock:{k}"),
    ("write", lambda c: c.rw_lock("k").write, "aiolock:{k}"),
    ("semaphore", lambda c: c.semaphore("k", 2), "aiolock:{k}"),
    ("multi", lambda c: c.multi_lock(c.lock("k"), c.lock("k2")), "aiolock:{k}"),
]


@pytest.mark.parametrize(("kind", "make", "main"), KINDS, ids=[k[0] for k in KINDS])
async def test_every_primitive_acknowledged_or_refused(
    replicated_pair: ReplicatedPair, kind: str, make: Maker, main: str
) -> None:
    """Healthy: the acquisition returns once the replica has it. Stalled: it is
    refused after about replica_timeout, undone on the master, nothing held."""
    pair = replicated_pair
    async with client_for(pair) as client:
        primitive = make(client)
        async with primitive:
            # Acknowledged means on the replica by the time acquire returned.
            assert pair.replica.execute("EXISTS", main) == 1
        # What a release leaves (fencing counters, release records): the baseline.
        await eventually(lambda: pair.master.execute("EXISTS", main) == 0)
        baseline = pair.master.execute("KEYS", "*")
        pair.stall()
        started = time.monotonic()
        with pytest.raises(ReplicationError) as caught:
            async with primitive:
                pytest.fail("a refused acquisition ran the body")
        elapsed = time.monotonic() - started
        assert caught.value.acknowledged == 0
        assert caught.value.required == 1
        assert RT * 0.9 <= elapsed < RT + 3, elapsed
        # Undone before the error was raised: nothing to wait for.
        assert sorted(pair.master.execute("KEYS", "*")) == sorted(baseline), (
            "something of the refused acquisition is left in Redis"
        )
        await assert_clean(client)


async def test_acknowledged_lock_is_on_the_replica(replicated_pair: ReplicatedPair) -> None:
    pair = replicated_pair
    async with client_for(pair) as client:
        lease = await client.lock("a").acquire()
        token = pair.replica.execute("HGET", "aiolock:{a}", "t")
        assert pair.replica.execute("EXISTS", "aiolock:{a}") == 1, token
        await lease.release()
        # Releases are not waited for, but they replicate.
        await eventually(lambda: pair.replica.execute("EXISTS", "aiolock:{a}") == 0)


async def test_two_required_one_replica(replicated_pair: ReplicatedPair) -> None:
    async with client_for(replicated_pair, replicas=2) as client:
        with pytest.raises(ReplicationError) as caught:
            await client.lock("a").acquire()
        assert (caught.value.acknowledged, caught.value.required) == (1, 2)
        assert "1 replica(s) acknowledged" in str(caught.value)
        assert replicated_pair.master.execute("EXISTS", "aiolock:{a}") == 0  # undone already


async def test_no_replica_at_all_is_refused(server: RedisServer) -> None:
    """A master with no replica: WAIT answers 0, the acquisition is refused."""
    async with Client.from_url(server.url, replicas=1, replica_timeout=0.05) as client:
        with pytest.raises(ReplicationError) as caught:
            await client.lock("a").acquire()
        assert (caught.value.acknowledged, caught.value.required) == (0, 1)
        assert server.execute("EXISTS", "aiolock:{a}") == 0  # undone already


async def test_wait_aof_needs_appendonly_and_7_2(server: RedisServer) -> None:
    """WAITAOF 1 ...: refused with a clear error (appendonly off here; Redis 7.0
    has no WAITAOF), and the acquisition undone."""
    async with Client.from_url(server.url, wait_aof=True, replica_timeout=0.05) as client:
        with pytest.raises(UnsupportedServerError) as caught:
            await client.lock("a").acquire()
        assert "wait_aof=False" in str(caught.value)
        assert caught.value.__cause__ is not None
        await no_hold(server)


@pytest.mark.parametrize("fresh_server", ["redis"], indirect=True)
async def test_a_server_without_wait_is_refused_naming_it(fresh_server: ServerProcess) -> None:
    """replicas=N on a server with no WAIT (Garnet has none; here a real Redis
    whose WAIT is renamed away): UnsupportedServerError naming WAIT, and the
    acquisition undone."""
    fresh_server.extra_args = ("--rename-command", "WAIT", "")
    fresh_server.restart()
    async with Client.from_url(fresh_server.url, replicas=1, replica_timeout=0.05) as client:
        with pytest.raises(UnsupportedServerError, match="needs the WAIT command") as caught:
            await client.lock("a").acquire()
        assert caught.value.__cause__ is not None
        assert "replicas=0" in str(caught.value)
    await no_hold(fresh_server)


async def test_waiter_behind_a_local_holder_is_acknowledged(
    replicated_pair: ReplicatedPair,
) -> None:
    """No handoff script with replicas: a local waiter that cannot take the
    holder's Redis hold as it is (here: a fixed lease) competes on the acked
    lane when the holder releases, so a stalled replica refuses it too. (A
    watchdog waiter is passed the same, acknowledged, Redis hold: no write.)"""
    pair = replicated_pair
    async with client_for(pair) as client:
        lock = client.lock("a")
        first = await lock.acquire()
        waiter = asyncio.create_task(lock.acquire(lease=10))
        await eventually(lambda: client.statistics().waiting == 1, what="the local waiter")
        pair.stall()
        await first.release()
        with pytest.raises(ReplicationError):
            await waiter
        await no_hold(pair.master)
        pair.resume()
        # Healthy again: the next local waiter gets it, and the replica has it.
        first = await lock.acquire()
        waiter = asyncio.create_task(lock.acquire(lease=10))
        await eventually(lambda: client.statistics().waiting == 1, what="the local waiter")
        token = first.fencing_token
        await first.release()
        second = await waiter
        assert second.fencing_token > token
        assert pair.replica.execute("EXISTS", "aiolock:{a}") == 1
        await second.release()
        await assert_clean(client)


async def test_waiter_behind_another_client_is_acknowledged(
    replicated_pair: ReplicatedPair,
) -> None:
    """No grant by another Client's release is taken up unacknowledged: the
    waiter competes on its acked lane, refused while the replica is stalled."""
    pair = replicated_pair
    async with client_for(pair) as client, Client.from_url(pair.master.url) as plain:
        held = await plain.lock("a").acquire()
        waiter = asyncio.create_task(client.lock("a").acquire())
        await eventually(lambda: client.statistics().waiting == 1, what="the waiter parked")
        pair.stall()
        await held.release()
        with pytest.raises(ReplicationError):
            await waiter
        await no_hold(pair.master)
        await assert_clean(client, plain)


async def test_busy_is_not_a_replication_error(replicated_pair: ReplicatedPair) -> None:
    """A try that grants nothing (the lock is held elsewhere) is not refused for
    the replicas' silence: the caller waits on, and times out as usual."""
    pair = replicated_pair
    async with client_for(pair) as client, Client.from_url(pair.master.url) as plain:
        held = await plain.lock("a").acquire()
        pair.stall()
        with pytest.raises(LockTimeoutError):
            await client.lock("a").acquire(timeout=RT * 2)
        pair.resume()
        await held.release()
        await assert_clean(client, plain)


async def test_unacknowledged_renewals_lose_the_hold(replicated_pair: ReplicatedPair) -> None:
    """The master renews, the replica never acknowledges: the hold is lost at its
    last acknowledged expiry (LockLostError from ``async with``), not later."""
    pair = replicated_pair
    lease_s = 1.5
    async with client_for(pair, lease=lease_s) as client:
        lock = client.lock("a")
        body_started = asyncio.Event()
        expires_at = 0.0

        async def body() -> None:
            nonlocal expires_at
            async with lock as lease:
                hold = lease._hold
                pair.stall()
                expires_at = hold.expires_at  # the last acknowledged expiry
                body_started.set()
                await asyncio.sleep(60)

        loop = asyncio.get_running_loop()
        with pytest.raises(LockLostError):
            await body()
        lost_at = loop.time()
        assert body_started.is_set()
        assert lost_at >= expires_at - 0.01, (lost_at, expires_at)
        assert lost_at < expires_at + RT + 3, (lost_at, expires_at)
        # The master did extend it: the replicas' silence alone decided.
        assert pair.master.execute("EXISTS", "aiolock:{a}") == 1
        pair.resume()
        await eventually(lambda: lock_keys(pair.master) == [], what="the release of the lost hold")
        await assert_clean(client)


async def test_cancelled_before_the_script_reply(replicated_pair: ReplicatedPair) -> None:
    """Cancelled after the script ran, its reply (and the WAIT's) unread: undone."""
    pair = replicated_pair
    async with client_for(pair) as client:
        await client.lock("warm").acquire()  # connected, scripts loaded
        lane = seam.acked_lane(client)
        assert lane is not None
        task = asyncio.create_task(client.lock("a").acquire())
        await eventually(lambda: lane.in_flight >= 1, interval=0, what="the script sent")
        await eventually(
            lambda: pair.master.execute("EXISTS", "aiolock:{a}") == 1,
            block_loop=True,
            what="the acquire script ran",
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(lambda: pair.master.execute("EXISTS", "aiolock:{a}") == 0, what="the undo")
        assert seam.peek_state(client, "aiolock:{a}") is None


async def test_cancelled_during_the_wait(replicated_pair: ReplicatedPair) -> None:
    """Cancelled while its WAIT is pending (the script's reply read): undone once
    the WAIT answers, whatever it says."""
    pair = replicated_pair
    async with client_for(pair) as client:
        pair.stall()
        task = asyncio.create_task(client.lock("a").acquire())
        await eventually(
            lambda: pair.master.execute("EXISTS", "aiolock:{a}") == 1, what="the script ran"
        )
        await eventually(
            lambda: seam.acked_lane(client).in_flight == 1,  # type: ignore[union-attr]
            what="only the WAIT pending",
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await no_hold(pair.master)
        await assert_clean(client)


async def test_cancelled_during_a_healthy_wait_keeps_nothing(
    replicated_pair: ReplicatedPair,
) -> None:
    """Cancelled while the WAIT is in flight, and the WAIT then acknowledges:
    the caller is gone, so the acquisition is undone all the same. (The stream
    is held back until the cancellation landed, then let go well within
    replica_timeout: the WAIT cannot answer first, and does acknowledge.)"""
    pair = replicated_pair
    async with client_for(pair, replica_timeout=5.0) as client:
        await (await client.lock("warm").acquire()).release()
        lane = seam.acked_lane(client)
        assert lane is not None
        waits = lane.waits
        pair.stall()
        task = asyncio.create_task(client.lock("a").acquire())
        await eventually(lambda: lane.waits > waits, interval=0, what="the WAIT sent")
        await eventually(
            lambda: pair.master.execute("EXISTS", "aiolock:{a}") == 1, what="the script ran"
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pair.resume()
        await eventually(
            lambda: (
                pair.replica.execute("EXISTS", "aiolock:{a}") == 1
                or pair.master.execute("EXISTS", "aiolock:{a}") == 0
            ),
            what="the replica acknowledged (or the undo already ran)",
        )
        await no_hold(pair.master)
        await assert_clean(client)


async def test_group_commit(replicated_pair: ReplicatedPair) -> None:
    """100 concurrent acquisitions cost a handful of WAITs, not 100."""
    pair = replicated_pair
    async with client_for(pair) as client:
        await client.lock("warm").acquire()
        before = pair.wait_calls()
        leases = await asyncio.gather(*(client.lock(f"n{i}").acquire() for i in range(100)))
        waits = pair.wait_calls() - before
        assert waits <= 5, waits
        for lease in leases:
            assert not lease.lost
        assert pair.replica.execute("EXISTS", "aiolock:{n99}") == 1
        await asyncio.gather(*(lease.release() for lease in leases))


@asynccontextmanager
async def on_new_master(pair: ReplicatedPair) -> AsyncIterator[Client]:
    async with Client.from_url(pair.replica.url) as client:
        yield client


async def test_failover_loses_an_unacknowledged_lock(replicated_pair: ReplicatedPair) -> None:
    """The loss replicas=N prevents: replicas=0, a stalled replica, the master
    killed: the lock is gone on the promoted replica, so a second holder gets it."""
    pair = replicated_pair
    async with Client.from_url(pair.master.url, command_timeout=2) as client:
        pair.stall()
        first = await client.lock("a").acquire()  # granted, never replicated
        pair.promote()
        async with on_new_master(pair) as other:
            second = await other.lock("a").try_acquire()
            assert second is not None, "the promoted replica had the lock"
            assert not first.lost  # (not yet noticed: two holders at once)
            await second.release()


async def test_failover_with_replicas_never_double_grants(
    replicated_pair: ReplicatedPair,
) -> None:
    """replicas=1: stalled, the acquisition is refused (nobody holds it after the
    failover either); healthy, the lock survives the promotion."""
    pair = replicated_pair
    async with client_for(pair, command_timeout=2) as client:
        held = await client.lock("kept").acquire()
        pair.stall()
        with pytest.raises(ReplicationError):
            await client.lock("refused").acquire()
        pair.promote()
        async with on_new_master(pair) as other:
            assert await other.lock("kept").try_acquire() is None, "double holder"
            assert await other.lock("refused").is_locked() is False
        assert held.fencing_token > 0


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
async def test_cluster_acknowledged_per_master(cluster: ClusterProcess) -> None:
    """Cluster mode: one acknowledged connection per master. Locks over every
    master are on their master's replica when acquired, renewed with a WAIT;
    asking for 2 replicas (each master has 1) refuses and undoes."""
    names = [f"c{i}" for i in range(12)]
    async with Client.from_url(cluster.url, replicas=1, replica_timeout=RT) as client:
        leases = await asyncio.gather(*(client.lock(n).acquire() for n in names))
        for name in names:
            key = f"aiolock:{{{name}}}"
            replica = cluster.replica_of(cluster.master_for_slot(cluster.slot_of(key)))
            with redis.Redis(
                host=replica.host, port=replica.port, single_connection_client=True
            ) as conn:
                conn.execute_command("READONLY")
                assert conn.exists(key) == 1, name
        assert len({cluster.master_for_slot(cluster.slot_of(f"{{{n}}}")).port for n in names}) > 1
        assert await seam.renew_now(client) is True
        await asyncio.gather(*(lease.release() for lease in leases))
        # A multi-lock over two masters: one acknowledged script per slot.
        async with client.multi_lock(*(client.lock(n) for n in names[:4])):
            pass
    async with (
        Client.from_url(cluster.url, replicas=2, replica_timeout=RT) as client,
        Client.from_url(cluster.url) as plain,
    ):
        with pytest.raises(ReplicationError) as caught:
            await client.lock("c0").acquire()
        assert (caught.value.acknowledged, caught.value.required) == (1, 2)

        async def undone() -> bool:
            return not await plain.lock("c0").is_locked()

        await eventually(undone, what="the undo")


async def test_unacknowledged_extension_keeps_the_expiry(replicated_pair: ReplicatedPair) -> None:
    """Lease.extend with a stalled replica: ReplicationError, the fixed lease's
    expiry unchanged (the master's longer TTL is not promised)."""
    pair = replicated_pair
    async with client_for(pair) as client:
        lease = await client.lock("a").acquire(lease=20)
        expires_at = lease._hold.expires_at
        pair.stall()
        with pytest.raises(ReplicationError):
            await lease.extend(60)
        assert lease._hold.expires_at == expires_at
        pair.resume()
        await lease.extend(60)
        assert lease._hold.expires_at > expires_at + 30
        await lease.release()


async def test_wait_aof_with_appendonly(replicated_pair: ReplicatedPair) -> None:
    """wait_aof=True with the append-only file on, on the master and the replica
    (WAITAOF counts replicas that fsynced to their own AOF; Valkey only: Redis
    7.0 has no WAITAOF): acknowledged by both fsyncs, refused when stalled."""
    pair = replicated_pair
    if pair.kind != "valkey":
        pytest.skip("WAITAOF needs Redis 7.2+; the redis-server here is older")
    servers = (pair.master, pair.replica)
    for server in servers:
        server.execute("CONFIG", "SET", "appendfsync", "always")
        server.execute("CONFIG", "SET", "appendonly", "yes")

    def aof_on() -> bool:
        for server in servers:
            info = server.info("persistence")
            if info.get("aof_enabled") != 1 or info.get("aof_rewrite_in_progress") != 0:
                return False
            if info.get("aof_rewrite_scheduled") != 0:
                return False
        return True

    try:
        await eventually(aof_on, what="the append-only files on")
        # A replica reports its fsynced offset with its acknowledgements, the
        # one after the fsync often only in the next second: so 1.2 s, not RT.
        async with client_for(pair, wait_aof=True, replica_timeout=1.2) as client:
            before = pair.wait_calls()
            async with client.lock("a"):
                assert pair.replica.execute("EXISTS", "aiolock:{a}") == 1
            assert pair.wait_calls() > before
            pair.stall()
            with pytest.raises(ReplicationError) as caught:
                await client.lock("a").acquire()
            assert (caught.value.acknowledged, caught.value.required) == (0, 1)
            await no_hold(pair.master)
    finally:
        for server in servers:
            server.execute("CONFIG", "SET", "appendonly", "no")
