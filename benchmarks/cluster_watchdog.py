"""The watchdog in a cluster: many held locks spread over every slot, renewed per node.

Run it against a running cluster (any node's URL; a 3 + 3 cluster is what
the figures in the report were measured on)::

    python benchmarks/cluster_watchdog.py redis://127.0.0.1:7000 [--locks 10000]

or import it: ``measure(url, ...)`` (a coroutine) or ``run(url, ...)`` return
a dict (see ``measure``), so that the main benchmark runner may add it as a
scenario. It is not part of ``python -m benchmarks``.

One Client takes ``locks`` plain locks (random names: their keys spread over
all 16384 slots, so over every master), every one held without an explicit
lease, so the watchdog renews them every ``lease / 3``. Meanwhile a ticker
task sleeping 1 ms measures event loop lag. Renewal calls are counted twice:
by the watchdog (its calls, one per batch) and by the masters (EVALSHA in
``INFO commandstats``, deltas over the measured window: the split of a batch
refused because a slot moved would show there, not in the watchdog's count).
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import contextlib
import json
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

if __package__ in (None, ""):  # `python benchmarks/cluster_watchdog.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiolock

__all__ = ["measure", "run"]


class _Ticker:
    """A task sleeping ``period`` at a time, recording how late it wakes (seconds)."""

    def __init__(self, period: float = 0.001) -> None:
        self.period = period
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.period)
            self.lags.append(max(0.0, time.perf_counter() - t0 - self.period))

    async def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return self.lags


@contextlib.contextmanager
def _step_cpu(steps: list[float]) -> Iterator[None]:
    """Record the CPU time (``time.thread_time``: what other processes take
    is not counted) of every step of the asyncio event loop (plain asyncio's
    ``Handle._run``; nothing under uvloop) that takes more than 0.2 ms."""
    original = asyncio.events.Handle._run

    def run(handle: asyncio.events.Handle) -> None:
        t0 = time.thread_time()
        original(handle)
        spent = time.thread_time() - t0
        if spent > 0.0002:
            steps.append(spent)

    asyncio.events.Handle._run = run  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]


def _masters(url: str) -> list[redis.Redis]:
    cluster = RedisCluster.from_url(url)
    try:
        return [
            redis.Redis(host=node.host, port=node.port, **_auth(url))
            for node in cluster.get_primaries()  # type: ignore[no-untyped-call]
        ]
    finally:
        cluster.close()


def _auth(url: str) -> dict[str, Any]:
    kwargs = redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
    return {k: kwargs[k] for k in ("username", "password") if kwargs.get(k)}


def _evalsha_calls(masters: list[redis.Redis]) -> dict[str, int]:
    out = {}
    for node in masters:
        stats = node.info("commandstats").get("cmdstat_evalsha", {})
        kw = node.connection_pool.connection_kwargs
        out[f"{kw['host']}:{kw['port']}"] = int(stats.get("calls", 0))
    return out


def _ms(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


async def measure(
    url: str, *, locks: int = 10_000, lease: float = 1.5, duration: float = 3.0
) -> dict[str, Any]:
    """Hold ``locks`` locks in one cluster-mode Client for ``duration`` seconds
    with a ``lease`` (renewed every ``lease / 3``) and return:

    ``renewal_calls_per_interval`` (the watchdog's batches per round),
    ``evalsha_per_interval`` (EVALSHA the masters ran per round, in all) and
    ``evalsha_per_node`` (per master, over the window), ``rounds``,
    ``lag_p50_ms`` / ``lag_p99_ms`` / ``lag_p999_ms`` / ``lag_max_ms`` of a
    1 ms ticker while the locks were renewed, ``idle_lag_p99_ms`` before any
    lock was taken, ``step_cpu_max_ms`` the longest CPU time of one step of the
    event loop (plain asyncio only: the library's own share of the lag, other
    processes on the machine not counted), ``steps_over_1ms_per_interval``,
    ``acquire_s``, ``lost`` (leases lost meanwhile: 0 expected),
    ``masters``.
    """
    masters = _masters(url)
    ticker = _Ticker()
    prefix = f"cwd{secrets.token_hex(3)}"
    async with aiolock.Client.from_url(url, prefix=prefix, lease=lease) as client:
        engine = client._engine
        ticker.start()
        await asyncio.sleep(0.5)
        idle = list(ticker.lags)
        held: list[Any] = []

        async def take(names: list[str]) -> None:
            for name in names:
                held.append(await client.lock(name).acquire())

        names = [f"k{i}" for i in range(locks)]
        t0 = time.perf_counter()
        step = max(1, locks // 100)
        await asyncio.gather(*(take(names[i : i + step]) for i in range(0, locks, step)))
        acquire_s = time.perf_counter() - t0
        # Measure whole intervals, from the middle of one (a round's calls
        # are all sent by then) to the middle of another.
        interval = lease / 3
        rounds0 = engine.watchdog.rounds
        while engine.watchdog.rounds == rounds0:  # noqa: ASYNC110 (the library's counter)
            await asyncio.sleep(0.005)
        await asyncio.sleep(interval / 2)
        ticker.lags.clear()
        before = _evalsha_calls(masters)
        rounds0, calls0 = engine.watchdog.rounds, engine.watchdog.calls
        steps: list[float] = []
        with _step_cpu(steps):
            await asyncio.sleep(max(1, round(duration / interval)) * interval)
        rounds = engine.watchdog.rounds - rounds0
        calls = engine.watchdog.calls - calls0
        lags = list(ticker.lags)
        after = _evalsha_calls(masters)
        await ticker.stop()
        lost = sum(1 for lease_ in held if lease_.lost)
        await asyncio.gather(*(lease_.release() for lease_ in held), return_exceptions=True)
        nodes = engine.renew_mux.nodes  # type: ignore[attr-defined]
    for node in masters:
        node.close()
    per_node = {name: after[name] - before.get(name, 0) for name in after}
    return {
        "locks": locks,
        "lease": lease,
        "interval": lease / 3,
        "rounds": rounds,
        "renewal_calls_per_interval": round(calls / max(rounds, 1), 2),
        "evalsha_per_interval": round(sum(per_node.values()) / max(rounds, 1), 2),
        "evalsha_per_node": per_node,
        "lag_p50_ms": _ms(lags, 0.50),
        "lag_p99_ms": _ms(lags, 0.99),
        "lag_p999_ms": _ms(lags, 0.999),
        "lag_max_ms": _ms(lags, 1.0),
        "idle_lag_p99_ms": _ms(idle, 0.99),
        "step_cpu_max_ms": _ms(steps, 1.0),
        "steps_over_1ms_per_interval": round(sum(x > 0.001 for x in steps) / max(rounds, 1), 1),
        "acquire_s": round(acquire_s, 2),
        "lost": lost,
        "masters": len(masters),
        "renewal_nodes": nodes,
    }


def run(url: str, *, loop: str = "asyncio", **options: Any) -> dict[str, Any]:
    """``measure`` in a fresh event loop: ``loop`` "asyncio" or "uvloop"."""
    if loop == "uvloop":
        import uvloop

        return {"loop": loop, **uvloop.run(measure(url, **options))}
    return {"loop": loop, **asyncio.run(measure(url, **options))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="any node of the cluster, e.g. redis://127.0.0.1:7000")
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--lease", type=float, default=1.5)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    result = run(
        args.url, loop=args.loop, locks=args.locks, lease=args.lease, duration=args.duration
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
