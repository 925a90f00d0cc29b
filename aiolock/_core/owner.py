"""Owner identity: ``<client id>:<task serial>``.

Each asyncio Task gets a serial the first time it touches a Client, from a
process-wide counter, so serials are never reused (``id(task)`` is, as soon as
the task is garbage collected). The map forgets a task when it finishes.
"""

from __future__ import annotations

import asyncio
import itertools

__all__ = ["task_serial"]

_serials: dict[asyncio.Task[object], int] = {}
_counter = itertools.count(1)


def _forget(task: asyncio.Task[object]) -> None:
    _serials.pop(task, None)


def task_serial(task: asyncio.Task[object]) -> int:
    serial = _serials.get(task)
    if serial is None:
        serial = _serials[task] = next(_counter)
        task.add_done_callback(_forget)
    return serial
