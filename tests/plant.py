"""Planted bugs: the suite must catch each one (issue 22 item 4).

    python -m tests.plant            # every bug, one at a time; prints the table
    python -m tests.plant --list     # the bugs
    python -m tests.plant NAME ...   # only these

Each bug is one textual change to a Lua script or a Python module of
``aiolock/``, made in a copy of the project (``aiolock/`` and ``tests/`` in
a temporary directory; the checkout is never touched). Against each, the
stateful tests (tests/test_stateful.py) run first, narrowed to the
primitives the bug touches; a bug they miss is run against the test named
for it (the one written for that promise), and the table says which caught
it and how long it took. A bug nothing catches fails the command.

``tests/test_plant.py`` (in the suite) checks that every change still
applies to the code as it is: a bug whose text moved must be planted anew,
not dropped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Bug:
    name: str
    what: str
    path: str  # relative to ROOT
    old: str
    new: str
    #: ``-k`` for the stateful tests ("" : skip them), and the test that
    #: guards the promise (run if the stateful tests miss the bug).
    stateful: str
    guard: str


S = "aiolock/scripts/"
BUGS: list[Bug] = [
    Bug(
        "release-skips-owner-check",
        "release frees the lock whoever asks",
        S + "release.lua",
        "local holder = hold[1] ~= false\n",
        "local holder = true or hold[1] ~= false\n",
        "redis-lock",
        "tests/test_lock_basic.py",
    ),
    Bug(
        "token-reused",
        "a new hold gets the last token again",
        S + "_fence.lua",
        "    if last >= token then\n        token = last + 1\n",
        "    if last >= token or last > 0 then\n        token = last\n",
        "redis-lock",
        "tests/test_contract.py",
    ),
    Bug(
        "restart-cohort-lower-token",
        "tokens count from the stored counter only: after a restart without "
        "persistence they start below the earlier ones",
        S + "_fence.lua",
        "    local token = clock\n",
        "    local token = 1\n",
        "across_restarts and lock",
        "tests/test_restart.py",
    ),
    Bug(
        "semaphore-grants-n-plus-1",
        "a semaphore grants one permit more than it has",
        S + "sem_acquire.lua",
        "if used + k + reserve <= n then",
        "if used + k + reserve <= n + 1 then",
        "redis-semaphore",
        "tests/test_semaphore.py",
    ),
    Bug(
        "writer-while-readers",
        "a writer is granted while readers hold",
        S + "rw_acquire_write.lua",
        "if rw_readers(key) > 0 then",
        "if rw_readers(key) > 99 then",
        "redis-rw",
        "tests/test_rwlock.py",
    ),
    Bug(
        "reader-past-waiting-writer",
        "a new reader is let in while a writer waits for the readers (no writer preference)",
        S + "rw_acquire_read.lua",
        "elseif not writer and rw_zlive(KEYS[3], now) > 0 then",
        "elseif not writer and rw_zlive(KEYS[3], now) > 99 then",
        "redis-rw",
        "tests/test_rwlock.py",
    ),
    Bug(
        "fair-skips-head",
        "the fair lock grants a free lock to whoever asks, not the head of its queue",
        S + "fair_acquire.lua",
        "    if head == nil or head == wid then\n",
        "    if true or head == nil or head == wid then\n",
        "redis-fair",
        "tests/test_fair.py",
    ),
    Bug(
        "stale-wait-bound",
        "a new hold shorter than the waiters' bound does not tell them "
        "(they keep an out-of-date bound)",
        S + "acquire.lua",
        "    if fence_cut(fence, ARGV[2]) then\n        wake_bounds(",
        "    if false and fence_cut(fence, ARGV[2]) then\n        wake_bounds(",
        "redis-lock",
        "tests/test_bounds.py",
    ),
    Bug(
        "renew-after-release",
        "a renewal succeeds for a hold the server no longer has",
        S + "_renew.lua",
        "    if read_typed('HEXISTS', key, field) == 1 -- nil on a key of another type\n",
        "    if true or read_typed('HEXISTS', key, field) == 1\n",
        "across_restarts and lock",
        "tests/test_restart.py",
    ),
    Bug(
        "multi-partial-grant",
        "a multi-lock takes its locks without checking that each is free",
        S + "multi_acquire.lua",
        "    if redis.call('EXISTS', key) == 1 and redis.call('HEXISTS', key, ARGV[1]) == 0 then\n",
        "    if false then\n",
        "redis-multi",
        "tests/test_multi.py",
    ),
    Bug(
        "latch-opens-early",
        "count_down opens the latch one step early",
        S + "latch_down.lua",
        "if c <= 0 then",
        "if c <= 1 then",
        "latch",
        "tests/test_latch.py",
    ),
    Bug(
        "force-release-keeps-holder",
        "force release deletes nothing",
        S + "force_release.lua",
        "redis.call('DEL'",
        "redis.call('EXISTS'",
        "redis-lock",
        "tests/test_cli_ops.py",
    ),
    Bug(
        "semaphore-release-counts-twice",
        "a released permit is counted back twice",
        S + "sem_release.lua",
        "    used = used - k\n",
        "    used = used - 2 * k\n",
        "redis-semaphore",
        "tests/test_semaphore.py",
    ),
    Bug(
        "reply-lost-not-undone",
        "an acquire whose reply was lost to cancellation is not undone",
        "aiolock/_core/holds/undo.py",
        "    def __call__(self, reply: Any, error: BaseException | None) -> None:\n",
        "    def __call__(self, reply: Any, error: BaseException | None) -> None:\n"
        "        return\n",
        "redis-lock or redis-spin or redis-rw",
        "tests/test_cancellation.py",
    ),
    Bug(
        "handoff-after-reconnect-unchecked",
        "a local handoff after a reconnect skips the check that the server still has the hold",
        "aiolock/_primitives/lock_queue.py",
        "            and hold.confirmed == engine.epoch\n"
        "        ):\n            return self._pass_locally",
        "        ):\n            return self._pass_locally",
        "",
        "tests/test_restart.py",
    ),
    Bug(
        "false-loss-after-reconnect",
        "every hold verified after a reconnect is reported lost",
        "aiolock/_core/holds/verifier.py",
        "                if alive == 1:\n                    if lease is not None:",
        "                if alive == 1 and False:\n                    if lease is not None:",
        "redis-lock",
        "tests/test_restart.py",
    ),
    Bug(
        "reentry-release-frees",
        "releasing one of two re-entries frees the lock in Redis",
        "aiolock/_core/holds/lease.py",
        "        if len(hold.leases) > 1 or hold.lost_reason is not None:",
        "        if len(hold.leases) > 2 or hold.lost_reason is not None:",
        "redis-lock",
        "tests/test_lock_basic.py",
    ),
    Bug(
        "lost-release-silent",
        "releasing a lost lease returns quietly instead of LockNotOwnedError",
        "aiolock/_core/holds/lease.py",
        "            if hold.lost_reason is not None:\n                raise LockNotOwnedError(",
        "            if hold.lost_reason is not None and False:\n"
        "                raise LockNotOwnedError(",
        "redis-lock",
        "tests/test_lock_basic.py",
    ),
    Bug(
        "refused-script-wrote",
        "acquire writes the fence before checking the waiting set's type",
        S + "acquire.lua",
        "check_some({wq, KEYS[4]}, 'zset', 'list')\n",
        "redis.call('HSET', fence, 'planted', 1)\ncheck_some({wq, KEYS[4]}, 'zset', 'list')\n",
        "",
        "tests/test_refused.py",
    ),
    Bug(
        "expiry-not-reported",
        "a fixed lease that runs out is never reported lost",
        "aiolock/_core/holds/lease.py",
        "    def mark_lost(self, reason: str) -> None:\n",
        "    def mark_lost(self, reason: str) -> None:\n        return\n",
        "redis-lock",
        "tests/test_leases.py",
    ),
    Bug(
        "rw-reader-while-writer",
        "a reader is granted while another task holds the write lock",
        S + "rw_acquire_read.lua",
        "if writer and writer ~= owner then\n",
        "if false and writer and writer ~= owner then\n",
        "redis-rw",
        "tests/test_rwlock.py",
    ),
]


def plant(bug: Bug, into: Path) -> None:
    """Make ``bug``'s change in the copy at ``into`` (exactly one occurrence)."""
    path = into / bug.path
    text = path.read_text()
    found = text.count(bug.old)
    if not bug.old or found != 1:
        raise SystemExit(f"{bug.name}: its text occurs {found} times in {bug.path}; plant it anew")
    path.write_text(text.replace(bug.old, bug.new))


def copy_project(into: Path) -> None:
    for part in ("aiolock", "tests"):
        shutil.copytree(ROOT / part, into / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "conftest.py"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, into / name)


#: The stateful tests search deeper here than in the suite (a bug may need a
#: particular sequence of several steps): examples and steps per machine.
EXAMPLES = os.environ.get("AIOLOCK_PLANT_EXAMPLES", "30")
STEPS = os.environ.get("AIOLOCK_PLANT_STEPS", "30")


def pytest(into: Path, *args: str) -> tuple[bool, float]:
    """Run pytest in the copy; True if it failed (caught the bug)."""
    env = dict(
        os.environ,
        PYTHONPATH=str(into),
        PYTHONDONTWRITEBYTECODE="1",
        AIOLOCK_STATEFUL_EXAMPLES=EXAMPLES,
        AIOLOCK_STATEFUL_STEPS=STEPS,
        AIOLOCK_STATEFUL_SHRINK="0",  # the time to catch, not to shrink
    )
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "--timeout",
            "1800",
            *args,
        ],
        cwd=into,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return proc.returncode != 0, time.monotonic() - started


def run_one(bug: Bug) -> tuple[str, float]:
    """(what caught it, seconds to catch); ("", s) if nothing did."""
    with tempfile.TemporaryDirectory(prefix="aiolock-plant-") as tmp:
        into = Path(tmp)
        copy_project(into)
        plant(bug, into)
        spent = 0.0
        if bug.stateful:
            caught, secs = pytest(into, "tests/test_stateful.py", "-k", bug.stateful)
            spent += secs
            if caught:
                return "stateful", spent
        caught, secs = pytest(into, bug.guard)
        spent += secs
        return (bug.guard.removeprefix("tests/") if caught else ""), spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.plant", description=__doc__)
    parser.add_argument("names", nargs="*", help="only these bugs")
    parser.add_argument("--list", action="store_true", help="list the bugs and stop")
    args = parser.parse_args(argv)
    bugs = [b for b in BUGS if not args.names or b.name in args.names]
    if args.list:
        for b in bugs:
            print(f"{b.name:36} {b.path:36} {b.what}")
        return 0
    missed = 0
    print("| bug | planted in | caught by | seconds |\n|---|---|---|---|", flush=True)
    for bug in bugs:
        by, secs = run_one(bug)
        missed += not by
        print(f"| {bug.name} | {bug.path} | {by or '**MISSED**'} | {secs:.0f} |", flush=True)
    print(f"{len(bugs) - missed} of {len(bugs)} caught", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
