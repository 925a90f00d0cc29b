"""The fair lock kind: FairLock (_primitives/fair.py).

Its declaration (aiolock/_core/protocol/kinds.py): layout, member formats and reader,
operations. Data and a pure reader, no runtime: the operator commands read it
without the primitive's code (registered in aiolock/_primitives/__init__.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .._core.protocol import kinds
from .._core.protocol.keys import FENCE, QUEUE, FairKeys

__all__ = ["KIND"]

# Member formats (scripts/_fair_queue.lua): a holder is a field of the main
# hash, a waiter id ``<client id>:<task serial>:<n>:<n>:<n>:<letter>`` -> its
# hold count, beside ``~fence``; the queue holds waiter ids scored by their
# place (>= 1) and each Client's liveness ``~<client id>`` scored by minus its
# lapse time (ms): a waiter counts while its Client is alive.
_WID = re.compile(r"^([0-9a-f]+):(\d+):\d+:\d+:\d+:[a-z]$")


def _claims(fields: Mapping[str, str]) -> bool:
    return any(_WID.match(f) for f in fields)


def _read(raw: kinds.RawName, main: kinds.RawKey | None) -> kinds.Description | None:
    if main is None:
        return None
    fields: dict[str, str] = main.value
    ttl = kinds.ttl(main.pttl)
    token = kinds.to_int(fields.get("~fence"))
    holders = []
    for f, v in fields.items():
        m = _WID.match(f)
        if m:
            owner, count = f"{m[1]}:{m[2]}", kinds.to_int(v) or 1
            holders.append(kinds.Holder(owner, m[1], int(m[2]), "exclusive", ttl, token, count))
    waiters = []
    q = raw.get(QUEUE, "zset")
    entries = q.value if q else []
    alive = {
        member[1:]: -score
        for member, score in entries
        if member.startswith("~") and -score > raw.now_ms
    }
    for member, score in entries:
        m = _WID.match(member)
        if m and score >= 1 and m[1] in alive:
            owner, lapse = f"{m[1]}:{m[2]}", kinds.left(alive[m[1]], raw.now_ms)
            waiters.append(kinds.Waiter(m[1], "queued", lapse, int(m[2]), owner))
    last, released = kinds.fence_of(raw, FENCE)
    return kinds.Description(
        KIND,
        raw.name,
        main.key,
        ttl,
        tuple(holders),
        tuple(waiters),
        last_token=last,
        last_released=released,
    )


KIND = kinds.KindSpec(
    name="fair_lock",
    words="fair lock",
    parts=(
        kinds.Part("", "hash", "the holder (waiter id -> holds), ~fence its token"),
        kinds.Part(FENCE, "hash", "fencing counter: t last issued, r last released, b bound"),
        kinds.Part(QUEUE, "zset", "the FIFO queue of waiter ids and the Clients' liveness"),
    ),
    read=_read,
    claims=_claims,
    wakeups=(":signal", r":sig:[0-9a-f]+"),
    renewals=("renew", "fair_live"),
    release=kinds.Release("fair_lock", "fair_force_release"),
    keys=FairKeys.of,
)
