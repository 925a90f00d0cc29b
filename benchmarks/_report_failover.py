"""The failover section of the summary and of RESULTS.md (issue 12, item 5).

Its runs (scenarios ``failover_*``) are summarised by the standalone summariser
itself, their scenario names mapped back (so every figure is computed the same
way as elsewhere), per variant (``replicas=0`` / ``replicas=1``) or for the
Redlock libraries side by side; the loss runs are counted here.
"""

# ruff: noqa: E501  (a report writer: long format strings, units and signs in the text)

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._analysis import pct
from benchmarks._report_fmt import _div, _f, _met, _t

#: (scenario in the failover section, scenario and variant for the standalone summariser)
REPLICAS = {
    "failover_replicas_uncontended": ("uncontended", "1 task"),
    "failover_replicas_spread": ("throughput", "spread"),
}
REDLOCK = {
    "failover_redlock_uncontended": ("uncontended", "1 task"),
    "failover_redlock_handoff": ("handoff", "in-process"),
}
#: Issue 12, item 5: acquire + release with replicas=1 at most this many times without.
REPLICAS_LIMIT = 1.5
#: "At least 20 forced-lag failovers" per setting.
LOSS_RUNS = 20
PEERS = ("pottery", "aioredlock")


def _plain(
    raw: dict[str, Any], plain: Callable[[dict[str, Any]], dict[str, Any]],
    mapping: dict[str, tuple[str, str]], variant: str | None,
) -> dict[str, Any]:  # fmt: skip
    runs = []
    for r in raw["runs"]:
        if r["scenario"] in mapping and (variant is None or r["variant"] == variant):
            scenario, v = mapping[r["scenario"]]
            runs.append({**r, "scenario": scenario, "variant": v})
    if not runs:
        return {}
    meta = {k: v for k, v in raw["meta"].items() if k != "failover_skipped"}
    sub = plain({"meta": meta, "runs": runs})
    return {k: sub[k] for k in ("uncontended", "handoff", "throughput")}


def summarise(
    raw: dict[str, Any], plain: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """Per variant figures, the Redlock comparison, the loss table and the targets."""
    variants = sorted({r["variant"] for r in raw["runs"] if r["scenario"] in REPLICAS})
    replicas = {v: _plain(raw, plain, REPLICAS, v) for v in variants}
    redlock = _plain(raw, plain, REDLOCK, None)
    loss: dict[str, Any] = {}
    for r in raw["runs"]:
        if r["scenario"] == "failover_loss" and isinstance(r["result"], list):
            loss = _loss(r["result"][0]) | {"loop": r["loop"]}
    s = {
        "servers": raw["meta"].get("failover", {}),
        "skipped": raw["meta"].get("failover_skipped"),
        "replicas": replicas,
        "redlock": redlock,
        "loss": loss,
        "config": raw["meta"].get("config", {}).get("failover", {}),
    }
    s["targets"] = _targets(s, raw["meta"]["loops"])
    return s


def _loss(res: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for run in res["runs"]:
        for key in (f"replicas={run['replicas']}, {run['lag']} lag", f"replicas={run['replicas']}"):
            row = rows.setdefault(key, {"runs": 0, "granted": 0, "refused": 0, "double": 0,
                                        "kept": 0, "failed": 0, "errors": 0, "_ms": []})  # fmt: skip
            row["runs"] += 1
            if "failed" in run:
                row["failed"] += 1
                row.setdefault("failures", []).append(run["failed"][-200:])
                continue
            row["granted"] += run["granted"]
            row["refused"] += run["refused"]
            row["double"] += run["double"]
            row["kept"] += bool(run["granted"] and not run.get("second_granted"))
            row["errors"] += bool(not run["granted"] and not run["refused"])
            if "error" in run and not run["refused"]:
                row.setdefault("other_errors", []).append(run["error"][-200:])
            row["_ms"].append(run["acquire_ms"])
    for row in rows.values():
        row["acquire_ms_p50"] = pct(row["_ms"], 50)
        row["acquire_ms_max"] = max(row["_ms"], default=math.nan)
    return {
        "rows": dict(sorted(rows.items())),
        "resync_s_p50": pct(res.get("resync_s", []), 50),
        "wall_s": res.get("wall_s"),
        "lease": res.get("lease"),
        "replica_timeout": res.get("replica_timeout"),
        "short_lag": res.get("short_lag"),
    }


def _entry(part: dict[str, Any], scenario: str, lib: str, loop: str) -> dict[str, Any] | None:
    t = part.get(scenario, {})
    if scenario in ("handoff", "throughput"):
        t = next(iter(t.values()), {})
    found: dict[str, Any] | None = t.get(lib, {}).get(loop)
    return found


def _wait_per_acq(e: dict[str, Any] | None) -> float | None:
    if not e:
        return None
    return float(e.get("by_command_per_acq", {}).get("wait", 0.0))


def _targets(s: dict[str, Any], loops: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    base, rep = s["replicas"].get("replicas=0", {}), s["replicas"].get("replicas=1", {})
    for loop in loops:
        e0, e1 = (
            _entry(base, "uncontended", "aiolock", loop),
            _entry(rep, "uncontended", "aiolock", loop),
        )
        if e0 and e1:
            for q in ("p50", "p99"):
                x = _div(e1[q], e0[q])
                out.append(_t(f"replicas=1: uncontended acquire+release {q} / without", loop, x,
                              REPLICAS_LIMIT, "<=", f"{x:.2f}x ({e1[q]:.0f} vs {e0[q]:.0f} µs)"))  # fmt: skip
        e0, e1 = (
            _entry(base, "throughput", "aiolock", loop),
            _entry(rep, "throughput", "aiolock", loop),
        )
        if e0 and e1:
            x = _div(e0["acq_per_s"], e1["acq_per_s"])
            n = e1.get("tasks", "?")
            out.append(_t(f"replicas=1: {n} tasks over {n} names, time per acquisition / without", loop, x,
                          REPLICAS_LIMIT, "<=", f"{x:.2f}x ({e1['acq_per_s']:.0f} vs {e0['acq_per_s']:.0f} acq/s)",
                          f"WAIT calls per acquisition: {_f(_wait_per_acq(e1), '.3f')} (group commit)"))  # fmt: skip
    red = s["redlock"]
    if red:
        for loop in loops:
            a = _entry(red, "uncontended", "aiolock", loop)
            peers = {p: e for p in PEERS if (e := _entry(red, "uncontended", p, loop))}
            if a and peers:
                best = min(peers, key=lambda p: peers[p]["p50"])
                x = _div(a["p50"], peers[best]["p50"])
                out.append(_t("Redlock, 3 masters: uncontended acquire+release p50 / the best peer's", loop, x,
                              1.0, "<=", f"{x:.2f}x ({a['p50']:.0f} vs {best} {peers[best]['p50']:.0f} µs)"))  # fmt: skip
            a = _entry(red, "handoff", "aiolock", loop)
            peers = {p: e for p in PEERS if (e := _entry(red, "handoff", p, loop))}
            if a and peers:
                best = min(peers, key=lambda p: peers[p]["p50"])
                x = _div(a["p50"], peers[best]["p50"])
                out.append(_t("Redlock, 3 masters: handoff p50 (release -> next holder) / the best peer's", loop, x,
                              1.0, "<", f"{x:.3f}x ({a['p50']:.0f} vs {best} {peers[best]['p50']:.0f} µs)",
                              "event-driven wake-up against polling"))  # fmt: skip
                best = max(peers, key=lambda p: peers[p]["acquisitions"])
                x = _div(a["acquisitions"], peers[best]["acquisitions"])
                out.append(_t("Redlock, 3 masters, contended: acquisitions in the same window / the best peer's", loop, x,
                              1.0, ">=", f"{x:.2f}x ({a['acquisitions']} vs {best} {peers[best]['acquisitions']})",
                              f"tasks still waiting at the end: {a.get('cancelled', 0)}"))  # fmt: skip
    rows = s["loss"].get("rows", {})
    loop = s["loss"].get("loop", loops[0] if loops else "?")
    for setting in ("replicas=0", "replicas=1"):
        row = rows.get(setting)
        if row is None:
            continue
        n = row["runs"] - row["failed"]
        out.append(_t(f"Failover loss, {setting}: forced-lag failovers run", loop, float(n), LOSS_RUNS, ">=",
                      f"{n} ({row['failed']} failed)"))  # fmt: skip
    row = rows.get("replicas=1")
    if row is not None:
        out.append(_t("Failover loss, replicas=1: double holders", loop, float(row["double"]), 0, "==",
                      f"{row['double']} of {row['runs']} ({row['granted']} granted, {row['refused']} refused)"))  # fmt: skip
    row = rows.get("replicas=0")
    if row is not None:
        out.append(_t("Failover loss, replicas=0: double holders seen (the experiment can fail)", loop,
                      float(row["double"]), 1, ">=", f"{row['double']} of {row['runs']}",
                      "a check of the harness, not of aiolock: without WAIT the forced lag must lose locks"))  # fmt: skip
    return out


def markdown(s: dict[str, Any]) -> list[str]:
    """The section's lines."""
    L: list[str] = []
    add = L.append
    add(
        "## Failover (issue 12): the cost of `replicas=1`, Redlock over 3 masters, the loss table\n"
    )
    if s.get("skipped"):
        add(f"**Not run:** {s['skipped']}\n")
        return L
    srv = s["servers"]
    if srv:
        add(f"- Servers started by the harness for this section (`{srv.get('binary')}`): a master "
            f"(port {srv['replicated'][0]}) with one replica (port {srv['replicated'][1]}, replicating "
            f"directly, diskless sync) for `replicas=1`; 3 independent masters (ports "
            f"{', '.join(map(str, srv['redlock']))}) for Redlock; the loss table starts its own.")  # fmt: skip
    add("- `replicas=1` and without ran on the same servers, interleaved in rounds (order "
        "rotating); so did the Redlock libraries. Requests are counted with `INFO commandstats` "
        "on the master (for Redlock: summed over the 3 masters).\n")  # fmt: skip
    add("### Failover targets (issue 12)\n")
    add(
        "| target | loop | measured | required | verdict | by how much | note |\n|---|---|---|---|---|---|---|"
    )
    for t in s["targets"]:
        note = str(t["note"]).replace("|", "\\|").replace("\n", " ")
        add(f"| {t['target']} | {t['loop']} | {t['measured']} | {t['required']} | {_met(t['met'])} | {t['margin']} | {note} |")  # fmt: skip
    met = sum(1 for t in s["targets"] if t["met"])
    add(f"\n{met} of {len(s['targets'])} failover target checks met.\n")
    notes = Path(__file__).with_name("NOT_MET_FAILOVER.md")  # by hand, after a full run
    if notes.exists():
        add(notes.read_text(encoding="utf-8").rstrip() + "\n")

    add("### The cost of `replicas=1`\n")
    add("aiolock on the master of a master + replica pair: `Client.from_url(url)` against "
        "`Client.from_url(url, replicas=1)` (`replica_timeout` 1 s). Uncontended: one task, "
        "acquire + release. Many names: every task on its own name, all at once, so that "
        "acquisitions arrive together and one `WAIT` can cover several (group commit).\n")  # fmt: skip
    base, rep = s["replicas"].get("replicas=0", {}), s["replicas"].get("replicas=1", {})
    add("| measure | loop | replicas=0 | replicas=1 | ratio |\n|---|---|---|---|---|")
    rows = (
        ("uncontended", "p50", "uncontended acquire+release p50 (µs)", ".0f"),
        ("uncontended", "p99", "uncontended acquire+release p99 (µs)", ".0f"),
        ("uncontended", "requests_per_acq", "uncontended: requests / acq", ".2f"),
        ("uncontended", "wait", "uncontended: WAIT / acq", ".2f"),
        ("throughput", "acq_per_s", "many names: acq/s", ".0f"),
        ("throughput", "requests_per_acq", "many names: requests / acq", ".2f"),
        ("throughput", "wait", "many names: WAIT / acq", ".3f"),
        (
            "throughput",
            "client_cpu_us_per_acq",
            "many names: CPU of aiolock's process / acq (µs)",
            ".1f",
        ),
        ("throughput", "server_cpu_us_per_acq", "many names: CPU of the servers / acq (µs)", ".1f"),
    )
    for scenario, field, label, fmt in rows:
        for loop in ("uvloop", "asyncio"):
            e0, e1 = _entry(base, scenario, "aiolock", loop), _entry(rep, scenario, "aiolock", loop)
            if not e0 and not e1:
                continue
            if scenario == "throughput" and field == "acq_per_s":
                n = (e1 or e0 or {}).get("tasks", "?")
                label = f"{n} tasks over {n} names: acq/s"
            if field == "wait":
                v0, v1 = _wait_per_acq(e0), _wait_per_acq(e1)
            else:
                v0, v1 = (e0 or {}).get(field), (e1 or {}).get(field)
            ratio = _div(v1, v0) if v0 is not None and v1 is not None else None
            add(f"| {label} | {loop} | {_f(v0, fmt)} | {_f(v1, fmt)} | {_f(ratio, '.2f')} |")
    add("")

    add("### Redlock over 3 independent masters\n")
    h = s.get("config", {}).get("redlock_handoff", {})
    add("`aiolock.Redlock([c1, c2, c3]).lock(name)` (one `Client.from_url` per master; each "
        "acquisition writes its fencing token back to a majority), pottery's "
        "`AIORedlock(key=name, masters={r1, r2, r3})` and `aioredlock.Aioredlock([m1, m2, m3])` "
        f"on the same 3 servers. Contended: {h.get('tasks', '?')} tasks in one process take turns on one name "
        f"(hold {_f(h.get('hold', math.nan) * 1000, 'g')} ms, then {_f(h.get('think', math.nan) * 1000, 'g')} ms "
        "before trying again, so that the lock goes to a task that was waiting rather than back "
        "to the one that released); 'handoff' is the time from `release()` returning to the next "
        "holder's `acquire()` returning: aiolock's waiters are woken by the release, the peers "
        "poll (pottery: a random 0-0.2 s sleep between attempts, aioredlock: 0.1-0.3 s).\n")  # fmt: skip
    red = s["redlock"]
    if not red:
        add("Not run.\n")
    else:
        add("Requests and script-internal calls are summed over the 3 masters (no target: shown "
            "for what each acquisition costs the servers). 'Same task again': the share of "
            "acquisitions that went to the task that had just released (a poller's waiters are "
            "asleep when the lock comes free).\n")  # fmt: skip
        add("| library | loop | uncontended p50 (µs) | p99 (µs) | requests / acq | script-internal calls / acq | contended: acquisitions | handoff p50 (µs) | handoff p99 (µs) | same task again | contended: requests / acq | contended: script-internal calls / acq |")  # fmt: skip
        add("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for lib in ("aiolock", *PEERS):
            for loop in ("uvloop", "asyncio"):
                u = _entry(red, "uncontended", lib, loop)
                h = _entry(red, "handoff", lib, loop)
                if not u and not h:
                    continue
                u, h = u or {}, h or {}
                add(f"| {lib} | {loop} | {_f(u.get('p50'))} | {_f(u.get('p99'))} | {_f(u.get('requests_per_acq'), '.2f')} | "
                    f"{_f(u.get('inner_per_acq'), '.1f')} | {_f(h.get('acquisitions'))} | {_f(h.get('p50'))} | {_f(h.get('p99'))} | "
                    f"{_f(None if 'same_task_share' not in h else h['same_task_share'] * 100)}% | "
                    f"{_f(h.get('requests_per_acq'), '.1f')} | {_f(h.get('inner_per_acq'), '.1f')} |")  # fmt: skip
        add("")

    add("### Failover loss table\n")
    loss = s["loss"]
    if not loss:
        add("Not run.\n")
        return L
    add(f"A master whose replica replicates through a proxy that can stall the stream. Each run: "
        f"a fresh Client takes and releases a warm-up lock (acknowledged with `replicas=1`), the "
        f"proxy stalls the replication stream, the Client acquires a new name (lease "
        f"{_f(loss['lease'], 'g')} s, `replica_timeout` {_f(loss['replica_timeout'], 'g')} s); "
        f"then the held stream is dropped, the master SIGKILLed and the replica promoted "
        f"(`REPLICAOF NO ONE`, as a Sentinel would), and another Client (without `replicas`) "
        f"tries the same name on the promoted master. A **double holder**: it gets the lock while "
        f"the first still believes it holds it (its lease not lost). 'long' lag: the stream stays "
        f"stalled until the kill; 'short': it resumes after {_f(loss['short_lag'], 'g')} s (less "
        f"than `replica_timeout`) unless the acquisition returned first. `replicas=0` and "
        f"`replicas=1` runs alternate; the killed master comes back empty as the new master's "
        f"replica (re-sync p50 {_f(loss['resync_s_p50'], '.2f')} s). "
        f"{_f(loss.get('wall_s'), '.0f')} s in all.\n")  # fmt: skip
    add(
        "| setting | runs | granted | refused (ReplicationError) | double holders | lock kept on the promoted master | acquisition time p50 / max (ms) | failed runs |"
    )
    add("|---|---|---|---|---|---|---|---|")
    for key, row in loss["rows"].items():
        bold = "**" if "lag" not in key else ""
        add(f"| {bold}{key}{bold} | {row['runs']} | {row['granted']} | {row['refused']} | {bold}{row['double']}{bold} | "
            f"{row['kept']} | {_f(row['acquire_ms_p50'], '.1f')} / {_f(row['acquire_ms_max'], '.1f')} | {row['failed']} |")  # fmt: skip
    add("")
    for key, row in loss["rows"].items():
        for what in ("failures", "other_errors"):
            for msg in row.get(what, [])[:3]:
                add(f"- {key}: {what.replace('_', ' ')}: `{msg}`")
    add("")
    return L
