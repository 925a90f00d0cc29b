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

from dataclasses import dataclass, replace

from .._core.protocol import kinds
from .._core.protocol.keys import FENCE, WAITING, LockKeys, main_key
from . import lock_kind

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
        return cls.rooted(main, notices=f"{main}:obs".encode())


# Member formats: the lock's (lock_kind.py, scripts/acquire.lua) under the
# election's root, plus in the hash ``~v``, the value the leader announced, and
# ``~t``, its term's fencing token (absent until the holder announced: a
# candidate that won the lock but has not announced yet is no leader to
# observers). So the lock's reader reads it, its keys taken from under the root.


def _read(raw: kinds.RawName, main: kinds.RawKey | None) -> kinds.Description | None:
    if main is None:
        return None
    n = len(ELECTION)
    rerooted = {suffix[n:]: key for suffix, key in raw.keys.items() if suffix.startswith(ELECTION)}
    found = lock_kind.KIND.read(replace(raw, keys=rerooted), main)
    if found is None:
        return None
    value = main.value.get("~v")
    announced = "none announced yet" if value is None else repr(value)
    return replace(found, spec=KIND, details={"value": value, "announced": announced})


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
    summary="leader's value: {announced}",
    holds_counted=False,
    not_shown="a waiting Client registers one candidate (in pub/sub notify mode); its "
    "other candidates are not in Redis",
)
