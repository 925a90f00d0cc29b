"""``aiolock demo``: the library's main job in one picture, with its proof.

Several worker processes, each with many asyncio tasks, contend for a few
named locks. Under the lock every task does a deliberately racy
read-modify-write of a counter in Redis (read, yield to the event loop, write
the value plus one), so any gap in mutual exclusion loses an update. Every
hold is recorded: its lock, its fencing token and three timestamps.

At the end the parent process checks the records against Redis:

* **no lost update**: each lock's counter equals the number of completed holds;
* **no two holders at once**: an occupancy counter in Redis never saw two
  holders, and no two recorded holds of one lock overlap in time;
* **fencing tokens strictly increasing per lock**: in the order the holds
  happened, and against the last token written to Redis under the lock;
* and that no lease was lost and nothing was left behind.

On a cluster (``--cluster`` starts a local one; a ``--url`` of a cluster
node is found out) the same runs unchanged: the workers' Clients are made
with ``Client.from_url(seed)`` and switch to cluster mode by themselves; the
demo's own clients are ``RedisCluster`` ones, and its data keys carry the
lock's hash tag, so a lock's data lives in the lock's slot.

Timestamps are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every
process on a machine, so holds of different processes can be compared (the
demo's processes all run here). *Handoff latency* is the time from the
moment a holder starts to release (its work is done) to the moment the next
holder's ``acquire`` returns, counted only when that next holder was already
waiting.

This module is the parent: arguments, the run, the checks. A worker process's
body is ``demo_worker.py``; the live display ``demo_view.py``; the shared
configuration ``demo_config.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import multiprocessing
import queue
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import redis

from aiolock import _history
from aiolock._core.protocol.keys import main_key
from aiolock.cli.demo_config import TICK, Admin, Config, Record, is_cluster, make_admin, masters
from aiolock.cli.demo_view import (
    Live,
    PlainView,
    RichView,
    count_connections,
    handoffs,
    make_view,
    ms_text,
    percentile,
)
from aiolock.cli.demo_worker import worker_entry
from aiolock.cli.embedded import NoServerBinaryError, Resolved, resolve
from aiolock.cli.embedded_cluster import resolve_cluster

__all__ = ["add_arguments", "run"]

READY_TIMEOUT = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="Redis/Valkey URL (default: $REDIS_URL, else localhost:6379 if it answers, "
        "else an embedded server)",
    )
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="always start an embedded server, even if one answers on localhost:6379",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="start an embedded local cluster (3 masters, 3 replicas) and run there; "
        "a --url of a cluster node needs no flag: the demo and aiolock find out by themselves",
    )
    parser.add_argument("--processes", type=_positive_int, default=4, help="default: 4")
    parser.add_argument("--tasks", type=_positive_int, default=50, help="per process; default: 50")
    parser.add_argument("--locks", type=_positive_int, default=3, help="default: 3")
    parser.add_argument("--duration", type=_positive_float, default=8.0, help="seconds; default: 8")
    parser.add_argument("--uvloop", action="store_true", help="run the workers on uvloop")
    parser.add_argument(
        "--plain", action="store_true", help="plain progress lines even on a terminal"
    )
    parser.add_argument(
        "--no-lock",
        dest="use_lock",
        action="store_false",
        help="run the same racy workload WITHOUT the lock, to watch the checks catch it (exits 1)",
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def verify(
    cfg: Config,
    records: list[Record],
    finals: dict[int, dict[str, Any]],
    admin: Admin,
) -> list[Check]:
    checks: list[Check] = []
    per_lock: dict[int, list[Record]] = {i: [] for i in range(cfg.locks)}
    for rec in records:
        per_lock[rec[0]].append(rec)

    # 1. no lost update
    parts, ok = [], True
    for i, recs in per_lock.items():
        raw = admin.get(cfg.data_key(i, "counter"))
        counter = int(raw) if raw is not None else 0
        ok = ok and counter == len(recs)
        sign = "=" if counter == len(recs) else "!="
        parts.append(f"{cfg.lock_name(i)} {counter:,} {sign} {len(recs):,}")
    checks.append(Check("no lost update", ok, "counter vs completed holds: " + ", ".join(parts)))

    # 2. no two holders at once, and 3. token order: the history checker
    # (aiolock/_history.py) over every worker's records. A hold acts from its
    # entry into the body (acquire returned) to the end of the body.
    history = [
        _history.Op(cfg.lock_name(i), token, waited, entered, done)
        for i, token, waited, entered, done in records
    ]
    violations = _history.check(history)
    seen_by_redis = sum(f["overlaps"] for f in finals.values())
    overlapping = sum(1 for v in violations if v.rule == "mutual exclusion")
    checks.append(
        Check(
            "no two holders at once",
            seen_by_redis == 0 and overlapping == 0,
            f"{len(records):,} holds; occupancy counter in Redis saw {seen_by_redis:,} "
            f"intruders; {overlapping:,} overlapping hold intervals",
        )
    )

    # 3. fencing tokens strictly increasing per lock, in real time: a hold
    # acquired before another was asked for has the smaller token
    out_of_order = sum(1 for v in violations if v.rule == "token order")
    stale = sum(f["token_regressions"] for f in finals.values())
    checks.append(
        Check(
            "fencing tokens strictly increasing per lock",
            out_of_order == 0 and stale == 0,
            f"{out_of_order:,} out of real-time order; {stale:,} not above the last "
            "token written under the lock",
        )
    )

    # 4. every lease held to the end, no errors
    lost = sum(f["lost"] for f in finals.values())
    errors = [e for f in finals.values() for e in f["errors"]]
    checks.append(
        Check(
            "no lease lost, no error",
            lost == 0 and not errors,
            f"{lost} leases lost, {len(errors)} errors"
            + (f" (first: {errors[0]})" if errors else ""),
        )
    )

    # 5. nothing left behind
    left = [
        cfg.lock_name(i)
        for i in range(cfg.locks)
        if admin.exists(main_key(cfg.prefix, cfg.lock_name(i)))
    ]
    holds = sum(f["holds"] for f in finals.values())
    waiting = sum(f["client_waiting"] for f in finals.values())
    checks.append(
        Check(
            "nothing left behind",
            not left and holds == 0 and waiting == 0,
            f"lock keys still set: {', '.join(left) or 'none'}; "
            f"holds {holds}, waiters {waiting} left in the clients",
        )
    )
    return checks


def _cleanup(admin: Admin, prefix: str) -> None:
    with contextlib.suppress(redis.RedisError):
        for node in masters(admin):
            keys = list(node.scan_iter(match=f"{prefix}:*", count=1000))
            # One DEL per key: on a cluster node, a DEL of keys of several slots is refused.
            for i in range(0, len(keys), 500):
                with node.pipeline(transaction=False) as pipe:
                    for key in keys[i : i + 500]:
                        pipe.delete(key)
                    pipe.execute()


# --------------------------------------------------------------------------- main


def _say(out: TextIO, text: str = "") -> None:
    print(text, file=out, flush=True)


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run the demo; returns the exit code (0: all checks passed, 1: a check
    failed, 2: the demo could not run)."""
    if args.uvloop:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            _say(out, "--uvloop: uvloop is not installed (python -m pip install uvloop)")
            return 2
    if args.cluster and (args.url or args.embedded):
        _say(out, "aiolock demo: --cluster starts its own cluster: drop --url and --embedded")
        return 2
    try:
        if args.cluster:
            _say(out, "starting an embedded cluster (3 masters, 3 replicas) ...")
            resolved = resolve_cluster()
        else:
            resolved = resolve(args.url, embedded=args.embedded)
    except (NoServerBinaryError, RuntimeError) as exc:
        _say(out, f"aiolock demo: {exc}")
        return 2
    try:
        return _run_on(args, resolved, out)
    finally:
        if resolved.embedded is not None:
            resolved.embedded.stop()
            what = "cluster" if args.cluster else resolved.embedded.binary.kind
            _say(out, f"stopped the embedded {what}.")


def _run_on(args: argparse.Namespace, resolved: Resolved, out: TextIO) -> int:
    cfg = Config(
        url=resolved.url,
        prefix=f"aiolock-demo-{secrets.token_hex(4)}",
        processes=args.processes,
        tasks=args.tasks,
        locks=args.locks,
        duration=args.duration,
        uvloop=args.uvloop,
        use_lock=args.use_lock,
    )
    loop_name = "uvloop" if cfg.uvloop else "asyncio"
    header = (
        f"aiolock demo, {cfg.processes} processes x {cfg.tasks} tasks, {cfg.locks} locks, "
        f"{cfg.duration:g} s, {loop_name}" + ("" if cfg.use_lock else ", WITHOUT THE LOCK")
    )
    _say(out, header)
    _say(out, f"server: {resolved.how}")
    try:
        cfg = dataclasses.replace(cfg, cluster=is_cluster(cfg.url))
        admin = make_admin(cfg)
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        _say(out, f"aiolock demo: cannot reach the server: {exc}")
        return 2
    try:
        admin.ping()
    except redis.RedisError as exc:
        _say(out, f"aiolock demo: cannot reach the server: {exc}")
        admin.close()
        return 2
    if cfg.cluster:
        _say(
            out,
            f"cluster mode: {len(masters(admin))} masters, keys spread over their slots; "
            "the workers' Clients are made with Client.from_url(seed) and find out themselves",
        )
    try:
        return _drive(cfg, admin, header, args.plain, out)
    finally:
        _cleanup(admin, cfg.prefix)
        admin.close()


def _drive(cfg: Config, admin: Admin, header: str, plain: bool, out: TextIO) -> int:
    ctx = multiprocessing.get_context("spawn")
    messages: Any = ctx.Queue()
    go = ctx.Event()
    start_at = ctx.Value("q", 0)
    counted = ctx.Event()  # the parent counted the connections: the workers may close them
    procs = [
        ctx.Process(
            target=worker_entry,
            args=(cfg, w, messages, go, start_at, counted),
            name=f"aiolock-demo-{w}",
            daemon=True,
        )
        for w in range(cfg.processes)
    ]
    _say(out, f"starting {cfg.processes} worker processes ...")
    for p in procs:
        p.start()
    live = Live(cfg)
    finals: dict[int, dict[str, Any]] = {}
    failures: list[str] = []
    view: PlainView | RichView | None = None
    try:
        ready: set[int] = set()
        names: set[str] = set()
        for msg in _receive(messages, procs, READY_TIMEOUT, lambda: len(ready) == len(procs)):
            if msg is None:
                continue
            if msg[0] == "ready":
                ready.add(msg[1])
                names.add(msg[2])
            elif msg[0] == "error":
                failures.append(f"worker {msg[1]}:\n{msg[2]}")
                break
        if failures or len(ready) < len(procs):
            _say(out, "aiolock demo: a worker failed to start:")
            _say(out, "\n".join(failures) or "  (timed out waiting for the workers)")
            return 2
        live.started = time.monotonic_ns()
        start_at.value = live.started
        go.set()
        view = make_view(cfg, plain, header, out)
        next_poll = 0.0
        limit = cfg.duration + 60.0
        for msg in _receive(messages, procs, limit, lambda: len(finals) == len(procs)):
            if msg is None:
                dead = [w for w, p in enumerate(procs) if p.exitcode is not None]
                dead = [w for w in dead if w not in finals]
                if dead and messages.empty():
                    failures.extend(
                        f"worker {w} exited with code {procs[w].exitcode} before it finished"
                        for w in dead
                    )
                    break
            else:
                kind, wid = msg[0], msg[1]
                if kind == "tick":
                    live.add(wid, msg[2], msg[3])
                elif kind == "done":
                    finals[wid] = msg[2]
                elif kind == "error":
                    failures.append(f"worker {wid}:\n{msg[2]}")
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + 0.5
                live.connections = count_connections(admin, cfg, names)
                view.update(live.figures())
        if len(finals) == len(procs):
            # Every worker has finished and holds its connections open until
            # `counted`: the figure the last line shows is that exact moment's.
            live.connections = count_connections(admin, cfg, names)
        counted.set()
        view.update(live.figures(), force=True)
    except KeyboardInterrupt:
        if view is not None:
            view.close()
            view = None
        _say(out, "\ninterrupted")
        for p in procs:
            p.terminate()
        return 130
    finally:
        counted.set()
        if view is not None:
            view.close()
        if len(finals) < len(procs):  # a failure: don't wait for the others
            for p in procs:
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if failures or len(finals) < len(procs):
        _say(out, "aiolock demo: a worker failed:")
        _say(out, "\n".join(failures) or "  (timed out waiting for the workers)")
        return 2
    return _report(cfg, live, finals, admin, out)


def _receive(
    messages: Any,
    procs: list[Any],
    limit: float,
    finished: Callable[[], bool],
) -> Iterator[Any]:
    """Messages from the workers until ``finished()``; None every TICK when idle."""
    deadline = time.monotonic() + limit
    while not finished() and time.monotonic() < deadline:
        try:
            yield messages.get(timeout=TICK / 2)
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and messages.empty():
                return
            yield None


def _report(
    cfg: Config,
    live: Live,
    finals: dict[int, dict[str, Any]],
    admin: Admin,
    out: TextIO,
) -> int:
    records = live.records
    elapsed = cfg.duration
    lat = sorted(handoffs(list(records)))
    _say(out)
    if cfg.use_lock:
        _say(
            out,
            f"results: {len(records):,} holds in {elapsed:g} s = {len(records) / elapsed:,.0f} "
            f"acquisitions/s across {cfg.processes} processes",
        )
    else:
        _say(
            out,
            f"results: {len(records):,} read-modify-write cycles WITHOUT a lock in "
            f"{elapsed:g} s = {len(records) / elapsed:,.0f} cycles/s across "
            f"{cfg.processes} processes (nothing acquired, nothing handed over)",
        )
    if lat and cfg.use_lock:
        _say(
            out,
            f"  handoff latency: p50 {ms_text(percentile(lat, 0.5))}, "
            f"p99 {ms_text(percentile(lat, 0.99))}, max {ms_text(float(lat[-1]))} "
            f"over {len(lat):,} handoffs to a waiting task",
        )
        _say(
            out,
            "  (from the holder finishing its work to the next holder's acquire returning; "
            "time.monotonic_ns)",
        )
    shares = [f"{cfg.lock_name(i)} {n:,}" for i, n in enumerate(live.figures()["per_lock"])]
    _say(out, f"  {'holds per lock' if cfg.use_lock else 'cycles per name'}: {', '.join(shares)}")
    checks = verify(cfg, records, finals, admin)
    _say(out)
    _say(out, "checks:")
    for check in checks:
        mark = "PASS" if check.ok else "FAIL"
        _say(out, f"  {mark}  {check.name}: {check.detail}")
    failed = [c for c in checks if not c.ok]
    _say(out)
    if failed:
        what = "as expected without the lock" if not cfg.use_lock else "this is a bug in aiolock"
        _say(out, f"{len(failed)} of {len(checks)} checks FAILED ({what}).")
        return 1
    _say(out, f"all {len(checks)} checks passed.")
    return 0
