"""A history checker for tests that run locks in several processes.

Each process records every acquisition it made as an ``Op``: when it called
acquire (``invoked``), when acquire returned (``acquired``: from then on it
acts as the holder), when it stopped acting (``released``: the call to
release, or the end of the ``async with`` body), the fencing token, and
whether and when it was told the lease was lost. Times are
``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process of a
machine, so histories of several processes merge. ``check(ops)`` then
proves, or refutes with the operations at fault:

* **mutual exclusion**: no two holds of one name overlap, where a hold acts
  from ``acquired`` until ``released`` or, if it was told it was lost,
  until then (the protected code is cancelled at a loss);
* **token order in real time**: a hold acquired before another was invoked
  has the smaller fencing token (strictly: tokens are never reused);
* **every reported loss happened**: a hold reported lost was either
  confirmed gone by the server (its release answered "not owned") or
  another hold of the name began after it began and before it was released.

``check_register(final, increments)``: no lost update on a register that
the holds incremented (read, then write, under the lock).

Each rule is one pass over the ops sorted by time: O(n log n). Used by
``aiolock demo`` and by the multi-process and fault tests; processes write
their ops with ``dumps`` and the parent reads them back with ``loads``.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import asdict, dataclass

__all__ = ["Op", "Violation", "check", "check_register", "dumps", "loads"]


@dataclass(frozen=True, slots=True)
class Op:
    """One acquisition, as the process that made it saw it (times: ``monotonic_ns``)."""

    name: str
    token: int
    invoked: int
    acquired: int
    released: int
    #: When the process was told the lease was lost (None: it was not).
    lost: int | None = None
    #: The server said the hold was gone (its release answered "not owned").
    confirmed_gone: bool = False
    #: Which process or task made it (for the report only).
    who: str = ""

    @property
    def acts_until(self) -> int:
        """When this holder stopped acting: released, or told it was lost before that."""
        return self.released if self.lost is None else min(self.released, self.lost)


@dataclass(frozen=True, slots=True)
class Violation:
    """A rule the history breaks, with the operations that show it."""

    rule: str
    detail: str
    ops: tuple[Op, ...]

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


def check(ops: Iterable[Op]) -> list[Violation]:
    """Every violation of the three rules (see the module docstring) in ``ops``."""
    by_name: dict[str, list[Op]] = {}
    for op in ops:
        if op.acquired < op.invoked or op.released < op.acquired:
            raise ValueError(f"{op}: times must satisfy invoked <= acquired <= released")
        by_name.setdefault(op.name, []).append(op)
    found: list[Violation] = []
    for name in sorted(by_name):
        history = by_name[name]
        found += _exclusion(name, history)
        found += _token_order(name, history)
        found += _losses(name, history)
    return found


def _exclusion(name: str, history: list[Op]) -> list[Violation]:
    found = []
    latest: Op | None = None  # of the holds begun so far, the one acting longest
    for op in sorted(history, key=lambda o: (o.acquired, o.acts_until)):
        if latest is not None and op.acquired < latest.acts_until:
            found.append(
                Violation(
                    "mutual exclusion",
                    f"{name!r}: token {op.token} acquired {latest.acts_until - op.acquired} ns "
                    f"before token {latest.token} stopped acting",
                    (latest, op),
                )
            )
        if latest is None or op.acts_until > latest.acts_until:
            latest = op
    return found


def _token_order(name: str, history: list[Op]) -> list[Violation]:
    found = []
    by_acquired = sorted(history, key=lambda o: o.acquired)
    top: Op | None = None  # the largest token among holds acquired before `op` was invoked
    i = 0
    for op in sorted(history, key=lambda o: o.invoked):
        while i < len(by_acquired) and by_acquired[i].acquired < op.invoked:
            if top is None or by_acquired[i].token > top.token:
                top = by_acquired[i]
            i += 1
        if top is not None and top.token >= op.token:
            found.append(
                Violation(
                    "token order",
                    f"{name!r}: token {op.token} was issued after token {top.token} "
                    "had been acquired",
                    (top, op),
                )
            )
    return found


def _losses(name: str, history: list[Op]) -> list[Violation]:
    found = []
    starts = sorted(op.acquired for op in history)
    for op in history:
        if op.lost is None or op.confirmed_gone:
            continue
        # Another hold began while this one was still (as far as it knew) held.
        if bisect_right(starts, op.released) - bisect_right(starts, op.acquired) == 0:
            found.append(
                Violation(
                    "loss happened",
                    f"{name!r}: token {op.token} was reported lost, but the server did not "
                    "say it was gone and no other hold began before its release",
                    (op,),
                )
            )
    return found


def check_register(final: int, increments: int) -> list[Violation]:
    """No lost update: a register that ``increments`` holds each incremented once
    (read, then write, under the lock) ends at ``increments``."""
    if final == increments:
        return []
    return [
        Violation(
            "no lost update",
            f"the register ends at {final}, but {increments} holds incremented it",
            (),
        )
    ]


def dumps(ops: Iterable[Op]) -> str:
    """Ops as JSON lines (for a process to hand its history to the checker)."""
    return "".join(json.dumps(asdict(op)) + "\n" for op in ops)


def loads(text: str) -> list[Op]:
    """The ops of ``dumps``."""
    return [Op(**json.loads(line)) for line in text.splitlines() if line.strip()]
