"""How a Client hears at once that a hold of its was force-released.

A force release (``force_release()`` of every primitive, ``aiolock
force-release``) deletes holds that other Clients may still believe they
have. Its script publishes, to each evicted holder's Client, a message on
that Client's *eviction channel* (scripts/_evict.lua):

* standalone: ``<prefix>:lost:<client id>``, one channel per Client;
* cluster mode: ``<prefix>:{<tag>}:lost:<client id>`` with ``<tag>`` a hash
  tag of the evicted name's slot (``slot_tag``), since a script's SPUBLISH
  must stay in its slot: one channel per Client and slot it holds in.

A Client subscribes its channel when it takes its first hold (in cluster
mode: its first hold in a slot) and keeps it until it is closed: no command
per acquire or release, one subscription per Client (per slot). Only in the
``pubsub`` notify mode (the others are for servers without pub/sub).

The message ``x <bound> <side> <key>`` marks lost each hold of this Client
renewed at ``key`` with a fencing token ``<= bound`` (the last token issued
for the name when it was deleted: a newer hold has a larger one), of the
side named (``w``/``r``: a read-write lock's writer or readers, ``*``: any).
Its lease is then lost as the watchdog would report it: ``async with``
bodies are cancelled and raise ``LockLostError`` (DESIGN.md). Evictions are
remembered an interval, so that a hold made after its message arrived (a
grant on its way) is caught as it is made. ``v <value>`` is for Redlock
(its handler counts the masters that deleted the hold).

What cannot be heard (a hold taken before the channel was confirmed, list
or poll mode) is caught by the watchdog, which checks every hold, fixed
leases too, every ``lease / 3`` (watchdog.py). A pub/sub connection lost
(messages missed meanwhile) has every hold verified at once (verifier.py,
the listener's ``on_reset``), as has a slot map change that moves a
channel to another node (cluster mode: ``Engine._start_cluster``).
"""

from __future__ import annotations

import asyncio
import binascii
from collections.abc import Callable
from typing import Any, Protocol

from ..protocol.keys import lost_prefix
from ..protocol.slots import slot_of
from ..waiting.channel import WAKE_ALL, Channel, Subscriber
from ..waiting.listener import Listener
from .lease import Hold
from .watchdog import Watchdog

__all__ = ["FORCE_RELEASED", "Evictions", "slot_tag"]

#: The lost reason of a hold whose Client was told of its force release (the
#: same as for a hold this Client force-released itself: either may come first).
FORCE_RELEASED = "force-released"

# slot_tag: a 4-letter tag "[@-O]{4}" per cluster slot. CRC16 (XMODEM, init 0)
# is linear over GF(2): crc(base ^ d) = crc(base) ^ crc(d) for strings of one
# length, so the tag's two halves are looked up meet-in-the-middle.
_LETTERS = b"@ABCDEFGHIJKLMNO"  # low nibble free, high nibble fixed: no "{" or "}"
_BASE = binascii.crc_hqx(b"@@@@", 0)
_HIGH: dict[int, tuple[int, int]] = {}
_LOW: list[tuple[int, int, int]] = []
_TAGS: dict[int, str] = {}


def slot_tag(slot: int) -> str:
    """A hash tag whose cluster slot is ``slot`` (computed once per slot)."""
    tag = _TAGS.get(slot)
    if tag is not None:
        return tag
    if not _LOW:
        for a in range(16):
            for b in range(16):
                _HIGH.setdefault(binascii.crc_hqx(bytes((a, b, 0, 0)), 0), (a, b))
                _LOW.append((binascii.crc_hqx(bytes((0, 0, a, b)), 0), a, b))
    for top in range(4):
        want = (slot | top << 14) ^ _BASE
        for crc, c, d in _LOW:
            high = _HIGH.get(want ^ crc)
            if high is not None:
                tag = bytes(_LETTERS[n] for n in (*high, c, d)).decode()
                _TAGS[slot] = tag
                return tag
    raise AssertionError(f"no hash tag found for slot {slot}")  # (none: tests cover all)


class EvictionEngine(Protocol):
    """What ``Evictions`` needs of its engine (``Engine``, structurally)."""

    prefix: str
    id: str
    watchdog: Watchdog

    @property
    def notify(self) -> str: ...

    @property
    def listener(self) -> Listener | Subscriber: ...

    @property
    def topology(self) -> Any: ...

    async def is_cluster(self) -> bool: ...


class Evictions:
    """The eviction channels of one Client, and what their messages do."""

    __slots__ = ("_channels", "_listener", "_recent", "_slots", "engine", "values")

    def __init__(self, engine: EvictionEngine) -> None:
        self.engine = engine
        self._channels: dict[bytes, Channel] = {}
        self._listener: object = None  # the listener they are registered with
        # The slots whose own channel is registered (-1: standalone, one channel).
        self._slots: set[int] = set()
        # key -> (bound, side, loop time): evictions heard in the last interval.
        self._recent: dict[str, tuple[int, str, float]] = {}
        #: Redlock: hold value -> called with this object on "v <value>".
        self.values: dict[str, Callable[[Evictions], None]] = {}

    @property
    def active(self) -> int:
        """The eviction channels registered (no task waits on them: statistics()
        leave them out of ``subscriptions``)."""
        return len(self._channels) if self._listener is self.engine.listener else 0

    async def template(self, key: str) -> str:
        """The eviction channel template a force release of ``key`` passes its
        script (the mode is found out first: the template depends on it)."""
        engine = self.engine
        if not await engine.is_cluster():
            return lost_prefix(engine.prefix)
        return lost_prefix(engine.prefix, slot_tag(slot_of(key)))

    @property
    def recent(self) -> bool:
        """Force releases told recently (their keys and tokens, see ``watch``)."""
        return bool(self._recent)

    def watch(self, hold: Hold) -> None:
        """A new hold of this Client: make sure its eviction channel is subscribed
        (nothing to do but a check, after the first). Called by ``Holds.track``."""
        if self._recent:
            self._check_recent(hold)
        engine = self.engine
        if engine.notify != "pubsub":
            return
        listener = engine.listener
        if engine.topology is None:
            if self._listener is listener and -1 in self._slots:
                return
            self.listen((lost_prefix(engine.prefix) + engine.id).encode())
            self._slots.add(-1)  # (standalone: one channel, "slot" -1)
        else:
            slot = slot_of(hold.renew_key)
            if self._listener is listener and slot in self._slots:
                return
            self.listen((lost_prefix(engine.prefix, slot_tag(slot)) + engine.id).encode())
            self._slots.add(slot)

    def listen(self, name: bytes) -> None:
        """Subscribe eviction channel ``name`` (once; kept until the Client closes)."""
        listener = self.engine.listener
        if self._listener is not listener:
            self._channels.clear()  # (cluster mode found: a new listener)
            self._slots.clear()
            self._listener = listener
        if name in self._channels:
            return
        channel = listener.register(name)
        channel.handler = self.message
        self._channels[name] = channel

    def message(self, message: bytes) -> None:
        """A message on an eviction channel. (``WAKE_ALL``, when the channel is
        confirmed again after a reset or a move, needs nothing: the reset has
        every hold verified already, see above.)"""
        if message == WAKE_ALL:
            return
        text = message.decode(errors="replace")
        if text.startswith("v "):
            callback = self.values.get(text[2:])
            if callback is not None:
                callback(self)
            return
        try:
            x, bound_text, side, key = text.split(" ", 3)
            bound = int(bound_text)
        except ValueError:
            return
        if x != "x":
            return
        now = asyncio.get_running_loop().time()
        interval = self.engine.watchdog.interval
        for old, (_, _, when) in list(self._recent.items()):
            if now - when > interval:
                del self._recent[old]
        previous = self._recent.get(key)
        if previous is None or previous[0] <= bound:
            self._recent[key] = (bound, side, now)
        for item in self.engine.watchdog.items():
            if isinstance(item, Hold) and _evicted(item, key, bound, side):
                item.gone(FORCE_RELEASED)

    def _check_recent(self, hold: Hold) -> None:
        seen = self._recent.get(hold.renew_key)
        if seen is not None and _evicted(hold, hold.renew_key, seen[0], seen[1]):
            # (On the next turn: the primitive records the new hold first.)
            asyncio.get_running_loop().call_soon(hold.gone, FORCE_RELEASED)


def _evicted(hold: Hold, key: str, bound: int, side: str) -> bool:
    return (
        hold.renew_key == key
        and hold.token <= bound
        and not hold.lost
        and (side == "*" or (side == "w") == (hold.kind == "write_lock"))
    )
