"""``aiolock demo``'s worker side: the body of one worker process.

A worker (spawned: a fresh interpreter) makes its own ``Client`` and a plain
data client, waits for the parent's go, then runs ``cfg.tasks`` tasks that
contend for the demo's locks, each doing the racy read-modify-write under the
lock. It reports on the queue ``out``: ``("ready", wid, name)``, then every
``TICK`` ``("tick", wid, snapshot, records)``, then ``("done", wid, finals)``,
or ``("error", wid, traceback)``. The parent (``aiolock.cli.demo``) checks the
records; the views (``aiolock.cli.demo_view``) show the ticks.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from aiolock.cli.demo_config import TICK, Config, Record

__all__ = ["COUNT_TIMEOUT", "worker_entry"]

# How long a worker that has finished keeps its connections open for the
# parent to count them, should the parent never say it has (it always does).
COUNT_TIMEOUT = 60.0


@dataclass(slots=True)
class _WorkerStats:
    waiting: int = 0
    acquisitions: int = 0
    overlaps: int = 0  # the occupancy counter saw another holder
    token_regressions: int = 0  # a token not above the last one written under the lock
    lost: int = 0
    errors: list[str] = field(default_factory=list)


def worker_entry(cfg: Config, wid: int, out: Any, go: Any, start_at: Any, counted: Any) -> None:
    """The body of one worker process (spawned: a fresh interpreter)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    try:
        factory: Callable[[], asyncio.AbstractEventLoop] | None = None
        if cfg.uvloop:
            import uvloop

            factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_worker(cfg, wid, out, go, start_at, counted))
    except BaseException:
        out.put(("error", wid, traceback.format_exc()))


async def _worker(cfg: Config, wid: int, out: Any, go: Any, start_at: Any, counted: Any) -> None:
    from aiolock import Client, LockLostError, LockTimeoutError

    loop = asyncio.get_running_loop()
    stats = _WorkerStats()
    records: list[Record] = []
    data: aioredis.Redis | aioredis.RedisCluster = (
        aioredis.RedisCluster.from_url(cfg.url, client_name=f"{cfg.prefix}-data")
        if cfg.cluster
        else aioredis.Redis.from_url(cfg.url, client_name=f"{cfg.prefix}-data")
    )
    # The same call on a cluster node: the Client sees it is one and runs in cluster mode.
    client = Client.from_url(cfg.url, prefix=cfg.prefix)
    try:
        locks = [client.lock(cfg.lock_name(i)) for i in range(cfg.locks)]
        # Connect everything before the start, so the clock measures locking only.
        await data.ping()
        await locks[0].is_locked()
        out.put(("ready", wid, f"aiolock:{client.id[:12]}"))
        await loop.run_in_executor(None, go.wait)
        deadline = start_at.value + int(cfg.duration * 1e9)

        async def critical(i: int, token: int, waited: int, entered: int) -> None:
            counter, occupancy, last = (cfg.data_key(i, k) for k in ("counter", "occ", "token"))
            async with data.pipeline(transaction=False) as pipe:
                pipe.incr(occupancy)
                pipe.get(counter)
                pipe.get(last)
                occupants, value, last_token = await pipe.execute()
            if occupants != 1:
                stats.overlaps += 1
            if last_token is not None and int(last_token) >= token:
                stats.token_regressions += 1
            await asyncio.sleep(0)  # the race: other tasks run between read and write
            async with data.pipeline(transaction=False) as pipe:
                pipe.set(counter, int(value or 0) + 1)
                pipe.set(last, token)
                pipe.decr(occupancy)
                _, _, left = await pipe.execute()
            if left != 0:
                stats.overlaps += 1
            records.append((i, token, waited, entered, time.monotonic_ns()))
            stats.acquisitions += 1

        async def task_loop(tid: int) -> None:
            rng = random.Random(wid * 1_000_003 + tid)
            while True:
                now = time.monotonic_ns()
                if now >= deadline:
                    return
                i = rng.randrange(cfg.locks)
                stats.waiting += 1
                waiting = True
                try:
                    if cfg.use_lock:
                        async with locks[i](timeout=(deadline - now) / 1e9) as lease:
                            entered = time.monotonic_ns()
                            stats.waiting -= 1
                            waiting = False
                            await critical(i, lease.fencing_token, now, entered)
                    else:
                        token = int(await data.incr(cfg.data_key(i, "tokens")))
                        entered = time.monotonic_ns()
                        stats.waiting -= 1
                        waiting = False
                        await critical(i, token, now, entered)
                except LockTimeoutError:
                    return  # the run is over
                except LockLostError:
                    stats.lost += 1
                except Exception as exc:
                    stats.errors.append(f"task {tid}: {exc!r}")
                    if len(stats.errors) > 20:
                        return
                finally:
                    if waiting:
                        stats.waiting -= 1

        def report(final: bool = False) -> None:
            batch = records[:]
            records.clear()
            s = client.statistics()
            snapshot = {
                "acquisitions": stats.acquisitions,
                "waiting": stats.waiting,
                "client_waiting": s.waiting,
                "holds": s.holds,
                "in_flight": s.in_flight,
                "subscriptions": s.subscriptions,
                "background": s.background,
                "at": time.monotonic_ns(),
            }
            out.put(("tick", wid, snapshot, batch))
            if final:
                out.put(
                    (
                        "done",
                        wid,
                        {
                            "overlaps": stats.overlaps,
                            "token_regressions": stats.token_regressions,
                            "lost": stats.lost,
                            "errors": stats.errors,
                            "holds": s.holds,
                            "client_waiting": s.waiting,
                        },
                    )
                )

        tasks = [asyncio.create_task(task_loop(t)) for t in range(cfg.tasks)]
        done = asyncio.ensure_future(asyncio.gather(*tasks))
        while not done.done():
            await asyncio.wait([done], timeout=TICK)
            report()
        await done
        # Let releases and clean-ups that are still on the wire settle.
        for _ in range(100):
            if client.statistics().background == 0:
                break
            await asyncio.sleep(0.01)
        report(final=True)
        # Keep every connection open until the parent has counted them: once all
        # workers said "done", its count is exact however late the parent runs.
        await loop.run_in_executor(None, counted.wait, COUNT_TIMEOUT)
    finally:
        await client.aclose()
        await data.aclose()
