"""The quorum call: one call per master at once, the replies in master order.

``quorum`` is the one fan-out of Redlock: every round (an acquire, a
write-back, a release, a renewal, a query) is a future per master, made by
that master's Engine through its public interface (``send_script``,
``submit_script``, ``eval``, ``renew_batch``, ``call``), and gathered here.
Also: ``Master`` (one master's Engine and its key names), ``AnyWaiter`` (a
waiter woken by any master) and the errors of a decision too few masters
answered to take.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._core.errors import AiolockError, ClientClosedError, ConnectionFailedError
from .._core.protocol.keys import RedlockKeys
from .._core.waiting.notify import Waiter
from .._primitives.compete import TRANSIENT

if TYPE_CHECKING:
    from .._core.engine import Engine

__all__ = [
    "AnyWaiter",
    "Master",
    "backoff",
    "cancel_all",
    "quorum",
    "redis_cause",
    "too_few",
    "transient",
]


class Master:
    """One master: its Client's Engine, and the names of the locks used on it."""

    __slots__ = ("_names", "engine", "failure")

    #: Names kept per master (rebuilt when more are used: cheap).
    NAMES = 4096

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._names: dict[str, RedlockKeys] = {}
        #: Why the last try to reach it (find its mode) failed, if it did.
        self.failure: BaseException | None = None

    def keys(self, name: str) -> RedlockKeys:
        keys = self._names.get(name)
        if keys is None:
            if len(self._names) >= self.NAMES:
                self._names.clear()
            keys = self._names[name] = RedlockKeys.of(self.engine.prefix, name)
        return keys

    def lock_key(self, name: str) -> str:
        return self.keys(name).lock

    def channel(self, name: str) -> bytes:
        return self.keys(name).channel

    def settled(self, task: asyncio.Future[Any]) -> None:
        """Keep why it could not be reached (the cause of "not reached yet")."""
        self.failure = None if task.cancelled() else task.exception()

    def script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]
    ) -> asyncio.Future[Any]:
        """Send script ``name`` now (``Engine.send_script``: no task, its reply
        taken from its parse); the future gets the reply or the error. A master
        never reached yet gets nothing: it would first wait to find its mode,
        and a later undo could overtake the call (ConnectionFailedError)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.engine.cluster is None:
            error = ConnectionFailedError(
                "this master was not reached yet"
                + (f" ({self.failure})" if self.failure is not None else "")
            )
            if self.failure is not None:
                error.__cause__ = redis_cause(self.failure)
            future.set_exception(error)
            return future

        def reply(value: Any, error: BaseException | None) -> None:
            if not future.done():
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(value)

        self.engine.send_script(name, keys, args, reply)
        return future


async def quorum(
    calls: Sequence[asyncio.Future[Any]],
    timeout: float | None,
    enough: Callable[[list[Any]], bool] | None = None,
    late: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """Gather one call per master: the replies in master order, an exception
    where it failed, None where none came within ``timeout`` (None: no
    bound but the masters' own command timeouts) or before
    ``enough(replies)`` was true (checked at each reply).

    A call still running when it returns is cancelled (every call made here
    is idempotent or undone by value), unless ``late`` is given: then
    ``late(i, reply)`` gets its reply when it comes.
    """
    loop = asyncio.get_running_loop()
    n = len(calls)
    replies: list[Any] = [None] * n
    ready: asyncio.Future[None] = loop.create_future()
    answered = 0

    def settle(i: int, call: asyncio.Future[Any]) -> None:
        nonlocal answered
        reply = None if call.cancelled() else (call.exception() or call.result())
        if ready.done():
            if late is not None and reply is not None:
                late(i, reply)
            return
        replies[i] = reply
        answered += 1
        if answered == n or (enough is not None and enough(replies)):
            ready.set_result(None)

    for i, call in enumerate(calls):
        call.add_done_callback(functools.partial(settle, i))
    try:
        if not ready.done():
            try:
                async with asyncio.timeout(timeout):
                    await ready
            except TimeoutError:
                pass
    finally:
        if not ready.done():
            ready.set_result(None)  # later replies go to `late`, or nowhere
        if late is None:
            cancel_all(calls)
    return list(replies)


class AnyWaiter:
    """A waiter on the name's channel on every master: woken by any of them.

    Live (``ready``) once a majority of the subscriptions are confirmed: a
    release deletes the key on a majority at least, and publishes on each.
    """

    __slots__ = ("_majority", "_waiters")

    def __init__(self, waiters: list[Waiter], majority: int) -> None:
        self._waiters = waiters
        self._majority = majority

    async def ready(self, bound: float | None) -> None:
        tasks = [asyncio.ensure_future(w.ready(bound)) for w in self._waiters]
        try:
            pending = set(tasks)
            done_count = 0
            while pending and done_count < self._majority:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                done_count += sum(1 for t in done if not t.cancelled() and t.exception() is None)
        finally:
            cancel_all(tasks)

    async def wait(self, timeout: float | None) -> bool:
        tasks = [asyncio.ensure_future(w.wait(timeout)) for w in self._waiters]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            woken = False
            for task in done:
                error = task.exception()
                if isinstance(error, ClientClosedError):
                    raise error
                woken = woken or (error is None and bool(task.result()))
            return woken
        finally:
            cancel_all(tasks)

    def close(self, *, linger: bool = False) -> None:
        for waiter in self._waiters:
            waiter.close(linger=linger)


def cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the unfinished ``tasks``; their outcomes are collected (never unretrieved)."""
    for task in tasks:
        if task.done():
            collect(task)
        else:
            task.cancel()
            task.add_done_callback(collect)


def collect(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def transient(exc: BaseException) -> bool:
    """A failure of one master that counts as "no reply" (the others decide)."""
    return isinstance(exc, (*TRANSIENT, TimeoutError))


def too_few(
    message: str, replies: Sequence[Any], majority: int, n: int | None = None
) -> ConnectionFailedError:
    """The error for a decision that too few masters answered to take: it
    says how many of ``n`` (``len(replies)``) answered (a reply other than
    None or an exception), and redis-py's error (the first one) is its cause."""
    causes = [redis_cause(r) for r in replies if isinstance(r, BaseException)]
    answered = sum(1 for r in replies if r is not None and not isinstance(r, BaseException))
    n = n or len(replies)
    if len(causes) > n - majority:  # (decided without waiting for the others)
        why = f"{len(causes)} of {n} masters could not be reached ({causes[0]})"
    else:
        why = f"only {answered} of {n} masters answered"
    error = ConnectionFailedError(
        f"{message}: {why}; a majority ({majority}) must answer. Check that the masters "
        "are up and reachable"
    )
    # redis-py's error where one came back (a master not reached yet has none).
    error.__cause__ = next(
        (c for c in causes if not isinstance(c, AiolockError)), causes[0] if causes else None
    )
    return error


def redis_cause(error: BaseException) -> BaseException:
    """redis-py's (or the OS') exception behind an AiolockError, else ``error``."""
    cause = error.__cause__
    return cause if isinstance(error, ConnectionFailedError) and cause is not None else error


def backoff(lease: float) -> float:
    """A short random pause before retrying an attempt that failed without a holder."""
    return min(lease / 10, 0.05) * (0.5 + secrets.randbelow(1000) / 2000)
