"""Bad input: a clear, typed error at the call, before any round trip, nothing changed."""

from __future__ import annotations

import asyncio
import math
import types
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiolock
from aiolock import (
    AiolockError,
    Client,
    ClientClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockNotOwnedError,
    WrongEventLoopError,
)
from tests.core_util import eventually, off_thread
from tests.servers import RedisServer


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "v"}


def assert_untouched(client: Client, server: RedisServer) -> None:
    assert client.statistics().command_connects == 0, "a round trip happened"
    assert server.execute("DBSIZE") == 0


@pytest.mark.parametrize("name", ["", b"bytes", 3, None, ["x"]])
async def test_bad_names(client: Client, server: RedisServer, name: Any) -> None:
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError)) as info:
        client.lock(name)
    assert isinstance(info.value, (ValueError, TypeError))
    assert isinstance(info.value, AiolockError)
    assert "name" in str(info.value)
    assert_untouched(client, server)


BAD_SECONDS = [-1, -0.001, math.nan, math.inf, -math.inf, "1", True, 10**10]


@pytest.mark.parametrize("value", BAD_SECONDS)
async def test_bad_timeouts(client: Client, server: RedisServer, value: Any) -> None:
    lock = client.lock("x")
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError), match="timeout"):
        await lock.acquire(timeout=value)
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError), match="wait"):
        await lock.try_acquire(value)
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError), match="timeout"):
        lock(timeout=value)
    assert_untouched(client, server)


@pytest.mark.parametrize("value", [*BAD_SECONDS, 0, 0.0])
async def test_bad_leases(client: Client, server: RedisServer, value: Any) -> None:
    lock = client.lock("x")
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError), match="lease"):
        await lock.acquire(lease=value)
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError), match="lease"):
        await lock.try_acquire(lease=value)
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError), match="lease"):
        lock(lease=value)
    assert_untouched(client, server)


async def test_bad_client_arguments(url: str) -> None:
    with pytest.raises(InvalidArgumentError, match="prefix"):
        Client.from_url(url, prefix="a{b}")
    with pytest.raises(InvalidArgumentError, match="prefix"):
        Client.from_url(url, prefix="")
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError), match="lease"):
        Client.from_url(url, lease=-1)
    with pytest.raises(InvalidArgumentError, match="notify"):
        Client.from_url(url, notify="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match=r"redis\.asyncio\.Redis"):
        Client("redis://localhost")  # type: ignore[arg-type]


async def test_bad_on_lost_and_decorator_target(client: Client, server: RedisServer) -> None:
    lock = client.lock("x")
    with pytest.raises(InvalidArgumentError, match="on_lost"):
        lock(on_lost="explode")  # type: ignore[call-overload]

    def sync_function() -> None:
        pass

    with pytest.raises(InvalidArgumentTypeError, match="async"):
        lock(sync_function)  # type: ignore[arg-type]
    assert_untouched(client, server)


async def test_bad_extend_and_callback(client: Client) -> None:
    lease = await client.lock("x").acquire()
    with pytest.raises(InvalidArgumentError):
        await lease.extend(-1)
    with pytest.raises(TypeError):
        lease.on_lost("not callable")  # type: ignore[arg-type]
    await lease.release()
    with pytest.raises(LockNotOwnedError):
        await lease.extend(5)


async def test_release_when_not_held(client: Client, server: RedisServer) -> None:
    lock = client.lock("x")
    with pytest.raises(LockNotOwnedError, match="not held by the current task"):
        await lock.release()
    assert_untouched(client, server)


async def test_use_after_close(url: str, server: RedisServer) -> None:
    client = Client.from_url(url, prefix="v")
    lock = client.lock("x")
    lease = await lock.acquire()
    await client.aclose()
    await client.aclose()  # idempotent
    assert client.closed
    assert lease.lost
    assert server.execute("EXISTS", "v:{x}") == 0, "aclose released the hold"
    with pytest.raises(ClientClosedError):
        await lock.acquire()
    with pytest.raises(ClientClosedError):
        await lock.is_locked()
    with pytest.raises(ClientClosedError):
        async with client:
            pass


async def test_waiters_get_client_closed_error(url: str) -> None:
    async with Client.from_url(url, prefix="v") as other:
        held = await other.lock("x").acquire()
        client = Client.from_url(url, prefix="v")
        remote_waiter = asyncio.create_task(client.lock("x").acquire())
        local_waiter = asyncio.create_task(client.lock("x").acquire())
        await eventually(lambda: client.statistics().waiting == 2, what="2 waiters")
        await client.aclose()
        for task in (remote_waiter, local_waiter):
            with pytest.raises(ClientClosedError):
                await task
        await held.release()


async def test_use_from_another_event_loop(url: str) -> None:
    client = Client.from_url(url, prefix="v")
    try:
        await client.lock("x").try_acquire()

        async def use() -> None:
            await client.lock("y").acquire()

        with pytest.raises(WrongEventLoopError) as error:
            off_thread(lambda: asyncio.run(use()))
        assert isinstance(error.value, RuntimeError)
        assert "event loop" in str(error.value)
    finally:
        await client.aclose()


async def test_client_wraps_existing_redis_and_leaves_it_open(url: str) -> None:
    redis = aioredis.Redis.from_url(url, decode_responses=True)
    async with Client(redis, prefix="v") as client:
        async with client.lock("x") as lease:
            assert lease.fencing_token > 0
    assert await redis.ping()
    await redis.aclose()


def test_public_names_match_all() -> None:
    # Subpackages (aiolock.cli, once imported) are modules, not exported names.
    public = {
        name
        for name in dir(aiolock)
        if not name.startswith("_") and not isinstance(getattr(aiolock, name), types.ModuleType)
    }
    assert set(aiolock.__all__) == public - {"annotations"}
    for name in aiolock.__all__:
        assert getattr(aiolock, name).__module__.startswith("aiolock")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://x", "schemes"),
        ("redis://h:abc", "Port"),
        ("redis://h:99999", "Port"),
        ("redis://h/?socket_timeout=abc", "socket_timeout"),
        ("redis://user:s3cret@h:abc/0", "Port"),
    ],
)
def test_bad_url_is_an_invalid_argument(url: str, says: str) -> None:
    """redis-py's ValueError for a URL it cannot parse reaches the user as an
    InvalidArgumentError (cause: redis-py's) that says which URLs work, and
    never shows a password."""
    with pytest.raises(InvalidArgumentError) as info:
        Client.from_url(url)
    message = str(info.value)
    assert says in message and "redis://[[user]:password@]host[:port][/db]" in message
    assert "s3cret" not in message
    assert type(info.value.__cause__) is ValueError
