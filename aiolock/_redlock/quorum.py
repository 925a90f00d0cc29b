"""The quorum engine: Redlock's engine, over the Engines of N independent masters.

``QuorumEngine`` offers the interfaces the shared machinery already uses of
an ``Engine``, each answered by a majority of the masters:

* ``Contender`` (``compete`` in _primitives/compete.py): ``loop``, ``closed``,
  ``lease``, ``command_timeout``, ``unreachable``;
* ``HoldEngine`` (_core/holds/lease.py: ``Hold`` and ``Lease``): ``release_hold``,
  ``extend_hold``, ``untrack``, ``run_callback``, ``check_usable``,
  ``observer``;
* ``Renewer`` (_core/holds/watchdog.py): ``renew_batch``, so that a plain
  ``Watchdog`` renews Redlock's holds, every ``validity / 3``.

Each is one ``quorum`` call (calls.py) over the masters' Engines, through
their public interface only: scripts are run by the masters' Engines
(``send_script``, ``eval``, ``retry``, ``renew_batch``), which load them.
The acquisition attempt is attempt.py, the fencing rule fencing.py.

Renewal: the watchdog's lease is a renewal's *validity* (``lease - drift *
lease - 2 ms``: how long a hold renewed on a majority may count on it); the
masters are given the whole lease. A round that renews a majority moves a
hold's validity on; a hold gone on a majority is lost; one that could not be
renewed on a majority is retried until its validity ends, then lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from .._core.errors import (
    ConnectionFailedError,
    LockNotOwnedError,
    UnsupportedServerError,
)
from .._core.holds.evict import FORCE_RELEASED
from .._core.holds.lease import Hold, Lease, LostCallback
from .._core.holds.watchdog import Watchdog
from .._core.observe.observer import CLIENT_CLOSED, Observer
from .._core.outage import Outage
from .._core.protocol.keys import lost_prefix
from .._primitives.base import current_task
from . import attempt as attempts
from .attempt import MASTER_TIMEOUT, Outcome
from .calls import Master, collect, quorum, redis_cause, too_few
from .fencing import Read, seed_generation

if TYPE_CHECKING:
    from .._core.engine import Engine

__all__ = ["CLOCK_SLACK", "LAST_TOKENS", "UNDO_WAIT", "QuorumEngine"]

log = logging.getLogger("aiolock.redlock")

#: The constant of the validity (``lease - elapsed - drift * lease - CLOCK_SLACK``).
CLOCK_SLACK = 0.002
#: A failed attempt waits at most this long for its undo before the task waits or retries.
UNDO_WAIT = 0.5
#: Names whose last token a Redlock remembers for its proposals.
LAST_TOKENS = 1024


class _Part:
    """One hold's renewal item on one master (``Engine.renew_batch`` takes these)."""

    __slots__ = ("renew_args", "renew_key")

    def __init__(self, key: str, value: str) -> None:
        self.renew_key = key
        self.renew_args = (value,)


class QuorumEngine:
    """The engine of one ``Redlock``: its masters, holds, watchdog and fencing memory."""

    def __init__(self, engines: Sequence[Engine], drift: float) -> None:
        self.masters = [Master(e) for e in engines]
        self.drift = drift
        self.majority = len(engines) // 2 + 1
        self.lease = min(e.lease for e in engines)
        #: The hold of each name held here, and the tasks parked per name.
        self.holds: dict[str, Hold] = {}
        self.waiting: dict[str, int] = {}
        #: The founding generations last seen (passed with every attempt).
        self.roster: tuple[str, ...] = ()
        # The last token handed out per name, for the proposals (bounded).
        self._last: dict[str, int] = {}
        # The watchdog, while it has holds to renew (see _watch).
        self._watchdog: Watchdog | None = None
        self._idle: asyncio.Event | None = None

    # -- Contender (compete) ---------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.masters[0].engine.loop

    @property
    def closed(self) -> bool:
        return any(m.engine.closed for m in self.masters)

    @property
    def unreachable(self) -> Outage:
        return self.masters[0].engine.unreachable

    @property
    def command_timeout(self) -> float:
        """How long an attempt waits for a master (a first contact gives up after it)."""
        return MASTER_TIMEOUT

    # -- HoldEngine (Hold, Lease) ----------------------------------------------------------

    @property
    def observer(self) -> Observer:
        """The first Client's: Redlock's acquisitions, holds and losses count there."""
        return self.masters[0].engine.observer

    def check_usable(self) -> None:
        for master in self.masters:
            master.engine.check_usable()

    def run_callback(self, callback: LostCallback, lease: Lease) -> None:
        self.masters[0].engine.run_callback(callback, lease)

    def untrack(self, hold: Hold) -> None:
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.remove(hold)
            if not len(watchdog) and self._idle is not None:
                self._idle.set()
        value = hold.release_args[0] if hold.release_args else None
        for master in self.masters:
            master.engine.evictions.values.pop(value, None)  # type: ignore[arg-type]

    def release_hold(self, hold: Hold) -> asyncio.Future[int]:
        """Release ``hold`` on every master; the future gets 1 (released) or 0 (gone).

        Decided once a majority confirmed they deleted the key, or once one
        did and the others had ``MASTER_TIMEOUT`` to answer, or once every
        master answered. A master that failed or did not answer is released
        again in the background (by value: idempotent); with no confirmation
        at all, the release waits for those retries. It completes whatever
        happens to its caller (a task of the first master's Engine)."""
        outcome: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        hold.releasing = outcome
        name, value = hold.name, hold.release_args[0]
        # Sent now, before the task that gathers the replies first runs.
        calls = [
            m.script("redlock_release", (m.lock_key(name),), (value, m.channel(name)))
            for m in self.masters
        ]
        self.spawn(self._release(hold, outcome, calls))
        return outcome

    async def _release(
        self, hold: Hold, outcome: asyncio.Future[int], calls: list[asyncio.Future[Any]]
    ) -> None:
        name, value = hold.name, hold.release_args[0]
        majority = self.majority
        try:
            replies = await quorum(
                calls, MASTER_TIMEOUT, lambda rs: rs.count(1) >= majority, _keep_going
            )
            if 1 not in replies and None in replies:
                # Nothing confirmed yet: wait for a confirmation, or every master.
                replies = await quorum(calls, None, lambda rs: 1 in rs, _keep_going)
            retries = [
                self.spawn(self._retry_release(m, name, value))
                for m, r in zip(self.masters, replies, strict=True)
                if isinstance(r, BaseException) or r is None
            ]
            if retries and 1 not in replies:
                await asyncio.wait(retries)
                replies = [*replies, *(t.result() for t in retries)]
        except BaseException as exc:  # cancelled (the Client closing)
            hold.releasing = None
            hold.mark_lost(f"release failed: {exc!r}")
            if not outcome.done():
                outcome.set_exception(exc)
            raise
        self._release_done(hold, outcome, replies)

    @staticmethod
    async def _retry_release(master: Master, name: str, value: str) -> Any:
        try:
            return await master.engine.retry(
                "redlock_release", (master.lock_key(name),), (value, master.channel(name))
            )
        except Exception as exc:
            return exc

    def _release_done(self, hold: Hold, outcome: asyncio.Future[int], replies: list[Any]) -> None:
        codes = [int(r) for r in replies if isinstance(r, int)]
        if not codes:
            error = next((r for r in replies if isinstance(r, BaseException)), None)
            hold.releasing = None
            hold.mark_lost(f"release failed: {error!r}")
            if not outcome.done():
                failure = ConnectionFailedError(
                    f"Redlock {hold.name!r}: no master could be reached to release it; "
                    "it frees itself when its lease runs out"
                )
                failure.__cause__ = None if error is None else redis_cause(error)
                outcome.set_exception(failure)
            return
        code = 1 if any(codes) else 0
        if code == 0 and not hold.lost:
            hold.mark_lost("the hold was gone when released (expired or force-released)")
        hold.detach()
        if not outcome.done():
            outcome.set_result(code)

    async def extend_hold(self, hold: Hold, seconds: float) -> None:
        sent = asyncio.get_running_loop().time()
        why = "the hold was gone on a majority of masters when extended"
        result = await self._renew(hold.renew_script, [hold], seconds, why)
        if result[0] == 0:
            raise LockNotOwnedError(f"{hold.name!r}: {why}")
        if isinstance(result[0], BaseException):
            # Too few answered to know: the hold stands until its validity ends.
            raise result[0]
        hold.extended(sent + self.validity(seconds))

    # -- Renewer (Watchdog) ----------------------------------------------------------------

    def renew_batch(
        self, script: str, items: Sequence[Any], lease: float
    ) -> asyncio.Future[list[Any]]:
        """Renew ``items`` (Redlock holds) on every master, each master's part
        by its Engine's ``renew_batch``; per hold: 1 (renewed on a majority),
        0 (gone on a majority) or ConnectionFailedError (too few answered).
        ``lease`` 0 only checks (fixed leases); else the masters get the whole
        lease (the watchdog's is the validity of a renewal)."""
        seconds = 0.0 if lease <= 0 else self.lease
        why = "the hold was gone on a majority of masters"
        return asyncio.ensure_future(self._renew(script, list(items), seconds, why))

    async def _renew(self, script: str, holds: list[Hold], seconds: float, why: str) -> list[Any]:
        """Renew (``seconds`` 0: check) ``holds`` on every master. A hold gone
        on a majority is told so (``Hold.gone(why)``) before its 0 is returned."""
        calls = [
            m.engine.renew_batch(
                script, [_Part(m.lock_key(h.name), h.renew_args[0]) for h in holds], seconds
            )
            for m in self.masters
        ]
        replies = await quorum(calls, MASTER_TIMEOUT)
        n, majority = len(self.masters), self.majority
        results: list[Any] = []
        for i, hold in enumerate(holds):
            alive = sum(1 for r in replies if isinstance(r, list) and r[i] == 1)
            gone = sum(1 for r in replies if isinstance(r, list) and r[i] == 0)
            if alive >= majority:
                results.append(1)
            elif gone > n - majority:
                hold.gone(why)
                results.append(0)
            else:
                results.append(too_few(f"Redlock {hold.name!r}: not renewed", replies, majority))
        return results

    def watch(self, hold: Hold) -> None:
        """Renew ``hold`` (or, a fixed lease, check it) every ``validity / 3``;
        and hear at once of a force release of it."""
        watchdog = self._watchdog
        if watchdog is None:
            watchdog = self._watchdog = Watchdog(self, self.validity(self.lease))
            self._idle = asyncio.Event()
            self.spawn(self._run(watchdog, self._idle))
        watchdog.add(hold)
        self._heed(hold)

    async def _run(self, watchdog: Watchdog, idle: asyncio.Event) -> None:
        """The watchdog's life, a task of the first master's Engine: from its
        first hold until it has none left. Closing that Client ends it: its
        holds are lost."""
        watchdog.start()
        try:
            while len(watchdog):
                idle.clear()
                await idle.wait()
        except asyncio.CancelledError:
            for hold in watchdog.items():
                if isinstance(hold, Hold):
                    hold.mark_lost(CLIENT_CLOSED)
            raise
        finally:
            if self._watchdog is watchdog:
                self._watchdog = self._idle = None
            await watchdog.aclose()

    def _heed(self, hold: Hold) -> None:
        """Hear at once of a force release of ``hold`` (redlock_force_release.lua
        publishes "v <value>" on the eviction channel of the Client its owner
        id names, on each master): lost once a majority can no longer be had."""
        value: str = hold.release_args[0]
        cid = value.partition(":")[0]
        told: set[int] = set()
        for i, master in enumerate(self.masters):
            engine = master.engine
            evictions = engine.evictions

            def deleted(_: object, i: int = i) -> None:
                told.add(i)
                if len(told) > len(self.masters) - self.majority:
                    hold.gone(FORCE_RELEASED)

            evictions.values[value] = deleted
            if engine.notify == "pubsub":
                evictions.listen((lost_prefix(engine.prefix) + cid).encode())

    # -- what attempts need (attempt.Attempting) --------------------------------------------

    def validity(self, lease: float) -> float:
        return lease - self.drift * lease - CLOCK_SLACK

    def last_token(self, name: str) -> int:
        return self._last.get(name, 0)

    def accepted(self, name: str, token: int) -> None:
        last = self._last
        last.pop(name, None)
        last[name] = token
        if len(last) > LAST_TOKENS:
            del last[next(iter(last))]

    async def attempt(
        self, name: str, value: str, lease_s: float, loop: asyncio.AbstractEventLoop
    ) -> Outcome:
        """One acquisition attempt (attempt.py)."""
        return await attempts.attempt(self, name, value, lease_s, loop)

    def enter(self) -> asyncio.Task[Any]:
        """The current task, checked on every master's Engine (loop, not closed);
        a master known to be a cluster node is refused."""
        task = current_task()
        for master in self.masters:
            engine = master.engine
            engine.enter_task()
            if engine.cluster is True:
                raise _cluster_refused()
        return task

    async def settle(self) -> None:
        """Have every Client find out its mode (one INFO on first use), so that
        a round sends at once, in order, on every master it reaches; refuse
        cluster mode. A master not settled within MASTER_TIMEOUT is left out
        of this attempt; once a majority is settled the others settle in the
        background, for the next."""
        unsettled = [m for m in self.masters if m.engine.cluster is None]
        if unsettled:
            tasks = [asyncio.ensure_future(m.engine.is_cluster()) for m in unsettled]
            for master, task in zip(unsettled, tasks, strict=True):
                task.add_done_callback(collect)
                task.add_done_callback(master.settled)
            if len(self.masters) - len(unsettled) < self.majority:
                await asyncio.wait(tasks, timeout=MASTER_TIMEOUT)
        if any(m.engine.cluster for m in self.masters):
            raise _cluster_refused()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self.masters[0].engine.spawn(coro)

    def undo(self, name: str, value: str) -> list[asyncio.Task[Any]]:
        """Release ``value`` on every master, in the background (retried,
        idempotent: also where the attempt's reply was lost or it never ran)."""

        async def one(master: Master) -> None:
            try:
                await master.engine.retry(
                    "redlock_release", (master.lock_key(name),), (value, master.channel(name))
                )
            except Exception as exc:  # the key expires by its TTL
                log.debug("Redlock undo of %r failed on a master: %r", name, exc)

        return [self.spawn(one(m)) for m in self.masters]

    async def undo_and_wait(self, name: str, value: str, replies: Sequence[Any]) -> None:
        """``undo``, awaited (at most ``UNDO_WAIT``) on the masters that answered;
        on the others it goes on in the background."""
        tasks = self.undo(name, value)
        answered = [t for t, r in zip(tasks, replies, strict=True) if isinstance(r, list)]
        if answered:
            await asyncio.wait(answered, timeout=UNDO_WAIT)

    def seed(
        self, name: str, token: int, i: int, reply: Any, code: int | None, start: float
    ) -> None:
        """Seed master ``i`` with ``token`` (a majority accepted it), in the
        background, if ``fencing.seed_generation`` says so."""
        read = Read.parse(reply) if isinstance(reply, list) else None
        before_read = asyncio.get_running_loop().time() - start
        generation = seed_generation(read, code, before_read, attempts.ATTEMPT_LIMIT)
        if generation is None:
            return
        master = self.masters[i]
        call = master.engine.eval(
            "redlock_fence", master.keys(name).write_back, attempts.seed_args(token, generation)
        )
        self.spawn(_quietly(call))


def _keep_going(i: int, reply: Any) -> None:
    """A release's reply that came after its decision: nothing to do (the
    ``late`` of ``quorum``: the calls are not cancelled, a later round
    may still wait for them)."""


async def _quietly(call: Coroutine[Any, Any, Any]) -> None:
    try:
        await call
    except Exception as exc:  # a best effort: the next write-back may seed it
        log.debug("Redlock seed failed: %r", exc)


def _cluster_refused() -> UnsupportedServerError:
    return UnsupportedServerError(
        "Redlock needs standalone masters (one Client per independent server); "
        "a Client here is in cluster mode"
    )
