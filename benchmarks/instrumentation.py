"""What instrumentation costs: uncontended acquire + release with and without it.

``python -m benchmarks.instrumentation`` starts a private redis-server and,
in one process on one event loop, runs the same uncontended acquire +
release of one lock through one Client per variant:

* ``off``: ``Client(telemetry=False)``: the Observer's counters only (the
  default without opentelemetry-api; DEBUG logging off, as by default);
* ``api``: opentelemetry-api, no SDK configured: the API's no-op proxies;
* ``sdk``: an SDK ``MeterProvider`` with a reader: every metric recorded;
* ``sdk+label``: the same with a ``lock_label`` function;
* ``sdk+trace``: the SDK's meters and tracer, every acquisition inside a
  current span (an uncontended acquisition makes no span of its own: this
  prices the check);
* ``debug-log``: ``off`` with the ``aiolock`` loggers at DEBUG into a
  handler that drops the records (what turning the trace on costs).

The variants run in rounds, interleaved, their order rotated every round,
so that drift hits them alike. Each round gives each variant's p50 and its
throughput; the report gives the medians over rounds and, per round, the
ratio to ``off`` (median over rounds): the target is ``sdk`` at most 5 %
slower than ``off``. A micro-benchmark without I/O then times what the
telemetry does per acquire + release cycle alone (``acquired`` + a hold's
begin and end).

The global providers are never set: the SDK variants hand their providers
to ``OtelTelemetry`` directly, which is the path a global SDK provider set
before the Client takes too. Writes ``RESULTS_INSTRUMENTATION.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks._server import Server

HERE = Path(__file__).resolve().parent
TARGET = 1.05
VARIANTS = ("off", "api", "sdk", "sdk+label", "sdk+trace", "debug-log")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _label(name: str) -> str | None:
    return name.partition(":")[0] or None


class Variant:
    def __init__(self, name: str, client: Any, span: Callable[[], Any] | None) -> None:
        self.name = name
        self.client = client
        self.lock = client.lock("bench:instrumentation:" + name)
        self.span = span
        self.p50: list[float] = []  # per round, µs
        self.rate: list[float] = []  # per round, cycles/s
        self.cpu: list[float] = []  # per round, this process's CPU µs per cycle


async def cycles(variant: Variant, seconds: float, max_cycles: int) -> tuple[float, float, float]:
    """Acquire + release for ``seconds``: (p50 µs, cycles per second, CPU µs per cycle)."""
    lock = variant.lock
    samples: list[int] = []
    clock = time.perf_counter_ns
    cpu = time.process_time_ns()
    began = clock()
    end = began + int(seconds * 1e9)
    while len(samples) < max_cycles:
        t0 = clock()
        lease = await lock.acquire()
        await lease.release()
        t1 = clock()
        samples.append(t1 - t0)
        if t1 >= end:
            break
    elapsed = clock() - began
    cpu_us = (time.process_time_ns() - cpu) / 1000.0 / len(samples)
    return statistics.median(samples) / 1000.0, len(samples) / (elapsed / 1e9), cpu_us


async def run_round(variant: Variant, seconds: float, max_cycles: int) -> None:
    if variant.span is None:
        p50, rate, cpu = await cycles(variant, seconds, max_cycles)
    else:
        with variant.span():
            p50, rate, cpu = await cycles(variant, seconds, max_cycles)
    variant.p50.append(p50)
    variant.rate.append(rate)
    variant.cpu.append(cpu)


def micro(telemetry: Any, n: int) -> float:
    """ns per acquire + release cycle of the telemetry calls alone."""
    t0 = time.perf_counter_ns()
    for _ in range(n):
        telemetry.acquired("lock", "order:1", "acquired", 0.0001, False)
        telemetry.held("lock", "order:1", 1, 0.0)
        telemetry.held("lock", "order:1", -1, 0.0001)
    return (time.perf_counter_ns() - t0) / n


async def measure(url: str, rounds: int, seconds: float, max_cycles: int) -> dict[str, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import aiolock
    from aiolock._core.observe.otel import OtelTelemetry

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracers.get_tracer("bench")

    def telemetry(label: Any = None, traced: bool = False) -> OtelTelemetry:
        return OtelTelemetry(
            label, meter_provider=meters, tracer_provider=tracers if traced else None
        )

    made: dict[str, Any] = {
        "off": aiolock.Client.from_url(url, telemetry=False),
        "api": aiolock.Client.from_url(url),  # the global providers: never set here
        "sdk": aiolock.Client.from_url(url),
        "sdk+label": aiolock.Client.from_url(url),
        "sdk+trace": aiolock.Client.from_url(url),
        "debug-log": aiolock.Client.from_url(url, telemetry=False),
    }
    made["sdk"]._engine.observer.telemetry = telemetry()
    made["sdk+label"]._engine.observer.telemetry = telemetry(_label)
    made["sdk+trace"]._engine.observer.telemetry = telemetry(traced=True)

    aiolock_log = logging.getLogger("aiolock")
    debug_handler = logging.NullHandler()

    def span() -> Any:
        return tracer.start_as_current_span("request")

    variants = [
        Variant(name, made[name], span if name == "sdk+trace" else None) for name in VARIANTS
    ]
    for client in made.values():
        await client.__aenter__()
    try:
        for variant in variants:  # warm up: connections, scripts
            await cycles(variant, 0.2, 200)
        for rnd in range(rounds):
            shift = rnd % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                debug = variant.name == "debug-log"
                if debug:
                    aiolock_log.addHandler(debug_handler)
                    aiolock_log.setLevel(logging.DEBUG)
                try:
                    await run_round(variant, seconds, max_cycles)
                finally:
                    if debug:
                        aiolock_log.setLevel(logging.NOTSET)
                        aiolock_log.removeHandler(debug_handler)
    finally:
        for client in reversed(made.values()):
            await client.aclose()

    n = 20_000 if max_cycles > 1000 else 200
    micro_ns = {
        "api": micro(made["api"]._engine.observer.telemetry, n),
        "sdk": micro(telemetry(), n),
        "sdk+label": micro(telemetry(_label), n),
    }
    # DEBUG off (the default): what observe/observer.py pays per cycle is two isEnabledFor checks.
    lock_log = logging.getLogger("aiolock.lock")
    t0 = time.perf_counter_ns()
    for _ in range(n):
        lock_log.isEnabledFor(logging.DEBUG)
        lock_log.isEnabledFor(logging.DEBUG)
    micro_ns["off"] = (time.perf_counter_ns() - t0) / n
    assert reader.get_metrics_data() is not None
    base = variants[0]
    results: dict[str, Any] = {}
    for variant in variants:
        results[variant.name] = {
            "p50_us": statistics.median(variant.p50),
            "rate": statistics.median(variant.rate),
            "p50_ratio": statistics.median(
                v / b for v, b in zip(variant.p50, base.p50, strict=True)
            ),
            "rate_ratio": statistics.median(
                b / v for v, b in zip(variant.rate, base.rate, strict=True)
            ),
            "cpu_us": statistics.median(variant.cpu),
            "cpu_ratio": statistics.median(
                v / b for v, b in zip(variant.cpu, base.cpu, strict=True)
            ),
            "micro_ns": micro_ns.get(variant.name),
        }
    return results


def report(results: dict[str, Any], args: argparse.Namespace, server: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    sdk = results["sdk"]
    slower = max(sdk["p50_ratio"], sdk["rate_ratio"])
    met = "met" if slower <= TARGET else "NOT met"
    lines = [
        "# Instrumentation overhead (issue 13)",
        "",
        f"`python -m benchmarks.instrumentation{' --quick' if args.quick else ''}`, {now}: "
        f"{_cpu()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()} (asyncio), {server}, "
        f"opentelemetry-api/sdk {version('opentelemetry-api')}/{version('opentelemetry-sdk')}. "
        f"{args.rounds} rounds of {args.seconds} s per variant, interleaved, order rotated.",
        "",
        f"**Target: uncontended acquire + release with the SDK's metrics on at most 5 % slower "
        f"than without: {met}** (sdk: {100 * (sdk['p50_ratio'] - 1):+.1f} % p50, "
        f"{100 * (sdk['rate_ratio'] - 1):+.1f} % time per cycle from throughput).",
        "",
        "| variant | p50 µs | cycles/s | p50 vs off | time/cycle vs off "
        "| CPU µs/cycle | CPU vs off | telemetry ns/cycle |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        micro_ns = "" if r["micro_ns"] is None else f"{r['micro_ns']:,.0f}"
        lines.append(
            f"| {name} | {r['p50_us']:.1f} | {r['rate']:,.0f} | {r['p50_ratio']:.3f} | "
            f"{r['rate_ratio']:.3f} | {r['cpu_us']:.1f} | {r['cpu_ratio']:.3f} | {micro_ns} |"
        )
    off = results["off"]
    lines += [
        "",
        f"DEBUG logging off (the default, all variants but `debug-log`) costs two "
        f"`isEnabledFor` checks per cycle: {off['micro_ns']:,.0f} ns, "
        f"{off['micro_ns'] / 10 / off['cpu_us']:.2f} % of `off`'s CPU per cycle.",
        "",
        "Ratios are the median over rounds of each round's ratio to `off` (p50: higher is "
        "slower; time/cycle: `off`'s throughput over the variant's; CPU: the benchmark "
        "process's CPU time per cycle, the server's not included). The last column "
        "times the telemetry's calls for one cycle (`acquired`, a hold's begin and end) "
        "without I/O, in a loop (for `off`: the two DEBUG checks).",
        "",
        "* `off`: `Client(telemetry=False)`, DEBUG logging off (the default): only the "
        "Observer's counters; the same as without opentelemetry-api installed.",
        "* `api`: opentelemetry-api without an SDK: the API's no-op proxy instruments.",
        "* `sdk`: an SDK `MeterProvider` with an in-memory reader: all six instruments record.",
        "* `sdk+label`: the same with `lock_label` (a `str.partition`).",
        "* `sdk+trace`: SDK metrics and tracer, each cycle inside a current span (an "
        "uncontended acquisition makes no span).",
        "* `debug-log`: `telemetry=False`, the `aiolock` loggers at DEBUG into a "
        "`NullHandler` (two records formatted per cycle): what the trace costs when on.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.instrumentation", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="a tiny run (for tests)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=1.0, help="per variant and round")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--server", help="redis-server or valkey-server binary (default: PATH)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 2, 0.05
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = Server(args.server)
    server.start()
    try:
        info = server.info()
        kind = "valkey" if "valkey_version" in info else "redis"
        server_version = info.get("valkey_version") or info.get("redis_version")
        max_cycles = 200 if args.quick else 1_000_000
        results = asyncio.run(measure(server.url, args.rounds, args.seconds, max_cycles))
    finally:
        server.cleanup()
    text = report(results, args, f"{kind}-server {server_version}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "RESULTS_INSTRUMENTATION.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
