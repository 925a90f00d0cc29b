"""The server matrix beyond the contract suite's runs (tests/test_contract.py
runs every contract on Redis 6.2 and Valkey 9.1 on one server, and Redlock's
over three such masters): a Sentinel deployment made of them (master,
replicas and Sentinels alike), and what Redis 6.2 lacks refused clearly, at
first use, naming the version."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from aiolock import Client, UnsupportedServerError
from aiolock.testing import seam
from tests.cluster_servers import ClusterProcess
from tests.conftest import MATRIX_BACKENDS, kind_and_binary, require_cluster_mode
from tests.core_util import assert_clean, eventually
from tests.sentinel_servers import SERVICE, SentinelSet
from tests.servers import LOOPBACK, ServerProcess
from tests.test_sentinel import keys_on

#: The Sentinel test's lease, watchdog-kept: it outlives a manual failover
#: (about 1 s here) and a loaded machine's stalls, and "woken by the
#: release" (within LEASE / 3) stays 10 s short of "by the holder's TTL".
LEASE = 15.0


@pytest.fixture
def redis62_cluster() -> Iterator[ClusterProcess]:
    require_cluster_mode()
    cluster = ClusterProcess(*kind_and_binary("redis-6.2"), node_timeout_ms=5000)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_a_redis_6_2_cluster_is_refused_at_first_use_naming_the_version(
    redis62_cluster: ClusterProcess,
) -> None:
    """A Cluster needs sharded pub/sub (Redis 7.0): the first command says so,
    and nothing is written."""
    async with Client.from_url(redis62_cluster.url, cluster=True) as client:
        lock = client.lock("x")
        with pytest.raises(UnsupportedServerError, match=r"6\.2.*needs Redis 7\.0") as info:
            await lock.acquire()
        assert "Redis 7.0" in str(info.value)
    for node in redis62_cluster.masters():
        assert node.execute("DBSIZE") == 0


def keys_while_master(node: ServerProcess) -> list[bytes] | None:
    """``node``'s keys if it answered ROLE master both before and after they
    were read (a demoted master copies the new one's keys), else None."""
    if SentinelSet.role(node) != "master":
        return None
    keys = keys_on(node)
    return keys if SentinelSet.role(node) == "master" else None


@pytest.fixture(params=MATRIX_BACKENDS)
def matrix_sentinel_set(request: pytest.FixtureRequest) -> Iterator[SentinelSet]:
    """A Sentinel set (tests/sentinel_servers.py) of one matrix server: its
    master, two replicas and three Sentinels all run that binary. Started for
    the one test that uses it and stopped after it (not shared: its only user
    fails the master over)."""
    require_cluster_mode()  # local processes only, as the shared Sentinel sets
    sentinel_set = SentinelSet(*kind_and_binary(request.param))
    sentinel_set.start()
    try:
        yield sentinel_set
    finally:
        sentinel_set.stop()


async def test_a_sentinel_deployment_of_matrix_servers(
    matrix_sentinel_set: SentinelSet,
) -> None:
    """On a Sentinel set of Redis 6.2 (or Valkey 9.1) servers: acquire and
    release, a contended lock handed to the waiter by the release, and a
    manual failover followed: the hold taken before it is still held on the
    promoted master, the waiter parked across it gets the lock, new holds are
    granted on the new master and none on the old one (a writable master for
    seconds after the switch)."""
    s = matrix_sentinel_set
    versions = {node.version for node in s.nodes}
    major = "6." if s.kind == "redis" else "9."
    assert len(versions) == 1 and versions.pop().startswith(major), versions
    async with (
        Client.from_sentinel(s.sentinel_addresses, SERVICE, prefix="st", lease=LEASE) as a,
        Client.from_sentinel(s.sentinel_addresses, SERVICE, prefix="st", lease=LEASE) as b,
    ):
        # Acquire and release: written on the master the Sentinels name.
        lease = await a.lock("plain").acquire()
        assert b"st:{plain}" in keys_on(s.master)
        assert await b.lock("plain").try_acquire() is None
        await lease.release()
        assert b"st:{plain}" not in keys_on(s.master)

        # Contention: B parks, A's release hands the lock over (by the
        # release's notice: well before A's lease would have run out).
        held = await a.lock("handed").acquire()
        waiting = asyncio.create_task(b.lock("handed").acquire(timeout=30))
        await eventually(lambda: b.statistics().waiting == 1, what="B parked")
        await held.release()
        async with asyncio.timeout(LEASE / 3):
            got = await waiting
        assert got.fencing_token > held.fencing_token
        await got.release()

        # A failover followed: A holds, B waits on it, SENTINEL FAILOVER.
        before = await a.lock("across").acquire()
        # Both replicas have the hold before the failover starts (an event,
        # not a hope: the promoted one must have it).
        assert s.master.execute("WAIT", 2, 10_000) == 2
        waiter = asyncio.create_task(b.lock("across").acquire(timeout=60))
        await eventually(lambda: b.statistics().waiting == 1, what="B parked on the hold")
        before_old = set(keys_on(s.master))
        old = await asyncio.to_thread(s.manual_failover)
        new = await asyncio.to_thread(s.wait_for_switch, old)
        watches = [seam.engine(client).deployment.watch for client in (a, b)]
        await eventually(
            lambda: all(w is not None and w.known == (LOOPBACK, new.port) for w in watches),
            timeout=LEASE,  # +switch-master, or the watch's next questions (2 s apart)
            what="both Clients saw the switch",
        )
        assert b"st:{across}" in keys_on(new), "the promoted master lacks the hold"
        assert not before.lost, before.lost_reason
        assert not waiter.done()
        await before.release()
        after = await asyncio.wait_for(waiter, LEASE / 3 + LEASE)
        assert after.fencing_token > before.fencing_token
        await after.release()
        lock = a.lock("fresh")
        await lock.acquire(timeout=10)
        assert b"st:{fresh}" in keys_on(new)
        await lock.release()
        await assert_clean(a, b)
        # No new key of the Clients on the old master since the failover,
        # while it is still a master (once demoted it copies the new master's).
        keys = keys_while_master(old)
        if keys is not None:
            assert set(keys) <= before_old, "something was written on the old master"
