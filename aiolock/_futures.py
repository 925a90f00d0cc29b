"""Two one-line future helpers every waiting structure shares."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["expire", "retrieve"]


def expire(fut: asyncio.Future[Any]) -> None:
    """A wait's timer fired: resolve it with False, unless it is already done."""
    if not fut.done():
        fut.set_result(False)


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Done-callback that marks an exception as seen (nobody may await the future)."""
    if not fut.cancelled():
        fut.exception()
