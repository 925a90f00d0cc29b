"""Fencing tokens: Kleppmann's paused client, made runnable.

A lock with a lease cannot stop a holder that is paused (a long GC pause, a
stopped VM, a swapped-out process) from waking up after its lease ran out and
writing as if it still held the lock. No lock can: the holder does not run
while paused, so it cannot notice anything. The defence is at the resource:
every acquisition gets a fencing token larger than every earlier one, the
holder sends it with each write, and the resource refuses a token older than
the newest it has seen.

What happens here:

1. client 1 (its own thread and event loop, standing for another process)
   takes the lock and gets token T1;
2. client 1 freezes for longer than its lease (``time.sleep``: its whole
   event loop stops, watchdog included, as in a stop-the-world pause), so the
   lease runs out in Redis;
3. client 2 takes the lock, gets T2 > T1, and writes: accepted;
4. client 1 wakes up, still "inside" its ``async with``, and writes with T1:
   the storage refuses it. Leaving the ``async with``, aiolock finds the hold
   gone and raises ``LockLostError``.

Run it (a server at ``$REDIS_URL``, default ``redis://localhost:6379/0``; with
none, prefix the command with ``aiolock run``)::

    python examples/fencing.py
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time

import aiolock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
LEASE = 1.0  # client 1's lease (renewed by its watchdog, while it runs)
PAUSE = 2.0  # how long client 1 is frozen


class StaleTokenError(Exception):
    """The storage refused a write: a newer fencing token has written already."""


class Storage:
    """A stand-in for the resource the lock protects (a file store, a database row).

    It remembers the highest fencing token it has accepted per key and refuses
    writes with an older one. With a real database this is a condition in the
    write itself, e.g. ``UPDATE ... SET data = $1, token = $2 WHERE id = $3
    AND token <= $2``, so the check and the write are one atomic step.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()  # the two clients run in two threads here
        self.data: dict[str, str] = {}
        self.tokens: dict[str, int] = {}

    def write(self, key: str, value: str, token: int) -> None:
        with self._guard:
            newest = self.tokens.get(key, 0)
            if token < newest:
                raise StaleTokenError(
                    f"write to {key!r} with token {token} refused: token {newest} wrote already"
                )
            self.tokens[key] = token
            self.data[key] = value


STARTED = time.monotonic()


def say(who: str, text: str) -> None:
    print(f"{time.monotonic() - STARTED:5.2f}s  {who}: {text}", flush=True)


async def paused_client(
    storage: Storage, name: str, has_lock: threading.Event, outcome: dict[str, object]
) -> None:
    async with aiolock.Client.from_url(REDIS_URL, prefix="example-fencing", lease=LEASE) as c:
        try:
            async with c.lock(name) as lease:
                say("client 1", f"holds the lock, fencing token {lease.fencing_token}")
                has_lock.set()
                say("client 1", f"freezes for {PAUSE:g} s (its lease is {LEASE:g} s) ...")
                # Blocking on purpose: this whole event loop stops, nothing of client 1 runs.
                time.sleep(PAUSE)  # noqa: ASYNC251
                say("client 1", "wakes up and writes, believing it still holds the lock")
                try:
                    storage.write("report.txt", "written by client 1", lease.fencing_token)
                    outcome["late_write"] = "accepted"
                    say("client 1", "its write was ACCEPTED: the stale data won")
                except StaleTokenError as exc:
                    outcome["late_write"] = "refused"
                    say("storage ", str(exc))
        except aiolock.LockLostError as exc:
            outcome["lost"] = True
            say("client 1", f"LockLostError: {exc}")


async def other_client(storage: Storage, name: str, has_lock: threading.Event) -> None:
    async with aiolock.Client.from_url(REDIS_URL, prefix="example-fencing") as c:
        await asyncio.to_thread(has_lock.wait)
        say("client 2", "waits for the lock ...")
        async with c.lock(name)(timeout=10) as lease:
            say(
                "client 2",
                f"holds the lock once client 1's lease ran out, token {lease.fencing_token}",
            )
            storage.write("report.txt", "written by client 2", lease.fencing_token)
            say("client 2", "wrote report.txt: accepted")


def main() -> int:
    storage = Storage()
    name = f"report.txt:{secrets.token_hex(3)}"
    has_lock = threading.Event()
    outcome: dict[str, object] = {}
    one = threading.Thread(
        target=asyncio.run, args=(paused_client(storage, name, has_lock, outcome),)
    )
    one.start()
    asyncio.run(other_client(storage, name, has_lock))
    one.join()
    print(f"\nreport.txt holds {storage.data.get('report.txt')!r}")
    ok = outcome.get("late_write") == "refused" and outcome.get("lost") is True
    if ok:
        print("the late write of the paused client was refused by its old fencing token")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
