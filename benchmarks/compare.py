"""``python -m benchmarks --compare REF [REF ...]``: two (or more) commits interleaved in one run.

Figures from different runs (let alone machines) cannot be compared: a
regression hides as "machine load". This mode benchmarks the work tree (or
``--against REF0``) and each ``REF`` in the same run, on the same private
server, in rounds whose order rotates, with ``asyncio.Lock`` in every round as
the in-run reference. Every headline figure is reported as a ratio to the first
variant, computed within each round, with its spread over the rounds (median,
min-max), and the contended throughputs also as a share of ``asyncio.Lock``
in the same round.

Headline figures: contended throughput with 10, 100 and 1,000 tasks on one
lock in one process (acquisitions/s, and share of ``asyncio.Lock``); in-process
handoff p50 (10 waiters); uncontended acquire + release p50; memory per
waiting task (tracemalloc, a fresh process per measurement, waiters on one
lock held by another Client); Redis requests and commands run inside scripts
per acquisition (from the T=100 cell).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _analysis, _orchestra
from benchmarks._server import Server

#: Sizes of the contended cells (tasks on one lock, one process).
SIZES = (10, 100, 1000)

FULL: dict[str, Any] = {
    "rounds": 5, "loop": "uvloop",
    "uncontended": {"duration": 1.0, "max_samples": 20000, "warmup": 50},
    "handoff": {"tasks": 11, "hold": 0.001, "think": 0.001, "duration": 1.5,
                "max_events": 20000, "grace": 0.5},
    "throughput": {"warmup": 0.25, "duration": 2.0, "grace": 0.0},
    "memory": {"rounds": 2, "waiters": 10000},
}  # fmt: skip

QUICK: dict[str, Any] = {
    "rounds": 1, "loop": "asyncio",
    "uncontended": {"duration": 0.1, "max_samples": 300, "warmup": 5},
    "handoff": {"tasks": 3, "hold": 0.001, "think": 0.001, "duration": 0.2,
                "max_events": 200, "grace": 0.5},
    "throughput": {"warmup": 0.05, "duration": 0.2, "grace": 0.0},
    "memory": {"rounds": 1, "waiters": 20},
}  # fmt: skip

ASYNCIO = "asyncio.Lock"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--compare",
        nargs="+",
        metavar="REF",
        help="interleave aiolock at these git refs with the work tree (or --against) in one "
        "run; report every headline figure as a ratio with its spread (COMPARE.md)",
    )
    ap.add_argument(
        "--against",
        metavar="REF0",
        help="with --compare: the base of the ratios (default: the work tree; "
        "then '.' in --compare names the work tree)",
    )
    ap.add_argument("--rounds", type=int, help="with --compare: rounds (default 5; --quick 1)")
    ap.add_argument(
        "--seconds", type=float, help="with --compare: each throughput window (default 2.0)"
    )
    ap.add_argument(
        "--loop", choices=("uvloop", "asyncio"), help="with --compare: event loop (default uvloop)"
    )
    ap.add_argument(
        "--no-memory", action="store_true", help="with --compare: skip memory per waiting task"
    )


def config(args: argparse.Namespace) -> dict[str, Any]:
    cfg = json.loads(json.dumps(QUICK if args.quick else FULL))
    if args.rounds:
        cfg["rounds"] = args.rounds
    if args.seconds:
        cfg["throughput"]["duration"] = args.seconds
        cfg["handoff"]["duration"] = args.seconds
        cfg["uncontended"]["duration"] = args.seconds / 2
    if args.loop:
        cfg["loop"] = args.loop
    if cfg["loop"] == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            _orchestra.log("uvloop is not installed: asyncio loop")
            cfg["loop"] = "asyncio"
    if args.no_memory:
        cfg["memory"]["rounds"] = 0
    return cfg


async def cell(
    worker: _orchestra.Worker, url: str, admin: Any, scenario: str, lib: str, loop: str,
    params: dict[str, Any], timeout: float = 120.0,
) -> dict[str, Any]:  # fmt: skip
    """One scenario in one worker; its result, or {"error": ...}."""
    admin.flushall()
    if not worker.alive:
        await worker.start()
    spec = {"url": url, "admin_urls": None, "node_urls": None, "cluster": False,
            "scenario": scenario, "lib": lib, "loop": loop, "params": params}  # fmt: skip
    try:
        await worker.send(spec)
        ready = await worker.recv(_orchestra.READY_TIMEOUT)
        if "error" in ready:
            raise RuntimeError(ready["error"])
        await worker.send({"go": True, "start_ns": time.monotonic_ns() + 50_000_000})
        reply = await worker.recv(timeout)
    except (TimeoutError, _orchestra.WorkerDied, RuntimeError, OSError, ValueError) as exc:
        await worker.kill()
        return {"error": ("timed out" if isinstance(exc, TimeoutError) else str(exc))[-1500:]}
    if "error" in reply:
        return {"error": str(reply["error"])[-1500:]}
    result: dict[str, Any] = reply["result"]
    return result


def figures(scenario: str, lib: str, result: dict[str, Any], size: int = 0) -> dict[str, float]:
    """The headline figures of one cell."""
    if "error" in result:
        return {}
    if scenario == "uncontended":
        return {"uncontended_p50_us": _analysis.pct(result["samples_us"], 50)}
    if scenario == "handoff":
        gaps, _same, _n = _analysis.handoffs(result["events"])
        return {"handoff_p50_us": _analysis.pct(gaps, 50)} if gaps else {}
    if scenario == "throughput":
        acqs = sum(result["counts"])
        out = {f"t{size}_acq_s": acqs / result["elapsed_s"]}
        if acqs:
            out[f"t{size}_cpu_us"] = 1e6 * result["client_cpu_s"] / acqs
        if lib == "aiolock" and size == 100:
            per = _analysis.per_acquisition(lib, result["cmdstats"], acqs)
            out["requests_per_acq"] = per["requests_per_acq"]
            out["inner_per_acq"] = per["inner_per_acq"]
            for cmd, v in per["inner_by_command_per_acq"].items():
                out[f"inner_{cmd}_per_acq"] = v
        return out
    if scenario == "scale":
        return {"memory_per_waiter_kib": result["traced_per_waiter"] / 1024}
    return {}


async def execute(
    variants: list[tuple[str, Path]], cfg: dict[str, Any], server_binary: str | None, logdir: Path
) -> dict[str, Any]:
    server = Server(server_binary)
    server.start()
    try:
        return await _execute(variants, cfg, server, logdir)
    finally:
        server.cleanup()


async def _execute(
    variants: list[tuple[str, Path]], cfg: dict[str, Any], server: Server, logdir: Path
) -> dict[str, Any]:
    url = server.url
    admin = _orchestra.Target("standalone", url).admin
    _orchestra.log(f"redis-server {server.info().get('redis_version')} on {url}")
    loop = cfg["loop"]
    workers = {
        label: _orchestra.Worker(f"cmp{i}", logdir, root)
        for i, (label, root) in enumerate(variants)
    }
    workers[ASYNCIO] = _orchestra.Worker("cmp-asyncio", logdir, variants[0][1])
    await asyncio.gather(*(w.start() for w in workers.values()))
    labels = [label for label, _ in variants]
    # rounds[r][label] = {figure: value}
    rounds: list[dict[str, dict[str, float]]] = []
    errors: list[str] = []
    fresh = [0]

    async def one(label: str, scenario: str, params: dict[str, Any], size: int = 0) -> None:
        lib = "asyncio.Lock" if label == ASYNCIO else "aiolock"
        if scenario == "scale":
            fresh[0] += 1
            root = dict(variants)[label]
            worker = _orchestra.Worker(f"cmp-fresh{fresh[0]}", logdir, root)
            await worker.start()
            try:
                result = await cell(worker, url, admin, scenario, lib, loop, params, 300.0)
            finally:
                await worker.close()
        else:
            result = await cell(workers[label], url, admin, scenario, lib, loop, params)
        if "error" in result:
            errors.append(f"{label} {scenario} {size or ''}: {result['error']}")
            _orchestra.log(errors[-1])
        rounds[-1].setdefault(label, {}).update(figures(scenario, lib, result, size))

    t0 = time.monotonic()
    for rnd in range(cfg["rounds"]):
        rounds.append({})
        order = _orchestra.rotate(labels, rnd)
        key = f"cmp:{rnd}"
        for label in order:
            await one(label, "uncontended", {**cfg["uncontended"], "key": f"{key}:u"})
        for label in order:
            await one(label, "handoff", {**cfg["handoff"], "key": f"{key}:h"})
        for size in SIZES:
            for label in _orchestra.rotate([*labels, ASYNCIO], rnd):
                p = {**cfg["throughput"], "tasks": size, "pool": size, "key": f"{key}:t{size}"}
                await one(label, "throughput", p, size)
        if rnd < cfg["memory"]["rounds"]:
            n = cfg["memory"]["waiters"]
            for label in order:
                p = {"names": 1, "waiters_per_name": n, "settle": 0.2, "cap": 60.0,
                     "cancel_cap": 30.0, "drain_cap": 60.0, "leftover_wait": 0.1,
                     "lease": 300.0, "key": f"{key}:m"}  # fmt: skip
                await one(label, "scale", p)
        _orchestra.log(f"round {rnd + 1}/{cfg['rounds']} done ({time.monotonic() - t0:.0f} s)")
    await asyncio.gather(*(w.close() for w in workers.values()))
    admin.close()
    return {"rounds": rounds, "errors": errors, "wall_s": time.monotonic() - t0}


#: (figure key, label, unit, higher is better)
HEADLINE: list[tuple[str, str, str, bool]] = [
    *((f"t{n}_acq_s", f"contended T={n}, acquisitions/s", "/s", True) for n in SIZES),
    *((f"t{n}_share", f"contended T={n}, share of asyncio.Lock", "%", True) for n in SIZES),
    *((f"t{n}_cpu_us", f"contended T={n}, client CPU per acquisition", "µs", False) for n in SIZES),
    ("handoff_p50_us", "in-process handoff p50 (10 waiters)", "µs", False),
    ("uncontended_p50_us", "uncontended acquire + release p50", "µs", False),
    ("memory_per_waiter_kib", "memory per waiting task", "KiB", False),
    ("requests_per_acq", "Redis requests per acquisition (T=100)", "", False),
    ("inner_per_acq", "Redis commands inside scripts per acquisition (T=100)", "", False),
]


def _spread(values: list[float], fmt: str) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "—"
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    labels: list[str] = raw["labels"]
    rounds: list[dict[str, dict[str, float]]] = raw["rounds"]
    for rnd in rounds:
        ref = rnd.get(ASYNCIO, {})
        for label in labels:
            figs = rnd.get(label, {})
            for n in SIZES:
                a, b = figs.get(f"t{n}_acq_s"), ref.get(f"t{n}_acq_s")
                if a is not None and b:
                    figs[f"t{n}_share"] = 100.0 * a / b
    base = labels[0]
    rows: list[dict[str, Any]] = []
    inner_keys = sorted({k for rnd in rounds for f in rnd.values() for k in f
                         if k.startswith("inner_") and k.endswith("_per_acq")
                         and k != "inner_per_acq"})  # fmt: skip
    keys = [*HEADLINE, *((k, f"  of which {k[6:-8].upper()}", "", False) for k in inner_keys)]
    for key, title, unit, higher in keys:
        row: dict[str, Any] = {"key": key, "figure": title, "unit": unit,
                               "higher_is_better": higher, "values": {}, "ratios": {}}  # fmt: skip
        for label in labels:
            vals = [rnd[label][key] for rnd in rounds if key in rnd.get(label, {})]
            row["values"][label] = vals
            ratios = [
                rnd[label][key] / rnd[base][key]
                for rnd in rounds
                if key in rnd.get(label, {}) and rnd.get(base, {}).get(key)
            ]
            row["ratios"][label] = ratios
        rows.append(row)
    return {"labels": labels, "rows": rows}


def markdown(raw: dict[str, Any], summary: dict[str, Any]) -> str:
    labels = summary["labels"]
    base = labels[0]
    n_rounds = len(raw["rounds"])
    lines = [
        "# aiolock: commits compared in one interleaved run",
        "",
        f"Command: `{raw['command']}`. {n_rounds} round(s), order rotated every round, "
        f"loop {raw['config']['loop']}, {raw['config']['throughput']['duration']} s "
        f"throughput windows; one private redis-server; `asyncio.Lock` in every round.",
        "",
        "Variants: " + "; ".join(f"**{lb}** = {raw['sources'][lb]}" for lb in labels) + ".",
        "",
        f"Each cell: the median over rounds (min-max). Ratios are to **{base}**, taken "
        "within each round (same machine, same minute), then summarised; figures from "
        "different runs are never compared.",
        "",
        "| figure | "
        + " | ".join(labels)
        + " | "
        + " | ".join(f"{lb} / {base}" for lb in labels[1:])
        + " |",
        "|---|" + "---|" * (2 * len(labels) - 1),
    ]
    for row in summary["rows"]:
        unit = row["unit"]
        fmt = {"/s": ",.0f", "%": ".1f", "µs": ".1f", "KiB": ".2f"}.get(unit, ".3f")
        cells = [_spread(row["values"][lb], fmt) for lb in labels]
        ratios = [_spread(row["ratios"][lb], ".2f") for lb in labels[1:]]
        title = row["figure"] + (f" ({unit})" if unit and unit != "/s" else "")
        lines.append(f"| {title} | " + " | ".join(cells + ratios) + " |")
    lines += [
        "",
        "Higher is better for acquisitions/s and shares; lower for times, memory and "
        "commands. Memory: tracemalloc per waiting task, a fresh process per measurement, "
        f"{raw['config']['memory']['waiters']} waiters on one lock held by another Client "
        f"({raw['config']['memory']['rounds']} round(s)). Commands inside scripts: INFO "
        "commandstats calls that the client did not send itself.",
    ]
    if raw["errors"]:
        lines += ["", "Errors:", ""] + [f"- {e[:300]}" for e in raw["errors"]]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace, argv: list[str] | None) -> int:
    cfg = config(args)
    exports: list[Path] = []
    variants: list[tuple[str, Path]] = []
    sources: dict[str, str] = {}
    try:
        for ref in [args.against, *args.compare]:
            if ref is None or ref == ".":
                label = "work tree"
                variants.append((label, _orchestra.ROOT))
                sources[label] = _orchestra.describe_source(_orchestra.ROOT, None, None)
                continue
            root, sha = _orchestra.export_aiolock(ref)
            exports.append(root)
            label = ref if ref not in sources else f"{ref}#{len(variants)}"
            variants.append((label, root))
            sources[label] = f"git {ref} = {sha[:12]}"
        logdir = Path(tempfile.mkdtemp(prefix="aiolock-bench-logs-"))
        _orchestra.log(
            f"comparing {', '.join(sources[lb] for lb, _ in variants)}; logs in {logdir}"
        )
        raw = asyncio.run(execute(variants, cfg, args.server, logdir))
    finally:
        for root in exports:
            shutil.rmtree(root, ignore_errors=True)
    raw.update(
        labels=[lb for lb, _ in variants],
        sources=sources,
        config=cfg,
        command="python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    summary = summarise(raw)
    text = markdown(raw, summary)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "COMPARE.md").write_text(text)
    (out / "compare.json").write_text(json.dumps({**raw, "summary": summary}, indent=1))
    print(text)
    _orchestra.log(f"wrote {out / 'COMPARE.md'} in {raw['wall_s']:.0f} s")
    return 1 if raw["errors"] else 0
