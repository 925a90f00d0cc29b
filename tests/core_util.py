"""Helpers shared by the core tests (fixtures live in each module or conftest)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from aiolock import Client

if TYPE_CHECKING:
    from tests.servers import RedisServer


async def eventually(
    predicate: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
) -> None:
    """Wait until ``predicate()`` is true; fail after a generous ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


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


async def assert_clean(client: Client, *clients: Client) -> None:
    """Every local trace of locking is gone: no holds, waiters, channels, leases, I/O."""
    for c in (client, *clients):
        await eventually(lambda c=c: is_quiet(c), what=f"{c!r} to be quiet")
        assert c._engine.states == {}, f"local lock states left behind: {c._engine.states}"


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

    Checks that every cancellation delivered ended its task cancelled (none
    swallowed), lets TimeoutError pass, re-raises any other error. Returns
    how many tasks ended cancelled.
    """
    loop = asyncio.get_running_loop()
    cancelled = 0
    for _ in range(rounds):
        running = [asyncio.create_task(contender()) for _ in range(tasks)]
        requested: dict[asyncio.Task[None], bool] = {}
        for task in running:
            if rng.random() < share:

                def cancel(
                    t: asyncio.Task[None] = task,
                    requested: dict[asyncio.Task[None], bool] = requested,
                ) -> None:
                    requested[t] = t.cancel()

                loop.call_later(delay(rng), cancel)
        results = await asyncio.gather(*running, return_exceptions=True)
        await asyncio.sleep(0.012)  # let every scheduled cancel fire
        for task, result in zip(running, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                cancelled += 1
            elif isinstance(result, BaseException) and not isinstance(result, TimeoutError):
                raise result
            if requested.get(task):
                assert task.cancelled(), "a delivered cancellation was swallowed"
    return cancelled


def block_until(predicate: Callable[[], bool], *, within: float = 10.0, what: str = "") -> None:
    """Block the whole event loop (a synchronous poll) until ``predicate()``.

    For "the server did it, the reply is not read yet" set-ups: the predicate
    asks the server over its own connection (``server.execute``), so the
    verdict waits for the event rather than for a guessed sleep.
    """
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what or predicate}")
        time.sleep(0.002)


def pubsub_subscribers(server: RedisServer, channel: str) -> int:
    """Subscribers of ``channel`` on the server (PUBSUB NUMSUB)."""
    reply = server.execute("PUBSUB", "NUMSUB", channel)
    return int(reply[1])


def blocked_clients(server: RedisServer) -> int:
    """Connections blocked in BLPOP & co. on the server (INFO clients)."""
    return int(server.info("clients")["blocked_clients"])

