"""Quick latency check of ``replicas=1``: p50 of acquire + release, one task,
on a healthy master + replica (tests/replication_servers.py), with and
without replica acknowledgement. Not the benchmark suite: a sanity figure.

    PYTHONPATH=. python tools/replicas_p50.py [redis|valkey] [rounds] [--direct]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from aiolock import Client
from tests.replication_servers import ReplicatedPair


async def measure(url: str, rounds: int, **options: object) -> list[float]:
    async with Client.from_url(url, **options) as client:  # type: ignore[arg-type]
        lock = client.lock("p50")
        for _ in range(200):  # warm up
            await (await lock.acquire()).release()
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            lease = await lock.acquire()
            await lease.release()
            times.append(time.perf_counter() - start)
        return times


def pct(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))] * 1000


async def main(kind: str, rounds: int, direct: bool) -> None:
    with ReplicatedPair(kind) as pair:  # type: ignore[arg-type]
        if direct:
            # Straight to the master, not through the proxy (whose thread
            # shares this process' GIL with the Client being measured).
            pair.replica.execute("REPLICAOF", "127.0.0.1", pair.master.port)
            pair.wait_in_sync()
        for attempt in range(3):  # interleaved, so a noisy moment hits both
            plain = await measure(pair.master.url, rounds)
            acked = await measure(pair.master.url, rounds, replicas=1, replica_timeout=1.0)
            p_plain, p_acked = statistics.median(plain) * 1000, statistics.median(acked) * 1000
            print(
                f"{kind} {'direct' if direct else 'via proxy'} run {attempt}: acquire+release "
                f"p50 {p_plain:.3f} ms (replicas=0), "
                f"{p_acked:.3f} ms (replicas=1), ratio {p_acked / p_plain:.2f}; "
                f"p90 {pct(plain, 0.9):.3f} / {pct(acked, 0.9):.3f} ms"
            )


if __name__ == "__main__":
    kind = sys.argv[1] if len(sys.argv) > 1 else "redis"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 2000
    asyncio.run(main(kind, rounds, "--direct" in sys.argv))
