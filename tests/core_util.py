"""Helpers shared by the tests (fixtures live in conftest)."""

from __future__ import annotations

import asyncio
import inspect
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from aiolock import Client, InvalidArgumentError, InvalidArgumentTypeError
from aiolock.testing import seam

if TYPE_CHECKING:
    from tests.servers import RedisServer

T = TypeVar("T")


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.005,
    block_loop: bool = False,
) -> None:
    """Poll ``predicate()`` until it is true; fail after a generous ``timeout``.

    The one polling helper of the suite. ``predicate`` may be sync or async
    (an async one is awaited each round). ``what`` names the awaited event in
    the failure. ``interval`` is the pause between polls (0: every loop turn).

    ``block_loop=True`` polls a sync predicate with ``time.sleep``, never
    yielding: the whole event loop waits. For "the server ran it, the reply is
    not read yet" set-ups: the predicate asks the server over its own
    connection (``server.execute``), so the verdict waits for that event
    rather than for a guessed sleep.
    """
    clock = time.monotonic if block_loop else asyncio.get_running_loop().time
    deadline = clock() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            assert not block_loop, "block_loop=True needs a sync predicate"
            result = await result
        if result:
            return
        if clock() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        if block_loop:
            time.sleep(interval)  # noqa: ASYNC251  (blocking the loop is the point)
        else:
            await asyncio.sleep(interval)


def is_quiet(client: Client) -> bool:
    s = client.statistics()
    return (
        s.holds == 0
        and s.waiting == 0
        and s.subscriptions == 0
        and s.watched == 0
        and s.in_flight == 0
        and s.background == 0
    )


def parked_on_channels(client: Client) -> int:
    """Tasks of ``client`` parked on a channel right now (a pub/sub channel, or a
    list-mode BLPOP loop's): past the retry that follows their registration, so
    only a wake-up or their TTL bound (list mode: 1 s) frees them."""
    engine = seam.engine(client)
    channels = [*engine.listener.channels.values()]
    channels += [signal.channel for signal in engine.signals._signals.values()]
    return sum(channel.parked for channel in channels)


async def assert_clean(client: Client, *clients: Client) -> None:
    """Every local trace of locking is gone: no holds, waiters, channels, leases, I/O."""
    for c in (client, *clients):
        await eventually(lambda c=c: is_quiet(c), what=f"{c!r} to be quiet")
        assert seam.local_states(c) == {}, (
            f"local lock states left behind: {seam.local_states(c)}"
        )


def evalsha_calls(server: RedisServer) -> int:
    """Script calls the server has run so far (INFO commandstats)."""
    stats = server.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def short_delay(rng: random.Random) -> float:
    """When a fuzz cancels a task: at once, within 3 ms, or at 10 ms."""
    return rng.choice([0.0, rng.uniform(0, 0.003), 0.01])


async def cancel_at_random(
    rng: random.Random,
    contender: Callable[[], Coroutine[Any, Any, None]],
    *,
    rounds: int,
    share: float = 0.6,
    delay: Callable[[random.Random], float] = short_delay,
    tasks: int = 8,
) -> int:
    """The cancellation fuzzes' driver: ``rounds`` rounds of ``tasks``
    contenders at once, a ``share`` of them cancelled after ``delay(rng)``.

    Checks every task against every cancel: a task whose cancel was
    delivered (``cancel()`` returned True) ended cancelled (none swallowed);
    any other task did not (no cancellation from nowhere). A cancel still
    due when every task of the round has ended is dropped, not waited for:
    it would find its task done, and deliver nothing. Lets TimeoutError pass,
    re-raises any other error. Returns how many tasks ended cancelled.
    """
    loop = asyncio.get_running_loop()
    cancelled = 0
    for _ in range(rounds):
        running = [asyncio.create_task(contender()) for _ in range(tasks)]
        requested: dict[asyncio.Task[None], bool] = {}
        due: list[asyncio.TimerHandle] = []
        for task in running:
            if rng.random() < share:

                def cancel(
                    t: asyncio.Task[None] = task,
                    requested: dict[asyncio.Task[None], bool] = requested,
                ) -> None:
                    requested[t] = t.cancel()

                due.append(loop.call_later(delay(rng), cancel))
        results = await asyncio.gather(*running, return_exceptions=True)
        for handle in due:
            handle.cancel()  # (one that has run already is not affected)
        for task, result in zip(running, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                cancelled += 1
            elif isinstance(result, BaseException) and not isinstance(result, TimeoutError):
                raise result
            if requested.get(task):
                assert task.cancelled(), "a delivered cancellation was swallowed"
            else:
                assert not task.cancelled(), "a task ended cancelled that nobody cancelled"
    return cancelled


def pubsub_subscribers(server: RedisServer, channel: str) -> int:
    """Subscribers of ``channel`` on the server (PUBSUB NUMSUB)."""
    reply = server.execute("PUBSUB", "NUMSUB", channel)
    return int(reply[1])


def blocked_clients(server: RedisServer) -> int:
    """Connections blocked in BLPOP & co. on the server (INFO clients)."""
    return int(server.info("clients")["blocked_clients"])


class Exclusive:
    """A critical section for the fuzzes: fails at once if two tasks are ever
    inside together; counts the entries (``entered``)."""

    def __init__(self) -> None:
        self.inside = 0
        self.entered = 0

    def enter(self) -> None:
        self.inside += 1
        assert self.inside == 1, "two holders inside at once"
        self.entered += 1

    def leave(self) -> None:
        self.inside -= 1


async def use_exclusively(
    lock: Any,
    rng: random.Random,
    section: Exclusive,
    *,
    leases: Sequence[float | None] | None = None,
) -> None:
    """One contender of an exclusive lock's cancellation fuzz: takes ``lock``
    by ``async with`` (half the time), ``try_acquire`` (no wait, 2 or 50 ms)
    or ``acquire`` with a timeout (1 ms, 10 ms or 1 s; with a lease drawn
    from ``leases`` if given), enters ``section`` and releases."""
    mode = rng.random()
    if mode < 0.5:
        async with lock:
            try:
                section.enter()
                await asyncio.sleep(0)
            finally:
                section.leave()
        return
    if mode < 0.8:
        lease = await lock.try_acquire(rng.choice([0.0, 0.002, 0.05]))
    elif leases is None:
        lease = await lock.acquire(timeout=rng.choice([0.001, 0.01, 1.0]))
    else:
        lease = await lock.acquire(timeout=rng.choice([0.001, 0.01, 1.0]), lease=rng.choice(leases))
    if lease is not None:
        section.enter()
        section.leave()
        await lease.release()


async def take_briefly(lock: Any, rng: random.Random) -> None:
    """Take ``lock`` once and let go at once: by ``async with`` or by
    ``try_acquire`` (no wait, or 10 ms), at random."""
    if rng.random() < 0.5:
        async with lock:
            await asyncio.sleep(0)
    else:
        lease = await lock.try_acquire(wait=rng.choice([0.0, 0.01]))
        if lease is not None:
            await lease.release()


async def cancel_after_turns(acquire: Coroutine[Any, Any, T], turns: int) -> T | None:
    """Run ``acquire`` in a task and cancel it after ``turns`` loop turns:
    its result if it ended first (the cancel came too late to be delivered),
    else None. Any error but the cancellation is raised."""
    task = asyncio.create_task(acquire)
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return None


def mypy_strict(
    config: str | Path, cache_dir: Path, *targets: str | Path, python: Path | None = None
) -> list[str]:
    """The command line of ``mypy --strict`` in a process of its own, one
    error a line (no colour, context or summary); ``python``: the
    interpreter whose installed packages it checks against."""
    interpreter = ("--python-executable", str(python)) if python is not None else ()
    return [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        *interpreter,
        "--config-file",
        str(config),
        "--cache-dir",
        str(cache_dir),
        "--show-error-codes",
        "--no-pretty",
        "--no-color-output",
        "--no-error-summary",
        "--hide-error-context",
        *(str(target) for target in targets),
    ]


async def assert_refuses_bad_arguments(lock: Any) -> None:
    """``lock``'s acquire, try_acquire and ``lock(...)`` refuse bad arguments
    with the typed errors, as they are called: a negative timeout, a zero
    lease, a wait given as a string, an unknown ``on_lost``."""
    with pytest.raises(InvalidArgumentError):
        await lock.acquire(timeout=-1)
    with pytest.raises(InvalidArgumentError):
        await lock.acquire(lease=0)
    with pytest.raises(InvalidArgumentTypeError):
        await lock.try_acquire("1")
    with pytest.raises(InvalidArgumentError):
        lock(on_lost="maybe")


def off_thread(fn: Callable[[], T], timeout: float = 30.0) -> T:
    """``fn()`` in a plain thread with no event loop (warnings are errors
    there too): its result, or its error raised here. Blocks the caller's
    loop: for calls that need nothing of it (a check that refuses at once)."""
    result: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout)
    if errors:
        raise errors[0]
    return result[0]


async def cancel_release(lease: Any, server: RedisServer, key: str) -> None:
    """``lease.release()`` cancelled once it is on the wire: the call ends
    cancelled, and the release still completes in Redis (``key`` goes)."""
    task = asyncio.create_task(lease.release())
    await asyncio.sleep(0)  # the release is on the wire
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: server.execute("EXISTS", key) == 0, what="the release in Redis")


def primitive(client: Client, kind: str, name: str = "res") -> Any:
    """``client``'s primitive of ``kind`` on ``name``: "lock", "spin_lock",
    "fair_lock", "read" or "write" (a read-write lock's sides), "semaphore"
    (2 permits)."""
    if kind == "lock":
        return client.lock(name)
    if kind == "spin_lock":
        return client.spin_lock(name)
    if kind == "fair_lock":
        return client.fair_lock(name)
    if kind == "read":
        return client.rw_lock(name).read
    if kind == "write":
        return client.rw_lock(name).write
    assert kind == "semaphore", kind
    return client.semaphore(name, 2)
