"""``@lock`` on async functions, and a lock named from the call's arguments.

* ``@report_lock``: every call of the function holds one fixed lock, in
  every process that shares the Redis.
* ``@report_lock(timeout=...)``: the same, but give up waiting after that long
  (``LockTimeoutError``, also a ``TimeoutError``).
* ``@locked(client, "account:{account_id}")``: a small helper (below, copy
  it) that builds the lock's name from the call's arguments, so calls for
  different accounts run in parallel and calls for one account take turns.

Run it (a server at ``$REDIS_URL``, default ``redis://localhost:6379/0``; with
none, prefix the command with ``aiolock run``)::

    python examples/decorator.py
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import secrets
import string
import time
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from redis.asyncio import Redis

import aiolock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
P = ParamSpec("P")
R = TypeVar("R")

# Creating a Client does no I/O: it connects on first use and binds to the
# event loop that first uses it. Module level is fine here because this
# program runs one event loop (one asyncio.run()); a second loop using it
# (another asyncio.run(), a test framework's per-test loop, another thread)
# gets WrongEventLoopError: there, create one Client per loop (README, Errors).
db = Redis.from_url(REDIS_URL, decode_responses=True)
locks = aiolock.Client(db, prefix="example-decorator")
RUN = secrets.token_hex(3)  # keeps this run's keys apart from other runs'


def locked(
    client: aiolock.Client, template: str, *, timeout: float | None = None
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Hold the lock ``template.format(**arguments)`` for each call.

    ``@locked(client, "account:{account_id}")`` on ``async def f(account_id, ...)``
    locks ``account:42`` for ``f(42, ...)``. Defaults count, and the template is
    checked against the signature when the function is decorated.
    """

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        signature = inspect.signature(fn)
        unknown = {
            name
            for _, name, _, _ in string.Formatter().parse(template)
            if name and name.split(".")[0].split("[")[0] not in signature.parameters
        }
        if unknown:
            raise TypeError(f"{template!r} names {sorted(unknown)}, not parameters of {fn!r}")

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            name = template.format(**bound.arguments)
            async with client.lock(name)(timeout=timeout):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate


# --------------------------------------------------------------------------- using them

report_lock = locks.lock(f"{RUN}:nightly-report")


@report_lock
async def build_report(who: str) -> None:
    print(f"  {clock()}  {who} builds the report")
    await asyncio.sleep(0.2)
    print(f"  {clock()}  {who} is done")


@report_lock(timeout=0.05)
async def peek_at_report() -> str:
    return "the report is not being built right now"


@locked(locks, RUN + ":account:{account_id}")
async def deposit(account_id: int, amount: int) -> None:
    # A racy read-modify-write: safe only because calls for one account take turns.
    key = f"example-decorator:{RUN}:balance:{account_id}"
    balance = int(await db.get(key) or 0)
    await asyncio.sleep(0.02)  # e.g. a call to another service
    await db.set(key, balance + amount, ex=600)


STARTED = time.monotonic()


def clock() -> str:
    return f"{time.monotonic() - STARTED:5.2f}s"


async def main() -> int:
    async with locks:
        print("three concurrent calls of @report_lock build_report take turns:")
        builders = [asyncio.create_task(build_report(who)) for who in ("alice", "bob", "carol")]
        await asyncio.sleep(0.05)
        try:
            print(f"  {clock()}  peek_at_report(): {await peek_at_report()}")
        except TimeoutError:
            print(f"  {clock()}  peek_at_report() gave up after 0.05 s: the report is busy")
        await asyncio.gather(*builders)

        print("20 concurrent deposits of 10, to accounts 1 and 2 (lock per account):")
        start = time.monotonic()
        await asyncio.gather(*(deposit(1 + i % 2, 10) for i in range(20)))
        took = time.monotonic() - start
        balances = [int(await db.get(f"example-decorator:{RUN}:balance:{a}") or 0) for a in (1, 2)]
        print(f"  balances {balances} (expected [100, 100]) in {took:.2f} s")
        print("  (10 deposits per account take turns; the two accounts run side by side)")
    await db.aclose()
    return 0 if balances == [100, 100] else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
