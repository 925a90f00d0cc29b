"""Reference models of the primitives: plain Python, no I/O (issue 22 item 1).

A model says, after any sequence of operations, what each call may return
and who holds what. The stateful tests (tests/test_stateful.py, driven by
tests/stateful.py) run the same operations on real servers and compare.

Time is an input, not a clock the model reads: a hold with a fixed lease
ends when the test says its lease ran out (``expired``), a restart without
persistence ends every hold (``restarted``). Holds renewed by the watchdog
never end by themselves.

``HoldsModel`` covers every primitive that is held, by its ``shape``:

* ``exclusive``: one holder, reentrant per task (``AsyncLock``, ``SpinLock``,
  ``MultiLock``, ``RedlockLock``); a re-entry returns the hold's token.
* ``fair``: exclusive, and the waiters are served in the order they queued
  (FIFO across Clients); a restart without persistence loses the queue, and
  its waiters are served in any order (they queue again as their Clients
  find out).
* ``rw``: many readers or one writer, each side reentrant; writers are
  preferred: while a writer waits for the readers to leave, no new reader
  is let in (a reader's re-entry still is).
* ``semaphore``: ``permits`` permits, each acquisition a new permit with its
  own token (not reentrant).

Every new hold's fencing token is above every token issued before on the
name, across expiries, force releases and restarts. A force release, an
expiry or a restart ends the holds it removes: their leases are *lost*
(``LockLostError`` to the code they protect, ``LockNotOwnedError`` on
release). ``LatchModel`` is the countdown latch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Try = Literal["acquired", "reentered", "busy"]
Shape = Literal["exclusive", "fair", "rw", "semaphore"]


@dataclass
class HoldsModel:
    shape: Shape = "exclusive"
    permits: int = 1
    #: Each actor's live leases (tokens), and the side it holds ("x" for
    #: exclusive shapes, "read"/"write" for rw, "permit" for a semaphore).
    leases: dict[str, list[int]] = field(default_factory=dict)
    side: dict[str, str] = field(default_factory=dict)
    #: The largest token issued on this name.
    top: int = 0
    #: Who waits, and for which side, in the order they queued.
    waiters: dict[str, str] = field(default_factory=dict)
    #: A restart without persistence lost the fair queue: its waiters queue
    #: again in the order their Clients find out, so until they are all
    #: served any of them may be next.
    unordered: bool = False

    # -- what holds ------------------------------------------------------------

    def holders(self, side: str | None = None) -> set[str]:
        return {w for w, ls in self.leases.items() if ls and (side is None or self.side[w] == side)}

    def in_use(self) -> int:
        """Permits held (semaphore), or holders."""
        return (
            sum(len(ls) for ls in self.leases.values())
            if self.shape == "semaphore"
            else (len(self.holders()))
        )

    def verdict(self, who: str, side: str) -> Try:
        """What a try that will not wait returns for ``who`` asking for ``side``."""
        mine = self.leases.get(who)
        if self.shape == "semaphore":
            return "acquired" if self.in_use() < self.permits else "busy"
        if mine:
            assert self.side[who] == side, "the machine never mixes sides in one actor"
            return "reentered"
        others = self.holders()
        if self.shape == "rw" and side == "read":
            if self.holders("write"):
                return "busy"
            if others and "write" in self.waiters.values():
                return "busy"  # a writer waits for the readers: no new reader
            return "acquired"
        if others:
            return "busy"
        if (
            self.shape == "fair"
            and self.waiters
            and not self.unordered
            and next(iter(self.waiters)) != who
        ):
            return "busy"
        return "acquired"

    # -- what happened ---------------------------------------------------------

    def granted(self, who: str, side: str, token: int) -> Try:
        """``who`` got ``side`` with ``token``; raises if that breaks a rule."""
        verdict = self.verdict(who, side)
        self.left(who)
        assert verdict != "busy", f"{who} granted {side} against the model: {self.describe()}"
        if verdict == "reentered":
            assert token == self.leases[who][-1], (
                f"re-entry token {token}, hold's {self.leases[who]}"
            )
        else:
            assert token > self.top, f"token {token} not above {self.top}"
            self.top = token
        self.leases.setdefault(who, []).append(token)
        self.side[who] = side
        return verdict

    def left(self, who: str) -> None:
        """``who`` stopped waiting (served, or gave up)."""
        self.waiters.pop(who, None)
        if not self.waiters:
            self.unordered = False

    def released(self, who: str) -> bool:
        """One lease of ``who`` released; True if that freed room for a waiter."""
        mine = self.leases.get(who)
        assert mine, f"{who} released what it does not hold"
        mine.pop()
        return self.shape == "semaphore" or not mine

    def ended(self, who: str) -> None:
        """``who``'s holds ended without a release (an expiry, an eviction)."""
        self.leases.pop(who, None)
        self.side.pop(who, None)

    def force_released(self) -> set[str]:
        """Every hold deleted by an operator: the evicted actors."""
        evicted = self.holders()
        self.leases.clear()
        self.side.clear()
        return evicted

    def restarted(self) -> set[str]:
        """A restart without persistence: every hold ends, and a fair queue is lost."""
        self.unordered = self.shape == "fair" and bool(self.waiters)
        return self.force_released()

    def may_be_granted(self) -> set[str]:
        """Who may get a hold next without a new call."""
        if self.shape == "fair" and not self.unordered:
            head = next(iter(self.waiters), None)
            return {head} if head is not None and not self.holders() else set()
        room = [w for w, s in self.waiters.items() if self.verdict(w, s) != "busy"]
        return set(room)

    def describe(self) -> str:
        held = {w: (self.side[w], ls) for w, ls in self.leases.items() if ls}
        return f"held {held}, waiting {self.waiters}, top token {self.top}"


@dataclass
class LatchModel:
    """A countdown latch: ``count_down`` lowers the count (never below 0) and
    returns it; ``wait`` returns True once it is 0; ``try_set_count`` resets it,
    only while it is 0."""

    count: int
    waiters: set[str] = field(default_factory=set)

    def count_down(self) -> int:
        self.count = max(0, self.count - 1)
        return self.count

    def try_set_count(self, count: int) -> bool:
        if self.count:
            return False
        self.count = count
        return True

    @property
    def open(self) -> bool:
        return self.count == 0
