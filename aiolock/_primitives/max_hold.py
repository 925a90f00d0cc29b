"""``max_hold=seconds``: a hold that ends when it is that old, renewed or not.

Every ``acquire``, ``try_acquire`` and ``lock(...)`` call form takes
``max_hold`` beside ``lease``. The primitives themselves know nothing of it:
the call forms acquire as usual, then ``arm`` the returned lease's holds.

The contract:

* **Watchdog leases** (``lease=None``): the watchdog renews the hold until it
  is ``max_hold`` seconds old (counted from the send time of the acquire
  that was granted). Then the hold is *lost* as any lost lease is:
  ``lease.lost`` is true with a reason naming ``max_hold``, the ``on_lost``
  callbacks run, an ``async with`` body is cancelled and LockLostError
  (naming ``max_hold``) is raised from the ``async with``; the loss is
  counted (``client.statistics().losses``, the ``aiolock.lease`` WARNING,
  the OpenTelemetry loss counter with its outcome ``max_hold``). The Client
  stops renewing it and releases it in Redis at once, so other Clients need
  not wait out the lease (if the Client is gone, the key expires within one
  lease anyway).
* **Fixed leases** (``lease=s``): the effective expiry is
  ``min(lease, max_hold)``: the key is written with that TTL, and when it
  runs out the lease is lost with a reason naming ``max_hold`` if max_hold
  was the shorter (else the fixed lease's own reason).
  ``lease.extend()`` never moves that end: the hold ends at max_hold whatever.
* **Re-entries** (the same task acquiring a hold it has): the hold keeps the
  earliest end any of its acquisitions asked for, each counted from when it
  was made.
* **Multi-locks**: every part's hold gets the same end.
* Validation: ``None`` or a finite number of seconds, at least 0.001:
  InvalidArgumentTypeError / InvalidArgumentError at the call, before any
  round trip.

The end is a timer on the Client's loop (no cost per renewal), kept per hold
in a weak map and cancelled when the hold ends, so a hold released early
keeps nothing alive until its max_hold.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from .._core.holds.handoff import exported, released_or_lost
from .._core.holds.lease import Hold, Lease
from .._core.observe.observer import MAX_HOLD_REACHED
from .._core.validate import check_lease

__all__ = ["MAX_HOLD_REACHED", "arm", "cap_lease", "check_max_hold", "maybe", "with_max_hold"]


T = TypeVar("T")

# hold -> (its end by loop time, the timer that ends it)
_ends: weakref.WeakKeyDictionary[Hold, tuple[float, asyncio.TimerHandle]] = (
    weakref.WeakKeyDictionary()
)


def check_max_hold(value: object) -> float | None:
    """None (no bound) or a finite number of seconds, at least 0.001."""
    return check_lease(value, "max_hold")


def cap_lease(lease: float | None, max_hold: float | None) -> float | None:
    """The fixed lease to acquire with: ``min(lease, max_hold)`` (None stays None)."""
    if lease is None or max_hold is None:
        return lease
    return min(lease, max_hold)


async def with_max_hold(acquiring: Awaitable[T], max_hold: float, lease: float | None = None) -> T:
    """Await the acquisition, then ``arm`` its lease (no await in between:
    a cancellation lands in the acquire, whose own contract applies).
    ``lease``: the fixed lease asked for (before ``cap_lease``), or None."""
    got = await acquiring
    arm(got, max_hold, lease)
    return got


def maybe(
    acquiring: Coroutine[Any, Any, T], max_hold: float | None, lease: float | None = None
) -> Coroutine[Any, Any, T]:
    """``acquiring`` as it is without a max_hold (no frame more), else ``with_max_hold``."""
    if max_hold is None:
        return acquiring
    return with_max_hold(acquiring, max_hold, lease)


def _holds(lease: object) -> list[Hold]:
    if isinstance(lease, Lease):
        return [lease._hold]
    parts = getattr(lease, "leases", None)  # a MultiLease
    if parts is None:
        return []
    return [part._hold for part in parts if isinstance(part, Lease)]


def arm(lease: object, max_hold: float, fixed: float | None = None) -> None:
    """End each hold of ``lease`` ``max_hold`` seconds after it began (see the
    module doc). ``fixed``: the fixed lease asked for, or None."""
    for hold in _holds(lease):
        _arm_hold(hold, max_hold, fixed)


def _arm_hold(hold: Hold, max_hold: float, fixed: float | None) -> None:
    if hold.lost or not hold.leases:
        return
    loop = asyncio.get_running_loop()
    now = loop.time()
    if not hold.watchdog:
        if len(hold.leases) == 1 and (fixed is None or fixed <= max_hold):
            return  # the fixed lease ends first, by its own timer and reason
        # Cut to max_hold (cap_lease): this timer ends it at its expiry, with
        # the reason naming max_hold, and extend() does not move it.
        end = hold.expires_at if len(hold.leases) == 1 else now + max_hold
    elif len(hold.leases) == 1:
        # A fresh hold: counted from the send time of its acquire.
        end = min(now, hold.expires_at - hold.lease) + max_hold
    else:
        end = now + max_hold  # a re-entry: counted from now
    known = _ends.get(hold)
    if known is not None:
        if known[0] <= end:
            return
        known[1].cancel()
    if not hold.watchdog:
        if hold.expires_at < end:
            return  # the fixed lease ends first
        if hold.timer is not None:
            hold.timer.cancel()
            hold.timer = None
    if known is None:
        # The timer goes when the hold ends: a hold released early keeps
        # nothing alive until its max_hold (a local handoff moves this to
        # the next hold, whose end then only drops the entry, if still there).
        prev = hold.on_detach

        def ended(ending: Hold) -> None:
            entry = _ends.pop(hold, None)
            if entry is not None:
                entry[1].cancel()
            if prev is not None:
                prev(ending)

        hold.on_detach = ended
    _ends[hold] = (end, loop.call_at(end, _reached, hold, max_hold))


def _reached(hold: Hold, max_hold: float) -> None:
    """The hold is ``max_hold`` old: lost (counted, reported), then released in
    Redis at once (best effort: a failure leaves it to expire). A hold whose
    handle was given out may have been adopted meanwhile: asked first."""
    _ends.pop(hold, None)
    if hold.lost or not hold.leases or hold.releasing is not None:
        return  # released (or being released), lost, or handed over meanwhile
    if exported(hold):
        hold.engine.untrack(hold)

        async def ask() -> None:
            if await released_or_lost(hold):
                hold.handed_over()
            else:
                _end(hold, max_hold)

        spawn = getattr(hold.engine, "spawn", None)
        if spawn is not None:
            spawn(ask())
            return
    _end(hold, max_hold)


def _end(hold: Hold, max_hold: float) -> None:
    if hold.lost or not hold.leases or hold.releasing is not None:
        return
    hold.mark_lost(f"{MAX_HOLD_REACHED} ({max_hold:g} s) reached: the hold is not renewed past it")
    try:
        hold.engine.release_hold(hold)
    except Exception:  # (a closed Client: the key expires by itself)
        pass
