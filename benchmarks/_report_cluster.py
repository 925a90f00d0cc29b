"""The cluster section of the summary and of RESULTS.md (issue 11, item 6).

The cluster section's runs (scenarios ``cluster_*``, variant = the target:
``standalone``, ``redis``, ``valkey``) are summarised per target by the
standalone summariser itself, their scenario names mapped back (so every
figure is computed the same way on both), then set against each other.
"""

# ruff: noqa: E501, RUF001  (a report writer: long format strings, units and signs in the text)

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._report_fmt import _div, _f, _met, _t

#: (scenario in the cluster section, scenario and variant for the standalone summariser)
MAPPED = {
    "cluster_floor": ("floor", "1 task"),
    "cluster_uncontended": ("uncontended", "1 task"),
    "cluster_handoff": ("handoff", "cross-process"),
    "cluster_spread": ("throughput", "spread"),
}
#: Targets of issue 11, item 6.
UNCONTENDED_LIMIT = 1.1
HANDOFF_PING_LIMIT = 1.5
SPREAD_MIN = 0.9
#: "The same" requests per acquisition: handoff counts vary a little with timing.
REQUESTS_SAME = 1.05
FAILOVER_SLACK_S = 1.0
LAG_P99_MS = 5.0
TITLES = {
    "redis": "Redis Cluster",
    "valkey": "Valkey Cluster",
    "redis-noreplicas": "Redis Cluster, no replicas",
}


def summarise(
    raw: dict[str, Any], plain: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """The cluster summary: per target figures, watchdog, failover, and the targets."""
    by_target: dict[str, Any] = {}
    names = sorted({r["variant"] for r in raw["runs"] if r["scenario"] in MAPPED})
    for name in names:
        runs = []
        for r in raw["runs"]:
            if r["scenario"] in MAPPED and r["variant"] == name:
                scenario, variant = MAPPED[r["scenario"]]
                runs.append({**r, "scenario": scenario, "variant": variant})
        sub = plain({"meta": raw["meta"], "runs": runs})
        by_target[name] = {k: sub[k] for k in ("floor", "uncontended", "handoff", "throughput")}
    extra: dict[str, dict[str, Any]] = {"watchdog": {}, "failover": {}}
    for r in raw["runs"]:
        kind = r["scenario"].removeprefix("cluster_")
        if kind in extra and isinstance(r["result"], list):
            extra[kind][r["variant"]] = r["result"][0] | {"loop": r["loop"]}
    s = {
        "clusters": raw["meta"].get("clusters", {}),
        "skipped": raw["meta"].get("clusters_skipped", {}),
        "by_target": by_target,
        **extra,
    }
    s["targets"] = _targets(s, raw["meta"]["loops"])
    return s


def _entry(
    s: dict[str, Any], target: str, scenario: str, lib: str, loop: str
) -> dict[str, Any] | None:
    t = s["by_target"].get(target, {}).get(scenario, {})
    if scenario in ("handoff", "throughput"):
        t = next(iter(t.values()), {})
    found: dict[str, Any] | None = t.get(lib, {}).get(loop)
    return found


def _targets(s: dict[str, Any], loops: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # The no-replica cluster is a diagnostic beside the others: no targets.
    kinds = [k for k in s["by_target"] if k != "standalone" and not k.endswith("-noreplicas")]
    kinds += [k for k in s["failover"] if k not in s["by_target"]]
    for kind in kinds:
        title = TITLES.get(kind, kind)
        for loop in loops:
            base = _entry(s, "standalone", "uncontended", "aiolock", loop)
            e = _entry(s, kind, "uncontended", "aiolock", loop)
            if e and base:
                x = _div(e["p50"], base["p50"])
                out.append(_t(f"{title}: uncontended acquire+release p50 / standalone p50", loop, x,
                              UNCONTENDED_LIMIT, "<=", f"{x:.2f}x ({e['p50']:.0f} vs {base['p50']:.0f} µs)"))  # fmt: skip
            e = _entry(s, kind, "handoff", "aiolock", loop)
            if e and "x_ping_p50" in e:
                out.append(_t(f"{title}: handoff cross-process p50 / PING p50 (a cluster node)", loop,
                              e["x_ping_p50"], HANDOFF_PING_LIMIT, "<=",
                              f"{e['x_ping_p50']:.2f}x ({e['p50']:.0f} µs)"))  # fmt: skip
            base = _entry(s, "standalone", "throughput", "aiolock", loop)
            e = _entry(s, kind, "throughput", "aiolock", loop)
            if e and base:
                x = _div(e["acq_per_s"], base["acq_per_s"])
                n = e.get("tasks", "?")
                out.append(_t(f"{title}: {n} tasks over {n} names, acq/s / standalone", loop, x,
                              SPREAD_MIN, ">=", f"{x:.2f}x ({e['acq_per_s']:.0f} vs {base['acq_per_s']:.0f}/s)"))  # fmt: skip
            for scenario, label in (("uncontended", "uncontended"), ("handoff", "handoff"),
                                    ("throughput", "many names")):  # fmt: skip
                base = _entry(s, "standalone", scenario, "aiolock", loop)
                e = _entry(s, kind, scenario, "aiolock", loop)
                if e and base:
                    x = _div(e["requests_per_acq"], base["requests_per_acq"])
                    out.append(_t(f"{title}: requests per acquisition ({label}) / standalone", loop, x,
                                  REQUESTS_SAME, "<=",
                                  f"{e['requests_per_acq']:.2f} vs {base['requests_per_acq']:.2f}"))  # fmt: skip
        w = s["watchdog"].get(kind)
        if w is not None:
            loop = w["loop"]
            if "skipped" in w:
                out.append(_t(f"{title}: watchdog event loop lag p99 (ms)", loop, None, LAG_P99_MS, "<",
                              "–", w["skipped"]))  # fmt: skip
            else:
                lag = w.get("lag_p99_ms", math.nan)
                out.append(_t(f"{title}: watchdog event loop lag p99 (ms), {w.get('locks', '?'):,} locks", loop,
                              lag, LAG_P99_MS, "<", f"{lag:.2f} ms ({_f(w.get('renewal_calls_per_interval', w.get('calls_per_interval')), '.1f')} renewal calls / interval)"))  # fmt: skip
                lost = w.get("lost")
                out.append(_t(f"{title}: watchdog leases lost", loop,
                              None if lost is None else float(lost), 0, "==", str(lost)))  # fmt: skip
        fo = s["failover"].get(kind)
        if fo is not None:
            loop = fo["loop"]
            cluster_s = fo.get("write_ok_s")
            limit = (cluster_s or math.nan) + FAILOVER_SLACK_S
            for who, label in (("waiter", "a waiting acquire()"), ("retrier", "a caller retrying")):
                got = fo.get(f"{who}_s")
                note = str(fo.get(f"{who}_error", "")).split(". ")[0]
                if who == "retrier" and got is None and fo.get("errors"):
                    note = "only errors: " + ", ".join(f"{k} x{v}" for k, v in fo["errors"].items())
                show = f"{got:.2f} s" if got is not None else "never (within the timeout)"
                if got is not None and cluster_s is not None:
                    show += f", {got - cluster_s:+.2f} s after the cluster"
                t = _t(f"{title}: SIGKILL of a master -> first acquisition on its slots, {label}, "
                       "vs the cluster's failover + 1 s", loop, got if got is not None else math.inf,
                       limit, "<=", f"{show} (cluster: {_f(cluster_s, '.2f')} s)", note[:200])  # fmt: skip
                t["required"] = f"<= {limit:.2f} s"
                if got is None:
                    t["margin"] = "never acquired"
                if math.isnan(limit):
                    t.update(met=None, margin="the cluster's failover time was not measured")
                out.append(t)
    return out


def _row(label: str, lib: str, loop: str, values: list[Any], fmt: str, kinds: list[str]) -> str:
    base = values[0]
    cells = [_f(base, fmt)]
    for v in values[1:]:
        cells += [
            _f(v, fmt),
            _f(_div(v, base) if v is not None and base is not None else None, ".2f"),
        ]
    return f"| {label} | {lib} | {loop} | " + " | ".join(cells) + " |"


def markdown(s: dict[str, Any]) -> list[str]:
    """The section's lines (after the standalone sections)."""
    L: list[str] = []
    add = L.append
    kinds = [k for k in s["by_target"] if k != "standalone"]
    add("## Cluster (issue 11): a local 3 + 3 cluster beside the standalone server\n")
    for kind, c in s["clusters"].items():
        add(f"- {TITLES.get(kind, kind)}: {c['version']} (`{c['binary']}`), 3 masters + {3 * c.get('replicas', 1)} replicas on "
            f"ports {', '.join(map(str, c['ports']))}, `cluster-node-timeout 1000`, started by the "
            f"harness in {c['start_s']:.1f} s.")  # fmt: skip
    for kind, reason in s["skipped"].items():
        add(f"- **{TITLES.get(kind, kind)}: not run:** {reason}")
    add("- Each cell ran on the standalone server and on every cluster, interleaved in rounds "
        "(order rotating): the standalone figures here are this section's own, measured beside "
        "the cluster ones. Requests are counted on every master (`INFO commandstats`, summed), "
        "CPU on every node (`INFO cpu`, replicas too). On a cluster aiolock is `Client.from_url(<a node>, cluster=True)`; redis-py's Lock "
        "(the one peer that supports a cluster) is `RedisCluster.from_url(<a node>, "
        "max_connections=tasks + 16).lock(...)`, the others are not run there. The cross-process "
        "handoff's ratio is to the PING of a cluster node (the 'floor' rows).\n")  # fmt: skip
    add("### Cluster targets (issue 11)\n")
    add(
        "| target | loop | measured | required | verdict | by how much | note |\n|---|---|---|---|---|---|---|"
    )
    for t in s["targets"]:
        note = str(t["note"]).replace("|", "\\|").replace("\n", " ")
        add(f"| {t['target']} | {t['loop']} | {t['measured']} | {t['required']} | {_met(t['met'])} | {t['margin']} | {note} |")  # fmt: skip
    met = sum(1 for t in s["targets"] if t["met"])
    add(f"\n{met} of {len(s['targets'])} cluster target checks met.\n")
    notes = Path(__file__).with_name("NOT_MET_CLUSTER.md")  # by hand, after a full run
    if notes.exists():
        add(notes.read_text(encoding="utf-8").rstrip() + "\n")

    head = "| measure | library | loop | standalone | " + " | ".join(
        f"{TITLES.get(k, k)} | × standalone" for k in kinds) + " |"  # fmt: skip
    add("### Cluster against standalone\n")
    add("'× standalone' divides the cluster figure by the standalone one (for acq/s higher is "
        "better, for times lower is better).\n")  # fmt: skip
    add(head)
    add("|---|---|---|---|" + "---|---|" * len(kinds))
    bt = s["by_target"]
    targets = ["standalone", *kinds]
    floor_loops = [
        lp for lp in ("uvloop", "asyncio") if lp in bt.get("standalone", {}).get("floor", {})
    ]
    for loop in floor_loops:
        for key, label in (
            ("raw_ping", "floor: PING p50 (µs)"),
            ("raw_pair", "floor: EVALSHA pair p50 (µs)"),
        ):
            vals = [
                bt.get(t, {}).get("floor", {}).get(loop, {}).get(key, {}).get("p50")
                for t in targets
            ]
            add(_row(label, "–", loop, vals, ".0f", kinds))
    rows = (
        ("uncontended", "p50", "uncontended acquire+release p50 (µs)", ".0f"),
        ("uncontended", "p99", "uncontended acquire+release p99 (µs)", ".0f"),
        ("uncontended", "requests_per_acq", "uncontended: requests / acq", ".2f"),
        ("handoff", "p50", "handoff cross-process p50 (µs)", ".0f"),
        ("handoff", "p99", "handoff cross-process p99 (µs)", ".0f"),
        ("handoff", "x_ping_p50", "handoff p50 / PING p50 (its node)", ".2f"),
        ("handoff", "requests_per_acq", "handoff: requests / acq", ".2f"),
        ("throughput", "acq_per_s", "many names: acq/s", ".0f"),
        ("throughput", "requests_per_acq", "many names: requests / acq", ".2f"),
        ("throughput", "inner_per_acq", "many names: script-internal calls / acq", ".1f"),
        (
            "throughput",
            "client_cpu_us_per_acq",
            "many names: CPU of the library's process / acq (µs)",
            ".1f",
        ),
        (
            "throughput",
            "server_cpu_us_per_acq",
            "many names: CPU of the server (every node) / acq (µs)",
            ".1f",
        ),
    )
    libs = [lib for lib in ("aiolock", "redis-py") if any(
        _entry(s, "standalone", sc, lib, lp) for sc in ("uncontended", "handoff", "throughput")
        for lp in ("uvloop", "asyncio"))]  # fmt: skip
    for scenario, field, label, fmt in rows:
        for lib in libs:
            for loop in ("uvloop", "asyncio"):
                entries = [_entry(s, t, scenario, lib, loop) for t in targets]
                if entries[0] is None:
                    continue
                if scenario == "throughput" and field == "acq_per_s":
                    n = entries[0].get("tasks", "?")
                    label = f"{n} tasks over {n} names: acq/s"
                add(
                    _row(
                        label, lib, loop, [e.get(field) if e else None for e in entries], fmt, kinds
                    )
                )
    for lib in libs:
        for loop in ("uvloop", "asyncio"):
            entries = [_entry(s, t, "throughput", lib, loop) for t in targets]
            if entries[0] is None:
                continue
            totals = [((e or {}).get("connections") or {}).get("total") for e in entries]
            add(_row("many names: connections open", lib, loop, totals, "", kinds))
    add("")

    add("### Watchdog in a cluster\n")
    if not s["watchdog"]:
        add("Not run.\n")
    for kind, w in s["watchdog"].items():
        if "skipped" in w:
            add(f"- {TITLES.get(kind, kind)}: not measured: {w['skipped']}")
            continue
        shown = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in w.items() if k != "loop" and not isinstance(v, (dict, list)))  # fmt: skip
        add(f"- {TITLES.get(kind, kind)} ({w['loop']}): {shown}")
    add("")

    add("### Failover: a master's SIGKILL\n")
    add("The master serving two lock names is SIGKILLed once a fresh worker has taken and released "
        "both (warm connections and slot map). From the kill on: the cluster's own failover time is "
        "the first plain `SET` on that slot that a live node accepts (no `MOVED`, no `CLUSTERDOWN`; "
        "polled every 5 ms), and 'state ok' when every live node says `cluster_state:ok` with the "
        "slot on a live master. aiolock: one `acquire()` started at the kill (its "
        "timeout shown when it never acquired), and a caller calling `acquire(timeout=0.25)` again after every error.\n")  # fmt: skip
    if not s["failover"]:
        add("Not run.\n")
        return L
    add(
        "| cluster | loop | killed port | slot | cluster: writes ok | cluster: state ok | waiting acquire() | retrying caller | errors seen by the caller |"
    )
    add("|---|---|---|---|---|---|---|---|---|")
    for kind, fo in s["failover"].items():
        errors = ", ".join(f"{k} x{v}" for k, v in fo.get("errors", {}).items()) or "none"
        never = f"not within {fo.get('timeout', '?')} s"
        waiter, retrier = (
            f"{fo[f'{who}_s']:.2f} s" if fo.get(f"{who}_s") is not None else never
            for who in ("waiter", "retrier")
        )
        add(f"| {TITLES.get(kind, kind)} | {fo['loop']} | {fo.get('killed_port')} | {fo.get('slot')} | "
            f"{_f(fo.get('write_ok_s'), '.2f')} s | {_f(fo.get('state_ok_s'), '.2f')} s | "
            f"{waiter} | {retrier} | {errors} |")  # fmt: skip
    add("")
    return L
