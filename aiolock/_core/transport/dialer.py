"""How aiolock opens a connection: one path for every connection of a Client.

Every connection an Engine has (the command connection, the watchdog's
renewal connection, the pub/sub listener's, and the BLPOP connections of
``notify="list"``) is opened by a :class:`Dialer`, the same way:

1. make a redis-py connection with the Client's settings (the engine's
   factory, see ``redis_compat.connection_factory``);
2. connect it with its handshake (AUTH, SELECT, CLIENT SETNAME, TLS...: see
   ``redis_compat.connect``) within a time bound, since a paused server may
   accept a connection and never answer;
3. hand its socket's transport to one of aiolock's protocols, which parse
   replies with hiredis as the bytes arrive (no reader task, no loop turn
   between a reply and its caller);
4. count the connect, and report the reset when an established connection is
   lost (the engine's connection epoch: the server behind the next
   connection may have lost every key);
5. for owners that reconnect in a loop (the listener, the BLPOP loops):
   capped exponential backoff, with jitter, between failed attempts;
6. log an outage once (``outage.Outage``): one WARNING when the connection
   is lost or a connect fails after it worked (which connection, to which
   server, why), nothing for the further failed attempts but a count, and
   one INFO when a connect succeeds again, with the downtime and the count.

Errors are redis-py's exceptions (a connect that ran out of time is a
redis-py ``ConnectionError``); owners turn them into AiolockErrors with
``errors.from_redis`` where they reach a caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError

from ..outage import Outage
from . import redis_compat
from .redis_compat import Connection, ConnectionFactory

__all__ = ["Dialer", "Link"]


class Link:
    """One open connection: the transport aiolock's protocol reads, and
    redis-py's connection object, kept to close it."""

    __slots__ = ("_conn", "transport")

    def __init__(self, conn: Connection, transport: asyncio.WriteTransport) -> None:
        self._conn = conn
        self.transport = transport

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def abort(self) -> None:
        """Close the socket at once (unsent data is dropped)."""
        self.transport.abort()

    async def close(self) -> None:
        await redis_compat.disconnect(self._conn)


class Dialer:
    """Opens the connections of one owner (a command connection, the listener,
    a BLPOP loop), counts them, reports resets, paces reconnects, and logs
    outages (once each).

    ``role`` names the connection in messages ("command", "renewal",
    "pub/sub", "BLPOP"...), ``log`` is where they go (None: nowhere, for
    short-lived probes whose owner reports failures itself). ``outage``
    may be shared by several dialers of one kind (the BLPOP connections:
    one line per outage, not one per key). ``back_note`` adds to the
    recovery line (the listener: how many channels it resubscribes)."""

    __slots__ = (
        "_back_note",
        "_backoff_cap",
        "_delay",
        "_factory",
        "_log",
        "_on_reset",
        "address",
        "connects",
        "outage",
        "role",
    )

    def __init__(
        self,
        factory: ConnectionFactory,
        *,
        on_reset: Callable[[], None] | None = None,
        backoff_cap: float = 2.0,
        role: str = "command",
        log: logging.Logger | None = None,
        outage: Outage | None = None,
        back_note: Callable[[], str] | None = None,
    ) -> None:
        self._factory = factory
        self._on_reset = on_reset
        self._backoff_cap = backoff_cap
        self._delay = 0.0
        self.connects = 0
        self.role = role
        self._log = log
        self.outage = Outage() if outage is None else outage
        self._back_note = back_note
        #: The server the last connection (or attempt) was to, for messages.
        self.address = "?"

    async def open(self, protocol: Callable[[Link], asyncio.Protocol], timeout: float) -> Link:
        """Connect a new connection, handshake included, within ``timeout``
        seconds, and read it with ``protocol(link)`` from now on.

        Sentinel mode: while the Sentinels name no master, or name one that
        says it is not (``redis_compat.NOT_MASTER``: a failover under way),
        it tries again after a short backoff (50 ms doubling to 500 ms), and
        raises that error if no master was reached within ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.05
        not_master: BaseException | None = None
        while True:
            conn = self._factory()
            try:
                try:
                    async with asyncio.timeout_at(deadline):
                        transport = await redis_compat.connect(conn)
                finally:
                    self.address = redis_compat.address(conn)
                break
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await redis_compat.disconnect(conn)
                if isinstance(exc, redis_compat.NOT_MASTER):
                    not_master = exc
                    if loop.time() + delay < deadline:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 0.5)
                        continue
                    self._failed_connect(exc)
                    raise
                if isinstance(exc, TimeoutError):
                    if not_master is not None:
                        self._failed_connect(not_master)
                        raise not_master from None
                    error = RedisConnectionError(f"could not connect to Redis within {timeout:g} s")
                    self._failed_connect(error)
                    raise error from None
                if isinstance(exc, Exception):
                    self._failed_connect(exc)
                raise
        link = Link(conn, transport)
        # No await from here to the caller: the protocol sees every byte, and
        # the caller records the link before any of its callbacks can run.
        transport.set_protocol(protocol(link))
        self.connects += 1
        run = self.outage.ended()
        log = self._log
        if run is not None and log is not None:
            log.info(
                "%s connection to %s back after %.1f s; %d connect attempts failed meanwhile%s",
                self.role,
                self.address,
                run.seconds,
                run.noted,  # (the connects that failed: see _failed_connect)
                self._back_note() if self._back_note is not None else "",
            )
        return link

    def _failed_connect(self, exc: BaseException) -> None:
        first = self.outage.failed()
        self.outage.note()  # counts the failed connects (a shared outage: of every dialer)
        if first and self._log is not None:
            self._log.warning(
                "%s connection to %s failed (%s); retrying until it answers",
                self.role,
                self.address,
                exc,
            )

    def lost(self, reason: object = None) -> None:
        """An established connection was lost (not closed by its owner)."""
        if self.outage.failed() and self._log is not None:
            self._log.warning(
                "%s connection to %s lost (%s); reconnecting",
                self.role,
                self.address,
                reason or "closed",
            )
        if self._on_reset is not None:
            self._on_reset()

    # -- pacing reconnects (for owners that reconnect in a loop) ------------------

    async def pause(self) -> None:
        """Wait before the next attempt if the last ones failed."""
        if self._delay:
            await asyncio.sleep(self._delay * random.uniform(0.5, 1.0))

    def failed(self) -> None:
        """An attempt failed, or its connection was lost: wait longer before the next."""
        self._delay = min(max(self._delay * 2, 0.05), self._backoff_cap)

    def proven(self) -> None:
        """The connection answered: the next attempt after a loss waits little."""
        self._delay = 0.0
