"""A real local Redis Cluster / Valkey Cluster for the test suite.

``ClusterProcess`` starts ``masters`` masters and ``masters * replicas`` replicas as
real ``redis-server``/``valkey-server`` processes (each a ``ClusterNode``, i.e. a
``ServerProcess`` with ``cluster-enabled yes`` and its own directory and
``nodes.conf``), forms the cluster with plain admin commands (CLUSTER
ADDSLOTSRANGE / MEET / REPLICATE) and waits until it is fully up:
``cluster_state:ok`` on every node, every node agreeing on who serves which slot,
and every master's replica acknowledging a write (``WAIT 1``).

Faults: ``kill_master`` + ``wait_for_failover``, ``manual_failover``, slot
migration (``migrate_slot``, or step by step: ``begin_migration``, ``move_keys``,
``finish_migration``), and per node ``kill``/``pause``/``resume``/``restart``.

Roles change (failovers), so ``masters()``/``replicas()``/``master_for_slot()``
read them live from ``CLUSTER NODES``; a ``ClusterNode`` is just a process on a
port.  Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Self, TypeVar

import redis
from redis.crc import key_slot

from tests.servers import LOOPBACK, ServerKind, ServerProcess, binary_major, server_binary

SLOTS = 16384
#: Default bound of every wait in this module (formation, failover, agreement).
CLUSTER_TIMEOUT = 30.0
#: Client ports are taken from [PORT_LOW, PORT_HIGH): the cluster bus port
#: (port + 10000) then stays below 32768, i.e. below Linux' ephemeral range.
PORT_LOW = 10000
PORT_HIGH = 22700
#: The port range is split in this many bands, one per xdist worker (mod).
PORT_BANDS = 8
_POLL = 0.02

T = TypeVar("T")
#: Slot ownership: master node id -> its inclusive slot ranges.
Ownership = dict[str, tuple[tuple[int, int], ...]]


# --------------------------------------------------------------------------- ports


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _worker_band() -> range:
    """This xdist worker's share of the port range (all of band 0 without xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    digits = "".join(ch for ch in worker if ch.isdigit())
    index = int(digits) % PORT_BANDS if digits else 0
    width = (PORT_HIGH - PORT_LOW) // PORT_BANDS
    start = PORT_LOW + index * width
    return range(start, start + width)


def cluster_port(taken: Iterable[int] = ()) -> int:
    """A port of this worker's band whose port and bus port (+10000) are both free now.

    Random inside the band: two sessions on one machine (other worktrees) rarely
    pick the same one, and a clash at spawn time is retried by the caller.
    """
    avoid = set(taken)
    band = _worker_band()
    for _ in range(500):
        port = random.choice(band)
        if port in avoid:
            continue
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError(f"no free cluster port pair in {band}")


# --------------------------------------------------------------------------- nodes


class ClusterNode(ServerProcess):
    """One cluster node: a ``ServerProcess`` with ``cluster-enabled yes``.

    Role-agnostic (a master may become a replica after a failover).  ``kill()``
    is SIGKILL, ``pause()``/``resume()`` SIGSTOP/SIGCONT, ``restart()`` SIGKILL then
    a new process on the same port and directory, so it keeps its ``nodes.conf``
    (same node id, rejoins the cluster) but loses its data.
    """

    def __init__(self, kind: ServerKind, binary: str, *, port: int, node_timeout_ms: int) -> None:
        super().__init__(
            kind,
            binary,
            port=port,
            extra_args=(
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
                "--repl-diskless-sync", "yes",
                "--repl-diskless-sync-delay", "0",
                "--cluster-require-full-coverage", "yes",
                # A SIGTERM (atexit clean-up) must not wait for lagging
                # replicas (the option is Redis 7.0's; 6.2 does not wait).
                *(("--shutdown-timeout", "0") if binary_major(binary) >= 7 else ()),
            ),
        )  # fmt: skip
        self._node_id: str | None = None

    @property
    def node_id(self) -> str:
        """The cluster node id (``CLUSTER MYID``); stable across ``restart()``."""
        if self._node_id is None:
            self._node_id = str(self.execute("CLUSTER", "MYID"))
        return self._node_id

    @property
    def is_paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._paused

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def cluster_nodes(self) -> list[NodeEntry]:
        """This node's view: ``CLUSTER NODES`` parsed."""
        return parse_cluster_nodes(str(self.execute("CLUSTER", "NODES")))

    def cluster_info(self) -> dict[str, str]:
        text = str(self.execute("CLUSTER", "INFO"))
        pairs = (line.partition(":") for line in text.splitlines() if ":" in line)
        return {key: value.strip() for key, _, value in pairs}

    def __repr__(self) -> str:
        return f"<ClusterNode {self.kind} {self.address} pid={self.pid}>"


@dataclass(frozen=True)
class NodeEntry:
    """One line of ``CLUSTER NODES`` (migration markers ``[slot->-id]`` dropped)."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None  # for a replica: its master's id
    link_connected: bool
    slots: tuple[tuple[int, int], ...]  # inclusive ranges

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def parse_cluster_nodes(text: str) -> list[NodeEntry]:
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        addr = fields[1].split("@")[0]
        port = int(addr.rpartition(":")[2] or 0)
        slots = []
        for item in fields[8:]:
            if item.startswith("["):
                continue
            low, _, high = item.partition("-")
            slots.append((int(low), int(high or low)))
        entries.append(
            NodeEntry(
                node_id=fields[0],
                port=port,
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                link_connected=fields[7] == "connected",
                slots=tuple(sorted(slots)),
            )
        )
    return entries


def _wait(what: str, check: Callable[[], T | None], timeout: float) -> T:
    """Poll ``check`` until it returns something other than None/False; TimeoutError."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
        except (redis.RedisError, OSError) as exc:  # a node mid-change: look again
            last_error = exc
            result = None
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s") from last_error
        time.sleep(_POLL)


def _probe_key(slot: int) -> str:
    """A key that hashes to ``slot``."""
    for i in range(1_000_000):
        key = f"probe:{i}"
        if key_slot(key.encode()) == slot:
            return key
    raise AssertionError(f"no probe key for slot {slot}")  # pragma: no cover


# --------------------------------------------------------------------------- cluster


class ClusterProcess:
    """A local cluster of real server processes; see the module docstring.

    Use as a context manager, or ``start()``/``stop()``.  All waits raise
    ``TimeoutError`` after ``timeout`` seconds (default ``CLUSTER_TIMEOUT``).
    """

    def __init__(
        self,
        kind: ServerKind,
        binary: str | None = None,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
    ) -> None:
        exe = server_binary(kind, binary)
        if masters < 1 or replicas < 0:
            raise ValueError("need at least one master and a non-negative replica count")
        self.kind: ServerKind = kind
        self.binary = exe
        self.master_count = masters
        self.replicas_per_master = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[ClusterNode] = []
        self.formation_seconds: float | None = None
        #: Slot ranges of each master killed by ``kill_master`` (by node id).
        self._orphaned: dict[str, list[tuple[int, int]]] = {}

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        ports = ",".join(str(node.port) for node in self.nodes)
        return f"<ClusterProcess {self.kind} ports={ports}>"

    def start(self) -> None:
        """Start every node, form the cluster, wait until it is fully up."""
        if self.nodes:
            raise RuntimeError(f"{self!r} is already started")
        began = time.monotonic()
        try:
            total = self.master_count * (1 + self.replicas_per_master)
            for _ in range(total):
                self.nodes.append(self._spawn_node())
            self._form()
        except BaseException:
            self.stop()
            raise
        self.formation_seconds = time.monotonic() - began

    def _spawn_node(self) -> ClusterNode:
        taken = [node.port for node in self.nodes]
        for attempt in range(5):
            node = ClusterNode(
                self.kind,
                self.binary,
                port=cluster_port(taken),
                node_timeout_ms=self.node_timeout_ms,
            )
            try:
                node.start()
                return node
            except RuntimeError:
                node.stop()  # removes its directory
                if attempt == 4:
                    raise
                taken.append(node.port)  # someone else got it first: another port
        raise AssertionError("unreachable")  # pragma: no cover

    def _form(self) -> None:
        masters = self.nodes[: self.master_count]
        replicas = self.nodes[self.master_count :]
        # Distinct config epochs up front: no epoch-collision rounds after MEET.
        for epoch, node in enumerate(self.nodes, start=1):
            node.execute("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for index, node in enumerate(masters):
            low = index * SLOTS // self.master_count
            high = (index + 1) * SLOTS // self.master_count - 1
            if binary_major(node.binary) >= 7:
                node.execute("CLUSTER", "ADDSLOTSRANGE", low, high)
            else:  # Redis 6.2: no ADDSLOTSRANGE
                node.execute("CLUSTER", "ADDSLOTS", *range(low, high + 1))
        first = self.nodes[0]
        for node in self.nodes[1:]:
            first.execute("CLUSTER", "MEET", LOOPBACK, node.port)
        everyone = {node.node_id for node in self.nodes}

        def all_known() -> bool:
            for node in self.nodes:
                view = node.cluster_nodes()
                if {e.node_id for e in view} != everyone or any(e.failed for e in view):
                    return False
            return True

        _wait("every node knowing every other", all_known, CLUSTER_TIMEOUT)
        for index, replica in enumerate(replicas):
            master = masters[index % self.master_count]
            replica.execute("CLUSTER", "REPLICATE", master.node_id)
        self.wait_healthy()

    def stop(self) -> None:
        """SIGKILL every node and remove their directories.  Idempotent.

        SIGKILL, not SIGTERM: nothing is persisted, and a Redis 7 master's SIGTERM
        waits for its replicas to catch up (up to ``shutdown-timeout``)."""
        nodes, self.nodes = self.nodes, []
        for node in nodes:
            with contextlib.suppress(Exception):
                if node.running:
                    node.kill()
            with contextlib.suppress(Exception):
                node.stop()

    # -- identity --------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port of the first node>`` (a startup node for clients)."""
        return f"redis://{LOOPBACK}:{self.nodes[0].port}"

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(LOOPBACK, node.port) for node in self.nodes]

    def node_by_id(self, node_id: str) -> ClusterNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(node_id)

    def node_by_port(self, port: int) -> ClusterNode:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(port)

    def live_nodes(self) -> list[ClusterNode]:
        """Nodes whose process runs and is not paused."""
        return [node for node in self.nodes if node.running and not node.is_paused]

    def _view(self) -> list[NodeEntry]:
        """The cluster as the first live node sees it."""
        return self.live_nodes()[0].cluster_nodes()

    # -- live roles ------------------------------------------------------------------

    def masters(self) -> list[ClusterNode]:
        """Masters serving slots and not failed, per the first live node's CLUSTER NODES."""
        return [
            self.node_by_id(e.node_id)
            for e in self._view()
            if e.is_master and e.slots and not e.failed
        ]

    def replicas(self) -> list[ClusterNode]:
        """Nodes flagged ``slave`` and not failed, per the first live node."""
        return [
            self.node_by_id(e.node_id) for e in self._view() if "slave" in e.flags and not e.failed
        ]

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        """A (not failed) replica of ``master``; KeyError if it has none."""
        for e in self._view():
            if e.master_id == master.node_id and "slave" in e.flags and not e.failed:
                return self.node_by_id(e.node_id)
        raise KeyError(f"{master!r} has no replica")

    @staticmethod
    def slot_of(key: str | bytes) -> int:
        data = key.encode() if isinstance(key, str) else key
        slot: int = key_slot(data)
        return slot

    def master_for_slot(self, slot: int) -> ClusterNode:
        """The master serving ``slot`` (per the first live node)."""
        for e in self._view():
            if e.is_master and not e.failed and any(lo <= slot <= hi for lo, hi in e.slots):
                return self.node_by_id(e.node_id)
        raise KeyError(f"no live master serves slot {slot}")

    def master_for_key(self, key: str | bytes) -> ClusterNode:
        return self.master_for_slot(self.slot_of(key))

    def slots_of(self, master: ClusterNode) -> list[tuple[int, int]]:
        for e in self._view():
            if e.node_id == master.node_id:
                return list(e.slots)
        return []

    # -- health ----------------------------------------------------------------------

    def _agreed_ownership(self) -> Ownership | None:
        """The master-id -> slot ranges map if every live node has the same one, all
        16384 slots served by live masters, cluster_state:ok everywhere and every live
        node seen as healthy by every live node; else None."""
        agreed: Ownership | None = None
        agreed_roles: dict[str, str] | None = None
        live = self.live_nodes()
        live_ids = {node.node_id for node in live}
        for node in live:
            if node.cluster_info().get("cluster_state") != "ok":
                return None
            view = node.cluster_nodes()
            if any(e.failed or not e.link_connected for e in view if e.node_id in live_ids):
                return None  # a live (e.g. restarted) node not yet seen as healthy
            owners = {e.node_id: e.slots for e in view if e.is_master and e.slots}
            if any(e.failed for e in view if e.node_id in owners):
                return None
            if sum(hi - lo + 1 for ranges in owners.values() for lo, hi in ranges) != SLOTS:
                return None
            # Every node sees the same roles too (which replica follows which
            # master): gossip spreads a REPLICATE or a failover over a few
            # pings, and a test reading one node's view must not run before.
            roles = {e.node_id: e.master_id for e in view if e.node_id in live_ids}
            if agreed is None:
                agreed, agreed_roles = owners, roles
            elif owners != agreed or roles != agreed_roles:
                return None
        return agreed

    def wait_agreed(self, timeout: float = CLUSTER_TIMEOUT) -> Ownership:
        """Wait until every live node reports cluster_state:ok and the same slot owners."""
        return _wait("cluster agreement", self._agreed_ownership, timeout)

    def wait_replication(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """A write on every master acknowledged by one replica (``WAIT 1``), for the
        masters that have a live replica."""
        deadline = time.monotonic() + timeout
        view = self._view()
        for e in view:
            if not (e.is_master and e.slots and not e.failed):
                continue
            has_replica = any(
                r.master_id == e.node_id and not r.failed and self.node_by_id(r.node_id).running
                for r in view
            )
            if not has_replica:
                continue
            master = self.node_by_id(e.node_id)
            key = _probe_key(e.slots[0][0])

            def acked(master: ClusterNode = master, key: str = key) -> bool:
                with master.admin_client() as client:
                    client.set(key, "1")
                    acks = int(client.execute_command("WAIT", 1, 200))  # type: ignore[no-untyped-call]
                    client.delete(key)
                return acks >= 1

            _wait(f"replication of {master!r}", acked, max(0.0, deadline - time.monotonic()))

    def wait_healthy(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Agreement (see ``wait_agreed``) plus replication (see ``wait_replication``)."""
        deadline = time.monotonic() + timeout
        self.wait_agreed(timeout)
        self.wait_replication(max(0.0, deadline - time.monotonic()))

    def reset(self) -> None:
        """FLUSHALL on every master (replicas follow, waited for with ``WAIT``) and
        SCRIPT FLUSH on every node.  Used between tests on the shared cluster."""
        for node in self.masters():
            with node.admin_client() as client:
                client.flushall()
                if self.replicas_per_master:
                    client.execute_command("WAIT", 1, 1000)  # type: ignore[no-untyped-call]
        for node in self.live_nodes():
            node.script_flush()

    # -- faults: failover ------------------------------------------------------------

    def kill_master(self, node: ClusterNode) -> list[tuple[int, int]]:
        """SIGKILL the master ``node``; return the slot ranges it served."""
        slots = self.slots_of(node)
        if not slots:
            raise ValueError(f"{node!r} is not a master serving slots")
        node.kill()
        self._orphaned[node.node_id] = slots
        return slots

    def wait_for_failover(
        self, slot_or_node: int | ClusterNode, timeout: float = CLUSTER_TIMEOUT
    ) -> ClusterNode:
        """Wait until another (live) master serves the slot (or every slot the killed
        node served), every live node agrees and says cluster_state:ok; return it."""
        if isinstance(slot_or_node, ClusterNode):
            ranges = self._orphaned.get(slot_or_node.node_id) or self.slots_of(slot_or_node)
            if not ranges:
                raise ValueError(f"no slots known for {slot_or_node!r}")
            slot = ranges[0][0]
            old_id: str | None = slot_or_node.node_id
        else:
            slot, old_id = slot_or_node, None

        def promoted() -> ClusterNode | None:
            owners = self._agreed_ownership()
            if owners is None:
                return None
            for node_id, slot_ranges in owners.items():
                if any(lo <= slot <= hi for lo, hi in slot_ranges):
                    node = self.node_by_id(node_id)
                    if node_id != old_id and node.running:
                        return node
            return None

        return _wait(f"failover of slot {slot}", promoted, timeout)

    def manual_failover(
        self, replica: ClusterNode, timeout: float = CLUSTER_TIMEOUT
    ) -> ClusterNode:
        """CLUSTER FAILOVER on ``replica``; wait until it is a master that every live
        node agrees on and the old master replicates it.  Returns the old master."""
        view = {e.node_id: e for e in self._view()}
        entry = view[replica.node_id]
        if entry.master_id is None:
            raise ValueError(f"{replica!r} is not a replica")
        old_master = self.node_by_id(entry.master_id)
        replica.execute("CLUSTER", "FAILOVER")

        def done() -> bool:
            owners = self._agreed_ownership()
            if owners is None or replica.node_id not in owners:
                return False
            return all(
                any(
                    e.node_id == old_master.node_id and e.master_id == replica.node_id
                    for e in node.cluster_nodes()
                )
                for node in self.live_nodes()
            )

        _wait(f"manual failover to {replica!r}", done, timeout)
        return old_master

    # -- faults: slot migration ------------------------------------------------------

    def begin_migration(self, slot: int, target: ClusterNode) -> ClusterNode:
        """SETSLOT IMPORTING on ``target``, MIGRATING on the slot's master; return the
        source.  Keys stay on the source until ``move_keys``."""
        source = self.master_for_slot(slot)
        if source.node_id == target.node_id:
            raise ValueError(f"slot {slot} is already served by {target!r}")
        target.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        source.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        return source

    def move_keys(self, slot: int, target: ClusterNode | None = None, batch: int = 100) -> int:
        """MIGRATE every key of ``slot`` from its (migrating) source to ``target`` (by
        default the node importing it); return how many moved."""
        source = self.master_for_slot(slot)
        if target is None:
            target = self._importing_node(slot)
        moved = 0
        while True:
            keys = source.execute("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                return moved
            source.execute("MIGRATE", LOOPBACK, target.port, "", 0, 5000, "REPLACE", "KEYS", *keys)
            moved += len(keys)

    def _importing_node(self, slot: int) -> ClusterNode:
        marker = f"[{slot}-<-"
        for node in self.live_nodes():
            for line in str(node.execute("CLUSTER", "NODES")).splitlines():
                if "myself" in line.split()[2] and marker in line:
                    return node
        raise KeyError(f"no node is importing slot {slot}")

    def finish_migration(
        self, slot: int, target: ClusterNode, timeout: float = CLUSTER_TIMEOUT
    ) -> None:
        """SETSLOT NODE ``target`` on the target, the source, then the other masters;
        wait until every live node agrees."""
        source = self.master_for_slot(slot)
        others = [m for m in self.masters() if m.node_id not in (source.node_id, target.node_id)]
        for node in (target, source, *others):
            node.execute("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)

        def served() -> bool:
            owners = self._agreed_ownership()
            ranges = owners.get(target.node_id, ()) if owners else ()
            return any(lo <= slot <= hi for lo, hi in ranges)

        _wait(f"slot {slot} served by {target!r}", served, timeout)

    def migrate_slot(self, slot: int, target: ClusterNode, timeout: float = CLUSTER_TIMEOUT) -> int:
        """The whole migration: begin, move every key, finish.  Returns keys moved."""
        self.begin_migration(slot, target)
        moved = self.move_keys(slot, target)
        self.finish_migration(slot, target, timeout)
        return moved

    # -- convenience -----------------------------------------------------------------

    @contextlib.contextmanager
    def client(self) -> Iterator[redis.RedisCluster]:
        """A sync ``redis.RedisCluster`` on this cluster (decoded replies)."""
        rc = redis.RedisCluster(host=LOOPBACK, port=self.nodes[0].port, decode_responses=True)
        try:
            yield rc
        finally:
            rc.close()
