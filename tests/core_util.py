"""Helpers shared by the tests (fixtures live in conftest)."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from aiolock import Client
from aiolock.testing import seam

if TYPE_CHECKING:
    from tests.servers import RedisServer


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

    Checks every task against every cancel: each scheduled cancel has fired
    (awaited, not slept for); a task whose cancel was delivered (``cancel()``
    returned True) ended cancelled (none swallowed); any other task did not
    (no cancellation from nowhere). Lets TimeoutError pass, re-raises any other
    error. Returns how many tasks ended cancelled.
    """
    loop = asyncio.get_running_loop()
    cancelled = 0
    for _ in range(rounds):
        running = [asyncio.create_task(contender()) for _ in range(tasks)]
        requested: dict[asyncio.Task[None], bool] = {}
        fired: list[asyncio.Future[None]] = []
        for task in running:
            if rng.random() < share:
                done: asyncio.Future[None] = loop.create_future()

                def cancel(
                    t: asyncio.Task[None] = task,
                    requested: dict[asyncio.Task[None], bool] = requested,
                    done: asyncio.Future[None] = done,
                ) -> None:
                    requested[t] = t.cancel()
                    done.set_result(None)

                loop.call_later(delay(rng), cancel)
                fired.append(done)
        results = await asyncio.gather(*running, return_exceptions=True)
        await asyncio.gather(*fired)  # every scheduled cancel has fired
        assert len(requested) == len(fired)
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
