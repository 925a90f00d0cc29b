"""Holds and leases.

A *hold* is one task's (or one handoff's) ownership of one lock in Redis: its
owner id, its fencing token, its expiry. A *Lease* is what one ``acquire``
returns: a re-entrant acquire returns a new Lease on the same hold, so every
acquire is matched by exactly one release, and releasing a Lease twice is a
no-op rather than a second decrement.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import LockNotOwnedError
from ..futures import Outcome
from ..observe.observer import FIXED_LEASE_EXPIRED, Observer
from ..validate import check_seconds
from .handoff import check_gone, exported, handle_of

__all__ = ["Hold", "HoldEngine", "Lease", "LostCallback"]

log = logging.getLogger("aiolock.lease")

#: Called with the Lease when it is lost. May return an awaitable, which is run as a task.
LostCallback = Callable[["Lease"], object]


class _Canceller(Protocol):
    def lease_lost(self, hold: Hold) -> None: ...


class HoldEngine(Protocol):
    """What a Hold and its Leases need of the engine that made them.

    ``Engine`` satisfies it structurally; it is declared here, below the
    engine, so that this module needs no import of it (no cycle).
    """

    def untrack(self, hold: Hold) -> None:
        """Stop renewing ``hold`` (a no-op if it is not renewed)."""

    def run_callback(self, callback: LostCallback, lease: Lease) -> None:
        """Run an ``on_lost`` callback (a coroutine one as a task), logging errors."""

    def check_usable(self) -> None:
        """Raise unless called from the engine's event loop."""

    @property
    def observer(self) -> Observer:
        """Counts holds and losses (observe/observer.py)."""
        ...

    def release_hold(self, hold: Hold) -> asyncio.Future[int]:
        """Start the release in Redis: the future gets 1, 2 (released) or 0 (gone)."""
        ...

    async def extend_hold(self, hold: Hold, seconds: float) -> None:
        """Make the hold last at least ``seconds`` from now."""


class Hold:
    """One ownership of one lock in Redis (shared by the Leases of its re-entries).

    Made only by ``Engine.new_hold`` (``Holds.new_hold`` in holds/lifecycle.py), or
    passed on locally by ``Engine.pass_on`` (``Holds.pass_on``), which
    wires it (``on_detach``, ``on_release``) and starts keeping it alive; its
    engine is anything that satisfies ``HoldEngine``.
    """

    __slots__ = (
        "__weakref__",
        "began",
        "callbacks",
        "confirmed",
        "contexts",
        "engine",
        "expires_at",
        "kind",
        "lease",
        "leases",
        "lost_reason",
        "name",
        "on_detach",
        "on_release",
        "owner",
        "release_args",
        "release_keys",
        "release_script",
        "releasing",
        "renew_args",
        "renew_key",
        "renew_script",
        "reserve",
        "serial",
        "task",
        "timer",
        "token",
        "watchdog",
    )

    def __init__(
        self,
        engine: HoldEngine,
        name: str,
        owner: str,
        token: int,
        task: asyncio.Task[Any] | None,
        lease: float,
        watchdog: bool,
        expires_at: float,
        *,
        release: tuple[str, tuple[Any, ...], tuple[Any, ...]],
        renew: tuple[str, str, tuple[Any, ...]],
        kind: str = "lock",
    ) -> None:
        self.engine = engine
        self.name = name
        #: The primitive's kind ("lock", "fair_lock", "read_lock", ...: ``kind`` of its class).
        self.kind = kind
        #: When the hold began (``perf_counter``), for its hold time; None once it ended.
        self.began: float | None = None
        self.owner = owner
        #: The holding task's serial (see owner.py), when its owner id differs
        #: from ``owner`` (a lock passed on locally); 0: ``holder`` is ``owner``.
        self.serial = 0
        self.token = token
        self.task = task
        self.lease = lease
        self.watchdog = watchdog
        self.expires_at = expires_at
        # How to release it: a script returning 1 (released), 2 (already
        # released by this very hold: a retry) or 0 (not held any more).
        self.release_script, self.release_keys, self.release_args = release
        # How to renew it: a batch script taking KEYS[i] = renew_key and, after
        # ARGV[1] = lease ms, this hold's renew_args; it answers 1 or 0 per hold.
        self.renew_script, self.renew_key, self.renew_args = renew
        # Fencing tokens after this one that this Client reserved in Redis and
        # may hand to its next local holders without a round trip.
        self.reserve = 0
        # The engine's connection epoch (Engine.epoch) in which the server last
        # confirmed this hold (its grant or a renewal); -1: never. Reserved
        # tokens are handed out locally only while it is the current epoch.
        self.confirmed = -1
        self.leases: list[Lease] = []
        self.lost_reason: str | None = None
        self.callbacks: list[LostCallback] = []
        self.contexts: list[_Canceller] = []
        self.releasing: asyncio.Future[int] | None = None
        self.timer: asyncio.TimerHandle | None = None
        # Called once when the hold ends (released or lost): frees the local gate.
        self.on_detach: Callable[[Hold], None] | None = None
        # Starts the release in Redis (default: Engine.release_hold); the
        # future resolves with the script's code (1, 2: released; 0: gone).
        self.on_release: Callable[[Hold], asyncio.Future[int]] | None = None

    @classmethod
    def passed_on(cls, hold: Hold, task: asyncio.Task[Any], serial: int) -> Hold:
        """A new hold of ``task`` that takes over ``hold``'s Redis entry
        (owner, scripts, expiry, confirmation) with its next reserved fencing
        token (``Holds.pass_on``): the fields copied, not rebuilt."""
        new = cls.__new__(cls)
        new.engine = hold.engine
        new.name = hold.name
        new.kind = hold.kind
        new.began = None
        new.owner = hold.owner
        new.serial = serial
        new.token = hold.token + 1
        new.task = task
        new.lease = hold.lease
        new.watchdog = hold.watchdog
        new.expires_at = hold.expires_at
        new.release_script = hold.release_script
        new.release_keys = hold.release_keys
        new.release_args = hold.release_args
        new.renew_script = hold.renew_script
        new.renew_key = hold.renew_key
        new.renew_args = hold.renew_args
        new.reserve = hold.reserve - 1
        new.confirmed = hold.confirmed
        new.leases = []
        new.lost_reason = None
        new.callbacks = []
        new.contexts = []
        new.releasing = None
        new.timer = None
        new.on_detach = None
        new.on_release = hold.on_release
        return new

    @property
    def holder(self) -> str:
        """The holding task's owner id, ``<client id>:<task serial>`` (statistics()
        show it). ``owner`` is the hold's entry in Redis: the same, but for a
        lock passed on locally, which keeps the entry of the task it came from.
        (Built when asked, not per hold: a hold is made per local handoff.)"""
        if not self.serial:
            return self.owner
        return f"{self.owner.partition(':')[0]}:{self.serial}"

    # -- the watchdog's interface ---------------------------------------------------------

    def renewed(self, sent: float, lease: float) -> None:
        self.expires_at = max(self.expires_at, sent + lease)

    def extended(self, expiry: float) -> None:
        """An extension (``Lease.extend``) made the hold last until ``expiry``
        (loop time) at least: a later expiry is kept, and a fixed lease's timer
        moves there. (An earlier one changes nothing.)"""
        if expiry > self.expires_at:
            self.expires_at = expiry
            if self.timer is not None:
                self.timer.cancel()
                self.timer = asyncio.get_running_loop().call_at(
                    expiry, self.gone, FIXED_LEASE_EXPIRED
                )

    def gone(self, reason: str) -> None:
        """Redis (a renewal, an extend, a check) or the clock says the hold is
        gone: it is lost, unless a release of this hold is under way.

        Then the release most likely ran first: the watchdog renews on its
        own connection, so its renewal can run in Redis after a release sent
        on the command connection and its reply can be read before the
        release's. The verdict is the release's reply (0: the hold was gone
        before it ran, and ``Engine.release_finished`` marks it lost; a release
        that fails for good marks it lost too). Meanwhile nothing is renewed.
        """
        if self.releasing is not None:
            self.engine.untrack(self)
            return
        if exported(self):  # its handle was given out: handed over, or lost?
            check_gone(self, reason)
            return
        self.mark_lost(reason)

    def handed_over(self) -> None:
        """Another Client adopted the hold (handoff.py): its leases report
        ``released`` (not lost: no callback, no cancellation, no loss counted)."""
        if self.lost_reason is not None:
            return
        for lease in list(self.leases):
            lease._mark_released()
        self.detach()

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None

    @property
    def count(self) -> int:
        return len(self.leases)

    def new_lease(self) -> Lease:
        lease = Lease(self)
        self.leases.append(lease)
        return lease

    def detach(self, observed: bool = True) -> None:
        """The hold ended: stop renewing it and free the local gate (once).

        ``observed=False``: a local handoff, whose new hold tells the observer
        that this one ended (``Holds.new_hold(handed_from=...)``)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.engine.untrack(self)
        if observed:
            self.engine.observer.hold_ended(self)
        on_detach, self.on_detach = self.on_detach, None
        if on_detach is not None:
            on_detach(self)

    def mark_lost(self, reason: str) -> None:
        """The hold is gone: flag it, free the gate, run callbacks, cancel bodies."""
        if self.lost_reason is not None:
            return
        self.lost_reason = reason
        self.engine.observer.lost(self)
        self.detach()
        for context in list(self.contexts):
            context.lease_lost(self)
        lease = self.leases[-1] if self.leases else Lease(self)
        for callback in self.callbacks:
            self.engine.run_callback(callback, lease)


class Lease:
    """Proof of one acquisition, returned by ``acquire``.

    * ``name`` and ``fencing_token``: pass the token to the resource you
      protect, and have it reject tokens older than the newest it has seen.
      A re-entry returns the holder's token.
    * ``lost``: True once the watchdog found the hold gone or could not renew
      it in time, a fixed lease ran out, or the Client was told that the
      hold was force-released. Callbacks registered with :meth:`on_lost` run then.
    * ``release()`` works from any task (a handoff) and is idempotent: a second
      call, or a retry after a cancelled call, never releases twice.
    """

    __slots__ = ("_hold", "_released")

    def __init__(self, hold: Hold) -> None:
        self._hold = hold
        self._released = False

    @property
    def name(self) -> str:
        return self._hold.name

    @property
    def fencing_token(self) -> int:
        return self._hold.token

    @property
    def lost(self) -> bool:
        return self._hold.lost

    @property
    def released(self) -> bool:
        return self._released

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost (None while it is not)."""
        return self._hold.lost_reason

    @property
    def handle(self) -> str:
        """An opaque string that hands this hold to another Client, in any
        process: ``await other_client.adopt(handle)`` returns a Lease of the
        same hold (same name, same fencing token) owned by the adopting task,
        and this lease then reports ``released`` (not lost). A handle is
        adopted once. Locks, spin locks, fair locks, write locks and
        semaphore permits; a read lock, a multi-lock or a Redlock lock
        raises InvalidArgumentError. See handoff.py and the README."""
        return handle_of(self._hold)

    def _watch(self, context: _Canceller) -> None:
        """Tell ``context`` (an ``async with``) if this lease is lost."""
        self._hold.contexts.append(context)
        if self._hold.lost:
            context.lease_lost(self._hold)

    def _unwatch(self, context: _Canceller) -> None:
        try:
            self._hold.contexts.remove(context)
        except ValueError:
            pass

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` when the lease is lost (at once, soon, if it already is).

        A callback may be a coroutine function; it then runs as a task of the
        Client. Exceptions from callbacks are logged, never raised here.
        """
        if not callable(callback):
            raise TypeError(f"on_lost() takes a callable, got {type(callback).__name__}")
        hold = self._hold
        if hold.lost:
            asyncio.get_running_loop().call_soon(hold.engine.run_callback, callback, self)
        else:
            hold.callbacks.append(callback)

    async def release(self) -> None:
        """Release this acquisition.

        The lock is freed in Redis when the last Lease of the hold is
        released. Raises LockNotOwnedError if the lease was lost (the hold is
        forgotten locally all the same). If the calling task is cancelled
        while the release is on the wire, the release still completes.

        A release that cannot reach Redis is retried for a second or two,
        then raises ConnectionFailedError: the lease is then lost (no longer
        renewed) and the lock frees itself when its TTL runs out.

        If Redis refuses the release because a key of this name holds a value
        aiolock did not write (WrongTypeError), nothing changed: the error is
        raised, and the lease is still held (and renewed, if the watchdog
        renews it). Delete that key and release again.
        """
        outcome = self._begin_release()
        if outcome is not None:
            # Shielded: a cancelled caller does not stop the release.
            if isinstance(outcome, Outcome):
                if outcome.done():  # (passed on locally: no wait at all)
                    self._check_outcome(outcome.result())
                    return
                self._check_outcome(await outcome.wait())
            else:
                self._check_outcome(await asyncio.shield(outcome))

    def _begin_release(self) -> asyncio.Future[int] | None:
        """Start the release without awaiting: the I/O, if any, is under way on
        return, so it completes whatever happens to the caller. Returns the
        future of the script's code, or None if there was nothing to send."""
        if self._released:
            return None
        hold = self._hold
        hold.engine.check_usable()
        if len(hold.leases) > 1 or hold.lost_reason is not None:
            self._mark_released()
            if hold.lost_reason is not None:
                raise LockNotOwnedError(
                    f"{hold.name!r}: the lease was lost ({hold.lost_reason}); nothing to release"
                )
            return None
        outcome = hold.releasing
        if outcome is None:
            start = hold.on_release or hold.engine.release_hold
            outcome = start(hold)
            if isinstance(outcome, Outcome):
                if outcome.done():  # (passed on locally: released at once)
                    if not outcome.cancelled() and outcome.exception() is None:
                        self._mark_released()  # (_released_in_redis, inline)
                else:
                    outcome.settled(self._released_in_redis)
            else:
                outcome.add_done_callback(self._released_in_redis)
        return outcome

    def _released_in_redis(self, outcome: asyncio.Future[int]) -> None:
        if not outcome.cancelled() and outcome.exception() is None:
            self._mark_released()

    def _mark_released(self) -> None:
        if not self._released:
            self._released = True
            try:
                self._hold.leases.remove(self)
            except ValueError:
                pass

    def _check_outcome(self, code: int) -> None:
        self._mark_released()
        if code == 0:
            hold = self._hold
            raise LockNotOwnedError(
                f"{hold.name!r}: the hold was gone when released "
                f"({hold.lost_reason or 'expired or force-released'})"
            )

    async def extend(self, seconds: float) -> None:
        """Make the hold last at least ``seconds`` from now (never shortens it).

        For a fixed lease this moves its expiry; for a watchdog lease it only
        matters if the watchdog is late. Raises LockNotOwnedError if the hold is
        gone, ConnectionFailedError if Redis stayed unreachable for a second or two.
        With ``replicas=N`` the extension counts only once N replicas
        acknowledged it: else ReplicationError, and the hold keeps its expiry.
        """
        value = check_seconds(seconds, "extend seconds", allow_zero=False)
        hold = self._hold
        if self._released:
            raise LockNotOwnedError(f"lock {hold.name!r}: this lease was released")
        if hold.lost:
            raise LockNotOwnedError(f"lock {hold.name!r}: the lease was lost ({hold.lost_reason})")
        await hold.engine.extend_hold(hold, value)

    def __repr__(self) -> str:
        hold = self._hold
        state = "released" if self._released else ("lost" if hold.lost else "held")
        return f"<Lease {hold.name!r} token={hold.token} {state}>"


def call_lost_callback(callback: LostCallback, lease: Lease) -> object:
    result = callback(lease)
    return result if inspect.isawaitable(result) else None
