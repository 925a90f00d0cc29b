"""Servers and fault injection for the failover section (issue 12, item 5).

- ``start_replicated`` / ``start_masters``: a master with one replica (replicating
  directly, for the cost of ``replicas=1``) and independent masters (for Redlock),
  started by the orchestrator from ``_server.Server``.
- ``StallProxy``: the smallest TCP proxy that can stall a replication stream
  (``blackhole()``: bytes are held, nothing is forwarded either way) and drop it
  (``cut()``: every held byte is thrown away and both sides are closed).
- ``loss``: the failover loss experiment, run in one fresh worker process: a
  master whose replica replicates through a ``StallProxy``; per run, stall the
  replica, take a lock on the master, SIGKILL the master, promote the replica
  (``REPLICAOF NO ONE``, what a Sentinel would do), then try the same lock on the
  promoted master from another Client. The killed master comes back empty as the
  replica of the new one (through a new proxy) for the next run.

The test suite has its own fault-injecting proxy (``tests/servers.py``), but it
imports pytest and the benchmark never imports from ``tests/``: this one does
only what the loss table needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from benchmarks._server import ADMIN_NAME, Server

#: Replication without the 5 s diskless-sync delay (an empty data set syncs at once), and
#: a SIGTERM that does not wait up to 10 s for a replica to catch up.
REPL_ARGS = (
    "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", "--shutdown-timeout", "0",
)  # fmt: skip
SYNC_TIMEOUT = 30.0
NS = 1_000_000_000


# --------------------------------------------------------------------------- orchestrator side


def _admin(server: Server) -> redis.Redis:
    return redis.Redis.from_url(server.url, client_name=ADMIN_NAME, socket_timeout=10)


def _in_sync(master: redis.Redis, replica: redis.Redis) -> bool:
    m = master.info("replication")
    r = replica.info("replication")
    return (
        int(m.get("connected_slaves", 0)) >= 1
        and r.get("master_link_status") == "up"
        and not int(r.get("master_sync_in_progress", 0))
        and int(r.get("slave_repl_offset", -1)) == int(m.get("master_repl_offset", -2))
    )


def start_replicated(binary: str | None) -> tuple[Server, Server]:
    """A master and its replica (replicating directly), in sync; both stopped on failure."""
    master = Server(binary, extra_args=REPL_ARGS)
    replica = Server(binary, extra_args=REPL_ARGS)
    try:
        master.start()
        replica.start()
        with _admin(master) as m, _admin(replica) as r:
            r.execute_command("REPLICAOF", "127.0.0.1", master.port)
            deadline = time.monotonic() + SYNC_TIMEOUT
            while not (_in_sync(m, r) and m.set("bench:sync-probe", "1") and m.wait(1, 200) >= 1):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {replica.port} not in sync in {SYNC_TIMEOUT} s")
                time.sleep(0.02)
    except BaseException:
        master.cleanup()
        replica.cleanup()
        raise
    return master, replica


def start_masters(binary: str | None, count: int) -> list[Server]:
    """``count`` independent masters (Redlock's)."""
    servers: list[Server] = []
    try:
        for _ in range(count):
            servers.append(Server(binary))
            servers[-1].start()
    except BaseException:
        for s in servers:
            s.cleanup()
        raise
    return servers


# --------------------------------------------------------------------------- the proxy


class _Side(asyncio.Protocol):
    def __init__(self, proxy: StallProxy) -> None:
        self.proxy = proxy
        # Not typed asyncio.Transport: uvloop's transports are not its subclasses.
        self.transport: Any = None
        self.peer: _Side | None = None
        #: Bytes read but not forwarded: before the peer is connected, or while stalled.
        self.held: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.proxy.sides.add(self)
        if self.proxy.stalled:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self.proxy.stalled or self.peer is None or self.peer.transport is None:
            self.held.append(data)
            return
        self.peer.transport.write(data)

    def flush(self) -> None:
        if self.held and self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(b"".join(self.held))
            self.held.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.sides.discard(self)
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            peer.transport.close()

    def abort(self) -> None:
        self.held.clear()
        if self.transport is not None:
            self.transport.abort()


class StallProxy:
    """A TCP proxy on 127.0.0.1 to ``port``: forwards, stalls (``blackhole``) or drops (``cut``)."""

    def __init__(self, port: int) -> None:
        self.target_port = port
        self.stalled = False
        self.sides: set[_Side] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def _accept(self) -> _Side:
        client = _Side(self)
        task = asyncio.get_running_loop().create_task(self._connect(client))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return client

    async def _connect(self, client: _Side) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(
                lambda: _Side(self), "127.0.0.1", self.target_port
            )
        except OSError:
            client.abort()
            return
        upstream.peer, client.peer = client, upstream
        if not self.stalled:
            client.flush()

    def blackhole(self) -> None:
        """Forward nothing either way from now on; connections stay open."""
        self.stalled = True
        for side in self.sides:
            if side.transport is not None:
                side.transport.pause_reading()

    def restore(self) -> None:
        """Forward again, held bytes first."""
        self.stalled = False
        for side in list(self.sides):
            side.flush()
            if side.transport is not None:
                side.transport.resume_reading()

    def cut(self) -> None:
        """Drop every held byte and close every connection (abortively)."""
        for side in list(self.sides):
            side.abort()

    async def aclose(self) -> None:
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


# --------------------------------------------------------------------------- the loss runs


class _Pair:
    """The current master, its replica, and the proxy between them (rotated after each run)."""

    def __init__(self, binary: str | None) -> None:
        self.binary = binary
        self.master = Server(binary, extra_args=REPL_ARGS)
        self.replica = Server(binary, extra_args=REPL_ARGS)
        self.proxy: StallProxy | None = None

    async def start(self) -> None:
        self.master.start()
        await self._attach(self.replica)

    async def _attach(self, replica: Server) -> float:
        """Start ``replica`` (if needed), replicating from the master through a new proxy."""
        t0 = time.monotonic()
        if replica.proc is None:
            replica.start()
        self.replica = replica
        self.proxy = StallProxy(self.master.port)
        await self.proxy.start()
        r = aioredis.Redis.from_url(replica.url, client_name=ADMIN_NAME)
        m = aioredis.Redis.from_url(self.master.url, client_name=ADMIN_NAME)
        try:
            await r.execute_command("REPLICAOF", "127.0.0.1", self.proxy.port)  # type: ignore[no-untyped-call]
            deadline = time.monotonic() + SYNC_TIMEOUT
            while True:
                mi, ri = await m.info("replication"), await r.info("replication")
                if (
                    int(mi.get("connected_slaves", 0)) >= 1
                    and ri.get("master_link_status") == "up"
                    and int(ri.get("slave_repl_offset", -1))
                    == int(mi.get("master_repl_offset", -2))
                ):
                    # Online is not yet applying: a write acknowledged by the replica is.
                    await m.set("bench:sync-probe", "1")
                    acked = await m.execute_command("WAIT", 1, 200)  # type: ignore[no-untyped-call]
                    if int(acked) >= 1:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {replica.port} not in sync in {SYNC_TIMEOUT} s")
                await asyncio.sleep(0.01)
        finally:
            await r.aclose()
            await m.aclose()
        return time.monotonic() - t0

    async def fail_over(self) -> None:
        """Drop the held stream, SIGKILL the master, promote the replica."""
        assert self.proxy is not None and self.master.proc is not None
        self.proxy.cut()
        self.master.proc.kill()
        self.master.proc.wait(10)
        r = aioredis.Redis.from_url(self.replica.url, client_name=ADMIN_NAME)
        try:
            await r.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]
        finally:
            await r.aclose()

    async def rotate(self) -> float:
        """The promoted replica is the master; the killed one comes back empty as its replica."""
        assert self.proxy is not None
        await self.proxy.aclose()
        dead = self.master
        dead.cleanup()
        self.master = self.replica
        return await self._attach(Server(self.binary, extra_args=REPL_ARGS))

    async def cleanup(self) -> None:
        if self.proxy is not None:
            await self.proxy.aclose()
        self.master.cleanup()
        self.replica.cleanup()


async def _one_run(
    pair: _Pair, p: dict[str, Any], i: int, replicas: int, lag: str
) -> dict[str, Any]:
    import aiolock

    assert pair.proxy is not None
    name = f"{p['key']}:{i}"
    options: dict[str, Any] = {"lease": p["lease"], "prefix": "bench"}
    if replicas:
        options.update(replicas=replicas, replica_timeout=p["replica_timeout"])
    out: dict[str, Any] = {"run": i, "replicas": replicas, "lag": lag, "granted": False,
                           "refused": False, "double": False}  # fmt: skip
    first = aiolock.Client.from_url(pair.master.url, **options)
    await first.__aenter__()
    try:
        # Warm: connections, scripts, and (replicas=1) one acknowledged acquisition
        # (tried a few times: on a loaded machine an acknowledgement can take longer
        # than replica_timeout even with the stream flowing).
        for attempt in range(5):
            try:
                warm = await first.lock(f"{name}:warm").acquire(timeout=10)
            except aiolock.ReplicationError:
                if attempt == 4:
                    raise
                continue
            await warm.release()
            break
        pair.proxy.blackhole()
        restore = None
        if lag == "short":
            restore = asyncio.get_running_loop().call_later(p["short_lag"], pair.proxy.restore)
        t0 = time.monotonic_ns()
        held: Any = None
        try:
            held = await first.lock(name).acquire(timeout=10)
            out["granted"] = True
        except aiolock.ReplicationError as exc:
            out["refused"] = True
            out["error"] = f"{type(exc).__name__}: {exc}"
        except aiolock.AiolockError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["acquire_ms"] = (time.monotonic_ns() - t0) / 1e6
        if restore is not None:
            restore.cancel()  # the kill comes now, whatever the replica has by then
        await pair.fail_over()
        second = aiolock.Client.from_url(pair.replica.url, lease=p["lease"], prefix="bench")
        async with second:
            other = await second.lock(name).try_acquire()
            out["second_granted"] = other is not None
            out["first_lost"] = bool(held is not None and held.lost)
            out["double"] = bool(out["granted"] and other is not None and not held.lost)
            if other is not None:
                await other.release()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(first.aclose(), 5)
    return out


async def loss(
    p: dict[str, Any], ready: Callable[[], None], wait_go: Callable[[], int]
) -> dict[str, Any]:
    """``p["runs"]`` forced-lag failovers for each of ``replicas`` 0 and 1, interleaved.

    Run ``i`` uses ``replicas = i % 2``; the lag alternates every two runs between
    ``long`` (the stream stays stalled until the kill: with ``replicas=1`` the
    acquisition is refused after ``replica_timeout``) and ``short`` (the stream
    resumes after ``short_lag`` s, shorter than ``replica_timeout``, unless the
    acquisition came back first: then the kill comes before the replica got it).
    """
    pair = _Pair(p.get("binary"))
    runs: list[dict[str, Any]] = []
    sync_s: list[float] = []
    try:
        await pair.start()
        ready()
        wait_go()
        t0 = time.monotonic()
        for i in range(2 * p["runs"]):
            lag = "long" if (i // 2) % 2 == 0 else "short"
            try:
                runs.append(await _one_run(pair, p, i, i % 2, lag))
            except Exception as exc:  # one broken run is reported, the others go on
                runs.append({"run": i, "replicas": i % 2, "lag": lag, "failed": repr(exc)})
                await pair.cleanup()  # in whatever state it was left: start over
                pair = _Pair(p.get("binary"))
                await pair.start()
                continue
            sync_s.append(await pair.rotate())
        wall = time.monotonic() - t0
    finally:
        await pair.cleanup()
    return {"runs": runs, "resync_s": sync_s, "wall_s": wall, "lease": p["lease"],
            "replica_timeout": p["replica_timeout"], "short_lag": p["short_lag"]}  # fmt: skip
