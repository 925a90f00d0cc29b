"""The benchmark's own redis-server: a free port, a temp dir, no persistence.

Started by the one launcher (``aiolock._servers``) in the orchestrator, which
runs the work tree's package; the worker imports only ``_admin``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from aiolock._servers import ServerProcess, free_port
from benchmarks._admin import ADMIN_COMMANDS, ADMIN_NAME, admin_client, clients, connection_counts


class Server(ServerProcess):
    """A private redis-server (or valkey-server) process for one benchmark run:
    the one launcher (``aiolock._servers``), with room for many clients.
    ``stop()`` ends the process and keeps its directory; ``cleanup()`` removes it."""

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
        super().__init__(
            found,
            extra_args=("--maxclients", "16000", "--protected-mode", "no", *extra_args),
            pick_port=pick_port or free_port,
            dir_prefix="aiolock-bench-",
            start_timeout=10.0,
        )
        self.binary = found

    @property
    def dir(self) -> Path:
        """The server's directory (its log: ``server.log``)."""
        return self.directory

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.popen

    def admin(self) -> redis.Redis:
        return admin_client(self.url)

    def info(self) -> dict[str, Any]:
        with self.admin() as r:
            info: dict[str, Any] = r.info("server")
            return info

    def stop(self) -> None:
        self.terminate()

    def cleanup(self) -> None:
        super().stop()


__all__ = [
    "ADMIN_COMMANDS",
    "ADMIN_NAME",
    "Server",
    "admin_client",
    "clients",
    "connection_counts",
]
