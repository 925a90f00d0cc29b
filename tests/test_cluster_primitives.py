"""Primitives on a cluster: what only a cluster has.

The contracts every primitive keeps (exclusion, reentrancy, FIFO,
try-acquire, timeouts, wake-ups, fencing, cancellation) run on the shared
cluster in tests/test_contract.py. Here, two Clients stand for two
processes: a lock named on each master lives there and its waiter parks
there only (sharded pub/sub on that very master, or its signal list
there); a latch opens across Clients on each master. Then the two-holder
failure the issue names: with classic ``PUBLISH`` (the standalone scripts and
a classic listener) a release grants the lock to nobody in Redis while the
waiter takes it, and a third party takes it too; with ``SPUBLISH`` (the real
cluster mode) it never happens, nor through a replica (which relays a
master's SPUBLISH uncounted: the listener subscribes on masters only). Last,
on clusters of their own: a waiter parked on a channel whose slot migrates
(also with a lagging slot map, and away and back) or whose master is failed
over still gets the lock at once, well before the holder's TTL (the
server's ``sunsubscribe`` re-homes the channel).

The ground truth (which master serves a slot, who is subscribed where) is
asked of the servers themselves, never of the Client under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from aiolock import Client, LockNotOwnedError, LockTimeoutError
from aiolock._core.protocol.scripts import load_scripts
from aiolock._core.topology.sharded import ShardedListener
from aiolock._core.waiting.listener import Listener
from aiolock.testing import seam
from tests.cluster_servers import ClusterProcess
from tests.core_util import eventually

#: The Clients' lease: a waiter that got the lock within a third of it was
#: woken by the release, not by the holder's TTL running out.
LEASE = 30.0
WOKEN = LEASE / 3


def _slot(name: str) -> int:
    """The slot of every key and channel of primitive ``name`` (its hash tag)."""
    return key_slot(name.encode())


class Nodes:
    """The cluster as its servers describe it (CLUSTER SLOTS), one plain
    connection per node: the ground truth the Client is checked against."""

    def __init__(self, url: str) -> None:
        self._seed = aioredis.Redis.from_url(url, decode_responses=True)
        self._conns: dict[str, aioredis.Redis] = {}
        self.slots: dict[int, str] = {}

    async def load(self) -> None:
        self.slots.clear()
        for start, end, master, *_ in await self._seed.execute_command("CLUSTER SLOTS"):
            name = f"{master[0]}:{master[1]}"
            for slot in range(int(start), int(end) + 1):
                self.slots[slot] = name

    def masters(self) -> list[str]:
        return sorted(set(self.slots.values()))

    def node(self, name: str) -> aioredis.Redis:
        conn = self._conns.get(name)
        if conn is None:
            host, _, port = name.rpartition(":")
            conn = self._conns[name] = aioredis.Redis(
                host=host, port=int(port), decode_responses=True
            )
        return conn

    def name_on(self, master: str, stem: str) -> str:
        """A primitive name whose slot ``master`` serves."""
        for i in range(100_000):
            name = f"{stem}-{i}"
            if self.slots[_slot(name)] == master:
                return name
        raise AssertionError(f"no name of stem {stem!r} on {master}")

    async def shard_subscribers(self, master: str, channel: bytes) -> int:
        reply = await self.node(master).execute_command("PUBSUB", "SHARDNUMSUB", channel)
        return int(reply[1])

    async def owners(self, master: str, key: str) -> list[str]:
        """The Client ids holding the lock hash ``key`` on ``master``, per Redis."""
        fields = await self.node(master).hgetall(key)
        return [field.split(":")[0] for field in fields if not field.startswith("~")]

    async def blocked(self, master: str) -> int:
        return int((await self.node(master).info("clients"))["blocked_clients"])

    async def aclose(self) -> None:
        for conn in (self._seed, *self._conns.values()):
            await conn.aclose()


@asynccontextmanager
async def _nodes(cluster: ClusterProcess) -> AsyncIterator[Nodes]:
    nodes = Nodes(cluster.url)
    try:
        await nodes.load()
        assert len(nodes.masters()) == 3
        yield nodes
    finally:
        await nodes.aclose()


@pytest.fixture
async def nodes(cluster: ClusterProcess) -> AsyncIterator[Nodes]:
    """The shared cluster's servers (never faulted or migrated)."""
    async with _nodes(cluster) as nodes:
        yield nodes


@pytest.fixture
async def fresh_nodes(fresh_cluster: ClusterProcess) -> AsyncIterator[Nodes]:
    """A cluster of this test's own, to migrate slots on."""
    async with _nodes(fresh_cluster) as nodes:
        yield nodes


MakeClient = Callable[..., Awaitable[Client]]


@asynccontextmanager
async def _maker(cluster: ClusterProcess) -> AsyncIterator[MakeClient]:
    async with AsyncExitStack() as stack:

        async def make(**options: Any) -> Client:
            options.setdefault("lease", LEASE)
            options.setdefault("prefix", "cp")
            return await stack.enter_async_context(
                Client.from_url(cluster.url, cluster=True, **options)
            )

        yield make


@pytest.fixture
async def make(cluster: ClusterProcess) -> AsyncIterator[MakeClient]:
    """``await make(**options)``: a started cluster-mode Client on ``cluster``
    (closed after the test)."""
    async with _maker(cluster) as make:
        yield make


@pytest.fixture
async def fresh_make(fresh_cluster: ClusterProcess) -> AsyncIterator[MakeClient]:
    """``make`` on ``fresh_cluster``."""
    async with _maker(fresh_cluster) as make:
        yield make


@pytest.fixture(params=[0, 1, 2], ids=["m0", "m1", "m2"])
def master(request: pytest.FixtureRequest, nodes: Nodes) -> str:
    return nodes.masters()[request.param]


async def parked_on(waiter: Client, nodes: Nodes, master: str, channel: bytes | None) -> None:
    """Wait until ``waiter`` waits on ``master``: its sharded listener
    subscribed there (the server says so) and only there, or, in list mode,
    it blocks in BLPOP there. ``channel``: the one it must listen on."""
    engine = seam.engine(waiter)
    if waiter.notify == "pubsub":

        def subscribed() -> bool:
            channels = engine.listener.channels
            if channel is not None:
                return channel in channels and channels[channel].is_confirmed
            return bool(channels) and all(c.is_confirmed for c in channels.values())

        await eventually(subscribed, what="the waiter's channels confirmed")
        assert master in engine.listener.nodes
        names = list(engine.listener.channels) if channel is None else [channel]
        for name in names:
            assert nodes.slots[key_slot(name)] == master
            assert await nodes.shard_subscribers(master, name) == 1
            for other in nodes.masters():
                if other != master:
                    assert await nodes.shard_subscribers(other, name) == 0
    elif waiter.notify == "list":

        async def blocking() -> bool:
            return await nodes.blocked(master) >= 1

        await eventually(blocking, what=f"a BLPOP on {master}")


async def _handoff(
    acquire_b: Callable[[], Awaitable[Any]],
    release_a: Callable[[], Awaitable[Any]],
    waiter: Client,
    nodes: Nodes,
    master: str,
    channel: bytes | None,
) -> Any:
    """B waits (parked on ``master``), A releases, B gets it well before A's TTL."""
    task = asyncio.ensure_future(acquire_b())
    try:
        await parked_on(waiter, nodes, master, channel)
        assert not task.done()
        await release_a()
        async with asyncio.timeout(WOKEN):
            return await task
    finally:
        task.cancel()


# -- where a name lives and where its waiter parks --------------------------------------------
# (Exclusion, reentrancy, try-acquire, timeouts, wake-ups and fencing of every
# kind on the shared cluster: tests/test_contract.py, deployment "cluster".)


@pytest.mark.parametrize("notify", ["pubsub", "list"])
async def test_lock_on_its_slots_master(
    make: MakeClient, nodes: Nodes, master: str, notify: str
) -> None:
    """A name on each master: its key is on that master, the waiter parks on
    that master only (sharded channel or BLPOP), and the release recorded
    there grants it to the waiter, per Redis."""
    a, b = await make(notify=notify), await make(notify=notify)
    name = nodes.name_on(master, "lock")
    lock_a, lock_b = a.lock(name), b.lock(name)
    first = await lock_a.acquire()
    assert await nodes.node(master).exists(f"cp:{{{name}}}") == 1
    channel = lock_b._names.wait_channel(b.id) if notify == "pubsub" else None
    second = await _handoff(lock_b.acquire, first.release, b, nodes, master, channel)
    assert second.fencing_token > first.fencing_token
    assert await nodes.owners(master, f"cp:{{{name}}}") == [b.id]
    await second.release()
    assert not await lock_a.is_locked()


@pytest.mark.parametrize("notify", ["pubsub", "list"])
async def test_latch(make: MakeClient, nodes: Nodes, master: str, notify: str) -> None:
    a, b = await make(notify=notify), await make(notify=notify)
    name = nodes.name_on(master, "latch")
    la, lb = a.latch(name, 2), b.latch(name, 2)
    assert await la.try_set_count()
    with pytest.raises(LockTimeoutError):
        await lb.wait(timeout=0.2)
    assert await la.count_down() == 1

    async def count_down() -> None:
        assert await la.count_down() == 0

    assert await _handoff(lb.wait, count_down, b, nodes, master, None)
    assert await lb.count() == 0


# -- classic PUBLISH in a cluster: two holders ------------------------------------------------


async def _classic(client: Client, node: str) -> None:
    """Make the cluster-mode ``client`` wait the way a standalone one does:
    the standalone scripts (classic ``PUBLISH``) and one classic pub/sub
    listener, connected to ``node``. A test-only set-up: aiolock never runs so."""
    engine = seam.engine(client)
    await client.lock("settle").is_locked()  # settles the mode: cluster
    assert engine.topology is not None
    scripts = load_scripts()
    for master in engine.topology.masters():
        for script in scripts.values():
            await engine.mux.connection(master).call(b"SCRIPT", b"LOAD", script.source)
    engine.scripts = scripts
    old, engine.listener = engine.listener, Listener(engine.topology.factory(node))
    engine.listener.start()
    await old.aclose()


@pytest.mark.parametrize("classic", [True, False], ids=["publish", "spublish"])
async def test_classic_publish_makes_two_holders(
    make: MakeClient, nodes: Nodes, classic: bool
) -> None:
    """B waits for a lock on master M, listening on another master N. A releases:
    the script's classic PUBLISH counts no receiver on M, so it records no grant
    and leaves the lock free, while the cluster bus still carries the grant to B,
    which takes it. C then acquires the free lock: B and C hold it at once.
    With SPUBLISH (cluster mode proper) B listens on M, the grant is recorded,
    and C finds the lock held."""
    lock_master, listen_on = nodes.masters()[0], nodes.masters()[1]
    a, b, c = await make(), await make(), await make()
    if classic:
        for client in (a, b, c):
            await _classic(client, listen_on)
    name = nodes.name_on(lock_master, "two")
    held_a = await a.lock(name).acquire()
    lock_b = b.lock(name)
    waiting = asyncio.ensure_future(lock_b.acquire())
    try:
        channel = lock_b._names.wait_channel(b.id)

        def confirmed() -> bool:
            subscribed = seam.listener_channels(b).get(channel)
            return subscribed is not None and subscribed.parked == 1

        await eventually(confirmed, what="B parked on its confirmed channel")
        await held_a.release()
        async with asyncio.timeout(WOKEN):
            held_b = await waiting
    finally:
        waiting.cancel()
    assert not held_b.lost
    owners = await nodes.owners(lock_master, f"cp:{{{name}}}")  # what Redis recorded
    held_c = await c.lock(name).try_acquire()
    if classic:
        assert owners == [], "the classic release recorded no grant"
        assert held_c is not None, "C took the lock B holds: two holders"
        assert not held_b.lost and not held_c.lost
        assert held_c.fencing_token > held_b.fencing_token
        await held_c.release()
        with pytest.raises(LockNotOwnedError):
            await held_b.release()  # (Redis never recorded B's hold)
    else:
        assert owners == [b.id]
        assert held_c is None
        await held_b.release()


async def test_no_grant_from_a_replica(
    cluster: ClusterProcess, make: MakeClient, nodes: Nodes
) -> None:
    """A replica accepts SSUBSCRIBE for its master's slots and passes the
    master's SPUBLISH messages on, but the master's SPUBLISH does not count
    its subscribers. B's listener is made to hold its channel on the replica
    of the lock's master (as a stale slot map would, after a failover that
    left the old master a replica): it asks the node its role first, so it
    never subscribes there; the channel goes to the master, and A's release
    grants the lock to B in Redis too. (Subscribed on the replica, B would
    take a grant the script skipped, and C would take the lock too.)"""
    replicated = {}
    for name in nodes.masters():
        with suppress(KeyError):
            node = cluster.replica_of(cluster.node_by_port(int(name.rpartition(":")[2])))
            replicated[name] = f"127.0.0.1:{node.port}"
    master, replica = sorted(replicated.items())[0]

    async def linked() -> bool:
        info = await nodes.node(replica).info("replication")
        return bool(info.get("master_link_status") == "up")

    await eventually(linked, what="the replica in sync with its master")
    a, b, c = await make(), await make(), await make()
    name = nodes.name_on(master, "replica")
    held_a = await a.lock(name).acquire()
    lock_b = b.lock(name)
    assert await lock_b.is_locked()  # (B's mode is settled: cluster)
    channel = lock_b._names.wait_channel(b.id)
    listener = seam.listener(b)
    assert isinstance(listener, ShardedListener)
    pinned = listener._listener(replica).register(channel)
    waiting = asyncio.ensure_future(lock_b.acquire())
    try:

        def parked() -> bool:
            subscribed = listener.channels.get(channel)
            return subscribed is not None and subscribed.is_confirmed and subscribed.parked == 1

        await eventually(parked, what="B parked on its confirmed channel")
        await held_a.release()
        async with asyncio.timeout(WOKEN):
            held_b = await waiting
    finally:
        waiting.cancel()
    owners = await nodes.owners(master, f"cp:{{{name}}}")
    held_c = await c.lock(name).try_acquire()
    assert owners == [b.id] and held_c is None, "two holders: B took a grant from the replica"
    assert await nodes.shard_subscribers(replica, channel) == 0
    assert await nodes.shard_subscribers(master, channel) == 1
    listener.unregister(pinned)
    await held_b.release()


# -- a slot migration under a parked waiter (each on a cluster of its own) --------------------


async def _migrate(cluster: ClusterProcess, slot: int, target: str) -> None:
    """The harness's whole migration of ``slot`` to master ``target``, in a
    thread: the Clients go on meanwhile, as they would."""
    node = cluster.node_by_port(int(target.rpartition(":")[2]))
    await asyncio.to_thread(cluster.migrate_slot, slot, node)


async def _give_away(nodes: Nodes, slot: int, target: str) -> None:
    """Move ``slot`` (and its keys) to master ``target`` and tell only the
    source (it drops the slot's subscribers and redirects to the target)
    while every other node, the target included, still names the source the
    owner. ``_finish`` tells the others (CLUSTER SETSLOT allows this order)."""
    source = nodes.slots[slot]
    src, dst = nodes.node(source), nodes.node(target)
    src_id = await src.execute_command("CLUSTER", "MYID")
    dst_id = await dst.execute_command("CLUSTER", "MYID")
    await dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    await src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    host, _, port = target.rpartition(":")
    while keys := await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        await src.execute_command("MIGRATE", host, port, "", 0, 5000, "KEYS", *keys)
    await src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


async def _finish(nodes: Nodes, slot: int, target: str) -> None:
    dst_id = await nodes.node(target).execute_command("CLUSTER", "MYID")
    for name in [target, *(m for m in nodes.masters() if m != target)]:
        await nodes.node(name).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


async def _listens_on(client: Client, nodes: Nodes, master: str, channel: bytes) -> bool:
    subscribed = seam.listener_channels(client).get(channel)
    return (
        subscribed is not None
        and subscribed.is_confirmed
        and await nodes.shard_subscribers(master, channel) == 1
    )


async def test_waiter_follows_its_slot(
    fresh_cluster: ClusterProcess, fresh_make: MakeClient, fresh_nodes: Nodes
) -> None:
    """B waits for a lock on master M (its sharded subscription on M); the slot
    moves to master T. M drops B's subscription (a server-sent sunsubscribe);
    B's listener re-homes the channel to T and B tries again. A's release,
    once B listens on T or at once after the move, gives B the lock at once,
    well before A's hold would have expired."""
    nodes = fresh_nodes
    source, target = nodes.masters()[0], nodes.masters()[1]
    a, b = await fresh_make(), await fresh_make()
    for stem, rehomed_first in (("moved", True), ("moving", False)):
        name = nodes.name_on(source, stem)
        held_a = await a.lock(name).acquire()
        lock_b = b.lock(name)
        channel = lock_b._names.wait_channel(b.id)
        waiting = asyncio.ensure_future(lock_b.acquire())
        try:
            await parked_on(b, nodes, source, channel)
            await _migrate(fresh_cluster, _slot(name), target)
            await nodes.load()
            if rehomed_first:
                await eventually(
                    lambda channel=channel: _listens_on(b, nodes, target, channel),
                    what="B's channel re-homed to the slot's new master",
                )
            await held_a.release()
            async with asyncio.timeout(WOKEN):
                held_b = await waiting
        finally:
            waiting.cancel()
        assert await nodes.owners(target, f"cp:{{{name}}}") == [b.id]
        assert held_b.fencing_token > held_a.fencing_token
        assert await nodes.shard_subscribers(source, channel) == 0
        await held_b.release()


async def test_waiter_when_the_slot_map_lags(fresh_make: MakeClient, fresh_nodes: Nodes) -> None:
    """The slot of B's channel moves, and the source is told first: it drops
    B's subscription while the other nodes still name it the owner, so the
    slot map B reads then still says "source" (the channel stays there, and
    the source refuses it with MOVED). B's listener keeps asking, at most a
    second apart, until the map agrees: once the move is finished, B listens
    on the new owner and gets the lock well before A's TTL."""
    nodes = fresh_nodes
    source, target = nodes.masters()[1], nodes.masters()[2]
    a, b = await fresh_make(), await fresh_make()
    name = nodes.name_on(source, "lag")
    held_a = await a.lock(name).acquire()
    lock_b = b.lock(name)
    channel = lock_b._names.wait_channel(b.id)
    waiting = asyncio.ensure_future(lock_b.acquire())
    try:
        await parked_on(b, nodes, source, channel)
        topology = seam.engine(b).topology
        assert topology is not None
        refreshes = topology.refreshes
        await _give_away(nodes, _slot(name), target)

        async def dropped() -> bool:
            return (
                await nodes.shard_subscribers(source, channel) == 0
                and topology.refreshes > refreshes
            )

        await eventually(dropped, what="the source dropped B's channel and B read the map")
        subscribed = seam.listener_channels(b).get(channel)
        assert subscribed is not None and not subscribed.is_confirmed  # (the map lags)
        await _finish(nodes, _slot(name), target)
        await nodes.load()
        await eventually(
            lambda: _listens_on(b, nodes, target, channel),
            timeout=WOKEN,
            what="B's channel on the slot's new master",
        )
        await held_a.release()
        async with asyncio.timeout(WOKEN):
            held_b = await waiting
    finally:
        waiting.cancel()
    await held_b.release()


async def test_slot_moves_away_and_back(
    fresh_cluster: ClusterProcess, fresh_make: MakeClient, fresh_nodes: Nodes
) -> None:
    """The slot of B's channel moves away and back.

    * Away, while B waits: B follows it (as above).
    * Back, while B's channel lingers (B got the lock; nobody waits on the
      channel any more): the channel is dropped, not carried to the new
      master for ever.
    * The SUNSUBSCRIBE B's listener sent the first master when the channel
      moved away was answered by MOVED (an error names no channel): no reply
      is left expected there, so B's next wait on that master is confirmed at
      once and woken by the release."""
    nodes = fresh_nodes
    home, away = nodes.masters()[1], nodes.masters()[2]
    a, b = await fresh_make(), await fresh_make()
    name = nodes.name_on(home, "back")
    slot = _slot(name)
    lock_a, lock_b = a.lock(name), b.lock(name)
    channel = lock_b._names.wait_channel(b.id)
    held_a = await lock_a.acquire()
    waiting = asyncio.ensure_future(lock_b.acquire())
    try:
        await parked_on(b, nodes, home, channel)
        await _migrate(fresh_cluster, slot, away)
        await nodes.load()
        await eventually(lambda: _listens_on(b, nodes, away, channel), what="B on the new master")
        await held_a.release()
        async with asyncio.timeout(WOKEN):
            held_b = await waiting
    finally:
        waiting.cancel()
    await held_b.release()
    lingering = seam.listener_channels(b).get(channel)
    assert lingering is not None and lingering.refs == 0  # (Listener.LINGER)
    await _migrate(fresh_cluster, slot, home)
    await nodes.load()

    async def dropped() -> bool:
        return (
            channel not in seam.listener_channels(b)
            and await nodes.shard_subscribers(away, channel) == 0
            and await nodes.shard_subscribers(home, channel) == 0
        )

    await eventually(dropped, what="the lingering channel dropped everywhere")
    held_a = await lock_a.acquire()
    second = await _handoff(lock_b.acquire, held_a.release, b, nodes, home, channel)
    assert second.fencing_token > held_a.fencing_token
    await second.release()


async def test_waiter_across_a_manual_failover(
    fresh_cluster: ClusterProcess, fresh_make: MakeClient, fresh_nodes: Nodes
) -> None:
    """B waits for a lock on master M; CLUSTER FAILOVER on M's replica R. M,
    a replica now, drops B's subscription; B's listener asks M its role
    (replica: nothing is subscribed there again), re-homes the channel to R,
    and B gets the lock when A releases, well before A's TTL. B's listener
    had a link to R already, from when R was a replica (a channel of the
    name's slot pinned there, as a stale map would): R is asked again, and
    says master now."""
    nodes = fresh_nodes
    master = nodes.masters()[0]
    node = fresh_cluster.replica_of(fresh_cluster.node_by_port(int(master.rpartition(":")[2])))
    replica = f"127.0.0.1:{node.port}"
    a, b = await fresh_make(), await fresh_make()
    name = nodes.name_on(master, "failover")
    held_a = await a.lock(name).acquire()
    lock_b = b.lock(name)
    assert await lock_b.is_locked()  # (B's mode is settled: cluster)
    listener = seam.listener(b)
    assert isinstance(listener, ShardedListener)
    pinned = listener._listener(replica).register(f"cp:{{{name}}}:pinned".encode())
    await eventually(lambda: pinned.is_confirmed, what="the pinned channel moved to the master")
    channel = lock_b._names.wait_channel(b.id)
    waiting = asyncio.ensure_future(lock_b.acquire())
    try:
        await parked_on(b, nodes, master, channel)
        await asyncio.to_thread(fresh_cluster.manual_failover, node)
        await nodes.load()
        assert nodes.slots[_slot(name)] == replica
        await eventually(
            lambda: _listens_on(b, nodes, replica, channel),
            timeout=WOKEN,
            what="B's channel on the promoted replica",
        )
        await held_a.release()
        async with asyncio.timeout(WOKEN):
            held_b = await waiting
    finally:
        waiting.cancel()
    assert await nodes.owners(replica, f"cp:{{{name}}}") == [b.id]
    assert held_b.fencing_token > held_a.fencing_token
    listener.unregister(pinned)
    await held_b.release()
