"""Measure Sentinel failover as a Client sees it: SIGKILL of the master to the
first acquire that succeeds, against the suite's Sentinel set
(tests/sentinel_servers.py: 1 master, 2 replicas, 3 Sentinels,
down-after-milliseconds 2000).

    PYTHONPATH=. python tools/sentinel_failover_time.py [redis|valkey] [runs]

Prints, per run, the time to the first acquire and the time to the switch
(every Sentinel names the new master, and it answers ROLE master), then the
median, min and max.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import time

from aiolock import Client, ConnectionFailedError
from tests.sentinel_servers import SERVICE, SentinelSet


async def one_run(s: SentinelSet) -> tuple[float, float]:
    async with Client.from_sentinel(
        s.sentinel_addresses, SERVICE, prefix="m", lease=3.0, command_timeout=2.0
    ) as client:
        lock = client.lock("warm")
        await lock.acquire()
        await lock.release()
        old = await asyncio.to_thread(s.kill_master)
        killed = time.monotonic()
        switch = asyncio.create_task(asyncio.to_thread(s.wait_for_switch, old))
        fresh = client.lock("fresh")
        while True:
            try:
                lease = await fresh.try_acquire(wait=1.0)
            except ConnectionFailedError:
                lease = None
            if lease is not None:
                took = time.monotonic() - killed
                await lease.release()
                break
            await asyncio.sleep(0.02)
        await switch
        return took, s.switch_times[-1]


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    kind = sys.argv[1] if len(sys.argv) > 1 else "redis"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    with SentinelSet(kind) as s:  # type: ignore[arg-type]
        results = []
        for _ in range(runs):
            results.append(asyncio.run(one_run(s)))
            s.heal()
    acquired = [a for a, _ in results]
    switched = [b for _, b in results]
    for name, values in (("kill -> first acquire", acquired), ("kill -> switch", switched)):
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(
            f"{kind} {name}: [{shown}] s; median {statistics.median(values):.2f}, "
            f"min {min(values):.2f}, max {max(values):.2f}"
        )


if __name__ == "__main__":
    main()
