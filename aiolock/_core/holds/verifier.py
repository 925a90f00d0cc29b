"""Connection epochs and the hold verifier: a restart or failover may have lost every hold.

Whenever an established connection to the server is lost, the Engine's
connection epoch (``Engine.epoch``, a plain attribute: the local handoff
reads it) is bumped, since the server behind the next connection may have
lost every key (a restart without persistence, a failover). A hold confirmed
by the server in an earlier epoch is verified at once by the ``Verifier``
and hands out no reserved token meanwhile (see ``Hold.confirmed``).

The Verifier is owned by the Engine, which passes ``connection_reset`` to
its connections and listener as their ``on_reset``. It needs of the engine
only what ``Verified`` names: this module does not import the engine.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol

from .lease import Hold
from .watchdog import group_batches

__all__ = ["Verified", "Verifier"]


class Verified(Protocol):
    """What the verifier needs of its engine (``Engine``, structurally)."""

    epoch: int
    epoch_since: float

    @property
    def closed(self) -> bool: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    @property
    def lease(self) -> float: ...

    @property
    def states(self) -> Mapping[str, Any]: ...

    @property
    def cluster(self) -> bool | None: ...

    def loop_time(self) -> float: ...

    def shard(self, key: Any) -> Hashable: ...

    def renew_batch(
        self, script: str, items: Sequence[Any], lease: float
    ) -> asyncio.Future[list[Any]]: ...


class Verifier:
    """Starts a new epoch on a connection reset, and verifies the holds not
    confirmed in the current one. ``task``: the running (or last) verification."""

    __slots__ = ("engine", "task")

    def __init__(self, engine: Verified) -> None:
        self.engine = engine
        self.task: asyncio.Task[None] | None = None

    def connection_reset(self) -> None:
        """An established connection to the server was lost: start a new epoch
        and verify every hold as soon as the server answers again."""
        engine = self.engine
        engine.epoch += 1
        engine.epoch_since = engine.loop.time() if engine.loop is not None else math.inf
        self.start()

    def start(self) -> None:
        """Run the verification unless it runs already."""
        engine = self.engine
        if engine.closed or engine.loop is None:
            return
        if self.task is None or self.task.done():
            self.task = engine.loop.create_task(self._verify_holds(), name="aiolock-verify-holds")

    async def aclose(self) -> None:
        """Stop the verification (the Client is closing)."""
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _verify_holds(self) -> None:
        """Verify every hold not confirmed in the current epoch, until none is left.

        Watchdog holds are renewed (as the watchdog would); a fixed lease is
        only checked, by the same script asked for no more than its remaining
        time (renewals never shorten). A hold the server no longer has is
        lost at once, not at the watchdog's next round (``lease / 3``) or at
        the fixed lease's end. A round that fails (the server is still down)
        is retried with backoff; the watchdog and the fixed leases' timers
        still mark holds lost at their expiry meanwhile.
        """
        engine = self.engine
        delay = 0.05
        while not engine.closed:
            now = engine.loop_time()
            epoch = engine.epoch
            holds = [
                h
                for state in list(engine.states.values())
                for h in state.holds()
                if h.confirmed != epoch and not h.lost and (h.watchdog or h.expires_at > now)
            ]
            if not holds:
                return
            if not await self._verify_round(holds, now) and engine.epoch == epoch:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _verify_round(self, holds: list[Hold], sent: float) -> bool:
        """One verification of ``holds``; False if some call failed.

        Watchdog holds are checked in the watchdog's batches (by script and,
        in cluster mode, by node: ``group_batches``); a fixed lease alone.
        """
        engine = self.engine
        calls: list[tuple[list[Hold], float | None, asyncio.Future[Any]]] = []
        watched: list[Hold] = []
        for hold in holds:
            if hold.watchdog:
                watched.append(hold)
            else:
                fut = engine.renew_batch(hold.renew_script, [hold], hold.expires_at - sent)
                calls.append(([hold], None, fut))
        shards = [engine.shard(h.renew_key) for h in watched] if engine.cluster else None
        for script, batch in group_batches(watched, shards):
            calls.append((batch, engine.lease, engine.renew_batch(script, batch, engine.lease)))
        results = await asyncio.gather(*(fut for _, _, fut in calls), return_exceptions=True)
        current = {h for state in list(engine.states.values()) for h in state.holds()}
        ok = True
        for (batch, lease, _), result in zip(calls, results, strict=True):
            if isinstance(result, BaseException):
                ok = False
                continue
            for hold, alive in zip(batch, result, strict=False):
                if alive == 1:
                    if lease is not None:
                        hold.renewed(sent, lease)
                elif isinstance(alive, BaseException):
                    ok = False
                elif hold in current and hold.releasing is None:
                    hold.mark_lost(
                        "the server no longer has the hold (lost on a restart or failover)"
                    )
        return ok
