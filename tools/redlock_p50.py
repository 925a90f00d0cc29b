"""Quick p50 of acquire + release over 3 local masters: aiolock's Redlock, aioredlock,
pottery's AIORedlock (the last two if installed). Not the benchmark suite.

    PYTHONPATH=. python tools/redlock_p50.py [redis|valkey] [rounds]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import warnings
from collections.abc import Awaitable, Callable

import aiolock
from tests.servers import ServerProcess, binary_for

WARMUP = 200


async def measure(one: Callable[[], Awaitable[None]], rounds: int) -> tuple[float, float]:
    times = []
    for i in range(rounds + WARMUP):
        start = time.perf_counter()
        await one()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times) * 1000, times[int(len(times) * 0.99)] * 1000


async def main(urls: list[str], rounds: int) -> None:
    clients = [aiolock.Client.from_url(url) for url in urls]
    lock = aiolock.Redlock(clients).lock("p50")

    async def aiolock_once() -> None:
        lease = await lock.acquire()
        await lease.release()

    print("aiolock Redlock     p50 %.3f ms  p99 %.3f ms" % await measure(aiolock_once, rounds))
    for client in clients:
        await client.aclose()
    try:
        from aioredlock import Aioredlock  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        manager = Aioredlock(urls)

        async def aioredlock_once() -> None:
            held = await manager.lock("p50-aioredlock", lock_timeout=30)
            await manager.unlock(held)

        figures = await measure(aioredlock_once, rounds)
        print("aioredlock          p50 {:.3f} ms  p99 {:.3f} ms".format(*figures))
        await manager.destroy()
    try:
        import redis.asyncio as aioredis
        from pottery import AIORedlock  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        masters = {aioredis.from_url(url) for url in urls}
        plock = AIORedlock(key="p50-pottery", masters=masters, auto_release_time=30)

        async def pottery_once() -> None:
            await plock.acquire()
            await plock.release()

        figures = await measure(pottery_once, rounds)
        print("pottery AIORedlock  p50 {:.3f} ms  p99 {:.3f} ms".format(*figures))
        for master in masters:
            await master.aclose()


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    kind = sys.argv[1] if len(sys.argv) > 1 else "redis"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    servers = [ServerProcess(kind, binary_for(kind)) for _ in range(3)]  # type: ignore[arg-type]
    for server in servers:
        server.start()
    try:
        asyncio.run(main([s.url for s in servers], rounds))
    finally:
        for server in servers:
            server.stop()
