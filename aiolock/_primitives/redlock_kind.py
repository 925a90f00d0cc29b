"""The Redlock kind: one master's part of a Redlock lock (aiolock/_redlock.py).

Its declaration (aiolock/_core/protocol/kinds.py): layout, member formats and reader,
operations. Data and a pure reader, no runtime; below ``aiolock._redlock``
in the layers, so that the registry (``aiolock/_primitives/__init__.py``)
lists it and the Redlock module may import it.
"""

from __future__ import annotations

import re

from .._core.protocol import kinds
from .._core.protocol.keys import REDLOCK, REDLOCK_FENCE, RedlockKeys

__all__ = ["KIND"]

# Member format (scripts/redlock_acquire.lua): the lock key is a string,
# ``<client id>:<task serial>|<attempt>``; the fence hash's ``t`` is the highest
# token this master accepted.
_VALUE = re.compile(r"^(([0-9a-f]+):(\d+))\|.*$")


def _read(raw: kinds.RawName, lock: kinds.RawKey | None) -> kinds.Description | None:
    fence = raw.get(REDLOCK_FENCE, "hash")
    if lock is None and fence is None:
        return None
    last = kinds.to_int(fence.value.get("t")) if fence else None
    if lock is None:
        key = f"{raw.prefix}:{{{raw.name}}}{REDLOCK}"
        return kinds.Description(KIND, raw.name, key, None, last_token=last)
    holders = []
    m = _VALUE.match(lock.value)
    if m:
        holders.append(kinds.Holder(m[1], m[2], int(m[3]), "exclusive", kinds.ttl(lock.pttl)))
    ttl = kinds.ttl(lock.pttl)
    return kinds.Description(KIND, raw.name, lock.key, ttl, tuple(holders), last_token=last)


KIND = kinds.KindSpec(
    name="redlock",
    words="Redlock lock (this server's part)",
    parts=(
        kinds.Part(REDLOCK, "string", "the holder's attempt, <owner>|<attempt>"),
        kinds.Part(REDLOCK_FENCE, "hash", "t: the highest fencing token accepted here"),
    ),
    read=_read,
    renewals=("redlock_renew",),
    cannot_release="a Redlock spans several masters",
    keys=RedlockKeys.of,
    waiters_recorded=False,
    not_shown="its waiters are not recorded in Redis",
    holds_counted=False,
    counter_note="highest fencing token accepted on this server: {last_token}",
)
