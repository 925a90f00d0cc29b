"""Pure functions over raw results: percentiles, request counting, handoffs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks._libs import DIRECT, SETUP


def pct(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; NaN if empty."""
    if not samples:
        return math.nan
    s = sorted(samples)
    if len(s) == 1:
        return float(s[0])
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def merge_stats(stats: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for st in stats:
        for k, v in st.items():
            out[k] = out.get(k, 0) + v
    return out


def classify(lib: str, cmdstats: dict[str, int]) -> dict[str, Any]:
    """Split INFO commandstats calls into the library's own requests and script-internal calls.

    A command the library sends itself (``DIRECT[lib]``) or a connection set-up
    command (``SETUP``) is a request; anything else ran inside a Lua script.
    python-redis-lock sends GET itself (its ``_held`` check) and its unlock
    script calls GET once more per EVALSHA: those are split accordingly.
    """
    direct = DIRECT.get(lib, frozenset())
    requests: dict[str, int] = {}
    setup: dict[str, int] = {}
    inner: dict[str, int] = {}
    for cmd, calls in cmdstats.items():
        if cmd in SETUP:
            setup[cmd] = calls
        elif cmd in direct:
            requests[cmd] = calls
        else:
            inner[cmd] = calls
    if lib == "python-redis-lock" and "get" in requests:
        in_script = min(requests["get"], requests.get("evalsha", 0) + requests.get("eval", 0))
        requests["get"] -= in_script
        inner["get"] = inner.get("get", 0) + in_script
    scripts = sum(requests.get(c, 0) for c in ("evalsha", "eval"))
    return {
        "requests": sum(requests.values()) + sum(setup.values()),
        "lock_requests": sum(requests.values()),
        "setup_requests": sum(setup.values()),
        "script_calls": scripts,
        "inner_calls": sum(inner.values()),
        "by_command": dict(sorted({**requests, **setup}.items())),
        "inner_by_command": dict(sorted(inner.items())),
    }


def per_acquisition(lib: str, cmdstats: dict[str, int], acquisitions: int) -> dict[str, Any]:
    c = classify(lib, cmdstats)
    n = max(acquisitions, 1)
    return {
        "requests_per_acq": c["requests"] / n if acquisitions else math.nan,
        "lock_requests_per_acq": c["lock_requests"] / n if acquisitions else math.nan,
        "script_calls_per_acq": c["script_calls"] / n if acquisitions else math.nan,
        "inner_per_acq": c["inner_calls"] / n if acquisitions else math.nan,
        "by_command_per_acq": {k: round(v / n, 3) for k, v in c["by_command"].items()},
        "inner_by_command_per_acq": {k: round(v / n, 3) for k, v in c["inner_by_command"].items()},
    }


def handoffs(events: Iterable[Sequence[Any]]) -> tuple[list[float], int, int]:
    """From (acquired_ns, released_ns, who) records: the handoff times in µs.

    Acquisitions are put in time order; a handoff is the time from the
    previous holder's ``release()`` returning to the next holder's
    ``acquire()`` returning (negative if the lock reached the next holder
    before the release call returned). Consecutive acquisitions by the same
    task are not handoffs; they are counted separately.
    Returns (handoffs_us, same_task_reacquisitions, acquisitions).
    """
    ev = sorted((int(a), int(r), str(w)) for a, r, w in events)
    out: list[float] = []
    same = 0
    for prev, cur in itertools.pairwise(ev):
        if prev[2] == cur[2]:
            same += 1
            continue
        out.append((cur[0] - prev[1]) / 1000)
    return out, same, len(ev)


def fairness(counts: Sequence[int]) -> dict[str, Any]:
    total = sum(counts)
    n = len(counts)
    busiest = max(counts) if counts else 0
    share = busiest / total if total else math.nan
    return {
        "tasks": n,
        "acquisitions": total,
        "starved": sum(1 for c in counts if c == 0),
        "busiest_share": share,
        "busiest_share_x_tasks": share * n if total else math.nan,
    }


def check_history(procs: Sequence[dict[str, Any]]) -> list[Any]:
    """Every process's holds of one round, merged and proved by aiolock's
    history checker (mutual exclusion and token order across processes).
    Drops the histories from the results (they are large): the report keeps
    the verdict."""
    from aiolock._history import Op, check

    ops = [
        Op(name, int(token), int(invoked), int(acquired), int(released), who=str(i))
        for i, r in enumerate(procs)
        for name, holds in (r.pop("history", None) or {}).items()
        for invoked, acquired, released, token in holds
    ]
    return check(ops)
