"""Future helpers every waiting structure shares."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Outcome", "expire", "retrieve"]


def expire(fut: asyncio.Future[Any]) -> None:
    """A wait's timer fired: resolve it with False, unless it is already done."""
    if not fut.done():
        fut.set_result(False)


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Done-callback that marks an exception as seen (nobody may await the future)."""
    if not fut.cancelled():
        fut.exception()


class Outcome(asyncio.Future[int]):
    """The outcome of a release: shared by everyone who waits for it, cancelled
    by none of them.

    ``wait()`` is ``asyncio.shield`` made cheaper: the caller's own future is
    resolved in the same call that resolves the outcome (often straight from
    the reply's parse), not one loop turn later; cancelling the caller
    cancels only its own future, so the release still completes.
    """

    _mirrors: list[asyncio.Future[int]] | None = None

    def wait(self) -> asyncio.Future[int]:
        if self.done():
            return self
        mirror: asyncio.Future[int] = self.get_loop().create_future()
        if self._mirrors is None:
            self._mirrors = []
        self._mirrors.append(mirror)
        return mirror

    def set_result(self, result: int, /) -> None:
        super().set_result(result)
        for mirror in self._mirrors or ():
            if not mirror.done():
                mirror.set_result(result)

    def set_exception(self, exception: type | BaseException, /) -> None:
        super().set_exception(exception)
        for mirror in self._mirrors or ():
            if not mirror.done():
                mirror.set_exception(exception)
