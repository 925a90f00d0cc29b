"""What every primitive shares: its name and keys, and the ``async with`` protocol.

``Primitive`` holds a name, its keys and how its waiters are notified.
``LockLike`` turns ``_acquire``/``_release_mine`` into ``async with``,
``lock(timeout=..., lease=..., on_lost=...)`` and ``@lock``, and cancels the
body of an ``async with`` whose lease is lost (the way ``asyncio.timeout()``
turns its cancellation into TimeoutError). ``Acquirable``, ``HeldByTask`` and
``SingleHolder`` add ``acquire``/``try_acquire``, ``release`` and the queries.
The try/park loop they wait in is ``compete`` (``compete.py``); their
statistics and reprs are built in ``stats.py``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
from collections.abc import Callable, Coroutine, Iterable
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
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    asyncio_required,
)
from .._core.holds.lease import Hold, Lease
from .._core.observe.observer import Observer, observed
from .._core.options import LockStatistics
from .._core.protocol.keys import Keys
from .._core.validate import check_lease, check_name, check_timeout
from .._core.waiting.notify import Waiter
from .max_hold import cap_lease, check_max_hold, maybe
from .stats import describe, lock_statistics

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = [
    "Acquirable",
    "Entry",
    "HeldByTask",
    "LockLike",
    "OnLost",
    "Primitive",
    "SingleHolder",
    "current_task",
]

P = ParamSpec("P")
R = TypeVar("R")


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


def current_task() -> asyncio.Task[Any]:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running asyncio loop (trio, or no loop at all)
        raise asyncio_required() from None
    if task is None:
        raise asyncio_required()
    return task


def check_on_lost(value: object) -> OnLost:
    if value == "cancel":
        return "cancel"
    if value == "ignore":
        return "ignore"
    raise InvalidArgumentError(f"on_lost must be 'cancel' or 'ignore', got {value!r}")


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
