"""The life cycle of every hold: make, keep alive, release, extend, renew.

``Holds`` is owned by the Engine, one per Client. The Engine exposes its
methods as its own (bound once in ``Engine.__init__``: no call layer more on
the acquire and release paths), so the primitives, ``Hold``/``Lease`` (as a
``HoldEngine``) and the watchdog (as its ``Renewer``) call them on the
Engine. It needs of the engine only what ``HoldOwner`` names: this module
does not import the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Hashable, Sequence
from typing import Any, Protocol

from ..errors import LockNotOwnedError
from ..futures import Outcome
from ..observe.observer import FIXED_LEASE_EXPIRED
from ..owner import task_serial
from ..protocol.scripts import refused
from ..topology.cluster import Topology
from ..transport.connection import Lane, Orphan
from ..transport.replication import Acknowledgement
from ..validate import to_ms
from .evict import Evictions
from .handoff import exported, released_or_lost
from .lease import Hold, HoldEngine, Lease, LostCallback, call_lost_callback
from .spread import renew_spread
from .watchdog import Watchdog

__all__ = ["HoldOwner", "Holds"]

log = logging.getLogger("aiolock.lease")
trace = logging.getLogger("aiolock.lock")  # the DEBUG trace of releases


class HoldOwner(HoldEngine, Protocol):
    """What the hold life cycle needs of its engine (``Engine``, structurally)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    @property
    def epoch(self) -> int: ...

    @property
    def epoch_since(self) -> float: ...

    @property
    def watchdog(self) -> Watchdog: ...

    @property
    def evictions(self) -> Evictions: ...

    @property
    def renew_mux(self) -> Lane: ...

    @property
    def ack(self) -> Acknowledgement | None: ...

    @property
    def topology(self) -> Topology | None: ...

    def shard(self, key: Any) -> Hashable: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    def send_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], callback: Orphan
    ) -> None: ...

    async def eval(
        self,
        name: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Any = None,
        mux: Lane | None = None,
    ) -> Any: ...

    async def retry(self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]) -> Any: ...

    def start_verifier(self) -> None: ...


def _keep(reply: Any, error: BaseException | None) -> None:
    """The orphan of an acknowledged extension: nothing to undo (see extend_hold)."""


class Holds:
    """Makes every hold, keeps it alive, and ends it (the Engine's ``new_hold``,
    ``track``, ``release_hold``, ``release_failed``, ``release_finished``,
    ``extend_hold``, ``renew_batch`` and ``run_callback``)."""

    __slots__ = ("engine",)

    def __init__(self, engine: HoldOwner) -> None:
        self.engine = engine

    def new_hold(
        self,
        name: str,
        owner: str,
        token: int,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        lease_s: float,
        sent: float,
        *,
        release: tuple[str, tuple[Any, ...], tuple[Any, ...]],
        renew: tuple[str, str, tuple[Any, ...]],
        on_detach: Callable[[Hold], None],
        on_release: Callable[[Hold], asyncio.Future[int]] | None = None,
        confirmed: int = -1,
        kind: str = "lock",
        handed_from: Hold | None = None,
    ) -> Hold:
        """The one place a hold is made: build it, wire it and start keeping it alive.

        ``lease`` is what the caller asked for (None: the watchdog renews the
        hold; else it simply expires), ``lease_s`` its length in seconds and
        ``sent`` the send time of the acquire that was granted, so the hold
        expires at ``sent + lease_s``. ``release``/``renew``: the scripts (see
        ``Hold``); ``on_detach`` frees the primitive's local gate when the
        hold ends; ``on_release`` replaces ``release_hold`` (the plain lock's
        handoff). ``confirmed``: the connection epoch in which the server
        granted it, if the primitive knows (see ``track``). The primitive
        records the returned hold in its local state. ``handed_from``: the
        hold this one takes over in a local handoff, detached unobserved
        (``Hold.detach(observed=False)``): the observer sees both at once.
        """
        hold = Hold(
            self.engine,
            name,
            owner,
            token,
            task,
            lease_s,
            lease is None,
            sent + lease_s,
            release=release,
            renew=renew,
            kind=kind,
        )
        hold.on_detach = on_detach
        hold.on_release = on_release
        hold.confirmed = confirmed
        if task is not None:
            # The task's own id (a lock passed on locally keeps the Redis owner).
            hold.serial = task_serial(task)
        if handed_from is None:
            self.engine.observer.hold_began(hold)
        else:
            self.engine.observer.hold_handed(handed_from, hold)
        self.track(hold)
        return hold

    def pass_on(self, hold: Hold, task: asyncio.Task[Any]) -> Hold:
        """A watchdog hold passed on locally to ``task`` (the plain lock's
        cohort handoff): ``hold`` ends and a new hold of ``task`` takes over its
        Redis entry (owner, key, expiry, confirmation) with the next reserved
        fencing token. Equivalent to ``hold.detach(observed=False)`` and
        ``new_hold(..., handed_from=hold)`` with the same scripts, at a
        fraction of the cost (issue 20 item 8): the watchdog swaps one item
        for the other, and the eviction channel is already subscribed (the
        key's tokens force-released recently are checked all the same).

        The caller took ``hold.on_detach`` (the new hold gets it) and set the
        local state's hold; ``hold.confirmed`` is the current epoch."""
        engine = self.engine
        if hold.timer is not None:
            hold.timer.cancel()
            hold.timer = None
        new = Hold.passed_on(hold, task, task_serial(task))
        engine.observer.hold_handed(hold, new)
        engine.watchdog.swap(hold, new)
        evictions = engine.evictions
        if evictions.recent:
            evictions.watch(new)
        return new

    def track(self, hold: Hold) -> None:
        """Start keeping a new hold alive: the watchdog renews it, or (a fixed
        lease) checks it each round and a timer ends it; and make sure the
        Client listens on the eviction channel a force release of it would
        be told on (evict.py: nothing to send after the first).

        Every primitive's new hold passes here, its ``expires_at`` being the
        send time of the acquire that was granted plus its lease. If that
        acquire was sent after the last connection reset (no reset since,
        until now: the reply came on the current connections), the grant
        confirms the hold in the current epoch; otherwise (or if a primitive
        sets an older ``confirmed`` afterwards, synchronously) it is verified
        at once, as after a reset (see verifier.py).
        """
        engine = self.engine
        if hold.confirmed < 0 and engine.epoch_since < hold.expires_at - hold.lease - 1e-6:
            hold.confirmed = engine.epoch
        if hold.confirmed != engine.epoch:
            engine.start_verifier()
        if not hold.watchdog:
            hold.timer = asyncio.get_running_loop().call_at(
                hold.expires_at, hold.gone, FIXED_LEASE_EXPIRED
            )
        # Renewed, or (a fixed lease) checked every round: watchdog.py.
        engine.watchdog.add(hold)
        engine.evictions.watch(hold)

    def release_hold(self, hold: Hold) -> asyncio.Future[int]:
        """Start releasing a hold in Redis; the returned future resolves with the
        script's code (1 released, 2 already released, 0 not owned).

        The release completes even if nobody awaits the future any more.
        """
        engine = self.engine
        outcome = Outcome(loop=engine.loop)
        hold.releasing = outcome
        script, keys, args = hold.release_script, hold.release_keys, hold.release_args

        def done(reply: Any, error: BaseException | None) -> None:
            # Straight from the reply's parse: the caller wakes on the next turn.
            if error is not None:
                engine.spawn(self._release_slowly(hold, outcome, script, keys, args))
            else:
                self.release_finished(hold, outcome, int(reply))

        engine.send_script(script, keys, args, done)
        return outcome

    async def _release_slowly(
        self,
        hold: Hold,
        outcome: asyncio.Future[int],
        script: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
    ) -> None:
        try:
            code = int(await self.engine.retry(script, keys, args))
        except BaseException as exc:
            self.release_failed(hold, outcome, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.release_finished(hold, outcome, code)

    def release_failed(self, hold: Hold, outcome: asyncio.Future[int], exc: BaseException) -> None:
        """The one ending of a release that failed for good (after its retries).

        Refused (``refused(exc)``: a key of the name holds a value aiolock did
        not write): nothing changed, the hold is still ours and still renewed,
        and the caller may release again once the key is fixed. Otherwise give
        up: the hold is lost (no longer renewed) and expires by itself within
        one lease. Either way the caller gets ``exc``.
        """
        hold.releasing = None
        if not refused(exc):
            hold.mark_lost(f"release failed: {exc!r}")
        if not outcome.done():
            outcome.set_exception(exc)

    def release_finished(self, hold: Hold, outcome: asyncio.Future[int], code: int) -> None:
        """The one ending of a release Redis answered: ``code`` 1 or 2 (released)
        or 0 (the hold was gone: lost, unless it already was, or handed over
        to another Client: handoff.py). Ends the hold."""
        if code == 0 and not hold.lost and exported(hold):
            self.engine.spawn(self._handed_or_gone(hold, outcome))
            return
        if code == 0 and not hold.lost:
            hold.mark_lost("the hold was gone when released (expired or force-released)")
        if trace.isEnabledFor(logging.DEBUG):
            trace.debug(
                "%s %r: released by %s (fencing token %d)%s",
                hold.kind,
                hold.name,
                hold.owner,
                hold.token,
                "; it was gone already" if code == 0 else "",
            )
        hold.detach()
        if not outcome.done():
            outcome.set_result(code)

    async def _handed_or_gone(self, hold: Hold, outcome: asyncio.Future[int]) -> None:
        """A release found gone a hold whose handle was given out: if another
        Client adopted it, the release succeeded (released, not lost)."""
        if await released_or_lost(hold):
            hold.handed_over()
            if not outcome.done():
                outcome.set_result(1)
            return
        self.release_finished(hold, outcome, 0)

    async def extend_hold(self, hold: Hold, seconds: float) -> None:
        """Make ``hold`` last at least ``seconds`` from now (``Lease.extend``)."""
        sent = asyncio.get_running_loop().time()
        ms = to_ms(seconds)
        keys, args = (hold.renew_key,), (ms, *hold.renew_args)
        if self.engine.ack is None:
            reply = await self.engine.retry(hold.renew_script, keys, args)
        else:
            # On the acknowledged lane: the extension counts only once the
            # replicas have it (ReplicationError otherwise: the hold keeps its
            # confirmed expiry). Nothing to undo: an unacknowledged extension
            # only makes the lock outlive its confirmed expiry on the master.
            reply = await self.engine.eval(hold.renew_script, keys, args, _keep)
        if int(reply[0]) != 1:
            hold.gone("the hold was gone when extended")
            raise LockNotOwnedError(f"{hold.name!r}: the hold was gone when extended")
        hold.extended(sent + seconds)

    def renew_batch(
        self, script: str, items: Sequence[Any], lease: float
    ) -> asyncio.Future[list[Any]]:
        """Renew ``items`` (to last at least ``lease`` seconds) in one script call,
        on the watchdog's own connection; the future gets one result per item:
        1 (renewed), 0 (gone) or, in cluster mode, the exception that failed
        that item's part of the batch (see below). It fails as a whole if the
        one call fails.

        A hold found alive is confirmed for the current connection epoch, if
        no connection was lost between the call and its reply.

        Cluster mode: the items are expected on one node (the watchdog groups
        them by ``Engine.shard``); more than one are renewed by
        ``spread.renew_spread``: one call in the script's node form, split
        if a slot moved or is migrating, never a hold lost for it.
        """
        engine = self.engine
        ms = to_ms(lease) if lease > 0 else 0  # (0: only check: a fixed lease)
        epoch = engine.epoch
        fut: asyncio.Future[list[Any]]
        if engine.topology is not None and len(items) > 1:
            fut = asyncio.ensure_future(renew_spread(engine, script, items, ms))
        else:
            keys = tuple(item.renew_key for item in items)
            args: list[Any] = [ms]
            for item in items:
                args.extend(item.renew_args)
            # (With replicas acknowledging, the renewal lane follows the call
            # with a WAIT: an unacknowledged renewal extends nothing.)
            fut = asyncio.ensure_future(
                engine.eval(script, keys, tuple(args), mux=engine.renew_mux)
            )

        def confirm(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled() or fut.exception() is not None or engine.epoch != epoch:
                return
            for item, alive in zip(items, fut.result(), strict=False):
                if alive == 1 and isinstance(item, Hold):
                    item.confirmed = epoch

        fut.add_done_callback(confirm)
        return fut

    def run_callback(self, callback: LostCallback, lease: Lease) -> None:
        """Run a lost lease's ``on_lost`` callback (a coroutine one as a task), logging errors."""
        try:
            awaitable = call_lost_callback(callback, lease)
        except Exception:
            log.exception("on_lost callback %r of %r raised", callback, lease.name)
            return
        if awaitable is not None:

            async def run() -> None:
                try:
                    await awaitable  # type: ignore[misc]
                except Exception:
                    log.exception("on_lost callback %r of %r raised", callback, lease.name)

            self.engine.spawn(run())
