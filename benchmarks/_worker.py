"""A benchmark worker process: runs one scenario of one library at a time.

Protocol (JSON lines; stdin in, the original stdout out, everything a library
prints goes to stderr):

    -> {"scenario": ..., "lib": ..., "loop": "uvloop" | "asyncio" | "threads", "params": {...}}
    <- {"ready": true}                  after connecting, before any measurement
    -> {"go": true, "start_ns": N}      a time on the system-wide monotonic clock
    <- {"result": {...}} | {"error": "..."}

All processes of one run get the same ``start_ns`` (``time.monotonic_ns`` is
CLOCK_MONOTONIC, shared by every process on Linux), so events recorded in
different processes can be merged on one time line.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import json
import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Coroutine
from typing import Any, TextIO

import redis

from benchmarks import _libs
from benchmarks._admin import ADMIN_COMMANDS, admin_client, connection_counts

now = time.monotonic_ns
NS = 1_000_000_000


# --------------------------------------------------------------------------- helpers


async def sleep_until(ns: int) -> None:
    delay = (ns - now()) / NS
    if delay > 0:
        await asyncio.sleep(delay)


def sleep_until_sync(ns: int) -> None:
    delay = (ns - now()) / NS
    if delay > 0:
        time.sleep(delay)


def reset_stats(admin: redis.Redis) -> None:
    admin.config_resetstat()


def read_stats(admin: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT, without the harness' own."""
    info = admin.info("commandstats")
    out: dict[str, int] = {}
    for key, value in info.items():
        name = key.removeprefix("cmdstat_")
        if name in ADMIN_COMMANDS:
            continue
        out[name] = int(value["calls"])
    return out


def server_cpu(admin: Any) -> float:
    """CPU seconds the server used so far (a cluster's: every node's, replicas too)."""
    if hasattr(admin, "cpu_seconds"):
        return float(admin.cpu_seconds())
    info = admin.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def us(ns: list[int]) -> list[float]:
    return [round(x / 1000, 2) for x in ns]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


class LagMeter:
    """A ticker task: sleeps 1 ms at a time and records how late it wakes up."""

    def __init__(self, period: float = 0.001) -> None:
        self.period = period
        self.lags: list[int] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        period_ns = int(self.period * NS)
        while True:
            t0 = now()
            await asyncio.sleep(self.period)
            self.lags.append(max(0, now() - t0 - period_ns))

    async def stop(self) -> list[int]:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        return self.lags


async def finish(tasks: list[asyncio.Task[Any]], timeout: float) -> int:
    """Wait for tasks until ``timeout``, then cancel the rest; returns how many were cancelled."""
    if not tasks:
        return 0
    pending: set[asyncio.Task[Any]] = set(tasks)
    if timeout > 0:
        _done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    if pending:
        # A peer may swallow a cancellation; give up on such tasks after a while.
        await asyncio.wait(pending, timeout=3)
    return len(pending)


# --------------------------------------------------------------------------- floor


class RawClient(asyncio.Protocol):
    """The least Python can do per command: write bytes, parse the reply with hiredis."""

    def __init__(self) -> None:
        import hiredis

        self.reader = hiredis.Reader()
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            reply = self.reader.gets()
            if reply is False:
                return
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(ConnectionError("closed"))

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        assert self.transport is not None
        fut = asyncio.get_running_loop().create_future()
        self.transport.write(packed)
        self.waiters.append(fut)
        return fut


def pack(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        b = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


async def floor(url: str, admin: redis.Redis, p: dict[str, Any], start_ns: int) -> dict[str, Any]:
    from urllib.parse import urlparse

    import redis.asyncio as aioredis

    u = urlparse(url)
    loop = asyncio.get_running_loop()
    _transport, raw = await loop.create_connection(RawClient, u.hostname, u.port)
    sha = await raw.send(pack("SCRIPT", "LOAD", "return 1"))
    ping, evalsha = pack("PING"), pack("EVALSHA", sha, 0)
    rp = aioredis.Redis.from_url(url)
    await rp.ping()
    for _ in range(50):
        await raw.send(ping)
        await raw.send(evalsha)
        await rp.evalsha(sha, 0)
    await sleep_until(start_ns)
    end = start_ns + int(p["duration"] * NS)
    reset_stats(admin)
    raw_ping: list[int] = []
    raw_pair: list[int] = []
    rp_ping: list[int] = []
    rp_pair: list[int] = []
    while now() < end and len(raw_ping) < p["max_samples"]:
        t0 = now()
        await raw.send(ping)
        t1 = now()
        await raw.send(evalsha)
        await raw.send(evalsha)
        t2 = now()
        await rp.ping()
        t3 = now()
        await rp.evalsha(sha, 0)
        await rp.evalsha(sha, 0)
        t4 = now()
        raw_ping.append(t1 - t0)
        raw_pair.append(t2 - t1)
        rp_ping.append(t3 - t2)
        rp_pair.append(t4 - t3)
    stats = read_stats(admin)
    assert raw.transport is not None
    raw.transport.close()
    await rp.aclose()
    return {
        "raw_ping_us": us(raw_ping),
        "raw_pair_us": us(raw_pair),
        "redispy_ping_us": us(rp_ping),
        "redispy_pair_us": us(rp_pair),
        "cmdstats": stats,
    }


# --------------------------------------------------------------------------- uncontended


async def uncontended(
    lib: Any, name: str, admin: redis.Redis, p: dict[str, Any], start_ns: int
) -> dict[str, Any]:
    h = lib.lock(p["key"])
    for _ in range(p["warmup"]):
        await lib.acquire(h)
        await lib.release(h)
    await sleep_until(start_ns)
    end = start_ns + int(p["duration"] * NS)
    reset_stats(admin)
    samples: list[int] = []
    while now() < end and len(samples) < p["max_samples"]:
        t0 = now()
        await lib.acquire(h)
        await lib.release(h)
        samples.append(now() - t0)
    result: dict[str, Any] = {
        "samples_us": us(samples),
        "acquisitions": len(samples),
        "cmdstats": read_stats(admin),
    }
    if name == "aiolock":
        lk = h.lock
        outer = await lk.acquire()
        reset_stats(admin)
        re: list[int] = []
        end = now() + int(p["duration"] * NS / 4)
        while now() < end and len(re) < p["max_samples"]:
            t0 = now()
            inner = await lk.acquire()
            await inner.release()
            re.append(now() - t0)
        result["reentrant_us"] = us(re)
        result["reentrant_cmdstats"] = read_stats(admin)
        result["reentrant_same_token"] = inner.fencing_token == outer.fencing_token
        await outer.release()
    return result


def uncontended_thread(
    lib: Any, name: str, admin: redis.Redis, p: dict[str, Any], start_ns: int
) -> dict[str, Any]:
    h = lib.lock(p["key"])
    for _ in range(p["warmup"]):
        lib.acquire_sync(h)
        lib.release_sync(h)
    sleep_until_sync(start_ns)
    end = start_ns + int(p["duration"] * NS)
    reset_stats(admin)
    samples: list[int] = []
    while now() < end and len(samples) < p["max_samples"]:
        t0 = now()
        lib.acquire_sync(h)
        lib.release_sync(h)
        samples.append(now() - t0)
    return {"samples_us": us(samples), "acquisitions": len(samples), "cmdstats": read_stats(admin)}


# --------------------------------------------------------------------------- handoff


async def handoff(
    lib: Any, name: str, admin: redis.Redis, p: dict[str, Any], start_ns: int
) -> dict[str, Any]:
    """``tasks`` tasks take turns: acquire, hold ``hold`` s, release, think ``think`` s."""
    events: list[tuple[int, int, str]] = []
    end = start_ns + int(p["duration"] * NS)
    tag = p.get("tag", "0")
    if p.get("leader", True):
        reset_stats(admin)

    async def worker(i: int) -> None:
        h = lib.lock(p["key"])
        who = f"{tag}:{i}"
        await sleep_until(start_ns)
        while now() < end and len(events) < p["max_events"]:
            await lib.acquire(h)
            ta = now()
            await asyncio.sleep(p["hold"])
            await lib.release(h)
            events.append((ta, now(), who))
            await asyncio.sleep(p["think"])

    tasks = [asyncio.create_task(worker(i)) for i in range(p["tasks"])]
    cancelled = await finish(tasks, (end - now()) / NS + p["grace"])
    stats = read_stats(admin) if p.get("leader", True) else {}
    return {"events": events, "cancelled": cancelled, "cmdstats": stats}


def handoff_thread(
    lib: Any, name: str, admin: redis.Redis, p: dict[str, Any], start_ns: int
) -> dict[str, Any]:
    events: list[tuple[int, int, str]] = []
    end = start_ns + int(p["duration"] * NS)
    tag = p.get("tag", "0")
    if p.get("leader", True):
        reset_stats(admin)

    def worker(i: int) -> None:
        h = lib.lock(p["key"])
        who = f"{tag}:{i}"
        sleep_until_sync(start_ns)
        while now() < end and len(events) < p["max_events"]:
            lib.acquire_sync(h)
            ta = now()
            time.sleep(p["hold"])
            lib.release_sync(h)
            events.append((ta, now(), who))
            time.sleep(p["think"])

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(p["tasks"])]
    for t in threads:
        t.start()
    deadline = time.monotonic() + (end - now()) / NS + p["grace"] + 5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    stats = read_stats(admin) if p.get("leader", True) else {}
    return {"events": events, "cancelled": stuck, "cmdstats": stats}


# --------------------------------------------------------------------------- throughput


async def throughput(
    lib: Any, name: str, admin: redis.Redis, p: dict[str, Any], start_ns: int
) -> dict[str, Any]:
    """``tasks`` tasks on ``names`` locks (task i on name i mod names), empty critical section."""
    n = p["tasks"]
    names = p.get("names", 1)
    counts = [0] * n
    tokens: list[list[tuple[int, int]]] = [[] for _ in range(names)]
    w_start = start_ns + int(p["warmup"] * NS)
    holders = [-1] * names
    state = {"violations": 0, "open": False}
    leader = p.get("leader", True)
    stats: dict[str, Any] = {}

    async def worker(i: int) -> None:
        j = i % names
        h = lib.lock(p["key"] if names == 1 else f"{p['key']}:{j}")
        await sleep_until(start_ns)
        while True:
            invoked = now()
            token = await lib.acquire(h)
            acquired = now()
            if holders[j] != -1:
                state["violations"] += 1
            holders[j] = i
            await asyncio.sleep(0)  # the critical section awaits once
            holders[j] = -1
            if state["open"]:
                counts[i] += 1
                if token is not None:
                    # For the history checker, across processes: (invoked,
                    # acquired, released, token) of the name's holds.
                    tokens[j].append((invoked, acquired, now(), token))
            await lib.release(h)

    async def meter() -> None:
        # The window opens when this task gets to run after the warm-up (late if
        # the loop is saturated) and lasts `duration` from then; the counters
        # and the server's stats cover exactly the same window.
        await sleep_until(w_start)
        if leader:
            reset_stats(admin)
            cpu0 = server_cpu(admin)
        stats["t0"] = now()
        client0 = time.process_time()
        state["open"] = True
        await asyncio.sleep(p["duration"])
        state["open"] = False
        stats["t1"] = now()
        stats["client_cpu_s"] = time.process_time() - client0
        if leader:
            stats["server_cpu_s"] = server_cpu(admin) - cpu0
            stats["cmdstats"] = read_stats(admin)
            stats["connections"] = connection_counts(admin, lib.conn_prefix)

    meter_task = asyncio.create_task(meter())
    tasks = [asyncio.create_task(worker(i)) for i in range(n)]
    await meter_task
    # The window is over: stop everyone now (waiting for each task to get the
    # lock once more would take seconds with a polling lock and 1,000 tasks).
    cancelled = await finish(tasks, 0)
    increasing = all(
        a[3] < b[3] for ts in tokens for a, b in itertools.pairwise(sorted(ts, key=lambda t: t[1]))
    )
    return {
        "counts": counts,
        "elapsed_s": (stats["t1"] - stats["t0"]) / NS,
        "violations": state["violations"],
        "tokens_checked": sum(map(len, tokens)),
        "tokens_increasing": increasing,
        "history": {
            p["key"] if names == 1 else f"{p['key']}:{j}": ts for j, ts in enumerate(tokens)
        },
        "cancelled": cancelled,
        "cmdstats": stats.get("cmdstats", {}),
        "connections": stats.get("connections"),
        "client_cpu_s": stats["client_cpu_s"],
        "server_cpu_s": stats.get("server_cpu_s"),
    }


def throughput_thread(
    lib: Any, name: str, admin: redis.Redis, p: dict[str, Any], start_ns: int
) -> dict[str, Any]:
    n = p["tasks"]
    counts = [0] * n
    w_start = start_ns + int(p["warmup"] * NS)
    state = {"holder": -1, "violations": 0, "open": False, "stop": False}
    leader = p.get("leader", True)
    stats: dict[str, Any] = {}

    def worker(i: int) -> None:
        h = lib.lock(p["key"])
        sleep_until_sync(start_ns)
        while True:
            lib.acquire_sync(h)
            if state["holder"] != -1:
                state["violations"] += 1
            state["holder"] = i
            if state["stop"]:
                state["holder"] = -1
                lib.release_sync(h)
                return
            if state["open"]:
                counts[i] += 1
            time.sleep(0)  # the critical section yields once
            state["holder"] = -1
            lib.release_sync(h)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    sleep_until_sync(w_start)
    if leader:
        reset_stats(admin)
    stats["t0"] = now()
    state["open"] = True
    time.sleep(p["duration"])
    state["open"] = False
    state["stop"] = True
    stats["t1"] = now()
    if leader:
        stats["cmdstats"] = read_stats(admin)
        stats["connections"] = connection_counts(admin, lib.conn_prefix)
    deadline = time.monotonic() + 10
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    return {
        "counts": counts,
        "elapsed_s": (stats["t1"] - stats["t0"]) / NS,
        "violations": state["violations"],
        "tokens_checked": 0,
        "tokens_increasing": True,
        "cancelled": stuck,
        "cmdstats": stats.get("cmdstats", {}),
        "connections": stats.get("connections"),
    }


# --------------------------------------------------------------------------- scale


async def scale(
    lib: Any, name: str, admin: redis.Redis, p: dict[str, Any], start_ns: int
) -> dict[str, Any]:
    """Many tasks waiting on many names: memory, connections, cancellation, completion."""
    import tracemalloc

    names = [f"{p['key']}:{i}" for i in range(p["names"])]
    per_name = p["waiters_per_name"]
    total = len(names) * per_name
    cap = p["cap"]
    cancel_cap = p["cancel_cap"]
    drain_cap = p["drain_cap"]
    # The holders are another client (another process, as far as Redis can tell),
    # so the waiters really wait on Redis: subscriptions, polls, blocked connections.
    holder_lib = lib if name in _libs.NO_REDIS else _libs.make(name)
    if holder_lib is not lib:
        await holder_lib.open(p["url"], len(names), lease=p["lease"])
    holders = [holder_lib.lock(n) for n in names]
    await asyncio.gather(*(holder_lib.acquire(h) for h in holders))
    base_keys = admin.dbsize()
    base_conns = connection_counts(admin, lib.conn_prefix)

    def conns() -> dict[str, int]:
        now_ = connection_counts(admin, lib.conn_prefix)
        return {k: now_[k] - base_conns[k] for k in now_}

    out: dict[str, Any] = {"waiters": total, "names": len(names), "base_keys": base_keys}
    started = [0]
    ended = [0]
    done = [0]

    async def waiter(nm: str) -> None:
        h = lib.lock(nm)
        started[0] += 1
        try:
            await lib.acquire(h)
        finally:
            ended[0] += 1
        done[0] += 1
        await lib.release(h)

    async def spawn() -> tuple[list[asyncio.Task[None]], float]:
        t0 = now()
        tasks = [asyncio.create_task(waiter(nm)) for nm in names for _ in range(per_name)]
        deadline = now() + int(cap * NS)
        while started[0] < total and now() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        while now() < deadline:
            waiting = lib.waiting()
            if waiting is None or waiting >= total:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(p["settle"])
        return tasks, (now() - t0) / NS

    # Phase 1: RSS, connections, then cancel everything.
    gc.collect()
    rss0 = rss_bytes()
    tasks, spawn_s = await spawn()
    out["rss_per_waiter"] = (rss_bytes() - rss0) / total
    out["spawn_s"] = spawn_s
    out["waiting_seen"] = lib.waiting()
    out["connections"] = conns()
    ended[0] = 0
    t0 = now()
    for task in tasks:
        task.cancel()
    deadline = now() + int(cancel_cap * NS)
    while ended[0] < total and now() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    out["cancel_s"] = (now() - t0) / NS
    out["cancel_pending"] = total - ended[0]
    del tasks
    local = lib.client.statistics() if name == "aiolock" else None
    await asyncio.sleep(p["leftover_wait"])
    leftovers: dict[str, Any] = {
        "keys": admin.dbsize() - base_keys,
        "channels": len(admin.pubsub_channels()),
    }
    if name == "aiolock":
        after = lib.client.statistics()
        leftovers.update(
            waiting_at_once=local.waiting if local else None,
            subscriptions_at_once=local.subscriptions if local else None,
            waiting=after.waiting,
            subscriptions=after.subscriptions,
            background=after.background,
            in_flight=after.in_flight,
        )
    out["leftovers"] = leftovers

    # Phase 2: tracemalloc per waiter, then release the holders and let everyone through.
    started[0] = 0
    gc.collect()
    tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0]
    tasks, _ = await spawn()
    out["traced_per_waiter"] = (tracemalloc.get_traced_memory()[0] - traced0) / total
    tracemalloc.stop()
    out["connections_phase2"] = conns()
    t0 = now()
    await asyncio.gather(*(holder_lib.release(h) for h in holders))
    deadline = now() + int(drain_cap * NS)
    peak_conns = 0
    while done[0] < total and now() < deadline:
        await asyncio.sleep(0.1)
        peak_conns = max(peak_conns, conns()["total"])
    out["all_acquired_s"] = (now() - t0) / NS
    out["acquired"] = done[0]
    out["peak_connections_draining"] = peak_conns
    await finish(tasks, 1.0)
    if holder_lib is not lib:
        await asyncio.wait_for(holder_lib.close(), 10)
    return out


# --------------------------------------------------------------------------- watchdog


async def watchdog(
    url: str, admin: redis.Redis, p: dict[str, Any], start_ns: int
) -> dict[str, Any]:
    """``locks`` held locks renewed by aiolock's watchdog; loop lag measured meanwhile."""
    import aiolock

    lease = p["lease"]
    async with aiolock.Client.from_url(url, prefix="bench", lease=lease) as client:
        lag = LagMeter()
        lag.start()
        await asyncio.sleep(p["idle"])
        idle_lags = list(lag.lags)
        lag.lags.clear()
        locks = [client.lock(f"{p['key']}:{i}") for i in range(p["locks"])]
        held: list[Any] = []

        async def take(chunk: list[Any]) -> None:
            for lk in chunk:
                held.append(await lk.acquire())

        t0 = now()
        step = max(1, len(locks) // 100)
        await asyncio.gather(*(take(locks[i : i + step]) for i in range(0, len(locks), step)))
        acquire_s = (now() - t0) / NS
        acquire_lags = list(lag.lags)
        lag.lags.clear()
        reset_stats(admin)
        t0 = now()
        await asyncio.sleep(p["duration"])
        elapsed = (now() - t0) / NS
        stats = read_stats(admin)
        lags = await lag.stop()
        lost = sum(1 for lease_ in held if lease_.lost)
        t0 = now()
        await asyncio.gather(*(lease_.release() for lease_ in held), return_exceptions=True)
        release_s = (now() - t0) / NS
    return {
        "locks": len(held),
        "lease": lease,
        "interval": lease / 3,
        "elapsed_s": elapsed,
        "cmdstats": stats,
        "lags_us": us(lags),
        "idle_lags_us": us(idle_lags),
        "acquire_lags_us": us(acquire_lags),
        "acquire_s": acquire_s,
        "release_s": release_s,
        "lost": lost,
    }


# --------------------------------------------------------------------------- cluster


async def failover(url: str, p: dict[str, Any]) -> dict[str, Any]:
    """Acquisitions of names on a master's slots across its SIGKILL (cluster section).

    Before ``ready`` every name has been taken and released once (the
    connections and the slot map are warm). The orchestrator SIGKILLs the
    master and sends ``go`` with the kill's time. Then, at once: ``waiter``
    makes one ``acquire()`` call (the library's own recovery, within a 30 s
    timeout), ``retrier`` calls ``acquire(timeout=0.25)`` again and again (a
    caller retrying on every error). Both report seconds from the kill.
    """
    import aiolock

    async with aiolock.Client.from_url(url, prefix="bench", lease=p["lease"], cluster=True) as c:
        for name in (p["waiter"], p["retrier"]):
            lease = await c.lock(name).acquire(timeout=10)
            await lease.release()
        send_ready()
        killed_ns = wait_go()
        out: dict[str, Any] = {"errors": {}, "timeout": p["timeout"]}

        async def waiter() -> None:
            try:
                lease = await c.lock(p["waiter"]).acquire(timeout=p["timeout"])
            except aiolock.AiolockError as exc:
                out["waiter_error"] = repr(exc)
                return
            out["waiter_s"] = (now() - killed_ns) / NS
            await lease.release()

        async def retrier() -> None:
            deadline = killed_ns + int(p["timeout"] * NS)
            while now() < deadline:
                try:
                    lease = await c.lock(p["retrier"]).acquire(timeout=0.25)
                except (aiolock.AiolockError, TimeoutError) as exc:
                    kind = type(exc).__name__
                    out["errors"][kind] = out["errors"].get(kind, 0) + 1
                    await asyncio.sleep(0.005)
                    continue
                out["retrier_s"] = (now() - killed_ns) / NS
                await lease.release()
                return

        await asyncio.gather(waiter(), retrier())
    return out


async def cluster_watchdog(url: str, p: dict[str, Any]) -> dict[str, Any]:
    """The hook for ``benchmarks/cluster_watchdog.py`` (issue 11, item 4), written apart.

    Called there: the first of ``measure``, ``run``, ``cluster_watchdog``,
    ``main`` that exists, with those of ``url`` (a cluster seed), ``locks``,
    ``lease``, ``duration`` it takes; a coroutine function is awaited, a plain
    one runs in a thread. It returns a dict; the report reads
    ``renewal_calls_per_interval`` (or ``calls_per_interval``), ``lag_p99_ms``,
    ``lost`` and ``locks`` from it and shows every other number as is. Until
    the module exists the result says so and the report marks the figures
    "not measured".
    """
    import inspect

    try:
        import benchmarks.cluster_watchdog as module  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError as exc:
        if exc.name != "benchmarks.cluster_watchdog":
            raise  # it is there, but something it imports is not
        send_ready()
        wait_go()
        return {"skipped": "benchmarks/cluster_watchdog.py is not there yet"}
    names = ("measure", "run", "cluster_watchdog", "main")
    fn = next((getattr(module, n) for n in names if callable(getattr(module, n, None))), None)
    if fn is None:
        raise RuntimeError(f"benchmarks/cluster_watchdog.py has none of {names}")
    given = {"url": url, "locks": p["locks"], "lease": p["lease"], "duration": p["duration"]}
    accepted = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in given.items() if k in accepted}
    send_ready()
    wait_go()
    if inspect.iscoroutinefunction(fn):
        result = await fn(**kwargs)
    else:
        result = await asyncio.to_thread(fn, **kwargs)
    return dict(result)


# --------------------------------------------------------------------------- driver

ASYNC = {
    "uncontended": uncontended,
    "handoff": handoff,
    "throughput": throughput,
    "scale": scale,
}
THREAD = {
    "uncontended": uncontended_thread,
    "handoff": handoff_thread,
    "throughput": throughput_thread,
}


def send(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


#: The pipe to the orchestrator (the original stdout), set by ``main``.
OUT: TextIO = sys.stdout


def send_ready() -> None:
    send(OUT, {"ready": True})


def wait_go() -> int:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(0)
    go = json.loads(line)
    return int(go["start_ns"])


def make_admin(spec: dict[str, Any]) -> Any:
    """The single server's admin client, or a cluster's (``admin_urls``: its masters)."""
    if spec.get("admin_urls"):
        from benchmarks._cluster import ClusterAdmin

        return ClusterAdmin(spec["admin_urls"], spec.get("node_urls"))
    return admin_client(spec["url"])


async def run_async(spec: dict[str, Any], out: TextIO) -> dict[str, Any]:
    url, scenario, name, p = spec["url"], spec["scenario"], spec["lib"], spec["params"]
    p = {**p, "url": url}
    if scenario == "failover":
        return await failover(url, p)
    if scenario == "cluster_watchdog":
        return await cluster_watchdog(url, p)
    if scenario == "failover_loss":
        from benchmarks._failover import loss

        return await loss(p, send_ready, wait_go)
    admin = make_admin(spec)
    admin.ping()
    try:
        if scenario == "floor":
            send(out, {"ready": True})
            return await floor(url, admin, p, wait_go())
        if scenario == "watchdog":
            send(out, {"ready": True})
            return await watchdog(url, admin, p, wait_go())
        lib = _libs.make(name)
        extra: dict[str, Any] = {"cluster": True} if spec.get("cluster") else {}
        if p.get("masters"):  # Redlock over independent masters (the failover section)
            extra["masters"] = p["masters"]
        if p.get("aiolock_options"):  # e.g. replicas=1 (the failover section)
            extra["options"] = p["aiolock_options"]
        await lib.open(url, p.get("pool", p.get("tasks", 1)), lease=p.get("lease", 30.0), **extra)
        try:
            if scenario in ("throughput", "handoff") and p.get("prewarm", True):
                await lib.prewarm(p["tasks"])
            send(out, {"ready": True})
            return await ASYNC[scenario](lib, name, admin, p, wait_go())
        finally:
            try:
                await asyncio.wait_for(lib.close(), 5)
            except Exception as exc:  # a peer that cannot close cleanly is not our failure
                print(f"close of {name} failed: {exc!r}", file=sys.stderr)
    finally:
        admin.close()


def run_threads(spec: dict[str, Any], out: TextIO) -> dict[str, Any]:
    url, scenario, name, p = spec["url"], spec["scenario"], spec["lib"], spec["params"]
    admin = admin_client(url)
    admin.ping()
    lib = _libs.make(name)
    lib.open_sync(url, p.get("pool", p.get("tasks", 1)))
    try:
        if scenario in ("throughput", "handoff") and p.get("prewarm", True):
            lib.prewarm_sync(p["tasks"])
        send(out, {"ready": True})
        result: dict[str, Any] = THREAD[scenario](lib, name, admin, p, wait_go())
        return result
    finally:
        lib.close_sync()
        admin.close()


def run_bounded(coro: Coroutine[Any, Any, dict[str, Any]], kind: str) -> dict[str, Any]:
    """Like ``asyncio.run``, but shutting down gives up on tasks that ignore cancellation."""
    if kind == "uvloop":
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            leftover = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in leftover:
                task.cancel()
            if leftover:
                loop.run_until_complete(asyncio.wait(leftover, timeout=2))
            loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), 2))
            loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), 2))
        except Exception as exc:  # best effort: the next run gets a fresh loop anyway
            print(f"loop shutdown: {exc!r}", file=sys.stderr)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def run(spec: dict[str, Any], out: TextIO) -> dict[str, Any]:
    loop = spec["loop"]
    if loop == "threads":
        return run_threads(spec, out)
    return run_bounded(run_async(spec, out), loop)


def main() -> None:
    global OUT
    out = OUT = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        spec = json.loads(line)
        try:
            result = run(spec, out)
        except BaseException as exc:  # report, never die silently
            if isinstance(exc, KeyboardInterrupt):
                raise
            send(out, {"error": "".join(traceback.format_exception(exc))[-4000:]})
            continue
        send(out, {"result": result})
        gc.collect()


if __name__ == "__main__":
    main()
