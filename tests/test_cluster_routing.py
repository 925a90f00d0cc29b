"""Cluster mode, the API and the routing (issue 11, items 1 and 2), on a real
local cluster (the ``cluster`` fixture: 3 masters + 3 replicas, Redis and Valkey).

* API: ``Client.from_url(seed, cluster=True)`` from a master or a replica,
  ``cluster=None`` finding out, ``cluster=False`` on a cluster node failing
  clearly, ``Client(RedisCluster(...))`` (credentials; the user's client is not
  closed), ``Client(Redis(<cluster node>))`` refused, a bad ``cluster=``, the
  version check.
* Routing: one command connection per master, slots computed locally, MOVED,
  ASK (with ASKING, on a connection not yet made), TRYAGAIN, CLUSTERDOWN, NOSCRIPT
  per node, and cancellation on the routing path.

Tests that change the cluster (a slot moved or unassigned, a password) put it
back in a ``finally`` and the ``restore`` fixture checks (and repairs) the slot
owners afterwards, so the shared cluster stays as the next test expects it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from aiolock import (
    Client,
    ConnectionFailedError,
    InvalidArgumentTypeError,
    LockTimeoutError,
    UnsupportedServerError,
)
from aiolock._core.engine import Engine
from aiolock._core.errors import ServerRefusedError, ServerUnavailableError
from aiolock._core.protocol.runner import Program
from aiolock._core.protocol.scripts import Script
from aiolock._core.topology.cluster import check_version, server_version
from aiolock._core.topology.mux import ClusterMux
from tests.cluster_servers import CLUSTER_TIMEOUT, ClusterNode, ClusterProcess
from tests.servers import LOOPBACK

PASSWORD = "s3cret-cluster"
#: The lease of a hold that must be renewed here (the renewal lane's use is
#: checked). Each renewal, due every lease / 3, must be answered within 2/3 of
#: a lease; the first one opens the lane's connection to the master (and
#: authenticates). Measured on a 2-core box at load average 11 to 13: up to
#: 0.71 s for such a first renewal, and up to 0.78 s of event-loop lag besides
#: (see MIGRATION_LEASE in test_cluster_failover.py). A 0.6 s lease was lost to
#: a renewal timeout under such load; 3 s allows 2 s.
RENEWED_LEASE = 3.0


def within_deadline(client: Client) -> float:
    """How long an acquire whose every try gets CLUSTERDOWN may take to fail,
    whatever (short) timeout its caller gave.

    It gives up at its deadline; a try still on the wire then gets
    ``REPLY_GRACE`` (1 s) for its reply (compete.py). Had it ignored the
    deadline, it would have failed only when ``client``'s command lane gave
    up, its re-sends bounded by ``command_timeout`` (10 s by default), or,
    with a lane quicker to give up than the caller, never (each failed try
    retried). "Gave up at its deadline, not the lane's" is a third of that,
    as "woken, not by the TTL" is a third of the lease. (It was a fixed 3 s:
    on 2 busy cores the second case below took 2.1 s, its 1 s timeout, a
    grace and the loop's lag.)"""
    return client.command_timeout / 3


# --------------------------------------------------------------------------- helpers


def engine_of(client: Client) -> Engine:
    return client._engine


def name_on(cluster: ClusterProcess, master: ClusterNode, tag: str = "n") -> str:
    """A lock name whose keys (``aiolock:{name}...``) live on ``master``."""
    for i in range(100_000):
        name = f"{tag}{i}"
        if cluster.master_for_key(f"aiolock:{{{name}}}").node_id == master.node_id:
            return name
    raise AssertionError("no name found")


def names_on_every_master(cluster: ClusterProcess) -> dict[str, str]:
    """address of each master -> a lock name on it."""
    return {m.address: name_on(cluster, m) for m in cluster.masters()}


def other_master(cluster: ClusterProcess, node: ClusterNode) -> ClusterNode:
    return next(m for m in cluster.masters() if m.node_id != node.node_id)


def aiolock_connections(node: ClusterNode, client: Client) -> list[dict[str, str]]:
    """CLIENT LIST entries of ``client``'s connections on ``node``."""
    wanted = f"aiolock:{client.id[:12]}"
    with node.admin_client() as admin:
        entries: list[dict[str, Any]] = admin.client_list()
    return [e for e in entries if e.get("name") == wanted]


def is_pubsub(entry: dict[str, str]) -> bool:
    return int(entry.get("sub", 0)) + int(entry.get("psub", 0)) + int(entry.get("ssub", 0)) > 0


def keys_in_slot(node: ClusterNode, slot: int) -> int:
    return int(node.execute("CLUSTER", "COUNTKEYSINSLOT", slot))


def migrate_back(cluster: ClusterProcess, slot: int, source: ClusterNode) -> None:
    """After a test moved ``slot`` away from ``source``: move it back (a migration
    left half way is the ``restore`` fixture's)."""
    if cluster.master_for_slot(slot).node_id != source.node_id:
        cluster.migrate_slot(slot, source)


def command_calls(node: ClusterNode, command: str) -> int:
    stats = node.info("commandstats")
    entry = stats.get(f"cmdstat_{command}")
    return int(entry["calls"]) if entry else 0


async def until(predicate: Any, what: str, timeout: float = 10.0) -> None:
    """Wait for an event the test itself observes (loop-turn polling, bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.fixture
def restore(cluster: ClusterProcess) -> Iterator[list[int]]:
    """The slots a test moves or unassigns (it appends them): afterwards each is
    served again by the master that served it before, as every node agrees."""
    before = cluster.wait_agreed()
    touched: list[int] = []
    yield touched
    masters = [cluster.node_by_id(node_id) for node_id in before]
    for slot in touched:  # (a migration left half way: no node agrees to disagree)
        for node in masters:
            with contextlib.suppress(redis.RedisError):
                node.execute("CLUSTER", "SETSLOT", slot, "STABLE")
    with contextlib.suppress(TimeoutError):
        if cluster.wait_agreed(timeout=5) == before:
            return
    owner = {}
    for node_id, ranges in before.items():
        for lo, hi in ranges:
            owner.update(dict.fromkeys(range(lo, hi + 1), node_id))
    cluster.reset()
    for slot in touched:
        with contextlib.suppress(redis.RedisError):
            cluster.node_by_id(owner[slot]).execute("CLUSTER", "ADDSLOTS", slot)
        for node in masters:
            node.execute("CLUSTER", "SETSLOT", slot, "NODE", owner[slot])
    assert cluster.wait_agreed() == before


# --------------------------------------------------------------------------- API


async def hold_everywhere(client: Client, names: dict[str, str]) -> None:
    """Take and release one lock per master."""
    for name in names.values():
        async with client.lock(name):
            pass


@pytest.mark.parametrize("seed", ["master", "replica"])
async def test_from_url_cluster_true_discovers_from_any_node(
    cluster: ClusterProcess, seed: str
) -> None:
    node = cluster.masters()[1] if seed == "master" else cluster.replicas()[0]
    names = names_on_every_master(cluster)
    async with Client.from_url(f"redis://{LOOPBACK}:{node.port}", cluster=True) as client:
        engine = engine_of(client)
        assert engine.cluster is True
        await hold_everywhere(client, names)
        assert engine.topology is not None
        assert engine.topology.masters() == sorted(names)
        assert isinstance(engine.mux, ClusterMux)
        assert engine.mux.nodes == sorted(names)


@pytest.mark.parametrize("seed", ["master", "replica"])
async def test_default_finds_out_and_switches_to_cluster_mode(
    cluster: ClusterProcess, seed: str
) -> None:
    node = cluster.masters()[0] if seed == "master" else cluster.replicas()[0]
    names = names_on_every_master(cluster)
    async with Client.from_url(f"redis://{LOOPBACK}:{node.port}") as client:
        engine = engine_of(client)
        assert engine.cluster is None  # not known before the first command
        held = {}
        for address, name in names.items():
            lease = await client.lock(name).acquire()
            held[address] = (name, lease)
        assert engine.cluster is True
        assert isinstance(engine.mux, ClusterMux)
        # Each lock's keys are on its slot's master, in Redis.
        for master in cluster.masters():
            name, _ = held[master.address]
            assert master.execute("EXISTS", client.key(name)) == 1
        for _, lease in held.values():
            await lease.release()


async def test_cluster_false_on_a_cluster_node_fails_clearly(cluster: ClusterProcess) -> None:
    seed = cluster.masters()[0]
    elsewhere = name_on(cluster, other_master(cluster, seed))
    async with Client.from_url(f"redis://{LOOPBACK}:{seed.port}", cluster=False) as client:
        with pytest.raises(UnsupportedServerError, match="cluster=True or None") as info:
            async with asyncio.timeout(10):
                await client.lock(elsewhere).acquire()
        assert "MOVED" in str(info.value.__cause__)
        assert engine_of(client).cluster is False
    for master in cluster.masters():
        assert master.execute("DBSIZE") == 0  # nothing ran


async def test_plain_redis_client_on_a_cluster_node_is_refused(cluster: ClusterProcess) -> None:
    node = cluster.masters()[0]
    user = aioredis.Redis(host=LOOPBACK, port=node.port)
    try:
        client = Client(user)
        with pytest.raises(UnsupportedServerError, match="RedisCluster"):
            await client.lock(name_on(cluster, node)).acquire()
        await client.aclose()
        assert await user.ping()  # the user's client is the user's
    finally:
        await user.aclose()
    for master in cluster.masters():
        assert master.execute("DBSIZE") == 0  # nothing changed in Redis


def test_bad_cluster_argument_is_refused_before_any_io() -> None:
    # Port 1: nothing listens there; the check comes before any connection.
    for bad in ("yes", 1, 0, []):
        with pytest.raises(InvalidArgumentTypeError, match="cluster must be"):
            Client.from_url("redis://127.0.0.1:1", cluster=bad)  # type: ignore[arg-type]


async def test_user_cluster_client_is_used_and_not_closed(cluster: ClusterProcess) -> None:
    names = names_on_every_master(cluster)
    user = RedisCluster(host=LOOPBACK, port=cluster.nodes[0].port)
    try:
        client = Client(user)
        await hold_everywhere(client, names)
        assert engine_of(client).cluster is True
        await client.aclose()
        assert await user.set("still-open", "1")  # not closed by aclose()
    finally:
        await user.aclose()


async def test_user_cluster_client_brings_its_credentials(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    """Nodes that need a password: the RedisCluster's password reaches every
    connection aiolock makes (commands on each master, renewals, pub/sub)."""
    nodes = list(cluster.nodes)
    for node in nodes:
        node.execute("CONFIG", "SET", "masterauth", PASSWORD)
    for node in nodes:
        node.execute("CONFIG", "SET", "requirepass", PASSWORD)
    try:
        names = names_on_every_master_authed(cluster, nodes)
        user = RedisCluster(host=LOOPBACK, port=nodes[0].port, password=PASSWORD)
        try:
            async with Client(user, lease=RENEWED_LEASE) as client, Client(user) as other:
                name = next(iter(names.values()))
                lease = await client.lock(name).acquire()
                waiter = asyncio.ensure_future(other.lock(name).acquire())
                # A waiter subscribes (pub/sub, with the password), the
                # watchdog renews (the renewal lane, with the password).
                renew_mux = engine_of(client).renew_mux
                assert isinstance(renew_mux, ClusterMux)
                await until(lambda: renew_mux.nodes != [] and renew_mux.in_flight == 0, "a renewal")
                await until(lambda: other.statistics().waiting == 1, "the waiter parked")
                await lease.release()
                await (await waiter).release()
                await hold_everywhere(client, names)
        finally:
            await user.aclose()
        # Without the password: refused, and said so.
        with pytest.raises(ServerRefusedError, match="NOAUTH"):
            async with Client.from_url(f"redis://{LOOPBACK}:{nodes[0].port}") as bare:
                await bare.lock("x").acquire()
    finally:
        for node in nodes:
            with redis.Redis(host=LOOPBACK, port=node.port, password=PASSWORD) as admin:
                admin.config_set("requirepass", "")
                admin.config_set("masterauth", "")


def names_on_every_master_authed(
    cluster: ClusterProcess, nodes: list[ClusterNode]
) -> dict[str, str]:
    """``names_on_every_master`` while the nodes need a password (the harness'
    admin connections have none): the slot map read with it."""
    with redis.Redis(host=LOOPBACK, port=nodes[0].port, password=PASSWORD) as admin:
        slots = admin.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
    owners: dict[str, list[tuple[int, int]]] = {}
    for entry in slots:
        host = entry[2][0].decode() if isinstance(entry[2][0], bytes) else entry[2][0]
        address = f"{host}:{entry[2][1]}"
        owners.setdefault(address, []).append((int(entry[0]), int(entry[1])))
    found: dict[str, str] = {}
    for i in range(100_000):
        slot = cluster.slot_of(f"aiolock:{{n{i}}}")
        for address, ranges in owners.items():
            if address not in found and any(lo <= slot <= hi for lo, hi in ranges):
                found[address] = f"n{i}"
        if len(found) == len(owners):
            return found
    raise AssertionError("no names found")


async def test_version_check_on_real_info_text(cluster: ClusterProcess) -> None:
    """The version check reads ``INFO server`` of each master. There is no
    Redis < 7.0 binary on this machine, so the refusal is shown on the real
    INFO text of this cluster's servers with its ``redis_version`` line set to
    an old version (a pure function on text: no server is faked)."""
    async with Client.from_url(cluster.url) as client:
        await client.lock("v").acquire()
        engine = engine_of(client)
        assert isinstance(engine.mux, ClusterMux)
        name = engine.mux.nodes[0]
        raw = await engine.mux.connection(name).call(b"INFO", b"server")
        await client.lock("v").release()
    text = raw.decode()
    version = server_version(text)
    assert version is not None and version >= (7, 0)
    if cluster.kind == "valkey":
        assert "valkey_version:" in text  # and redis_version: 7.2.x beside it
    check_version(name, text)  # no error
    old = re.sub(r"^redis_version:\S+", "redis_version:6.2.14", text, flags=re.M)
    assert server_version(old) == (6, 2)
    with pytest.raises(UnsupportedServerError, match=r"needs Redis 7\.0 or Valkey 7\.2"):
        check_version(name, old)
    assert server_version("# Server\r\nfoo:bar\r\n") is None


async def test_cluster_true_on_a_standalone_server_fails_clearly(url: str) -> None:
    async with Client.from_url(url, cluster=True) as client:
        with pytest.raises(UnsupportedServerError, match="not a Redis Cluster node"):
            await client.lock("x").acquire()


# --------------------------------------------------------------------------- routing


def cluster_mux(client: Client) -> ClusterMux:
    mux = engine_of(client).mux
    assert isinstance(mux, ClusterMux)
    return mux


async def settled(client: Client, timeout: float | None = None) -> ClusterMux:
    """The Client's command lane once it found the cluster (one acquire;
    ``timeout``: its first contacts may fail until then, as any wait with a
    timeout rides out failed tries)."""
    async with client.lock("settle")(timeout=timeout):
        pass
    return cluster_mux(client)


async def test_one_command_connection_per_master_slots_computed_locally(
    cluster: ClusterProcess,
) -> None:
    masters = cluster.masters()
    for master in masters:
        master.execute("CONFIG", "RESETSTAT")
    names = names_on_every_master(cluster)
    async with Client.from_url(cluster.url) as client:
        for _ in range(3):
            await hold_everywhere(client, names)

        # (Besides its sharded pub/sub link per master: its eviction channels.)
        def commands(m: Any) -> list[Any]:
            return [e for e in aiolock_connections(m, client) if not is_pubsub(e)]

        def one_each() -> bool:  # (the first INFO's connection to the seed closes)
            return all(len(commands(m)) == 1 for m in masters)

        await until(one_each, "one command connection per master")

        # The renewal lane and the pub/sub connection, where they are used: a
        # hold renewed on one master, and a waiter there.
        master = masters[0]
        name = names[master.address]
        async with Client.from_url(cluster.url, lease=RENEWED_LEASE) as renewing:
            lease = await renewing.lock(name).acquire()
            renew_mux = engine_of(renewing).renew_mux
            assert isinstance(renew_mux, ClusterMux)
            await until(
                lambda: renew_mux.nodes == [master.address] and renew_mux.in_flight == 0,
                "a renewal",
            )
            waiter = asyncio.ensure_future(client.lock(name).acquire())
            await until(
                lambda: (
                    client.statistics().subscriptions == 1
                    and [is_pubsub(e) for e in aiolock_connections(master, client)].count(True) == 1
                ),
                "the waiter's sharded subscription",
            )
            mine = aiolock_connections(master, client)
            assert sorted(is_pubsub(e) for e in mine) == [False, True]
            theirs = aiolock_connections(master, renewing)
            # commands, renewals, and its eviction channel's sharded link
            assert sorted(is_pubsub(e) for e in theirs) == [False, False, True]
            for other in masters[1:]:
                assert len(aiolock_connections(other, renewing)) == 1
                assert sorted(is_pubsub(e) for e in aiolock_connections(other, client)) == [
                    False,
                    True,
                ]
            await lease.release()
            await (await waiter).release()
    for master in masters:
        assert command_calls(master, "cluster|keyslot") == 0  # slots computed locally
        assert command_calls(master, "evalsha") > 0


async def test_moved_is_followed_and_corrects_the_map(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    source = cluster.masters()[0]
    target = other_master(cluster, source)
    name = name_on(cluster, source)
    # Poll mode: no eviction channel (a holder's sharded pub/sub link), whose
    # server-sent sunsubscribe would tell the Client of the move before the MOVED.
    async with Client.from_url(cluster.url, notify="poll") as client:
        mux = await settled(client)
        slot = cluster.slot_of(client.key(name))
        topology = engine_of(client).topology
        assert topology is not None
        async with client.lock(name) as lease:
            first = lease.fencing_token
        restore.append(slot)
        try:
            await asyncio.to_thread(cluster.migrate_slot, slot, target)
            assert topology.node(slot) == source.address  # stale: nobody told the Client
            before = mux.redirects
            async with client.lock(name) as lease:
                assert lease.fencing_token > first  # the fence moved with the slot
                assert target.execute("EXISTS", client.key(name)) == 1
            assert mux.redirects == before + 1  # one MOVED
            assert topology.node(slot) == target.address
        finally:
            await asyncio.to_thread(migrate_back, cluster, slot, source)


async def test_ask_goes_with_asking_even_on_a_connection_not_yet_made(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    """Mid-migration (keys moved, SETSLOT NODE not done): a command for a key
    the source no longer has gets ASK; ASKING and the command go to the target
    back to back, also when that connection is still being made, and with a
    script the target lacks (its script cache is its own) its load goes first,
    before ASKING: never between ASKING and the command."""
    source = cluster.masters()[0]
    target = other_master(cluster, source)
    key = f"aiolock:{{{name_on(cluster, source)}}}:plain"
    slot = cluster.slot_of(key)
    script = b"return redis.call('GET', KEYS[1])"
    sha = hashlib.sha1(script).hexdigest().encode()
    program = Program(Script("get", script.decode(), sha.decode()))
    async with Client.from_url(cluster.url) as client:
        await settled(client)
        topology = engine_of(client).topology
        assert topology is not None
        restore.append(slot)
        # A lane of its own, with no connection yet.
        mux = ClusterMux(topology, command_timeout=5.0)
        try:
            await asyncio.to_thread(cluster.begin_migration, slot, target)
            assert mux.nodes == []
            assert await mux.call(b"SET", key, b"v") == b"OK"
            assert mux.nodes == sorted([source.address, target.address])
            assert mux.redirects == 1  # one ASK, and no MOVED back: ASKING came first
            assert keys_in_slot(target, slot) == 1
            assert keys_in_slot(source, slot) == 0
            assert topology.node(slot) == source.address  # ASK does not change the map

            assert target.execute("SCRIPT", "EXISTS", sha) == [0]
            assert await mux.call(*program.command((key,), ()), script=program) == b"v"
            assert mux.redirects == 2  # one ASK more; loaded there, then ASKING
            assert target.execute("SCRIPT", "EXISTS", sha) == [1]
        finally:
            await mux.aclose()
            await asyncio.to_thread(migrate_back, cluster, slot, source)


async def test_an_acquire_rides_out_a_migration_and_follows_the_slot(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    """A lock's scripts take several keys, some absent (its waiting set...):
    while the slot is migrating, the target refuses them (TRYAGAIN: Redis runs
    a multi-key command on an importing slot only if it has every key), the
    source sends them there (ASK). Re-sent with backoff until SETSLOT NODE;
    then MOVED, and the map follows."""
    source = cluster.masters()[0]
    target = other_master(cluster, source)
    name = name_on(cluster, source)
    async with Client.from_url(cluster.url) as client:
        mux = await settled(client)
        key = client.key(name)
        slot = cluster.slot_of(key)
        restore.append(slot)
        topology = engine_of(client).topology
        assert topology is not None
        try:
            async with client.lock(name) as lease:
                first = lease.fencing_token
            await asyncio.to_thread(cluster.begin_migration, slot, target)
            await asyncio.to_thread(cluster.move_keys, slot, target)
            before = mux.redirects
            acquire = asyncio.ensure_future(client.lock(name).acquire(timeout=30))
            await until(lambda: mux.redirects >= before + 2, "ASK, then TRYAGAIN")
            assert not acquire.done()
            await asyncio.to_thread(cluster.finish_migration, slot, target)
            lease = await acquire
            assert lease.fencing_token > first
            # The acquire's last re-send may have reached the target by ASK
            # (the source's SETSLOT NODE not run yet at that moment): no MOVED
            # then. The next command for the slot (the release) gets one from
            # the source, now that both SETSLOTs ran, and the map follows.
            await lease.release()
            assert topology.node(slot) == target.address
            assert keys_in_slot(target, slot) == 1  # the fence
        finally:
            await asyncio.to_thread(migrate_back, cluster, slot, source)


async def test_tryagain_is_ridden_out_while_a_migration_splits_the_keys(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    """A multi-key script (release: the lock, its fence, its signal list and
    waiting set) while its keys are split (the fence moved, the lock not,
    the others absent): TRYAGAIN from the source (Redis runs a multi-key
    command on a migrating slot only where all its keys are), re-sent after
    a backoff until the migration ends."""
    source = cluster.masters()[0]
    target = other_master(cluster, source)
    name = name_on(cluster, source)
    async with Client.from_url(cluster.url) as client:
        mux = await settled(client)
        key = client.key(name)
        slot = cluster.slot_of(key)
        restore.append(slot)
        try:
            lease = await client.lock(name).acquire()
            first = lease.fencing_token
            await asyncio.to_thread(cluster.begin_migration, slot, target)
            source.execute("MIGRATE", LOOPBACK, target.port, "", 0, 5000, "KEYS", key + ":fence")
            before = mux.redirects
            release = asyncio.ensure_future(lease.release())
            await until(lambda: mux.redirects > before, "a TRYAGAIN")
            assert not release.done()
            assert keys_in_slot(source, slot) == 1  # the lock, still held
            await asyncio.to_thread(cluster.migrate_slot, slot, target)  # the rest, and done
            await release
            assert keys_in_slot(target, slot) == 1  # released there: the fence is left
            assert keys_in_slot(source, slot) == 0
            async with client.lock(name) as again:
                assert again.fencing_token > first
        finally:
            await asyncio.to_thread(migrate_back, cluster, slot, source)


async def test_clusterdown_is_ridden_out_within_the_callers_timeout(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    owner = cluster.masters()[0]
    name = name_on(cluster, owner)
    async with Client.from_url(cluster.url) as client:
        mux = await settled(client)
        slot = cluster.slot_of(client.key(name))
        restore.append(slot)
        owner.execute("CLUSTER", "DELSLOTS", slot)
        try:
            before = mux.redirects
            acquire = asyncio.ensure_future(client.lock(name).acquire(timeout=20))
            await until(lambda: mux.redirects >= before + 2, "CLUSTERDOWN replies")
            assert not acquire.done()
        finally:
            owner.execute("CLUSTER", "ADDSLOTS", slot)
        lease = await acquire
        await lease.release()
        topology = engine_of(client).topology
        assert topology is not None and topology.node(slot) == owner.address


async def test_clusterdown_past_the_callers_timeout_fails_and_leaves_nothing(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    owner = cluster.masters()[0]
    name = name_on(cluster, owner)
    async with (
        Client.from_url(cluster.url) as client,
        Client.from_url(cluster.url, command_timeout=0.2) as impatient,
        Client.from_url(cluster.url) as other,
    ):
        await settled(client)
        # Its first contacts (the slot map, each master's INFO, the script's
        # first run) are each bounded by its 0.2 s command_timeout, which a
        # loaded machine's event loop can miss: a set-up, ridden out.
        await settled(impatient, timeout=CLUSTER_TIMEOUT)
        key = client.key(name)
        slot = cluster.slot_of(key)
        restore.append(slot)
        owner.execute("CLUSTER", "DELSLOTS", slot)
        try:
            loop = asyncio.get_running_loop()
            # As documented for an outage: ConnectionFailedError when the
            # deadline comes while the command is still being re-sent (for up
            # to command_timeout): the lock was never found busy...
            began = loop.time()
            with pytest.raises(ConnectionFailedError, match="never found busy") as info:
                await client.lock(name).acquire(timeout=0.5)
            assert not isinstance(info.value, LockTimeoutError)
            assert loop.time() - began < within_deadline(client)
            # ... ConnectionFailedError when its tries failed until then (the
            # command lane gave up after command_timeout, the wait retried).
            began = loop.time()
            with pytest.raises(ConnectionFailedError, match="CLUSTERDOWN") as info:
                await impatient.lock(name).acquire(timeout=1.0)
            assert loop.time() - began < within_deadline(client)
            assert "CLUSTERDOWN" in str(info.value.__cause__)
        finally:
            owner.execute("CLUSTER", "ADDSLOTS", slot)
        assert owner.execute("EXISTS", key) == 0  # nothing held
        assert owner.execute("EXISTS", key + ":fence") == 0  # no acquire ran
        lease = await other.lock(name).acquire(timeout=10)
        await lease.release()


async def test_a_command_whose_caller_left_during_backoff_is_not_resent(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    owner = cluster.masters()[0]
    async with Client.from_url(cluster.url) as client:
        await settled(client)
        topology = engine_of(client).topology
        assert topology is not None
        key = f"aiolock:{{{name_on(cluster, owner)}}}:plain"
        slot = cluster.slot_of(key)
        restore.append(slot)
        mux = ClusterMux(topology, command_timeout=10.0)
        orphaned: asyncio.Future[tuple[Any, BaseException | None]] = (
            asyncio.get_running_loop().create_future()
        )
        owner.execute("CLUSTER", "DELSLOTS", slot)
        try:
            fut = mux.submit(b"SET", key, b"v", orphan=lambda r, e: orphaned.set_result((r, e)))
            await until(lambda: mux.redirects >= 1, "a CLUSTERDOWN")
            fut.cancel()  # the caller leaves while the command backs off
        finally:
            owner.execute("CLUSTER", "ADDSLOTS", slot)
        try:
            reply, error = await asyncio.wait_for(orphaned, 5)
        finally:
            await mux.aclose()
        assert reply is None
        assert isinstance(error, ServerUnavailableError) and error.code == "CLUSTERDOWN"
        assert owner.execute("EXISTS", key) == 0  # never re-sent


async def test_noscript_is_handled_per_node(cluster: ClusterProcess) -> None:
    names = names_on_every_master(cluster)
    async with Client.from_url(cluster.url) as client:
        await hold_everywhere(client, names)
        sha = engine_of(client).scripts["acquire"].sha
        flushed, *others = cluster.masters()
        await asyncio.to_thread(flushed.script_flush)
        assert flushed.execute("SCRIPT", "EXISTS", sha) == [0]
        async with client.lock(names[flushed.address]):
            pass
        assert flushed.execute("SCRIPT", "EXISTS", sha) == [1]  # reloaded there
        for node in others:
            assert node.execute("SCRIPT", "EXISTS", sha) == [1]


async def test_cancelled_while_finding_the_cluster(cluster: ClusterProcess) -> None:
    name = name_on(cluster, cluster.masters()[0])
    async with Client.from_url(cluster.url) as client:
        engine = engine_of(client)
        first = asyncio.ensure_future(client.lock(name).acquire())
        await until(lambda: engine._settling is not None, "the cluster being found")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await until(lambda: engine.cluster is True, "cluster mode")
        key = client.key(name)
        assert cluster.master_for_key(key).execute("EXISTS", key + ":fence") == 0  # never sent
        async with client.lock(name):
            pass


async def test_cancelled_while_being_redirected_holds_nothing(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    """The caller leaves while its acquire is on the wire to the slot's old
    master: the MOVED that comes back is not followed (nobody waits), so the
    acquire never runs on the new one."""
    source = cluster.masters()[0]
    target = other_master(cluster, source)
    name = name_on(cluster, source)
    # ``client`` polls: no eviction channel, whose sunsubscribe on the move would
    # refresh the map before the acquire goes to the old master.
    async with (
        Client.from_url(cluster.url, notify="poll") as client,
        Client.from_url(cluster.url) as other,
    ):
        mux = await settled(client)
        key = client.key(name)
        slot = cluster.slot_of(key)
        restore.append(slot)
        try:
            async with client.lock(name):
                pass
            await asyncio.to_thread(cluster.migrate_slot, slot, target)
            issued = target.execute("HGET", key + ":fence", "t")
            before = mux.redirects
            source.pause()  # (briefly: well within the node timeout)
            try:
                acquire = asyncio.ensure_future(client.lock(name).acquire())
                await until(lambda: mux.in_flight > 0, "the acquire on the wire")
                acquire.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await acquire
            finally:
                source.resume()
            await until(lambda: mux.redirects > before, "the MOVED")
            assert target.execute("EXISTS", key) == 0  # nothing held
            assert target.execute("HGET", key + ":fence", "t") == issued  # never ran there
            lease = await other.lock(name).acquire(timeout=10)
            await lease.release()
        finally:
            await asyncio.to_thread(migrate_back, cluster, slot, source)


async def test_discovery_that_fails_at_first_is_tried_again(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    """The seed says a slot has no master (cluster=None found a cluster node,
    then its slot map was incomplete): the Client's first acquire rides it out,
    discovering again, and works once the slot is served."""
    seed = cluster.masters()[0]
    elsewhere = name_on(cluster, other_master(cluster, seed))
    slot = cluster.slot_of(f"aiolock:{{{name_on(cluster, seed)}}}")
    restore.append(slot)
    seed.execute("CLUSTER", "DELSLOTS", slot)
    try:
        async with Client.from_url(f"redis://{LOOPBACK}:{seed.port}") as client:
            engine = engine_of(client)
            acquire = asyncio.ensure_future(client.lock(elsewhere).acquire(timeout=30))

            def failed_once() -> bool:
                task = engine._settling
                return task is not None and task.done() and task.exception() is not None

            await until(failed_once, "a failed discovery")
            assert engine.cluster is True  # a cluster node: that much is known
            seed.execute("CLUSTER", "ADDSLOTS", slot)
            lease = await acquire
            await lease.release()
    finally:
        with contextlib.suppress(redis.RedisError):
            seed.execute("CLUSTER", "ADDSLOTS", slot)


async def test_a_slot_that_changes_master_has_its_holds_checked(
    cluster: ClusterProcess, restore: list[int]
) -> None:
    """A slot's master changed without any connection of this Client lost (a
    migration here; a FAILOVER FORCE or TAKEOVER looks the same): the new
    master may lack the last writes, so the Client starts a new epoch and
    checks its holds there. A hold that moved with its slot is confirmed and
    kept; nothing is reported lost."""
    source = cluster.masters()[0]
    target = other_master(cluster, source)
    name = name_on(cluster, source, tag="epoch")
    # Poll mode: no eviction channel (a holder's sharded pub/sub link), whose
    # server-sent sunsubscribe would tell the Client of the move before the MOVED.
    async with Client.from_url(cluster.url, notify="poll") as client:
        mux = await settled(client)
        engine = engine_of(client)
        slot = cluster.slot_of(client.key(name))
        restore.append(slot)
        lease = await client.lock(name).acquire()
        try:
            epoch, connects = engine.epoch, mux.connects
            await asyncio.to_thread(cluster.migrate_slot, slot, target)
            other = other_master(cluster, target)
            await client.lock(name_on(cluster, other, tag="other")).acquire()  # no MOVED
            assert engine.epoch == epoch  # nothing told the Client yet
            # The next command on the slot gets MOVED: the map changes.
            assert await client.lock(name).is_locked()
            assert engine.epoch > epoch and mux.connects == connects  # no connection lost
            verifier = engine.verifier
            assert verifier is not None
            await asyncio.wait_for(asyncio.shield(verifier), 10)
            assert not lease.lost
            assert target.execute("EXISTS", client.key(name)) == 1
            await lease.release()
        finally:
            await asyncio.to_thread(migrate_back, cluster, slot, source)


async def test_an_acl_user_without_cluster_slots_is_told_so(cluster: ClusterProcess) -> None:
    """redis-py reports any refusal of CLUSTER SLOTS as "cluster mode is not
    enabled"; aiolock finds the server's reply behind it: an ACL user that
    may not run CLUSTER SLOTS gets ServerRefusedError NOPERM (with the ACL
    advice), not "this is not a cluster node"."""
    rules = ["on", ">s3cret", "~*", "&*", "+@all", "-cluster"]
    for node in cluster.nodes:
        node.execute("ACL", "SETUSER", "noslots", *rules)
    try:
        url = f"redis://noslots:s3cret@127.0.0.1:{cluster.nodes[0].port}/0"
        async with Client.from_url(url, cluster=True) as client:
            with pytest.raises(ServerRefusedError) as caught:
                await client.lock("n").acquire(timeout=5)
            assert caught.value.code == "NOPERM"
            assert "CLUSTER SLOTS" in str(caught.value)
            assert not isinstance(caught.value, UnsupportedServerError)
    finally:
        for node in cluster.nodes:
            node.execute("ACL", "DELUSER", "noslots")
