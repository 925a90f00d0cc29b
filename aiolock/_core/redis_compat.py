"""Everything aiolock relies on from redis-py's connection objects, in one place.

aiolock uses redis-py for what it does well and what users configure through
it: the connection settings of the ``redis.asyncio.Redis`` they pass in (host
or unix socket, TLS, username and password or a credential provider, db), and
the handshake those settings call for (AUTH or HELLO, CLIENT SETNAME, SELECT,
the TLS handshake). Once that ran, aiolock takes the socket's transport and
reads it with its own protocols (see ``dialer``): redis-py's command retries,
socket timeouts and reader task are never on aiolock's paths.

The contact:

* ``connection_factory``: the pool's ``connection_class`` and
  ``connection_kwargs`` (public), with aiolock's overrides (keyword names of
  ``AbstractConnection.__init__``);
* ``connect``: ``AbstractConnection.connect()`` (public) runs the handshake,
  then the **private** ``_writer`` attribute gives the transport. This is the
  one place that reads a private attribute of redis-py;
* ``disconnect``: ``AbstractConnection.disconnect(nowait=True)`` (public).

``tests/test_redis_compat.py`` checks each of these against real servers, so
that a redis-py release that changes one fails there, naming it, rather than
somewhere deep in a lock test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

__all__ = [
    "ConnectionFactory",
    "connect",
    "connection_factory",
    "disconnect",
    "node_connection_factory",
]

#: Builds a new, unconnected redis-py connection with aiolock's settings.
ConnectionFactory = Callable[[], AbstractConnection]


def connection_factory(client: aioredis.Redis, client_name: str) -> ConnectionFactory:
    """A factory of connections with ``client``'s settings, as aiolock needs them:
    raw bytes, RESP2, no socket read timeout (aiolock checks liveness itself),
    never retried behind aiolock's back, and named ``client_name`` on the server.

    The pool's settings are read at each call, as the pool would.
    """
    pool = client.connection_pool

    def new_connection() -> AbstractConnection:
        return _new(pool.connection_class, pool.connection_kwargs, client_name)

    return new_connection


def node_connection_factory(node: ClusterNode, client_name: str) -> ConnectionFactory:
    """``connection_factory`` for one node of a ``redis.asyncio.RedisCluster``: its
    ``ClusterNode``'s ``connection_class`` and ``connection_kwargs`` (public), the
    cluster client's credentials and TLS settings."""

    def new_connection() -> AbstractConnection:
        return _new(node.connection_class, node.connection_kwargs, client_name)

    return new_connection


def _new(cls: type[AbstractConnection], settings: dict[str, Any], name: str) -> AbstractConnection:
    kwargs = dict(settings)
    kwargs.update(
        socket_timeout=None,
        decode_responses=False,
        protocol=2,
        retry=None,
        client_name=name,
    )
    kwargs.pop("connection_pool", None)
    kwargs.pop("connection_class", None)
    return cls(**kwargs)


async def connect(conn: AbstractConnection) -> asyncio.WriteTransport:
    """Connect ``conn`` with its handshake and hand over its socket's transport.

    The caller sets its own protocol on the transport (the replies to the
    handshake have all been read) and closes it with :func:`disconnect`, also
    when this raised.
    Raises redis-py's exceptions as its ``connect()`` does over TCP
    (``ConnectionError``, ``AuthenticationError``, ``ResponseError``...).
    """
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
    except RedisConnectionError as exc:
        # A unix socket connection runs its handshake inside its socket
        # connect, where redis-py wraps any error in a plain ConnectionError:
        # a refused AUTH (or SELECT) is a refusal there too, as over TCP.
        cause = exc.__cause__
        if type(exc) is RedisConnectionError and isinstance(cause, RedisError):
            raise cause from None
        raise
    # redis-py offers no public way to the transport: its stream writer is
    # the private `_writer` (set by every connection class's `_connect`).
    writer = getattr(conn, "_writer", None)
    if not isinstance(writer, asyncio.StreamWriter):
        raise RedisConnectionError(
            f"redis-py {redis.__version__}: {type(conn).__name__}._writer is "
            f"{type(writer).__name__} after connect(), not an asyncio.StreamWriter; "
            "this aiolock does not support this redis-py version"
        )
    return writer.transport


async def disconnect(conn: AbstractConnection) -> None:
    """Close ``conn``'s socket. ``nowait``: once another protocol took the
    transport, redis-py's stream never learns that it closed, so waiting for
    that would wait for ever."""
    await conn.disconnect(nowait=True)
