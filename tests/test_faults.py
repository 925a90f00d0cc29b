"""Faults on real servers: killed pub/sub links, restarts, pauses, cut networks."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from aiolock import Client, ConnectionFailedError, LockLostError, LockTimeoutError
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually
from tests.servers import RedisServer, TcpProxy


async def test_pubsub_connection_killed_waiter_still_woken(server: RedisServer) -> None:
    """The listener reconnects, resubscribes, and the waiter acquires long before the TTL."""
    async with (
        Client.from_url(server.url, prefix="f") as holder,
        Client.from_url(server.url, prefix="f") as waiter,
    ):
        held = await holder.lock("k").acquire()  # 30 s lease: a TTL-bound wait would be slow
        task = asyncio.create_task(waiter.lock("k").acquire())
        # The waiter listens on its Client's own channel of the lock (targeted wake-ups).
        name = f"f:{{k}}:w:{waiter.id}".encode()
        await eventually(lambda: seam.listener_channels(waiter).get(name) is not None)
        channel = seam.listener_channels(waiter)[name]
        await eventually(lambda: channel.is_confirmed, what="subscription confirmed")
        assert server.kill_pubsub_clients() >= 1
        await eventually(
            lambda: waiter.statistics().pubsub_connects >= 2, what="listener reconnect"
        )
        await eventually(lambda: channel.is_confirmed, what="resubscribed")
        loop = asyncio.get_running_loop()
        released = loop.time()
        await held.release()
        lease = await asyncio.wait_for(task, 20)
        assert loop.time() - released < 10, "woken by the message, not by the 30 s TTL"
        await lease.release()
        await assert_clean(holder, waiter)


async def test_script_flush_reloads_scripts(server: RedisServer) -> None:
    async with Client.from_url(server.url, prefix="f") as client:
        async with client.lock("s"):
            pass
        server.script_flush()
        async with client.lock("s") as lease:
            assert lease.fencing_token > 0
        await assert_clean(client)


async def test_server_restart_reconnects_and_loses_held_lease(fresh_server: RedisServer) -> None:
    async with Client.from_url(fresh_server.url, prefix="f", lease=1.5) as client:
        lock = client.lock("r")
        first = await lock.acquire()
        fresh_server.restart()  # all data lost, scripts too
        await eventually(lambda: first.lost, what="the watchdog to notice the lost hold")
        second = await asyncio.wait_for(lock.acquire(), 20)
        assert second.fencing_token > first.fencing_token, "tokens grow across data loss"
        await second.release()
        assert client.statistics().command_connects >= 2
        await assert_clean(client)


async def test_paused_server_times_out_then_recovers(fresh_server: RedisServer) -> None:
    async with Client.from_url(fresh_server.url, prefix="f", command_timeout=0.5) as client:
        lock = client.lock("p")
        await lock.is_locked()
        with fresh_server.paused():
            with pytest.raises((LockTimeoutError, ConnectionFailedError)):
                await lock.acquire(timeout=0.2)
            with pytest.raises(ConnectionFailedError):
                await lock.is_locked()
        async with lock as lease:
            assert lease.fencing_token > 0
        await assert_clean(client)


async def test_cut_connection_then_restore(proxy: TcpProxy, server: RedisServer) -> None:
    async with Client.from_url(proxy.url, prefix="f", command_timeout=2) as client:
        lock = client.lock("cut")
        async with lock:
            pass
        proxy.cut()
        with pytest.raises(ConnectionFailedError):
            await lock.acquire(timeout=0.5)
        proxy.restore()
        async with lock as lease:
            assert lease.fencing_token > 0
        await assert_clean(client)
        assert server.execute("EXISTS", "f:{cut}") == 0


async def test_release_survives_a_blackholed_connection(
    proxy: TcpProxy, server: RedisServer
) -> None:
    """The release's first attempt vanishes; a retry on a new connection completes it."""
    async with Client.from_url(proxy.url, prefix="f", command_timeout=0.5) as client:
        lease = await client.lock("bh").acquire()
        proxy.blackhole()
        release = asyncio.create_task(lease.release())
        await asyncio.sleep(0.7)  # past command_timeout: the connection is dropped
        proxy.restore()
        await asyncio.wait_for(release, 20)
        assert server.execute("EXISTS", "f:{bh}") == 0
        await assert_clean(client)


async def test_release_script_is_idempotent(server: RedisServer) -> None:
    """A retried release (same owner and token) reports success and changes nothing."""
    async with Client.from_url(server.url, prefix="f") as client:
        lease = await client.lock("idem").acquire()
        hold = lease._hold
        redis = aioredis.Redis.from_url(server.url)
        script = seam.engine(client).scripts[hold.release_script]
        args, keys = hold.release_args, hold.release_keys
        try:
            assert await redis.eval(script.source, len(keys), *keys, *args) == 1
            assert await redis.eval(script.source, len(keys), *keys, *args) == 2
            # A later holder (another task) is not disturbed by a late retry.
            await lease.release()  # the local side: the server says "already released"
            other = await asyncio.create_task(client.lock("idem").acquire())
            assert await redis.eval(script.source, len(keys), *keys, *args) == 2
            assert await client.lock("idem").is_locked(), "the new hold is untouched"
            await other.release()
        finally:
            await redis.aclose()
        await assert_clean(client)


async def test_lost_lease_when_renewal_impossible(proxy: TcpProxy) -> None:
    async with Client.from_url(proxy.url, prefix="f", lease=1.0, command_timeout=5) as client:
        with pytest.raises(LockLostError):
            async with client.lock("nr"):
                proxy.blackhole()
                await asyncio.sleep(30)
        proxy.restore()


async def _gate_undos(
    client: Client, script: str
) -> tuple[asyncio.Event, list[asyncio.Future[object]]]:
    """Hold back ``client``'s background undos of ``script`` (token "") until the
    returned event is set, as a slow retry after an outage would; the futures
    resolve with each undo's reply."""
    gate = asyncio.Event()
    replies: list[asyncio.Future[object]] = []
    retry = seam.engine(client).retry

    async def gated(
        name: str, keys: tuple[object, ...], args: tuple[object, ...], attempts: int = 5
    ) -> object:
        if name != script or args[1] != "":
            return await retry(name, keys, args, attempts)
        reply: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        replies.append(reply)
        await gate.wait()
        try:
            result = await retry(name, keys, args, attempts)
        except BaseException as exc:
            reply.set_exception(exc)
            raise
        reply.set_result(result)
        return result

    seam.engine(client).retry = gated  # type: ignore[method-assign]
    return gate, replies


async def test_late_undo_of_abandoned_acquire_spares_the_next_hold(
    proxy: TcpProxy, server: RedisServer
) -> None:
    """An acquire that gave up in an outage leaves a background undo; when that
    undo runs only after the same task acquired the lock again, it must not
    delete the new hold (the undo targets the attempt, not the owner)."""
    async with (
        Client.from_url(server.url, prefix="f") as other,
        Client.from_url(proxy.url, prefix="f") as client,
    ):
        gate, undos = await _gate_undos(client, "release")
        held = await other.lock("k").acquire()
        async with client.lock("warm"):
            pass  # connected once
        proxy.cut()
        with pytest.raises(ConnectionFailedError):
            await client.lock("k").acquire(timeout=0.5)  # gives up: abandons its tries
        await eventually(lambda: len(undos) == 1, what="the abandoned attempt's undo")
        proxy.restore()
        await held.release()
        async with asyncio.timeout(20):  # (not wait_for: its own task, another owner)
            again = await client.lock("k").acquire()  # the same task: the same owner
        gate.set()  # the stale undo runs now, after the new hold
        assert await asyncio.wait_for(undos[0], 20) == 0, "the undo touched nothing"
        with pytest.raises(LockTimeoutError):
            await other.lock("k").acquire(timeout=0)  # still held: no second holder
        await again.release()
        await assert_clean(other, client)


async def test_late_undo_of_abandoned_multi_acquire_spares_the_next_hold(
    proxy: TcpProxy, server: RedisServer
) -> None:
    """The same for a multi-lock: each lock's undo targets the attempt."""
    async with (
        Client.from_url(server.url, prefix="f") as other,
        Client.from_url(proxy.url, prefix="f") as client,
    ):
        gate, undos = await _gate_undos(client, "release")
        held = await other.lock("b").acquire()
        multi = client.multi_lock(client.lock("a"), client.lock("b"))
        async with client.lock("warm"):
            pass  # connected once
        proxy.cut()
        with pytest.raises(ConnectionFailedError):
            await multi.acquire(timeout=0.5)  # gives up: abandons its tries
        await eventually(lambda: len(undos) == 2, what="an undo per lock")
        proxy.restore()
        await held.release()
        async with asyncio.timeout(20):  # (not wait_for: its own task, another owner)
            again = await multi.acquire()  # the same task: the same owner
        gate.set()  # the stale undos run now, after the new holds
        assert [await asyncio.wait_for(undo, 20) for undo in undos] == [0, 0]
        for name in ("a", "b"):
            with pytest.raises(LockTimeoutError):
                await other.lock(name).acquire(timeout=0)  # still held
        await again.release()
        await assert_clean(other, client)


async def test_each_failed_command_gets_its_own_error(proxy: TcpProxy) -> None:
    """Commands failed by one lost connection (or one failed connect) each raise
    their own ConnectionFailedError, all caused by the same redis-py error: a
    shared instance, raised by many tasks, would pile up their tracebacks."""
    async with Client.from_url(proxy.url, prefix="f") as client:
        lock = client.lock("k")
        assert not await lock.is_locked()  # connected
        proxy.blackhole()
        calls = [asyncio.create_task(lock.is_locked()) for _ in range(2)]
        await eventually(
            lambda: len(seam.command_lane(client)._pending) >= 2, what="both on the wire"
        )
        proxy.cut()  # one connection lost: both fail
        lost = await asyncio.gather(*calls, return_exceptions=True)
        # No connection now: both wait in the backlog of one connect that fails.
        calls = [asyncio.create_task(lock.is_locked()) for _ in range(2)]
        refused = await asyncio.gather(*calls, return_exceptions=True)
        for first, second in (lost, refused):
            assert isinstance(first, ConnectionFailedError), repr(first)
            assert isinstance(second, ConnectionFailedError), repr(second)
            assert first is not second
            assert first.__cause__ is second.__cause__ is not None
        proxy.restore()
        await assert_clean(client)


async def test_pubsub_link_dropped_right_after_subscribing_backs_off(server: RedisServer) -> None:
    """A pub/sub link the server accepts and drops at once (an output buffer
    limit, a proxy) is retried with a growing pause, not in a tight loop: only
    a link that served a whole health interval makes the next attempt quick."""
    async with (
        Client.from_url(server.url, prefix="fb") as holder,
        Client.from_url(server.url, prefix="fb") as waiter,
    ):
        listener = seam.listener(waiter)
        listener._health_interval = 3600.0  # no session here lasts that long
        held = await holder.lock("k").acquire()
        task = asyncio.create_task(waiter.lock("k").acquire())
        name = f"fb:{{k}}:w:{waiter.id}".encode()
        await eventually(lambda: listener.channels.get(name) is not None, what="the channel")
        channel = listener.channels[name]
        for drop in range(1, 4):
            await eventually(lambda: channel.is_confirmed, what=f"subscription {drop}")
            assert server.kill_pubsub_clients() >= 1
            await eventually(
                lambda drop=drop: listener.connects >= drop + 1,  # type: ignore[misc]
                timeout=30,
                what=f"reconnect {drop}",
            )
        # Three short-lived links in a row: 0.05, 0.1, then 0.2 s between attempts.
        assert listener._dialer._delay == pytest.approx(0.2)
        await held.release()
        await (await asyncio.wait_for(task, 30)).release()
        await assert_clean(holder, waiter)
