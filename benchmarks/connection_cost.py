"""What a new connection costs before its first command: bytes written and round trips.

    python -m benchmarks.connection_cost [--base 6274ce0 | --against PATH] [--no-cluster]

Starts its own redis-server (and a 3-master cluster of it, unless
``--no-cluster``) on free ports, then measures two versions of aiolock, each
in a subprocess of its own with that version first on ``sys.path``: the
current checkout, and the base (``--against PATH``: a checkout; else
``git archive`` of ``--base`` unpacked in a temporary directory).

In each subprocess one Client is made and its first acquire + release run
(standalone: one lock; cluster: one lock on each master, so each master's
command connection runs its first command). Every socket write and every
read-ready event of the process is recorded (asyncio's selector transport,
patched before anything connects), so for each aiolock command connection
(one that runs a script) it reports, up to the reply of its first script:

* ``commands``: the commands written (redis-py's handshake, the mode probe,
  SCRIPT LOADs, the script) and their bytes;
* ``round trips``: groups of writes with no read between them, the group
  that carries the first script included (the handshake's are redis-py's,
  the same in both versions);
* the time from the Client's creation to the end of the first acquire.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASE = "6274ce0"
#: The script command (its first word on the wire, any version).
_SCRIPT_WORDS = (b"EVALSHA", b"EVAL", b"FCALL")


# -- in the measuring subprocess ---------------------------------------------------------------


def _split(buf: bytes) -> list[tuple[str, int]]:
    """The RESP commands in ``buf``: (name, bytes) each (``SCRIPT LOAD``, ``EVALSHA``...)."""
    out: list[tuple[str, int]] = []
    i = 0
    while i < len(buf):
        if buf[i : i + 1] != b"*":  # an inline command (none expected)
            end = buf.index(b"\r\n", i) + 2
            out.append(("inline", end - i))
            i = end
            continue
        j = buf.index(b"\r\n", i)
        n = int(buf[i + 1 : j])
        k = j + 2
        words: list[bytes] = []
        for _ in range(n):
            e = buf.index(b"\r\n", k)
            length = int(buf[k + 1 : e])
            words.append(buf[e + 2 : e + 2 + length])
            k = e + 2 + length + 2
        name = words[0].upper()
        if name in (b"SCRIPT", b"CLIENT", b"CLUSTER", b"INFO") and n > 1:
            name += b" " + words[1].upper()
        out.append((name.decode(), k - i))
        i = k
    return out


def _connections(events: list[tuple[int, str, bytes]]) -> list[dict[str, Any]]:
    """Per transport that ran a script: what it wrote up to its first script's reply."""
    by_conn: dict[int, list[tuple[str, bytes]]] = {}
    for conn, kind, data in events:
        by_conn.setdefault(conn, []).append((kind, data))
    found = []
    for seq in by_conn.values():
        writes = b"".join(d for k, d in seq if k == "w")
        commands = _split(writes)
        first = next(
            (i for i, (name, _) in enumerate(commands) if name.encode() in _SCRIPT_WORDS), None
        )
        if first is None:
            continue  # not a command connection of aiolock (discovery, pub/sub)
        before = commands[: first + 1]
        limit = sum(size for _, size in before)
        # Round trips: groups of writes with no read between, up to the one
        # holding the first script's last byte.
        trips, written, reading = 0, 0, True
        for kind, data in seq:
            if kind == "r":
                reading = True
                continue
            if reading:
                trips += 1
                reading = False
            written += len(data)
            if written >= limit:
                break
        names = Counter(name for name, _ in before)
        found.append(
            {
                "commands": dict(names),
                "script_loads": names.get("SCRIPT LOAD", 0),
                "bytes": limit,
                "load_bytes": sum(s for n, s in before if n == "SCRIPT LOAD"),
                "round_trips": trips,
            }
        )
    return found


async def _measure(url: str, cluster: bool) -> dict[str, Any]:
    import asyncio.selector_events as se

    events: list[tuple[int, str, bytes]] = []
    transport: Any = se._SelectorSocketTransport  # type: ignore[attr-defined]
    write, ready = transport.write, transport._read_ready

    def recording_write(self: Any, data: Any) -> None:
        events.append((id(self), "w", bytes(data)))
        write(self, data)

    def recording_ready(self: Any) -> None:
        events.append((id(self), "r", b""))
        ready(self)

    transport.write = recording_write
    transport._read_ready = recording_ready

    import redis
    from redis.crc import key_slot

    import aiolock

    names = ["a"]
    if cluster:
        admin = redis.Redis.from_url(url)
        slots = admin.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        admin.close()
        owners = [(int(s[0]), int(s[1])) for s in slots]
        names = []
        for lo, hi in owners:
            i = 0
            while not lo <= key_slot(f"aiolock:{{n{i}}}".encode()) <= hi:
                i += 1
            names.append(f"n{i}")
    started = time.perf_counter()
    async with aiolock.Client.from_url(url, cluster=None if cluster else False) as client:
        for name in names:
            async with client.lock(name):
                pass
        elapsed = time.perf_counter() - started
        found = _connections(events)
    return {
        "aiolock": str(Path(aiolock.__file__).parent),
        "first_acquires_ms": round(elapsed * 1000, 2),
        "connections": found,
    }


# -- the driver -------------------------------------------------------------------------------


def _base_tree(rev: str, into: Path) -> Path:
    """``aiolock/`` of git revision ``rev``, unpacked under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "aiolock"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _run(root: Path, url: str, cluster: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, str(Path(__file__)), "--measure", url, "--cluster-mode", str(cluster)],
        cwd=str(root),
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _row(label: str, mode: str, result: dict[str, Any]) -> str:
    conns = result["connections"]
    n = len(conns) or 1
    loads = sum(c["script_loads"] for c in conns) / n
    total = sum(c["bytes"] for c in conns) / n
    load_bytes = sum(c["load_bytes"] for c in conns) / n
    trips = sum(c["round_trips"] for c in conns) / n
    return (
        f"| {label} | {mode} | {len(conns)} | {loads:g} | {total:,.0f} | {load_bytes:,.0f} "
        f"| {trips:g} | {result['first_acquires_ms']:.1f} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=BASE, help="git revision to compare with")
    parser.add_argument("--against", type=Path, help="a checkout to use as the base instead")
    parser.add_argument("--no-cluster", action="store_true", help="standalone only")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--cluster-mode", default="False", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        result = asyncio.run(_measure(args.measure, args.cluster_mode == "True"))
        print(json.dumps(result))
        return

    sys.path.insert(0, str(ROOT))
    from benchmarks._cluster import LocalCluster
    from benchmarks._server import Server, admin_client

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="aiolock-base-") as tmp:
        base_root = args.against.resolve() if args.against else _base_tree(args.base, Path(tmp))
        versions = [(f"base {args.against or args.base}", base_root), ("current", ROOT)]
        server = Server()
        server.start()
        cluster = None
        try:
            if not args.no_cluster:
                cluster = LocalCluster(server.binary, masters=3, replicas=0)
                cluster.start()
            for label, root in versions:
                with server.admin() as admin:
                    admin.script_flush()
                results[f"{label}|standalone"] = _run(root, server.url, False)
                if cluster is not None:
                    for url in cluster.master_urls():
                        with admin_client(url) as admin:
                            admin.script_flush()
                    results[f"{label}|cluster"] = _run(root, cluster.url, True)
        finally:
            if cluster is not None:
                cluster.cleanup()
            server.cleanup()
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print("Per new command connection, up to the reply of its first script (averages):\n")
    print(
        "| version | mode | connections | SCRIPT LOADs | bytes written | of which SCRIPT LOAD "
        "| round trips | first acquire(s) ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, result in results.items():
        label, mode = key.split("|")
        print(_row(label, mode, result))
    print()
    for key, result in results.items():
        commands: Counter[str] = Counter()
        for conn in result["connections"]:
            commands.update(conn["commands"])
        print(f"{key}: {dict(commands)} ({result['aiolock']})")


if __name__ == "__main__":
    main()
