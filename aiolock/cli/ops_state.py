"""What aiolock keeps in Redis for one name, read back as a typed description.

Pure: no I/O. ``aiolock.cli.ops`` reads the keys of a name (``RawName``, one
pipelined round trip) and ``describe`` turns them into a ``NameState``: one
``Primitive`` per kind of primitive found under that name (its main key is a
lock, fair lock, read-write lock, semaphore or latch; a Redlock lock of the
same name has keys of its own), with its holders, its waiters and its fencing
counter. The layouts read here are the ones the scripts document
(aiolock/scripts: acquire.lua and _wake.lua, _fair_queue.lua, _rw_common.lua,
_sem.lua, latch_set.lua, redlock_acquire.lua); the key names are
``aiolock._core.keys``'s.

Times: every expiry is given as milliseconds left (``ttl_ms``), counted from
the server clock (``RawName.now_ms``, read in the same round trip), or from
``PTTL``. ``None`` means no expiry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from aiolock._core.keys import (
    FENCE,
    HOLDERS,
    QUEUE,
    READERS_PARKED,
    REDLOCK,
    REDLOCK_FENCE,
    STATE_SUFFIXES,
    WAITING,
)

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

#: The keys of one name that hold state, by suffix, with the Redis type
#: aiolock writes there: declared once, in the library's key layout.
KEY_SUFFIXES: dict[str, str] = STATE_SUFFIXES
_SIGNAL_SUFFIX = re.compile(r"\}(?::signal|:wsignal|:sig:[0-9a-f]+)$")

_OWNER = re.compile(r"^([0-9a-f]+):(\d+)$")
_WID = re.compile(r"^([0-9a-f]+):(\d+):\d+:\d+:\d+:[a-z]$")
_WAKE_MEMBER = re.compile(r"^(([0-9a-f]+):(\d+))\|\d+\|(\d+)$")
_SEM_MEMBER = re.compile(r"^(\d+)\|(([0-9a-f]+):(\d+)):\d+$")
_RW_WRITER = re.compile(r"^(([0-9a-f]+):(\d+))#.*$")
_REDLOCK_VALUE = re.compile(r"^(([0-9a-f]+):(\d+))\|.*$")


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
    found = _SIGNAL_SUFFIX.search(rest)
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


# --------------------------------------------------------------------------- raw input


@dataclass(frozen=True, slots=True)
class RawKey:
    """One key as read: its ``TYPE``, its ``PTTL`` (ms; -1 no TTL, -2 missing) and value.

    ``value``: a hash as a dict, a zset as ``[(member, score), ...]`` in score
    order, a list as a list, a string as a str; None when missing or when it
    holds another type than aiolock writes there (then ``type`` tells which).
    """

    key: str
    type: str
    pttl: int
    value: Any = None


@dataclass(frozen=True, slots=True)
class RawName:
    """The keys of one name (by suffix, as KEY_SUFFIXES) and the server clock (ms)."""

    prefix: str
    name: str
    now_ms: int
    keys: dict[str, RawKey]

    def get(self, suffix: str, want: str) -> RawKey | None:
        """The key at ``suffix`` if it exists and holds a ``want``, else None."""
        raw = self.keys.get(suffix)
        if raw is None or raw.type != want or raw.value is None:
            return None
        return raw


# --------------------------------------------------------------------------- description


@dataclass(frozen=True, slots=True)
class Holder:
    """One hold. ``owner``: ``<client id>:<task serial>`` of the task Redis records.

    ``role``: ``"exclusive"`` (lock, fair lock, Redlock), ``"write"`` or
    ``"read"`` (rw lock), ``"permits"`` (semaphore). ``count``: the holds
    Redis records for it (1: a Client counts its tasks' re-entries itself);
    ``token``: its fencing token (None where aiolock does not store it per
    hold: semaphore, Redlock); ``permits``: a semaphore holder's permits.
    """

    owner: str
    client_id: str
    task: int
    role: str
    ttl_ms: int | None
    token: int | None = None
    count: int = 1
    permits: int | None = None


@dataclass(frozen=True, slots=True)
class Waiter:
    """A waiter Redis knows of. ``role``: ``"task"`` (a lock's targeted waiter, one
    per Client; the Client's other tasks queue behind it locally), ``"queued"``
    (fair lock, in FIFO order), ``"writer"`` / ``"readers"`` (rw lock: a waiting
    writer / a Client with parked readers), ``"claim"`` (semaphore: the waiter
    that waited longest, ``permits`` it asks for). ``ttl_ms``: until the entry
    lapses unless its Client renews it."""

    client_id: str
    role: str
    ttl_ms: int | None
    task: int | None = None
    owner: str | None = None
    permits: int | None = None


@dataclass(frozen=True, slots=True)
class Primitive:
    """One primitive under a name. ``kind``: ``lock`` (AsyncLock, SpinLock and
    MultiLock parts share it), ``fair_lock``, ``rw_lock``, ``semaphore``,
    ``latch``, ``redlock`` (this server's part), or ``foreign`` (the main key
    holds a value aiolock did not write).

    ``held``: somebody holds it (never a latch: nobody holds a latch, it
    is counting down or open; see ``state``, one word for all outputs);
    ``waiters``: the waiters Redis records, which are not all that wait
    (``not_shown`` says which are missing for the kind);
    ``untracked_waiters``: a lock's ``~n`` flag: during the current hold a
    task that does not register (list or poll notify mode, a spin lock, a
    multi lock) found it busy and was going to wait, and its next try is not
    overdue (``~nx``; a flag carried to a new hold has none and counts until
    that hold ends). A try that will not wait sets no flag;
    ``last_token``: the fencing counter (the last token issued, or for a
    Redlock the highest accepted here; None if it expired: tokens still
    increase, floored by the server clock); ``last_released``: the last
    released token; ``details``: kind-specific figures (semaphore
    ``permits`` and ``in_use``, latch ``count`` and ``generation``, rw
    ``mode``, foreign ``type``).
    """

    name: str
    kind: str
    key: str
    ttl_ms: int | None
    holders: tuple[Holder, ...] = ()
    waiters: tuple[Waiter, ...] = ()
    untracked_waiters: bool = False
    last_token: int | None = None
    last_released: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return bool(self.holders)

    @property
    def counting_down(self) -> bool:
        """A latch whose count is above zero."""
        return self.kind == "latch" and int(self.details.get("count", 0)) > 0

    @property
    def state(self) -> str:
        """One word for every output: ``held`` or ``free``; a latch ``counting
        down`` or ``open``; ``foreign`` (a value aiolock did not write)."""
        if self.kind == "latch":
            return "counting down" if self.counting_down else "open"
        if self.kind == "foreign":
            return "foreign"
        return "held" if self.held else "free"

    @property
    def contended(self) -> bool:
        """Redis records a waiter (or the lock's ``~n`` flag)."""
        return bool(self.waiters) or self.untracked_waiters

    @property
    def active(self) -> bool:
        """Shown by ``ls`` and ``top``: held, contended or counting down."""
        return self.held or self.contended or self.counting_down

    @property
    def not_shown(self) -> str:
        """Which waiters of this kind Redis does not record ("" if it records all)."""
        return NOT_SHOWN.get(self.kind, "")

    @property
    def waiting(self) -> str:
        """The WAITING column: the waiters Redis records, ``+`` for the lock's
        ``~n`` flag, ``?`` for a kind whose waiters Redis never records."""
        if self.kind in ("latch", "redlock"):
            return "?"
        return str(len(self.waiters)) + ("+" if self.untracked_waiters else "")


#: By kind: the waiters that Redis does not record, so that no command reading
#: Redis (``ls``, ``inspect``, ``top``, ``force-release``) can show them.
NOT_SHOWN: dict[str, str] = {
    "lock": "a waiting Client registers one task (in pub/sub notify mode); its other "
    "waiting tasks, and tasks queued inside the holder's own Client, are not in Redis",
    "rw_lock": "a waiting writer registers only while readers hold the lock, one per "
    "Client (its other writers queue inside it); parked readers are recorded per "
    "Client, not per task",
    "semaphore": "only the waiter that has waited longest (its claim) is recorded; "
    "the other waiters are not in Redis",
    "latch": "tasks in wait() are not recorded in Redis",
    "redlock": "its waiters are not recorded in Redis",
}


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


def _ttl(pttl: int) -> int | None:
    return None if pttl < 0 else pttl


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _left(expiry_ms: float, now_ms: int) -> int:
    return max(int(expiry_ms) - now_ms, 0)


def describe(raw: RawName) -> NameState:
    """The typed description of a name's raw keys (see the module docstring).

    Expired entries the scripts have not purged yet (a rw hold or semaphore
    holder past its expiry, a lapsed waiting entry) are left out, as the
    scripts would drop them at their next run.
    """
    primitives: list[Primitive] = []
    main = raw.keys.get("")
    if main is not None and main.type != "none":
        primitives.append(_main_primitive(raw, main))
    redlock = _redlock(raw)
    if redlock is not None:
        primitives.append(redlock)
    keys = tuple(
        KeyInfo(k.key, k.type, _ttl(k.pttl)) for k in raw.keys.values() if k.type != "none"
    )
    last, released = _fence(raw)
    return NameState(raw.prefix, raw.name, tuple(primitives), keys, last, released)


def _fence(raw: RawName, suffix: str = FENCE) -> tuple[int | None, int | None]:
    fence = raw.get(suffix, "hash")
    if fence is None:
        return None, None
    return _int(fence.value.get("t")), _int(fence.value.get("r"))


def _main_primitive(raw: RawName, main: RawKey) -> Primitive:
    if main.type != "hash" or main.value is None:
        return Primitive(
            raw.name, "foreign", main.key, _ttl(main.pttl), details={"type": main.type}
        )
    fields: dict[str, str] = main.value
    if "mode" in fields:
        return _rw_lock(raw, main, fields)
    if "n" in fields:
        return _semaphore(raw, main, fields)
    if "c" in fields or "g" in fields:
        return Primitive(
            raw.name,
            "latch",
            main.key,
            _ttl(main.pttl),
            details={"count": _int(fields.get("c")) or 0, "generation": _int(fields.get("g")) or 0},
        )
    if any(_WID.match(f) for f in fields):
        return _fair_lock(raw, main, fields)
    return _lock(raw, main, fields)


def _lock(raw: RawName, main: RawKey, fields: dict[str, str]) -> Primitive:
    ttl = _ttl(main.pttl)
    token = _int(fields.get("~fence"))
    holders = []
    for f, v in fields.items():
        m = _OWNER.match(f)
        if m:
            holders.append(Holder(f, m[1], int(m[2]), "exclusive", ttl, token, _int(v) or 1))
    waiters = []
    wq = raw.get(WAITING, "zset")
    for member, score in wq.value if wq else ():
        m = _WAKE_MEMBER.match(member)
        if m and score > raw.now_ms:
            waiters.append(Waiter(m[2], "task", _left(score, raw.now_ms), int(m[3]), m[1]))
    last, released = _fence(raw)
    return Primitive(
        raw.name,
        "lock",
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
    known = _int(fields.get("~nx"))
    return known is None or known > now_ms


def _fair_lock(raw: RawName, main: RawKey, fields: dict[str, str]) -> Primitive:
    ttl = _ttl(main.pttl)
    token = _int(fields.get("~fence"))
    holders = []
    for f, v in fields.items():
        m = _WID.match(f)
        if m:
            holders.append(
                Holder(f"{m[1]}:{m[2]}", m[1], int(m[2]), "exclusive", ttl, token, _int(v) or 1)
            )
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
            owner = f"{m[1]}:{m[2]}"
            waiters.append(Waiter(m[1], "queued", _left(alive[m[1]], raw.now_ms), int(m[2]), owner))
    last, released = _fence(raw)
    return Primitive(
        raw.name,
        "fair_lock",
        main.key,
        ttl,
        tuple(holders),
        tuple(waiters),
        last_token=last,
        last_released=released,
    )


def _rw_lock(raw: RawName, main: RawKey, fields: dict[str, str]) -> Primitive:
    now = raw.now_ms
    holders = []
    writer, wx = fields.get("w"), _int(fields.get("wx"))
    m = _OWNER.match(writer or "")
    if m and wx is not None and wx > now:
        holders.append(Holder(m[0], m[1], int(m[2]), "write", wx - now, _int(fields.get("wt"))))
    for f, v in fields.items():
        if not f.startswith("r:"):
            continue
        owner = f[2:]
        m = _OWNER.match(owner)
        expiry = _int(fields.get(f"x:{owner}"))
        if m and expiry is not None and expiry > now:
            holders.append(Holder(owner, m[1], int(m[2]), "read", expiry - now, _int(v)))
    waiters = []
    wq = raw.get(WAITING, "zset")
    for member, score in wq.value if wq else ():
        m = _RW_WRITER.match(member)
        if m and score > now:
            waiters.append(Waiter(m[2], "writer", _left(score, now), int(m[3]), m[1]))
    rq = raw.get(READERS_PARKED, "zset")
    for member, score in rq.value if rq else ():
        if score > now:
            waiters.append(Waiter(member, "readers", _left(score, now)))
    last, released = _fence(raw)
    mode = "write" if any(h.role == "write" for h in holders) else "read" if holders else "free"
    return Primitive(
        raw.name,
        "rw_lock",
        main.key,
        _ttl(main.pttl),
        tuple(holders),
        tuple(waiters),
        last_token=last,
        last_released=released,
        details={"mode": mode},
    )


def _semaphore(raw: RawName, main: RawKey, fields: dict[str, str]) -> Primitive:
    now = raw.now_ms
    holders = []
    h = raw.get(HOLDERS, "zset")
    for member, score in h.value if h else ():
        m = _SEM_MEMBER.match(member)
        if m and score > now:
            holders.append(
                Holder(m[2], m[3], int(m[4]), "permits", _left(score, now), permits=int(m[1]))
            )
    waiters = []
    claimant, lapse = fields.get("c"), _int(fields.get("ce"))
    m = _SEM_MEMBER.match(claimant or "")
    if m and lapse is not None and lapse > now:
        waiters.append(Waiter(m[3], "claim", lapse - now, int(m[4]), m[2], _int(fields.get("ck"))))
    last, _ = _fence(raw)
    return Primitive(
        raw.name,
        "semaphore",
        main.key,
        _ttl(main.pttl),
        tuple(holders),
        tuple(waiters),
        last_token=last,
        details={
            "permits": _int(fields.get("n")) or 0,
            "in_use": sum(x.permits or 0 for x in holders),
        },
    )


def _redlock(raw: RawName) -> Primitive | None:
    lock = raw.keys.get(REDLOCK)
    fence = raw.get(REDLOCK_FENCE, "hash")
    if (lock is None or lock.type == "none") and fence is None:
        return None
    last = _int(fence.value.get("t")) if fence else None
    key = lock.key if lock is not None else f"{raw.prefix}:{{{raw.name}}}:rl"
    if lock is None or lock.type == "none":
        return Primitive(raw.name, "redlock", key, None, last_token=last)
    if lock.type != "string" or lock.value is None:
        return Primitive(raw.name, "foreign", key, _ttl(lock.pttl), details={"type": lock.type})
    holders = []
    m = _REDLOCK_VALUE.match(lock.value)
    if m:
        holders.append(Holder(m[1], m[2], int(m[3]), "exclusive", _ttl(lock.pttl)))
    return Primitive(raw.name, "redlock", key, _ttl(lock.pttl), tuple(holders), last_token=last)
