"""Reference models of the primitives: plain Python, no I/O (issue 22 item 1).

A model says, after any sequence of operations, what each call may return
and who holds what. The stateful tests (tests/test_stateful.py) run the
same operations on real servers and compare. Time is not modelled yet:
every hold here is a watchdog hold (renewed, never expiring by itself).

``LockModel``: the reentrant ``AsyncLock``. Holders are named actors (a
task each); a re-entry by the holder returns its token and counts; the
last release frees the lock and, if anyone waits, hands it to one of the
waiters (the plain lock promises no order); a force release evicts the
holder, whose leases are then lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Try = Literal["acquired", "reentered", "busy"]


@dataclass
class LockModel:
    holder: str | None = None
    #: The holder's leases not yet released (reentrancy).
    count: int = 0
    #: The holder's fencing token, and the largest seen on this name.
    token: int = 0
    top: int = 0
    waiters: set[str] = field(default_factory=set)

    def try_acquire(self, who: str) -> Try:
        """What a try that will not wait returns (before any reply: the model's verdict)."""
        if self.holder is None:
            return "acquired"
        return "reentered" if self.holder == who else "busy"

    def granted(self, who: str, token: int) -> None:
        """``who`` got the free lock with ``token``; raises if that breaks a rule."""
        assert self.holder is None, f"{who} granted while {self.holder} holds"
        assert token > self.top, f"token {token} not above {self.top}"
        self.waiters.discard(who)
        self.holder, self.count, self.token, self.top = who, 1, token, token

    def reentered(self, who: str, token: int) -> None:
        assert self.holder == who, f"{who} re-entered a lock held by {self.holder}"
        assert token == self.token, f"re-entry token {token}, hold's {self.token}"
        self.count += 1

    def released(self, who: str) -> bool:
        """One lease of ``who`` released; True if that freed the lock."""
        assert self.holder == who and self.count > 0, f"{who} released what it does not hold"
        self.count -= 1
        if self.count == 0:
            self.holder = None
            return True
        return False

    def force_released(self) -> str | None:
        """The lock deleted by an operator: the evicted holder, if any."""
        evicted, self.holder, self.count = self.holder, None, 0
        return evicted

    def may_be_granted(self) -> set[str]:
        """Who may get the lock next without a new call: any waiter, if it is free."""
        return set(self.waiters) if self.holder is None else set()
