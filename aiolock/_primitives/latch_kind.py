"""The latch kind: Latch (_primitives/latch.py).

Its declaration (aiolock/_core/protocol/kinds.py): layout, member formats and reader,
operations. Data and a pure reader, no runtime: the operator commands read it
without the primitive's code (registered in aiolock/_primitives/__init__.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from .._core.protocol import kinds
from .._core.protocol.keys import LatchKeys

__all__ = ["KIND"]

# Member format (scripts/latch_set.lua, latch_down.lua): one hash, ``c`` its
# count, ``g`` how many times it opened. Nobody holds a latch (a gate): it is
# counting down or open.


def _claims(fields: Mapping[str, str]) -> bool:
    return "c" in fields or "g" in fields


def _read(raw: kinds.RawName, main: kinds.RawKey | None) -> kinds.Description | None:
    if main is None:
        return None
    count, generation = (kinds.to_int(main.value.get(f)) or 0 for f in ("c", "g"))
    details = {"count": count, "generation": generation}
    return kinds.Description(KIND, raw.name, main.key, kinds.ttl(main.pttl), details=details)


KIND = kinds.KindSpec(
    name="latch",
    words="latch",
    parts=(kinds.Part("", "hash", "the count (c) and how many times it opened (g)"),),
    read=_read,
    claims=_claims,
    wakeups=(":signal",),
    cannot_release="count_down() opens it",
    keys=LatchKeys.of,
    gate=True,
    waiters_recorded=False,
    not_shown="tasks in wait() are not recorded in Redis",
)
