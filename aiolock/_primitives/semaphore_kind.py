"""The semaphore kind: Semaphore (_primitives/semaphore.py).

Its declaration (aiolock/_core/protocol/kinds.py): layout, member formats and reader,
operations. Data and a pure reader, no runtime: the operator commands read it
without the primitive's code (registered in aiolock/_primitives/__init__.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .._core.protocol import kinds
from .._core.protocol.keys import FENCE, HOLDERS, RELEASED, SemaphoreKeys

__all__ = ["KIND"]

# Member formats (scripts/_sem.lua): the main hash has ``n`` (N) and the claim
# of the waiter that waited longest (``c`` its member, ``ce`` its lapse time,
# ``ck`` the permits it asks for); a holder is a member
# ``<permits>|<client id>:<task serial>:<n>`` of the holders set, scored by its
# expiry (ms).
_MEMBER = re.compile(r"^(\d+)\|(([0-9a-f]+):(\d+)):\d+$")


def _claims(fields: Mapping[str, str]) -> bool:
    return "n" in fields


def _read(raw: kinds.RawName, main: kinds.RawKey | None) -> kinds.Description | None:
    if main is None:
        return None
    fields: dict[str, str] = main.value
    now = raw.now_ms
    holders = []
    h = raw.get(HOLDERS, "zset")
    for member, score in h.value if h else ():
        m = _MEMBER.match(member)
        if m and score > now:
            left, permits = kinds.left(score, now), int(m[1])
            holders.append(kinds.Holder(m[2], m[3], int(m[4]), "permits", left, permits=permits))
    waiters = []
    claimant, lapse = fields.get("c"), kinds.to_int(fields.get("ce"))
    m = _MEMBER.match(claimant or "")
    if m and lapse is not None and lapse > now:
        asks = kinds.to_int(fields.get("ck"))
        waiters.append(kinds.Waiter(m[3], "claim", lapse - now, int(m[4]), m[2], asks))
    last, _ = kinds.fence_of(raw, FENCE)
    return kinds.Description(
        KIND,
        raw.name,
        main.key,
        kinds.ttl(main.pttl),
        tuple(holders),
        tuple(waiters),
        last_token=last,
        details={
            "permits": kinds.to_int(fields.get("n")) or 0,
            "in_use": sum(x.permits or 0 for x in holders),
        },
    )


def _permits(found: kinds.Description) -> tuple[int]:
    # N as found (any N would do: force_release never writes N).
    return (int(found.details.get("permits") or 1),)


def _released(found: kinds.Description, holders: str) -> str:
    in_use = int(found.details.get("in_use") or 0)
    return (
        f"force-released semaphore {found.name!r}: {in_use} permit{'s' if in_use != 1 else ''} "
        f"held by {holders} returned (N and fencing counter kept, waiters woken)"
    )


KIND = kinds.KindSpec(
    name="semaphore",
    words="semaphore",
    parts=(
        kinds.Part("", "hash", "N (n) and the longest waiter's claim (c, ce, ck)"),
        kinds.Part(HOLDERS, "zset", "holders, <permits>|<owner>:<n>, scored by their expiry"),
        kinds.Part(RELEASED, "zset", "recently released holds"),
        kinds.Part(FENCE, "hash", "fencing counter: t last issued"),
    ),
    read=_read,
    claims=_claims,
    wakeups=(":signal",),
    renewals=("sem_renew",),
    release=kinds.Release("semaphore", "sem_force_release", _permits, _released),
    keys=SemaphoreKeys.of,
    not_shown="only the waiter that has waited longest (its claim) is recorded; "
    "the other waiters are not in Redis",
    summary="{in_use} of {permits} permits in use",
    holder_note="(a semaphore keeps no fencing token per holder)",
)
