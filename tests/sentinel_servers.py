"""A real local Sentinel set for the test suite: 1 master, 2 replicas, 3 Sentinels.

``SentinelSet`` starts three ``redis-server``/``valkey-server`` data nodes
(``ServerProcess``: one master, two ``--replicaof`` it) and three Sentinels
(the same binary run as ``<binary> <conf> --sentinel``) monitoring the
master as service ``SERVICE`` with quorum 2, ``down-after-milliseconds``
2000 (1000 caused double failovers on a loaded machine) and a small
``failover-timeout``. ``start()`` returns once every Sentinel knows the
other two and both replicas, and both replicas acknowledged a write
(``WAIT``).

Faults: ``kill_master`` (SIGKILL), ``pause_master`` (SIGSTOP; ``resume``),
``manual_failover`` (``SENTINEL FAILOVER``), then ``wait_for_switch`` (every
Sentinel names the same new master and it answers ROLE master; the time it
took is recorded in ``switch_times``). ``heal()`` brings the set back to a
healthy 1 + 2 between tests: a killed node is restarted as a replica of the
current master, a stale master (paused, or the old one of a manual
failover, which stays a writable master for seconds) is made a replica by
hand, and it waits until both replicas are in sync (a replica fresh from a
full sync reports "online" before it applies writes: a ``WAIT`` of a test
write is the proof). Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Self

import redis

from aiolock import _servers as launcher
from tests.servers import LOOPBACK, ServerKind, ServerProcess, server_binary

SERVICE = "aiolock-svc"
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 3000
#: Default bound of every wait here (start, switch, sync).
TIMEOUT = 30.0

Address = tuple[str, int]


def _client(port: int, timeout: float = 5.0) -> redis.Redis:
    return redis.Redis(LOOPBACK, port, socket_timeout=timeout, socket_connect_timeout=timeout)


class SentinelProcess:
    """One Sentinel: ``<binary> <dir>/server.conf --sentinel`` on a free port,
    started by the one launcher (``aiolock._servers``)."""

    def __init__(self, binary: str, master_port: int) -> None:
        self.binary = binary
        self.master_port = master_port
        self._process = launcher.ServerProcess(
            binary,
            extra_args=("--sentinel",),
            dir_prefix="aiolock-sentinel-",
            start_timeout=TIMEOUT,
            config=(
                f"sentinel monitor {SERVICE} {LOOPBACK} {master_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 2\n"
            ),
        )

    @property
    def port(self) -> int:
        return self._process.port

    @property
    def address(self) -> Address:
        return (LOOPBACK, self.port)

    def start(self) -> None:
        self._process.start()

    def log_tail(self, lines: int = 30) -> str:
        return self._process.log_tail(lines)

    def execute(self, *args: Any) -> Any:
        with _client(self.port) as r:
            return r.execute_command(*args)

    def master_address(self) -> Address | None:
        reply = self.execute("SENTINEL", "get-master-addr-by-name", SERVICE)
        if not reply:
            return None
        return (reply[0].decode(), int(reply[1]))

    def pause(self) -> None:
        """SIGSTOP: the port stays open, nothing is answered until ``resume()``."""
        self._process.pause()

    def resume(self) -> None:
        self._process.resume()

    def stop(self) -> None:
        """SIGKILL (a Sentinel has nothing to save), and remove its directory."""
        if self._process.running:
            self._process.kill()
        self._process.stop()


class SentinelSet:
    """1 master + 2 replicas + 3 Sentinels of one kind (see the module)."""

    def __init__(self, kind: ServerKind, binary: str | None = None) -> None:
        exe = server_binary(kind, binary)
        self.kind = kind
        self.binary = exe
        self.service = SERVICE
        self.nodes: list[ServerProcess] = []
        self.sentinels: list[SentinelProcess] = []
        #: Seconds from each fault (kill, pause, FAILOVER) to the switch seen by every Sentinel.
        self.switch_times: list[float] = []
        self._fault_at: float | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _node_args(self, master_port: int | None) -> tuple[str, ...]:
        args: tuple[str, ...] = ("--repl-diskless-sync-delay", "0")
        args += ("--repl-ping-replica-period", "1")
        if master_port is not None:
            args += ("--replicaof", LOOPBACK, str(master_port))
        return args

    def start(self) -> None:
        try:
            master = ServerProcess(self.kind, self.binary, extra_args=self._node_args(None))
            master.start()
            self.nodes.append(master)
            for _ in range(2):
                args = self._node_args(master.port)
                node = ServerProcess(self.kind, self.binary, extra_args=args)
                node.start()
                self.nodes.append(node)
            for _ in range(3):
                sentinel = SentinelProcess(self.binary, master.port)
                sentinel.start()
                self.sentinels.append(sentinel)
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for node in self.nodes:
            node.stop()
        self.sentinels.clear()
        self.nodes.clear()

    # -- what the Sentinels say ----------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[Address]:
        return [s.address for s in self.sentinels]

    def named_master(self) -> Address | None:
        """The master the first Sentinel that answers names."""
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                return sentinel.master_address()
        return None

    def node_at(self, address: Address) -> ServerProcess:
        for node in self.nodes:
            if node.port == address[1]:
                return node
        raise LookupError(f"no node at {address}")

    @property
    def master(self) -> ServerProcess:
        """The node the Sentinels name the master."""
        address = self.named_master()
        if address is None:
            raise RuntimeError("no Sentinel names a master")
        return self.node_at(address)

    @property
    def replicas(self) -> list[ServerProcess]:
        master = self.master
        return [node for node in self.nodes if node is not master]

    @staticmethod
    def role(node: ServerProcess) -> str:
        with _client(node.port, 2.0) as r:
            role = r.execute_command("ROLE")[0]
        return role.decode() if isinstance(role, bytes) else str(role)

    # -- faults -------------------------------------------------------------------------

    def kill_master(self) -> ServerProcess:
        """SIGKILL the master; returns it (dead until ``heal()``)."""
        node = self.master
        self._fault_at = time.monotonic()
        node.kill()
        return node

    def pause_master(self) -> ServerProcess:
        """SIGSTOP the master; ``node.resume()`` (or ``heal()``) wakes it."""
        node = self.master
        self._fault_at = time.monotonic()
        node.pause()
        return node

    def manual_failover(self, via: int = 0) -> ServerProcess:
        """``SENTINEL FAILOVER`` on Sentinel ``via``; returns the old master (it
        stays a writable master for seconds after the switch: the trap)."""
        node = self.master_per(self.sentinels[via])
        self._fault_at = time.monotonic()
        self.sentinels[via].execute("SENTINEL", "FAILOVER", SERVICE)
        return node

    def master_per(self, sentinel: SentinelProcess) -> ServerProcess:
        address = sentinel.master_address()
        assert address is not None
        return self.node_at(address)

    def wait_for_switch(
        self,
        old: ServerProcess,
        timeout: float = TIMEOUT,
        sentinels: list[SentinelProcess] | None = None,
    ) -> ServerProcess:
        """Wait until every Sentinel (of ``sentinels``: default all) names the
        same master, not ``old``, and it answers ROLE master; record the time
        since the fault; return it."""
        deadline = time.monotonic() + timeout
        while True:
            named: set[Address | None] = set()
            for sentinel in sentinels or self.sentinels:
                try:
                    named.add(sentinel.master_address())
                except redis.RedisError:
                    named.add(None)
            if len(named) == 1:
                (address,) = named
                if address is not None and address[1] != old.port:
                    node = self.node_at(address)
                    with contextlib.suppress(redis.RedisError):
                        if self.role(node) == "master":
                            if self._fault_at is not None:
                                self.switch_times.append(time.monotonic() - self._fault_at)
                                self._fault_at = None
                            return node
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no switch from {old.port} within {timeout} s: Sentinels name {named}\n"
                    + self.sentinels[0].log_tail()
                )
            time.sleep(0.02)

    @property
    def switch_bound(self) -> float:
        """The longest switch measured so far (at least the detection time plus 2 s)."""
        return max([DOWN_AFTER_MS / 1000 + 2.0, *self.switch_times])

    # -- healing --------------------------------------------------------------------------

    def heal(self, timeout: float = TIMEOUT) -> None:
        """Back to 1 master + 2 replicas in sync, all three Sentinels agreeing."""
        deadline = time.monotonic() + timeout
        for sentinel in self.sentinels:
            sentinel.resume()
        master = self._agreed_master(deadline)
        for node in self.nodes:
            if node is master:
                continue
            if not node.running:
                node.extra_args = self._node_args(master.port)
                node.restart()
                continue
            node.resume()
            try:
                role = self.role(node)
            except redis.RedisError:
                role = "?"
            if role != "slave":
                # A stale master (the old one of a manual failover, or one
                # paused through the failover): make it a replica at once.
                with _client(node.port) as r:
                    r.execute_command("REPLICAOF", LOOPBACK, str(master.port))
        self.wait_healthy(deadline - time.monotonic())

    def _agreed_master(self, deadline: float) -> ServerProcess:
        while True:
            named = set()
            for sentinel in self.sentinels:
                with contextlib.suppress(redis.RedisError):
                    named.add(sentinel.master_address())
            if len(named) == 1:
                (address,) = named
                if address is not None:
                    node = self.node_at(address)
                    if node.running:
                        return node
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Sentinels do not agree on a live master: {named}")
            time.sleep(0.05)

    def wait_healthy(self, timeout: float = TIMEOUT) -> None:
        """Every Sentinel names the master, knows 2 Sentinels more and 2 replicas
        up; both replicas acknowledge a write (``WAIT 2``)."""
        start = time.monotonic()
        deadline = start + max(timeout, 1.0)
        last = None
        while True:
            problem = self._health_problem()
            if problem != last and os.environ.get("AIOLOCK_SENTINEL_TRACE"):
                print(f"sentinel set +{time.monotonic() - start:.2f}s: {problem}")
            last = problem
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Sentinel set not healthy: {problem}")
            time.sleep(0.05)

    def _health_problem(self) -> str | None:
        try:
            master = self._agreed_master(time.monotonic())
        except TimeoutError as exc:
            return str(exc)
        for sentinel in self.sentinels:
            try:
                info = sentinel.execute("SENTINEL", "MASTER", SERVICE)
                replicas = sentinel.execute("SENTINEL", "REPLICAS", SERVICE)
            except redis.RedisError as exc:
                return f"sentinel {sentinel.port}: {exc}"
            # (raw pairs: bytes keys and values)
            if int(info[b"num-other-sentinels"]) < 2:
                return f"sentinel {sentinel.port} knows {info[b'num-other-sentinels']} others"
            if info[b"flags"] != b"master":
                return f"sentinel {sentinel.port}: master flags {info[b'flags']!r}"
            up = sum(
                1 for r in replicas if r[b"flags"] == b"slave" and r[b"master-link-status"] == b"ok"
            )
            # One is enough for the next failover; a replica made one by hand
            # shows up at the Sentinels' next INFO (10 s): the nodes' own ROLE
            # and WAIT 2 below prove both are in sync.
            if up < 1:
                return f"sentinel {sentinel.port} sees no replica up"
        for node in self.nodes:
            if node is master:
                continue
            try:
                if self.role(node) != "slave":
                    return f"node {node.port} is not a replica"
            except redis.RedisError as exc:
                return f"node {node.port}: {exc}"
        try:
            with _client(master.port) as r:
                r.set("aiolock-harness:sync", str(time.monotonic()))
                acked = r.execute_command("WAIT", 2, 1000)
                r.delete("aiolock-harness:sync")
        except redis.RedisError as exc:
            return f"master {master.port}: {exc}"
        if acked < 2:
            return f"{acked} of 2 replicas acknowledged a write"
        return None

    def flushall(self) -> None:
        with _client(self.master.port) as r:
            r.flushall()
            r.script_flush()
