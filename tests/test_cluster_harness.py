"""The cluster harness (tests/cluster_servers.py) does what it says, checked with
plain redis-py: the cluster forms, keys live where it says, failovers and slot
migrations complete and clients see their effects (MOVED, ASK)."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from tests.cluster_servers import SLOTS, ClusterNode, ClusterProcess
from tests.servers import LOOPBACK, _ping_once

KEY = "harness:{k}"


def _other_master(cluster: ClusterProcess, slot: int) -> ClusterNode:
    owner = cluster.master_for_slot(slot)
    return next(m for m in cluster.masters() if m.node_id != owner.node_id)


def test_cluster_forms(cluster: ClusterProcess) -> None:
    masters, replicas = cluster.masters(), cluster.replicas()
    assert len(masters) == 3
    assert len(replicas) == 3
    assert {cluster.replica_of(m).node_id for m in masters} == {r.node_id for r in replicas}
    assert sum(hi - lo + 1 for m in masters for lo, hi in cluster.slots_of(m)) == SLOTS
    for node in cluster.nodes:
        assert node.cluster_info()["cluster_state"] == "ok"
        assert node.running and node.pid is not None


def test_key_lives_on_its_master_and_replica(cluster: ClusterProcess) -> None:
    slot = cluster.slot_of(KEY)
    assert int(cluster.nodes[0].execute("CLUSTER", "KEYSLOT", KEY)) == slot
    with cluster.client() as rc:
        rc.set(KEY, "v")
    master = cluster.master_for_key(KEY)
    with master.admin_client() as direct:
        assert direct.get(KEY) == "v"
        assert int(direct.execute_command("WAIT", 1, 5000)) == 1  # type: ignore[no-untyped-call]
    with cluster.replica_of(master).admin_client() as replica:
        replica.execute_command("READONLY")  # type: ignore[no-untyped-call]
        assert replica.get(KEY) == "v"
    with _other_master(cluster, slot).admin_client() as wrong:
        with pytest.raises(redis.exceptions.MovedError):
            wrong.get(KEY)


def test_reset_empties_every_node(cluster: ClusterProcess) -> None:
    with cluster.client() as rc:
        for i in range(30):
            rc.set(f"k{i}", i)
        sha = rc.script_load("return 1")
    cluster.reset()
    for node in cluster.masters():
        assert node.execute("DBSIZE") == 0
    for node in cluster.nodes:
        assert node.execute("SCRIPT", "EXISTS", sha) == [0]


async def test_asyncio_cluster_client_on_cluster_url(cluster_url: str) -> None:
    rc = redis.asyncio.RedisCluster.from_url(cluster_url, decode_responses=True)
    try:
        await rc.set(KEY, "async")
        assert await rc.get(KEY) == "async"
    finally:
        await rc.aclose()


def test_faults_in_sequence(fresh_cluster: ClusterProcess) -> None:
    """One private cluster through kill/failover, restart, manual failover,
    pause/resume and a slot migration stopped half-way (one cluster, ~2 s to form)."""
    cluster = fresh_cluster
    slot = cluster.slot_of(KEY)
    with cluster.client() as rc:
        rc.set(KEY, "before")
    master = cluster.master_for_key(KEY)
    with master.admin_client() as direct:
        assert int(direct.execute_command("WAIT", 1, 5000)) == 1  # type: ignore[no-untyped-call]
    replica = cluster.replica_of(master)

    # SIGKILL the master: its replica takes over and writes work again.
    killed_slots = cluster.kill_master(master)
    assert any(lo <= slot <= hi for lo, hi in killed_slots)
    promoted = cluster.wait_for_failover(master)
    assert promoted.node_id == replica.node_id
    assert cluster.master_for_slot(slot).node_id == replica.node_id
    with cluster.client() as rc:
        assert rc.get(KEY) == "before"  # it had reached the replica (WAIT 1)
        rc.set(KEY, "after-failover")

    # The killed node comes back on its port as a replica of the new master.
    master.restart()
    cluster.wait_healthy()
    assert cluster.replica_of(promoted).node_id == master.node_id

    # Manual failover back to it.
    old = cluster.manual_failover(master)
    assert old.node_id == promoted.node_id
    assert cluster.master_for_slot(slot).node_id == master.node_id
    with cluster.client() as rc:
        assert rc.get(KEY) == "after-failover"

    # A short SIGSTOP of a replica is no failure.
    paused = cluster.replica_of(master)
    with paused.paused():
        assert not _ping_once(LOOPBACK, paused.port, timeout=0.2)
    assert _ping_once(LOOPBACK, paused.port, timeout=5.0)
    cluster.wait_healthy()

    # Slot migration, stopped half-way: ASK for moved keys, then MOVED.
    source = cluster.master_for_slot(slot)
    target = _other_master(cluster, slot)
    assert cluster.begin_migration(slot, target).node_id == source.node_id
    with source.admin_client() as direct:
        assert direct.get(KEY) == "after-failover"  # not moved yet: served here
        assert cluster.move_keys(slot) == 1
        with pytest.raises(redis.exceptions.AskError):
            direct.get(KEY)
    with cluster.client() as rc:
        assert rc.get(KEY) == "after-failover"  # redis-py follows the ASK
    cluster.finish_migration(slot, target)
    assert cluster.master_for_slot(slot).node_id == target.node_id
    with source.admin_client() as direct, pytest.raises(redis.exceptions.MovedError):
        direct.get(KEY)
    with cluster.client() as rc:
        assert rc.get(KEY) == "after-failover"

    # And the one-call migration moves it back.
    assert cluster.migrate_slot(slot, source) == 1
    assert cluster.master_for_key(KEY).node_id == source.node_id
    cluster.wait_healthy()
