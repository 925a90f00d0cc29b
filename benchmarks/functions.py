"""FCALL against EVALSHA: the cost of ``scripting="functions"`` (issue 23).

    python -m benchmarks.functions [--rounds 6] [--cycles 2000] [--tasks 50] [--seconds 2]

Starts its own redis-server on a free port (``AIOLOCK_BENCH_SERVER`` picks
another binary) and runs, in rounds, the two modes one after the other
(their order alternating round by round, so a drift of the machine's load
falls on both):

* ``p50``: one task, uncontended ``async with client.lock(name)`` cycles
  (acquire + release, one name), the median of ``--cycles`` cycles, in µs;
* ``throughput``: ``--tasks`` tasks, each cycling its own lock (uncontended,
  pipelined on the Client's one connection) for ``--seconds``, in cycles/s;
* ``server µs/call``: the server's own time per script call (INFO
  commandstats ``usec_per_call`` of EVALSHA or FCALL over the measured part),
  the figure the machine's load disturbs least.

Each round makes a fresh Client per mode, warms it up (the script or the
library loaded), then measures. Printed: per mode the median over rounds of
each figure and its spread (min-max), and the ratios FCALL / EVALSHA.
Compare the ratios, never absolute figures across runs or machines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from aiolock import Client
from benchmarks._server import Server

MODES = ("eval", "functions")


async def _p50(client: Client, cycles: int) -> float:
    lock = client.lock("bench:p50")
    took: list[float] = []
    for _ in range(cycles):
        start = time.perf_counter()
        async with lock:
            pass
        took.append(time.perf_counter() - start)
    return statistics.median(took) * 1e6


async def _throughput(client: Client, tasks: int, seconds: float) -> float:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    done = [0] * tasks

    async def cycle(i: int) -> None:
        lock = client.lock(f"bench:t{i}")
        while loop.time() < end:
            async with lock:
                pass
            done[i] += 1

    start = loop.time()
    await asyncio.gather(*(cycle(i) for i in range(tasks)))
    return sum(done) / (loop.time() - start)


async def _round(server: Server, mode: Any, args: argparse.Namespace) -> tuple[float, float, float]:
    async with Client.from_url(server.url, scripting=mode, cluster=False) as client:
        await _p50(client, 200)  # warm-up: loaded, connected
        await _throughput(client, args.tasks, 0.2)
        with server.admin() as admin:
            admin.config_resetstat()
        p50 = await _p50(client, args.cycles)
        tput = await _throughput(client, args.tasks, args.seconds)
        with server.admin() as admin:
            stats: dict[str, Any] = admin.info("commandstats")
        command = "cmdstat_fcall" if mode == "functions" else "cmdstat_evalsha"
        return p50, tput, float(stats[command]["usec_per_call"])


def _fmt(values: list[float], unit: str) -> str:
    return f"{statistics.median(values):,.0f} {unit} ({min(values):,.0f}-{max(values):,.0f})"


async def _main(args: argparse.Namespace) -> None:
    server = Server()
    server.start()
    try:
        p50: dict[str, list[float]] = {m: [] for m in MODES}
        tput: dict[str, list[float]] = {m: [] for m in MODES}
        usec: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                a, b, c = await _round(server, mode, args)
                p50[mode].append(a)
                tput[mode].append(b)
                usec[mode].append(c)
                print(
                    f"round {r + 1} {mode:9}  p50 {a:7.1f} µs  {b:9,.0f} cycles/s  "
                    f"server {c:5.2f} µs/call",
                    flush=True,
                )
        version = server.info().get("redis_version", "?")
        print()
        print(
            f"redis-server {version}, {args.rounds} rounds, {args.cycles} cycles (p50), "
            f"{args.tasks} tasks x {args.seconds:g} s (throughput); median (min-max)"
        )
        print()
        print("| mode | acquire+release p50 | throughput | server µs/call |")
        print("|---|---:|---:|---:|")
        for mode, name in zip(MODES, ("EVALSHA", "FCALL"), strict=True):
            print(
                f"| {name} | {_fmt(p50[mode], 'µs')} | {_fmt(tput[mode], '/s')} | "
                f"{statistics.median(usec[mode]):.2f} ({min(usec[mode]):.2f}-"
                f"{max(usec[mode]):.2f}) |"
            )
        ratios = [
            statistics.median(figure["functions"]) / statistics.median(figure["eval"])
            for figure in (p50, tput, usec)
        ]
        print("| FCALL / EVALSHA | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    finally:
        server.stop()
        server.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=2.0)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
