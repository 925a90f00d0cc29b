"""Handing a hold to another Client: ``lease.handle`` and ``client.adopt(handle)``.

The handle is url-safe base64 (no padding) of a small versioned JSON object:
the kind, the Client's key prefix, the name, the hold's identity in Redis
(its holder field or member), its fencing token, whether the watchdog
renews it, its lease, and the id of the Client that made it. No secret is
in it (no password, no URL); whoever has a handle and reaches the server
may take the hold, as whoever reaches the server may force-release it.

How the giver learns (it may be in another process): the adopt script
(``adopt.lua`` and its kin) moves the hold to the new holder in one step
and writes a record "<old identity> -> token" into ``<prefix>:{<name>}:handed``
(same hash slot; it expires a while after the hold). The giver's Client
only looks there for holds whose handle it gave out (``exported``): when it
finds such a hold gone (a renewal, a release, an extend, a fixed lease's
end), it asks ``handed.lua`` once before deciding. Handed over: its leases
report ``released`` (not lost: no LockLostError, no loss counted, no
``on_lost`` callback), and it stops renewing. Otherwise it is lost as
before. Holds whose handle was never taken cost nothing more.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import weakref
from collections.abc import Awaitable
from typing import Any, NamedTuple, Protocol

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..protocol.keys import main_key

__all__ = [
    "ADOPTABLE",
    "Handle",
    "decode",
    "exported",
    "handed_key",
    "handle_of",
    "released_or_lost",
]

log = logging.getLogger("aiolock.lease")

#: The handle format's version (its "v").
VERSION = 1
#: The kinds whose holds can be handed over (one owner per hold).
ADOPTABLE = frozenset({"lock", "spin_lock", "fair_lock", "write_lock", "semaphore"})
#: Why the others cannot.
REFUSED = {
    "read_lock": "a read hold is one of many shared ones",
    "redlock": "a Redlock hold lives on several masters",
    "multi_lock": "a multi-lock is several holds",
    "election": "a term is resigned, never handed over",
}


class Handle(NamedTuple):
    """A decoded handle (see the module doc)."""

    kind: str
    prefix: str
    name: str
    holder: str
    token: int
    watchdog: bool
    lease: float
    client: str
    permits: int = 0  # a semaphore permit's count
    default_n: int = 0  # the semaphore's N, as its Client gives it on first use
    #: The token of the hold's entry in Redis, if not ``token``: a lock passed
    #: on locally (cohort handoff) keeps the entry of the hold it came from.
    redis_token: int = 0

    @property
    def entry_token(self) -> int:
        """The fencing token the hold's entry in Redis carries."""
        return self.redis_token or self.token

    @property
    def record(self) -> str:
        """The hold's entry in the handed hash (what handed.lua is asked)."""
        return f"w|{self.holder}" if self.kind == "write_lock" else self.holder


def handed_key(prefix: str, name: str) -> str:
    """``<prefix>:{<name>}:handed``: the records of holds handed over."""
    return main_key(prefix, name) + ":handed"


class _HoldLike(Protocol):
    kind: str
    name: str
    owner: str
    token: int
    watchdog: bool
    lease: float
    renew_args: tuple[Any, ...]
    release_args: tuple[Any, ...]
    reserve: int
    engine: Any


# hold -> (its handed key, its record, its entry's token): the holds whose
# handle was given out.
_exported: weakref.WeakKeyDictionary[Any, tuple[str, str, int]] = weakref.WeakKeyDictionary()
# holds whose "handed or lost?" question is on its way
_asking: weakref.WeakSet[Any] = weakref.WeakSet()


def handle_of(hold: _HoldLike) -> str:
    """The handle of ``hold`` (``Lease.handle``); marks it exported."""
    kind = hold.kind
    if kind not in ADOPTABLE:
        why = REFUSED.get(kind, "its holds have no single owner")
        raise InvalidArgumentError(f"{kind.replace('_', ' ')} holds cannot be handed over: {why}")
    prefix = getattr(hold.engine, "prefix", None)
    client = getattr(hold.engine, "id", None)
    if not isinstance(prefix, str) or not isinstance(client, str):
        raise InvalidArgumentError(f"{kind} {hold.name!r}: this hold cannot be handed over")
    permits = default_n = 0
    entry_token = hold.token
    if kind == "write_lock":
        holder, entry_token = str(hold.renew_args[1]), int(hold.renew_args[2])
    elif kind == "semaphore":
        holder = str(hold.renew_args[0])
        permits = int(holder.split("|", 1)[0])
        default_n = int(hold.release_args[1])
    else:
        holder, entry_token = str(hold.renew_args[0]), int(hold.renew_args[1])
    handle = Handle(
        kind,
        prefix,
        hold.name,
        holder,
        hold.token,
        hold.watchdog,
        hold.lease,
        client,
        permits,
        default_n,
        entry_token if entry_token != hold.token else 0,
    )
    # No more local handoffs of this entry without a round trip (cohort
    # passes reuse it): a later holder's entry changes in Redis, so this
    # handle goes stale instead of taking the hold from that holder.
    hold.reserve = 0
    _exported[hold] = (handed_key(prefix, hold.name), handle.record, entry_token)
    body = {
        "v": VERSION,
        "k": handle.kind,
        "p": handle.prefix,
        "n": handle.name,
        "h": handle.holder,
        "t": handle.token,
        "w": handle.watchdog,
        "l": handle.lease,
        "c": handle.client,
    }
    if permits:
        body["s"], body["N"] = permits, default_n
    if handle.redis_token:
        body["r"] = handle.redis_token
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode(handle: object) -> Handle:
    """A handle's content, checked: InvalidArgumentTypeError (not a str) or
    InvalidArgumentError (malformed) before any round trip."""
    if not isinstance(handle, str):
        raise InvalidArgumentTypeError(
            f"adopt() takes the str of lease.handle, got {type(handle).__name__}"
        )

    def bad(why: str) -> InvalidArgumentError:
        shown = handle if len(handle) <= 40 else handle[:37] + "..."
        return InvalidArgumentError(f"not a handle of aiolock ({why}): {shown!r}")

    if not handle or len(handle) > 8192:
        raise bad("empty or too long")
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        body = json.loads(raw.decode())
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad("not base64 of JSON") from None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise bad(f"not version {VERSION}")
    kind, prefix, name, holder = body.get("k"), body.get("p"), body.get("n"), body.get("h")
    token, watchdog, lease, client = body.get("t"), body.get("w"), body.get("l"), body.get("c")
    permits, default_n, redis_token = body.get("s", 0), body.get("N", 0), body.get("r", 0)
    if kind not in ADOPTABLE:
        raise bad(f"kind {kind!r}")
    for what, value in (("prefix", prefix), ("name", name), ("holder", holder), ("client", client)):
        if not isinstance(value, str) or not value:
            raise bad(f"no {what}")
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise bad("no fencing token")
    if not isinstance(watchdog, bool):
        raise bad("no lease mode")
    if (
        isinstance(lease, bool)
        or not isinstance(lease, int | float)
        or not math.isfinite(lease)
        or lease <= 0
    ):
        raise bad("no lease")
    if isinstance(permits, bool) or not isinstance(permits, int) or permits < 0:
        raise bad("bad permits")
    if isinstance(default_n, bool) or not isinstance(default_n, int) or default_n < 0:
        raise bad("bad permits")
    if isinstance(redis_token, bool) or not isinstance(redis_token, int) or redis_token < 0:
        raise bad("bad entry token")
    if kind == "semaphore" and not (permits and default_n):
        raise bad("no permits")
    assert isinstance(prefix, str) and isinstance(name, str)
    assert isinstance(holder, str) and isinstance(client, str)
    return Handle(
        kind,
        prefix,
        name,
        holder,
        token,
        watchdog,
        float(lease),
        client,
        permits,
        default_n,
        redis_token,
    )


def exported(hold: object) -> bool:
    """Whether ``hold``'s handle was given out (then its end is asked about)."""
    return hold in _exported


class _Asker(Protocol):
    def spawn(self, coro: Any) -> asyncio.Task[Any]: ...

    def eval(self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]) -> Awaitable[Any]: ...


async def released_or_lost(hold: Any) -> bool:
    """Ask Redis whether ``hold`` (found gone) was handed over: True (and it
    is forgotten here), or False (lost; also when Redis cannot answer)."""
    entry = _exported.pop(hold, None)
    if entry is None:
        return False
    engine: _Asker = hold.engine
    key, record, token = entry
    try:
        return int(await engine.eval("handed", (key,), (record, token))) == 1
    except Exception as exc:  # (unknown: lost, as a hold nobody can confirm)
        log.debug("%s %r: could not ask whether it was handed over: %r", hold.kind, hold.name, exc)
        return False


def check_gone(hold: Any, reason: str) -> None:
    """``Hold.gone`` of an exported hold: stop renewing it, then ask whether it
    was handed over (released) or not (lost, with ``reason``)."""
    if hold in _asking:
        return
    _asking.add(hold)
    hold.engine.untrack(hold)

    async def ask() -> None:
        try:
            handed = await released_or_lost(hold)
        finally:
            _asking.discard(hold)
        if handed:
            hold.handed_over()
        else:
            hold.mark_lost(reason)

    hold.engine.spawn(ask())
