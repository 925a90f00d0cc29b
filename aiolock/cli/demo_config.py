"""The demo's configuration, shared by the parent, the workers and the views."""

from __future__ import annotations

from dataclasses import dataclass

# One hold: (lock index, fencing token, wait started, acquired, work done), ns.
Record = tuple[int, int, int, int, int]

TICK = 0.25  # how often workers report, seconds
WINDOW = 2.0  # live figures cover the last this many seconds


@dataclass(frozen=True, slots=True)
class Config:
    url: str
    prefix: str
    processes: int
    tasks: int
    locks: int
    duration: float
    uvloop: bool
    use_lock: bool

    def lock_name(self, i: int) -> str:
        return f"lock-{i}"

    def data_key(self, i: int, what: str) -> str:
        # Demo data lives under the same prefix, so one SCAN cleans up everything.
        return f"{self.prefix}:data:{self.lock_name(i)}:{what}"
