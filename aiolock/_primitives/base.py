"""What every primitive shares: the try/park loop, and the ``async with`` protocol.

``compete`` is trio's "check, try without waiting, then park" as one loop,
used by every waiting primitive: try in Redis; if that failed, register a
Waiter (see ``aiolock._core.waiting.notify``), make sure it is live, and try again at once (so a
release between the first try and the registration is not missed); then
park until woken or until the bound passes (the holder's TTL, cut to the
caller's deadline), and try again. One last try is always made at the
deadline. A try whose reply is lost to a timeout or a cancellation is
undone by its ``orphan`` handler (``Engine.undo``: see ``Undo``).

``LockLike`` turns ``_acquire``/``_release_mine`` into ``async with``,
``lock(timeout=..., lease=..., on_lost=...)`` and ``@lock``, and cancels the
body of an ``async with`` whose lease is lost (the way ``asyncio.timeout()``
turns its cancellation into TimeoutError).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from .._core.errors import (
    CANNOT_REACH,
    TRANSIENT,
    ClientClosedError,
    ConnectionFailedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    ServerUnavailableError,
    asyncio_required,
    clause,
    no_reply,
)
from .._core.holds.lease import Hold, Lease
from .._core.observe.observer import Observer, note_waiting, observed
from .._core.options import LockStatistics
from .._core.outage import Outage
from .._core.protocol.keys import Keys
from .._core.validate import check_lease, check_name, check_timeout
from .._core.waiting.notify import Waiter
from .max_hold import cap_lease, check_max_hold, maybe

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = [
    "REPLY_GRACE",
    "TRANSIENT",
    "Acquirable",
    "Contender",
    "HeldByTask",
    "LockLike",
    "OnLost",
    "Primitive",
    "SingleHolder",
    "compete",
    "current_task",
    "describe",
    "lock_statistics",
    "ttl_hint",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class LeaseLike(Protocol):
    """What ``async with`` needs of the lease a primitive returns."""

    @property
    def lost(self) -> bool: ...

    @property
    def lost_reason(self) -> str | None: ...

    async def release(self) -> None: ...

    def _watch(self, context: Entry) -> None: ...

    def _unwatch(self, context: Entry) -> None: ...


L = TypeVar("L", bound=LeaseLike)  # the lease type a primitive returns
OnLost = Literal["cancel", "ignore"]

#: However short the caller's timeout, an attempt already on the wire gets
#: this long for its reply (so ``try_acquire()`` always makes one real try).
REPLY_GRACE = 1.0
#: A wait without a timeout that never reached Redis gives up after this many failures.
FIRST_CONTACT_TRIES = 3
#: The longest pause between two tries of a wait riding out an outage.
OUTAGE_BACKOFF_CAP = 1.0

log = logging.getLogger("aiolock.lock")


def current_task() -> asyncio.Task[Any]:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running asyncio loop (trio, or no loop at all)
        raise asyncio_required() from None
    if task is None:
        raise asyncio_required()
    return task


def ttl_hint(pttl_ms: int) -> float | None:
    """A script's PTTL of the holder as a wait bound: -1 (no TTL) is None
    (wait for a message, bounded by the lease); 0 or -2 (it is expiring, or
    gone) retries in a millisecond, never after a whole lease."""
    if pttl_ms == -1:
        return None
    return max(pttl_ms, 1) / 1000.0


def check_on_lost(value: object) -> OnLost:
    if value == "cancel":
        return "cancel"
    if value == "ignore":
        return "ignore"
    raise InvalidArgumentError(f"on_lost must be 'cancel' or 'ignore', got {value!r}")


class Contender(Protocol):
    """What ``compete`` needs of its engine: ``Engine``, or Redlock's
    ``QuorumEngine`` over several."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def lease(self) -> float: ...

    #: How long a try waits for a reply (a first contact gives up after it).
    @property
    def command_timeout(self) -> float: ...

    #: The run of failed tries of waiting tasks under way (one WARNING, one INFO).
    @property
    def unreachable(self) -> Outage: ...


async def compete(
    engine: Contender,
    *,
    what: str,
    deadline: float | None,
    attempt: Callable[[], Awaitable[tuple[T | None, float | None]]],
    waiter: Callable[[], Waiter],
    abandon: Callable[[], None] = lambda: None,
    parked: Callable[[bool], None] = lambda _: None,
    warm: Callable[[], Waiter | None] | None = None,
    cut: bool = True,
) -> tuple[T, float]:
    """Try until ``attempt()`` returns a result; return it with the time it was sent.

    ``attempt()`` returns ``(result, None)`` on success, or ``(None, hint)``
    where hint is how long, at most, it is worth waiting before the next try
    (the holder's remaining TTL), or None if unknown. ``abandon()`` is called
    if we give up after transient errors (an attempt may have succeeded
    unseen). ``parked(True/False)`` brackets the time a Waiter is registered.

    Outages: a try that fails with a connection error is retried with
    capped exponential backoff (at most ``OUTAGE_BACKOFF_CAP`` s apart; the
    command connection reconnects on each try). With a deadline, until the
    deadline: a failure of the last try there raises ConnectionFailedError
    (not LockTimeoutError: the lock was not found busy, Redis was
    unreachable); so does a try cut by the deadline (no reply) when no try
    of this wait found the lock busy. Without a deadline: for ever, once this
    wait has reached Redis; a wait that never reached it gives up with
    ConnectionFailedError after ``FIRST_CONTACT_TRIES`` tries or once
    ``command_timeout`` has passed since it began (a wrong URL, a server
    that is down or never answers fails instead of hanging; a server that
    answers that it cannot serve yet, ServerUnavailableError (LOADING,
    BUSY...), was reached). Server refusals (ServerRefusedError,
    WrongTypeError) are raised at once.

    ``cut``: a try still running at the deadline is cut (given
    ``REPLY_GRACE``); False for an ``attempt()`` that bounds itself and says
    itself whether it was answered (Redlock's: ConnectionFailedError when too
    few masters answered, else busy).

    ``warm()``, if given, returns a Waiter that is live already (a channel
    still subscribed and confirmed), or None. Taken before the first try, it
    hears every wake-up sent after that try ran, so a failed first try parks
    at once, without the confirming retry a new subscription needs.
    """
    loop = engine.loop or asyncio.get_running_loop()
    registration: Waiter | None = warm() if warm is not None else None
    is_parked = False
    failures = 0
    reached = False  # has any try of this wait had a reply from Redis?
    busy = False  # has any try of this wait found the lock busy?
    began = 0.0  # when the first failed try was sent (set on failure: not on the hot path)
    failure: BaseException | None = None  # the last try's connection failure
    outage = engine.unreachable
    failing = False  # this task counts among outage.failing
    try:
        while True:
            sent = loop.time()
            try:
                if deadline is None or not cut:
                    result, hint = await attempt()
                else:
                    async with asyncio.timeout_at(max(deadline, sent + REPLY_GRACE)):
                        result, hint = await attempt()
            except TimeoutError:
                if busy:
                    raise LockTimeoutError(
                        f"timed out waiting for {what} (it was busy; the last try got no "
                        "reply from Redis)"
                    ) from None
                # Never found busy: Redis did not answer (a paused or overloaded
                # server, a black-holed network), as for a refused port.
                waited = loop.time() - (began if failure is not None else sent)
                cause = no_reply(
                    f"no reply from Redis to the try sent {loop.time() - sent:.1f} s before "
                    "the timeout ran out"
                )
                earlier = f"; the tries before failed: {clause(failure)}" if failure else ""
                raise ConnectionFailedError(
                    f"gave up waiting for {what} after {waited:.1f} s: the try under way had "
                    f"no answer from Redis when the timeout ran out{earlier}. The lock was "
                    "never found busy. Check that the server is up and answering (a paused "
                    "or overloaded server, a network that drops packets, or a cluster that "
                    "cannot serve the slot, answer no command)"
                ) from cause
            except TRANSIENT as exc:
                failures += 1
                if failure is None:
                    began = sent  # (a first contact: the first try of the wait)
                failure = exc
                if not failing:
                    failing = True
                    outage.failing += 1
                # LOADING, BUSY...: the server answered, it is there (not a wrong URL).
                reached = reached or isinstance(exc, ServerUnavailableError)
                now = loop.time()
                # A first contact gives up after FIRST_CONTACT_TRIES quick failures
                # (refused, unknown host), or after the first try that took
                # command_timeout (a server that accepts but never answers).
                first_contact_failed = not reached and (
                    failures >= FIRST_CONTACT_TRIES or now - began >= engine.command_timeout
                )
                if (deadline is not None and now >= deadline) or (
                    deadline is None and first_contact_failed
                ):
                    abandon()
                    # redis-py's text for a plain connection failure (ours
                    # only adds the advice given below), ours for any other
                    # (it says what happened: "the master changed", "2 of 3
                    # masters could not be reached"...).
                    plain = exc.__cause__ is not None and str(exc).startswith(CANNOT_REACH)
                    why = clause(exc.__cause__ if plain else exc)
                    if deadline is None:
                        raise ConnectionFailedError(
                            f"gave up waiting for {what} after {now - began:.1f} s: its first "
                            f"tries did not reach Redis ({why}). A wait without a timeout "
                            f"gives up when its first contact fails: {FIRST_CONTACT_TRIES} "
                            "failed tries, or no reply within command_timeout "
                            f"({engine.command_timeout:g} s). Check that the server is up "
                            "and reachable"
                        ) from exc.__cause__ or exc
                    never = "" if busy else " The lock was never found busy."
                    raise ConnectionFailedError(
                        f"gave up waiting for {what}: Redis stayed unreachable until the "
                        f"timeout ran out ({why}).{never} Check that the server is up and "
                        "reachable, or wait longer"
                    ) from exc.__cause__ or exc
                if engine.closed:
                    raise ClientClosedError("the aiolock Client was closed while waiting") from exc
                if outage.failed():
                    # One warning per outage, not per task nor per try.
                    log.warning(
                        "%s: Redis unreachable (%s); waiting tasks retry %s",
                        what,
                        exc,
                        "until their timeout" if deadline is not None else "until it answers",
                    )
                delay = min(0.05 * 2**failures, OUTAGE_BACKOFF_CAP)
                if deadline is not None:
                    delay = min(delay, max(deadline - now, 0.0))
                try:
                    await asyncio.sleep(delay)
                except asyncio.CancelledError:
                    abandon()  # the failed try may have run, its reply lost
                    raise
                continue
            if failing:
                failing = False
                outage.failing -= 1
                if outage.failing == 0:  # the last failing task of the outage recovered
                    run = outage.ended()
                    if run is not None:
                        log.info(
                            "%s: Redis answers again after %.1f s; tries of waiting tasks "
                            "failed %d times meanwhile",
                            what,
                            run.seconds,
                            run.failures,
                        )
            failures = 0
            reached = True
            if result is not None:
                if registration is not None:
                    registration.close(linger=True)
                    registration = None
                    if is_parked:
                        parked(False)
                return result, sent
            busy = True
            bound = hint if hint is not None and hint > 0 else engine.lease
            now = loop.time()
            if deadline is not None:
                if now >= deadline:
                    raise LockTimeoutError(f"timed out waiting for {what}")
                bound = min(bound, deadline - now)
            if engine.closed:
                raise ClientClosedError("the aiolock Client was closed while waiting")
            if registration is None:
                # Register, and only then retry: a release in between is not missed.
                note_waiting()
                registration = waiter()
                is_parked = True
                parked(True)
                await registration.ready(bound)
                continue
            if not is_parked:
                note_waiting()
                is_parked = True  # a warm registration: live since before the try
                parked(True)
            await registration.wait(bound)
            if engine.closed:
                raise ClientClosedError("the aiolock Client was closed while waiting")
    finally:
        if registration is not None:
            registration.close()
            if is_parked:
                parked(False)
        if failing:
            outage.failing -= 1
            if outage.failing == 0:
                run = outage.ended()
                if run is not None:
                    log.info(
                        "%s: no waiting task retries any more (they timed out, were "
                        "cancelled or the Client closed) after %.1f s; their tries failed "
                        "%d times meanwhile",
                        what,
                        run.seconds,
                        run.failures,
                    )


# -- statistics and reprs: local state only, from any thread ----------------------------------
#
# ``statistics()`` and ``repr()`` of every primitive are built here, from the
# local holds of the lock and its local waiting count: plain attributes read
# without a lock (a snapshot taken by copying a container in one C call, so a
# thread other than the loop's never sees "changed size during iteration"),
# and the time from the Client's loop (``loop.time()``: asyncio's clock is
# time.monotonic, valid from any thread; no running loop is looked up).


def lease_count(hold: Hold) -> int:
    """A hold's acquisitions not yet released (its re-entries)."""
    return len(hold.leases)


def lock_statistics(
    kind: str,
    name: str,
    loop: asyncio.AbstractEventLoop | None,
    holds: Iterable[Hold],
    waiting: int,
    *,
    count: Callable[[Hold], int] = lease_count,
    parts: tuple[LockStatistics, ...] = (),
) -> LockStatistics:
    """The one place a ``LockStatistics`` is built: from this Client's holds of
    one lock (oldest first; lost ones are skipped) and how many of its tasks wait.

    No I/O, and safe from any thread (see above): ``holds`` is copied first.
    """
    held = [hold for hold in tuple(holds) if hold.lost_reason is None]
    if not held:
        return LockStatistics(kind, name, False, None, None, (), 0, None, None, waiting, parts)
    owners = tuple(hold.holder for hold in held)
    left = None
    if loop is not None:
        now = loop.time()
        left = max(min(hold.expires_at for hold in held) - now, 0.0)
    return LockStatistics(
        kind,
        name,
        True,
        held[0].task,
        owners[0],
        owners,
        sum(count(hold) for hold in held),
        max(hold.token for hold in held),
        left,
        waiting,
        parts,
    )


def describe_holders(stats: LockStatistics, unit: str = "") -> str:
    """Who holds it here: "held by task 7 (x2), token 1042, lease 21.4 s left",
    or "not held here".

    ``unit``: what ``hold_count`` counts, if not re-entries ("permit")."""
    if not stats.locked:
        return "not held here"
    tasks = [owner.rpartition(":")[2] for owner in stats.holders]
    n = stats.hold_count
    if len(tasks) == 1:
        who = f"task {tasks[0]}"
    else:
        shown = ", ".join(tasks[:3]) + (f" and {len(tasks) - 3} more" if len(tasks) > 3 else "")
        who = f"{len(tasks)} tasks ({shown})"
    if unit:
        counted = f" ({n} {unit}{'s' if n != 1 else ''})"
    else:
        counted = f" (x{n})" if n > len(tasks) else ""
    token = "token" if len(tasks) == 1 else "highest token"
    left = "" if stats.lease_left is None else f", lease {stats.lease_left:.1f} s left"
    return f"held by {who}{counted}, {token} {stats.fencing_token}{left}"


def describe(stats: LockStatistics, loop: asyncio.AbstractEventLoop | None, unit: str = "") -> str:
    """A lock's state at a glance, for its repr:
    "'orders:42' held by task 7 (x2), token 1042, lease 21.4 s left, 3 waiting"."""
    if loop is None:
        return f"{stats.name!r} not used yet"
    return f"{stats.name!r} {describe_holders(stats, unit)}, {stats.waiting} waiting"


class Primitive:
    """A name, its keys, and how its waiters are notified. Cheap: no I/O."""

    __slots__ = ("_channel", "_engine", "_key", "_names", "_signal", "name")

    #: The kind's names (aiolock/_core/protocol/keys.py); ``_names`` is built from it once.
    _keys_type: ClassVar[type[Keys]] = Keys
    _names: Keys

    def __init__(self, engine: EngineView, name: str) -> None:
        self.name = check_name(name)
        self._engine = engine
        names = self._names = self._keys_type.of(engine.prefix, self.name)
        self._key = names.main
        self._channel = names.channel
        self._signal = names.signal

    def _waiter(self) -> Waiter:
        return self._engine.waiter(self._channel, self._signal)

    def _observer(self) -> Observer:
        return self._engine.observer

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self._engine.loop


class Entry:
    """One ``async with`` over a lock: cancels its body if the lease is lost."""

    __slots__ = ("cancel_requested", "cancelling", "lease", "on_lost", "task")

    def __init__(self, lease: Any, task: asyncio.Task[Any], on_lost: OnLost) -> None:
        self.lease = lease
        self.task = task
        self.on_lost = on_lost
        self.cancelling = task.cancelling()
        self.cancel_requested = False

    def lease_lost(self, hold: Hold) -> None:
        if self.on_lost == "cancel" and not self.cancel_requested and not self.task.done():
            self.cancel_requested = True
            self.task.cancel(f"aiolock: the lease of {hold.name!r} was lost")


class LockLike(Generic[L]):
    """``async with``, ``lock(...)`` and ``@lock`` over ``_acquire``.

    ``L`` is the lease type; it must offer Lease's protocol: ``lost``,
    ``lost_reason``, ``release()``, ``_watch(entry)``, ``_unwatch(entry)``.
    """

    __slots__ = ()

    name: str
    #: The kind of primitive, as statistics, logs and metrics name it.
    kind: ClassVar[str] = "lock"

    async def _acquire(self, timeout: float | None, lease: float | None) -> L:
        """Acquire and return a lease."""
        raise NotImplementedError

    def _observer(self) -> Observer:
        """The Client's observer (``_core/observe/observer.py``): every
        acquisition is counted there."""
        raise NotImplementedError

    def _entries(self) -> dict[asyncio.Task[Any], list[Entry]]:
        raise NotImplementedError

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        """The Client's event loop (None until the Client was first used)."""
        raise NotImplementedError

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        """This Client's holds of the lock (oldest first) and its waiting tasks."""
        raise NotImplementedError

    def statistics(self) -> LockStatistics:
        """This Client's view of the lock: its holder here, the hold count,
        fencing token and lease left, and how many of its tasks wait for it.

        Local only, no round trip and no I/O (anyio's ``Lock.statistics()``):
        a lock held by another Client reads as not held (``locked=False``);
        ask the server with ``await lock.is_locked()``.
        Cheap enough to call often, and safe from any thread.
        """
        holds, waiting = self._local_view()
        return lock_statistics(self.kind, self.name, self._loop(), holds, waiting)

    def __repr__(self) -> str:
        # Plain attributes and the loop's clock only: valid from any thread.
        loop = self._loop()
        return f"<{type(self).__name__} {describe(self.statistics(), loop)}>"

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(
        self,
        fn: None = None,
        /,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        on_lost: OnLost = "cancel",
        max_hold: float | None = None,
    ) -> LockContext[L]: ...

    def __call__(
        self,
        fn: Callable[P, Coroutine[Any, Any, R]] | None = None,
        /,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        on_lost: OnLost = "cancel",
        max_hold: float | None = None,
    ) -> Callable[P, Coroutine[Any, Any, R]] | LockContext[L]:
        """``async with lock(timeout=..., lease=..., on_lost=..., max_hold=...)``;
        ``@lock``; ``@lock(...)`` (``max_hold``: see max_hold.py)."""
        context = LockContext(
            self,
            check_timeout(timeout),
            check_lease(lease),
            check_on_lost(on_lost),
            check_max_hold(max_hold),
        )
        if fn is None:
            return context
        return context(fn)

    async def __aenter__(self) -> L:
        return await self._enter_ctx(None, None, "cancel")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._exit_ctx(exc_type, exc)

    def _observed(self, timeout: float | None, lease: float | None) -> Coroutine[Any, Any, L]:
        """``_acquire(timeout, lease)``, observed (``observed()``; the plain lock
        observes inside its ``_acquire``: one coroutine frame less)."""
        return observed(self._observer(), self.kind, self.name, self._acquire, timeout, lease)

    async def _enter_ctx(
        self,
        timeout: float | None,
        lease: float | None,
        on_lost: OnLost,
        max_hold: float | None = None,
    ) -> L:
        got = await maybe(self._observed(timeout, cap_lease(lease, max_hold)), max_hold, lease)
        task = current_task()
        entry = Entry(got, task, on_lost)
        self._entries().setdefault(task, []).append(entry)
        got._watch(entry)
        return got

    async def _exit_ctx(
        self, exc_type: type[BaseException] | None, exc: BaseException | None
    ) -> None:
        task = current_task()
        entries = self._entries()
        stack = entries[task]
        entry = stack.pop()
        if not stack:
            del entries[task]
        lease = entry.lease
        lease._unwatch(entry)
        ours_delivered = False
        if entry.cancel_requested and exc_type is not asyncio.CancelledError:
            # Our cancellation may still be pending (the body ended first):
            # take delivery here, so it never leaks past the `async with`.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                ours_delivered = True
        try:
            await lease.release()
        except LockNotOwnedError:
            if not lease.lost:
                raise
        except asyncio.CancelledError:
            if not entry.cancel_requested or ours_delivered:
                raise
            ours_delivered = True  # ours, delivered during the release (which still completes)
        if entry.cancel_requested:
            if task.uncancel() > entry.cancelling:
                # Somebody else cancelled us too: that cancellation wins.
                if ours_delivered:
                    raise asyncio.CancelledError()
                return
            if exc_type is None or exc_type is asyncio.CancelledError or ours_delivered:
                raise LockLostError(
                    f"{self.name!r}: the lease was lost while held ({lease.lost_reason})"
                ) from exc
            return
        if lease.lost and entry.on_lost == "cancel" and exc_type is None:
            raise LockLostError(f"{self.name!r}: the lease was lost ({lease.lost_reason})")


class LockContext(Generic[L]):
    """``lock(timeout=..., lease=..., on_lost=...)``: an async context manager and a decorator."""

    __slots__ = ("_lease", "_lock", "_max_hold", "_on_lost", "_timeout")

    def __init__(
        self,
        lock: LockLike[L],
        timeout: float | None,
        lease: float | None,
        on_lost: OnLost,
        max_hold: float | None = None,
    ) -> None:
        self._lock = lock
        self._timeout = timeout
        self._lease = lease
        self._on_lost: OnLost = on_lost
        self._max_hold = max_hold

    async def __aenter__(self) -> L:
        return await self._lock._enter_ctx(
            self._timeout, self._lease, self._on_lost, self._max_hold
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._lock._exit_ctx(exc_type, exc)

    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(fn):
            raise InvalidArgumentTypeError(
                f"@lock decorates async functions (async def), got {fn!r}"
            )

        @functools.wraps(fn)
        async def locked(*args: P.args, **kwargs: P.kwargs) -> R:
            async with self:
                return await fn(*args, **kwargs)

        return locked


class Acquirable(LockLike[L]):
    """``acquire`` and ``try_acquire`` over ``_acquire``, for every lock-like primitive."""

    __slots__ = ()

    def acquire(
        self,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        max_hold: float | None = None,
    ) -> Coroutine[Any, Any, L]:
        """Wait for the lock and return its lease (``await lock.acquire()``).

        ``timeout``: seconds to wait at most (None: for ever); raises
        LockTimeoutError (a TimeoutError) when it runs out. ``lease``: a fixed
        lease in seconds with no renewal (None: the watchdog renews it).
        ``max_hold``: the hold ends (lost, reason naming max_hold) when it is
        that old, renewed or not; a fixed lease lasts ``min(lease, max_hold)``
        (see max_hold.py).
        Arguments are checked at the call. (A plain function returning the
        coroutine: one frame less per waiting task.)

        Redis outages: a waiting task rides out connection failures, retrying
        with backoff (at most a second apart) until its timeout; if Redis is
        still unreachable then, it raises ConnectionFailedError rather than
        LockTimeoutError (also when no try was answered: a lock never found
        busy is no timeout). Without a timeout it waits through any outage
        once it has reached Redis, but a call whose first tries cannot reach
        Redis at all (server down, wrong URL, a server that never answers)
        gives up with ConnectionFailedError after 3 quick failures or one
        ``command_timeout`` without a reply. A refusal (ServerRefusedError: password, ACL,
        out of memory; WrongTypeError: the key holds a value aiolock did not
        write) is raised at once.
        """
        checked_timeout, checked_lease = check_timeout(timeout), check_lease(lease)
        limit = check_max_hold(max_hold)
        return maybe(
            self._observed(checked_timeout, cap_lease(checked_lease, limit)), limit, checked_lease
        )

    async def try_acquire(
        self, wait: float = 0.0, *, lease: float | None = None, max_hold: float | None = None
    ) -> L | None:
        """Acquire if possible within ``wait`` seconds (default: one try, no waiting).

        Returns the lease, or None if the lock stayed busy. A Redis that
        cannot be reached is not "busy": ConnectionFailedError (see ``acquire``).
        """
        checked_wait = check_timeout(wait, "wait")
        checked_lease = check_lease(lease)
        limit = check_max_hold(max_hold)
        try:
            return await maybe(
                self._observed(checked_wait, cap_lease(checked_lease, limit)), limit, checked_lease
            )
        except LockTimeoutError:
            return None


class HeldByTask(Acquirable[Lease]):
    """``release()`` and ``hold_count()`` of a lock one task holds at a time,
    over whatever engine holds it: a Client's (``SingleHolder``) or Redlock's
    quorum engine (``RedlockLock``). Its hooks: ``_my_hold()``, ``_enter()``
    (binds the loop on first use) and ``_check_usable()``."""

    __slots__ = ()

    #: How errors name this kind of lock.
    _kind = "lock"

    def _my_hold(self) -> Hold | None:
        """The current task's hold of this lock in this Client, if any."""
        raise NotImplementedError

    def _enter(self) -> None:
        raise NotImplementedError

    def _check_usable(self) -> None:
        raise NotImplementedError

    async def release(self) -> None:
        """Release the current task's most recent acquisition of this lock.

        Raises LockNotOwnedError if the current task does not hold it (or its
        lease was lost). If cancelled while the release is on the wire, the
        release still completes.
        """
        self._check_usable()
        hold = self._my_hold()
        if hold is None or not hold.leases:
            raise LockNotOwnedError(
                f"{self._kind} {self.name!r} is not held by the current task; "
                "release it from the task that acquired it, or call lease.release()"
            )
        await hold.leases[-1].release()

    async def hold_count(self) -> int:
        """How many times the current task holds the lock (0 if not). No round trip."""
        self._enter()
        hold = self._my_hold()
        return hold.count if hold is not None else 0


class SingleHolder(Primitive, HeldByTask):
    """Queries and ``release()`` of a lock one task holds at a time (AsyncLock, FairLock)."""

    __slots__ = ()

    #: The read-only script that checks a hold in Redis (see owned.lua).
    _owned_script = "owned"

    def _enter(self) -> None:
        self._engine.enter()

    def _check_usable(self) -> None:
        self._engine.check_usable()

    def _owned_args(self, hold: Hold) -> tuple[Any, ...]:
        return hold.renew_args

    async def is_locked(self) -> bool:
        """True if anyone (any client) holds the lock right now (one round trip)."""
        self._engine.enter()
        return bool(await self._engine.call(self._key, b"EXISTS", self._key))

    async def is_owned(self) -> bool:
        """True if the current task holds the lock, confirmed by Redis."""
        engine = self._engine
        engine.enter()
        hold = self._my_hold()
        if hold is None:
            return False
        ttl = int(await engine.eval(self._owned_script, (self._key,), self._owned_args(hold)))
        if ttl == -2:
            hold.gone("the hold was gone when checked")
            return False
        return True

    async def remaining_ttl(self) -> float | None:
        """Seconds until the current hold expires (whoever holds it); None if unlocked."""
        self._engine.enter()
        ttl = int(await self._engine.call(self._key, b"PTTL", self._key))
        if ttl == -2:
            return None
        if ttl == -1:
            return math.inf
        return ttl / 1000.0
