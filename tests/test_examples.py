"""Every file in examples/ runs as it stands, and does what its docstring says.

Each example is run as a script (a subprocess, ``REDIS_URL`` pointing at the
test server) and its printed outcome is checked. The two web apps are also
driven in-process, the way a user would test them: FastAPI through httpx's
ASGI transport, aiohttp through its test client, against a real server, with
a second aiolock Client standing for another process of the same service.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import aiolock
from tests.servers import RedisServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RUN_TIMEOUT = 60


def no_keys_without_ttl(server: RedisServer) -> None:
    """The examples clean up or expire what they write: nothing stays for ever."""
    with server.admin_client() as admin:
        forever = [k for k in admin.scan_iter("*") if admin.ttl(k) == -1]
    assert forever == [], forever


def run_example(name: str, url: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        env={**os.environ, "REDIS_URL": url, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out}"
    assert "Traceback" not in out, out
    return proc.stdout


@cache
def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def charges(server: RedisServer, order: int) -> int:
    with server.admin_client() as admin:
        return int(admin.hget(f"shop:order:{order}", "charges") or 0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- as scripts


def test_worker_script_commits_each_job_once_despite_a_lost_lease(
    server: RedisServer, url: str
) -> None:
    out = run_example("worker.py", url, "--workers", "3", "--jobs", "8")
    stalled = int(re.search(r"will hang on job (\d+)", out).group(1))  # type: ignore[union-attr]
    assert re.search(rf"worker-a  job +{stalled}  LOST ", out), out
    done = re.findall(r"job +(\d+)  done ", out)
    assert sorted(map(int, done)) == list(range(1, 9)), out  # every job once, none twice
    assert "committed exactly once each: yes; started 9 times" in out, out
    no_keys_without_ttl(server)


def test_decorator_script(server: RedisServer, url: str) -> None:
    out = run_example("decorator.py", url)
    turns = re.findall(r"(\w+) (builds the report|is done)", out)
    # take turns: each builder finishes before the next one starts
    assert [t[1] for t in turns] == ["builds the report", "is done"] * 3, out
    assert "peek_at_report() gave up after 0.05 s" in out, out
    assert "balances [100, 100]" in out, out
    no_keys_without_ttl(server)


def test_fencing_script_refuses_the_paused_holders_write(url: str) -> None:
    out = run_example("fencing.py", url)
    first = int(re.search(r"client 1: holds the lock, fencing token (\d+)", out).group(1))  # type: ignore[union-attr]
    second = int(re.search(r"client 2: holds the lock .*token (\d+)", out).group(1))  # type: ignore[union-attr]
    assert second > first
    assert f"with token {first} refused: token {second} wrote already" in out, out
    assert "client 1: LockLostError" in out, out
    assert "report.txt holds 'written by client 2'" in out, out


@pytest.mark.parametrize("script", ["fastapi_app.py", "aiohttp_app.py"])
def test_web_app_scripts(url: str, script: str) -> None:
    out = run_example(script, url)
    assert out.count("'status': 'paid'") == 1, out
    assert out.count("'status': 'already paid'") == 9, out
    assert "the card was charged 1 time(s)" in out, out
    assert re.search(r"200 \{'order': \d+, 'status': 'refunded'\}", out), out
    assert re.search(r"409 \{'detail': 'order \d+ is busy, try again'\}", out), out


def test_otel_prometheus_script_exports_the_wait_time_histogram(url: str) -> None:
    out = run_example("otel_prometheus.py", url)
    assert "[200, 200, 200, 200, 200, 200, 200, 200, 200, 200]" in out, out
    series = 'aiolock_lock_kind="lock",aiolock_lock_name="order",aiolock_lock_outcome="acquired"'
    buckets = re.findall(
        rf'^  aiolock_lock_wait_duration_seconds_bucket\{{{series},le="([^"]+)".*\}} (\S+)$',
        out,
        re.MULTILINE,
    )
    assert [le for le, _ in buckets][:3] == ["0.0005", "0.001", "0.0025"], out  # our buckets
    assert buckets[-1] == ("+Inf", "10.0"), out
    assert re.search(rf"^  aiolock_lock_acquisitions_total\{{{series},.*\}} 10.0$", out, re.M), out
    assert re.search(r"^  aiolock_lock_hold_duration_seconds_count\{.*\} 10.0$", out, re.M), out
    assert re.search(r"^  aiolock_lock_waiters\{.*\} 0.0$", out, re.M), out
    assert "order:" not in out.split("GET /metrics")[1], out  # no raw lock names


# --------------------------------------------------------------------------- FastAPI in-process


@asynccontextmanager
async def fastapi_client(url: str) -> AsyncIterator[Any]:
    """httpx against the app through its ASGI interface, lifespan included."""
    import httpx

    app = load("fastapi_app").create_app(url)
    # httpx's ASGITransport sends no lifespan events: run the lifespan here and
    # hand its state to each request, as an ASGI server does.
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: dict[str, Any], receive: Any, send: Any) -> None:
            scope["state"] = dict(state)
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http
    assert state["locks"].closed, "the lifespan must close the aiolock Client"


async def test_fastapi_concurrent_payments_charge_once(server: RedisServer, url: str) -> None:
    async with fastapi_client(url) as http:
        replies = await asyncio.gather(*(http.post("/orders/5/pay") for _ in range(8)))
    assert [r.status_code for r in replies] == [200] * 8
    statuses = sorted(r.json()["status"] for r in replies)
    assert statuses == ["already paid"] * 7 + ["paid"]
    assert charges(server, 5) == 1


async def test_fastapi_pay_waits_for_another_process(server: RedisServer, url: str) -> None:
    async with (
        fastapi_client(url) as http,
        aiolock.Client.from_url(url, prefix="shop") as other_process,
    ):
        held = await other_process.lock("order:6").acquire()
        pay = asyncio.ensure_future(http.post("/orders/6/pay"))
        done, _ = await asyncio.wait({pay}, timeout=0.3)
        assert not done, "the payment ran while another process held the order"
        other = asyncio.ensure_future(http.post("/orders/7/pay"))  # another order: not held up
        assert (await asyncio.wait_for(other, 10)).json()["status"] == "paid"
        await held.release()
        reply = await asyncio.wait_for(pay, 10)
    assert reply.status_code == 200
    assert reply.json()["fencing_token"] > held.fencing_token
    assert charges(server, 6) == 1


async def test_fastapi_refund_is_409_while_the_order_is_held(url: str) -> None:
    async with (
        fastapi_client(url) as http,
        aiolock.Client.from_url(url, prefix="shop") as other_process,
    ):
        assert (await http.post("/orders/8/pay")).json()["status"] == "paid"
        async with other_process.lock("order:8"):
            busy = await http.post("/orders/8/refund")
        assert busy.status_code == 409
        assert busy.json() == {"detail": "order 8 is busy, try again"}
        after = await http.post("/orders/8/refund")
        assert after.status_code == 200 and after.json()["status"] == "refunded"
        assert (await http.post("/orders/8/refund")).json()["status"] == "not paid"


# --------------------------------------------------------------------------- aiohttp in-process


@asynccontextmanager
async def aiohttp_client(url: str) -> AsyncIterator[Any]:
    from aiohttp.test_utils import TestClient, TestServer

    app = load("aiohttp_app").create_app(url)
    async with TestClient(TestServer(app)) as client:
        yield client
    assert app[load("aiohttp_app").LOCKS].closed, "cleanup must close the aiolock Client"


async def test_aiohttp_concurrent_payments_charge_once(server: RedisServer, url: str) -> None:
    async with aiohttp_client(url) as http:

        async def pay() -> tuple[int, Any]:
            async with http.post("/orders/15/pay") as reply:
                return reply.status, await reply.json()

        replies = await asyncio.gather(*(pay() for _ in range(8)))
    assert [status for status, _ in replies] == [200] * 8
    assert sorted(body["status"] for _, body in replies) == ["already paid"] * 7 + ["paid"]
    assert charges(server, 15) == 1


async def test_aiohttp_refund_is_409_while_the_order_is_held(url: str) -> None:
    async with (
        aiohttp_client(url) as http,
        aiolock.Client.from_url(url, prefix="shop") as other_process,
    ):
        async with http.post("/orders/16/pay") as reply:
            assert (await reply.json())["status"] == "paid"
        async with other_process.lock("order:16"):
            async with http.post("/orders/16/refund") as busy:
                assert busy.status == 409
                assert await busy.json() == {"detail": "order 16 is busy, try again"}
        async with http.post("/orders/16/refund") as after:
            assert after.status == 200 and (await after.json())["status"] == "refunded"


def test_examples_are_all_tested() -> None:
    here = Path(__file__).read_text()
    for path in EXAMPLES.glob("*.py"):
        assert f'"{path.name}"' in here or f'"{path.stem}"' in here, f"{path.name} has no test"
