"""A semaphore's permits: the Permit lease, the permit count's check, and the
local state of one semaphore name in one Client (semaphore.py's parts that
adopt.py and the kind share)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.errors import InvalidArgumentError, InvalidArgumentTypeError
from .._core.holds.lease import Hold, Lease

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["MAX_PERMITS", "Permit", "SemState", "check_permits", "permits_of"]

#: The largest N (and the most permits one acquisition may ask for).
MAX_PERMITS = 2**31 - 1

# Holder ids: the Client id and task serial (the owner) and the call's attempt
# id make every one unique, so a retried or undone script never touches another hold.


def check_permits(value: object, what: str = "permits") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        hint = " (to wait, pass wait=...)" if isinstance(value, float) else ""
        raise InvalidArgumentTypeError(
            f"{what} must be an int, got {type(value).__name__}: {value!r}{hint}"
        )
    if not 1 <= value <= MAX_PERMITS:
        raise InvalidArgumentError(f"{what} must be between 1 and {MAX_PERMITS}, got {value!r}")
    return value


class Permit(Lease):
    """The :class:`Lease` of one semaphore acquisition: ``permits`` of them.

    ``release()`` gives back exactly these permits, from any task, once
    (idempotent). ``fencing_token``, ``lost``, ``extend()`` and ``on_lost()``
    work as for a lock.
    """

    __slots__ = ("_permits",)

    def __init__(self, hold: Hold, permits: int) -> None:
        super().__init__(hold)
        self._permits = permits

    @property
    def permits(self) -> int:
        """How many permits this acquisition holds."""
        return self._permits

    def __repr__(self) -> str:
        hold = self._hold
        state = "released" if self._released else ("lost" if hold.lost else "held")
        return f"<Permit {hold.name!r} x{self._permits} token={hold.token} {state}>"


class SemState:
    """One semaphore name in one Client: its local holds and parked tasks."""

    __slots__ = ("active", "engine", "held", "key", "parked")

    def __init__(self, engine: EngineView, key: str) -> None:
        self.engine = engine
        self.key = key
        self.held: dict[Hold, None] = {}
        self.active = 0  # tasks inside acquire
        self.parked = 0  # of which registered as waiters

    def holds(self) -> list[Hold]:
        return list(self.held)

    def waiting(self) -> int:
        return self.parked

    def set_parked(self, value: bool) -> None:
        self.parked += 1 if value else -1

    def hold_ended(self, hold: Hold) -> None:
        self.held.pop(hold, None)
        self.drop_if_idle()

    def drop_if_idle(self) -> None:
        if not self.held and not self.active:
            self.engine.drop_state(self.key, self)

    def close(self) -> None:
        return None  # parked tasks are failed by their channel or by compete()


def permits_of(hold: Hold) -> int:
    """The permits a semaphore hold has (its one Permit's, until released)."""
    return sum(p.permits for p in tuple(hold.leases) if isinstance(p, Permit))
