"""The failover section of ``python -m benchmarks`` (issue 12, item 5).

Three parts, in one run, each measured side by side:

- **the cost of ``replicas=1``**: on a master with one replica (replicating
  directly), aiolock's uncontended acquire + release (p50, p99) and 100 tasks over
  100 names (acquisitions/s, ``WAIT`` calls per acquisition: the group commit) with
  ``Client(..., replicas=1)`` and without, same servers, interleaved in rounds
  (target: with <= 1.5 x without);
- **Redlock over 3 independent masters**: ``aiolock.Redlock([c1, c2, c3]).lock(name)``
  against pottery's ``AIORedlock`` and aioredlock on the same 3 servers:
  uncontended acquire + release (target: aiolock's p50 no slower than the best
  peer's), and ``tasks`` tasks taking turns on one name: the time from
  ``release()`` returning to the next holder's ``acquire()`` returning, and
  requests per acquisition summed over the 3 masters (event-driven against polling);
- **the failover loss table** (``_failover.loss``, one fresh worker): forced-lag
  failovers of a master whose replica replicates through a stall-able proxy,
  ``replicas=0`` and ``replicas=1`` interleaved; double holders counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from benchmarks import _failover

if TYPE_CHECKING:
    from benchmarks._orchestra import Orchestrator
    from benchmarks._server import Server

Record = Callable[[str, str, str, str, int, Any], None]
#: The Redlock peers (and aiolock), in display order.
REDLOCK_LIBS = ("aiolock", "pottery", "aioredlock")
VARIANTS = {"replicas=0": {}, "replicas=1": {"replicas": 1}}


class Servers:
    """The section's servers: a master + replica, and 3 independent masters."""

    def __init__(self) -> None:
        self.master: Server | None = None
        self.replica: Server | None = None
        self.masters: list[Server] = []

    def cleanup(self) -> None:
        for s in [self.master, self.replica, *self.masters]:
            if s is not None:
                s.cleanup()


def start_servers(
    binary: str | None, log: Callable[[str], None]
) -> tuple[Servers, dict[str, Any], str | None]:
    """(servers, their meta, why not if they could not start)."""
    servers = Servers()
    try:
        servers.master, servers.replica = _failover.start_replicated(binary)
        servers.masters = _failover.start_masters(binary, 3)
    except (RuntimeError, OSError) as exc:
        servers.cleanup()
        log(f"failover section: skipped: {exc}")
        return servers, {}, f"could not start its servers: {exc}"
    meta = {
        "binary": servers.master.binary,
        "replicated": [servers.master.port, servers.replica.port],
        "redlock": [s.port for s in servers.masters],
    }
    log(f"failover section: master {meta['replicated'][0]} + replica {meta['replicated'][1]}; "
        f"Redlock masters {meta['redlock']}")  # fmt: skip
    return servers, meta, None


async def run_section(
    orch: Orchestrator,
    cfg: dict[str, Any],
    libs: list[str],
    loops: list[str],
    servers: Servers,
    key: str,
    record: Record,
    binary: str | None,
) -> None:
    from benchmarks._orchestra import Target, rotate

    if "aiolock" not in libs:
        return
    assert servers.master is not None and servers.replica is not None
    f_loops = [lp for lp in cfg["loops"] if lp in loops] or loops[:1]
    peer_loops = [lp for lp in f_loops if lp in cfg["peer_loops"]] or f_loops[:1]

    # (a) The cost of replicas=1: the same master, with and without.
    pair = Target("replicated", servers.master.url, [servers.master.url],
                  [servers.master.url, servers.replica.url], cluster=False)  # fmt: skip
    orch.targets.append(pair)
    cells = [(v, lp) for v in VARIANTS for lp in f_loops]
    c = cfg["uncontended"]
    for rnd in range(c["rounds"]):
        for variant, lp in rotate(cells, rnd):
            p = {**c, "key": f"{key}:fu:{variant}:{lp}:{rnd}", "aiolock_options": VARIANTS[variant]}
            res = await orch.run("uncontended", "aiolock", lp, p, target=pair,
                                 timeout=c["duration"] * 2 + 60)  # fmt: skip
            record("failover_replicas_uncontended", variant, "aiolock", lp, rnd, res)
    c = cfg["spread"]
    for rnd in range(c["rounds"]):
        for variant, lp in rotate(cells, rnd):
            p = {**c, "key": f"{key}:fs:{variant}:{lp}:{rnd}", "aiolock_options": VARIANTS[variant]}
            res = await orch.run("throughput", "aiolock", lp, p, target=pair,
                                 timeout=c["warmup"] + c["duration"] + c["grace"] + 90)  # fmt: skip
            record("failover_replicas_spread", variant, "aiolock", lp, rnd, res)

    # (b) Redlock over 3 independent masters.
    urls = [s.url for s in servers.masters]
    three = Target("redlock", urls[0], urls, urls, cluster=False)
    orch.targets.append(three)
    r_libs = [lib for lib in REDLOCK_LIBS if lib in libs]
    cells = [(lib, lp) for lib in r_libs for lp in (f_loops if lib == "aiolock" else peer_loops)]
    c = cfg["redlock_uncontended"]
    for rnd in range(c["rounds"]):
        for lib, lp in rotate(cells, rnd):
            p = {**c, "key": f"{key}:ru:{lib}:{lp}:{rnd}", "masters": urls}
            res = await orch.run("uncontended", lib, lp, p, target=three,
                                 timeout=c["duration"] * 2 + 60)  # fmt: skip
            record("failover_redlock_uncontended", "3 masters", lib, lp, rnd, res)
    c = cfg["redlock_handoff"]
    for rnd in range(c["rounds"]):
        for lib, lp in rotate(cells, rnd):
            p = {**c, "key": f"{key}:rh:{lib}:{lp}:{rnd}", "masters": urls}
            res = await orch.run("handoff", lib, lp, p, target=three,
                                 timeout=c["duration"] + c["grace"] + 60)  # fmt: skip
            record("failover_redlock_handoff", "3 masters", lib, lp, rnd, res)

    # (c) The failover loss table: its own servers, in a fresh worker.
    c = cfg["loss"]
    p = {**c, "key": f"{key}:fl", "binary": binary or servers.master.binary}
    timeout = 2 * c["runs"] * (c["replica_timeout"] + 10) + 60
    res = await orch.run("failover_loss", "aiolock", f_loops[0], p, fresh=True, timeout=timeout)
    record("failover_loss", "master + replica", "aiolock", f_loops[0], 0, res)
