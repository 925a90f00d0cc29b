"""The watchdog in a cluster: renewals batched per node, never lost to a redirection.

Every renewal call holds the keys of one master only (``Engine.shard``); a
call over several slots uses the script's node form (one declared key, see
scripts.py). A slot that moves or migrates under a batch splits it, and no
hold is lost for it. The verifier (after a connection reset) and
``Lease.extend`` work across masters too.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Iterator
from typing import Any

import redis

from aiolock import Client, Lease
from aiolock._core.errors import ConnectionFailedError, ServerRefusedError, ServerUnavailableError
from aiolock._core.holds.spread import slot_trouble
from aiolock._core.holds.watchdog import group_batches
from aiolock._core.protocol.keys import main_key
from aiolock._core.protocol.scripts import NODE, RENEWALS, load_scripts, node_call
from aiolock.testing import seam
from tests.cluster_servers import ClusterNode, ClusterProcess
from tests.core_util import eventually
from tests.servers import LOOPBACK

#: The holds here must survive (README_TESTING_NOTES: at least 4.5 s):
#: renewed every 1.5 s, a hold survives 3 s of stall. 1.5 s (renewed every
#: 0.5 s, lost after a 1 s stall) lost 23 holds of test_migrating_slot_never_
#: loses_a_hold in 1 of 5 runs under 2 busy loops ("renewal got no reply
#: before the lease expired"): the renewals through ASK and MOVED, the first
#: on a node opening its connection, and the loop's lag took longer.
LEASE = 4.5
#: Watchdog rounds (every lease / 3) that span three leases.
THREE_LEASES = 9


def _names(prefix: str, node: ClusterNode, cluster: ClusterProcess, tag: str) -> Iterator[str]:
    """Names whose keys (``<prefix>:{name}``) the master ``node`` serves (its
    slots read once: no server call per candidate)."""
    ranges = cluster.slots_of(node)
    for i in itertools.count():
        name = f"{tag}{i}"
        slot = cluster.slot_of(main_key(prefix, name))
        if any(lo <= slot <= hi for lo, hi in ranges):
            yield name


def _pttl(cluster: ClusterProcess, key: str, *, asking: bool = False) -> int:
    """PTTL of ``key`` on the master serving it (``asking``: on the node
    importing it, after ASKING: a migrating key already moved)."""
    node = cluster.master_for_key(key)
    if asking:
        node = cluster._importing_node(cluster.slot_of(key))
    client = redis.Redis(host=LOOPBACK, port=node.port, single_connection_client=True)
    try:
        if asking:
            client.execute_command("ASKING")  # type: ignore[no-untyped-call]
        return int(client.pttl(key))
    finally:
        client.close()


async def _rounds(client: Client, count: int, what: str) -> None:
    watchdog = seam.watchdog(client)
    start = watchdog.rounds
    await eventually(lambda: watchdog.rounds >= start + count, timeout=60, what=what)


def _watched(client: Client) -> list[Any]:
    return list(seam.watchdog(client)._items)


def test_batches_never_mix_shards() -> None:
    class Item:
        def __init__(self, script: str, key: str) -> None:
            self.renew_script, self.renew_key = script, key

    items = [Item(s, f"k{i}") for i in range(10) for s in ("renew", "sem_renew")]
    shards = [int(item.renew_key[1:]) % 3 for item in items]
    batches = group_batches(items, shards, size=2)
    for script, batch in batches:
        assert {item.renew_script for item in batch} == {script}
        assert len({int(item.renew_key[1:]) % 3 for item in batch}) == 1
        assert len(batch) <= 2
    assert sorted(id(i) for _, b in batches for i in b) == sorted(id(i) for i in items)
    # Standalone (no shards): one batch per script, as before.
    assert [(s, len(b)) for s, b in group_batches(items)] == [("renew", 10), ("sem_renew", 10)]


def test_node_form_of_every_renewal_script() -> None:
    """In cluster mode each renewal script has a node form: one declared key,
    the others in ARGV after their count, read by the same script text."""
    scripts = load_scripts(cluster=True)
    assert {name for name in scripts if name.endswith(NODE)} == {s + NODE for s in RENEWALS}
    for name in RENEWALS:
        flag, _, body = scripts[name + NODE].source.partition("\n")
        assert flag == "#!lua flags=allow-cross-slot-keys"
        _preamble, _, script = body.partition("\nend\n")
        assert "KEYS[" not in script and "ARGV[" not in script
    assert not any(name.endswith(NODE) for name in load_scripts())
    assert node_call(["a", "b", "c"], [600, "x"]) == (("a",), (3, "b", "c", 600, "x"))


def test_slot_trouble() -> None:
    """What splits a batch: a slot moved or migrating, never an outage."""
    for code in ("MOVED", "ASK", "TRYAGAIN"):
        assert slot_trouble(ServerUnavailableError("...", code))
    assert slot_trouble(ServerRefusedError("CROSSSLOT Keys ...", "CROSSSLOT"))
    assert slot_trouble(
        ServerRefusedError("Script attempted to access a non local key in a cluster node script")
    )
    assert not slot_trouble(
        ServerUnavailableError("CLUSTERDOWN The cluster is down", "CLUSTERDOWN")
    )
    assert not slot_trouble(ConnectionFailedError("connection lost"))
    assert not slot_trouble(TimeoutError())


async def test_every_kind_of_hold_on_every_master_outlives_its_leases(
    cluster: ClusterProcess,
) -> None:
    """Holds and waiting entries of every renewal script, on all three masters,
    stay alive for three leases; one call per (script, master) per round."""
    prefix = f"cw{secrets.token_hex(3)}"
    async with (
        Client.from_url(cluster.url, prefix=prefix, lease=LEASE) as client,
        Client.from_url(cluster.url, prefix=prefix, lease=LEASE) as other,
    ):
        leases: list[Lease] = []
        waiters: list[asyncio.Task[Lease]] = []
        masters = cluster.masters()
        assert len(masters) == 3
        for node in masters:
            names = _names(prefix, node, cluster, f"n{node.port}-")
            leases.append(await client.lock(next(names)).acquire())
            leases.append(await client.spin_lock(next(names)).acquire())
            leases.append(await client.fair_lock(next(names)).acquire())
            leases.append(await client.rw_lock(next(names)).read.acquire())
            leases.append(await client.rw_lock(next(names)).write.acquire())
            leases.append(await client.semaphore(next(names), 2).acquire())
            # Waiting entries the watchdog keeps alive: a fair lock's queue
            # entry, a read-write lock's waiting writer.
            fair, rw = next(names), next(names)
            leases.append(await other.fair_lock(fair).acquire())
            leases.append(await other.rw_lock(rw).read.acquire())
            waiters.append(asyncio.create_task(client.fair_lock(fair).acquire()))
            waiters.append(asyncio.create_task(client.rw_lock(rw).write.acquire()))

        def pairs() -> set[tuple[str, Any]]:
            engine = seam.engine(client)
            return {(i.renew_script, engine.shard(i.renew_key)) for i in _watched(client)}

        await eventually(
            lambda: len(pairs()) == len(RENEWALS) * 3,
            what="every renewal script in use on every master",
        )
        assert {script for script, _ in pairs()} == RENEWALS
        watchdog = seam.watchdog(client)
        rounds, calls = watchdog.rounds, watchdog.calls
        await _rounds(client, THREE_LEASES, "three leases of renewals")
        assert [lease.lost_reason for lease in leases if lease.lost] == []
        assert not any(task.done() for task in waiters)
        # One call per (script, master) and round (a round in progress may
        # have sent its calls already).
        assert watchdog.calls - calls <= (watchdog.rounds - rounds + 1) * len(pairs())
        for item in _watched(client):
            assert _pttl(cluster, item.renew_key) > 0, item.renew_key
        assert seam.renewal_lane(client).nodes == sorted(m.address for m in masters)  # type: ignore[attr-defined]
        for lease in leases:
            await lease.release()
        for lease in await asyncio.gather(*waiters):
            await lease.release()


async def test_extend_on_every_master(cluster: ClusterProcess) -> None:
    prefix = f"cx{secrets.token_hex(3)}"
    async with Client.from_url(cluster.url, prefix=prefix, lease=LEASE) as client:
        for node in cluster.masters():
            names = _names(prefix, node, cluster, "x")
            for lock in (client.lock(next(names)), client.semaphore(next(names), 1)):
                lease = await lock.acquire()
                await lease.extend(30)
                assert _pttl(cluster, lease._hold.renew_key) > 20_000
                await lease.release()


async def test_verifier_checks_holds_per_master(cluster: ClusterProcess) -> None:
    """After a connection reset every hold is verified (and confirmed in the
    new epoch), its batch on one master: never one call over all of them."""
    prefix = f"cv{secrets.token_hex(3)}"
    async with Client.from_url(cluster.url, prefix=prefix, lease=LEASE) as client:
        engine = seam.engine(client)
        leases = []
        for node in cluster.masters():
            names = _names(prefix, node, cluster, "v")
            leases += [await client.lock(next(names)).acquire() for _ in range(3)]
        await _rounds(client, 2, "the renewal lane to every master")
        epoch = engine.epoch
        # Drop this Client's renewal connection to one master: a reset.
        victim = cluster.masters()[0]
        renewals = engine.renew_mux.connection(victim.address)
        victim.execute("CLIENT", "KILL", "ID", await renewals.call(b"CLIENT", b"ID"))
        await eventually(lambda: engine.epoch > epoch, what="the connection reset")
        holds = [h for state in list(engine.states.values()) for h in state.holds()]
        await eventually(
            lambda: all(h.confirmed == engine.epoch for h in holds),
            what="every hold verified in the new epoch",
        )
        assert not any(lease.lost for lease in leases)
        for lease in leases:
            await lease.release()


async def test_migrating_slot_never_loses_a_hold(fresh_cluster: ClusterProcess) -> None:
    """A slot migrates under a node's batch: begun, half its keys moved (the
    node form meets ASK, the slot's own call TRYAGAIN), all moved, finished
    (the Client's map is stale: MOVED). Every hold lives on for three leases
    while the slot is split, and the keys end up renewed on the new master."""
    cluster = fresh_cluster
    prefix = f"cm{secrets.token_hex(3)}"
    source, target = cluster.masters()[:2]
    async with Client.from_url(cluster.url, prefix=prefix, lease=LEASE) as client:
        names = _names(prefix, source, cluster, "m")
        first = next(names)
        slot = cluster.slot_of(main_key(prefix, first))
        in_slot = [
            first,
            *itertools.islice(
                (n for n in names if cluster.slot_of(main_key(prefix, n)) == slot), 3
            ),
        ]
        elsewhere = list(itertools.islice(_names(prefix, source, cluster, "o"), 20))
        leases = [await client.lock(n).acquire() for n in in_slot[:3] + elsewhere]
        leases.append(await client.semaphore(in_slot[3], 2).acquire())
        keys = [main_key(prefix, n) for n in in_slot]
        await _rounds(client, 2, "renewals on the source")

        cluster.begin_migration(slot, target)
        await _rounds(client, 3, "renewals of a slot migrating, no key moved")
        moved = [keys[0], keys[3]]
        source.execute("MIGRATE", LOOPBACK, target.port, "", 0, 5000, "KEYS", *moved)
        await _rounds(client, THREE_LEASES, "renewals of a slot split by its migration")
        assert [lease.lost_reason for lease in leases if lease.lost] == []
        for key in keys:
            assert _pttl(cluster, key, asking=key in moved) > 0, key
        # The moved keys were renewed one by one, following ASK to the target.
        assert seam.renewal_lane(client).redirects > 0  # type: ignore[attr-defined]

        cluster.move_keys(slot)
        await _rounds(client, 3, "renewals of a slot whose keys all moved")
        cluster.finish_migration(slot, target)
        await _rounds(client, 6, "two leases of renewals after the migration")
        assert [lease.lost_reason for lease in leases if lease.lost] == []
        assert cluster.master_for_slot(slot).node_id == target.node_id
        for key in keys:
            assert _pttl(cluster, key) > 0, key
        for lease in leases:
            await lease.release()


async def test_holds_follow_a_manual_failover(fresh_cluster: ClusterProcess) -> None:
    """A replica takes over its master's slots; the old master, a replica now,
    answers the watchdog's calls with MOVED: the map is refreshed, the calls
    regrouped, and the holds are renewed on the new master. None is lost."""
    cluster = fresh_cluster
    lease = LEASE  # (a manual failover pauses the old master's clients a moment)
    prefix = f"cf{secrets.token_hex(3)}"
    async with Client.from_url(cluster.url, prefix=prefix, lease=lease) as client:
        old = cluster.masters()[0]
        leases = []
        for node in cluster.masters():
            names = _names(prefix, node, cluster, "f")
            leases += [await client.lock(next(names)).acquire() for _ in range(5)]
        await _rounds(client, 1, "renewals on every master")
        replica = cluster.replica_of(old)
        cluster.manual_failover(replica)
        await _rounds(client, 6, "two leases of renewals after the failover")
        assert [lease.lost_reason for lease in leases if lease.lost] == []
        for item in _watched(client):
            if cluster.master_for_key(item.renew_key).node_id == replica.node_id:
                assert _pttl(cluster, item.renew_key) > 0
        assert seam.engine(client).shard(leases[0]._hold.renew_key) == replica.address
        for lease_ in leases:
            await lease_.release()
