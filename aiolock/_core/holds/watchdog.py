"""The Client's one watchdog task: renews every watchdog lease, and checks
every fixed lease, in batches.

A fixed lease (``lease=<seconds>``) is checked, never renewed: it is in the
same rounds, sent to its renewal script with a lease of 0 ms, which only
answers whether the hold is still there. So a hold deleted any other way
than by its holder (a force release its Client did not hear of, an
operator's ``DEL``, an eviction, a restart that lost it) is found gone and
reported lost within one interval (``lease / 3`` of the Client's lease)
plus a round trip. A checked item is never the reason a round comes early.

Every ``lease / 3`` seconds (sooner for an item added with less than two
thirds of a lease left, its acquire having taken a while) it renews
everything registered with it (holds
taken without an explicit lease, and the queue entries of waiting fair-lock
tasks and read-write writers), grouped by renewal script (and in cluster
mode by the master serving the item's slot: one call never spans two
nodes, see ``shard_by`` and spread.py), up to ``BATCH`` keys per script
call, all calls pipelined on the Client's renewal lane: its own, so that a
renewal never waits behind a burst of acquires on the main one. The calls
are sent one per loop turn and their replies handled one per loop turn, so
no turn of the event loop does more than one batch of work. An item whose
renewal finds it gone is told so at once (a hold is then lost, unless a
release of it is under way: the release's reply decides, see
``Hold.gone``; renewals and releases use different connections, so a
renewal can run after a release and be answered first). A renewal that
fails (connection error, no reply) is retried every ``interval / 4`` until
the item's known expiry passes, and then it is gone: a lease is never
assumed alive past the last moment Redis is known to have extended it.
Such a run of failed rounds is logged once (``outage.Outage``): a WARNING
at its first failure, an INFO when a round succeeds again (or nothing is
left to renew) with how long it lasted, how many rounds failed and how
many items were lost meanwhile.

``plan_batches`` and ``group_batches`` are pure functions, tested without
a server.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from ..futures import stop
from ..outage import Outage

__all__ = ["BATCH", "Renewable", "Renewer", "Watchdog", "group_batches", "plan_batches"]

log = logging.getLogger("aiolock.watchdog")

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

    # (``watchdog``, if present and False: a fixed lease, checked only.)

    def gone(self, reason: str) -> None: ...


R = TypeVar("R", bound=Renewable)


class Renewer(Protocol):
    """What the watchdog needs of its engine: one batch renewal call.

    ``Engine`` satisfies it structurally (declared here: no import of the engine).
    """

    def renew_batch(
        self, script: str, items: Sequence[Any], lease: float
    ) -> asyncio.Future[list[Any]]:
        """Renew ``items`` for ``lease`` seconds; the future gets 1 (renewed),
        0 (gone) or an exception (that item's renewal failed) per item."""
        ...


def plan_batches(items: Sequence[T], size: int = BATCH) -> list[list[T]]:
    """Split items into renewal batches of at most ``size`` keys."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def group_batches(
    items: Iterable[R], shards: Iterable[Hashable] | None = None, size: int = BATCH
) -> list[tuple[str, list[R]]]:
    """The renewal calls for ``items``: ``(script, batch)``, a batch being at
    most ``size`` items of one renewal script and, given ``shards`` (cluster
    mode: each item's shard, ``Engine.shard(item.renew_key)``, in the order of
    ``items``), of one shard."""
    if shards is None:
        by_script: dict[tuple[str, bool], list[R]] = {}
        for item in items:
            by_script.setdefault((item.renew_script, checked(item)), []).append(item)
        return [
            (s, batch) for (s, _), group in by_script.items() for batch in plan_batches(group, size)
        ]
    by_shard: dict[tuple[str, bool, Hashable], list[R]] = {}
    for item, shard in zip(items, shards, strict=True):
        by_shard.setdefault((item.renew_script, checked(item), shard), []).append(item)
    return [
        (s, batch) for (s, _, _), group in by_shard.items() for batch in plan_batches(group, size)
    ]


def checked(item: Any) -> bool:
    """Whether ``item`` is only checked (a fixed lease), not renewed. A batch
    of ``group_batches`` never mixes the two."""
    return getattr(item, "watchdog", True) is False


class Watchdog:
    """The renewal task of one Client and the items it renews (see the module docstring)."""

    def __init__(self, engine: Renewer, lease: float) -> None:
        self._engine = engine
        self.lease = lease
        self.interval = lease / 3
        # Each item, with its key's cluster slot (0 standalone): computed once.
        self._items: dict[Renewable, int] = {}
        self._slot: Callable[[Any], int] | None = None
        self._node: Callable[[int], Hashable] | None = None
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        # Loop time of the next round (see _run; inf while idle, with nothing
        # to renew); an item added that is due sooner kicks the watchdog, and
        # only such an item: a lock handed on in this Client removes one hold
        # and adds the next, which must not wake the watchdog each time.
        # _soonest: the earliest due time of the items added since the last
        # round began (the others were renewed then).
        self._wake_at = math.inf
        self._soonest = math.inf
        self.rounds = 0
        self.calls = 0
        #: The run of failed rounds under way, if any (one WARNING, one INFO).
        self.outage = Outage()
        self._error: BaseException | None = None  # the last renewal error seen
        self._gone = 0  # items found gone or lost in this round
        #: How many items are only checked (fixed leases), not renewed.
        self.checked = 0
        # The task waits for a first item (nothing to renew or check). A checked
        # item added then does not wake it (no task step per acquire of a
        # fixed lease): a timer does, an interval later, for a round at once.
        self._idle = False
        self._idle_timer: asyncio.TimerHandle | None = None

    def shard_by(self, slot: Callable[[Any], int], node: Callable[[int], Hashable]) -> None:
        """Cluster mode: batch the items by node, never two nodes in one call.
        ``slot(key)`` (computed once per item) is its key's slot, and
        ``node(slot)`` the master serving it by the current map (asked every
        round: a moved slot's items follow it)."""
        self._slot, self._node = slot, node
        for item in self._items:
            self._items[item] = slot(item.renew_key)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: Renewable) -> None:
        slot = self._slot
        self._items[item] = 0 if slot is None else slot(item.renew_key)
        if checked(item):
            # Checked at the next round, whenever it comes: never sooner.
            self.checked += 1
            if self._idle and self._idle_timer is None:
                self._idle_timer = asyncio.get_running_loop().call_later(
                    self.interval, self._idle_check
                )
            return
        due = item.expires_at - 2 * self.interval  # (self._due(item), inline: once per hold)
        self._soonest = min(self._soonest, due)
        if due < self._wake_at:
            self._kick.set()

    def _idle_check(self) -> None:
        self._idle_timer = None
        self.check_now()

    def _due(self, item: Renewable) -> float:
        """When ``item``'s renewal is due: ``2 * interval`` (two thirds of a
        lease) before its known expiry, as for an item renewed on time. An
        item whose acquire took a while (a first connection, a loaded host)
        has less left of its lease than a whole one when it is added: it is
        due sooner than ``interval`` after that."""
        return item.expires_at - 2 * self.interval

    def remove(self, item: Renewable) -> None:
        if self._items.pop(item, None) is not None and checked(item):
            self.checked -= 1

    def swap(self, old: Renewable, new: Renewable) -> None:
        """``remove(old)`` then ``add(new)`` for an item that takes over
        ``old``'s key and expiry (a watchdog hold passed on locally): its
        renewal is due when ``old``'s was, so the watchdog is not woken. One
        dict update per local handoff."""
        slot = self._items.pop(old, None)
        if (
            slot is None
            or getattr(old, "watchdog", True) is False  # (checked(), inline)
            or getattr(new, "watchdog", True) is False
            or new.expires_at != old.expires_at
        ):
            if slot is not None and checked(old):
                self.checked -= 1
            self.add(new)
            return
        self._items[new] = slot

    def check_now(self) -> None:
        """Start a round at once (or right after the one under way): the
        Client may have missed an eviction message (evict.py)."""
        if self._items:
            self._soonest = -math.inf
            self._kick.set()

    def items(self) -> list[Renewable]:
        """Every item renewed or checked (a copy)."""
        return list(self._items)

    def __contains__(self, item: Renewable) -> bool:
        return item in self._items

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aiolock-watchdog")

    async def aclose(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        task, self._task = self._task, None
        await stop(task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        wake = loop.time() + self.interval
        retrying = False
        while True:
            if not self._items:
                self._ended("nothing is left to renew")
                self._wake_at = math.inf
                self._kick.clear()
                self._idle = True
                try:
                    await self._kick.wait()
                finally:
                    self._idle = False
                    if self._idle_timer is not None:
                        self._idle_timer.cancel()
                        self._idle_timer = None
                wake, retrying = loop.time() + self.interval, False
            if not retrying:
                # A round every interval, or sooner if an item is due sooner:
                # each renewal then has two thirds of a lease to be answered.
                wake = min(wake, self._soonest)
            self._wake_at = wake
            self._kick.clear()
            delay = wake - loop.time()
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await self._kick.wait()
                except TimeoutError:
                    pass
                else:
                    continue  # an item due sooner than ``wake`` was added
            if not self._items:
                continue
            self._soonest = math.inf  # (every item is in this round)
            ok = await self.renew_all()
            now = loop.time()
            retrying = not ok
            wake = now + (self.interval if ok else max(self.interval / 4, 0.01))
            # Never sleep past the earliest known expiry of an item we failed to renew.
            if not ok and self._items:
                earliest = min(item.expires_at for item in self._items)
                wake = max(now, min(wake, earliest))

    async def renew_all(self) -> bool:
        """One round: renew every item. Returns False if any renewal failed.

        The calls are sent one per loop turn, and their replies handled one
        per loop turn as they come (in cluster mode the items are grouped
        ``BATCH`` at a time per loop turn too): no turn of the event loop
        does more than one batch of work (one to three milliseconds for
        2,000 items).
        """
        engine = self._engine
        loop = asyncio.get_running_loop()
        self.rounds += 1
        self._gone = 0
        sent = loop.time()
        items = list(self._items)
        if self._node is None:
            batches = group_batches(items)
        else:
            batches = await self._group_by_node()
        # (A fixed lease that ends sooner is no reason to wait less: it
        # simply expires.)
        renewed = [item.expires_at for item in items if not checked(item)]
        deadline = max(min(renewed) if renewed else sent + self.interval, sent + 0.001)
        batch_of: dict[asyncio.Future[list[Any]], list[Renewable]] = {}
        ok = True
        try:
            for script, batch in batches:
                if batch_of:
                    await asyncio.sleep(0)  # one call's packing per loop turn
                lease = 0.0 if checked(batch[0]) else self.lease
                batch_of[engine.renew_batch(script, batch, lease)] = batch
                self.calls += 1
            pending = set(batch_of)
            while pending:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                for i, fut in enumerate(done):
                    if i:
                        await asyncio.sleep(0)  # one batch's replies per loop turn
                    ok = self._handle(batch_of[fut], fut, sent) and ok
        finally:
            late = [fut for fut in batch_of if not fut.done()]
            for fut in late:
                fut.cancel()
        for fut in late:
            ok = self._handle(batch_of[fut], fut, sent) and ok
        if not ok:
            if self.outage.failed():
                log.warning(
                    "lease renewals failed (%s); retrying every %.2g s, each lease is lost "
                    "if not renewed before it expires",
                    self._error,
                    max(self.interval / 4, 0.01),
                )
            self.outage.note(self._gone)
        else:
            self._ended("they succeed again")
        return ok

    def _ended(self, how: str) -> None:
        run = self.outage.ended()
        if run is not None:
            log.info(
                "lease renewals failed %d times over %.1f s, until %s; %d leases or queue "
                "places lost meanwhile",
                run.failures,
                run.seconds,
                how,
                run.noted,
            )

    async def _group_by_node(self) -> list[tuple[str, list[Renewable]]]:
        """Cluster mode: the items' batches by script and node, ``BATCH``
        items grouped per loop turn (each item's slot is known: ``shard_by``)."""
        node = self._node
        assert node is not None
        pairs = list(self._items.items())
        groups: dict[tuple[str, bool, Hashable], list[Renewable]] = {}
        for start in range(0, len(pairs), BATCH):
            if start:
                await asyncio.sleep(0)
            for item, slot in pairs[start : start + BATCH]:
                key = (item.renew_script, checked(item), node(slot))
                groups.setdefault(key, []).append(item)
        return [(s, batch) for (s, _, _), group in groups.items() for batch in plan_batches(group)]

    def _handle(self, batch: list[Renewable], fut: asyncio.Future[list[Any]], sent: float) -> bool:
        """Apply one call's results to its items; False if it (or an item) failed."""
        results: Sequence[Any]
        if not fut.done() or fut.cancelled():
            results = [TimeoutError("renewal got no reply before the lease expired")] * len(batch)
        elif fut.exception() is not None:
            results = [fut.exception()] * len(batch)
        else:
            results = fut.result()
        ok = True
        now = asyncio.get_running_loop().time()
        items = self._items
        lease = 0.0 if checked(batch[0]) else self.lease
        for item, renewed in zip(batch, results, strict=True):
            if item not in items:
                continue  # released meanwhile
            if renewed == 1:
                item.renewed(sent, lease)
            elif isinstance(renewed, BaseException):
                ok = False
                self._error = renewed
                if now >= item.expires_at:
                    self._gone += 1
                    item.gone(f"could not renew before expiry: {renewed!r}")
            else:
                self._gone += 1
                item.gone("the watchdog found the hold gone (expired or taken)")
        return ok
