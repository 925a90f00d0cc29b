"""Bugs users found at a Client's edges: closing from the wrong loop, an idle pub/sub link."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aiolock import Client, ClientClosedError, WrongEventLoopError
from aiolock.testing import seam
from tests.core_util import cancel_after_turns, eventually
from tests.servers import RedisServer


def _connections_named(server: RedisServer, client: Client) -> int:
    """The Client's connections the server still lists (they carry its id in their name)."""
    listing = str(server.execute("CLIENT", "LIST"))
    return listing.count(f"name=aiolock:{client.id[:12]} ")


async def test_aclose_from_another_loop_leaves_the_client_to_close_properly(
    server: RedisServer,
) -> None:
    """A wrong-loop aclose() raises and changes nothing; the right loop's aclose()
    then stops the listener and the watchdog, fails the waiters and releases the holds."""
    other = Client.from_url(server.url, prefix="e")
    client = Client.from_url(server.url, prefix="e")
    try:
        lease = await client.lock("held").acquire()  # a watchdog hold (the 30 s lease)
        blocker = await other.lock("busy").acquire()
        waiter = asyncio.create_task(client.lock("busy").acquire())  # its listener connects
        await eventually(lambda: seam.listener(client).connected, what="the listener to connect")
        await eventually(lambda: client.statistics().waiting == 1, what="the waiter to park")
        listener_task = seam.listener(client)._task
        watchdog_task = seam.watchdog(client)._task
        assert listener_task is not None and watchdog_task is not None

        with pytest.raises(WrongEventLoopError):
            await asyncio.to_thread(asyncio.run, client.aclose())

        # Nothing changed: the Client runs on, the lock is still held and renewed.
        assert not client.closed
        assert not lease.lost and not waiter.done()
        assert not listener_task.done() and not watchdog_task.done()
        assert client.statistics().watched == 1
        assert int(server.execute("EXISTS", "e:{held}")) == 1

        await client.aclose()
        assert client.closed
        assert listener_task.done() and watchdog_task.done()
        assert lease.lost
        with pytest.raises(ClientClosedError):
            await waiter
        assert int(server.execute("EXISTS", "e:{held}")) == 0, "the hold was not released"
        await eventually(
            lambda: _connections_named(server, client) == 0,
            what="the server to see every connection of the closed Client gone",
        )
        await blocker.release()
    finally:
        await client.aclose()
        await other.aclose()


#: A ping unanswered for a whole interval kills the link: long enough that a
#: loaded machine's scheduling delays (1-2 s) do not pass for a dead server.
HEALTH_INTERVAL = 3.0


async def test_idle_pubsub_connection_is_not_reconnected(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """With no channel left, Redis answers the health check's PING with a plain
    +PONG: the listener must take it as an answer and keep the link."""
    caplog.set_level(logging.WARNING, logger="aiolock")
    async with (
        Client.from_url(server.url, prefix="h") as other,
        Client.from_url(server.url, prefix="h") as client,
    ):
        listener = seam.listener(client)
        listener._health_interval = HEALTH_INTERVAL  # read when its session starts

        async def contended_acquire_release() -> None:
            # ``client`` only waits, and gives up: a Client that held a lock
            # keeps its eviction channel (evict.py), so its link is never idle.
            held = await other.lock("k").acquire()
            waiter = asyncio.create_task(client.lock("k").acquire())
            await eventually(
                lambda: any(c.is_confirmed for c in listener.channels.values()),
                what="the waiter's subscription to be confirmed",
            )
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await held.release()

        await contended_acquire_release()
        assert client.statistics().pubsub_connects == 1
        # The channel lingers a second, then is unsubscribed: the link is idle.
        await eventually(
            lambda: not listener.channels and not listener._expect,
            timeout=listener.LINGER + 10,
            what="every channel to be unsubscribed",
        )
        # Three health checks on the idle link. Without the fix the second one
        # finds its ping unanswered and drops the connection.
        for check in range(3):
            handle = listener._health_handle
            await eventually(
                lambda handle=handle: listener._health_handle is not handle,  # type: ignore[misc]
                timeout=HEALTH_INTERVAL + 10,
                what=f"health check {check + 1}",
            )
            assert listener.connected, f"the idle link was dropped at health check {check + 1}"
        assert client.statistics().pubsub_connects == 1
        # The next wait uses the same link.
        await contended_acquire_release()
        assert client.statistics().pubsub_connects == 1
    # aiolock's own warnings (a reconnect, a failed health check). asyncio's
    # debug-mode "Executing ... took 0.1 s" notes are about the machine's load.
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("aiolock")
    ]
    assert warnings == []


@pytest.mark.parametrize("turns", range(0, 12, 2))
async def test_a_cancelled_aclose_still_closes(server: RedisServer, turns: int) -> None:
    """aclose() cancelled after ``turns`` loop turns (while it releases, stops
    its tasks or closes its connections): the closing goes on to its end, a
    second aclose() waits for it, and then the hold is released in Redis, the
    waiter told, and no connection of the Client is left on the server."""
    client = Client.from_url(server.url, cluster=False)
    await client.lock("a").acquire()
    other = asyncio.create_task(client.lock("a").acquire())  # a local waiter
    await eventually(lambda: client.statistics().waiting == 1, what="the waiter")
    await cancel_after_turns(client.aclose(), turns)
    assert client.closed or turns == 0  # (cancelled before it began: nothing happened)
    await client.aclose()  # waits for the closing under way
    with pytest.raises(ClientClosedError):
        await other
    assert server.execute("EXISTS", "aiolock:{a}") == 0
    await eventually(
        lambda: _connections_named(server, client) == 0, what="no connection of the Client"
    )
