"""Statistics and reprs of every primitive, from local state only (no I/O, any thread)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from .._core.holds.lease import Hold
from .._core.options import LockStatistics

__all__ = ["describe", "describe_holders", "lease_count", "lock_statistics"]


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
