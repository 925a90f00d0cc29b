"""SpinLock: the AsyncLock protocol without pub/sub."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.errors import InvalidArgumentTypeError
from .._core.waiting.notify import Backoff, PollWaiter, Waiter
from .lock import AsyncLock

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["SpinLock"]


class SpinLock(AsyncLock):
    """An :class:`AsyncLock` that waits by polling, never by notification.

    For proxies and managed services that disable pub/sub, and for very
    short, very frequent locks. Same keys, scripts and contracts as
    AsyncLock (so a spin lock and a lock of the same name are one lock);
    only the waiting differs: capped exponential backoff with jitter
    (``backoff``, default: the Client's). No sleep ever runs past the
    caller's deadline: the last one is cut to the time left, and one last
    attempt is made at the deadline.
    """

    __slots__ = ("_backoff",)

    _targeted = False  # it polls: no registration for targeted wake-ups
    kind = "spin_lock"

    def __init__(self, engine: EngineView, name: str, *, backoff: Backoff | None = None) -> None:
        super().__init__(engine, name)
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgumentTypeError(
                f"backoff must be an aiolock.Backoff, got {type(backoff).__name__}"
            )
        self._backoff = backoff or engine.backoff

    def _waiter(self) -> Waiter:
        return PollWaiter(self._backoff)
