"""Tests of the test harness itself (tests/servers.py, tests/conftest.py).

Everything runs against real servers; negative checks ("this stays blocked") use
short bounded waits, positive checks use generous ones.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # NOT redis.retry.Retry: that one is sync
from redis.backoff import NoBackoff

from tests.conftest import _mode, _server_params, _ServerPool
from tests.core_util import eventually
from tests.servers import (
    RedisServer,
    ServerProcess,
    TcpProxy,
    find_free_port,
    redis_binary,
)

GENEROUS = 10.0  # upper bound for things that should happen promptly
BLOCKED = 0.3  # how long "still blocked" is observed for

REPO_ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def aclient(url: str, *, retries: int = 0, **kwargs: Any) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client that is always closed; no retries unless asked."""
    client = aioredis.Redis.from_url(url, retry=Retry(NoBackoff(), retries), **kwargs)
    try:
        yield client
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- servers


def test_find_free_port_is_bindable() -> None:
    import socket

    port = find_free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_shared_server_answers_ping(server: RedisServer, url: str) -> None:
    assert server.ping()
    assert url == server.url
    assert server.version
    assert server.kind in ("redis", "valkey")
    with server.admin_client() as client:
        info = client.info("server")
    if server.kind == "valkey":
        assert "valkey_version" in info
    else:
        assert "valkey_version" not in info


_FLUSH_TESTS = """
from pathlib import Path

MARKS = Path(__file__).parent


def test_part1(server):
    server.execute("SET", "leftover", "1")
    server.execute("SCRIPT", "LOAD", "return 1")
    (MARKS / f"part1-{server.port}").touch()


def test_part2(server):
    # Part 1 ran first on this very server (file order, one process): the
    # autouse fixture flushed between the two.
    assert (MARKS / f"part1-{server.port}").exists()
    assert server.execute("DBSIZE") == 0
    sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"  # sha1("return 1")
    assert server.execute("SCRIPT", "EXISTS", sha) == [0]
"""


def test_shared_server_is_flushed_between_tests(tmp_path: Path) -> None:
    # The backends the inner session runs (a missing binary skips, as here).
    backends = sum(1 for param in _server_params() if not param.marks)
    if not backends:
        pytest.skip("no server binary")
    # Its own pytest session (one process, file order), whatever this one's
    # workers and order: part 2 always runs after part 1, on the same server.
    (tmp_path / "test_inner.py").write_text(_FLUSH_TESTS)
    (tmp_path / "pytest.ini").write_text(_GUARD_INI)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-q", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
         str(tmp_path), str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=100, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"{2 * backends} passed" in out, out
    assert len(list(tmp_path.glob("part1-*"))) == backends, out


def test_both_backends_distinct(_server_pool: _ServerPool) -> None:
    if _mode() != "process":
        pytest.skip("compares the two local server processes")
    redis_srv = _server_pool.get("redis")  # skips (fails under CI) if a binary is missing
    valkey_srv = _server_pool.get("valkey")
    assert redis_srv.kind == "redis"
    assert valkey_srv.kind == "valkey"
    assert redis_srv.port != valkey_srv.port
    assert redis_srv.version != valkey_srv.version, (redis_srv.version, valkey_srv.version)
    assert redis_srv.ping() and valkey_srv.ping()


def test_server_process_stop_cleans_up(fresh_server: ServerProcess) -> None:
    tmp = fresh_server.directory
    assert tmp.is_dir()
    assert fresh_server.log_path.exists()
    fresh_server.stop()
    assert not tmp.exists()
    assert not fresh_server.running
    fresh_server.stop()  # idempotent


def test_start_failure_reports_log_tail() -> None:
    if redis_binary() is None:
        pytest.skip("redis-server not on PATH")
    blocker = ServerProcess("redis")
    blocker.start()
    try:
        clash = ServerProcess("redis", port=blocker.port)
        try:
            with pytest.raises(RuntimeError, match=r"(?s)exited.*log tail:.*in use"):
                clash.start()
        finally:
            clash.stop()
    finally:
        blocker.stop()


async def test_pause_blocks_then_resume_unblocks(fresh_server: ServerProcess) -> None:
    async with aclient(fresh_server.url) as client:
        assert await client.ping()
        with fresh_server.paused():
            task = asyncio.ensure_future(client.set("k", "v"))
            done, _ = await asyncio.wait({task}, timeout=BLOCKED)
            assert not done, "command completed while the server was SIGSTOPped"
        async with asyncio.timeout(GENEROUS):
            assert await task
        assert await client.get("k") == b"v"


def test_restart_loses_data_and_keeps_port(fresh_server: ServerProcess) -> None:
    fresh_server.execute("SET", "k", "v")
    port, pid = fresh_server.port, fresh_server.pid
    fresh_server.restart()
    assert fresh_server.port == port
    assert fresh_server.pid != pid
    assert fresh_server.url.endswith(f":{port}/0")
    assert fresh_server.execute("GET", "k") is None
    assert fresh_server.ping()


async def test_kill_drops_connections(fresh_server: ServerProcess) -> None:
    async with aclient(fresh_server.url) as client:
        assert await client.ping()
        fresh_server.kill()
        assert not fresh_server.running
        with pytest.raises(redis.ConnectionError):
            await client.ping()
        fresh_server.restart()  # also works after kill()
        assert await client.ping()


async def test_restart_resets_live_connections(fresh_server: ServerProcess) -> None:
    async with aclient(fresh_server.url, retries=0) as client:
        await client.set("k", "v")
        fresh_server.restart()
        with pytest.raises(redis.ConnectionError):
            await client.get("k")
        assert await client.get("k") is None  # reconnected to the new, empty server


async def test_kill_pubsub_clients_disconnects_subscriber(server: RedisServer) -> None:
    async with aclient(server.url, retries=3) as client, aclient(server.url) as publisher:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe("chan")
            first = await pubsub.get_message(timeout=GENEROUS)
            assert first is not None and first["type"] == "subscribe"
            with server.admin_client() as admin:
                before = {entry["id"] for entry in admin.client_list(_type="pubsub")}
            assert len(before) == 1

            assert server.kill_pubsub_clients() == 1

            # redis-py notices the dead socket on the next read and, with retries,
            # reconnects and resubscribes: we observe a fresh "subscribe" message.
            async with asyncio.timeout(GENEROUS):
                while True:
                    try:
                        message = await pubsub.get_message(timeout=1.0)
                    except redis.ConnectionError:
                        # Surfaced instead of retried; the next call reconnects.
                        await asyncio.sleep(0.01)  # never spin without yielding
                        continue
                    if message is not None and message["type"] == "subscribe":
                        break

            with server.admin_client() as admin:
                after = {entry["id"] for entry in admin.client_list(_type="pubsub")}
            assert len(after) == 1 and after.isdisjoint(before), (before, after)

            assert await publisher.publish("chan", "hello") == 1
            async with asyncio.timeout(GENEROUS):
                while (msg := await pubsub.get_message(timeout=1.0)) is None:
                    pass
            assert msg["type"] == "message" and msg["data"] == b"hello"
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]


async def test_kill_normal_clients_spares_admin(server: RedisServer) -> None:
    async with aclient(server.url) as client:
        await client.ping()
        assert server.client_count("normal") == 1
        assert server.kill_normal_clients() >= 1
        with pytest.raises(redis.ConnectionError):
            await client.ping()
        assert await client.ping()  # new connection


# --------------------------------------------------------------------------- proxy


async def test_proxy_forwards(proxy: TcpProxy, server: RedisServer) -> None:
    big = os.urandom(4 * 1024 * 1024)  # exercises flow control in both directions
    async with aclient(proxy.url) as client:
        await client.set("big", big)
        assert await client.get("big") == big
        assert proxy.connection_count == 1
    assert server.execute("STRLEN", "big") == len(big)
    await eventually(lambda: proxy.connection_count == 0, what="proxy link closed")


async def test_proxy_cut_breaks_live_connection_and_restore(
    proxy: TcpProxy, server: RedisServer
) -> None:
    async with aclient(proxy.url) as client:
        assert await client.ping()
        proxy.cut()
        with pytest.raises(redis.ConnectionError):
            await client.ping()
        # New connections are reset too while cut.
        async with aclient(proxy.url) as other:
            with pytest.raises(redis.ConnectionError):
                await other.ping()
        await eventually(lambda: server.client_count() == 0, what="server saw the cut")
        proxy.restore()
        assert await client.ping()
        async with aclient(proxy.url) as other:
            assert await other.ping()


async def test_proxy_blackhole_hangs_then_restore_delivers(proxy: TcpProxy) -> None:
    async with aclient(proxy.url) as client:
        await client.set("k", "v")
        proxy.blackhole()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(BLOCKED):
                await client.get("k")
        # A command issued during the partition is held, not lost ...
        async with aclient(proxy.url) as other:
            task = asyncio.ensure_future(other.get("k"))
            done, _ = await asyncio.wait({task}, timeout=BLOCKED)
            assert not done
            proxy.restore()
            # ... and completes once the partition heals.
            async with asyncio.timeout(GENEROUS):
                assert await task == b"v"
        assert await client.get("k") == b"v"


async def test_proxy_aclose_with_live_connections(server: RedisServer) -> None:
    proxy = TcpProxy.to(server)
    await proxy.start()
    async with aclient(proxy.url) as client:
        await client.ping()
        proxy.blackhole()
        task = asyncio.ensure_future(client.ping())
        await asyncio.sleep(0)
        await proxy.aclose()
        with pytest.raises(redis.ConnectionError):
            async with asyncio.timeout(GENEROUS):
                await task
    assert proxy.connection_count == 0


# --------------------------------------------------------------------------- asyncio guard

_GUARD_TESTS = """
import asyncio

async def test_clean():
    task = asyncio.ensure_future(asyncio.sleep(0))
    await task

async def test_leaks_failed_task():
    async def boom():
        raise ValueError("boom")
    task = asyncio.ensure_future(boom())
    await asyncio.sleep(0.01)
    del task

def test_sync():
    pass

async def test_debug_mode_is_on():
    assert asyncio.get_running_loop().get_debug()
"""

_GUARD_INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""


def test_loop_guard_fails_tests_with_unhandled_loop_errors(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(_GUARD_TESTS))
    (tmp_path / "pytest.ini").write_text(_GUARD_INI)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", "-rE", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
         str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "4 passed, 1 error" in out, out
    assert "ERROR" in out and "test_leaks_failed_task" in out, out
    assert "Task exception was never retrieved" in out, out
    assert "ValueError: boom" in out, out
