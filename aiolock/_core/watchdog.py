"""The Client's one watchdog task: renews every watchdog lease, in batches.

Every ``lease / 3`` seconds it renews everything registered with it (holds
taken without an explicit lease, and the queue entries of waiting fair-lock
tasks), grouped by renewal script, up to ``BATCH`` keys per script call, all
calls pipelined on the Client's renewal connection: its own, so that a
renewal never waits behind a burst of acquires on the main one. An item
whose renewal finds it gone is told so at once (a hold is then lost, unless
a release of it is under way: the release's reply decides, see
``Hold.gone``; renewals and releases use different connections, so a
renewal can run after a release and be answered first). A renewal that
fails (connection error, no reply) is retried every ``interval / 4`` until
the item's known expiry passes, and then it is gone: a lease is never
assumed alive past the last moment Redis is known to have extended it.

``plan_batches`` is a pure function, tested without a server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from .futures import stop

__all__ = ["BATCH", "Renewable", "Renewer", "Watchdog", "plan_batches"]

log = logging.getLogger("aiolock")

#: Keys per renewal script call: 10,000 holds cost 5 calls per interval,
#: each a few milliseconds of Redis time.
BATCH = 2000
T = TypeVar("T")


class Renewable(Protocol):
    """What the watchdog renews: one key per item, renewed by a batch script."""

    renew_script: str
    renew_key: str
    renew_args: tuple[Any, ...]
    expires_at: float

    def renewed(self, sent: float, lease: float) -> None: ...

    def gone(self, reason: str) -> None: ...


class Renewer(Protocol):
    """What the watchdog needs of its engine: one batch renewal call.

    ``Engine`` satisfies it structurally (declared here: no import of the engine).
    """

    def renew_batch(self, script: str, items: list[Any], lease: float) -> asyncio.Future[Any]:
        """Renew ``items`` for ``lease`` seconds; the future gets 1 or 0 per item."""
        ...


def plan_batches(items: Sequence[T], size: int = BATCH) -> list[list[T]]:
    """Split items into renewal batches of at most ``size`` keys."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


class Watchdog:
    def __init__(self, engine: Renewer, lease: float) -> None:
        self._engine = engine
        self.lease = lease
        self.interval = lease / 3
        self._items: dict[Renewable, None] = {}
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self.rounds = 0
        self.calls = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: Renewable) -> None:
        self._items[item] = None
        if len(self._items) == 1:
            self._kick.set()

    def remove(self, item: Renewable) -> None:
        self._items.pop(item, None)

    def __contains__(self, item: Renewable) -> bool:
        return item in self._items

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aiolock-watchdog")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop(task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.interval
        while True:
            if not self._items:
                self._kick.clear()
                await self._kick.wait()
                delay = self.interval
            await asyncio.sleep(delay)
            if not self._items:
                continue
            ok = await self.renew_all()
            delay = self.interval if ok else max(self.interval / 4, 0.01)
            # Never sleep past the earliest known expiry of an item we failed to renew.
            if not ok and self._items:
                earliest = min(item.expires_at for item in self._items)
                delay = max(0.0, min(delay, earliest - loop.time()))

    async def renew_all(self) -> bool:
        """One round: renew every item. Returns False if any renewal failed."""
        engine = self._engine
        loop = asyncio.get_running_loop()
        items = list(self._items)
        self.rounds += 1
        sent = loop.time()
        by_script: dict[str, list[Renewable]] = {}
        for item in items:
            by_script.setdefault(item.renew_script, []).append(item)
        batches = [
            (script, batch) for script, group in by_script.items() for batch in plan_batches(group)
        ]
        futures = [engine.renew_batch(script, batch, self.lease) for script, batch in batches]
        self.calls += len(futures)
        deadline = min(item.expires_at for item in items)
        results: list[Any]
        try:
            async with asyncio.timeout_at(max(deadline, sent + 0.001)):
                results = list(await asyncio.gather(*futures, return_exceptions=True))
        except TimeoutError:
            results = [TimeoutError("renewal got no reply before the lease expired")] * len(batches)
        ok = True
        now = loop.time()
        for (_, batch), result in zip(batches, results, strict=True):
            if isinstance(result, BaseException):
                ok = False
                for item in batch:
                    if item in self._items and now >= item.expires_at:
                        item.gone(f"could not renew before expiry: {result!r}")
                continue
            for item, renewed in zip(batch, result, strict=True):
                if item not in self._items:
                    continue  # released meanwhile
                if renewed == 1:
                    item.renewed(sent, self.lease)
                else:
                    item.gone("the watchdog found the hold gone (expired or taken)")
        if not ok:
            log.warning("aiolock watchdog: renewal failed; retrying until the leases expire")
        return ok
