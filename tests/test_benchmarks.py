"""The benchmark command runs end to end on a tiny configuration.

This is not a timed test: it checks that ``python -m benchmarks --quick``
starts its own server, the failover section's servers (a master + replica,
3 masters, and the loss runs' pair through a stalling proxy) and its own local
Redis Cluster (3 masters + 3 replicas; the Valkey cluster is left out here to
keep the suite quick), runs every scenario, exits 0 and writes RESULTS.md with
every section. The numbers
of a quick run mean nothing, and no target is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SECTIONS = (
    "# aiolock benchmark results",
    "## Targets (issue 5)",
    "## Floor: the physical limit of one task",
    "## Uncontended acquire + release",
    "## Handoff:",
    "### in-process",
    "### cross-process",
    "## Contended throughput",
    "## Scale:",
    "## Watchdog:",
    "## Failover (issue 12):",
    "### Failover targets (issue 12)",
    "### The cost of `replicas=1`",
    "### Redlock over 3 independent masters",
    "### Failover loss table",
    "## Cluster (issue 11): a local 3 + 3 cluster beside the standalone server",
    "### Cluster targets (issue 11)",
    "### Cluster against standalone",
    "### Watchdog in a cluster",
    "### Failover: a master's SIGKILL",
    "## How it is measured",
)


def _server_binary() -> str | None:
    return os.environ.get("AIOLOCK_BENCH_SERVER") or shutil.which("redis-server")


@pytest.mark.timeout(240)
def test_quick_benchmark_writes_results(tmp_path: Path) -> None:
    if _server_binary() is None:
        pytest.skip("redis-server not on PATH (and AIOLOCK_BENCH_SERVER not set)")
    # Peers are optional (the `bench` extra): whatever is missing is reported
    # "unavailable" by the command itself. Two peers at most keep this quick.
    libs = ["aiolock", "asyncio.Lock"]
    if importlib.util.find_spec("redis.asyncio") is not None:
        libs.append("redis-py")
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path),
           "--libs", ",".join(libs), "--cluster-servers", "redis"]  # fmt: skip
    if importlib.util.find_spec("matplotlib") is None:
        cmd.append("--no-plots")
    # Every temporary directory the command makes (its server's, the worker
    # logs it keeps for inspection) goes under tmp_path, and is removed here:
    # nothing is left in the system's /tmp.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=230, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        left = sorted(p.name for p in tmp.iterdir())
        assert [name.rsplit("-", 1)[0] for name in left] == ["aiolock-bench-logs"], left
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results = (tmp_path / "RESULTS.md").read_text()
    for section in SECTIONS:
        assert section in results, f"missing {section!r} in RESULTS.md:\n{results[:3000]}"
    # Every scenario produced aiolock figures (a section is only written when it has data).
    assert "| aiolock |" in results
    # The cluster section measured aiolock on the cluster beside the standalone server, and
    # the failover cell ran: the cluster's own failover time is there (aiolock's may not be).
    cluster = results[results.index("## Cluster (issue 11)") :]
    assert "Redis Cluster: uncontended acquire+release p50 / standalone p50" in cluster
    assert "| uncontended acquire+release p50 (µs) | aiolock |" in cluster
    summary = json.loads((tmp_path / "summary.json").read_text())
    # The history checker proved every contended aiolock run: its holds,
    # merged across the worker processes, never overlapped, tokens in order.
    proved = [
        entry["history_violations"]
        for variant in summary["throughput"].values()
        for entry in variant.get("aiolock", {}).values()
    ]
    assert proved and all(v == 0 for v in proved), proved
    fo = summary["cluster"]["failover"]["redis"]
    assert isinstance(fo["write_ok_s"], float), fo
    # The failover section compared replicas=1 with replicas=0 on its master + replica, and
    # the loss runs took place: with replicas=0 a lag lasting until the kill lost the lock
    # in every run (the harness can show a double holder); with replicas=1 none was a
    # double holder.
    failover = results[results.index("## Failover (issue 12)") : results.index("## Cluster")]
    assert "| uncontended acquire+release p50 (µs) | asyncio |" in failover
    redlock = failover[failover.index("### Redlock over 3 independent masters") :]
    assert "| aiolock | asyncio |" in redlock
    failed = [e for e in summary["errors"] if e["scenario"].startswith("failover_")]
    assert not failed, failed
    rows = summary["failover"]["loss"]["rows"]
    assert rows["replicas=0"]["failed"] == rows["replicas=1"]["failed"] == 0, rows
    long0 = rows["replicas=0, long lag"]
    assert long0["double"] == long0["runs"] >= 1, rows
    assert rows["replicas=1"]["double"] == 0, rows
    assert (tmp_path / "summary.json").is_file()
    if "--no-plots" not in cmd:
        assert (tmp_path / "throughput.png").is_file()
        assert (tmp_path / "latency.png").is_file()
        assert (tmp_path / "memory.png").is_file()


def test_unknown_library_is_rejected_before_starting() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--libs", "no-such-lib", "--no-plots",
         "--out", "/nonexistent/never-written"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "no-such-lib" in proc.stderr


def test_unknown_cluster_server_is_rejected_before_starting() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--cluster-servers", "memcached",
         "--no-plots", "--out", "/nonexistent/never-written"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "memcached" in proc.stderr


@pytest.mark.timeout(120)
def test_quick_instrumentation_benchmark_writes_results(tmp_path: Path) -> None:
    if _server_binary() is None:
        pytest.skip("redis-server not on PATH (and AIOLOCK_BENCH_SERVER not set)")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.instrumentation", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = (tmp_path / "RESULTS_INSTRUMENTATION.md").read_text()
    assert "# Instrumentation overhead (issue 13)" in results
    assert "**Target: uncontended acquire + release with the SDK's metrics on" in results
    for variant in ("off", "api", "sdk", "sdk+label", "sdk+trace", "debug-log"):
        assert f"\n| {variant} | " in results, results
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS_INSTRUMENTATION.md"]


@pytest.mark.timeout(120)
def test_quick_compare_reports_ratios(tmp_path: Path) -> None:
    """``--compare REF`` runs the work tree and a commit interleaved and reports ratios.

    HEAD against HEAD: every headline figure has a value for both and a ratio
    (the numbers of a quick run mean nothing; no ratio is asserted).
    """
    if _server_binary() is None:
        pytest.skip("redis-server not on PATH (and AIOLOCK_BENCH_SERVER not set)")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-m", "benchmarks", "--compare", "HEAD", "--quick",
           "--out", str(tmp_path)]  # fmt: skip
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # The exported commit is removed; only the worker logs stay (as in a full run).
        left = sorted(p.name for p in tmp.iterdir())
        assert [name.rsplit("-", 1)[0] for name in left] == ["aiolock-bench-logs"], left
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["labels"] == ["work tree", "HEAD"]
    assert data["errors"] == []
    rows = {row["key"]: row for row in data["summary"]["rows"]}
    for key in ("t10_acq_s", "t100_acq_s", "t1000_acq_s", "t10_share", "t100_share",
                "t1000_share", "handoff_p50_us", "uncontended_p50_us",
                "memory_per_waiter_kib", "requests_per_acq", "inner_per_acq"):  # fmt: skip
        assert len(rows[key]["values"]["work tree"]) == 1, key
        assert len(rows[key]["ratios"]["HEAD"]) == 1, key
        assert rows[key]["ratios"]["HEAD"][0] > 0, key
    text = (tmp_path / "COMPARE.md").read_text()
    assert "| figure | work tree | HEAD | HEAD / work tree |" in text
