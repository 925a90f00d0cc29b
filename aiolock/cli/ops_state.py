"""What aiolock keeps in Redis for one name, read back as a typed description.

Pure: no I/O. ``aiolock.cli.ops_connect`` reads the keys of a name (``RawName``, one
pipelined round trip: every kind's declared parts) and ``describe`` turns
them into a ``NameState``: one ``Primitive`` per anchor found under that
name (its main key is a lock, fair lock, read-write lock, semaphore or
latch; a Redlock lock of the same name has keys of its own), with its
holders, its waiters and its fencing counter. Nothing here knows a kind:
each kind declares its layout, member formats and reader once, in its
``aiolock/_primitives/<name>_kind.py`` (``aiolock._core.protocol.kinds.KindSpec``,
registered in ``aiolock._primitives.KINDS``); the key names are
``aiolock._core.protocol.keys``'s.

Times: every expiry is given as milliseconds left (``ttl_ms``), counted from
the server clock (``RawName.now_ms``, read in the same round trip), or from
``PTTL``. ``None`` means no expiry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiolock._core.protocol.keys import FENCE
from aiolock._core.protocol.kinds import (
    FOREIGN,
    Description,
    Holder,
    KindSpec,
    RawKey,
    RawName,
    Waiter,
    fence_of,
    ttl,
)
from aiolock._primitives import KINDS

__all__ = [
    "KEY_SUFFIXES",
    "NOT_SHOWN",
    "Holder",
    "KeyInfo",
    "NameState",
    "Primitive",
    "RawKey",
    "RawName",
    "Waiter",
    "describe",
    "glob_match",
    "name_of_key",
]

#: One primitive found under a name, described (``aiolock._core.protocol.kinds``).
Primitive = Description

#: The keys of one name that hold state, by suffix, with the Redis type
#: aiolock writes there: every kind's declared parts (``KINDS``).
KEY_SUFFIXES: dict[str, str] = KINDS.state_suffixes()

#: By kind: the waiters that Redis does not record, so that no command reading
#: Redis (``ls``, ``inspect``, ``top``, ``force-release``) can show them.
NOT_SHOWN: dict[str, str] = {spec.name: spec.not_shown for spec in KINDS if spec.not_shown}


def name_of_key(prefix: str, key: str) -> str | None:
    """The primitive name a key of aiolock's belongs to, or None if it is not one.

    ``<prefix>:{<name>}<suffix>`` with a known suffix (KEY_SUFFIXES, or a
    wake-up list). A name containing ``}`` followed by a known suffix is
    read as the shorter name: such names are ambiguous in the layout itself.
    """
    head = f"{prefix}:{{"
    if not key.startswith(head):
        return None
    rest = key[len(head) :]
    for suffix in sorted(KEY_SUFFIXES, key=len, reverse=True):
        tail = "}" + suffix
        if rest.endswith(tail) and len(rest) > len(tail):
            return rest[: -len(tail)]
    found = KINDS.wakeup.search(rest)
    if found is not None and found.start() > 0:
        return rest[: found.start()]
    return None


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                negate = body[:1] in ("^", "!")
                if negate:
                    body = body[1:]
                body = body.replace("\\", "\\\\")
                out.append(f"[{'^' if negate else ''}{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def glob_match(pattern: str, name: str) -> bool:
    """Whether ``name`` matches the Redis glob ``pattern`` (``*``, ``?``, ``[a-z]``, ``\\``)."""
    return _glob_regex(pattern).match(name) is not None


# --------------------------------------------------------------------------- description


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A key of the name that exists: its name, ``TYPE`` and TTL (ms; None: none)."""

    key: str
    type: str
    ttl_ms: int | None


@dataclass(frozen=True, slots=True)
class NameState:
    """Everything aiolock keeps for one name: its primitives and its keys.

    ``last_token`` / ``last_released``: the name's fencing counter (shared by
    the kinds of its main key; kept ``retention`` after the last use, so it is
    there after a release too), None if absent.
    """

    prefix: str
    name: str
    primitives: tuple[Primitive, ...]
    keys: tuple[KeyInfo, ...]
    last_token: int | None = None
    last_released: int | None = None

    @property
    def exists(self) -> bool:
        return bool(self.keys)


def describe(raw: RawName) -> NameState:
    """The typed description of a name's raw keys (see the module docstring).

    Per anchor (the main key; a Redlock's own key) at most one primitive: the
    kind whose claim its value matches (``KINDS``), read by that kind's
    reader; an anchor holding another type than its kinds write is
    ``foreign``. Expired entries the scripts have not purged yet (a rw hold
    or semaphore holder past its expiry, a lapsed waiting entry) are left
    out, as the scripts would drop them at their next run.
    """
    primitives: list[Primitive] = []
    for suffix, kinds in KINDS.anchors().items():
        found = _anchored(raw, raw.keys.get(suffix), kinds)
        if found is not None:
            primitives.append(found)
    keys = tuple(KeyInfo(k.key, k.type, ttl(k.pttl)) for k in raw.keys.values() if k.type != "none")
    last, released = fence_of(raw, FENCE)
    return NameState(raw.prefix, raw.name, tuple(primitives), keys, last, released)


def _anchored(raw: RawName, anchor: RawKey | None, kinds: tuple[KindSpec, ...]) -> Primitive | None:
    if anchor is None or anchor.type == "none":
        for spec in kinds:
            found: Primitive | None = spec.read(raw, None)
            if found is not None:
                return found
        return None
    if anchor.type != kinds[0].anchor.type or anchor.value is None:
        details = {"type": anchor.type}
        return Primitive(FOREIGN, raw.name, anchor.key, ttl(anchor.pttl), details=details)
    for spec in kinds:
        if spec.claims is None or spec.claims(anchor.value):
            found = spec.read(raw, anchor)
            if found is not None:
                return found
    return None
