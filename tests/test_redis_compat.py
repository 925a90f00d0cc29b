"""What aiolock relies on from redis-py's connection objects
(``aiolock/_core/transport/redis_compat.py``).

aiolock lets redis-py open each connection (socket or unix socket, TLS, the
handshake: AUTH, SELECT, CLIENT SETNAME), then takes the socket's transport
over with its own hiredis protocol. The transport is reached through a
private attribute, ``_writer``. If a redis-py release changes any of this,
these tests fail and say what changed, rather than a lock test failing in a
way that points nowhere. (TLS goes through the same ``_writer``: the
``rediss://`` test in ``test_connecting.py`` runs it end to end.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hiredis
import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError

from aiolock import ServerRefusedError
from aiolock._core.errors import from_redis
from aiolock._core.transport import redis_compat
from aiolock._core.transport.resp import pack
from tests.servers import RedisServer, ServerKind, ServerProcess, binary_for

REDIS_PY = f"redis-py {redis.__version__}"
NAME = "aiolock:compat-test"
PASSWORD = "s3cret"
DB = 3


class Replies(asyncio.Protocol):
    """Reads a taken-over transport the way aiolock does: hiredis, as bytes arrive."""

    def __init__(self) -> None:
        self._parser = hiredis.Reader()
        self._replies: asyncio.Queue[Any] = asyncio.Queue()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        while (reply := self._parser.gets()) is not False:
            self._replies.put_nowait(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)

    async def next(self) -> Any:
        return await asyncio.wait_for(self._replies.get(), 10)


def client_info(reply: bytes) -> dict[str, str]:
    """``CLIENT INFO``'s ``key=value`` fields."""
    return dict(field.partition("=")[::2] for field in reply.decode().split())


async def open_with(url: str) -> tuple[AbstractConnection, asyncio.WriteTransport]:
    """A connection from ``url``'s settings as the Engine makes it, connected by redis_compat."""
    client = aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=0.5, protocol=3)
    try:
        conn = redis_compat.connection_factory(client, NAME)()
    finally:
        await client.aclose()
    return conn, await asyncio.wait_for(redis_compat.connect(conn), 10)


async def check_handshake_and_takeover(url: str, via: str) -> None:
    """Everything redis_compat relies on, for one connection made from ``url``."""
    conn, transport = await open_with(url)
    try:
        # aiolock's overrides of the user's settings are accepted (the keyword
        # names of AbstractConnection.__init__) and kept where the handshake reads them.
        assert conn.client_name == NAME, f"{REDIS_PY}: client_name= is no longer kept"
        assert conn.protocol == 2, f"{REDIS_PY}: protocol=2 is no longer kept"
        assert conn.socket_timeout is None, f"{REDIS_PY}: socket_timeout=None is no longer kept"
        assert conn.retry.get_retries() == 0, f"{REDIS_PY}: retry=None no longer means no retry"
        # The one private attribute: connect() left the stream writer in `_writer`,
        # and its transport is what redis_compat.connect() handed over.
        writer = getattr(conn, "_writer", None)
        assert isinstance(writer, asyncio.StreamWriter), (
            f"{REDIS_PY}: {type(conn).__name__}._writer is {type(writer).__name__} after "
            "connect(), not an asyncio.StreamWriter: update "
            "aiolock/_core/transport/redis_compat.connect"
        )
        assert writer.transport is transport
        assert conn.is_connected

        replies = Replies()
        transport.set_protocol(replies)
        transport.write(pack((b"PING",)) + pack((b"CLIENT", b"INFO")) + pack((b"DBSIZE",)))
        # The handshake's replies were all read by redis-py: the first reply
        # on the taken-over transport answers our first command.
        first = await replies.next()
        assert first == b"PONG", (
            f"{REDIS_PY} left a handshake reply unread on the transport ({via}): got {first!r}"
        )
        # The handshake ran: AUTH (no NOAUTH above), CLIENT SETNAME, SELECT, RESP2.
        info = client_info(await replies.next())
        assert info.get("name") == NAME, f"{REDIS_PY} did not run CLIENT SETNAME ({via}): {info}"
        assert info.get("db") == str(DB), f"{REDIS_PY} did not run SELECT {DB} ({via}): {info}"
        if "resp" in info:  # Redis >= 7, Valkey
            assert info["resp"] == "2", f"{REDIS_PY} did not stay on RESP2 ({via}): {info}"
        assert isinstance(await replies.next(), int)
    finally:
        # disconnect() closes the socket even though redis-py's stream no
        # longer reads it, and returns at once (nowait).
        await asyncio.wait_for(redis_compat.disconnect(conn), 5)
    assert not conn.is_connected, f"{REDIS_PY}: disconnect() left the connection open"
    await asyncio.wait_for(replies.lost, 5)


async def check_refusals(url: str, wrong_url: str) -> None:
    """A refused AUTH raises redis-py's AuthenticationError, which errors.from_redis
    turns into the ServerRefusedError (NOAUTH / WRONGPASS) that users see."""
    for bad, code in ((url, "NOAUTH"), (wrong_url, "WRONGPASS")):
        with pytest.raises(AuthenticationError) as caught:
            conn, _ = await open_with(bad)
            await redis_compat.disconnect(conn)  # (not reached)
        error = from_redis(caught.value)
        assert isinstance(error, ServerRefusedError) and error.code == code, (
            f"{REDIS_PY}: {type(caught.value).__name__}({caught.value}) no longer maps to {code}"
        )


@pytest.fixture(params=["redis", "valkey"])
def protected(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A server of its own that wants a password, on TCP and on a unix socket:
    its ``host:port`` and its socket's path."""
    kind: ServerKind = request.param
    if (binary := binary_for(kind)) is None:
        pytest.skip(f"no {kind}-server binary")
    sock = tmp_path / "r.sock"
    with ServerProcess(kind, binary, extra_args=("--unixsocket", str(sock))) as server:
        server.execute("CONFIG", "SET", "requirepass", PASSWORD)
        yield f"{server.host}:{server.port}", sock


async def test_handshake_and_transport_takeover(protected: tuple[str, Path]) -> None:
    """Over TCP and a unix socket (each redis-py class sets `_writer` itself), with
    a password and a db: the handshake ran, and the transport is aiolock's to read."""
    address, sock = protected
    await check_handshake_and_takeover(f"redis://:{PASSWORD}@{address}/{DB}", "tcp")
    await check_handshake_and_takeover(f"unix://:{PASSWORD}@{sock}?db={DB}", "unix socket")
    await check_refusals(f"redis://{address}/{DB}", f"redis://:wrong@{address}/{DB}")
    await check_refusals(f"unix://{sock}?db={DB}", f"unix://:wrong@{sock}?db={DB}")


async def test_connect_names_what_is_missing(server: RedisServer) -> None:
    """If redis-py stops keeping its stream writer in `_writer`, redis_compat.connect()
    fails at once, saying so (and the Client's error names it), never later."""
    client = aioredis.Redis.from_url(server.url)
    try:
        conn = redis_compat.connection_factory(client, NAME)()
    finally:
        await client.aclose()
    real_connect: Callable[[], Any] = conn.connect
    hidden: list[asyncio.StreamWriter] = []

    async def connect_and_hide_the_writer() -> None:  # as if redis-py renamed it
        await real_connect()
        hidden.append(conn._writer)  # type: ignore[arg-type]
        conn._writer = None

    conn.connect = connect_and_hide_the_writer  # type: ignore[method-assign]
    try:
        with pytest.raises(RedisConnectionError, match=r"\._writer is NoneType after connect"):
            await redis_compat.connect(conn)
    finally:
        for writer in hidden:
            writer.close()
        conn._reader = None


# -- cluster mode: what aiolock/_core/topology/cluster.py relies on ---------------------


async def test_cluster_discovery_and_node_connections(cluster: Any) -> None:
    """Cluster mode takes three things from redis-py: ``key_slot`` (the slot of
    a key, hash tags included), ``NodesManager.initialize()`` and its
    ``slots_cache`` (the slot map, from CLUSTER SLOTS), and each
    ``ClusterNode``'s ``connection_class`` / ``connection_kwargs``, from which
    ``redis_compat.node_connection_factory`` makes aiolock's own connections."""
    from redis.asyncio.cluster import RedisCluster
    from redis.crc import key_slot

    assert key_slot(b"aiolock:{x}:fence") == key_slot(b"{x}") == key_slot(b"x"), (
        f"{REDIS_PY}: key_slot no longer honours hash tags"
    )
    seed = RedisCluster.from_url(cluster.url)
    try:
        slot = key_slot(b"aiolock:{compat}")
        expected = cluster.master_for_slot(slot)
        for first in (True, False):  # the first read, and a refresh
            masters = await redis_compat.read_slot_map(seed, first)
            assert len(masters) == 16384, f"{REDIS_PY}: slots_cache no longer maps every slot"
            node = masters[slot]
            assert node.name == f"127.0.0.1:{expected.port}", (
                f"{REDIS_PY}: slots_cache[slot][0] is no longer the slot's master"
            )
        made = redis_compat.cluster_node(seed, "127.0.0.1", expected.port)
        assert made.name == node.name and made.connection_kwargs == node.connection_kwargs, (
            f"{REDIS_PY}: nodes_manager.connection_kwargs no longer make a node like the map's"
        )
        conn = redis_compat.node_connection_factory(node, NAME)()
        assert conn.client_name == NAME and conn.protocol == 2 and conn.socket_timeout is None
        transport = await asyncio.wait_for(redis_compat.connect(conn), 10)
        try:
            replies = Replies()
            transport.set_protocol(replies)
            transport.write(pack((b"CLIENT", b"INFO")))
            info = client_info(await replies.next())
            assert info.get("name") == NAME, f"{REDIS_PY}: a node connection lost its name"
        finally:
            await asyncio.wait_for(redis_compat.disconnect(conn), 5)
    finally:
        await seed.aclose()


# -- Sentinel mode (i12-sentinel) ---------------------------------------------------------


async def test_sentinel_managed_connections(sentinel_set: Any) -> None:
    """A ``Sentinel(...).master_for(service)`` client: its pool is a
    ``SentinelConnectionPool`` with public ``service_name``,
    ``sentinel_manager`` (its ``sentinels``: one Redis per Sentinel, their
    ``connection_kwargs`` with host and port) and ``master_address``; its
    ``connection_kwargs`` carry the pool, which a ``SentinelManagedConnection``
    asks for the master on ``connect()``; ``send_command``/``read_response``
    run ROLE before the takeover; ``Sentinel.aclose()`` closes the Sentinels'
    clients."""
    from redis.asyncio.sentinel import SentinelConnectionPool, SentinelManagedConnection

    sentinel = aioredis.Sentinel(sentinel_set.sentinel_addresses)  # type: ignore[no-untyped-call]
    master = sentinel.master_for(sentinel_set.service)
    try:
        pool = master.connection_pool
        assert isinstance(pool, SentinelConnectionPool), f"{REDIS_PY}: {type(pool)}"
        assert "connection_pool" in pool.connection_kwargs, REDIS_PY
        service = redis_compat.sentinel_service(master)
        assert service is not None
        assert service.name == sentinel_set.service
        assert service.master_address is None  # no connect yet
        assert sorted(service.addresses) == sorted(
            f"{h}:{p}" for h, p in sentinel_set.sentinel_addresses
        ), REDIS_PY
        conn = redis_compat.connection_factory(master, NAME)()
        assert isinstance(conn, SentinelManagedConnection), REDIS_PY
        try:
            transport = await redis_compat.connect(conn)  # asks the Sentinels, checks ROLE
            assert (conn.host, conn.port) == ("127.0.0.1", sentinel_set.master.port)
            assert service.master_address == ("127.0.0.1", sentinel_set.master.port), REDIS_PY
            replies = Replies()
            transport.set_protocol(replies)
            transport.write(pack((b"ROLE",)))
            assert (await replies.next())[0] == b"master"
        finally:
            await redis_compat.disconnect(conn)
        # One factory per Sentinel: plain connections that run SENTINEL commands.
        for factory in service.factories(NAME):
            sconn = factory()
            try:
                transport = await redis_compat.connect(sconn)
                replies = Replies()
                transport.set_protocol(replies)
                transport.write(
                    pack((b"SENTINEL", b"get-master-addr-by-name", service.name.encode()))
                )
                _, port = await replies.next()
                assert int(port) == sentinel_set.master.port
            finally:
                await redis_compat.disconnect(sconn)
        # A master the Sentinels no longer name is refused like a replica.
        service.expect(("127.0.0.1", sentinel_set.master.port))
        service.expect(("127.0.0.1", sentinel_set.replicas[0].port))
        conn = redis_compat.connection_factory(master, NAME)()
        try:
            with pytest.raises(redis_compat.NOT_MASTER, match="now name"):
                await redis_compat.connect(conn)
        finally:
            service.expect(("127.0.0.1", sentinel_set.master.port))
            await redis_compat.disconnect(conn)
    finally:
        await master.aclose()
        await sentinel.aclose()
