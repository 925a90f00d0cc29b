"""``futures.stop``: the one way a Client's long-lived tasks stop."""

from __future__ import annotations

import asyncio

from aiolock._core.futures import RECANCEL, stop


async def test_stop_cancels_again_a_task_that_swallowed_its_cancellation() -> None:
    """A cancellation swallowed below a task (seen in a Sentinel-managed
    connect under way when a Client closed: its listener then waited on its
    new connection forever, and ``aclose()`` with it) does not hang ``stop``:
    the task is cancelled again until it ends."""
    waiting = asyncio.Event()

    async def stubborn() -> None:
        try:
            waiting.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # swallowed, as that connect did
        await asyncio.sleep(3600)  # and on it goes, as the listener's session did

    task = asyncio.create_task(stubborn())
    await waiting.wait()
    # One more RECANCEL than it needs, with room for a busy machine.
    await asyncio.wait_for(stop(task), timeout=20 * RECANCEL)
    assert task.cancelled()


async def test_stop_of_a_task_that_ends_at_once_waits_no_more() -> None:
    task = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await stop(task)
    assert task.cancelled()
    assert loop.time() - began < RECANCEL  # (no wait for a second cancel)
    await stop(None)
