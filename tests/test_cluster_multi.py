"""multi_lock in a Cluster: names on different slots and masters, all or nothing,
deadlock-free, cancellation-safe, with fencing tokens per name (real 3+3 clusters)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from aiolock import Client, ConnectionFailedError, LockTimeoutError
from aiolock._primitives.lock import AsyncLock
from aiolock._primitives.lock_queue import LocalQueue
from aiolock._primitives.multi import MultiLease, MultiLock
from aiolock.testing import seam
from tests.cluster_servers import CLUSTER_TIMEOUT, ClusterNode, ClusterProcess
from tests.core_util import assert_clean, evalsha_calls, eventually

#: Renewed every 1.5 s: a hold survives 3 s of scheduling stall on a loaded machine.
LEASE = 4.5
PREFIX = "cm"

MakeClient = Callable[..., Awaitable[Client]]


@pytest.fixture
async def make(cluster: ClusterProcess) -> AsyncIterator[MakeClient]:
    """``await make(**options)``: a started cluster-mode Client on the shared cluster."""
    async with AsyncExitStack() as stack:

        async def new(**options: Any) -> Client:
            options = {"prefix": PREFIX, "lease": LEASE, **options}
            return await stack.enter_async_context(
                Client.from_url(cluster.url, cluster=True, **options)
            )

        yield new


def key(name: str) -> str:
    return f"{PREFIX}:{{{name}}}"


def names_on_masters(cluster: ClusterProcess, tag: str = "") -> list[tuple[str, ClusterNode]]:
    """One name per master (three), returned in DESCENDING slot order: the
    order the parts are taken in (by slot) is the reverse of the given one."""
    masters = cluster.masters()
    ranges = {m.node_id: cluster.slots_of(m) for m in masters}
    found: dict[str, tuple[int, str, ClusterNode]] = {}
    i = 0
    while len(found) < len(masters):
        name = f"{tag}n{i}"
        slot = cluster.slot_of(key(name))
        for m in masters:
            if m.node_id not in found and any(lo <= slot <= hi for lo, hi in ranges[m.node_id]):
                found[m.node_id] = (slot, name, m)
        i += 1
    return [(name, m) for _, name, m in sorted(found.values(), reverse=True)]


def held_here(client: Client, name: str) -> bool:
    """This Client has a local hold of lock ``name`` (the part is taken)."""
    state = seam.peek_state(client, key(name))
    return isinstance(state, LocalQueue) and state.hold is not None


async def none_locked(client: Client, names: list[str]) -> bool:
    for name in names:
        if await client.lock(name).is_locked():
            return False
    return True


async def test_parts_on_three_masters(make: MakeClient, cluster: ClusterProcess) -> None:
    client, other = await make(), await make()
    parts = names_on_masters(cluster)
    names = [name for name, _ in parts]
    assert len({m.node_id for _, m in parts}) == 3
    multi = client.multi_lock(*(client.lock(n) for n in names))
    assert isinstance(multi, MultiLock)
    await seam.engine(client).is_cluster()  # (settled: the capability probe is not counted)
    for _, master in parts:
        master.execute("CONFIG", "RESETSTAT")
    lease = await multi.acquire()
    assert isinstance(lease, MultiLease)
    for name, master in parts:  # one script per part, on the part's own master
        assert evalsha_calls(master) == 1, name
    for name, master in parts:
        assert master.execute("EXISTS", key(name)) == 1, f"{name} held on its own master"
        assert await other.lock(name).is_locked()
    assert await multi.is_owned()
    assert set(lease.fencing_tokens) == set(names)
    # Taken by slot, but the leases come in the order of ``multi.locks``.
    assert [x.name for x in lease.leases] == [lock.name for lock in multi.locks]
    assert lease.name == multi.name
    # Each part is an ordinary hold of its lock: reentrant from the same task.
    again = await client.lock(names[0]).acquire()
    assert again.fencing_token == lease.fencing_tokens[names[0]]
    await again.release()
    await lease.release()
    assert await none_locked(other, names)
    await assert_clean(client, other)


async def test_parts_sharing_a_slot_take_one_script(
    make: MakeClient, cluster: ClusterProcess
) -> None:
    """Names whose keys share a hash tag (``g}a`` and ``g}b``: tag ``g``) are one
    part, taken by one multi_acquire on their slot; the others are parts of their own."""
    client, other = await make(), await make()
    (far, _), *_ = names_on_masters(cluster)
    together = ["g}a", "g}b"]
    assert cluster.slot_of(key(together[0])) == cluster.slot_of(key(together[1]))
    multi = client.multi_lock(*(client.lock(n) for n in [*together, far]))
    lease = await multi.acquire()
    for name in [*together, far]:
        assert await other.lock(name).is_locked()
    await lease.release()
    assert await none_locked(other, [*together, far])
    # Busy: the one-slot part is all or nothing too.
    held = await other.lock(together[1]).acquire()
    assert await multi.try_acquire() is None
    assert await none_locked(other, [together[0], far])
    await held.release()
    await assert_clean(client, other)


async def test_all_or_nothing_under_contention(make: MakeClient, cluster: ClusterProcess) -> None:
    client, other = await make(), await make()
    names = [name for name, _ in names_on_masters(cluster)]
    by_slot = sorted(names, key=lambda n: cluster.slot_of(key(n)))
    middle = by_slot[1]  # taken after the first part, before the last
    held = await other.lock(middle).acquire()
    multi = client.multi_lock(*(client.lock(n) for n in names))
    assert await multi.try_acquire() is None
    assert await none_locked(other, [n for n in names if n != middle]), "nothing taken"
    with pytest.raises(LockTimeoutError):
        await multi.acquire(timeout=0.05)
    assert await none_locked(other, [n for n in names if n != middle])

    waiter = asyncio.create_task(multi.acquire(timeout=4 * LEASE))
    # Parked on the busy part, holding none of the others.
    await eventually(lambda: client.statistics().waiting > 0, what="the multi-lock to wait")
    assert not held_here(client, by_slot[0]) and not held_here(client, by_slot[2])
    assert await none_locked(other, [by_slot[0], by_slot[2]])
    await held.release()
    lease = await waiter
    for name in names:
        assert await other.lock(name).is_locked()
    await lease.release()
    await assert_clean(client, other)


async def test_reversed_orders_never_deadlock(make: MakeClient, cluster: ClusterProcess) -> None:
    """Multi-locks over overlapping sets given in opposite orders, from two
    Clients and two tasks each, plus a plain lock user: every round ends
    (bounded by the lease), and no name is ever held twice at once."""
    c1, c2 = await make(), await make()
    a, b, c = (name for name, _ in names_on_masters(cluster))
    inside: dict[str, bool] = {a: False, b: False, c: False, "g}a": False, "g}b": False}
    rounds = 12

    async def run(client: Client, order: list[str]) -> None:
        multi = client.multi_lock(*(client.lock(n) for n in order))
        for _ in range(rounds):
            async with multi(timeout=2 * LEASE):
                for n in order:
                    assert not inside[n], f"{n} held twice"
                    inside[n] = True
                await asyncio.sleep(0)
                for n in order:
                    inside[n] = False

    async def plain(client: Client, name: str) -> None:
        for _ in range(rounds):
            async with client.lock(name)(timeout=2 * LEASE):
                assert not inside[name], f"{name} held twice"
                inside[name] = True
                await asyncio.sleep(0)
                inside[name] = False

    async with asyncio.timeout(4 * LEASE):
        await asyncio.gather(
            run(c1, [a, b, c]),
            run(c2, [c, b, a]),
            run(c1, [c, a]),
            run(c2, [b, a]),
            # One-slot parts (one script each), waited for in the global order.
            run(c1, [c, "g}a", "g}b"]),
            run(c2, ["g}b", a, "g}a"]),
            plain(c2, b),
        )
    await assert_clean(c1, c2)


async def test_fencing_tokens_per_name(make: MakeClient, cluster: ClusterProcess) -> None:
    client, other = await make(), await make()
    names = [name for name, _ in names_on_masters(cluster)]
    multi = client.multi_lock(*(client.lock(n) for n in names))
    lease = await multi.acquire()
    first = lease.fencing_tokens
    await lease.release()
    alone = await other.lock(names[1]).acquire()
    assert alone.fencing_token > first[names[1]]
    await alone.release()
    lease = await multi.acquire()
    second = lease.fencing_tokens
    for name in names:
        assert second[name] > first[name], name
    assert second[names[1]] > alone.fencing_token
    assert lease.fencing_token == max(second.values())
    await lease.release()
    await assert_clean(client, other)


async def test_parts_are_renewed(make: MakeClient, cluster: ClusterProcess) -> None:
    """Each part is an ordinary hold: the watchdog renews it on its own master."""
    lease_s = LEASE  # a hold that must survive (1.2 s, renewed every 0.4 s, dies of a 0.8 s stall)
    client = await make(lease=lease_s)
    parts = names_on_masters(cluster)
    multi = client.multi_lock(*(client.lock(n) for n, _ in parts))
    lease = await multi.acquire()
    await asyncio.sleep(2 * lease_s)  # the property is about time: outlive the lease twice
    assert not lease.lost, lease.lost_reason
    for name, master in parts:
        assert int(master.execute("PTTL", key(name))) > 0, f"{name} renewed on its master"
    await lease.release()
    await assert_clean(client)


async def _warm(client: Client, names: list[str]) -> None:
    """Connect to every master (a first command opens its connection)."""
    for name in names:
        await client.lock(name).is_locked()


async def _cancel_frees_every_part(
    task: asyncio.Task[Any], client: Client, other: Client, names: list[str]
) -> None:
    """Cancel the multi-lock acquire ``task``: it ends cancelled, ``other``
    finds every part free within a third of the lease, nothing is left."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(
        lambda: none_locked(other, names), timeout=LEASE / 3, what="every part to be freed"
    )
    await assert_clean(client, other)


async def test_cancel_after_first_part_with_the_second_reply_lost(
    make: MakeClient, cluster: ClusterProcess
) -> None:
    """Cancelled once the first part is taken and the second part's script has
    run but its reply is not read yet: the first is released, the second
    undone when its reply arrives; nothing stays held (well within the lease)."""
    client, other = await make(), await make()
    parts = names_on_masters(cluster)
    names = [name for name, _ in parts]
    first, second, _third = sorted(parts, key=lambda p: cluster.slot_of(key(p[0])))
    await _warm(client, names)
    multi = client.multi_lock(*(client.lock(n) for n in names))
    task = asyncio.create_task(multi.acquire())
    await eventually(lambda: held_here(client, first[0]), interval=0, what="the first part")
    # The second part's script is on the wire: block the loop until it ran.
    await eventually(
        lambda: second[1].execute("EXISTS", key(second[0])) == 1,
        block_loop=True,
        what="the second part's script to run",
    )
    await _cancel_frees_every_part(task, client, other, names)


async def test_cancel_after_second_part(make: MakeClient, cluster: ClusterProcess) -> None:
    client, other = await make(), await make()
    parts = sorted(names_on_masters(cluster), key=lambda p: cluster.slot_of(key(p[0])))
    names = [name for name, _ in parts]
    await _warm(client, names)
    multi = client.multi_lock(*(client.lock(n) for n in names))
    task = asyncio.create_task(multi.acquire())
    await eventually(lambda: held_here(client, names[1]), interval=0, what="the second part")
    await _cancel_frees_every_part(task, client, other, names)


async def test_cancel_while_waiting_for_a_busy_part(
    make: MakeClient, cluster: ClusterProcess
) -> None:
    client, other = await make(), await make()
    names = sorted(
        (name for name, _ in names_on_masters(cluster)), key=lambda n: cluster.slot_of(key(n))
    )
    held = await other.lock(names[2]).acquire()
    multi = client.multi_lock(*(client.lock(n) for n in names))
    task = asyncio.create_task(multi.acquire())
    await eventually(lambda: client.statistics().waiting > 0, what="the multi-lock to wait")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await none_locked(other, names[:2])
    await held.release()
    await assert_clean(client, other)


async def test_cancel_at_every_loop_turn(make: MakeClient, cluster: ClusterProcess) -> None:
    """Cancelled after 0, 1, 2, ... loop turns until an acquire completes first:
    each cancelled acquire leaves nothing held, and the next one succeeds."""
    client, other = await make(), await make()
    names = [name for name, _ in names_on_masters(cluster)]
    await _warm(client, names)
    multi = client.multi_lock(*(client.lock(n) for n in names))
    for turns in range(400):
        task = asyncio.create_task(multi.acquire(timeout=LEASE))
        for _ in range(turns):
            await asyncio.sleep(0)
        if task.done():
            await task.result().release()
            break
        task.cancel()
        try:
            lease = await task
        except asyncio.CancelledError:
            pass
        else:  # the cancel came after the acquire ended (it was not delivered)
            await lease.release()
            break
        await eventually(
            lambda: none_locked(other, names), timeout=LEASE / 3, what=f"free after {turns}"
        )
    else:
        pytest.fail("the acquire never completed within 400 loop turns")
    await assert_clean(client, other)


async def test_lock_of_the_multi_is_an_ordinary_lock(
    make: MakeClient, cluster: ClusterProcess
) -> None:
    client = await make()
    names = [name for name, _ in names_on_masters(cluster)]
    multi = client.multi_lock(*(client.lock(n) for n in names))
    assert all(isinstance(lock, AsyncLock) for lock in multi.locks)
    async with multi as lease:
        assert await multi.remaining_ttl() is not None
        assert not lease.lost
    assert not await multi.is_locked()
    await assert_clean(client)


async def test_a_master_killed_mid_way(fresh_cluster: ClusterProcess) -> None:
    """The master of the middle part is SIGKILLed. Before any failover an
    acquire fails holding nothing, and another Client takes the other parts
    while the multi-lock waits for the dead one. After the failover the
    multi-lock gets every part, with larger tokens.

    "Before any failover" is an event the test makes, not a race it hopes
    to win: the dead master's replica may not fail over (its
    ``cluster-replica-no-failover``) until the other Client is done, and the
    live masters serve on meanwhile (``cluster-require-full-coverage no``;
    with full coverage the whole cluster answers CLUSTERDOWN from the node
    timeout to the failover, so the other Client could only race the
    multi-lock for the first part once the failover ended, and lose it to
    the multi-lock's successful acquisition, which this test holds)."""
    cluster = fresh_cluster
    async with AsyncExitStack() as stack:
        client, other = [
            await stack.enter_async_context(
                Client.from_url(cluster.url, cluster=True, prefix=PREFIX, lease=LEASE)
            )
            for _ in range(2)
        ]
        parts = sorted(names_on_masters(cluster), key=lambda p: cluster.slot_of(key(p[0])))
        names = [name for name, _ in parts]
        multi = client.multi_lock(*(client.lock(n) for n in names))
        lease = await multi.acquire()
        before = lease.fencing_tokens
        await lease.release()
        await _warm(other, names)

        victim = parts[1][1]
        replica = cluster.replica_of(victim)
        for node in cluster.nodes:
            node.execute("CONFIG", "SET", "cluster-require-full-coverage", "no")
        # Held back until the test lets it go; then promoted however long the
        # master has been dead by then (no "data too old" refusal).
        replica.execute("CONFIG", "SET", "cluster-replica-no-failover", "yes")
        replica.execute("CONFIG", "SET", "cluster-replica-validity-factor", "0")
        cluster.kill_master(victim)
        # A try already sent gets REPLY_GRACE (1 s) for its reply: the part on
        # the dead master is never answered, so the acquire fails, holding nothing.
        with pytest.raises(ConnectionFailedError):
            await multi.acquire(timeout=0.3)
        assert not held_here(client, names[0]) and not held_here(client, names[2])
        assert await none_locked(other, [names[0], names[2]])

        task = asyncio.create_task(multi.acquire(timeout=CLUSTER_TIMEOUT + 2 * LEASE))
        # The multi-lock holds the first part at most while its try of the dead
        # part is under way (REPLY_GRACE), then waits for the dead part holding
        # nothing: the other Client gets the first part within a lease. (Were it
        # held while the multi-lock waits, it would be held until the failover,
        # which does not come before this.)
        alone = await other.lock(names[0]).acquire(timeout=LEASE)
        assert not task.done()
        await alone.release()
        replica.execute("CONFIG", "SET", "cluster-replica-no-failover", "no")
        await asyncio.to_thread(cluster.wait_for_failover, victim)
        # The Client learned the promoted replica (no ConnectionFailedError).
        lease = await asyncio.wait_for(task, 2 * LEASE)
        assert not lease.lost
        for name in names:
            assert lease.fencing_tokens[name] > before[name], name
            assert await other.lock(name).is_locked()
        await lease.release()
        assert await none_locked(other, names)


async def test_standalone_and_cluster_locks_in_one_multi_lock(
    make: MakeClient, url: str, cluster: ClusterProcess
) -> None:
    """Locks of a standalone Client (taken first, by one script) and of a
    cluster Client (a part per slot) in one all-or-nothing multi-lock."""
    clustered, other = await make(), await make()
    async with Client.from_url(url, prefix=PREFIX, lease=LEASE) as single:
        names = [name for name, _ in names_on_masters(cluster)]
        locks = [clustered.lock(n) for n in names] + [single.lock("s1"), single.lock("s2")]
        multi = clustered.multi_lock(*locks)
        lease = await multi.acquire()
        assert await single.lock("s1").is_locked() and await single.lock("s2").is_locked()
        for name in names:
            assert await other.lock(name).is_locked()
        await lease.release()
        held = await other.lock(names[2]).acquire()
        assert await multi.try_acquire() is None
        assert not await single.lock("s1").is_locked()
        assert await none_locked(other, names[:2])
        await held.release()
        await assert_clean(clustered, other, single)
