"""Helpers shared by the core tests (fixtures live in each module or conftest)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiolock import Client

if TYPE_CHECKING:
    from tests.servers import RedisServer


async def eventually(
    predicate: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
) -> None:
    """Wait until ``predicate()`` is true; fail after a generous ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


def is_quiet(client: Client) -> bool:
    s = client.statistics()
    return (
        s.holds == 0
        and s.waiting == 0
        and s.subscriptions == 0
        and s.watched == 0
        and s.in_flight == 0
        and s.background == 0
    )


async def assert_clean(client: Client, *clients: Client) -> None:
    """Every local trace of locking is gone: no holds, waiters, channels, leases, I/O."""
    for c in (client, *clients):
        await eventually(lambda c=c: is_quiet(c), what=f"{c!r} to be quiet")
        assert c._states == {}, f"local lock states left behind: {c._states}"


def evalsha_calls(server: RedisServer) -> int:
    """Script calls the server has run so far (INFO commandstats)."""
    stats = server.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
