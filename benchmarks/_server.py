"""The benchmark's own redis-server: a free port, a temp dir, no persistence."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

ADMIN_NAME = "bench-admin"

#: Commands the harness itself sends (never counted as a library's requests).
ADMIN_COMMANDS = frozenset(
    {
        "config|resetstat",
        "config|set",
        "info",
        "client|list",
        "client|kill",
        "pubsub|channels",
        "pubsub|numsub",
        "dbsize",
        "flushall",
        "script|flush",
        "memory|usage",
        "cluster|info",
        "cluster|nodes",
        "pubsub|shardchannels",
        "replconf",  # a replica's acknowledgements to its master
    }
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """A private redis-server (or valkey-server) process for one benchmark run."""

    def __init__(
        self,
        binary: str | None = None,
        *,
        extra_args: tuple[str, ...] = (),
        pick_port: Callable[[], int] | None = None,
    ) -> None:
        found = binary or os.environ.get("AIOLOCK_BENCH_SERVER") or shutil.which("redis-server")
        if not found:
            raise RuntimeError(
                "redis-server not found on PATH (apt-get install redis-server, "
                "or set AIOLOCK_BENCH_SERVER=/path/to/redis-server)"
            )
        self.binary = found
        self.dir = Path(tempfile.mkdtemp(prefix="aiolock-bench-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args = extra_args
        self.pick_port = pick_port or free_port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        for _attempt in range(5):
            self.port = self.pick_port()
            args = [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
                "--logfile", str(self.dir / "server.log"),
                "--maxclients", "16000",
                "--protected-mode", "no",
                *self.extra_args,
            ]  # fmt: skip
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    with self.admin() as r:
                        if r.ping():
                            return
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"could not start {self.binary}; see {self.dir / 'server.log'}")

    def admin(self) -> redis.Redis:
        return admin_client(self.url)

    def info(self) -> dict[str, Any]:
        with self.admin() as r:
            info: dict[str, Any] = r.info("server")
            return info

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def admin_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, client_name=ADMIN_NAME, socket_timeout=30)


def clients(r: redis.Redis) -> list[dict[str, Any]]:
    """CLIENT LIST without the harness' own admin connections."""
    return [c for c in r.client_list() if c.get("name") != ADMIN_NAME]


def connection_counts(r: redis.Redis, name_prefix: str | None = None) -> dict[str, int]:
    """Connections of the library under test: command and pub/sub ones."""
    found = clients(r)
    if name_prefix is not None:
        found = [c for c in found if str(c.get("name", "")).startswith(name_prefix)]
    pubsub = [
        c
        for c in found
        if int(c.get("sub", 0)) + int(c.get("psub", 0)) > 0 or "P" in str(c.get("flags", ""))
    ]
    return {"total": len(found), "pubsub": len(pubsub), "command": len(found) - len(pubsub)}
