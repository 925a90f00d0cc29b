"""The cost of a change of leader (issue 24): from ``resign()`` to the next leader.

    python -m benchmarks.election [--url URL] [--observers 8] [--repeats 50] [--json]

Starts its own redis-server on a free port (unless ``--url``), then, in one
event loop, runs two candidates (each its own Client, as two processes
would be) and ``--observers`` observers (each ``election.observe()`` on a
Client of its own). Each repeat: the leader has announced, every observer
has seen it, the other candidate waits in ``campaign()`` (registered in
Redis); then the leader calls ``resign()``, and it is timed:

* **campaign**: from the call of ``resign()`` to the next leader's
  ``campaign()`` returning (its term announced);
* **all observers**: from the same instant to the last of the observers
  yielding the new leader (each woken by the pub/sub notice of the
  announcement, then reading the leader: one round trip);
* **one observer**: the same, per observer (every observer of every repeat).

The roles then swap. Everything runs on one loop, so a figure includes the
loop's scheduling of every Client (a real deployment spreads them over
processes). p50 and p95 over the repeats, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from contextlib import AsyncExitStack
from time import perf_counter
from typing import Any

from aiolock import Client, Leader, Term
from aiolock._servers import ServerProcess, redis_binary

NAME = "bench:election"
WARMUP = 5


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "p50_ms": round(_pct(ms, 0.50), 3),
        "p95_ms": round(_pct(ms, 0.95), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        "n": len(ms),
    }


class _Observer:
    """One ``observe()`` iterator; ``seen(value)`` resolves at the first yield of it."""

    def __init__(self, client: Client) -> None:
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.task = asyncio.create_task(self._run(client))

    async def _run(self, client: Client) -> None:
        async for leader in client.election(NAME).observe():
            now = perf_counter()
            if isinstance(leader, Leader):
                fut = self.waiting.pop(leader.value, None)
                if fut is not None and not fut.done():
                    fut.set_result(now)

    def seen(self, value: str) -> asyncio.Future[float]:
        fut = self.waiting[value] = asyncio.get_running_loop().create_future()
        return fut


async def _registered(client: Client) -> None:
    """Until the candidate of ``client`` waits in Redis (a benchmark may poll)."""
    while client.statistics().waiting < 1:  # noqa: ASYNC110 (no event tells it)
        await asyncio.sleep(0.0005)


async def measure(url: str, *, observers: int, repeats: int) -> dict[str, Any]:
    campaign: list[float] = []
    every: list[float] = []
    each: list[float] = []
    async with AsyncExitStack() as stack:
        candidates = [await stack.enter_async_context(Client.from_url(url)) for _ in range(2)]
        watchers = [
            _Observer(await stack.enter_async_context(Client.from_url(url)))
            for _ in range(observers)
        ]
        try:
            seen = [w.seen("v0") for w in watchers]
            term: Term = await candidates[0].election(NAME).campaign("v0")
            await asyncio.gather(*seen)
            for i in range(1, WARMUP + repeats + 1):
                value = f"v{i}"
                nxt = candidates[i % 2]
                seen = [w.seen(value) for w in watchers]
                ended: asyncio.Future[float] = asyncio.get_running_loop().create_future()

                async def run(
                    client: Client = nxt, value: str = value, ended: asyncio.Future[float] = ended
                ) -> Term:
                    got = await client.election(NAME).campaign(value)
                    ended.set_result(perf_counter())
                    return got

                task = asyncio.create_task(run())
                await _registered(nxt)
                start = perf_counter()
                await term.resign()
                term = await task
                times = await asyncio.gather(*seen)
                if i > WARMUP:
                    campaign.append(ended.result() - start)
                    every.append(max(times) - start)
                    each.extend(t - start for t in times)
            await term.resign()
        finally:
            for w in watchers:
                w.task.cancel()
            await asyncio.gather(*(w.task for w in watchers), return_exceptions=True)
    return {
        "observers": observers,
        "repeats": repeats,
        "campaign": _summary(campaign),
        "all_observers": _summary(every),
        "one_observer": _summary(each),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a server to use (default: start a redis-server)")
    parser.add_argument("--observers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    server: ServerProcess | None = None
    url = args.url
    if url is None:
        binary = redis_binary()
        if binary is None:
            raise SystemExit("redis-server not found on PATH: pass --url")
        server = ServerProcess(binary).start()
        url = server.url
    try:
        result = asyncio.run(measure(url, observers=args.observers, repeats=args.repeats))
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"election change on {url}: {args.observers} observers, {args.repeats} repeats "
        f"(after {WARMUP} warm-up)"
    )
    for key, label in (
        ("campaign", "resign() -> next campaign() returns"),
        ("all_observers", "resign() -> every observer saw it"),
        ("one_observer", "resign() -> one observer saw it"),
    ):
        s = result[key]
        print(f"  {label:40} p50 {s['p50_ms']:7.3f} ms   p95 {s['p95_ms']:7.3f} ms")


if __name__ == "__main__":
    main()
