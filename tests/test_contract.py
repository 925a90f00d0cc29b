"""One contract suite for every primitive, on every deployment, under every notify mode.

Two sides stand for two processes. Each primitive is described by a `Kind`:
how to make it, how many may hold it at once, whether it is reentrant or
FIFO, and what blocks it. Each deployment by a `Deployment`: how one side is
made there (Clients, or a Redlock over Clients), which servers keep its keys,
and which notify modes run on it. The contracts (DESIGN.md): mutual
exclusion (at most N for the semaphore), reentrancy where promised, FIFO
where promised, try-acquire never blocks, timeouts honoured, a release wakes
a parked waiter (not its TTL), a lost lease cancels the body, fencing tokens
strictly increase, and after random cancellations nothing is left behind.

The deployments: one server (Redis and Valkey, every notify mode), the
shared Redis Cluster (pub/sub and list: sharded channels and per-node
BLPOP), the shared Sentinel set, a master with ``replicas=1`` (the
acknowledged lane), and Redlock over three masters (Redis 7.0, and Redis
6.2 and Valkey 9.1 as well). Every (deployment, kind) pair that does not
run is in `EXCLUDED`, with its reason.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest

from aiolock import Client, LockLostError, LockTimeoutError, Redlock
from tests.conftest import KINDS as BACKENDS
from tests.conftest import MATRIX_BACKENDS, URL_ENV, healthy_pair, pairwise_skips
from tests.core_util import assert_clean, cancel_at_random, eventually, take_briefly
from tests.sentinel_servers import SERVICE
from tests.servers import RedisServer


@dataclass(frozen=True)
class Kind:
    id: str
    #: The primitive of a side (a Client, or a Redlock) by name.
    make: Callable[[Any, str], Any]
    #: How many holders at once (None: any number, e.g. readers).
    limit: int | None = 1
    reentrant: bool = True
    fifo: bool = False
    #: Takes the primitive so that `make` cannot be acquired (default: `limit` holds).
    block: Callable[[Client, str], Awaitable[list[Any]]] | None = None


async def _rw_write_block(client: Client, name: str) -> list[Any]:
    return [await client.rw_lock(name).write.acquire()]


async def _sem_block(client: Client, name: str) -> list[Any]:
    return [await client.semaphore(name, 2).acquire(permits=2)]


KINDS = [
    Kind("lock", lambda c, n: c.lock(n)),
    Kind("spin_lock", lambda c, n: c.spin_lock(n)),
    Kind("fair_lock", lambda c, n: c.fair_lock(n), fifo=True),
    Kind("rw.write", lambda c, n: c.rw_lock(n).write),
    Kind("rw.read", lambda c, n: c.rw_lock(n).read, limit=None, block=_rw_write_block),
    Kind("semaphore", lambda c, n: c.semaphore(n, 2), limit=2, reentrant=False, block=_sem_block),
    Kind("multi_lock", lambda c, n: c.multi_lock(c.lock(n + "-a"), c.lock(n + "-b"))),
]
#: The Clients' lease: renewed every 10 s, so a loaded machine's scheduling
#: stalls (seconds) never cost a watchdog-kept hold; tests needing a lease to
#: run out ask a fixed one.
LEASE = 30.0


@dataclass(frozen=True)
class Deployment:
    id: str
    #: The (backend, notify mode) pairs it runs with.
    runs: tuple[tuple[str, str], ...]
    #: The suffix of a held name's main key (Redlock keeps its own).
    held_suffix: str = ""


def _every(*modes: str) -> tuple[tuple[str, str], ...]:
    """Every mode on each shared server (one, ``external``, with ``URL_ENV`` set),
    pairwise unless ``AIOLOCK_FULL_MATRIX`` is set (``pairwise_skips``)."""
    servers = ("external",) if os.environ.get(URL_ENV) else BACKENDS
    return tuple(
        (server, mode) for server in servers for mode in modes if not pairwise_skips(server, mode)
    )


def _matrix(*backends: str) -> tuple[tuple[str, str], ...]:
    """The compatibility matrix's servers (Redis 6.2, Valkey 9.1): with the
    default notify mode, on local servers only."""
    return () if os.environ.get(URL_ENV) else tuple((b, "pubsub") for b in backends)


DEPLOYMENTS = [
    # Redis 7.0 and Valkey 8.1 (the whole suite's), then Redis 6.2 (what many
    # managed services still run) and Valkey 9.1: every contract on each.
    Deployment("one", (*_every("pubsub", "list", "poll"), *_matrix(*MATRIX_BACKENDS))),
    # Sharded pub/sub is where Redis and Valkey clusters differ (who drops a
    # moved channel, and how): both. A per-node BLPOP is the same on both.
    # Poll mode retries by the TTL bound alone, routed like any acquire: no
    # node-specific waiting to exercise, so one server covers it.
    # Valkey 9.1 too; Redis 6.2 has no sharded pub/sub (see the README).
    Deployment(
        "cluster",
        (("redis", "pubsub"), ("valkey", "pubsub"), ("redis", "list"), *_matrix("valkey-9.1")),
    ),
    # Sentinel, replicas=1 and Redlock change where commands go and how they
    # are acknowledged, not how a waiter is woken; what Redis and Valkey do
    # differently the one-server runs cover, so one backend each. (A Sentinel
    # set of Redis 6.2 or Valkey 9.1 servers: tests/test_server_matrix.py.)
    Deployment("sentinel", (("redis", "pubsub"),)),
    Deployment("replicas", (("valkey", "pubsub"),)),
    # Redlock on Redis 6.2 and Valkey 9.1 too: its own scripts (the server's
    # clock, the fence's generations) run on each server of the matrix.
    Deployment("redlock", (("redis", "pubsub"), *_matrix(*MATRIX_BACKENDS)), held_suffix=":rl"),
]

#: The decision is local once the script has run where the deployment sends
#: it: a re-entry, a wait's deadline, a fixed lease's end.
_LOCAL = "decided by the Client, as on one server, once the master is found"

#: Every (deployment, contract, kind) that does not run, and why; "*": any.
EXCLUDED: dict[tuple[str, str, str], str] = {
    **{
        ("redlock", "*", k.id): "Redlock offers one kind, a mutex (Redlock.lock)"
        for k in KINDS
        if k.id != "lock"
    },
    ("cluster", "timeout_honoured", "*"): _LOCAL,
    ("cluster", "lost_lease_cancels_body", "*"): _LOCAL,
    ("sentinel", "reentrancy", "*"): _LOCAL,
    ("sentinel", "timeout_honoured", "*"): _LOCAL,
    ("sentinel", "lost_lease_cancels_body", "*"): _LOCAL,
    ("replicas", "timeout_honoured", "*"): _LOCAL,
    ("replicas", "lost_lease_cancels_body", "*"): _LOCAL,
}


def _excluded(deployment: str, contract: str, kind: str) -> bool:
    return any((deployment, c, k) in EXCLUDED for c in (contract, "*") for k in (kind, "*"))


@dataclass
class Place:
    """Where a contract runs: a deployment, a backend, a notify mode."""

    deployment: Deployment
    backend: str
    mode: str

    @property
    def id(self) -> str:
        return f"{self.deployment.id}-{self.backend}-{self.mode}"


def _cases(contract: str, predicate: Callable[[Kind], bool] = lambda k: True) -> Any:
    """Parametrise ``case`` with every (place, kind) where ``contract`` runs:
    the kind's contract has the clause, and the table does not exclude it."""
    cases = [
        pytest.param((Place(d, b, m), k), id=f"{d.id}-{b}-{m}-{k.id}")
        for d in DEPLOYMENTS
        for b, m in d.runs
        for k in KINDS
        if predicate(k) and not _excluded(d.id, contract, k.id)
    ]
    return pytest.mark.parametrize("case", cases)


@dataclass
class Side:
    """One "process": what a kind's ``make`` takes (a Client, or a Redlock),
    and the Clients under it."""

    maker: Any
    clients: Sequence[Client]

    def waiting(self) -> int:
        return sum(c.statistics().waiting for c in self.clients)


@dataclass
class Setup:
    kind: Kind
    deployment: Deployment
    a: Side
    b: Side
    #: The servers that keep the keys (a cluster's masters, Redlock's three).
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def sides(self) -> tuple[Side, Side]:
        return self.a, self.b

    async def clean(self) -> None:
        await assert_clean(*self.a.clients, *self.b.clients)

    def main_key(self, name: str) -> str:
        return f"k:{{{name}}}{self.deployment.held_suffix}"


def _nodes(request: pytest.FixtureRequest, place: Place) -> tuple[list[RedisServer], Any]:
    """The servers of ``place``, reset (flushed, healthy), and what a side's
    Clients are made from: a URL, or ``("sentinel", set)``, or Redlock's URLs."""
    d, backend = place.deployment.id, place.backend
    if d == "one":
        server: RedisServer = request.getfixturevalue("_server_pool").get(backend)
        server.reset()
        return [server], server.url
    if d == "cluster":
        cluster = request.getfixturevalue("_cluster_pool").get(backend)
        cluster.reset()
        return list(cluster.masters()), cluster.url
    if d == "sentinel":
        sentinel_set = request.getfixturevalue("_sentinel_pool").get(backend)
        sentinel_set.heal()
        sentinel_set.flushall()
        request.addfinalizer(sentinel_set.heal)
        return [sentinel_set.master], sentinel_set
    if d == "replicas":
        pair = healthy_pair(request.getfixturevalue("_pair_pool").get(backend))
        return [pair.master], pair.master.url
    masters = request.getfixturevalue("redlock_masters_pool").get(backend)
    masters.reset()
    return list(masters), [m.url for m in masters]


@pytest.fixture
async def setup(request: pytest.FixtureRequest, case: tuple[Place, Kind]) -> AsyncIterator[Setup]:
    place, kind = case
    nodes, where = _nodes(request, place)
    options: dict[str, Any] = {"prefix": "k", "lease": LEASE, "notify": place.mode}
    d = place.deployment.id
    async with AsyncExitStack() as stack:

        async def client(url: str, **more: Any) -> Client:
            return await stack.enter_async_context(Client.from_url(url, **options, **more))

        async def side() -> Side:
            if d == "sentinel":
                made = Client.from_sentinel(where.sentinel_addresses, SERVICE, **options)
                c = await stack.enter_async_context(made)
                return Side(c, [c])
            if d == "redlock":
                clients = [await client(url) for url in where]
                return Side(Redlock(clients), clients)
            more = {"cluster": True} if d == "cluster" else {}
            if d == "replicas":
                more = {"replicas": 1}
            c = await client(where, **more)
            return Side(c, [c])

        yield Setup(kind, place.deployment, await side(), await side(), nodes)


async def _block(kind: Kind, side: Side, name: str) -> list[Any]:
    if kind.block is not None:
        return await kind.block(side.maker, name)
    return [await kind.make(side.maker, name).acquire()]


async def _release_all(leases: list[Any]) -> None:
    for lease in leases:
        await lease.release()


@_cases("exclusion")
async def test_exclusion(setup: Setup) -> None:
    kind = setup.kind
    inside = 0
    peak = 0

    async def worker(side: Side) -> None:
        nonlocal inside, peak
        prim = kind.make(side.maker, "x")
        for _ in range(4):
            async with prim:
                inside += 1
                peak = max(peak, inside)
                if kind.limit is not None:
                    assert inside <= kind.limit
                await asyncio.sleep(0.001)
                inside -= 1

    workers = (worker(side) for side in setup.sides for _ in range(4))
    await asyncio.wait_for(asyncio.gather(*workers), 120)
    assert peak >= 1
    await setup.clean()


@_cases("reentrancy", lambda k: k.reentrant)
async def test_reentrancy(setup: Setup) -> None:
    prim = setup.kind.make(setup.a.maker, "re")
    outer = await prim.acquire()
    inner = await prim.try_acquire()
    assert inner is not None, "the holder may acquire again"
    assert inner.fencing_token == outer.fencing_token
    await inner.release()
    assert await prim.is_owned()
    await outer.release()
    await setup.clean()


@_cases("fifo", lambda k: k.fifo)
async def test_fifo(setup: Setup) -> None:
    kind, (a, b) = setup.kind, setup.sides
    held = await asyncio.create_task(kind.make(a.maker, "q").acquire())
    order: list[int] = []
    tasks = []
    for i in range(6):
        side = (a, b)[i % 2]

        async def waiter(i: int = i, side: Side = side) -> None:
            async with kind.make(side.maker, "q"):
                order.append(i)

        tasks.append(asyncio.create_task(waiter()))
        # Let each waiter take its place in the queue before the next arrives.
        await eventually(lambda i=i: a.waiting() + b.waiting() == i + 1)
    await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert order == list(range(6))
    await setup.clean()


@_cases("try_acquire_never_blocks")
async def test_try_acquire_never_blocks(setup: Setup) -> None:
    kind, (a, b) = setup.kind, setup.sides
    blockers = await _block(kind, b, "t")
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await kind.make(a.maker, "t").try_acquire() is None
    # One round trip; blocking would last until the blockers' lease ran out.
    assert loop.time() - start < LEASE / 3
    assert a.waiting() == 0
    await _release_all(blockers)
    got = await kind.make(a.maker, "t").try_acquire()
    assert got is not None
    await got.release()
    await setup.clean()


@_cases("timeout_honoured")
async def test_timeout_honoured(setup: Setup) -> None:
    kind, (a, b) = setup.kind, setup.sides
    blockers = await _block(kind, b, "to")
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(LockTimeoutError):
        await kind.make(a.maker, "to").acquire(timeout=0.3)
    elapsed = loop.time() - start
    assert 0.25 <= elapsed < 0.3 + 3.0
    await _release_all(blockers)
    await setup.clean()


@_cases("release_wakes_a_waiter")
async def test_release_wakes_a_waiter(setup: Setup) -> None:
    """A waits on B's hold; B lets go: A gets it well before B's lease would
    have run out (woken by the release, on whatever node keeps the name)."""
    kind, (a, b) = setup.kind, setup.sides
    blockers = await _block(kind, b, "w")
    prim = kind.make(a.maker, "w")
    waiting = asyncio.ensure_future(prim.acquire())
    try:
        # (The lock's own statistics: a Redlock's waiters wait on no one Client.)
        await eventually(lambda: prim.statistics().waiting == 1, what="A waiting")
        assert not waiting.done()
        await _release_all(blockers)
        async with asyncio.timeout(LEASE / 3):
            got = await waiting
    finally:
        waiting.cancel()
    await got.release()
    await setup.clean()


@_cases("lost_lease_cancels_body")
async def test_lost_lease_cancels_body(setup: Setup) -> None:
    finished = False
    with pytest.raises(LockLostError):
        async with setup.kind.make(setup.a.maker, "lost")(lease=0.2):
            await asyncio.sleep(30)
            finished = True
    assert not finished
    await setup.clean()


@_cases("fencing_tokens_increase")
async def test_fencing_tokens_increase(setup: Setup) -> None:
    tokens = []
    for i in range(6):
        lease = await setup.kind.make(setup.sides[i % 2].maker, "f").acquire()
        tokens.append(lease.fencing_token)
        await lease.release()
    assert all(x < y for x, y in itertools.pairwise(tokens)), tokens
    await setup.clean()


@_cases("random_cancellation_leaves_nothing")
async def test_random_cancellation_leaves_nothing(setup: Setup) -> None:
    kind = setup.kind
    rng = random.Random(7)
    await cancel_at_random(
        rng,
        lambda: take_briefly(kind.make(rng.choice(setup.sides).maker, "z"), rng),
        rounds=40,
        share=0.7,
        delay=lambda rng: rng.uniform(0, 0.004),
        tasks=6,
    )
    await asyncio.sleep(0.01)
    await setup.clean()
    # No hold is left, and every key that remains expires by itself (fence
    # counters, signal lists, release markers), on every node. (KEYS, not
    # EXISTS: a cluster node answers only for its own slots.)
    held = {setup.main_key(name) for name in ("z", "z-a", "z-b")}
    for node in setup.nodes:
        for key in node.execute("KEYS", "k:{z*"):
            assert key not in held, f"{key} is still held on {node!r}"
            assert int(node.execute("PTTL", key)) > 0, f"{key} is left behind with no TTL"


def test_exclusions_name_real_contracts_and_kinds() -> None:
    """Every row of `EXCLUDED` names a deployment, a contract of this module
    and a kind that exist: a renamed test cannot leave a stale exclusion."""
    contracts = {name[len("test_") :] for name in globals() if name.startswith("test_")}
    for deployment, contract, kind in EXCLUDED:
        assert deployment in {d.id for d in DEPLOYMENTS}, deployment
        assert contract == "*" or contract in contracts, contract
        assert kind == "*" or kind in {k.id for k in KINDS}, kind
