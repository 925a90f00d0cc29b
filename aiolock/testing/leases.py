"""Make a lease end now, for testing what your code does on ``LockLostError``.

``await expire(lease)``: the hold's TTL runs out now, as if the holder had
been paused past its lease. ``await force_release(lease)``: an operator
force-releases the name now (``aiolock force-release NAME``). Either returns
once the holder's Client has marked the lease lost: ``lease.lost`` is True,
its ``on_lost`` callbacks are run, and the body of the ``async with`` that
holds it is cancelled, so the statement raises ``LockLostError`` (or exits
quietly with ``on_lost="ignore"``). No need to wait out a lease.

Both run in the Client's own event loop, on a lease that is held (neither
released nor lost: ``InvalidArgumentError`` otherwise), of one of the kinds
each names (``InvalidArgumentTypeError`` otherwise). Nothing here imports
pytest: ``aiolock.testing`` re-exports them with the fixtures.
"""

from __future__ import annotations

from typing import Any

from .. import (
    AiolockError,
    AsyncLock,
    FairLock,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Lease,
    Permit,
    ReadWriteLock,
    Semaphore,
)

__all__ = ["EXPIRABLE", "FORCE_RELEASABLE", "expire", "force_release"]

#: The kinds ``expire`` handles: those whose hold is a whole key of its own
#: (the key going away is the hold expiring). A read lock or a semaphore
#: permit shares its keys with other holders: use ``force_release``.
EXPIRABLE = frozenset({"lock", "spin_lock", "fair_lock", "write_lock"})
#: The kinds ``force_release`` handles.
FORCE_RELEASABLE = EXPIRABLE | {"read_lock", "semaphore"}


def _held(lease: object, what: str, kinds: frozenset[str]) -> Any:
    """The hold behind ``lease``, checked: a held lease of one of ``kinds``."""
    if not isinstance(lease, Lease):
        raise InvalidArgumentTypeError(
            f"{what}() takes a Lease (what acquire() returns), got {type(lease).__name__}: "
            f"{lease!r}"
        )
    hold = lease._hold
    if hold.kind not in kinds:
        raise InvalidArgumentTypeError(
            f"{what}() takes a lease of a {', '.join(sorted(kinds))}; this one is of a "
            f"{hold.kind}" + ("" if what == "force_release" else "; use force_release()")
        )
    hold.engine.check_usable()
    if lease.released or lease.lost:
        state = "released" if lease.released else f"lost ({lease.lost_reason})"
        raise InvalidArgumentError(f"{what}(): the lease of {hold.name!r} is already {state}")
    return hold


async def _noticed(lease: Lease, hold: Any, what: str) -> None:
    """One renewal round of the holder's Client (its watchdog checks every
    hold, fixed leases too): it finds the hold gone and marks it lost."""
    if not lease.lost:
        await hold.engine.watchdog.renew_all()
    if not lease.lost:
        raise AiolockError(
            f"{what}(): the Client holding {hold.name!r} did not find its hold gone "
            "(was it being released, or is Redis unreachable?)"
        )


async def expire(lease: Lease) -> None:
    """Make ``lease`` expire now, as if its holder had been paused past it.

    The hold's key is deleted, as its TTL running out would: no waiter is
    woken (a waiter learns of it as of an expiry), the fencing counter is
    kept. Then the holder's Client runs a renewal round, finds the hold gone
    and marks the lease lost (reason: the watchdog's). Kinds: ``EXPIRABLE``
    (lock, spin lock, fair lock, write lock).
    """
    hold = _held(lease, "expire", EXPIRABLE)
    key = hold.renew_key
    await hold.engine.call(key, b"DEL", key)
    await _noticed(lease, hold, "expire")


async def force_release(lease: Lease) -> None:
    """Force-release the name ``lease`` holds now, as an operator would.

    Runs the primitive's own ``force_release()`` (every holder of the name
    is evicted: every reader of a read lock, every permit of a semaphore;
    waiters are woken; the fencing counter is kept) through the holder's
    Client, which marks the lease lost at once (reason ``"force-released"``).
    Kinds: ``FORCE_RELEASABLE`` (lock, spin lock, fair lock, read lock,
    write lock, semaphore).
    """
    hold = _held(lease, "force_release", FORCE_RELEASABLE)
    engine, name, kind = hold.engine, hold.name, hold.kind
    if kind in ("lock", "spin_lock"):
        await AsyncLock(engine, name).force_release()
    elif kind == "fair_lock":
        await FairLock(engine, name).force_release()
    elif kind == "read_lock":
        await ReadWriteLock(engine, name).read.force_release()
    elif kind == "write_lock":
        await ReadWriteLock(engine, name).write.force_release()
    else:
        permits = lease.permits if isinstance(lease, Permit) else 1
        await Semaphore(engine, name, permits).force_release()
    await _noticed(lease, hold, "force_release")
