"""What a kind of primitive is, declared once: ``KindSpec``, and the registry of them.

A kind is what Redis can tell apart under a name: ``lock`` (AsyncLock, and
SpinLock and a MultiLock's parts, which are that lock), ``fair_lock``,
``rw_lock``, ``semaphore``, ``latch``, ``redlock`` (one master's part of a
Redlock lock). Each kind declares its ``KindSpec`` once, in
``aiolock/_primitives/<name>_kind.py`` beside its class's module (data and
a pure reader: no runtime), and ``aiolock/_primitives/__init__.py`` lists
them (``KINDS``: the one registration). A spec says:

* its **name** (as the command line shows it) and the words that name it in
  sentences;
* its **key layout**: ``parts``, the keys that hold state, by suffix after
  the main key ``<prefix>:{<name>}`` (``_core/protocol/keys.py`` names the suffixes),
  each with the Redis type aiolock writes there and what it holds; the first
  part is its *anchor*, the key whose existence is an instance of the kind
  (kinds with one anchor are one name's one primitive: a name's main key is a
  lock or a fair lock, never both; they may share other parts, such as the
  fencing counter). ``wakeups``: the suffixes (regular expressions) of its
  wake-up lists, which hold no state;
* its **member formats**: ``claims`` (which kind of an anchor a value is;
  the first claim in registration order wins, ``None`` is the anchor's
  default kind) and ``read``, which turns a name's raw keys into a
  ``Description`` (its holders with their Client id, task, role and count,
  its waiters, its fencing counter);
* its **operations**: ``renewals``, the watchdog's renewal scripts of its
  holds and waiters (the scripts say so too: ``--@runner renewal``), and
  ``release``, how ``aiolock force-release`` evicts its holders (the Client
  method that makes it and the script its ``force_release()`` runs), or
  ``cannot_release``, why not;
* how the operator commands word it (``gate``: it counts down instead of
  being held, like a latch; which waiters Redis does not record; the few
  sentences only it needs).

``aiolock ls | inspect | top | force-release`` (``aiolock/cli/ops*.py``)
read these and branch on no kind's name. Pure: no I/O, no import above the
basics.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FOREIGN",
    "Description",
    "Holder",
    "KindSpec",
    "Part",
    "RawKey",
    "RawName",
    "Registry",
    "Release",
    "Waiter",
    "fence_of",
    "left",
    "to_int",
    "ttl",
]


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
    """The keys of one name (by suffix: every kind's ``parts``) and the server clock (ms)."""

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
class Description:
    """One primitive found under a name, described. ``spec``: its kind
    (``kind`` is its name), or ``FOREIGN`` (the anchor holds a value aiolock
    did not write).

    ``held``: somebody holds it (never a gate such as a latch: nobody holds a
    latch, it is counting down or open; see ``state``, one word for all
    outputs); ``waiters``: the waiters Redis records, which are not all that
    wait (``not_shown`` says which are missing for the kind);
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

    spec: KindSpec = field(repr=False)
    name: str
    key: str
    ttl_ms: int | None
    holders: tuple[Holder, ...] = ()
    waiters: tuple[Waiter, ...] = ()
    untracked_waiters: bool = False
    last_token: int | None = None
    last_released: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.spec.name

    @property
    def held(self) -> bool:
        return bool(self.holders)

    @property
    def counting_down(self) -> bool:
        """A gate (latch) whose count is above zero."""
        return self.spec.gate and int(self.details.get("count", 0)) > 0

    @property
    def state(self) -> str:
        """One word for every output: ``held`` or ``free``; a gate (latch)
        ``counting down`` or ``open``; ``foreign`` (a value aiolock did not write)."""
        if self.spec.gate:
            return "counting down" if self.counting_down else "open"
        if self.spec.foreign:
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
        return self.spec.not_shown

    @property
    def waiting(self) -> str:
        """The WAITING column: the waiters Redis records, ``+`` for the lock's
        ``~n`` flag, ``?`` for a kind whose waiters Redis never records."""
        if not self.spec.waiters_recorded:
            return "?"
        return str(len(self.waiters)) + ("+" if self.untracked_waiters else "")


# --------------------------------------------------------------------------- the declaration

#: A kind's reader: its description from a name's raw keys and its anchor's key
#: (None when the anchor is missing: a kind that leaves traces without it, like
#: a Redlock's fencing counter, may still describe them), or None.
Reader = Callable[[RawName, RawKey | None], Description | None]


@dataclass(frozen=True, slots=True)
class Part:
    """One key of a kind that holds state: ``suffix`` after ``<prefix>:{<name>}``
    ("" is the main key), the Redis ``type`` aiolock writes there, and what it ``holds``."""

    suffix: str
    type: str
    holds: str


def _no_args(found: Description) -> tuple[Any, ...]:
    return ()


@dataclass(frozen=True, slots=True)
class Release:
    """How ``aiolock force-release`` evicts a kind's holders: through the library,
    ``client.<factory>(name, *args(found)).force_release()``, which runs ``script``.

    ``done``: the line it prints when it did, given the holders' text (None:
    ``force-released <words> '<name>' held by <holders> (<kept>, waiters woken)``).
    """

    factory: str
    script: str
    args: Callable[[Description], tuple[Any, ...]] = _no_args
    done: Callable[[Description, str], str] | None = None


@dataclass(frozen=True, slots=True)
class KindSpec:
    """Everything the library and the operator commands know of one kind (see
    the module docstring).

    Text: ``summary`` (a first line of ``inspect``, formatted with the
    description's details; a kind with one shows no "free" line),
    ``counter_note`` (a line when the fencing counter is known, formatted
    with ``last_token``), ``holder_note`` (a line when it is held),
    ``holds_counted`` (whether Redis records a hold count per holder).
    ``keys``: its key class's ``of(prefix, name)`` (the names its scripts are
    given; tests/test_keys.py checks they are ``parts``).
    """

    name: str
    words: str
    parts: tuple[Part, ...]
    read: Reader
    claims: Callable[[Mapping[str, str]], bool] | None = None
    wakeups: tuple[str, ...] = ()
    renewals: tuple[str, ...] = ()
    release: Release | None = None
    cannot_release: str = ""
    keys: Callable[[str, str], object] | None = None
    gate: bool = False
    foreign: bool = False
    waiters_recorded: bool = True
    not_shown: str = ""
    holds_counted: bool = True
    summary: str = ""
    counter_note: str = ""
    holder_note: str = ""

    @property
    def anchor(self) -> Part:
        return self.parts[0]


def _unread(raw: RawName, anchor: RawKey | None) -> Description | None:
    return None


#: What the anchor of a kind holds when aiolock did not write it.
FOREIGN = KindSpec("foreign", "key", (), _unread, foreign=True)


class Registry:
    """The kinds, in registration order, checked when made: one name per kind;
    a suffix claimed by several kinds only among kinds of one anchor (one
    name's one primitive) and with one type; at most one default kind
    (``claims=None``) per anchor."""

    def __init__(self, *specs: KindSpec) -> None:
        self._specs = specs
        self._by_name: dict[str, KindSpec] = {}
        self._anchors: dict[str, list[KindSpec]] = {}
        claimed: dict[str, tuple[KindSpec, Part]] = {}
        for spec in specs:
            if not spec.parts:
                raise ValueError(f"kind {spec.name!r}: no anchor")
            if spec.name in self._by_name or spec.name == FOREIGN.name:
                raise ValueError(f"two kinds named {spec.name!r}")
            self._by_name[spec.name] = spec
            self._anchors.setdefault(spec.anchor.suffix, []).append(spec)
            for part in spec.parts:
                if part.suffix in {p.suffix for p in spec.parts if p is not part}:
                    raise ValueError(f"kind {spec.name!r} declares {part.suffix!r} twice")
                other = claimed.setdefault(part.suffix, (spec, part))
                if other[0] is spec:
                    continue
                if other[0].anchor.suffix != spec.anchor.suffix:
                    raise ValueError(
                        f"suffix {part.suffix!r} claimed by kinds {other[0].name!r} and "
                        f"{spec.name!r} of different anchors (two primitives of one name)"
                    )
                if other[1].type != part.type:
                    raise ValueError(
                        f"suffix {part.suffix!r}: a {other[1].type} for {other[0].name!r}, "
                        f"a {part.type} for {spec.name!r}"
                    )
        for suffix, kinds in self._anchors.items():
            if sum(1 for k in kinds if k.claims is None) > 1:
                raise ValueError(f"anchor {suffix!r}: more than one default kind")
            kinds.sort(key=lambda k: k.claims is None)  # claims in order, the default last
        self._wakeup = re.compile(
            r"\}(?:" + "|".join(dict.fromkeys(w for s in specs for w in s.wakeups)) + r")$"
        )

    def __iter__(self) -> Iterator[KindSpec]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __getitem__(self, name: str) -> KindSpec:
        return self._by_name[name]

    def anchors(self) -> dict[str, tuple[KindSpec, ...]]:
        """By anchor suffix (first registered first): its kinds, in the order
        their claims are tried (the default last)."""
        return {suffix: tuple(kinds) for suffix, kinds in self._anchors.items()}

    def state_suffixes(self) -> dict[str, str]:
        """Every key that holds state, by suffix (first declared first), with its type."""
        return {p.suffix: p.type for spec in self._specs for p in spec.parts}

    @property
    def wakeup(self) -> re.Pattern[str]:
        """Matches the tail ``}<suffix>`` of any kind's wake-up list."""
        return self._wakeup


# --------------------------------------------------------------------------- for readers


def ttl(pttl: int) -> int | None:
    """A ``PTTL`` as milliseconds left, None for none (or a missing key)."""
    return None if pttl < 0 else pttl


def to_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def left(expiry_ms: float, now_ms: int) -> int:
    """Milliseconds from the server clock ``now_ms`` to ``expiry_ms`` (0 if past)."""
    return max(int(expiry_ms) - now_ms, 0)


def fence_of(raw: RawName, suffix: str) -> tuple[int | None, int | None]:
    """The fencing counter hash at ``suffix``: (last token issued, last released)."""
    fence = raw.get(suffix, "hash")
    if fence is None:
        return None, None
    return to_int(fence.value.get("t")), to_int(fence.value.get("r"))
