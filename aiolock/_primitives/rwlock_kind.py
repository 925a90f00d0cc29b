"""The read-write lock kind: ReadWriteLock (_primitives/rwlock.py).

Its declaration (aiolock/_core/protocol/kinds.py): layout, member formats and reader,
operations. Data and a pure reader, no runtime: the operator commands read it
without the primitive's code (registered in aiolock/_primitives/__init__.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .._core.protocol import kinds
from .._core.protocol.keys import FENCE, READERS_PARKED, RELEASED_TOKENS, WAITING, RWKeys

__all__ = ["KIND"]

# Member formats (scripts/_rw_common.lua): the main hash has ``mode``; the
# writer is ``w`` = ``<client id>:<task serial>`` with ``wx`` its expiry (ms)
# and ``wt`` its token; a reader is ``r:<owner>`` -> its token with
# ``x:<owner>`` its expiry. Waiting writers are ``<owner>#...`` in the waiting
# set, Clients with parked readers their client id in the parked set, each
# scored by its lapse time (ms).
_OWNER = re.compile(r"^([0-9a-f]+):(\d+)$")
_WRITER = re.compile(r"^(([0-9a-f]+):(\d+))#.*$")


def _claims(fields: Mapping[str, str]) -> bool:
    return "mode" in fields


def _read(raw: kinds.RawName, main: kinds.RawKey | None) -> kinds.Description | None:
    if main is None:
        return None
    fields: dict[str, str] = main.value
    now = raw.now_ms
    holders = []
    writer, wx = fields.get("w"), kinds.to_int(fields.get("wx"))
    m = _OWNER.match(writer or "")
    if m and wx is not None and wx > now:
        token = kinds.to_int(fields.get("wt"))
        holders.append(kinds.Holder(m[0], m[1], int(m[2]), "write", wx - now, token))
    for f, v in fields.items():
        if not f.startswith("r:"):
            continue
        owner = f[2:]
        m = _OWNER.match(owner)
        expiry = kinds.to_int(fields.get(f"x:{owner}"))
        if m and expiry is not None and expiry > now:
            token = kinds.to_int(v)
            holders.append(kinds.Holder(owner, m[1], int(m[2]), "read", expiry - now, token))
    waiters = []
    wq = raw.get(WAITING, "zset")
    for member, score in wq.value if wq else ():
        m = _WRITER.match(member)
        if m and score > now:
            waiters.append(kinds.Waiter(m[2], "writer", kinds.left(score, now), int(m[3]), m[1]))
    rq = raw.get(READERS_PARKED, "zset")
    for member, score in rq.value if rq else ():
        if score > now:
            waiters.append(kinds.Waiter(member, "readers", kinds.left(score, now)))
    last, released = kinds.fence_of(raw, FENCE)
    mode = "write" if any(h.role == "write" for h in holders) else "read" if holders else "free"
    return kinds.Description(
        KIND,
        raw.name,
        main.key,
        kinds.ttl(main.pttl),
        tuple(holders),
        tuple(waiters),
        last_token=last,
        last_released=released,
        details={"mode": mode},
    )


KIND = kinds.KindSpec(
    name="rw_lock",
    words="read-write lock",
    parts=(
        kinds.Part("", "hash", "mode; the writer (w, wx, wt); readers (r:<owner>, x:<owner>)"),
        kinds.Part(FENCE, "hash", "fencing counter: t last issued, r last released, b bound"),
        kinds.Part(WAITING, "zset", "waiting writers, one per Client, scored by their lapse"),
        kinds.Part(READERS_PARKED, "zset", "Clients with parked readers, by their lapse"),
        kinds.Part(RELEASED_TOKENS, "list", "recently released tokens"),
    ),
    read=_read,
    claims=_claims,
    wakeups=(":signal", ":wsignal"),
    renewals=("rw_renew", "rw_renew_wait"),
    release=kinds.Release("rw_lock", "rw_force_release"),
    keys=RWKeys.of,
    not_shown="a waiting writer registers only while readers hold the lock, one per "
    "Client (its other writers queue inside it); parked readers are recorded per "
    "Client, not per task",
)
