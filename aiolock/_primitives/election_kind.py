"""The election kind: Election (_primitives/election.py), a lock of its own kind
underneath, whose hash also carries the leader's announced value.

Its key class (``ElectionKeys``: the lock's layout under ``<prefix>:{<name>}:el``,
so that an election and a plain lock of one name are two things) and its
declaration (aiolock/_core/protocol/kinds.py): layout, member formats and
reader, operations. Data and a pure reader, no runtime: the operator
commands read it without the primitive's code (registered in
aiolock/_primitives/__init__.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._core.protocol import kinds
from .._core.protocol.keys import FENCE, WAITING, LockKeys, main_key

__all__ = ["ELECTION", "KIND", "ElectionKeys"]

#: The suffix of an election's lock hash after ``<prefix>:{<name>}``; its other
#: keys are the lock's suffixes after it (``:el:fence``, ``:el:wq``).
ELECTION = ":el"


@dataclass(frozen=True, slots=True)
class ElectionKeys(LockKeys):
    """An election's names: a plain lock's (``LockKeys``: the lock scripts run on
    them unchanged) rooted at ``<prefix>:{<name>}:el``, and ``notices``: the
    channel on which every change of leader is announced ("*", see
    scripts/election_*.lua); its observers listen there."""

    notices: bytes

    @classmethod
    def of(cls, prefix: str, name: str) -> ElectionKeys:
        main = main_key(prefix, name) + ELECTION
        fence, wq, signal = main + FENCE, main + WAITING, f"{main}:signal"
        return cls(
            main=main,
            channel=f"{main}:ch".encode(),
            signal=signal,
            fence=fence,
            wq=wq,
            wait_prefix=f"{main}:w:",
            acquire=(main, fence, wq, signal),
            free=(main, fence, signal, wq),
            multi=(main, fence, wq, signal),
            notices=f"{main}:obs".encode(),
        )


# Member formats (the lock's, scripts/acquire.lua, plus election_proclaim.lua):
# a holder is a field ``<client id>:<task serial>`` of the hash; ``~v`` is the
# value the leader announced and ``~t`` its term's fencing token (absent until
# the holder announced: a candidate that won the lock but has not announced
# yet is no leader to observers); a waiter is a member of the waiting set.
_OWNER = re.compile(r"^([0-9a-f]+):(\d+)$")
_WAKE_MEMBER = re.compile(r"^(([0-9a-f]+):(\d+))\|\d+\|(\d+)$")


def _read(raw: kinds.RawName, main: kinds.RawKey | None) -> kinds.Description | None:
    if main is None:
        return None
    fields: dict[str, str] = main.value
    ttl = kinds.ttl(main.pttl)
    token = kinds.to_int(fields.get("~t")) or kinds.to_int(fields.get("~fence"))
    holders = []
    for f in fields:
        m = _OWNER.match(f)
        if m:
            holders.append(kinds.Holder(f, m[1], int(m[2]), "exclusive", ttl, token))
    waiters = []
    wq = raw.get(ELECTION + WAITING, "zset")
    for member, score in wq.value if wq else ():
        m = _WAKE_MEMBER.match(member)
        if m and score > raw.now_ms:
            lapse = kinds.left(score, raw.now_ms)
            waiters.append(kinds.Waiter(m[2], "task", lapse, int(m[3]), m[1]))
    last, released = kinds.fence_of(raw, ELECTION + FENCE)
    details = {"value": fields["~v"]} if "~v" in fields else {}
    return kinds.Description(
        KIND,
        raw.name,
        main.key,
        ttl,
        tuple(holders),
        tuple(waiters),
        last_token=last,
        last_released=released,
        details=details,
    )


KIND = kinds.KindSpec(
    name="election",
    words="election",
    parts=(
        kinds.Part(ELECTION, "hash", "the leader (owner -> 1), ~v its value, ~t its term"),
        kinds.Part(ELECTION + FENCE, "hash", "fencing counter: t last issued, r last released"),
        kinds.Part(ELECTION + WAITING, "zset", "waiting candidates, one per Client"),
    ),
    read=_read,
    wakeups=(ELECTION + ":signal",),
    renewals=("renew",),
    release=kinds.Release("election", "force_release"),
    keys=ElectionKeys.of,
    not_shown="a waiting Client registers one candidate (in pub/sub notify mode); its "
    "other candidates are not in Redis",
)
