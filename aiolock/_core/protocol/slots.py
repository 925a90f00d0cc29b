"""The cluster slot of a key: redis-py's computation, named once.

A key's slot is part of aiolock's key layout (keys.py): every key of one
name carries the name's hash tag, so all are in one slot, and a script
touches one slot. The cluster's routing (topology), the eviction channels
and MultiLock's grouping by slot read it here.
"""

from __future__ import annotations

from typing import Any

from redis.crc import key_slot

__all__ = ["slot_of"]


def slot_of(key: Any) -> int:
    """The cluster slot of ``key`` (its hash tag's, if it has one)."""
    return key_slot(key.encode() if isinstance(key, str) else key)
