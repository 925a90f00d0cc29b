"""A free lock never sits idle while a live waiter sleeps on an out-of-date bound.

A waiter that finds a lock held sleeps at most until the hold in its way can
expire (its TTL), so that a hold that ends without a release still lets it in.
When a later hold is shorter than the one a waiter saw (a fixed ``lease=``
after a watchdog hold) and ends without a release, the waiter must not sleep
on until the first hold's old TTL: every new hold tells the waiters whose
bound lies past its expiry (scripts/_fence.lua, wake_bounds in _wake.lua,
fair_nudge in _fair_queue.lua).

The scenario of the issue, for every primitive that parks on a TTL bound,
on one server and on a cluster: Client 0 holds with a watchdog lease
(``LEASE``); a waiter in each other Client (or several tasks of one Client)
queues, each asking for a fixed ``SHORT`` lease it never releases; Client 0
releases. Each waiter gets the lock when the one before it runs out: the
last within about ``n * SHORT``. Without the fix they waited for ``LEASE``;
the bound asserted, ``CHAIN``, tells the two apart on a
loaded machine.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any

import pytest

from aiolock import Client
from aiolock._primitives.fair import _FairState
from aiolock.testing import seam
from tests.cluster_servers import ClusterProcess
from tests.core_util import eventually

#: The first holder's (watchdog) lease: what the waiters see when they queue
#: (long: a fair lock's waiters also re-check at a third of it, keeping their
#: entries alive).
LEASE = 60.0
#: The fixed lease each waiter takes and lets run out.
SHORT = 0.6
#: Waiters in the chain.
N = 3
#: The longest the chain may take: one SHORT per waiter (and one for a first
#: hold that runs out), plus scheduling on a loaded machine; far less than
#: LEASE / 3 (see above).
CHAIN = (N + 1) * SHORT + 8.0

Make = Callable[..., Awaitable[Client]]


@asynccontextmanager
async def _maker(url: str, **extra: Any) -> AsyncIterator[Make]:
    async with AsyncExitStack() as stack:

        async def make(**options: Any) -> Client:
            options.setdefault("lease", LEASE)
            return await stack.enter_async_context(Client.from_url(url, **extra, **options))

        yield make


@pytest.fixture
async def standalone(url: str) -> AsyncIterator[Make]:
    """``await standalone()``: a started Client (lease ``LEASE``) on the shared server."""
    async with _maker(url) as make:
        yield make


@pytest.fixture
async def on_cluster(cluster: ClusterProcess) -> AsyncIterator[Make]:
    """The same in cluster mode, on the shared cluster."""
    async with _maker(cluster.url, cluster=True) as make:
        yield make


def parked(client: Client) -> int:
    """Waiting calls of ``client`` parked right now, past their confirming
    retry: on a channel of its listener, or as a fair lock's ticket."""
    engine = seam.engine(client)
    on_channels = sum(channel.parked for channel in engine.listener.channels.values())
    tickets = sum(
        len(state.lot) for state in engine.states.values() if isinstance(state, _FairState)
    )
    return on_channels + tickets


def _name() -> str:
    return f"bounds-{uuid.uuid4().hex[:8]}"


async def _chain(
    waiters: Sequence[Callable[[], Awaitable[Any]]],
    queued: Callable[[int], Awaitable[bool]],
    release: Callable[[], Awaitable[Any]],
) -> list[float]:
    """Queue ``waiters`` one after another (``queued(i)``: the first i + 1 wait),
    release the first hold, and return when each waiter got the lock."""
    loop = asyncio.get_running_loop()
    got: list[float] = []
    start = 0.0

    async def run(waiter: Callable[[], Awaitable[Any]]) -> None:
        await waiter()  # never released: its fixed lease runs out
        got.append(loop.time() - start)

    tasks = []
    try:
        for i, waiter in enumerate(waiters):
            tasks.append(asyncio.ensure_future(run(waiter)))
            await eventually(partial(queued, i), what=f"waiter {i} queued")
        start = loop.time()
        await release()
        async with asyncio.timeout(CHAIN):
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return got


async def _one_per_client(make: Make, lock_of: Callable[[Client, str], Any]) -> None:
    """A holder, then one waiter with a short fixed lease in each of N other Clients."""
    name = _name()
    clients = [await make() for _ in range(N + 1)]
    first = await lock_of(clients[0], name).acquire()
    locks = [lock_of(c, name) for c in clients[1:]]

    async def queued(i: int) -> bool:
        return parked(clients[i + 1]) == 1

    waiters = [partial(lk.acquire, lease=SHORT) for lk in locks]
    got = await _chain(waiters, queued, first.release)
    assert len(got) == N


async def _lock(make: Make) -> None:
    await _one_per_client(make, lambda c, name: c.lock(name))


async def _lock_grant_then_shorter_handoff(make: Make) -> None:
    """A grant (watchdog waiter) then a fixed-lease local task of the grantee's
    Client, handed the lock by one script: the other Client's waiter is told."""
    name = _name()
    a, b, c = await make(), await make(), await make()
    first = await a.lock(name).acquire()
    lock_b, lock_c = b.lock(name), c.lock(name)
    loop = asyncio.get_running_loop()
    start = 0.0
    got: list[float] = []

    async def grantee() -> None:
        lease = await lock_b.acquire()  # watchdog: granted by A's release
        await lease.release()  # handed by handoff.lua to B's next task (fixed lease)

    async def short() -> None:
        await lock_b.acquire(lease=SHORT)
        got.append(loop.time() - start)

    async def other() -> None:
        await lock_c.acquire(lease=SHORT)
        got.append(loop.time() - start)

    tasks = [asyncio.ensure_future(grantee())]
    try:
        await eventually(lambda: parked(b) == 1, what="B waits")
        tasks.append(asyncio.ensure_future(other()))
        await eventually(lambda: parked(c) == 1, what="C waits")
        tasks.append(asyncio.ensure_future(short()))
        await eventually(lambda: lock_b.statistics().waiting == 2, what="B's second task queued")
        start = loop.time()
        await first.release()
        async with asyncio.timeout(CHAIN):
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert len(got) == 2


async def _fair_lock(make: Make) -> None:
    name = _name()
    clients = [await make() for _ in range(N + 1)]
    holder = clients[0].fair_lock(name)
    await holder.acquire()
    locks = [c.fair_lock(name) for c in clients[1:]]

    async def queued(i: int) -> bool:
        return await holder.queue_length() == i + 1 and parked(clients[i + 1]) == 1

    waiters = [partial(lk.acquire, lease=SHORT) for lk in locks]
    got = await _chain(waiters, queued, holder.release)
    assert len(got) == N


async def _fair_lock_one_client(make: Make) -> None:
    """The waiters are tasks of one Client: its own hold runs out next."""
    name = _name()
    a, b = await make(), await make()
    holder = a.fair_lock(name)
    await holder.acquire()
    lock = b.fair_lock(name)

    async def queued(i: int) -> bool:
        return await holder.queue_length() == i + 1 and parked(b) == i + 1

    waiters = [partial(lock.acquire, lease=SHORT) for _ in range(N)]
    got = await _chain(waiters, queued, holder.release)
    assert len(got) == N


async def _rw_write(make: Make) -> None:
    await _one_per_client(make, lambda c, name: c.rw_lock(name).write)


async def _rw_read_behind_a_writer(make: Make) -> None:
    """A reader refused because a writer waits sleeps on that writer's entry
    (a Client lease); the writer takes a short write hold when the first
    reader's fixed lease runs out, and lets it run out too."""
    name = _name()
    a, b, c = await make(), await make(), await make()
    await a.rw_lock(name).read.acquire(lease=2 * SHORT)
    write_b, read_c = b.rw_lock(name).write, c.rw_lock(name).read

    async def queued(i: int) -> bool:
        return parked((b, c)[i]) == 1

    async def nothing() -> None:
        return None  # the first hold runs out by itself

    waiters = [partial(write_b.acquire, lease=SHORT), partial(read_c.acquire, lease=SHORT)]
    got = await _chain(waiters, queued, nothing)
    assert len(got) == 2


async def _semaphore(make: Make) -> None:
    """Several tasks of one Client: a release wakes one of them."""
    name = _name()
    a, b = await make(), await make()
    first = await a.semaphore(name, 1).acquire()
    sem = b.semaphore(name, 1)

    async def queued(i: int) -> bool:
        return parked(b) == i + 1

    waiters = [partial(sem.acquire, lease=SHORT) for _ in range(N)]
    got = await _chain(waiters, queued, first.release)
    assert len(got) == N


def _list_mode(scenario: Callable[[Make], Awaitable[None]]) -> Callable[[Make], Awaitable[None]]:
    """``scenario`` with every Client in list mode (BLPOP wake-ups)."""

    async def run(make: Make) -> None:
        async def make_list(**options: Any) -> Client:
            return await make(notify="list", **options)

        await scenario(make_list)

    return run


#: The scenarios that failed before the fix: the waiters slept for LEASE.
SCENARIOS: dict[str, Callable[[Make], Awaitable[None]]] = {
    "lock": _lock,
    "lock-handoff": _lock_grant_then_shorter_handoff,
    "fair": _fair_lock,
    "fair-one-client": _fair_lock_one_client,
    "rw-read": _rw_read_behind_a_writer,
}

#: The same promise where the scenario already held before the fix, pinned
#: (one server): a write release wakes a writer of every Client, a semaphore
#: release with a claim pending wakes every waiter (each tries again and
#: learns the new TTL), and a fair lock's nudges in list mode went by the list.
PINS: dict[str, Callable[[Make], Awaitable[None]]] = {
    "rw-write": _rw_write,
    "semaphore": _semaphore,
    "fair-list": _list_mode(_fair_lock),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_standalone(standalone: Make, scenario: str) -> None:
    await SCENARIOS[scenario](standalone)


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_cluster(on_cluster: Make, scenario: str) -> None:
    await SCENARIOS[scenario](on_cluster)


@pytest.mark.parametrize("scenario", PINS)
async def test_pinned(standalone: Make, scenario: str) -> None:
    await PINS[scenario](standalone)


#: A try that will not wait (``try_acquire()``, no wait) on a free lock whose
#: fence still holds the bound of a waiter that gave up: the try takes a hold
#: shorter than that bound, so its script tells the waiters. A read try once
#: sent no channels then, and the server refused the script.
#: The first hold (in the way of the waiter) is a write hold for "rw-read".
NO_WAIT: dict[str, tuple[Callable[[Client, str], Any], Callable[[Client, str], Any]]] = {
    "lock": (lambda c, name: c.lock(name),) * 2,
    "fair": (lambda c, name: c.fair_lock(name),) * 2,
    "rw-read": (lambda c, name: c.rw_lock(name).write, lambda c, name: c.rw_lock(name).read),
    "rw-write": (lambda c, name: c.rw_lock(name).write,) * 2,
    "semaphore": (lambda c, name: c.semaphore(name, 1),) * 2,
}


@pytest.mark.parametrize("kind", NO_WAIT)
async def test_no_wait_try_under_a_stale_bound(standalone: Make, kind: str) -> None:
    name = _name()
    a, b, c = await standalone(), await standalone(), await standalone()
    holder, side = NO_WAIT[kind]
    first = await holder(a, name).acquire()
    waiter = asyncio.ensure_future(side(b, name).acquire())
    try:
        await eventually(lambda: parked(b) == 1, what="B waits")
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    await first.release()
    hold = await side(c, name).try_acquire(lease=SHORT)
    assert hold is not None
    await hold.release()
