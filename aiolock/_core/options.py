"""The Client's options, checked in one place, and the statistics snapshots.

``Client`` checks what users pass with ``check_options`` (the one place the
options are validated) and gives the result to the Engine it makes;
``ClientStatistics`` is what ``Client.statistics()`` returns, and
``LockStatistics`` what every primitive's ``statistics()`` returns (built in
one place: ``lock_statistics`` in ``_primitives/stats.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from .errors import InvalidArgumentError, InvalidArgumentTypeError
from .observe.observer import LockLabel
from .validate import check_lease, check_prefix, check_seconds
from .waiting.notify import Backoff

__all__ = [
    "ClientStatistics",
    "LockStatistics",
    "Notify",
    "Options",
    "check_options",
    "check_sentinels",
]

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
    replicas: int = 0
    """Replicas that must acknowledge (WAIT) every acquisition and renewal; 0: none asked."""
    replica_timeout: float = 1.0
    """How long one WAIT may wait for them, in seconds."""
    wait_aof: bool = False
    """WAITAOF instead of WAIT: the master and ``replicas`` replicas fsynced the write."""
    telemetry: bool = True
    """Record OpenTelemetry metrics and spans if ``opentelemetry-api`` is installed."""
    lock_label: LockLabel | None = None
    """Maps a lock name to a bounded label for metric attributes (None: no name recorded)."""


def check_options(
    redis: object,
    *,
    prefix: str,
    lease: float,
    notify: Notify,
    command_timeout: float,
    backoff: Backoff | None,
    replicas: int = 0,
    replica_timeout: float = 1.0,
    wait_aof: bool = False,
    telemetry: bool = True,
    lock_label: LockLabel | None = None,
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
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise InvalidArgumentTypeError(
            f"replicas must be an int (how many replicas must acknowledge each "
            f"acquisition; 0: none), got {type(replicas).__name__}: {replicas!r}"
        )
    if replicas < 0:
        raise InvalidArgumentError(f"replicas must be 0 or more, got {replicas!r}")
    if not isinstance(wait_aof, bool):
        raise InvalidArgumentTypeError(f"wait_aof must be True or False, got {wait_aof!r}")
    wait_s = check_seconds(replica_timeout, "replica_timeout", allow_zero=False)
    if (replicas or wait_aof) and wait_s > lease_s / 3:
        raise InvalidArgumentError(
            f"replica_timeout ({replica_timeout!r} s) must be at most a third of the lease "
            f"({lease_s:g} s): the watchdog renews every lease / 3, and each renewal waits "
            "for the replicas too. Lower replica_timeout or raise lease"
        )
    if not isinstance(telemetry, bool):
        raise InvalidArgumentTypeError(f"telemetry must be True or False, got {telemetry!r}")
    if lock_label is not None and not callable(lock_label):
        raise InvalidArgumentTypeError(
            f"lock_label must be a function from a lock name to a label (str or None), "
            f"got {type(lock_label).__name__}: {lock_label!r}"
        )
    return Options(
        prefix,
        lease_s,
        notify,
        timeout,
        backoff or Backoff(),
        replicas,
        wait_s,
        wait_aof,
        telemetry,
        lock_label,
    )


def check_sentinels(sentinels: object) -> list[tuple[str, int]]:
    """``Client.from_sentinel``'s Sentinel addresses: a non-empty sequence of
    ``(host, port)`` pairs, or a typed error naming the wrong one."""
    if isinstance(sentinels, str | bytes) or not isinstance(sentinels, list | tuple):
        raise InvalidArgumentTypeError(
            f"sentinels must be a list of (host, port) pairs, e.g. [('10.0.0.1', 26379)], "
            f"got {type(sentinels).__name__}: {sentinels!r}"
        )
    if not sentinels:
        raise InvalidArgumentError("sentinels must name at least one (host, port) Sentinel")
    pairs: list[tuple[str, int]] = []
    for item in sentinels:
        if not (
            isinstance(item, list | tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and item[0]
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
        ):
            raise InvalidArgumentTypeError(
                f"each Sentinel must be a (host, port) pair, host a str and port an int, "
                f"got {item!r}"
            )
        if not 0 < item[1] < 65536:
            raise InvalidArgumentError(f"Sentinel port must be 1 to 65535, got {item[1]!r}")
        pairs.append((item[0], item[1]))
    return pairs


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
    acquisitions: int = 0
    """Acquisitions granted since the Client was made (re-entries included)."""
    timeouts: int = 0
    """Acquisitions that timed out (``try_acquire`` finding the lock busy included)."""
    cancellations: int = 0
    """Acquisitions cancelled before they got the lock (an enclosing
    ``asyncio.timeout()`` included: it cancels)."""
    failures: int = 0
    """Acquisitions that failed with an error (Redis unreachable, refused, ...)."""
    losses: int = 0
    """Leases lost while held (expired, force-released, not renewed in time, ...); a
    Client closed while holding is not a loss."""
    wait_time: float = 0.0
    """Seconds spent in acquisitions, whatever their outcome, summed."""


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """What one Client knows of one lock, locally: no round trip, no I/O.

    Only this Client's own tasks are seen: a lock that another Client (or
    process) holds reads here as ``locked=False``. For the server's view use
    ``await lock.is_locked()`` / ``remaining_ttl()``.
    Cheap, and safe to take from any thread (``repr(lock)`` shows the same).

    Several local holders (the readers of ``rw.read``, the acquisitions of a
    semaphore) are all listed in ``holders``; ``task`` and ``owner`` name the
    first of them.
    """

    kind: str
    """The primitive's kind: "lock", "spin_lock", "fair_lock", "read_lock",
    "write_lock", "semaphore", "multi_lock", "redlock" or "latch"."""
    name: str
    """The lock's name (a multi-lock's: its locks' names joined by "+")."""
    locked: bool
    """Whether a task of this Client holds it (a latch: never)."""
    task: asyncio.Task[Any] | None
    """The asyncio Task that holds it here (the first holder), or None."""
    owner: str | None
    """That holder's owner id, ``<client id>:<task serial>``, or None."""
    holders: tuple[str, ...]
    """The owner id of every local hold, oldest first (several for a read lock
    or a semaphore; a task holding two permits is listed twice)."""
    hold_count: int
    """Acquisitions not yet released, re-entries included, summed over the
    local holds (a semaphore: the permits held here)."""
    fencing_token: int | None
    """The fencing token of the hold (the highest, with several holders)."""
    lease_left: float | None
    """Seconds until the local hold expires unless renewed (the first to
    expire, with several); None if not held here."""
    waiting: int
    """Tasks of this Client waiting for it (queued locally or parked)."""
    parts: tuple[LockStatistics, ...] = ()
    """A multi-lock: the statistics of each of its locks (empty otherwise)."""

    @property
    def task_name(self) -> str | None:
        """The holder task's name (``task.get_name()``), or None."""
        return self.task.get_name() if self.task is not None else None

    @property
    def tasks_waiting(self) -> int:
        """``waiting``, by the name anyio's ``LockStatistics`` gives it."""
        return self.waiting
