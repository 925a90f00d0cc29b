"""The benchmark's moving parts: worker processes, the server targets, the
orchestrator that runs one scenario over every library and loop, and the
source that workers import (the work tree, or a commit for ``--compare``).

Used by ``run`` (every scenario), ``compare`` (commits interleaved) and the
cluster and failover sections; it imports none of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks._cluster import ClusterAdmin
from benchmarks._server import admin_client

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent

READY_TIMEOUT = 90.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class WorkerDied(RuntimeError):
    pass


#: Where workers import ``aiolock`` and ``benchmarks`` from (see ``--aiolock-ref``).
SOURCE_ROOT = ROOT


def export_aiolock(ref: str) -> tuple[Path, str]:
    """``git archive`` the aiolock package at ``ref`` into a temp dir beside a link to benchmarks/.

    Benchmarking a commit keeps the run independent of whatever is being
    edited in the work tree meanwhile.
    """

    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    target = Path(tempfile.mkdtemp(prefix="aiolock-bench-src-"))
    archive = subprocess.run(
        ["git", "archive", sha, "aiolock"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    (target / "benchmarks").symlink_to(HERE, target_is_directory=True)
    return target, sha


def describe_source(root: Path, ref: str | None, sha: str | None) -> str:

    if ref is not None and sha is not None:
        return f"git {ref} = {sha[:12]}"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "aiolock"],
            cwd=root, check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "work tree (not a git checkout)"
    return f"work tree at {head[:12]}" + (" with uncommitted changes" if dirty else "")


class Worker:
    """One ``benchmarks._worker`` process and its JSON-lines pipe."""

    def __init__(self, label: str, logdir: Path, root: Path | None = None) -> None:
        self.label = label
        self.logpath = logdir / f"worker-{label}.log"
        self.proc: asyncio.subprocess.Process | None = None
        #: Where this worker imports ``aiolock`` from (default: ``SOURCE_ROOT``; ``--compare``).
        self.root = root

    async def start(self) -> None:
        root = self.root or SOURCE_ROOT
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.logpath, "ab") as logfile:  # noqa: ASYNC230  (before any timing)
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks._worker",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=logfile, cwd=str(root), env=env, limit=1 << 28,
            )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    async def recv(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise WorkerDied(f"worker {self.label} died: {self.log_tail()}")
        message: dict[str, Any] = json.loads(line)
        return message

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.logpath.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    async def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.kill()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            pass

    async def close(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.stdin is not None and proc.returncode is None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            await self.kill()
        self.proc = None


class Target:
    """Where a cell runs: the standalone server, or a cluster (its seed URL and masters)."""

    def __init__(
        self,
        name: str,
        url: str,
        admin_urls: list[str] | None = None,
        node_urls: list[str] | None = None,
        *,
        cluster: bool | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.admin_urls = admin_urls
        self.node_urls = node_urls
        #: Several admin URLs are a cluster's masters unless told otherwise (Redlock's masters).
        self.cluster = bool(admin_urls) if cluster is None else cluster
        self.admin: Any = ClusterAdmin(admin_urls) if admin_urls else admin_client(url)

    def spec(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "admin_urls": self.admin_urls,
            "node_urls": self.node_urls,
            "cluster": self.cluster,
        }


class Orchestrator:
    def __init__(self, url: str, logdir: Path) -> None:
        self.logdir = logdir
        self._main: dict[str, Worker] = {}
        self._helpers: list[Worker] = []
        self._fresh = 0
        self.standalone = Target("standalone", url)
        self.targets: list[Target] = [self.standalone]

    async def warm(self, libs: Iterable[str], helpers: int) -> None:
        """Start the long-lived workers up front (not timed)."""
        starts = [self.main(lib) for lib in libs]
        await asyncio.gather(*starts, self.helpers(helpers))

    async def main(self, lib: str) -> Worker:
        worker = self._main.get(lib)
        if worker is None or not worker.alive:
            worker = self._main[lib] = Worker(lib.replace(".", "_"), self.logdir)
            await worker.start()
        return worker

    async def helpers(self, n: int) -> list[Worker]:
        while len(self._helpers) < n:
            self._helpers.append(Worker(f"helper{len(self._helpers)}", self.logdir))
        for worker in self._helpers[:n]:
            if not worker.alive:
                await worker.start()
        return self._helpers[:n]

    async def run(
        self,
        scenario: str,
        lib: str,
        loop: str,
        params: dict[str, Any],
        *,
        procs: int = 1,
        fresh: bool = False,
        timeout: float = 120.0,
        target: Target | None = None,
        go: Callable[[], int] | None = None,
    ) -> list[dict[str, Any]] | dict[str, Any]:
        """Run one cell; a list of per-process results, or {"error": ...}.

        ``go``: called once every worker is ready, instead of picking a start
        time ahead; returns the start time (e.g. of a SIGKILL) sent to them.
        """
        target = target or self.standalone
        if fresh:
            self._fresh += 1
            workers = [Worker(f"fresh{self._fresh}", self.logdir)]
            await workers[0].start()
        elif procs == 1:
            workers = [await self.main(lib)]
        else:
            workers = await self.helpers(procs)
        target.admin.flushall()
        if not fresh:
            for worker in workers:
                if not worker.alive:
                    await worker.start()
        try:
            for i, worker in enumerate(workers):
                p = dict(params)
                if procs > 1:
                    p["leader"] = i == 0
                    p["tag"] = str(i)
                spec = {
                    **target.spec(),
                    "scenario": scenario,
                    "lib": lib,
                    "loop": loop,
                    "params": p,
                }
                await worker.send(spec)
            readies = await asyncio.gather(*(w.recv(READY_TIMEOUT) for w in workers))
            errors = [r["error"] for r in readies if "error" in r]
            if errors:
                raise RuntimeError(errors[0])
            if go is not None:
                start_ns = await asyncio.to_thread(go)
            else:
                start_ns = time.monotonic_ns() + 50_000_000 + 10_000_000 * procs
            for worker in workers:
                await worker.send({"go": True, "start_ns": start_ns})
            replies = await asyncio.gather(*(w.recv(timeout) for w in workers))
        except (
            TimeoutError,
            WorkerDied,
            RuntimeError,
            OSError,
            ValueError,
            ConnectionError,
        ) as exc:
            for worker in workers:
                await worker.kill()
            reason = "timed out" if isinstance(exc, TimeoutError) else str(exc).strip()
            return {"error": reason[-1500:]}
        finally:
            if fresh:
                await workers[0].close()
        errors = [r["error"] for r in replies if "error" in r]
        if errors:
            return {"error": errors[0][-1500:]}
        return [r["result"] for r in replies]

    async def close(self) -> None:
        for worker in [*self._main.values(), *self._helpers]:
            await worker.close()
        for target in self.targets:
            target.admin.close()


def rotate(items: list[Any], k: int) -> list[Any]:
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]
