"""Turn raw results into a summary, RESULTS.md and PNG plots."""

# ruff: noqa: E501, RUF001  (a report writer: long format strings, units and signs in the text)

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from benchmarks import _libs
from benchmarks._analysis import (
    check_history,
    classify,
    fairness,
    handoffs,
    merge_stats,
    pct,
    per_acquisition,
)
from benchmarks._report_fmt import _div, _f, _met, _t

KIB = 1024
#: Throughput targets against redis-py's default Lock, per variant.
THROUGHPUT_TARGETS = {"10": 2.0, "1000": 10.0}
#: "Near 1/T": the busiest task's share at most this many times the fair share.
FAIR_SHARE_LIMIT = 2.0
#: "A handful" of renewal calls per watchdog interval.
HANDFUL = 10
#: A floor whose p99 is this many times its p50 was measured on a noisy machine.
NOISY = 10.0
#: "Bounded" command connections for the scale scenario (aiolock uses one).
COMMAND_CONNECTIONS_LIMIT = 4


def strip(obj: Any) -> Any:
    """The summary without the raw samples (kept only for the plots)."""
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj


def _lat(samples: list[float]) -> dict[str, Any]:
    return {"n": len(samples), "p50": pct(samples, 50), "p99": pct(samples, 99)}


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _mem_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return math.nan


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    meta = dict(raw["meta"])
    meta.update(
        cpu=_cpu(),
        cores=os.cpu_count(),
        mem_gib=_mem_gib(),
        python=platform.python_version(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        load_end=os.getloadavg(),
    )
    s: dict[str, Any] = {
        "meta": meta,
        "errors": [],
        "floor": {},
        "uncontended": {},
        "handoff": {},
        "throughput": {},
        "scale": {},
        "watchdog": {},
    }
    groups: dict[tuple[str, str, str, str], list[Any]] = {}
    for run in raw["runs"]:
        res = run["result"]
        if isinstance(res, dict) and "error" in res:
            s["errors"].append({k: run[k] for k in ("scenario", "variant", "lib", "loop", "round")}
                               | {"error": res["error"]})  # fmt: skip
            continue
        groups.setdefault((run["scenario"], run["variant"], run["lib"], run["loop"]), []).append(
            res
        )

    for (scenario, variant, lib, loop), results in groups.items():
        if scenario == "floor":
            per = [r[0] for r in results]
            s["floor"][loop] = {
                k: _lat([x for r in per for x in r[f"{k}_us"]])
                | {"_samples": [x for r in per for x in r[f"{k}_us"]]}
                for k in ("raw_ping", "raw_pair", "redispy_ping", "redispy_pair")
            }
        elif scenario == "uncontended":
            per = [r[0] for r in results]
            samples = [x for r in per for x in r["samples_us"]]
            acq = sum(r["acquisitions"] for r in per)
            entry = _lat(samples) | per_acquisition(
                lib, merge_stats(r["cmdstats"] for r in per), acq
            )
            entry["_samples"] = samples
            if "reentrant_us" in per[0]:
                re = [x for r in per for x in r["reentrant_us"]]
                c = classify(lib, merge_stats(r["reentrant_cmdstats"] for r in per))
                entry["reentrant"] = _lat(re) | {
                    "requests": c["requests"],
                    "same_token": all(r["reentrant_same_token"] for r in per),
                }
            s["uncontended"].setdefault(lib, {})[loop] = entry
        elif scenario == "handoff":
            samples_all: list[float] = []
            same_all = acq_all = cancelled = 0
            for procs in results:
                events = [e for r in procs for e in r["events"]]
                hs, same, acq = handoffs(events)
                samples_all += hs
                same_all += same
                acq_all += acq
                cancelled += sum(r["cancelled"] for r in procs)
            stats = merge_stats(r[0]["cmdstats"] for r in results)
            entry = _lat(samples_all) | {
                "acquisitions": acq_all,
                "same_task": same_all,
                "same_task_share": same_all / max(acq_all - 1, 1),
                "cancelled": cancelled,
                "_samples": samples_all,
            }
            entry |= per_acquisition(lib, stats, acq_all)
            s["handoff"].setdefault(variant, {}).setdefault(lib, {})[loop] = entry
        elif scenario == "throughput":
            rates: list[float] = []
            worst: dict[str, Any] = {"starved": 0, "busiest_share_x_tasks": 0.0}
            total_acq = 0
            stats_list = []
            violations = 0
            history_violations = 0
            tokens_ok = True
            tokens_checked = 0
            cancelled = 0
            conns: list[Any] = []
            client_cpu = server_cpu = 0.0
            for procs in results:
                counts = [c for r in procs for c in r["counts"]]
                elapsed = procs[0]["elapsed_s"]
                f = fairness(counts)
                rates.append(_div(f["acquisitions"], elapsed))
                worst["starved"] = max(worst["starved"], f["starved"])
                worst["busiest_share_x_tasks"] = max(
                    worst["busiest_share_x_tasks"], f["busiest_share_x_tasks"]
                )
                worst["tasks"] = f["tasks"]
                total_acq += f["acquisitions"]
                stats_list.append(procs[0]["cmdstats"])
                violations += sum(r["violations"] for r in procs)
                history_violations += len(check_history(procs))
                tokens_ok = tokens_ok and all(r["tokens_increasing"] for r in procs)
                tokens_checked += sum(r["tokens_checked"] for r in procs)
                cancelled += sum(r["cancelled"] for r in procs)
                conns.append(procs[0].get("connections"))
                client_cpu += sum(r.get("client_cpu_s", math.nan) for r in procs)
                server_cpu += procs[0].get("server_cpu_s") or math.nan
            entry = {
                "acq_per_s": statistics.median(rates),
                "rounds": rates,
                "acquisitions": total_acq,
                "violations": violations,
                # Every process's holds merged and proved by aiolock's history
                # checker: mutual exclusion and token order across processes.
                "history_violations": history_violations if tokens_checked else None,
                "tokens_increasing": tokens_ok if tokens_checked else None,
                "cancelled_at_end": cancelled,
                "connections": conns[-1],
                # CPU time in the measured window per acquisition: the library's processes,
                # and the server's (a cluster's: every node's, replicas too).
                "client_cpu_us_per_acq": _div(client_cpu * 1e6, total_acq),
                "server_cpu_us_per_acq": _div(server_cpu * 1e6, total_acq),
            } | worst
            entry |= per_acquisition(lib, merge_stats(stats_list), total_acq)
            s["throughput"].setdefault(variant, {}).setdefault(lib, {})[loop] = entry
        elif scenario == "scale":
            r = results[0][0]
            s["scale"].setdefault(lib, {})[loop] = r
        elif scenario == "watchdog":
            r = results[0][0]
            c = classify("aiolock", r["cmdstats"])
            intervals = r["elapsed_s"] / r["interval"]
            lags = r["lags_us"]
            s["watchdog"][loop] = {
                "locks": r["locks"],
                "lease": r["lease"],
                "interval": r["interval"],
                "elapsed_s": r["elapsed_s"],
                "renew_calls": c["script_calls"],
                "requests": c["requests"],
                "inner_calls": c["inner_calls"],
                "calls_per_interval": c["script_calls"] / intervals if intervals else math.nan,
                "lag_p50_ms": pct(lags, 50) / 1000,
                "lag_p99_ms": pct(lags, 99) / 1000,
                "lag_max_ms": max(lags, default=math.nan) / 1000,
                "idle_lag_p99_ms": pct(r["idle_lags_us"], 99) / 1000,
                "acquire_lag_p99_ms": pct(r["acquire_lags_us"], 99) / 1000,
                "acquire_s": r["acquire_s"],
                "release_s": r["release_s"],
                "lost": r["lost"],
            }

    _ratios(s)
    s["targets"] = _targets(s)
    for t in s["targets"]:
        f = s["floor"].get(t["loop"])
        ratio_to_floor = "PING" in t["target"] or "EVALSHA" in t["target"]
        if (
            f
            and ratio_to_floor
            and "p99" in t["target"]
            and f["raw_ping"]["p99"] > NOISY * f["raw_ping"]["p50"]
        ):
            t["note"] = (t["note"] + "; " if t["note"] else "") + (
                f"floor p99 is {f['raw_ping']['p99'] / f['raw_ping']['p50']:.0f}x its p50 on "
                "this loop: machine noise, read this p99 ratio with care"
            )
    if any(run["scenario"].startswith("cluster_") for run in raw["runs"]):
        from benchmarks import _report_cluster

        s["cluster"] = _report_cluster.summarise(raw, summarise)
    if any(run["scenario"].startswith("failover_") for run in raw["runs"]) or raw["meta"].get(
        "failover_skipped"
    ):
        from benchmarks import _report_failover

        s["failover"] = _report_failover.summarise(raw, summarise)
    return s


def _ratios(s: dict[str, Any]) -> None:
    floor = s["floor"]
    for loops in s["uncontended"].values():
        for loop, e in loops.items():
            f = floor.get(loop if loop in floor else next(iter(floor), ""), {})
            if f:
                e["x_pair_p50"] = _div(e["p50"], f["raw_pair"]["p50"])
                e["x_pair_p99"] = _div(e["p99"], f["raw_pair"]["p99"])
                e["x_ping_p50"] = _div(e["p50"], f["raw_ping"]["p50"])
    for _variant, libs in s["handoff"].items():
        for _lib, loops in libs.items():
            for loop, e in loops.items():
                f = floor.get(loop if loop in floor else next(iter(floor), ""), {})
                if f:
                    e["x_ping_p50"] = _div(e["p50"], f["raw_ping"]["p50"])
                    e["x_ping_p99"] = _div(e["p99"], f["raw_ping"]["p99"])
    for _variant, libs in s["throughput"].items():
        for _lib, loops in libs.items():
            for loop, e in loops.items():
                ref = libs.get("redis-py", {}).get(loop if loop != "threads" else "asyncio")
                best_peer = max(
                    (
                        v["acq_per_s"]
                        for name, lp in libs.items()
                        if name not in ("aiolock", "asyncio.Lock")
                        for v in lp.values()
                    ),
                    default=math.nan,
                )
                ceiling = libs.get("asyncio.Lock", {}).get(loop)
                e["x_redispy"] = _div(e["acq_per_s"], ref["acq_per_s"] if ref else math.nan)
                e["x_best_peer"] = _div(e["acq_per_s"], best_peer)
                e["x_ceiling"] = _div(e["acq_per_s"], ceiling["acq_per_s"] if ceiling else math.nan)


def _targets(s: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    loops = s["meta"]["loops"]
    a_unc = s["uncontended"].get("aiolock", {})
    for loop in loops:
        e = a_unc.get(loop)
        if e and "x_pair_p50" in e:
            out.append(_t("Uncontended acquire+release p50 / EVALSHA pair p50", loop,
                          e["x_pair_p50"], 1.1, "<=", f"{e['x_pair_p50']:.2f}x ({e['p50']:.0f} µs)"))  # fmt: skip
            out.append(_t("Uncontended acquire+release p99 / EVALSHA pair p99", loop,
                          e["x_pair_p99"], 1.1, "<=", f"{e['x_pair_p99']:.2f}x ({e['p99']:.0f} µs)"))  # fmt: skip
        if e and "reentrant" in e:
            re = e["reentrant"]
            out.append(_t("Re-entrant acquire+release: Redis requests", loop, float(re["requests"]),
                          0, "==", f"{re['requests']} requests, p50 {re['p50']:.1f} µs"))  # fmt: skip
    for variant, limit in (("in-process", 1.0), ("cross-process", 1.5)):
        op = "<" if variant == "in-process" else "<="
        for loop in loops:
            e = s["handoff"].get(variant, {}).get("aiolock", {}).get(loop)
            if e and "x_ping_p50" in e:
                for q in ("p50", "p99"):
                    out.append(_t(f"Handoff {variant} (10 waiters) {q} / PING {q}", loop,
                                  e[f"x_ping_{q}"], limit, op,
                                  f"{e[f'x_ping_{q}']:.2f}x ({e[q]:.0f} µs)"))  # fmt: skip
    tp = s["throughput"]
    for variant, minimum in THROUGHPUT_TARGETS.items():
        for loop in loops:
            e = tp.get(variant, {}).get("aiolock", {}).get(loop)
            if e:
                out.append(_t(f"Throughput {variant} tasks / redis-py Lock", loop, e["x_redispy"],
                              minimum, ">=", f"{e['x_redispy']:.1f}x ({e['acq_per_s']:.0f}/s)"))  # fmt: skip
    for loop in loops:
        entries = {
            v: libs["aiolock"][loop] for v, libs in tp.items() if loop in libs.get("aiolock", {})
        }
        if not entries:
            continue
        worst_req = max(entries.items(), key=lambda kv: kv[1]["requests_per_acq"])
        out.append(_t("Requests to Redis per acquisition, every size (max)", loop,
                      worst_req[1]["requests_per_acq"], 3, "<=",
                      f"{worst_req[1]['requests_per_acq']:.2f} (at {worst_req[0]})"))  # fmt: skip
        one_proc = {v: e for v, e in entries.items() if "x" not in v}
        inner = [e["inner_per_acq"] for e in one_proc.values()]
        if inner:
            growth = max(inner) / min(inner) if min(inner) > 0 else math.nan
            out.append(_t(f"Script-internal calls per acquisition, {' / '.join(one_proc)} tasks "
                          "in one process: max/min", loop, growth, 1.2, "<=",
                          f"{growth:.2f} ({' / '.join(f'{x:.2f}' for x in inner)})",
                          "across processes: " + ", ".join(
                              f"{v}: {e['inner_per_acq']:.2f}" for v, e in entries.items()
                              if "x" in v)))  # fmt: skip
        starved = sum(e["starved"] for e in entries.values())
        out.append(_t("Starved tasks (no acquisition), all sizes", loop, float(starved), 0, "==",
                      str(starved)))  # fmt: skip
        worst_share = max(entries.items(), key=lambda kv: kv[1]["busiest_share_x_tasks"])
        out.append(_t("Busiest task's share x T (1 = perfectly even)", loop,
                      worst_share[1]["busiest_share_x_tasks"], FAIR_SHARE_LIMIT, "<=",
                      f"{worst_share[1]['busiest_share_x_tasks']:.2f} (at {worst_share[0]})"))  # fmt: skip
        viol = sum(e["violations"] for e in entries.values())
        out.append(_t("Mutual exclusion violations seen in-process", loop, float(viol), 0, "==",
                      str(viol)))  # fmt: skip
        hist = [e.get("history_violations") for e in entries.values()]
        if any(h is not None for h in hist):
            bad = sum(h or 0 for h in hist)
            out.append(_t("History checker violations across processes", loop, float(bad), 0,
                          "==", str(bad)))  # fmt: skip
    for loop in loops:
        e = s["scale"].get("aiolock", {}).get(loop)
        if not e:
            continue
        n = e["waiters"]
        kib = e["traced_per_waiter"] / KIB
        out.append(_t(f"Memory per waiting task ({n:,} waiters, tracemalloc)", loop, kib, 2.0,
                      "<=", f"{kib:.2f} KiB (RSS {e['rss_per_waiter'] / KIB:.2f} KiB)"))  # fmt: skip
        conns = e["connections"]
        out.append(_t("Pub/sub connections while waiting", loop, float(conns["pubsub"]), 1, "==",
                      str(conns["pubsub"])))  # fmt: skip
        out.append(_t("Command connections while waiting", loop, float(conns["command"]),
                      COMMAND_CONNECTIONS_LIMIT, "<=", str(conns["command"])))  # fmt: skip
        out.append(_t("Waiters that acquired in the end", loop, float(e["acquired"]), float(n),
                      "==", f"{e['acquired']:,} / {n:,} in {e['all_acquired_s']:.1f} s"))  # fmt: skip
        out.append(_t("Cancelling every waiter (s)", loop, e["cancel_s"], 1.0, "<",
                      f"{e['cancel_s']:.2f} s"))  # fmt: skip
        left = {k: v for k, v in e["leftovers"].items() if v}
        out.append(_t("Left behind after cancelling (keys, channels, local state)", loop,
                      float(len(left)), 0, "==", "nothing" if not left else str(left)))  # fmt: skip
    for loop in loops:
        w = s["watchdog"].get(loop)
        if not w:
            continue
        out.append(_t(f"Watchdog: renewal calls per interval ({w['locks']:,} locks)", loop,
                      w["calls_per_interval"], HANDFUL, "<=",
                      f"{w['calls_per_interval']:.1f} (lost: {w['lost']})"))  # fmt: skip
        out.append(_t(f"Watchdog: leases lost while renewed ({w['locks']:,} locks, "
                      f"{w['lease']:g} s lease)", loop, float(w["lost"]), 0, "==",
                      f"{w['lost']:,}"))  # fmt: skip
        out.append(_t("Watchdog: event loop lag p99 (ms)", loop, w["lag_p99_ms"], 5.0, "<",
                      f"{w['lag_p99_ms']:.2f} ms (max {w['lag_max_ms']:.1f})"))  # fmt: skip
    return out


# --------------------------------------------------------------------------- markdown


def _order(libs: dict[str, Any]) -> list[str]:
    known = [lib for lib in ("floor", *_libs.LIBS) if lib in libs]
    return known + [lib for lib in libs if lib not in known]


def _loops(entry: dict[str, Any]) -> list[str]:
    return [lp for lp in ("uvloop", "asyncio", "threads") if lp in entry]


def markdown(s: dict[str, Any], plots: list[str]) -> str:
    m = s["meta"]
    L: list[str] = []
    add = L.append
    add("# aiolock benchmark results\n")
    add(f"Generated by `{m.get('command', 'python -m benchmarks')}` on {m['date']} "
        f"in {m.get('wall_s', 0):.0f} s{' (QUICK configuration: tiny, not meaningful)' if m['quick'] else ''}.\n")  # fmt: skip
    add(f"- Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']:.0f} GiB; Python {m['python']}; "
        f"redis-server {m['server_version']} (started by the harness on a free port, no persistence).")  # fmt: skip
    add(f"- aiolock: {m.get('aiolock_source', '?')}.")
    loads = [f"{name} {' / '.join(f'{x:.1f}' for x in m[key])}"
             for key, name in (("load_start", "at the start"), ("load_end", "at the end"))
             if m.get(key)]  # fmt: skip
    if loads:
        add(
            f"- Load average (1/5/15 min) {', '.join(loads)}: other work on the machine shares "
            "its cores with the benchmark; the interleaved rounds spread that noise evenly."
        )
    add(
        f"- Event loops: {', '.join(m['loops'])}; python-redis-lock runs in OS threads ('threads')."
    )
    add("- Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".")
    if m["unavailable"]:
        for lib, reason in m["unavailable"].items():
            add(f"- **{lib}: unavailable:** {reason}")
    add("- Every figure below was measured in this one run, against the same server; rounds "
        "interleave the libraries (their order rotating each round).\n")  # fmt: skip
    if s["errors"]:
        add("## Runs that failed\n")
        add("| scenario | variant | library | loop | round | error |\n|---|---|---|---|---|---|")
        for e in s["errors"]:
            err = str(e["error"]).strip().splitlines()[-1][:160].replace("|", "\\|")
            add(f"| {e['scenario']} | {e['variant']} | {e['lib']} | {e['loop']} | {e['round']} | {err} |")  # fmt: skip
        add("")

    add("## Targets (issue 5)\n")
    add(
        "| target | loop | measured | required | verdict | by how much | note |\n|---|---|---|---|---|---|---|"
    )
    for t in s["targets"]:
        add(f"| {t['target']} | {t['loop']} | {t['measured']} | {t['required']} | {_met(t['met'])} | {t['margin']} | {t['note']} |")  # fmt: skip
    met = sum(1 for t in s["targets"] if t["met"])
    add(f"\n{met} of {len(s['targets'])} target checks met.\n")
    notes = Path(__file__).with_name("NOT_MET.md")
    if notes.exists():
        add(notes.read_text(encoding="utf-8").rstrip() + "\n")

    if s["floor"]:
        add("## Floor: the physical limit of one task\n")
        add("Measured from one task with a minimal asyncio protocol (`transport.write` of pre-packed "
            "RESP + `hiredis.Reader`, the least Python can do per command), and with redis-py's "
            "asyncio client for comparison. The 'EVALSHA pair' is two sequential EVALSHA calls of "
            "`return 1`: the round trips an acquire plus a release need at least.\n")  # fmt: skip
        add("| loop | PING p50 | PING p99 | EVALSHA pair p50 | EVALSHA pair p99 | redis-py PING p50 | redis-py pair p50 | redis-py pair p99 |")  # fmt: skip
        add("|---|---|---|---|---|---|---|---|")
        for loop in _loops(s["floor"]):
            f = s["floor"][loop]
            add(f"| {loop} | {_f(f['raw_ping']['p50'])} µs | {_f(f['raw_ping']['p99'])} µs | "
                f"{_f(f['raw_pair']['p50'])} µs | {_f(f['raw_pair']['p99'])} µs | "
                f"{_f(f['redispy_ping']['p50'])} µs | {_f(f['redispy_pair']['p50'])} µs | "
                f"{_f(f['redispy_pair']['p99'])} µs |")  # fmt: skip
        add("")

    if s["uncontended"]:
        add("## Uncontended acquire + release (one task, one lock)\n")
        add("Ratios are to the EVALSHA pair of the same loop. 'Requests' counts every command the "
            "library sent (script calls, plain commands and connection set-up) per acquisition; "
            "'inner' the commands its scripts ran inside Redis.\n")  # fmt: skip
        add("| library | loop | p50 | p99 | p50 / pair | p99 / pair | requests / acq | inner / acq | commands |")  # fmt: skip
        add("|---|---|---|---|---|---|---|---|---|")
        for lib in _order(s["uncontended"]):
            for loop in _loops(s["uncontended"][lib]):
                e = s["uncontended"][lib][loop]
                cmds = ", ".join(f"{k} {v:g}" for k, v in e["by_command_per_acq"].items())
                add(f"| {lib} | {loop} | {_f(e['p50'])} µs | {_f(e['p99'])} µs | "
                    f"{_f(e.get('x_pair_p50'), '.2f')} | {_f(e.get('x_pair_p99'), '.2f')} | "
                    f"{_f(e['requests_per_acq'], '.2f')} | {_f(e['inner_per_acq'], '.1f')} | {cmds} |")  # fmt: skip
        add("")
        a = s["uncontended"].get("aiolock", {})
        rows = [(loop, a[loop]["reentrant"]) for loop in _loops(a) if "reentrant" in a[loop]]
        if rows:
            add("Re-entrant acquire + release by the task that already holds the lock (aiolock only; "
                "the peers are not re-entrant):\n")  # fmt: skip
            add(
                "| loop | p50 | p99 | requests to Redis | same fencing token |\n|---|---|---|---|---|"
            )
            for loop, re in rows:
                add(f"| {loop} | {_f(re['p50'], '.1f')} µs | {_f(re['p99'], '.1f')} µs | {re['requests']} | {re['same_token']} |")  # fmt: skip
            add("")

    if s["handoff"]:
        add("## Handoff: from `release()` returning to the next waiter's `acquire()` returning\n")
        add("Each task loops: acquire, hold 1 ms, release, think 1 ms. In-process: 11 tasks in one "
            "process (10 waiting while one holds). Cross-process: 11 processes of one task each, "
            "events merged on the system-wide monotonic clock. Consecutive acquisitions by the "
            "same task are not handoffs ('releaser re-took it'). A negative handoff means the "
            "lock reached the next holder before the releasing call returned. Ratios are to the "
            "PING round trip (raw floor) of the same loop, percentile for percentile.\n")  # fmt: skip
        for variant in ("in-process", "cross-process"):
            libs = s["handoff"].get(variant)
            if not libs:
                continue
            add(f"### {variant}\n")
            add("| library | loop | handoffs | p50 | p99 | p50 / PING | p99 / PING | releaser re-took it | requests / acq |")  # fmt: skip
            add("|---|---|---|---|---|---|---|---|---|")
            for lib in _order(libs):
                for loop in _loops(libs[lib]):
                    e = libs[lib][loop]
                    add(f"| {lib} | {loop} | {e['n']} | {_f(e['p50'])} µs | {_f(e['p99'])} µs | "
                        f"{_f(e.get('x_ping_p50'), '.2f')} | {_f(e.get('x_ping_p99'), '.2f')} | "
                        f"{e['same_task_share'] * 100:.0f}% | {_f(e['requests_per_acq'], '.2f')} |")  # fmt: skip
            add("")

    if s["throughput"]:
        add("## Contended throughput: T tasks on one lock, empty critical section\n")
        add("Acquisitions per second over the measured window (median of the rounds), after a "
            "warm-up. `× redis-py` is against redis-py's default Lock on the same loop; "
            "`× ceiling` against in-process asyncio.Lock. 'Busiest × T' is the busiest task's share "
            "times T (1.0 = perfectly even). 'Starved': tasks with no acquisition in the window. "
            "'Excl.' counts mutual-exclusion violations seen in-process (must be 0).\n")  # fmt: skip
        for variant, libs in s["throughput"].items():
            add(f"### {variant} tasks\n" if "x" not in variant else f"### {variant.replace('x', ' processes × ')} tasks\n")  # fmt: skip
            add("| library | loop | acq/s | × redis-py | × best peer | × ceiling | requests / acq | inner / acq | starved | busiest × T | excl. | conns |")  # fmt: skip
            add("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for lib in _order(libs):
                for loop in _loops(libs[lib]):
                    e = libs[lib][loop]
                    conns = e.get("connections") or {}
                    add(f"| {lib} | {loop} | {_f(e['acq_per_s'])} | {_f(e['x_redispy'], '.1f')} | "
                        f"{_f(e['x_best_peer'], '.2f')} | {_f(e['x_ceiling'], '.3f')} | "
                        f"{_f(e['requests_per_acq'], '.2f')} | {_f(e['inner_per_acq'], '.1f')} | "
                        f"{e['starved']}/{e.get('tasks', '?')} | {_f(e['busiest_share_x_tasks'], '.2f')} | "
                        f"{e['violations']} | {conns.get('total', '–')} |")  # fmt: skip
            add("")
        rows = []
        for variant, libs in s["throughput"].items():
            for lib in _order(libs):
                for loop in _loops(libs[lib]):
                    e = libs[lib][loop]
                    rows.append(f"| {variant} | {lib} | {loop} | " + ", ".join(
                        f"{k} {v:g}" for k, v in e["by_command_per_acq"].items()) + " | " + ", ".join(
                        f"{k} {v:g}" for k, v in e["inner_by_command_per_acq"].items()) + " |")  # fmt: skip
        add("<details><summary>Commands per acquisition, by command</summary>\n")
        add(
            "| tasks | library | loop | sent by the library | run inside scripts |\n|---|---|---|---|---|"
        )
        L.extend(rows)
        add("\n</details>\n")

    if s["scale"]:
        add("## Scale: many tasks waiting on many names in one process\n")
        add("Holders take every name, then the waiters start. Memory per waiter: tracemalloc "
            "(Python allocations, the headline) and RSS delta (a separate spawn, without "
            "tracemalloc). Peers are measured at a smaller size (their per-waiter cost does not "
            "depend on it; 100,000 redis-py waiters would need 100,000 polling tasks and a "
            "connection each). Then every waiter is cancelled (timed, and the server and client "
            "checked for leftovers), spawned again, and the holders release: all must acquire.\n")  # fmt: skip
        add("| library | loop | waiters / names | KiB per waiter (tracemalloc) | KiB per waiter (RSS) | connections (pub/sub + command) | cancel all | left behind | all acquired | time to drain |")  # fmt: skip
        add("|---|---|---|---|---|---|---|---|---|---|")
        for lib in _order(s["scale"]):
            for loop in _loops(s["scale"][lib]):
                e = s["scale"][lib][loop]
                c = e["connections"]
                left = {k: v for k, v in e["leftovers"].items() if v}
                add(f"| {lib} | {loop} | {e['waiters']:,} / {e['names']:,} | "
                    f"{e['traced_per_waiter'] / KIB:.2f} | {e['rss_per_waiter'] / KIB:.2f} | "
                    f"{c['total']} ({c['pubsub']} + {c['command']}) | {e['cancel_s']:.2f} s | "
                    f"{'nothing' if not left else left} | {e['acquired']:,}/{e['waiters']:,} | "
                    f"{e['all_acquired_s']:.1f} s |")  # fmt: skip
        add("")

    if s["watchdog"]:
        add("## Watchdog: many held locks renewed in the background\n")
        add("aiolock with a short client lease (so that several renewal intervals fit in the "
            "run; the batching does not depend on it), every lock held without an explicit lease. "
            "A ticker task sleeping 1 ms measures event loop lag. Peers have no comparable "
            "batched renewal (redis-py, pottery: none; aioredlock, redis-fifo-lock: one task and "
            "one script call per lock per interval; python-redis-lock: one thread per lock).\n")  # fmt: skip
        add("| loop | locks | interval | renewal calls | calls / interval | inner calls | lag p50 | lag p99 | lag max | idle lag p99 | leases lost |")  # fmt: skip
        add("|---|---|---|---|---|---|---|---|---|---|---|")
        for loop in _loops(s["watchdog"]):
            w = s["watchdog"][loop]
            add(f"| {loop} | {w['locks']:,} | {w['interval']:.2f} s | {w['renew_calls']} | "
                f"{w['calls_per_interval']:.1f} | {w['inner_calls']} | {w['lag_p50_ms']:.2f} ms | "
                f"{w['lag_p99_ms']:.2f} ms | {w['lag_max_ms']:.1f} ms | {w['idle_lag_p99_ms']:.2f} ms | {w['lost']} |")  # fmt: skip
        add("")

    if s.get("failover"):
        from benchmarks import _report_failover

        L.extend(_report_failover.markdown(s["failover"]))
    if s.get("cluster"):
        from benchmarks import _report_cluster

        L.extend(_report_cluster.markdown(s["cluster"]))

    if plots:
        add("## Plots\n")
        for p in plots:
            add(f"![{p}]({p})")
        add("")

    add("## How it is measured\n")
    add("- Requests per acquisition: `CONFIG RESETSTAT` at the start of the measured window and "
        "`INFO commandstats` at its end. Redis counts the commands a script runs inside commandstats "
        "too, so each command is attributed: commands the library sends itself (declared per "
        "library in `benchmarks/_libs.py`: EVALSHA, SET, BLPOP, SUBSCRIBE, ...) and connection "
        "set-up (CLIENT SETINFO, SCRIPT LOAD, PING, ...) are requests; everything else ran inside a "
        "script ('inner'). The harness' own INFO/CONFIG/CLIENT LIST are excluded.")  # fmt: skip
    add("- Pools: every redis-py based peer gets a pool of (tasks + 16) connections; redis-py 8's "
        "default asyncio pool would raise `MaxConnectionsError` beyond 100 connections. aioredis "
        "(aioredlock) gets `maxsize` = tasks + 16.")  # fmt: skip
    add(
        "- Processes: each library runs in its own long-lived worker process; multi-process "
        "scenarios use a pool of helper processes; every memory measurement uses a fresh process."
    )
    add(
        "- Connections: `CLIENT LIST` (without the harness' own), at the end of the throughput "
        "window; in the scale scenario, minus those already open before the waiters started "
        "(the holders' client)."
    )
    add(
        "- Percentiles pool the samples of every round. p99 figures are sensitive to other work "
        "on the machine; the targets table flags a loop whose own PING p99 shows it."
    )
    add("- Loop lag: a task sleeping 1 ms in a loop; lag = how late it wakes.")
    add("- Library set-ups:")
    for lib in _libs.LIBS:
        add(f"  - **{lib}**: {_libs.DESCRIPTION[lib]}")
    add("")
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------- plots

_COLORS = {
    "aiolock": "#d62728",
    "redis-py": "#1f77b4",
    "redis-py-10ms": "#17becf",
    "python-redis-lock": "#2ca02c",
    "pottery": "#9467bd",
    "aioredlock": "#8c564b",
    "redis-fifo-lock": "#e377c2",
    "asyncio.Lock": "#7f7f7f",
    "floor": "#000000",
}
_STYLE = {"uvloop": "-", "asyncio": "--", "threads": ":"}


def plot(s: dict[str, Any], out: Path) -> list[str]:
    """Write the PNG plots; returns their file names (empty if matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    files: list[str] = []

    # 1. latency distributions
    panels: list[tuple[str, dict[str, Any]]] = []
    if s["uncontended"]:
        panels.append(("Uncontended acquire + release", s["uncontended"]))
    for variant in ("in-process", "cross-process"):
        if s["handoff"].get(variant):
            panels.append((f"Handoff, {variant} (10 waiters)", s["handoff"][variant]))
    if panels:
        fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.6 * len(panels)), squeeze=False)
        for ax, (title, libs) in zip(axes[:, 0], panels, strict=True):
            labels, data, colors = [], [], []
            for lib in _order(libs):
                for loop in _loops(libs[lib]):
                    samples = [max(x, 1.0) for x in libs[lib][loop].get("_samples", [])]
                    if not samples:
                        continue
                    labels.append(f"{lib}\n{loop}")
                    data.append(samples)
                    colors.append(_COLORS.get(lib, "#333333"))
            if not data:
                continue
            bp = ax.boxplot(data, whis=(1, 99), showfliers=False, patch_artist=True)
            for patch, color in zip(bp["boxes"], colors, strict=True):
                patch.set_facecolor(color)
                patch.set_alpha(0.5)
            ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7, rotation=25, ha="right")
            ax.set_yscale("log")
            ax.set_ylabel("µs (box p25-p75, whiskers p1-p99;\n≤ 1 µs and negative drawn at 1)",
                          fontsize=8)  # fmt: skip
            ax.set_title(title)
            for loop, f in s["floor"].items():
                key = "raw_pair" if title.startswith("Uncontended") else "raw_ping"
                ax.axhline(f[key]["p50"], color="black", lw=0.8, ls=_STYLE.get(loop, "-"),
                           label=f"{'EVALSHA pair' if key == 'raw_pair' else 'PING'} p50 ({loop})")  # fmt: skip
            ax.legend(fontsize=7, loc="upper left")
            ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=110)
        plt.close(fig)
        files.append("latency.png")

    # 2. throughput and requests per acquisition against tasks
    tp = s["throughput"]
    if tp:
        variants = list(tp)
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
        libs = _order({lib: 1 for v in tp.values() for lib in v})
        for lib in libs:
            for loop in ("uvloop", "asyncio", "threads"):
                xs, ys, req, inner = [], [], [], []
                for i, v in enumerate(variants):
                    e = tp[v].get(lib, {}).get(loop)
                    if e:
                        xs.append(i)
                        ys.append(e["acq_per_s"])
                        req.append(e["requests_per_acq"])
                        inner.append(e["inner_per_acq"])
                if not xs:
                    continue
                kw = {"color": _COLORS.get(lib), "ls": _STYLE[loop], "marker": "o", "ms": 4}
                axes[0].plot(xs, ys, label=f"{lib} ({loop})", **kw)
                axes[1].plot(xs, req, **kw)
                axes[2].plot(xs, inner, **kw)
        titles = ("Acquisitions per second", "Requests to Redis per acquisition",
                  "Commands run inside scripts per acquisition")  # fmt: skip
        for ax, title in zip(axes, titles, strict=True):
            ax.set_xticks(range(len(variants)), [v.replace("x", " procs × ") for v in variants])
            ax.set_xlabel("tasks on one lock")
            ax.set_yscale("log")
            ax.set_title(title)
            ax.grid(alpha=0.3)
        axes[1].axhline(3, color="red", lw=0.8, ls=":", label="target: 3")
        axes[1].legend(fontsize=7)
        axes[0].legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)
        files.append("throughput.png")

    # 3. memory per waiter
    if s["scale"]:
        fig, ax = plt.subplots(figsize=(10, 4.2))
        labels, traced, rss, colors = [], [], [], []
        for lib in _order(s["scale"]):
            for loop in _loops(s["scale"][lib]):
                e = s["scale"][lib][loop]
                labels.append(f"{lib}\n{loop}\n{e['waiters']:,} waiters")
                traced.append(e["traced_per_waiter"] / KIB)
                rss.append(max(e["rss_per_waiter"], 0) / KIB)
                colors.append(_COLORS.get(lib, "#333333"))
        x = list(range(len(labels)))
        ax.bar([i - 0.2 for i in x], traced, width=0.4, color=colors, label="tracemalloc")
        ax.bar([i + 0.2 for i in x], rss, width=0.4, color=colors, alpha=0.4, label="RSS delta")
        ax.axhline(2.0, color="red", lw=0.8, ls=":", label="target: 2 KiB")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("KiB per waiting task")
        ax.set_title("Memory per waiting task")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "memory.png", dpi=110)
        plt.close(fig)
        files.append("memory.png")
    return files
