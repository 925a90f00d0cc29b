"""The demo's live figures and views: what the parent shows while the workers run.

``Live`` folds the workers' reports into rolling figures (acquisitions per
second, handoff latency, waiting tasks, connections in use); ``PlainView``
prints them as lines, ``RichView`` as a live table (with ``rich``, the
``demo`` extra). ``handoffs`` turns the records into handoff latencies.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TextIO

import redis

from aiolock.cli.demo_config import WINDOW, Admin, Config, Record, nodes

# --------------------------------------------------------------------------- parent side


def percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[k])


def handoffs(records: list[Record], settled: int | None = None) -> list[int]:
    """Handoff latencies, ns: per lock, in hold order, from one holder's end of work
    to the next holder's acquire returning, when that holder was already waiting."""
    by_lock: dict[int, list[Record]] = {}
    for rec in records:
        by_lock.setdefault(rec[0], []).append(rec)
    out: list[int] = []
    for recs in by_lock.values():
        recs.sort(key=lambda r: r[3])
        for prev, cur in itertools.pairwise(recs):
            if settled is not None and cur[3] > settled:
                break
            if cur[2] <= prev[4] <= cur[3]:
                out.append(cur[3] - prev[4])
    return out


def rate_label(cfg: Config) -> str:
    """The rate's name: with ``--no-lock`` nothing is acquired, tasks only run
    their unprotected read-modify-write cycles."""
    return "acquisitions/s" if cfg.use_lock else "cycles/s (no lock)"


def handoff_text(cfg: Config, p50: float, p99: float) -> str:
    """The handoff figure, or why there is none: without the lock nothing is
    handed from one holder to the next."""
    if not cfg.use_lock:
        return "handoff n/a (no lock)"
    return f"handoff p50 {ms_text(p50)} p99 {ms_text(p99)}"


def ms_text(ns: float) -> str:
    if math.isnan(ns):
        return "-"
    ms = ns / 1e6
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"


@dataclass(slots=True)
class Live:
    """What the parent knows while the workers run."""

    cfg: Config
    started: int = 0
    snapshots: dict[int, dict[str, Any]] = field(default_factory=dict)
    totals: deque[tuple[int, int]] = field(default_factory=deque)  # (at, total acquisitions)
    recent: deque[Record] = field(default_factory=deque)
    records: list[Record] = field(default_factory=list)
    connections: str = "-"

    def add(self, wid: int, snapshot: dict[str, Any], batch: list[Record]) -> None:
        self.snapshots[wid] = snapshot
        self.records.extend(batch)
        self.recent.extend(batch)

    def figures(self) -> dict[str, Any]:
        now = time.monotonic_ns()
        total = sum(s["acquisitions"] for s in self.snapshots.values())
        self.totals.append((now, total))
        while self.totals and self.totals[0][0] < now - int(1e9):
            self.totals.popleft()
        first_at, first_total = self.totals[0]
        span = (now - first_at) / 1e9
        rate = (total - first_total) / span if span > 0.2 else math.nan
        while self.recent and self.recent[0][4] < now - int(WINDOW * 1e9):
            self.recent.popleft()
        # A hold can be paired with its predecessor once every worker has reported
        # past its start (a worker's tick carries everything that ended before it).
        settled = min((s["at"] for s in self.snapshots.values()), default=0)
        lat = sorted(handoffs(list(self.recent), settled))
        per_lock = [0] * self.cfg.locks
        for rec in self.records:
            per_lock[rec[0]] += 1
        per_process = [
            self.snapshots.get(w, {}).get("acquisitions", 0) for w in range(self.cfg.processes)
        ]
        return {
            "elapsed": (now - self.started) / 1e9 if self.started else 0.0,
            "total": total,
            "rate": rate,
            "p50": percentile(lat, 0.50),
            "p99": percentile(lat, 0.99),
            "waiting": sum(s["waiting"] for s in self.snapshots.values()),
            "in_flight": sum(s["in_flight"] for s in self.snapshots.values()),
            "connections": self.connections,
            "per_lock": per_lock,
            "per_process": per_process,
        }


def count_connections(admin: Admin, cfg: Config, names: set[str]) -> str:
    """The connections of the workers' Clients and of their own data clients,
    summed over every node (one server standalone; masters and replicas in a cluster)."""
    try:
        clients = [c for node in nodes(admin) for c in node.client_list()]
    except redis.RedisError:
        return "n/a (CLIENT LIST refused)"
    ours = sum(1 for c in clients if c.get("name") in names)
    data = sum(1 for c in clients if c.get("name") == f"{cfg.prefix}-data")
    what = (
        "per process: a command connection per master, a sharded pub/sub one per master listened on"
        if cfg.cluster
        else "command + pub/sub per process"
    )
    return f"{ours} aiolock ({what}) + {data} for the demo's own reads"


class PlainView:
    def __init__(self, cfg: Config, out: TextIO) -> None:
        self.cfg = cfg
        self.out = out
        self.last = 0.0

    def update(self, f: dict[str, Any], force: bool = False) -> None:
        if not force and f["elapsed"] - self.last < 1.0:
            return
        self.last = f["elapsed"]
        rate = "-" if math.isnan(f["rate"]) else f"{f['rate']:,.0f}"
        print(
            f"  {f['elapsed']:5.1f}s  {rate_label(self.cfg)} {rate:>7}  "
            f"{handoff_text(self.cfg, f['p50'], f['p99'])}  "
            f"waiting {f['waiting']}/{self.cfg.processes * self.cfg.tasks}  "
            f"connections {f['connections']}",
            file=self.out,
            flush=True,
        )

    def close(self) -> None:
        pass


class RichView:
    def __init__(self, cfg: Config, header: str) -> None:
        from rich.console import Console
        from rich.live import Live

        self.cfg = cfg
        self.header = header
        self.console = Console()
        self.live = Live(console=self.console, refresh_per_second=8, transient=False)
        self.live.start()

    def update(self, f: dict[str, Any], force: bool = False) -> None:
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        cfg = self.cfg
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        elapsed = min(f["elapsed"], cfg.duration)
        clock = Table.grid(padding=(0, 1))
        clock.add_row(
            ProgressBar(total=cfg.duration, completed=elapsed, width=30),
            f"{elapsed:.1f} / {cfg.duration:g} s",
        )
        grid.add_row("elapsed", clock)
        rate = "-" if math.isnan(f["rate"]) else f"{f['rate']:,.0f}"
        grid.add_row(rate_label(cfg), f"[cyan]{rate}[/]   (total {f['total']:,})")
        if cfg.use_lock:
            handoff = f"[cyan]{ms_text(f['p50'])}[/] / [cyan]{ms_text(f['p99'])}[/]"
            grid.add_row("handoff p50 / p99", handoff)
        else:
            grid.add_row("handoff", "n/a (no lock: nothing is handed over)")
        grid.add_row("tasks waiting", f"{f['waiting']:,} of {cfg.processes * cfg.tasks:,}")
        grid.add_row("connections in use", f["connections"])
        grid.add_row("commands in flight", f"{f['in_flight']:,}")
        grid.add_row(
            "holds per lock" if cfg.use_lock else "cycles per name (no lock)",
            " · ".join(f"{cfg.lock_name(i)} {n:,}" for i, n in enumerate(f["per_lock"])),
        )
        total = max(1, sum(f["per_process"]))
        grid.add_row(
            "share per process",
            " · ".join(f"{100 * n / total:.0f}%" for n in f["per_process"]),
        )
        self.live.update(
            Panel(grid, title=self.header, title_align="left", expand=False), refresh=force
        )

    def close(self) -> None:
        self.live.stop()


def make_view(cfg: Config, plain: bool, header: str, out: TextIO) -> PlainView | RichView:
    if not plain and out.isatty():
        try:
            return RichView(cfg, header)
        except ImportError:
            pass
    return PlainView(cfg, out)


# --------------------------------------------------------------------------- checks
