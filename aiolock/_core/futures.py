"""Future helpers every waiting structure shares."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["Outcome", "expire", "retrieve", "stop"]


def expire(fut: asyncio.Future[Any]) -> None:
    """A wait's timer fired: resolve it with False, unless it is already done."""
    if not fut.done():
        fut.set_result(False)


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Done-callback that marks an exception as seen (nobody may await the future)."""
    if not fut.cancelled():
        fut.exception()


#: How long ``stop`` waits before it cancels a task again.
RECANCEL = 0.5


async def stop(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task (None: none) and wait until it has ended,
    whatever it ended with (the one way a Client's long-lived tasks stop).

    A task that goes on after its cancellation is cancelled again every
    ``RECANCEL`` seconds: a cancellation that arrives while a connect is
    under way can be swallowed below us (redis-py's Sentinel-managed connect
    was seen to), and the task then waits on its new connection forever. A
    close must not hang on that. (Cancelling the caller of ``stop`` cancels
    the wait, not the task's stop: it was cancelled already.)"""
    if task is None:
        return
    task.cancel()
    while not task.done():
        await asyncio.wait((task,), timeout=RECANCEL)
        if not task.done():
            task.cancel()
    if not task.cancelled():
        task.exception()  # (retrieved: whatever it ended with)


class Outcome(asyncio.Future[int]):
    """The outcome of a release: shared by everyone who waits for it, cancelled
    by none of them.

    ``wait()`` is ``asyncio.shield`` made cheaper: the caller's own future is
    resolved in the same call that resolves the outcome (often straight from
    the reply's parse), not one loop turn later; cancelling the caller
    cancels only its own future, so the release still completes. Hooks given
    to ``settled()`` run in that call too (no loop turn, no Handle). An
    exception is marked as retrieved: the release reports it to its callers.
    """

    _mirrors: list[asyncio.Future[int]] | None = None
    _hooks: list[Callable[[Outcome], None]] | None = None

    def wait(self) -> asyncio.Future[int]:
        if self.done():
            return self
        mirror: asyncio.Future[int] = self.get_loop().create_future()
        if self._mirrors is None:
            self._mirrors = []
        self._mirrors.append(mirror)
        return mirror

    def settled(self, hook: Callable[[Outcome], None]) -> None:
        """Call ``hook(self)`` once the outcome is known (at once if it is)."""
        if self.done():
            hook(self)
            return
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)

    def set_result(self, result: int, /) -> None:
        super().set_result(result)
        for mirror in self._mirrors or ():
            if not mirror.done():
                mirror.set_result(result)
        self._run_hooks()

    def set_exception(self, exception: type | BaseException, /) -> None:
        super().set_exception(exception)
        error = super().exception()  # (retrieved: its callers get it)
        assert error is not None
        for mirror in self._mirrors or ():
            if not mirror.done():
                mirror.set_exception(error)
        self._run_hooks()

    def _run_hooks(self) -> None:
        hooks, self._hooks = self._hooks, None
        for hook in hooks or ():
            hook(self)
