"""Singleflight under a stampede: 1,000 concurrent callers in 4 processes, one run.

    python -m benchmarks.singleflight [--processes 4] [--callers 1000] [--work 0.2]
                                      [--url redis://...] [--json]

Starts its own redis-server on a free port (unless ``--url``), then
``--processes`` worker processes, each with one Client. Once every worker is
connected and warmed up (its scripts loaded, its listener connected), the
server's command statistics are reset and every worker starts its share of
the callers at once, all of one name; the function sleeps ``--work`` seconds
(so that every call overlaps the run) and returns a small dict.

Reported: how many times the function ran (1 is the point), the Redis
commands the library sent (``INFO commandstats`` delta, the harness' own
commands excluded) in all and per call, the round trips per call (counted in
each worker: a batch of socket writes on one connection before its next read
is one round trip; pub/sub included), and the wall time from "go" to the last
caller's return.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NAME = "bench:stampede"


# -- in a worker process ---------------------------------------------------------------------


async def _worker(url: str, callers: int, work: float) -> dict[str, Any]:
    import asyncio.selector_events as se

    counting = False
    round_trips = 0
    last: dict[int, str] = {}
    transport: Any = se._SelectorSocketTransport  # type: ignore[attr-defined]
    write, ready = transport.write, transport._read_ready

    def counted_write(self: Any, data: Any) -> None:
        nonlocal round_trips
        if counting and last.get(id(self)) != "w":
            round_trips += 1
        last[id(self)] = "w"
        write(self, data)

    def counted_ready(self: Any) -> None:
        last[id(self)] = "r"
        ready(self)

    transport.write = counted_write
    transport._read_ready = counted_ready

    import aiolock

    runs = 0

    async def fn() -> dict[str, int]:
        nonlocal runs
        runs += 1
        await asyncio.sleep(work)
        return {"answer": 42}

    async with aiolock.Client.from_url(url) as client:
        # Warm up: connected, scripts loaded, the listener subscribed once.
        async def warm() -> int:
            return 0

        await client.singleflight("bench:warm").run(warm)
        sf = client.singleflight(NAME)
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # "go"
        counting = True
        began = time.perf_counter()
        results = await asyncio.gather(*(sf.run(fn) for _ in range(callers)))
        elapsed = time.perf_counter() - began
        counting = False
        assert all(r == {"answer": 42} for r in results)
        report = {"runs": runs, "calls": callers, "round_trips": round_trips, "wall_s": elapsed}
        print(json.dumps(report), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # "close": counted already
    return report


# -- the driver ------------------------------------------------------------------------------


def _commandstats(admin: Any) -> dict[str, int]:
    from benchmarks._admin import ADMIN_COMMANDS

    stats = admin.info("commandstats")
    out: dict[str, int] = {}
    for key, value in stats.items():
        command = key.removeprefix("cmdstat_")
        if command not in ADMIN_COMMANDS:
            out[command] = int(value["calls"])
    return out


def _measure(url: str, processes: int, callers: int, work: float) -> dict[str, Any]:
    from benchmarks._admin import admin_client

    share = [callers // processes + (i < callers % processes) for i in range(processes)]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.singleflight",
                "--worker",
                url,
                "--callers",
                str(n),
                "--work",
                str(work),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in share
    ]
    try:
        for proc in workers:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a worker did not start: {line!r}")
        with admin_client(url) as admin:
            admin.delete(f"aiolock:{{{NAME}}}:sf:res")
            admin.config_resetstat()
            began = time.perf_counter()
            for proc in workers:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            reports = []
            for proc in workers:
                assert proc.stdout is not None
                reports.append(json.loads(proc.stdout.readline()))
            wall = time.perf_counter() - began
            commands = _commandstats(admin)
        for proc in workers:
            proc.communicate("close\n", timeout=60)
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
    total = sum(commands.values())
    calls = sum(r["calls"] for r in reports)
    return {
        "processes": processes,
        "calls": calls,
        "runs": sum(r["runs"] for r in reports),
        "commands": commands,
        "commands_total": total,
        "commands_per_call": round(total / calls, 4),
        "round_trips_total": sum(r["round_trips"] for r in reports),
        "round_trips_per_call": round(sum(r["round_trips"] for r in reports) / calls, 4),
        "wall_s": round(wall, 3),
        "slowest_worker_s": round(max(r["wall_s"] for r in reports), 3),
        "work_s": work,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--callers", type=int, default=1000, help="in all processes")
    parser.add_argument("--work", type=float, default=0.2, help="seconds the function takes")
    parser.add_argument("--url", help="an existing server (default: start one)")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_worker(args.worker, args.callers, args.work))
        return

    sys.path.insert(0, str(ROOT))
    server = None
    url = args.url
    if url is None:
        from benchmarks._server import Server

        server = Server()
        server.start()
        url = server.url
    try:
        result = _measure(url, args.processes, args.callers, args.work)
    finally:
        if server is not None:
            server.cleanup()
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(
        f"{result['calls']} callers in {result['processes']} processes, one name, "
        f"a function of {result['work_s']} s:"
    )
    print(f"  function runs:          {result['runs']}")
    print(
        f"  Redis commands:         {result['commands_total']} "
        f"({result['commands_per_call']} per call): {result['commands']}"
    )
    print(
        f"  round trips:            {result['round_trips_total']} "
        f"({result['round_trips_per_call']} per call)"
    )
    print(
        f"  wall time:              {result['wall_s']} s "
        f"(slowest process {result['slowest_worker_s']} s)"
    )


if __name__ == "__main__":
    main()
