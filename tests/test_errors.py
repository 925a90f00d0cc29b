"""Every failure a user sees is an AiolockError, with redis-py's exception as its cause.

Real faults only: a stopped server, a cut connection, a restarted server,
a password, an ACL user without EVALSHA, an out-of-memory server, and
redis-py's own Lock on the same key.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.lock import Lock as RedisPyLock

import aiolock
from aiolock import (
    AiolockError,
    AsyncioRequiredError,
    Backoff,
    Client,
    ConnectionFailedError,
    Lease,
    ServerRefusedError,
    ServerUnavailableError,
    WrongEventLoopError,
    WrongTypeError,
)
from aiolock._core import errors as _errors
from tests.core_util import assert_clean, eventually, off_thread
from tests.servers import RedisServer, ServerProcess, TcpProxy

Call = Callable[[], Awaitable[Any]]


def test_every_error_is_exported() -> None:
    errors = {
        name
        for name, value in vars(_errors).items()
        if isinstance(value, type) and issubclass(value, AiolockError)
    }
    assert errors <= set(aiolock.__all__)
    assert {"ConnectionFailedError", "ServerRefusedError", "WrongTypeError"} <= errors
    assert issubclass(ConnectionFailedError, ConnectionError), "except ConnectionError works"
    assert issubclass(WrongTypeError, ServerRefusedError)
    assert issubclass(AsyncioRequiredError, RuntimeError)


def test_every_error_is_in_the_docs() -> None:
    section = (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text()
    for name in aiolock.__all__:
        if name.endswith("Error"):
            assert f"`{name}`" in section, name


def _check(error: BaseException, cause: type[BaseException], *words: str) -> None:
    """An AiolockError, redis-py's exception as its cause, and a message with advice."""
    assert isinstance(error, AiolockError), repr(error)
    assert isinstance(error.__cause__, cause), repr(error.__cause__)
    for word in words:
        assert word in str(error), (word, str(error))


@pytest.mark.parametrize(
    ("reply", "code", "cause"),
    [
        (
            "LOADING Redis is loading the dataset in memory",
            "LOADING",
            redis.exceptions.BusyLoadingError,
        ),
        ("BUSY Redis is busy running a script.", "BUSY", redis.exceptions.ResponseError),
        ("MASTERDOWN Link with MASTER is down", "MASTERDOWN", redis.exceptions.MasterDownError),
        (
            "TRYAGAIN Multiple keys request during rehashing",
            "TRYAGAIN",
            redis.exceptions.TryAgainError,
        ),
    ],
)
def test_a_server_that_cannot_serve_yet_is_transient(
    reply: str, code: str, cause: type[BaseException]
) -> None:
    """LOADING, BUSY, MASTERDOWN, TRYAGAIN replies (as the reply parser hands
    them over) are ServerUnavailableError, a ConnectionFailedError: retried as
    an outage, never a refusal. (A real LOADING: test_restart.py.)"""
    from aiolock._core.transport.connection import DID_NOT_RUN
    from aiolock._core.transport.resp import reply_error

    ReplyError = redis.exceptions.ResponseError  # what either reply parser hands over

    error = reply_error(ReplyError(reply))
    assert isinstance(error, ServerUnavailableError) and isinstance(error, ConnectionFailedError)
    assert not isinstance(error, ServerRefusedError)
    assert error.code == code and isinstance(error, DID_NOT_RUN)
    _check(error, cause, reply.rstrip("."))
    assert str(error.__cause__) == reply  # the server's text is kept
    # redis-py's own classification (a handshake during LOADING) maps the same way.
    loading = _errors.from_redis(redis.exceptions.BusyLoadingError("Redis is loading"))
    assert isinstance(loading, ServerUnavailableError) and loading.code == "LOADING"
    # A code inside a script's error is not the command turned away: a refusal.
    wrapped = reply_error(ReplyError(f"ERR user_script:1: {reply} script: abc"))
    assert type(wrapped) is ServerRefusedError


# -- connection failures -----------------------------------------------------------------


async def _held(client: Client) -> dict[str, Any]:
    """Leases of each kind, taken while the server is up (released, or not, later)."""
    return {
        "lock": await client.lock("h").acquire(),
        "fair": await client.fair_lock("hf").acquire(),
        "write": await client.rw_lock("hw").write.acquire(),
        "permit": await client.semaphore("hs", 2).acquire(),
    }


def _calls(client: Client, held: dict[str, Any]) -> dict[str, Call]:
    lock = client.lock("x")
    fair = client.fair_lock("xf")
    rw = client.rw_lock("xrw")
    sem = client.semaphore("xs", 1)
    latch = client.latch("xl", 1)
    multi = client.multi_lock(client.lock("m1"), client.lock("m2"))
    return {
        "lock.acquire": lambda: lock.acquire(),
        "lock.acquire(timeout)": lambda: lock.acquire(timeout=0.5),
        "lock.try_acquire": lambda: lock.try_acquire(),
        "lock.is_locked": lambda: lock.is_locked(),
        "lock.remaining_ttl": lambda: lock.remaining_ttl(),
        "lock.force_release": lambda: lock.force_release(),
        "lease.extend": lambda: held["lock"].extend(10),
        "lease.release": lambda: held["lock"].release(),
        "fair.acquire": lambda: fair.acquire(),
        "fair.try_acquire": lambda: fair.try_acquire(),
        "fair.lease.release": lambda: held["fair"].release(),
        "rw.read.acquire": lambda: rw.read.acquire(),
        "rw.write.try_acquire": lambda: rw.write.try_acquire(),
        "rw.is_locked": lambda: rw.write.is_locked(),
        "rw.lease.release": lambda: held["write"].release(),
        "semaphore.acquire": lambda: sem.acquire(),
        "semaphore.available": lambda: sem.available(),
        "permit.release": lambda: held["permit"].release(),
        "latch.count_down": lambda: latch.count_down(),
        "latch.wait": lambda: latch.wait(),
        "multi.acquire": lambda: multi.acquire(),
    }


async def test_server_down_raises_connection_failed(fresh_server: ServerProcess) -> None:
    """Every user-facing await fails with ConnectionFailedError when Redis is gone.

    A first try that cannot reach Redis fails fast, with or without a timeout
    (try_acquire does not report a down server as a busy lock).
    """
    async with Client.from_url(fresh_server.url, prefix="e") as client:
        held = await _held(client)
        calls = _calls(client, held)
        fresh_server.stop()
        for what, call in calls.items():
            with pytest.raises(ConnectionFailedError) as info:
                async with asyncio.timeout(30):  # fails fast: never near this bound
                    await call()
            _check(info.value, redis.exceptions.ConnectionError, "Redis")
            assert "reachable" in str(info.value), (what, str(info.value))


async def waiting_through_a_cut(
    holder: Client, waiter: Client, name: str, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> tuple[Lease, asyncio.Task[Lease]]:
    """``holder`` holds lock ``name``; ``waiter`` (behind ``proxy``) waits for it
    with a 60 s timeout; then the proxy cuts every connection, and the wait
    goes on past a failed retry (logged: "Redis unreachable")."""
    caplog.set_level(logging.WARNING, logger="aiolock")
    held = await holder.lock(name).acquire()
    task = asyncio.create_task(waiter.lock(name).acquire(timeout=60))
    await eventually(lambda: waiter.statistics().waiting == 1, what="the waiter waits")
    proxy.cut()
    await eventually(
        lambda: task.done() or "Redis unreachable" in caplog.text, what="a failed retry"
    )
    return held, task


async def test_short_outage_ridden_out_by_waiting_task(
    proxy: TcpProxy, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A task waiting with a timeout longer than the outage acquires the lock afterwards.

    The holder talks to Redis directly; the waiter through a proxy that is cut
    (every connection reset, new ones too) while it waits. The lock is released
    during the outage; the waiter gets it once the network is back.
    """
    poll = Backoff(initial=0.01, maximum=0.05)
    async with (
        Client.from_url(server.url, prefix="e") as holder,
        Client.from_url(proxy.url, prefix="e", notify="poll", backoff=poll) as waiter,
    ):
        held, task = await waiting_through_a_cut(holder, waiter, "o", proxy, caplog)
        assert not task.done(), task.exception()
        # Several retries fail meanwhile (before the fix the third one gave up).
        done, _ = await asyncio.wait([task], timeout=2.0)
        assert not done, task.exception()
        await held.release()
        proxy.restore()
        lease = await asyncio.wait_for(task, 30)
        assert lease.fencing_token > held.fencing_token
        await lease.release()
        await assert_clean(holder, waiter)


async def test_cancelled_while_riding_out_an_outage(
    proxy: TcpProxy, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A wait cancelled between retries during an outage leaves nothing behind."""
    poll = Backoff(initial=0.01, maximum=0.05)
    async with (
        Client.from_url(server.url, prefix="e") as holder,
        Client.from_url(proxy.url, prefix="e", notify="poll", backoff=poll) as waiter,
    ):
        held, task = await waiting_through_a_cut(holder, waiter, "c", proxy, caplog)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proxy.restore()
        await held.release()
        assert not await waiter.lock("c").is_locked()
        await assert_clean(holder, waiter)


async def test_waiting_without_timeout_rides_out_a_restart(
    fresh_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A task that waits with no timeout, and reached Redis, waits through a restart."""
    caplog.set_level(logging.WARNING, logger="aiolock")
    poll = Backoff(initial=0.01, maximum=0.05)
    async with (
        Client.from_url(fresh_server.url, prefix="e") as holder,
        Client.from_url(fresh_server.url, prefix="e", notify="poll", backoff=poll) as waiter,
    ):
        held = await holder.lock("r").acquire()
        task = asyncio.create_task(waiter.lock("r").acquire())
        await eventually(lambda: waiter.statistics().waiting == 1, what="the waiter waits")
        fresh_server.kill()
        await eventually(
            lambda: task.done() or "Redis unreachable" in caplog.text, what="a failed retry"
        )
        done, _ = await asyncio.wait([task], timeout=2.0)
        assert not done, task.exception()
        fresh_server.restart()  # empty: the holder's hold is gone with the data
        lease = await asyncio.wait_for(task, 30)
        assert held.fencing_token > 0 and lease.fencing_token > 0
        await lease.release()
        await eventually(lambda: held.lost, what="the holder learns its hold is gone")


async def test_outage_longer_than_timeout(fresh_server: ServerProcess) -> None:
    """A wait whose timeout runs out while Redis is unreachable: ConnectionFailedError
    (not LockTimeoutError: the lock was not found busy). The holder's release fails too."""
    poll = Backoff(initial=0.01, maximum=0.05)
    async with (
        Client.from_url(fresh_server.url, prefix="e") as holder,
        Client.from_url(fresh_server.url, prefix="e", notify="poll", backoff=poll) as waiter,
    ):
        held = await holder.lock("t").acquire()
        # A timeout of seconds, so that a stall before the kill cannot run it
        # out while the lock is merely busy (that would be LockTimeoutError).
        waiting = asyncio.create_task(waiter.lock("t").acquire(timeout=5.0))
        await eventually(lambda: waiter.statistics().waiting == 1, what="the waiter waits")
        fresh_server.kill()
        with pytest.raises(ConnectionFailedError) as info:
            await asyncio.wait_for(waiting, 30)
        _check(info.value, redis.exceptions.ConnectionError, "timeout", "reachable")
        with pytest.raises(ConnectionFailedError):
            await held.release()
        assert held.lost


# -- a server that accepts connections and never answers ------------------------------------


def _redis_py_cause(error: BaseException) -> None:
    """redis-py's exception is the ``__cause__`` itself: not an aiolock class
    (an AiolockError, or an internal wrapper) with redis-py's one level down."""
    cause = error.__cause__
    assert cause is not None, repr(error)
    assert type(cause).__module__.startswith("redis."), repr(cause)
    assert not isinstance(cause, AiolockError), repr(cause)


async def test_a_silent_server_is_a_connection_failure(fresh_server: ServerProcess) -> None:
    """A server that accepts connections and never answers (SIGSTOP: the kernel
    still completes the TCP handshake) is unreachable, not busy: every wait
    ends in ConnectionFailedError, with redis-py's exception as its cause.

    With a timeout shorter than the try under way: when the timeout ends it.
    Without one: the first contact gives up after one ``command_timeout``
    without a reply (the README's rule), not after several tries."""
    fresh_server.pause()
    slow = 1.5  # a command_timeout longer than the grace a try gets past the deadline
    async with Client.from_url(fresh_server.url, prefix="e", command_timeout=slow) as client:
        lock = client.lock("x")
        start = time.monotonic()
        with pytest.raises(ConnectionFailedError) as info:
            await lock.acquire(timeout=0.5)
        assert time.monotonic() - start < 2 * slow  # ended by the timeout + the try's grace
        assert not isinstance(info.value, aiolock.LockTimeoutError)
        assert "never found busy" in str(info.value), str(info.value)
        _redis_py_cause(info.value)
        with pytest.raises(ConnectionFailedError) as info:
            await lock.try_acquire()  # not "busy" (None)
        _redis_py_cause(info.value)
    timeout = 1.0
    async with Client.from_url(fresh_server.url, prefix="e", command_timeout=timeout) as client:
        for call in (client.lock("x").acquire, client.fair_lock("y").acquire):
            start = time.monotonic()
            with pytest.raises(ConnectionFailedError) as info:
                await call()
            elapsed = time.monotonic() - start
            # One command_timeout for the connect that never got an answer;
            # at most twice that by the rule, plus scheduling on a loaded box.
            assert timeout <= elapsed < 2 * timeout + 0.5, elapsed
            message = str(info.value)
            assert "command_timeout (1 s)" in message and "reachable" in message, message
            _redis_py_cause(info.value)
            _one_stop(message)


@pytest.mark.parametrize("mode", ["standalone", "cluster", "sentinel"])
async def test_a_refused_port_has_redis_pys_error_as_cause(mode: str) -> None:
    """The connection could not be opened: the cause is redis-py's exception
    itself, on every path (an internal "not sent" wrapper, or our own error
    for a Sentinel that did not answer, used to sit between)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        url = f"redis://127.0.0.1:{port}"
        if mode == "sentinel":
            client = Client.from_sentinel([("127.0.0.1", port)], "mymaster", prefix="e")
        else:
            client = Client.from_url(url, prefix="e", cluster=mode == "cluster")
        async with client:
            for call in (
                client.lock("x").acquire,
                client.lock("x").is_locked,
                lambda: client.lock("x").acquire(timeout=0.2),
            ):
                with pytest.raises(ConnectionFailedError) as info:
                    await call()
                _redis_py_cause(info.value)
                if mode != "cluster":  # (redis-py's cluster client raises its own class)
                    assert type(info.value.__cause__) is redis.exceptions.ConnectionError, repr(
                        info.value.__cause__
                    )
                _one_stop(str(info.value))


# -- refusals ------------------------------------------------------------------------------


async def test_password_required(fresh_server: ServerProcess) -> None:
    url = fresh_server.url.replace("redis://", "redis://:s3cret@")  # none is set yet
    async with Client.from_url(url, prefix="e") as client:
        with pytest.raises(ServerRefusedError) as info:
            await client.lock("a").is_locked()
        # redis-py's text ends in a question mark: kept, no period after it.
        assert "correct? Check" in str(info.value), str(info.value)
        _one_stop(str(info.value))
    fresh_server.execute("CONFIG", "SET", "requirepass", "s3cret")
    async with Client.from_url(fresh_server.url, prefix="e") as client:
        with pytest.raises(ServerRefusedError) as info:
            async with asyncio.timeout(30):  # a refusal is not waited out
                await client.lock("a").acquire(timeout=60)
        _check(info.value, redis.exceptions.AuthenticationError, "NOAUTH", "password")
        assert info.value.code == "NOAUTH"
        assert not isinstance(info.value, ConnectionError)
    url = fresh_server.url.replace("redis://", "redis://:wrong@")
    async with Client.from_url(url, prefix="e") as client:
        with pytest.raises(ServerRefusedError) as info:
            await client.lock("a").is_locked()
        _check(info.value, redis.exceptions.AuthenticationError, "password")
        assert info.value.code == "WRONGPASS"
        # redis-py's text ends in a period: one period, then the advice.
        assert "disabled. Check" in str(info.value), str(info.value)
        _one_stop(str(info.value))
    url = fresh_server.url.replace("redis://", "redis://:s3cret@")
    async with Client.from_url(url, prefix="e") as client:
        async with client.lock("a") as lease:
            assert lease.fencing_token > 0


def _one_stop(message: str) -> None:
    """No doubled punctuation where our text follows redis-py's."""
    for doubled in ("..", "?.", "!.", ".)."):
        assert doubled not in message, (doubled, message)


async def test_acl_user_without_evalsha(fresh_server: ServerProcess) -> None:
    fresh_server.execute("ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-evalsha")
    url = fresh_server.url.replace("redis://", "redis://limited:pw@")
    # (scripting="eval": "auto" would run Functions instead, test_functions.py)
    async with Client.from_url(url, prefix="e", scripting="eval") as client:
        lock = client.lock("acl")
        with pytest.raises(ServerRefusedError) as info:
            async with asyncio.timeout(30):
                await lock.acquire(timeout=60)
        _check(info.value, redis.exceptions.ResponseError, "NOPERM", "evalsha", "EVALSHA")
        assert info.value.code == "NOPERM"
        assert not await lock.is_locked(), "EXISTS is allowed; nothing was taken"
        await assert_clean(client)


async def test_out_of_memory(fresh_server: ServerProcess) -> None:
    fresh_server.execute("CONFIG", "SET", "maxmemory-policy", "noeviction")
    fresh_server.execute("CONFIG", "SET", "maxmemory", "1")
    async with Client.from_url(fresh_server.url, prefix="e") as client:
        lock = client.lock("oom")
        with pytest.raises(ServerRefusedError) as info:
            async with asyncio.timeout(30):
                await lock.acquire(timeout=60)
        _check(info.value, redis.exceptions.ResponseError, "OOM", "maxmemory")
        assert info.value.code == "OOM"
        fresh_server.execute("CONFIG", "SET", "maxmemory", "0")
        async with lock as lease:
            assert lease.fencing_token > 0
        await assert_clean(client)


async def test_key_held_by_redis_py_lock(server: RedisServer) -> None:
    """redis-py's Lock on ``<prefix>:{<name>}`` (a string): WrongTypeError, not a hang."""
    other = aioredis.Redis.from_url(server.url)
    foreign = RedisPyLock(other, "e:{shared}", timeout=60)
    assert await foreign.acquire()
    try:
        async with Client.from_url(server.url, prefix="e") as client:
            for call in (
                lambda: client.lock("shared").acquire(timeout=60),
                lambda: client.lock("shared").try_acquire(),
                lambda: client.fair_lock("shared").acquire(timeout=60),
                lambda: client.rw_lock("shared").write.acquire(timeout=60),
                lambda: client.semaphore("shared", 1).acquire(timeout=60),
            ):
                with pytest.raises(WrongTypeError) as info:
                    async with asyncio.timeout(30):
                        await call()
                _check(info.value, redis.exceptions.ResponseError, "WRONGTYPE", "prefix")
                assert info.value.code == "WRONGTYPE"
                # Once: which key holds what, and what to do; no script SHA or line.
                message = str(info.value)
                assert re.search(
                    r"key e:\{shared\}\S* holds a string where aiolock keeps a \w+\. ", message
                ), message
                for once in ("WRONGTYPE", "holds", "another name", "nothing was changed"):
                    assert message.count(once) == 1, (once, message)
                assert not re.search(r"[0-9a-f]{40}|script|user_script", message), message
                _one_stop(message)
            assert await foreign.owned(), "the foreign lock is untouched"
            await assert_clean(client)
    finally:
        await foreign.release()
        await other.aclose()


# -- event loops -----------------------------------------------------------------------


def test_no_asyncio_loop_says_asyncio_is_needed() -> None:
    """Driven by something other than asyncio (as trio does): a plain message, no RuntimeError
    about a missing event loop."""
    client = Client.from_url("redis://127.0.0.1:1/0")
    lock = client.lock("x")
    calls: list[Call] = [
        lambda: lock.acquire(),
        lambda: lock.try_acquire(),
        lambda: lock.release(),
        lambda: lock.is_locked(),
        lambda: client.semaphore("s", 1).acquire(),
        lambda: client.rw_lock("rw").read.acquire(),
        lambda: client.fair_lock("f").acquire(),
        lambda: client.latch("l", 1).wait(),
        lambda: client.aclose(),
    ]
    for call in calls:
        coro = call()
        assert inspect.iscoroutine(coro)
        with pytest.raises(AsyncioRequiredError) as info:
            coro.send(None)
        assert "asyncio" in str(info.value) and "trio" in str(info.value)
    with pytest.raises(AsyncioRequiredError):
        client.__aenter__().send(None)


def test_trio_backend_says_asyncio_is_needed() -> None:
    pytest.importorskip("trio")
    import anyio

    async def main() -> None:
        client = Client.from_url("redis://127.0.0.1:1/0")
        with pytest.raises(AsyncioRequiredError, match="trio"):
            await client.lock("x").acquire()
        with pytest.raises(AsyncioRequiredError):
            async with client:
                pass

    anyio.run(main, backend="trio")


async def test_wrong_event_loop_explains_the_usual_cause(server: RedisServer) -> None:
    async with Client.from_url(server.url, prefix="e") as client:
        lock = client.lock("loop")
        await lock.is_locked()  # bound to this loop

        async def use() -> None:
            await lock.acquire()

        with pytest.raises(WrongEventLoopError) as raised:
            off_thread(lambda: asyncio.run(use()))
        error = raised.value
        for words in ("fixture", "module level", "one Client per event loop"):
            assert words in str(error), str(error)
        assert not await lock.is_locked()
