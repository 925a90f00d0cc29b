"""The pub/sub connection's wire protocol: its replies parsed with hiredis as bytes arrive.

Each reply is handed on at once (a woken waiter runs on the next loop turn,
with no listener task step between): an error reply to ``refused``, any other
to ``dispatch`` (``Listener._refused`` and ``Listener._dispatch``, which match
it to the (un)subscriptions due and wake the channels).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError

from ..transport.dialer import Link
from ..transport.hiredis import hiredis

__all__ = ["PubSubProtocol"]

log = logging.getLogger("aiolock.listener")


class PubSubProtocol(asyncio.Protocol):
    """Parses the pub/sub connection's replies with hiredis as bytes arrive and
    hands each to ``dispatch`` (an error reply to ``refused``); ``ended`` fails
    when the link does."""

    def __init__(
        self,
        dispatch: Callable[[object], None],
        refused: Callable[[Exception], None],
        link: Link,
        ended: asyncio.Future[None],
    ) -> None:
        self._dispatch = dispatch
        self._refused = refused
        self._link = link
        self._ended = ended
        self._parser = hiredis.Reader()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        while True:
            try:
                reply = parser.gets()
            except Exception as exc:  # a protocol error: the stream is unusable
                self._end(f"bad reply from Redis: {exc}")
                self._link.abort()
                return
            if reply is False:
                return
            if isinstance(reply, hiredis.ReplyError):
                self._refused(reply)
                continue
            try:
                self._dispatch(reply)
            except Exception:
                log.exception("dispatching the pub/sub message %r failed", reply)

    def eof_received(self) -> bool | None:
        self._end("Redis closed the pub/sub connection")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(f"pub/sub connection lost: {exc}" if exc else "pub/sub connection closed")

    def _end(self, reason: str) -> None:
        if not self._ended.done():
            self._ended.set_exception(RedisConnectionError(reason))
