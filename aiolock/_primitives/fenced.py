"""Fenced writes: a value in Redis that refuses writers holding an older fencing token.

``await client.fenced_set(key, value, token)`` (``Client.fenced_set``
delegates here) is the resource side of fencing for data kept in Redis
itself: the write happens only if ``token`` is not lower than the newest
token ``key`` has accepted, so a holder whose lease ran out while it was
paused cannot overwrite what a later holder wrote. One script
(scripts/fenced_set.lua) compares and writes atomically.

The layout, decided here:

* the value is at ``key`` itself, a plain string: anyone reads it with
  ``GET key``; ``key`` is the caller's own key, not under the prefix;
* the newest accepted token is at the *fence key*
  ``<prefix>:fenced:{<slot tag>}:<key>`` (a plain string, decimal), where
  ``<slot tag>`` is the 4-letter hash tag of ``key``'s cluster slot
  (holds/evict.py's ``slot_tag``): the fence is in ``key``'s slot whatever
  ``key`` looks like (its own hash tag, braces without one, bytes), so one
  script touches both on a cluster node. The ``fenced:`` part keeps fence
  keys out of ``aiolock ls`` (which reads ``<prefix>:{<name>}...``).
  The fence key is a name of aiolock's data: it never changes;
* lifetime: an accepted write gives the fence the value's TTL (``ttl=``, or
  none), so the fence lives exactly as long as the value it guards and
  memory grows with the values kept, never with the writes. A value deleted
  or expired by other means than its ``ttl=`` (a plain ``DEL``, an
  ``EXPIRE``) leaves its fence: it goes on refusing older tokens (a stale
  writer cannot bring the value back) until deleted too:
  ``client.fence_key(key)`` names it.

``equal`` tokens are accepted: tokens of one lock name are never handed to
two holds (DESIGN.md, "Fencing tokens"), so an equal token is the same
holder writing again, and a retry after a lost reply is harmless.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.errors import InvalidArgumentError, InvalidArgumentTypeError
from .._core.holds.evict import slot_tag
from .._core.protocol.slots import slot_of
from .._core.validate import check_seconds, to_ms

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["MAX_TOKEN", "check_key", "fence_key", "fenced_set"]

#: The largest token accepted: a signed 64-bit integer, what a SQL ``BIGINT``
#: fence column holds (aiolock's own tokens are microseconds since 1970).
MAX_TOKEN = 2**63 - 1
#: What comes between the prefix and the slot tag of every fence key.
FENCED = "fenced"


def check_key(key: object) -> str | bytes:
    """A non-empty str or bytes key, else the typed error."""
    if not isinstance(key, str | bytes):
        raise InvalidArgumentTypeError(
            f"key must be a str or bytes, got {type(key).__name__}: {key!r}"
        )
    if not key:
        raise InvalidArgumentError("key must be a non-empty str or bytes")
    return key


def fence_key(prefix: str, key: str | bytes) -> str | bytes:
    """The fence key of ``key`` (str for a str key, bytes for bytes): see the
    module docstring. Always in ``key``'s cluster slot."""
    tag = slot_tag(slot_of(key))
    if isinstance(key, bytes):
        return f"{prefix}:{FENCED}:{{{tag}}}:".encode() + key
    return f"{prefix}:{FENCED}:{{{tag}}}:{key}"


def _check_value(value: object) -> str | bytes:
    if not isinstance(value, str | bytes):
        raise InvalidArgumentTypeError(
            f"value must be a str or bytes (encode other data first), "
            f"got {type(value).__name__}: {value!r}"
        )
    return value


def _check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgumentTypeError(
            f"token must be an int (a lease's fencing_token), got {type(token).__name__}: {token!r}"
        )
    if token < 0 or token > MAX_TOKEN:
        raise InvalidArgumentError(
            f"token must be an int from 0 to 2**63 - 1 (a lease's fencing_token), got {token!r}"
        )
    return token


async def fenced_set(
    engine: EngineView,
    key: object,
    value: object,
    token: object,
    ttl: object = None,
) -> bool:
    """Write ``value`` at ``key`` if ``token`` is not lower than its fence (see
    ``Client.fenced_set``). Every argument is checked before any round trip."""
    checked_key = check_key(key)
    checked_value = _check_value(value)
    checked_token = _check_token(token)
    ttl_ms = 0
    if ttl is not None:
        seconds = check_seconds(ttl, "ttl", allow_zero=False)
        if seconds < 0.001:
            raise InvalidArgumentError(f"ttl must be at least 0.001 seconds, got {ttl!r}")
        ttl_ms = to_ms(seconds)
    engine.enter()  # closed, or another loop: the typed error, nothing sent
    reply = await engine.eval(
        "fenced_set",
        (checked_key, fence_key(engine.prefix, checked_key)),
        (checked_value, str(checked_token), str(ttl_ms)),
    )
    return bool(reply == 1)
