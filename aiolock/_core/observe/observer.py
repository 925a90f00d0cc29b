"""What a Client sees of its own locks: counters, the DEBUG trace, and the
hooks OpenTelemetry plugs into.

One ``Observer`` per Client (``Engine.observer``). Every acquisition of every
primitive passes through ``observed`` once, whichever way it was called
(``acquire``, ``try_acquire``, ``async with``, ``@lock``); every hold passes
through ``hold_began`` / ``hold_ended`` once (``Holds.new_hold``,
``Hold.detach``), and every lost one through ``lost`` (``Hold.mark_lost``).
So the figures of ``Client.statistics()``, the metrics and the log lines
have one source and cannot disagree.

Whether an acquisition *waited* (and so deserves a span and counts among
the waiting tasks) is known only to the code that parks the task: the
local queues, the listener's channels (``ParkingLot.park``) and
``compete``'s registration call ``note_waiting()``, which finds the
attempt of the current task through a context variable (each asyncio Task
runs in its own copy of the context, so one attempt never sees another's).

What it costs: an uncontended acquisition makes one small object, sets and
resets one context variable and adds to a few integers. The DEBUG trace is
one ``isEnabledFor`` check when it is off. Without OpenTelemetry (not
installed, or ``Client(telemetry=False)``) ``telemetry`` is None and
nothing else runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from importlib.util import find_spec
from typing import Any, Literal, Protocol, TypeVar

from ..errors import LockTimeoutError

__all__ = [
    "CLIENT_CLOSED",
    "FIXED_LEASE_EXPIRED",
    "MAX_HOLD_REACHED",
    "Attempt",
    "Hold",
    "LockLabel",
    "Observer",
    "Outcome",
    "Telemetry",
    "new_telemetry",
    "note_waiting",
    "observed",
]

T = TypeVar("T")

#: How an acquisition ended.
Outcome = Literal["acquired", "timed_out", "cancelled", "failed"]
#: The user's map from lock names to a bounded set of labels (None: no label).
LockLabel = Callable[[str], "str | None"]

log = logging.getLogger("aiolock.lock")


def answers(logger: logging.Logger) -> dict[int, bool]:
    """``logger``'s cache of ``isEnabledFor`` answers (logging clears it, never
    replaces it, whenever a level changes; an empty dict where there is none).

    On the hot paths ``log_answers.get(DEBUG) is not False and
    log.isEnabledFor(DEBUG)`` is ``log.isEnabledFor(DEBUG)`` with no Python
    call while DEBUG is off and the answer cached (a cleared cache answers
    None, and ``isEnabledFor`` is asked, and caches its answer). Three
    such checks per local handoff cost as much as the rest of the telemetry
    (issue 20 item 8)."""
    found = getattr(logger, "_cache", None)
    return found if isinstance(found, dict) else {}


#: ``log``'s answers (see ``answers``).
log_answers = answers(log)
DEBUG = logging.DEBUG
lease_log = logging.getLogger("aiolock.lease")

#: The reason of a hold lost because its Client was closed (``aclose()``): the
#: user's own doing, logged at INFO; every other loss is a WARNING.
CLIENT_CLOSED = "the Client was closed"
#: How many local handoffs and waited acquisitions may pass before an
#: Observer whose telemetry did not record asks it again (``Observer.live``):
#: an OpenTelemetry SDK configured after the Client was made records wait
#: and hold times from the next uncontended acquisition or release on, and
#: under contention from at most this many events on (the counts are exact
#: all along).
RECHECK = 64
#: The reason a fixed lease (``acquire(lease=...)``) ran out.
FIXED_LEASE_EXPIRED = "the fixed lease expired"
#: The start of the reason of a hold ended by its ``max_hold``
#: (_primitives/max_hold.py); its losses carry ``outcome="max_hold"``.
MAX_HOLD_REACHED = "max_hold"


class Telemetry(Protocol):
    """Where the figures go besides the Client's counters (OpenTelemetry: otel.py).

    ``kind`` is the primitive's kind ("lock", "fair_lock", "read_lock", ...),
    ``name`` the lock's name: an implementation labels it only through the
    user's ``lock_label``, never raw.
    """

    def acquired(
        self, kind: str, name: str, outcome: Outcome, seconds: float, waited: bool
    ) -> None:
        """An acquisition ended after ``seconds`` (waited: it had to park, and
        stops waiting now: as ``waiting(kind, name, -1)``, in the same call)."""

    def waiting(self, kind: str, name: str, delta: int) -> None:
        """A task started (+1) or stopped (-1) waiting."""

    def held(self, kind: str, name: str, delta: int, seconds: float) -> None:
        """A hold began (+1, seconds 0) or ended (-1) after ``seconds``."""

    def handed(self, kind: str, name: str, seconds: float) -> None:
        """A hold ended after ``seconds`` and the next began at once in the
        same Client (a local handoff): ``held(-1, seconds)`` then ``held(+1, 0)``."""

    def lost(self, kind: str, name: str, reason: str = "") -> None:
        """A hold was lost; ``reason``: "max_hold" if its max_hold ended it, else ""."""

    @property
    def tally(self) -> Tally | None:
        """Where the Observer keeps the counts itself, with no call per event
        (then it calls ``timed_wait`` / ``timed_hold`` instead of ``acquired``,
        ``waiting``, ``held`` and ``handed``, and only while ``recording()``);
        None: the telemetry counts (by a label of the name, say)."""

    def recording(self) -> bool:
        """Whether ``timed_wait`` / ``timed_hold`` may record anything now."""

    def timed_wait(
        self, kind: str, name: str, outcome: Outcome, seconds: float, waited: bool
    ) -> None:
        """``acquired`` without the counts (see ``tally``)."""

    def timed_hold(self, kind: str, name: str, seconds: float) -> None:
        """A hold ended after ``seconds`` (``held(-1)`` or ``handed``) without the counts."""


class Tally(Protocol):
    """The counts an Observer keeps for its telemetry (otel.py's ``Counts``):
    acquisitions by series ``(kind, outcome, None)``, the common one
    (outcome "acquired") and the holds and waiters right now by kind alone."""

    acquisitions: dict[tuple[str, str, str | None], int]
    acquired_by_kind: dict[str, int]
    holds_by_kind: dict[str, int]
    waiters_by_kind: dict[str, int]


class Hold(Protocol):
    """What the observer reads and writes of a hold (``lease.Hold``, structurally)."""

    kind: str
    name: str
    owner: str
    token: int
    lost_reason: str | None
    began: float | None
    contexts: list[Any]


class Attempt:
    """One acquisition under way (see ``observed``)."""

    __slots__ = ("done", "kind", "name", "observer", "started", "waited")

    def __init__(
        self,
        observer: Observer,
        kind: str,
        name: str,
        started: float | None = None,
        waited: bool = False,
    ) -> None:
        self.observer = observer
        self.kind = kind
        self.name = name
        #: When the acquisition began (``perf_counter``; given: it began
        #: before the attempt was made, see ``AsyncLock._acquire``).
        self.started = time.perf_counter() if started is None else started
        #: It parked (counted in ``Observer.waiting``) already.
        self.waited = waited
        self.done = False


#: The acquisition attempt of the running task (its wait counted once).
CURRENT_ATTEMPT: ContextVar[Attempt | None] = ContextVar("aiolock_attempt", default=None)


def note_waiting() -> None:
    """The current task is about to park for a lock: count it as waiting (once per attempt)."""
    attempt = CURRENT_ATTEMPT.get()
    if attempt is not None and not attempt.waited and not attempt.done:
        attempt.waited = True
        attempt.observer.began_waiting(attempt)


def outcome_of(exc: BaseException) -> Outcome:
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, LockTimeoutError):
        return "timed_out"
    return "failed"


async def observed(
    observer: Observer, kind: str, name: str, acquire: Callable[..., Awaitable[T]], *args: Any
) -> T:
    """``await acquire(*args)`` (one acquisition of lock ``name``), observing it.

    (The coroutine is made here, not by the caller: a task cancelled before
    it ever ran leaves no coroutine that was never awaited.)"""
    attempt = Attempt(observer, kind, name)
    token = CURRENT_ATTEMPT.set(attempt)
    try:
        result = await acquire(*args)
    except BaseException as exc:
        observer.finished(attempt, outcome_of(exc), None)
        raise
    finally:
        CURRENT_ATTEMPT.reset(token)
    observer.finished(attempt, "acquired", result)
    return result


class Observer:
    """One Client's counters (see ``ClientStatistics``) and its telemetry, if any."""

    __slots__ = (
        "acquisitions",
        "cancellations",
        "complained",
        "failures",
        "holds",
        "live",
        "losses",
        "recheck",
        "tally",
        "telemetry_",
        "timeouts",
        "wait_time",
        "waiting",
    )

    def __init__(self, telemetry: Telemetry | None = None) -> None:
        self.telemetry = telemetry
        #: Acquisitions by outcome, since the Client was made.
        self.acquisitions = 0
        self.timeouts = 0
        self.cancellations = 0
        self.failures = 0
        #: Holds lost since the Client was made.
        self.losses = 0
        #: Seconds spent in acquisitions (any outcome), summed.
        self.wait_time = 0.0
        #: Tasks parked for a lock right now (see ``note_waiting``).
        self.waiting = 0
        #: Holds begun and not ended.
        self.holds = 0
        #: A telemetry call raised once already (logged then, not again).
        self.complained = False

    @property
    def telemetry(self) -> Telemetry | None:
        """Where the figures go besides the counters (None: nowhere). While the
        telemetry keeps no counts of its own (``Telemetry.tally``), this
        Observer keeps them in its tally and calls it only while it records
        (an SDK or a tracer provider set): with only the API installed, an
        acquisition makes no telemetry call (issue 20 item 8)."""
        return self.telemetry_

    @telemetry.setter
    def telemetry(self, telemetry: Telemetry | None) -> None:
        self.telemetry_ = telemetry
        #: The telemetry's counts, kept here (see ``telemetry``), or None.
        self.tally = None if telemetry is None else telemetry.tally
        #: With a tally: the telemetry records (``Telemetry.recording``). Once
        #: true it stays true (OpenTelemetry's global providers are set once,
        #: never unset); while false it is asked again every RECHECK events,
        #: not at each (see ``_recording``).
        self.live = telemetry is not None and telemetry.recording()
        self.recheck = RECHECK

    def _recording(self) -> bool:
        """Whether the telemetry records now (``live``), asked of it again:
        at the end of each acquisition that did not wait and of each hold not
        handed on locally, and once per RECHECK local handoffs and waited
        acquisitions, the hot path (its callers count ``recheck`` down,
        inline, and call this at zero; once ``live``, it no longer matters)."""
        self.recheck = RECHECK
        telemetry = self.telemetry_
        self.live = telemetry is not None and telemetry.recording()
        return self.live

    # -- acquisitions --------------------------------------------------------------------

    def telemetry_failed(self) -> None:
        """A telemetry call raised (an exporter's or a span processor's bug):
        never the caller's problem. The lock was granted or released all the
        same; logged once per Client, with the traceback."""
        if not self.complained:
            self.complained = True
            log.error(
                "OpenTelemetry raised while aiolock recorded a metric or span (logged once; "
                "the locks are not affected): check the SDK's processors and exporters",
                exc_info=True,
            )

    def began_waiting(self, attempt: Attempt) -> None:
        self.began_waiting_for(attempt.kind, attempt.name)

    def began_waiting_for(self, kind: str, name: str) -> None:
        """``began_waiting`` of an acquisition with no ``Attempt`` (yet): the
        plain lock's, parked in its local queue (see ``ended``)."""
        self.waiting += 1
        tally = self.tally
        if tally is not None:
            waiters = tally.waiters_by_kind
            waiters[kind] = waiters.get(kind, 0) + 1
        elif self.telemetry_ is not None:
            try:
                self.telemetry_.waiting(kind, name, 1)
            except Exception:
                self.telemetry_failed()

    def finished(self, attempt: Attempt, outcome: Outcome, result: Any) -> None:
        attempt.done = True
        self.ended(attempt.kind, attempt.name, attempt.started, attempt.waited, outcome, result)

    def ended(
        self, kind: str, name: str, started: float, waited: bool, outcome: Outcome, result: Any
    ) -> None:
        """``finished`` of an acquisition of lock ``name`` begun at ``started``
        (``perf_counter``) that parked (``waited``: counted by
        ``began_waiting_for``) or not, with no ``Attempt``: the plain lock makes
        one only when it competes in Redis, none for a task handed the lock in
        its local queue (an object less per waiting task, issue 20 item 8)."""
        seconds = time.perf_counter() - started
        self.wait_time += seconds
        if outcome == "acquired":
            self.acquisitions += 1
        elif outcome == "timed_out":
            self.timeouts += 1
        elif outcome == "cancelled":
            self.cancellations += 1
        else:
            self.failures += 1
        telemetry = self.telemetry_
        if waited:
            self.waiting -= 1
        if telemetry is not None:
            # Never raises: past a grant, an exception here would leave the
            # lock held with nobody to release it. (A waited attempt stops
            # waiting in the same call.)
            tally = self.tally
            try:
                if tally is None:
                    telemetry.acquired(kind, name, outcome, seconds, waited)
                else:
                    if outcome == "acquired":
                        counts = tally.acquired_by_kind
                        counts[kind] = counts.get(kind, 0) + 1
                    else:
                        key = (kind, outcome, None)
                        other = tally.acquisitions
                        other[key] = other.get(key, 0) + 1
                    if waited:
                        counts = tally.waiters_by_kind
                        counts[kind] = counts.get(kind, 0) - 1
                    # (asked at once after an acquisition that did not wait:
                    # a round trip, that a call more does not slow down)
                    self.recheck -= 1  # (see _recording)
                    if self.live or ((self.recheck <= 0 or not waited) and self._recording()):
                        telemetry.timed_wait(kind, name, outcome, seconds, waited)
            except Exception:
                self.telemetry_failed()
        if log_answers.get(DEBUG) is not False and log.isEnabledFor(DEBUG):
            token = getattr(result, "fencing_token", None)
            log.debug(
                "%s %r: %s after %.1f ms%s%s",
                kind,
                name,
                outcome.replace("_", " "),
                seconds * 1000.0,
                " (waited)" if waited else "",
                f", fencing token {token}" if token is not None else "",
            )

    # -- holds ---------------------------------------------------------------------------

    def hold_began(self, hold: Hold) -> None:
        hold.began = time.perf_counter()
        self.holds += 1
        self._held(hold, 1)

    def _held(self, hold: Hold, delta: int) -> None:
        """A hold began (+1) or ended unseen (-1, no time): the counts only."""
        tally = self.tally
        if tally is not None:
            kind = hold.kind
            counts = tally.holds_by_kind
            counts[kind] = counts.get(kind, 0) + delta
        elif self.telemetry_ is not None:
            try:
                self.telemetry_.held(hold.kind, hold.name, delta, 0.0)
            except Exception:
                self.telemetry_failed()

    def hold_handed(self, hold: Hold, new: Hold) -> None:
        """A local handoff: ``hold`` ended and ``new`` (same kind and name)
        began at once; as ``hold_ended(hold)`` then ``hold_began(new)``, with
        one clock reading and one telemetry call (``Telemetry.handed``; none
        while it does not record, see ``telemetry``)."""
        now = new.began = time.perf_counter()
        began = hold.began
        if began is None:  # (it ended already: only the new one begins)
            self.holds += 1
            self._held(new, 1)
            return
        hold.began = None
        seconds = now - began
        telemetry = self.telemetry_
        if telemetry is not None:
            try:
                if self.tally is None:
                    telemetry.handed(hold.kind, hold.name, seconds)
                else:
                    self.recheck -= 1
                    if self.live or (self.recheck <= 0 and self._recording()):
                        telemetry.timed_hold(hold.kind, hold.name, seconds)
            except Exception:
                self.telemetry_failed()
        if log_answers.get(DEBUG) is not False and log.isEnabledFor(DEBUG):
            self._log_ended(hold, seconds)

    def hold_ended(self, hold: Hold) -> None:
        began = hold.began
        if began is None:
            return
        hold.began = None
        self.holds -= 1
        seconds = time.perf_counter() - began
        telemetry = self.telemetry_
        if telemetry is not None:
            try:
                tally = self.tally
                if tally is None:
                    telemetry.held(hold.kind, hold.name, -1, seconds)
                else:
                    kind = hold.kind
                    counts = tally.holds_by_kind
                    counts[kind] = counts.get(kind, 0) - 1
                    if self.live or self._recording():  # (a release, not a local handoff)
                        telemetry.timed_hold(hold.kind, hold.name, seconds)
            except Exception:
                self.telemetry_failed()
        if log.isEnabledFor(logging.DEBUG):
            self._log_ended(hold, seconds)

    @staticmethod
    def _log_ended(hold: Hold, seconds: float) -> None:
        """The DEBUG line of a hold that ended (hold_ended, hold_handed)."""
        log.debug(
            "%s %r: hold of %s ended after %.1f ms (fencing token %d)%s",
            hold.kind,
            hold.name,
            hold.owner,
            seconds * 1000.0,
            hold.token,
            f", lost: {hold.lost_reason}" if hold.lost_reason is not None else "",
        )

    def lost(self, hold: Hold) -> None:
        if hold.lost_reason == CLIENT_CLOSED:
            # aclose() while holding: asked for, and the hold is released in
            # Redis right after; worth a line, not an alarm, and not a loss
            # (an alert on losses must not fire on every deploy).
            lease_log.info(
                "lease of %s %r given up (fencing token %d, owner %s): %s while it was held",
                hold.kind.replace("_", " "),
                hold.name,
                hold.token,
                hold.owner,
                hold.lost_reason,
            )
            return
        self.losses += 1
        # A fixed lease (``acquire(lease=...)``) that simply runs out while no
        # ``async with`` body depends on it is the contract at work (a hold
        # for N seconds, a rate limit): INFO. Everything else is an alarm.
        level = (
            logging.INFO
            if hold.lost_reason == FIXED_LEASE_EXPIRED and not hold.contexts
            else logging.WARNING
        )
        if lease_log.isEnabledFor(level):
            lease_log.log(
                level,
                "lease of %s %r lost (fencing token %d, owner %s): %s. The holder's `async "
                "with` body is cancelled and raises LockLostError (unless on_lost='ignore'); "
                "writes it makes after this moment must be refused by the fencing token",
                hold.kind.replace("_", " "),
                hold.name,
                hold.token,
                hold.owner,
                hold.lost_reason,
            )
        if self.telemetry_ is not None:
            try:
                reason = hold.lost_reason or ""
                self.telemetry_.lost(
                    hold.kind,
                    hold.name,
                    MAX_HOLD_REACHED if reason.startswith(MAX_HOLD_REACHED) else "",
                )
            except Exception:
                self.telemetry_failed()


def new_telemetry(lock_label: LockLabel | None) -> Telemetry | None:
    """OpenTelemetry's telemetry (otel.py) if ``opentelemetry-api`` is installed, else None.

    Without it nothing is imported, and the Observer records nothing but its counters.
    """
    try:
        if find_spec("opentelemetry.metrics") is None:
            return None
        from .otel import OtelTelemetry
    except ImportError:  # a partial install (opentelemetry without its api)
        return None
    return OtelTelemetry(lock_label)
