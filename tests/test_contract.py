"""One contract suite for every primitive, under every notify mode, on both servers.

Two Clients stand for two processes. Each primitive is described by a
`Kind`: how to make it, how many may hold it at once, whether it is
reentrant or FIFO, and what blocks it. The contracts (DESIGN.md): mutual
exclusion (at most N for the semaphore), reentrancy where promised, FIFO
where promised, try-acquire never blocks, timeouts honoured, a lost lease
cancels the body, fencing tokens strictly increase, and after random
cancellations nothing is left behind.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from aiolock import Client, LockLostError, LockTimeoutError
from tests.conftest import MakeClient
from tests.core_util import assert_clean, eventually
from tests.servers import RedisServer


@dataclass(frozen=True)
class Kind:
    id: str
    make: Callable[[Client, str], Any]
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
MODES = ["pubsub", "list", "poll"]
#: The Clients' lease: renewed every 10 s, so a loaded machine's scheduling
#: stalls (seconds) never cost a watchdog-kept hold; tests needing a lease to
#: run out ask a fixed one.
LEASE = 30.0


def _kinds(predicate: Callable[[Kind], bool]) -> Any:
    """Parametrise ``kind`` with only the kinds whose contract has the clause."""
    kinds = [k for k in KINDS if predicate(k)]
    return pytest.mark.parametrize("kind", kinds, ids=[k.id for k in kinds])


@pytest.fixture(params=KINDS, ids=[k.id for k in KINDS])
def kind(request: pytest.FixtureRequest) -> Kind:
    k: Kind = request.param
    return k


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    m: str = request.param
    return m


@pytest.fixture
async def clients(make_client: MakeClient, mode: str) -> tuple[Client, Client]:
    options = {"prefix": "k", "lease": LEASE, "notify": mode}
    return await make_client(**options), await make_client(**options)


async def _block(kind: Kind, client: Client, name: str) -> list[Any]:
    if kind.block is not None:
        return await kind.block(client, name)
    return [await kind.make(client, name).acquire()]


async def _release_all(leases: list[Any]) -> None:
    for lease in leases:
        await lease.release()


async def test_exclusion(kind: Kind, clients: tuple[Client, Client]) -> None:
    inside = 0
    peak = 0

    async def worker(client: Client) -> None:
        nonlocal inside, peak
        prim = kind.make(client, "x")
        for _ in range(4):
            async with prim:
                inside += 1
                peak = max(peak, inside)
                if kind.limit is not None:
                    assert inside <= kind.limit
                await asyncio.sleep(0.001)
                inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker(c) for c in clients for _ in range(4))), 120)
    assert peak >= 1
    await assert_clean(*clients)


@_kinds(lambda k: k.reentrant)
async def test_reentrancy(kind: Kind, clients: tuple[Client, Client]) -> None:
    a, _ = clients
    prim = kind.make(a, "re")
    outer = await prim.acquire()
    inner = await prim.try_acquire()
    assert inner is not None, "the holder may acquire again"
    assert inner.fencing_token == outer.fencing_token
    await inner.release()
    assert await prim.is_owned()
    await outer.release()
    await assert_clean(*clients)


@_kinds(lambda k: k.fifo)
async def test_fifo(kind: Kind, clients: tuple[Client, Client]) -> None:
    a, b = clients
    held = await asyncio.create_task(kind.make(a, "q").acquire())
    order: list[int] = []
    tasks = []
    for i in range(6):
        client = (a, b)[i % 2]

        async def waiter(i: int = i, client: Client = client) -> None:
            async with kind.make(client, "q"):
                order.append(i)

        tasks.append(asyncio.create_task(waiter()))
        # Let each waiter take its place in the queue before the next arrives.
        await eventually(lambda i=i: a.statistics().waiting + b.statistics().waiting == i + 1)
    await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert order == list(range(6))
    await assert_clean(*clients)


async def test_try_acquire_never_blocks(kind: Kind, clients: tuple[Client, Client]) -> None:
    a, b = clients
    blockers = await _block(kind, b, "t")
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await kind.make(a, "t").try_acquire() is None
    # One round trip; blocking would last until the blockers' lease ran out.
    assert loop.time() - start < LEASE / 3
    assert a.statistics().waiting == 0
    await _release_all(blockers)
    got = await kind.make(a, "t").try_acquire()
    assert got is not None
    await got.release()
    await assert_clean(*clients)


async def test_timeout_honoured(kind: Kind, clients: tuple[Client, Client]) -> None:
    a, b = clients
    blockers = await _block(kind, b, "to")
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(LockTimeoutError):
        await kind.make(a, "to").acquire(timeout=0.3)
    elapsed = loop.time() - start
    assert 0.25 <= elapsed < 0.3 + 3.0
    await _release_all(blockers)
    await assert_clean(*clients)


async def test_lost_lease_cancels_body(kind: Kind, clients: tuple[Client, Client]) -> None:
    a, _ = clients
    finished = False
    with pytest.raises(LockLostError):
        async with kind.make(a, "lost")(lease=0.2):
            await asyncio.sleep(30)
            finished = True
    assert not finished
    await assert_clean(*clients)


async def test_fencing_tokens_increase(kind: Kind, clients: tuple[Client, Client]) -> None:
    tokens = []
    for i in range(6):
        lease = await kind.make(clients[i % 2], "f").acquire()
        tokens.append(lease.fencing_token)
        await lease.release()
    assert all(x < y for x, y in itertools.pairwise(tokens)), tokens
    await assert_clean(*clients)


async def test_random_cancellation_leaves_nothing(
    kind: Kind, clients: tuple[Client, Client], server: RedisServer
) -> None:
    rng = random.Random(7)
    loop = asyncio.get_running_loop()

    async def contender(client: Client) -> None:
        prim = kind.make(client, "z")
        if rng.random() < 0.5:
            async with prim:
                await asyncio.sleep(0)
        else:
            lease = await prim.try_acquire(wait=rng.choice([0.0, 0.01]))
            if lease is not None:
                await lease.release()

    for _ in range(40):
        tasks = [asyncio.create_task(contender(rng.choice(clients))) for _ in range(6)]
        for task in tasks:
            if rng.random() < 0.7:
                loop.call_later(rng.uniform(0, 0.004), task.cancel)
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(
                result, asyncio.CancelledError | TimeoutError
            ):
                raise result
    await asyncio.sleep(0.01)
    await assert_clean(*clients)
    # No hold is left, and every key that remains expires by itself (fence
    # counters, signal lists, release markers).
    for key in server.execute("KEYS", "k:{z*"):
        assert int(server.execute("PTTL", key)) > 0, f"{key} is left behind with no TTL"
    for key in ("k:{z}", "k:{z-a}", "k:{z-b}"):
        assert server.execute("EXISTS", key) == 0, f"{key} is still held"
