"""Singleflight (client.singleflight): concurrent calls of one name run fn once,
across Clients, on real servers.

Every wait here is for an event: the function's start, a Client's wait
registered on the name's channel (``PUBSUB NUMSUB`` on the server, or the
listener's channel: a Client registers its wait only after it found the run
under way), a key gone. A ttl is checked as the result key's PTTL, not by
waiting for it; the one time bound is the runner's lease (2 s where a runner
is cut off from Redis). About 13 s in all on 2 busy cores (Redis and Valkey);
the cross-process case is behind AIOLOCK_TEST_PROCESSES.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from aiolock import (
    Client,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SharedCallError,
    UnshareableResultError,
    WrongTypeError,
)
from aiolock.testing import seam
from tests.conftest import MakeClient
from tests.core_util import eventually
from tests.servers import TcpProxy


class Boom(Exception):
    """The function's own exception type."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.fixture
async def admin(url: str) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(url)
    try:
        yield conn
    finally:
        await conn.aclose()


def keys_of(name: str) -> tuple[str, str, str]:
    base = f"aiolock:{{{name}}}:sf"
    return base, base + ":res", base + ":ch"


async def subscribers(admin: aioredis.Redis, name: str) -> int:
    channel = keys_of(name)[2]
    ((_, count),) = await admin.pubsub_numsub(channel)
    return int(count)


class Gate:
    """A function that records each run and returns once opened."""

    def __init__(self, value: Any = "v") -> None:
        self.runs = 0
        self.started = asyncio.Event()
        self.opened = asyncio.Event()
        self.value = value

    async def __call__(self, *args: Any) -> Any:
        self.runs += 1
        self.started.set()
        await self.opened.wait()
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


async def calls(n: int, run: Callable[[], Awaitable[Any]]) -> list[asyncio.Task[Any]]:
    """Start n calls and return once each has entered run() (a local follower
    registers in the same step)."""
    tasks = [asyncio.create_task(run()) for _ in range(n)]
    for _ in range(2):
        await asyncio.sleep(0)
    return tasks


async def test_concurrent_callers_over_two_clients_run_fn_once(
    client: Client, other_client: Client, admin: aioredis.Redis
) -> None:
    name = "sf:once"
    gate = Gate({"answer": 42})
    runner = asyncio.create_task(client.singleflight(name).run(gate, 1))
    await gate.started.wait()
    here = await calls(4, lambda: client.singleflight(name).run(gate, 2))
    there = await calls(5, lambda: other_client.singleflight(name).run(gate, 3))
    # other_client's one wait found the run under way and subscribed.
    await eventually(lambda: subscribers(admin, name), what="other_client's waiter")
    assert await subscribers(admin, name) == 1  # one wait per Client, not per caller
    here_stats = client.singleflight(name).statistics()
    assert (here_stats.locked, here_stats.waiting) == (True, 4)
    assert other_client.singleflight(name).statistics().waiting == 5
    gate.opened.set()
    results = await asyncio.gather(runner, *here, *there)
    assert results == [{"answer": 42}] * 10
    assert gate.runs == 1
    run_key, result_key, _ = keys_of(name)
    assert await admin.exists(run_key) == 0
    # ttl=0: the outcome is kept only for that run's waiters (one lease), never reused.
    assert 0 < await admin.pttl(result_key) <= client.lease * 1000
    gate.opened.clear()
    again = asyncio.create_task(other_client.singleflight(name).run(gate))
    await eventually(lambda: gate.runs == 2, what="a new run")
    gate.opened.set()
    assert await again == {"answer": 42}


async def test_ttl_keeps_the_result_for_ttl(
    client: Client, other_client: Client, admin: aioredis.Redis
) -> None:
    name = "sf:ttl"
    gate = Gate([1, 2])
    gate.opened.set()
    ttl = 30.0
    assert await client.singleflight(name, ttl=ttl).run(gate) == [1, 2]
    _, result_key, _ = keys_of(name)
    # It expires ttl after the run ended (Redis expires it: no clock of ours).
    assert 0 < await admin.pttl(result_key) <= ttl * 1000
    # Within the ttl, any caller of the name takes it, whatever its own ttl.
    assert await other_client.singleflight(name).run(gate) == [1, 2]
    assert gate.runs == 1
    await admin.delete(result_key)  # as its expiry does
    assert await other_client.singleflight(name, ttl=ttl).run(gate) == [1, 2]
    assert gate.runs == 2


async def _gone(admin: aioredis.Redis, key: str) -> bool:
    return await admin.exists(key) == 0


async def test_an_exception_reaches_the_runner_unchanged_and_the_others_as_shared_call_error(
    client: Client, other_client: Client, admin: aioredis.Redis
) -> None:
    name = "sf:boom"
    error = Boom("it broke")
    gate = Gate(error)
    runner = asyncio.create_task(client.singleflight(name, ttl=30).run(gate))
    await gate.started.wait()
    local = await calls(2, lambda: client.singleflight(name).run(gate))
    remote = await calls(2, lambda: other_client.singleflight(name).run(gate))
    await eventually(lambda: subscribers(admin, name), what="other_client's waiter")
    gate.opened.set()
    with pytest.raises(Boom) as caught:
        await runner
    assert caught.value is error
    for task in [*local, *remote]:
        with pytest.raises(SharedCallError) as shared:
            await task
        assert shared.value.type_name == "tests.test_singleflight.Boom"
        assert shared.value.message == "it broke"
        assert shared.value.name == name
    # An exception is never cached, even with a ttl: the next call runs fn.
    gate.value = "fine"
    assert await other_client.singleflight(name, ttl=30).run(gate) == "fine"
    assert gate.runs == 2

    # An exception whose str() fails is shared all the same.
    unprintable = Gate(Unprintable())
    runner = asyncio.create_task(client.singleflight(f"{name}:2").run(unprintable))
    await unprintable.started.wait()
    (local_call,) = await calls(1, lambda: client.singleflight(f"{name}:2").run(unprintable))
    unprintable.opened.set()
    with pytest.raises(Unprintable):
        await runner
    with pytest.raises(SharedCallError) as shared:
        await local_call
    assert shared.value.message == "<Unprintable whose str() failed>"


async def test_a_cancelled_runner_hands_the_run_to_a_waiter(
    client: Client, other_client: Client, admin: aioredis.Redis
) -> None:
    name = "sf:cancel-runner"
    first, second = Gate(), Gate("second")
    second.opened.set()
    runner = asyncio.create_task(client.singleflight(name).run(first))
    await first.started.wait()
    waiter = asyncio.create_task(other_client.singleflight(name).run(second))
    await eventually(lambda: subscribers(admin, name), what="other_client's waiter")
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    # The abandon woke it at once (not after the runner's lease).
    async with asyncio.timeout(client.lease / 2):
        assert await waiter == "second"
    assert (first.runs, second.runs) == (1, 1)

    # Cancelled while its begin is on the wire (the reply not read): whatever
    # the begin took is given up in the background, the run is free again.
    task = asyncio.create_task(client.singleflight(name).run(second))
    await asyncio.sleep(0)  # the begin is written
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await eventually(lambda: _gone(admin, keys_of(name)[0]), what="no run left")
    assert await other_client.singleflight(name).run(second) == "second"

    # Cancelled while its outcome is on the wire: the record completes all the
    # same (the waiters get it), and the runner's caller sees its cancellation.
    name = f"{name}:record"
    third = Gate("third")

    async def cancelled_on_return() -> str:
        value = await third()
        # Runs once the task awaits the record (written in this same step).
        asyncio.get_running_loop().call_soon(recording.cancel)
        return str(value)

    recording = asyncio.create_task(client.singleflight(name).run(cancelled_on_return))
    await third.started.wait()
    waiter = asyncio.create_task(other_client.singleflight(name).run(second))
    await eventually(lambda: subscribers(admin, name), what="other_client's waiter")
    third.opened.set()
    with pytest.raises(asyncio.CancelledError):
        await recording
    assert await waiter == "third"
    assert await admin.exists(keys_of(name)[0]) == 0


async def test_a_closed_runner_client_hands_the_run_to_a_waiter(
    make_client: MakeClient, other_client: Client, admin: aioredis.Redis
) -> None:
    name = "sf:closed"
    runner_client = await make_client()
    first, second = Gate(), Gate("second")
    second.opened.set()
    runner = asyncio.create_task(runner_client.singleflight(name).run(first))
    await first.started.wait()
    waiter = asyncio.create_task(other_client.singleflight(name).run(second))
    await eventually(lambda: subscribers(admin, name), what="other_client's waiter")
    await runner_client.aclose()
    async with asyncio.timeout(other_client.lease / 2):
        assert await waiter == "second"
    # The old runner finishes later: its lease is lost, it records nothing.
    first.opened.set()
    assert await runner == "v"
    assert await admin.hget(keys_of(name)[1], "v") == b'"second"'


async def test_a_runner_cut_off_from_redis_is_replaced_within_its_lease(
    proxy: TcpProxy, other_client: Client, admin: aioredis.Redis
) -> None:
    name = "sf:cut"
    lease = 2.0  # short, yet renewed in time on a busy machine (every lease / 3)
    async with Client.from_url(proxy.url, lease=lease) as cut_client:
        await _run_cut(proxy, cut_client, other_client, admin, name, lease)


async def _run_cut(
    proxy: TcpProxy,
    cut_client: Client,
    other_client: Client,
    admin: aioredis.Redis,
    name: str,
    lease: float,
) -> None:
    first, second = Gate(), Gate("second")
    second.opened.set()
    runner = asyncio.create_task(cut_client.singleflight(name).run(first))
    await first.started.wait()
    waiter = asyncio.create_task(other_client.singleflight(name).run(second))
    await eventually(lambda: subscribers(admin, name), what="other_client's waiter")
    loop = asyncio.get_running_loop()
    began = loop.time()
    # The run's hold is renewed by the watchdog like a lock's (renew.lua): from
    # now on it lasts at least one lease.
    assert await seam.renew_now(cut_client)
    stats = cut_client.statistics()
    assert (stats.holds, stats.losses) == (1, 0)
    proxy.blackhole()  # the runner's process is as good as dead to Redis
    assert await waiter == "second"
    # It took over once the run's lease ran out in Redis, not before.
    assert loop.time() - began >= lease * 0.8
    # The old runner finishes after all: its own caller gets its result, but
    # it lost its lease and cannot overwrite the newer run's record.
    proxy.restore()
    first.opened.set()
    assert await runner == "v"
    assert await admin.hget(keys_of(name)[1], "v") == b'"second"'


async def test_a_cancelled_waiter_affects_nobody_and_leaves_nothing(
    client: Client, other_client: Client, admin: aioredis.Redis
) -> None:
    name = "sf:cancel-waiter"
    gate = Gate("ok")
    runner = asyncio.create_task(client.singleflight(name).run(gate))
    await gate.started.wait()
    # other_client: the first caller talks to Redis for the others; cancel it.
    leader, follower = await calls(2, lambda: other_client.singleflight(name).run(gate))
    local_gone, local_stays = await calls(2, lambda: client.singleflight(name).run(gate))
    await eventually(lambda: subscribers(admin, name), what="other_client's waiter")
    leader.cancel()
    local_gone.cancel()
    await asyncio.gather(leader, local_gone, return_exceptions=True)
    assert leader.cancelled() and local_gone.cancelled()
    # The follower took over other_client's wait: it found the run under way
    # (a Client registers its wait only then).
    await eventually(lambda: _waits(other_client, name), what="the follower's wait")
    gate.opened.set()
    assert await asyncio.gather(runner, follower, local_stays) == ["ok"] * 3
    assert gate.runs == 1
    assert await admin.exists(keys_of(name)[0]) == 0
    for each in (client, other_client):
        stats = each.statistics()
        assert (stats.holds, stats.waiting) == (0, 0)


@pytest.mark.parametrize(
    ("value", "options", "why"),
    [({1, 2}, {}, "could not be serialized"), ("x" * 100, {"max_size": 64}, "over max_size")],
    ids=["unserializable", "oversize"],
)
async def test_an_unshareable_result_is_an_error_for_every_caller(
    client: Client,
    other_client: Client,
    admin: aioredis.Redis,
    value: Any,
    options: dict[str, Any],
    why: str,
) -> None:
    name = f"sf:unshareable:{why}"
    gate = Gate(value)
    runner = asyncio.create_task(client.singleflight(name, **options).run(gate))
    await gate.started.wait()
    local = await calls(1, lambda: client.singleflight(name).run(gate))
    remote = await calls(1, lambda: other_client.singleflight(name).run(gate))
    await eventually(lambda: subscribers(admin, name), what="other_client's waiter")
    gate.opened.set()
    for task in [runner, *local, *remote]:
        with pytest.raises(UnshareableResultError, match=why):
            await task
    assert gate.runs == 1


async def test_bad_input_is_refused_before_any_redis_call_and_the_decorator(
    client: Client, admin: aioredis.Redis
) -> None:
    with pytest.raises(InvalidArgumentError):
        client.singleflight("")
    with pytest.raises(InvalidArgumentTypeError):
        client.singleflight(b"name")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        client.singleflight("n", ttl=-1)
    with pytest.raises(InvalidArgumentTypeError):
        client.singleflight("n", ttl="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        client.singleflight("n", max_size=0)
    with pytest.raises(InvalidArgumentTypeError):
        client.singleflight("n", serializer=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        await client.singleflight("n").run(42)  # type: ignore[arg-type]

    def sync() -> int:
        return 1

    with pytest.raises(InvalidArgumentTypeError):
        client.singleflight("n")(sync)  # type: ignore[arg-type]
    assert await admin.dbsize() == 0

    # A key of the name holding a value aiolock did not write: refused, nothing changed.
    run_key, result_key, _ = keys_of("sf:planted")
    await admin.set(result_key, "planted")
    with pytest.raises(WrongTypeError, match="sf:res"):
        await client.singleflight("sf:planted").run(Gate())
    assert await admin.get(result_key) == b"planted"
    assert await admin.exists(run_key) == 0

    @client.singleflight("sf:decorated", ttl=5)
    async def square(x: int, *, plus: int = 0) -> int:
        """Squares."""
        return x * x + plus

    assert square.__name__ == "square" and square.__doc__ == "Squares."
    assert await square(3, plus=1) == 10
    assert await square(4) == 10  # the same name: the cached result


async def test_on_a_cluster(cluster_url: str) -> None:
    async with Client.from_url(cluster_url) as one, Client.from_url(cluster_url) as two:
        gate = Gate("c")
        runner = asyncio.create_task(one.singleflight("sf:cluster").run(gate))
        await gate.started.wait()
        others = await calls(3, lambda: two.singleflight("sf:cluster").run(gate))
        await eventually(lambda: _waits(two, "sf:cluster"), what="two's waiter")
        gate.opened.set()
        assert await asyncio.gather(runner, *others) == ["c"] * 4
        assert gate.runs == 1


def _waits(client: Client, name: str) -> bool:
    """A task of ``client`` waits for the run of ``name`` (registered on its channel)."""
    channel = seam.engine(client).subscribed(keys_of(name)[2].encode())
    return channel is not None and channel.refs > 0


@pytest.mark.skipif(
    not os.environ.get("AIOLOCK_TEST_PROCESSES"),
    reason="starts 2 Python processes (~7 s on 2 busy cores): AIOLOCK_TEST_PROCESSES=1",
)
async def test_two_processes_run_fn_once(url: str) -> None:
    """Two real processes (the benchmark's workers, 10 callers each, one Client
    each) share one run of one name. Skipped unless AIOLOCK_TEST_PROCESSES is
    set (README_TESTING_NOTES.md): the two Clients of the other tests stand
    for two processes in the default run."""
    from benchmarks.singleflight import _measure

    result = await asyncio.to_thread(_measure, url, 2, 20, 0.5)
    assert (result["calls"], result["runs"]) == (20, 1)
