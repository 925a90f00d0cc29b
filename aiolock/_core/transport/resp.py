"""RESP on a command connection: commands encoded, replies parsed with hiredis as bytes arrive.

``pack`` encodes one command; ``ReplyProtocol`` feeds what the server sends
to ``hiredis.Reader`` and hands each reply (an error reply made the
AiolockError that ``reply_error`` names) to its connection, in order
(``connection.py``'s ``CommandConnection``).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Protocol

from redis.exceptions import (
    BusyLoadingError,
    MasterDownError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from ..capabilities import STANDALONE, Capabilities
from ..errors import (
    MasterChangedError,
    ServerUnavailableError,
    UnsupportedServerError,
    from_redis,
)
from .dialer import Link
from .hiredis import hiredis

__all__ = ["Replies", "ReplyProtocol", "pack", "reply_error"]

# redis-py's class for an error reply, by its code (as redis-py's parser picks
# it); the reply's full text is kept as the message.
_REPLY_CLASSES: dict[str, type[ResponseError] | type[BusyLoadingError]] = {
    "LOADING": BusyLoadingError,
    "MASTERDOWN": MasterDownError,
    "TRYAGAIN": TryAgainError,
}


#: hiredis' C encoder (hiredis 2.1+), for long commands: a watchdog batch of
#: 2,000 holds (6,000 arguments) costs 0.4 ms instead of 1.2 ms of one loop turn.
_PACK_COMMAND = getattr(hiredis, "pack_command", None)
_LONG = 64


def pack(args: tuple[Any, ...]) -> bytes:
    """RESP-encode one command (bytes, str, int and float arguments)."""
    if len(args) > _LONG and _PACK_COMMAND is not None:
        try:
            return _PACK_COMMAND(args)  # type: ignore[no-any-return]
        except TypeError:
            pass  # an argument of another type: refused below, with its name
    parts = [b"*%d\r\n" % len(args)]
    append = parts.append
    for arg in args:
        kind = type(arg)
        if kind is bytes:
            data = arg
        elif kind is str:
            data = arg.encode()
        elif kind is int:
            data = b"%d" % arg
        elif isinstance(arg, bytes | str | int | float) and not isinstance(arg, bool):
            data = arg if isinstance(arg, bytes) else str(arg).encode()  # subclasses, floats
        else:
            raise TypeError(f"cannot send {type(arg).__name__} to Redis: {arg!r}")
        append(b"$%d\r\n" % len(data))
        append(data)
        append(b"\r\n")
    return b"".join(parts)


#: A replica's refusal of a write: the reply's code, or inside a script's
#: error ("ERR Error running script ...: -READONLY You can't write...").
_READONLY = re.compile(r"(?:^|-)READONLY\b")


def reply_error(
    reply: Exception, redirects: bool = True, capabilities: Capabilities = STANDALONE
) -> Exception:
    """The exception for an error reply: ServerUnavailableError for a server that cannot serve for a
    while (LOADING, BUSY, MASTERDOWN, TRYAGAIN: retried like an outage; MOVED,
    ASK, CLUSTERDOWN: followed by a cluster lane), else a ServerRefusedError
    (WrongTypeError); caused by redis-py's exception. Without ``redirects`` (a
    standalone connection), MOVED or ASK is an UnsupportedServerError: the
    server is a cluster node, and retrying would never reach the key's node."""
    message = str(reply)
    if capabilities.follows_master and _READONLY.search(message):
        changed = MasterChangedError(f"{message} (the server was made a replica)")
        failed = from_redis(changed)
        failed.__cause__ = changed
        return failed
    if not redirects and message.startswith(("MOVED ", "ASK ")):
        error: Exception = UnsupportedServerError(
            f"this server is a Redis Cluster node: it answered {message!r} (the key is "
            "served by another node), and this Client runs in standalone mode "
            "(cluster=False). Use cluster=True or None (Client.from_url(url) finds out "
            "by itself), or pass a redis.asyncio.RedisCluster. The command did not run"
        )
        error.__cause__ = ResponseError(message)
        return error
    cls = _REPLY_CLASSES.get(message.split(" ", 1)[0], ResponseError)
    cause = cls(message)
    error = from_redis(cause)
    error.__cause__ = cause
    return error

class Replies(Protocol):
    """What a ``ReplyProtocol`` hands its replies to (a ``CommandConnection``)."""

    redirects: bool
    capabilities: Capabilities

    def _deliver(self, reply: Any, error: BaseException | None) -> None: ...

    def _drop(self, error: BaseException, link: Link | None = None) -> None: ...


class ReplyProtocol(asyncio.Protocol):
    """Parses replies with hiredis as bytes arrive; each resolves one future."""

    def __init__(self, owner: Replies, link: Link) -> None:
        self._owner = owner
        self._link = link
        self._parser = hiredis.Reader()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        owner = self._owner
        while True:
            try:
                reply = parser.gets()
            except Exception as exc:  # a protocol error: the stream is unusable
                owner._drop(RedisConnectionError(f"bad reply from Redis: {exc}"), self._link)
                return
            if reply is False:
                return
            if isinstance(reply, hiredis.ReplyError):
                error = reply_error(reply, owner.redirects, owner.capabilities)
                owner._deliver(None, error)
                if isinstance(error, ServerUnavailableError) and error.code == "READONLY":
                    # A demoted master: the rest of its replies are not wanted
                    # (their commands fail as on a lost connection), and the
                    # next connect asks the Sentinels for the master.
                    owner._drop(RedisConnectionError(str(reply)), self._link)
                    return
            else:
                owner._deliver(reply, None)

    def eof_received(self) -> bool | None:
        self._owner._drop(RedisConnectionError("Redis closed the connection"), self._link)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection to Redis lost: {exc}" if exc else "connection to Redis closed"
        self._owner._drop(RedisConnectionError(reason), self._link)
