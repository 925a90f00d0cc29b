"""The try/park loop every waiting primitive runs: ``compete``.

``compete`` is trio's "check, try without waiting, then park" as one loop,
used by every waiting primitive: try in Redis; if that failed, register a
Waiter (see ``aiolock._core.waiting.notify``), make sure it is live, and try again at once (so a
release between the first try and the registration is not missed); then
park until woken or until the bound passes (the holder's TTL, cut to the
caller's deadline), and try again. One last try is always made at the
deadline. A try whose reply is lost to a timeout or a cancellation is
undone by its ``orphan`` handler (``Engine.undo``: see ``Undo``). It rides
out Redis outages (backoff, one warning per outage) and tells a lock found
busy from a Redis that did not answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from .._core.errors import (
    CANNOT_REACH,
    TRANSIENT,
    ClientClosedError,
    ConnectionFailedError,
    LockTimeoutError,
    ServerUnavailableError,
    clause,
    no_reply,
)
from .._core.observe.observer import note_waiting
from .._core.outage import Outage
from .._core.waiting.notify import Waiter

__all__ = [
    "FIRST_CONTACT_TRIES",
    "OUTAGE_BACKOFF_CAP",
    "REPLY_GRACE",
    "TRANSIENT",
    "Contender",
    "compete",
    "ttl_hint",
]

T = TypeVar("T")

#: However short the caller's timeout, an attempt already on the wire gets
#: this long for its reply (so ``try_acquire()`` always makes one real try).
REPLY_GRACE = 1.0
#: A wait without a timeout that never reached Redis gives up after this many failures.
FIRST_CONTACT_TRIES = 3
#: The longest pause between two tries of a wait riding out an outage.
OUTAGE_BACKOFF_CAP = 1.0

log = logging.getLogger("aiolock.lock")


def ttl_hint(pttl_ms: int) -> float | None:
    """A script's PTTL of the holder as a wait bound: -1 (no TTL) is None
    (wait for a message, bounded by the lease); 0 or -2 (it is expiring, or
    gone) retries in a millisecond, never after a whole lease."""
    if pttl_ms == -1:
        return None
    return max(pttl_ms, 1) / 1000.0


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
