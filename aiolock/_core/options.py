"""The Client's options, checked in one place, and its statistics snapshot.

``Client`` checks what users pass with ``check_options`` (the one place the
options are validated) and gives the result to the Engine it makes;
``ClientStatistics`` is what ``Client.statistics()`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from .errors import InvalidArgumentError, InvalidArgumentTypeError
from .notify import Backoff
from .validate import check_lease, check_prefix, check_seconds

__all__ = ["ClientStatistics", "Notify", "Options", "check_options"]

Notify = Literal["pubsub", "list", "poll"]
_NOTIFY_MODES = ("pubsub", "list", "poll")


@dataclass(frozen=True, slots=True)
class Options:
    """A Client's options, checked (see ``Client`` for what each means)."""

    prefix: str
    lease: float
    notify: Notify
    command_timeout: float
    backoff: Backoff


def check_options(
    redis: object,
    *,
    prefix: str,
    lease: float,
    notify: Notify,
    command_timeout: float,
    backoff: Backoff | None,
) -> Options:
    """Check a Client's arguments: the options, or a typed error naming the wrong one."""
    if not isinstance(redis, aioredis.Redis | RedisCluster):
        raise InvalidArgumentTypeError(
            f"Client() takes a redis.asyncio.Redis or a redis.asyncio.RedisCluster, got "
            f"{type(redis).__name__}; use Client.from_url('redis://...') to connect by URL"
        )
    prefix = check_prefix(prefix)
    lease_s = check_lease(lease, "lease")
    if lease_s is None or lease_s < 0.3:
        raise InvalidArgumentError(
            f"the Client's lease must be at least 0.3 seconds, got {lease!r}"
        )
    if notify not in _NOTIFY_MODES:
        raise InvalidArgumentError(
            f"notify must be one of {', '.join(map(repr, _NOTIFY_MODES))}, got {notify!r}"
        )
    timeout = check_seconds(command_timeout, "command_timeout", allow_zero=False)
    if backoff is not None and not isinstance(backoff, Backoff):
        raise InvalidArgumentTypeError(
            f"backoff must be an aiolock.Backoff, got {type(backoff).__name__}"
        )
    return Options(prefix, lease_s, notify, timeout, backoff or Backoff())


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """A cheap snapshot of a Client's local state (no round trip)."""

    holds: int
    """Holds this Client has in Redis right now (one per held lock, however re-entered)."""
    waiting: int
    """Tasks waiting for a lock: queued locally or parked on a channel."""
    subscriptions: int
    """Channels some local task waits on (pub/sub channels, or BLPOP loops in
    list mode). A pub/sub channel stays subscribed for a second after its last
    waiter left, in case it is waited on again; it is not counted then."""
    watched: int
    """Holds the watchdog renews."""
    in_flight: int
    """Commands sent and not answered yet."""
    background: int
    """Clean-up tasks still running (undo of a cancelled acquire, release retries)."""
    command_connects: int
    pubsub_connects: int
