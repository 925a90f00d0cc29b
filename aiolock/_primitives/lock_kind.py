"""The lock kind: AsyncLock (_primitives/lock.py), and SpinLock and a MultiLock's
parts, which are that lock when they share a name.

Its declaration (aiolock/_core/protocol/kinds.py): layout, member formats and reader,
operations. Data and a pure reader, no runtime: the operator commands read it
without the primitive's code (registered in aiolock/_primitives/__init__.py).
"""

from __future__ import annotations

import re

from .._core.protocol import kinds
from .._core.protocol.keys import FENCE, WAITING, LockKeys

__all__ = ["KIND"]

# Member formats (scripts/acquire.lua, _wake.lua): a holder is a field of the
# main hash, ``<client id>:<task serial>`` -> its hold count, beside ``~fence``
# (its token) and ``~n`` / ``~nx`` (untracked waiters); a waiter is a member of
# the waiting set, ``<owner>|<n>|<task serial>``, scored by its lapse time (ms).
_OWNER = re.compile(r"^([0-9a-f]+):(\d+)$")
_WAKE_MEMBER = re.compile(r"^(([0-9a-f]+):(\d+))\|\d+\|(\d+)$")


def _read(raw: kinds.RawName, main: kinds.RawKey | None) -> kinds.Description | None:
    if main is None:
        return None
    fields: dict[str, str] = main.value
    ttl = kinds.ttl(main.pttl)
    token = kinds.to_int(fields.get("~fence"))
    holders = []
    for f, v in fields.items():
        m = _OWNER.match(f)
        if m:
            count = kinds.to_int(v) or 1
            holders.append(kinds.Holder(f, m[1], int(m[2]), "exclusive", ttl, token, count))
    waiters = []
    wq = raw.get(WAITING, "zset")
    for member, score in wq.value if wq else ():
        m = _WAKE_MEMBER.match(member)
        if m and score > raw.now_ms:
            lapse = kinds.left(score, raw.now_ms)
            waiters.append(kinds.Waiter(m[2], "task", lapse, int(m[3]), m[1]))
    last, released = kinds.fence_of(raw, FENCE)
    return kinds.Description(
        KIND,
        raw.name,
        main.key,
        ttl,
        tuple(holders),
        tuple(waiters),
        untracked_waiters=_untracked(fields, raw.now_ms),
        last_token=last,
        last_released=released,
    )


def _untracked(fields: dict[str, str], now_ms: int) -> bool:
    """The lock's "~n" flag, while its "~nx" says such a waiter's next try is due
    (no "~nx": a flag carried over to a new hold: shown until that hold ends)."""
    if "~n" not in fields:
        return False
    known = kinds.to_int(fields.get("~nx"))
    return known is None or known > now_ms


#: AsyncLock, and SpinLock and a MultiLock's parts: one lock when they share a name.
KIND = kinds.KindSpec(
    name="lock",
    words="lock",
    parts=(
        kinds.Part("", "hash", "the holder (owner -> holds), ~fence its token, ~n untracked"),
        kinds.Part(FENCE, "hash", "fencing counter: t last issued, r last released, b bound"),
        kinds.Part(WAITING, "zset", "waiting tasks, one per Client, scored by their lapse"),
    ),
    read=_read,
    claims=None,  # the main hash's default: a hash no other kind claims
    wakeups=(":signal",),
    renewals=("renew",),
    release=kinds.Release("lock", "force_release"),
    keys=LockKeys.of,
    not_shown="a waiting Client registers one task (in pub/sub notify mode); its other "
    "waiting tasks, and tasks queued inside the holder's own Client, are not in Redis",
)
