"""``Redlock`` (the facade: validates its Clients, makes locks) and
``RedlockLock`` (a primitive on the quorum engine, from the shared base)."""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from .._client import Client, engine_of
from .._core.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
)
from .._core.holds.lease import Hold, Lease
from .._core.observe.observer import FIXED_LEASE_EXPIRED, Observer
from .._core.protocol.keys import lost_prefix
from .._core.validate import check_name
from .._core.waiting.notify import PollWaiter, Waiter
from .._primitives.base import HeldByTask
from .._primitives.compete import compete
from .attempt import MASTER_TIMEOUT
from .calls import AnyWaiter, Master, quorum, too_few
from .quorum import QuorumEngine

__all__ = ["Redlock", "RedlockLock", "quorum_of"]


class Redlock:
    """A lock over several independent Redis masters (Redlock), with fencing tokens.

    ``Redlock([client_a, client_b, client_c], drift=0.01)``: an odd number of
    distinct Clients of one event loop, each on its own master (standalone,
    not a cluster), and ``drift`` in [0, 0.5), the clock drift allowed for,
    as a fraction of the lease. Nothing is sent until a lock is used.

    ``redlock.lock(name)`` returns a :class:`RedlockLock`. The lease of a
    hold without ``lease=`` is the smallest of the Clients' leases; it is
    renewed on every master every lease / 3 by one task of this Redlock.

    What it guarantees, and what not: see :class:`RedlockLock` and the
    package's documentation (aiolock/_redlock/): tokens are written back
    to a majority before they are handed out, so they keep increasing when
    the quorum changes, including across a master that comes back empty;
    mutual exclusion rests on timing assumptions (bounded process pauses,
    clock drift and network delays), as Kleppmann pointed out.
    """

    __slots__ = ("_quorum", "drift", "lease", "majority")

    def __init__(self, clients: Sequence[Client], *, drift: float = 0.01) -> None:
        if isinstance(clients, str | bytes) or not isinstance(clients, Sequence):
            raise InvalidArgumentTypeError(
                f"Redlock takes a list of aiolock Clients, got {type(clients).__name__}"
            )
        for client in clients:
            if not isinstance(client, Client):
                raise InvalidArgumentTypeError(
                    f"Redlock takes aiolock Clients (one per master), got {type(client).__name__}"
                )
        if len({id(c) for c in clients}) != len(clients):
            raise InvalidArgumentError("Redlock needs distinct Clients (one per master)")
        if len(clients) % 2 == 0:
            raise InvalidArgumentError(
                f"Redlock needs an odd number of masters (a clear majority), got {len(clients)}"
            )
        if isinstance(drift, bool) or not isinstance(drift, int | float):
            raise InvalidArgumentTypeError(
                f"drift must be a float in [0, 0.5), got {type(drift).__name__}: {drift!r}"
            )
        if not (0.0 <= float(drift) < 0.5):
            raise InvalidArgumentError(f"drift must be in [0, 0.5), got {drift!r}")
        engines = [engine_of(c) for c in clients]
        for client, engine in zip(clients, engines, strict=True):
            if engine.replicas or engine.wait_aof:
                raise InvalidArgumentError(
                    f"Redlock runs over independent masters and does not wait for their "
                    f"replicas, but Client {client.id[:8]} was made with replicas="
                    f"{engine.replicas}, wait_aof={engine.wait_aof}: pass Clients made "
                    "without them (Redlock's majority replaces replica acknowledgement), "
                    "or use that Client alone with replicas=N"
                )
        self._quorum = QuorumEngine(engines, float(drift))
        self.drift = float(drift)
        self.majority = self._quorum.majority
        self.lease = self._quorum.lease

    def lock(self, name: str) -> RedlockLock:
        """The lock ``name`` over these masters (cheap: no I/O)."""
        return RedlockLock(self, name)

    def __repr__(self) -> str:
        q = self._quorum
        return f"<Redlock {len(q.masters)} masters, {len(q.holds)} held here>"


def quorum_of(redlock: Redlock) -> QuorumEngine:
    """The quorum engine of ``redlock``. Internal to the package (not public
    API): a seam for tests that watch or patch its attempts and seeds."""
    return redlock._quorum


class RedlockLock(HeldByTask):
    """A lock over the masters of a :class:`Redlock`, with the ``AsyncLock`` API.

    * **Who may release:** the task that acquired it (``release()``), or
      anyone with the :class:`Lease` (``lease.release()``).
    * **Reentrant** per asyncio Task (no round trip); a re-entry returns
      the holder's token. Tasks of one process compete like any two
      processes (no local queue, no fairness).
    * **Acquiring:** every master at once; held when a majority granted it
      and its fencing token was written back to a majority within the
      validity (lease minus the time taken, minus ``drift * lease``, minus
      2 ms). A failed attempt releases what it took on every master before
      the task waits, woken by a release on any master (pub/sub), every
      wait bounded by the holder's TTL.
    * **Lease expiry:** without ``lease=`` the hold is renewed on every
      master every lease / 3; it is *lost* when a majority can no longer be
      renewed before its validity ends, or is found gone there: then
      ``lease.lost``, ``on_lost`` callbacks, and ``LockLostError`` from
      ``async with`` (unless ``on_lost="ignore"``). With ``lease=`` it is
      lost when its validity ends.
    * **Cancellation:** an acquire cancelled at any await leaves nothing on
      any master (its attempt is undone by value, in the background); a
      cancelled release still completes; release is idempotent.
    * **Fencing:** strictly increasing across acquisitions whatever the
      quorum, including a master that came back empty (see the package
      documentation for the rule and its limits).
    """

    __slots__ = ("_entry_map", "_quorum", "name")

    kind = "redlock"
    _kind = "Redlock"

    def __init__(self, redlock: Redlock, name: str) -> None:
        self.name = check_name(name)
        self._quorum = redlock._quorum
        # The ``async with`` entries of each task (the shared base's ``Entry``).
        self._entry_map: dict[asyncio.Task[Any], list[Any]] = {}

    # -- the shared base's hooks ----------------------------------------------------------

    def _entries(self) -> dict[asyncio.Task[Any], list[Any]]:
        return self._entry_map

    def _observer(self) -> Observer:
        return self._quorum.observer

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self._quorum.loop

    def _enter(self) -> None:
        self._quorum.enter()

    def _check_usable(self) -> None:
        self._quorum.check_usable()

    def _my_hold(self) -> Hold | None:
        hold = self._quorum.holds.get(self.name)
        if hold is None or hold.task is not asyncio.current_task():
            return None
        return hold

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        """This process's hold of the name through this Redlock, and its parked tasks."""
        q = self._quorum
        hold = q.holds.get(self.name)
        return ((hold,) if hold is not None else ()), q.waiting.get(self.name, 0)

    async def _acquire(self, timeout: float | None, lease: float | None) -> Lease:
        q = self._quorum
        task = q.enter()
        loop = task.get_loop()
        hold = q.holds.get(self.name)
        if hold is not None and hold.task is task and hold.releasing is None and not hold.lost:
            return hold.new_lease()
        lease_s = q.lease if lease is None else lease
        if q.validity(lease_s) <= 0:
            raise InvalidArgumentError(
                f"lease {lease_s!r} s is too short for Redlock (drift {q.drift}): "
                f"nothing of it would be valid"
            )
        owner = q.masters[0].engine.owner(task)
        name = self.name
        deadline = None if timeout is None else loop.time() + timeout
        current: str | None = None

        def attempt() -> Coroutine[Any, Any, tuple[tuple[int, float] | None, float | None]]:
            nonlocal current
            # Known before anything is sent: an attempt cancelled anywhere is undone by it.
            current = f"{owner}|{secrets.token_hex(8)}"
            return q.attempt(name, current, lease_s, loop)

        def waiter() -> Waiter:
            masters = q.masters
            if not all(m.engine.capabilities.publish_in_scripts for m in masters):
                # A master's scripts may not publish (probe.py): no release
                # would wake a waiter there. Poll, with the Client's backoff.
                return PollWaiter(masters[0].engine.backoff)
            return AnyWaiter(
                [m.engine.pubsub_waiter(m.channel(name)) for m in masters], q.majority
            )

        def abandon() -> None:
            if current is not None:
                q.undo(name, current)

        def parked(value: bool) -> None:
            waiting = q.waiting.get(name, 0) + (1 if value else -1)
            if waiting > 0:
                q.waiting[name] = waiting
            else:
                q.waiting.pop(name, None)

        try:
            (token, valid_until), _ = await compete(
                q,
                what=f"Redlock {name!r}",
                deadline=deadline,
                attempt=attempt,
                waiter=waiter,
                abandon=abandon,
                parked=parked,
                cut=False,  # each round is bounded (MASTER_TIMEOUT), and says who answered
            )
        except BaseException:
            # An attempt cancelled or timed out anywhere (even after it
            # succeeded, before its result was taken): undo it by value.
            abandon()
            raise
        assert current is not None
        hold = Hold(
            q,
            name,
            owner,
            token,
            task,
            lease_s,
            lease is None,
            valid_until,
            release=("redlock_release", (), (current,)),
            renew=("redlock_renew", "", (current,)),
            kind=self.kind,
        )
        q.holds[name] = hold
        q.observer.hold_began(hold)

        def detached(h: Hold) -> None:
            if q.holds.get(name) is h:
                del q.holds[name]

        hold.on_detach = detached
        if lease is not None:
            hold.timer = loop.call_at(valid_until, hold.gone, FIXED_LEASE_EXPIRED)
        q.watch(hold)  # renewed, or (a fixed lease) checked each round
        return hold.new_lease()

    # -- queries: each decided by a majority -------------------------------------------------

    async def _each(self, command: Callable[[Master], Coroutine[Any, Any, Any]]) -> list[Any]:
        q = self._quorum
        q.enter()
        return await quorum([asyncio.ensure_future(command(m)) for m in q.masters], MASTER_TIMEOUT)

    def _decide(self, replies: list[Any], yes: Callable[[Any], bool], what: str) -> bool:
        """True when ``yes`` holds for a majority of the answers, False when it
        fails for more than a minority; else too few masters answered to know:
        ConnectionFailedError (redis-py's error, or the timeout, as its cause)."""
        q = self._quorum
        n, majority = len(q.masters), q.majority
        answers = [r for r in replies if r is not None and not isinstance(r, BaseException)]
        ayes = sum(1 for r in answers if yes(r))
        if ayes >= majority:
            return True
        if len(answers) - ayes > n - majority:
            return False
        raise too_few(f"Redlock {self.name!r}: cannot tell {what}", replies, majority)

    async def is_locked(self) -> bool:
        """True if the lock's key is on a majority of masters (one round trip each).

        ConnectionFailedError when too few masters answered to tell."""
        replies = await self._each(
            lambda m: m.engine.call(m.lock_key(self.name), b"EXISTS", m.lock_key(self.name))
        )
        return self._decide(replies, lambda r: r == 1, "whether it is locked")

    async def is_owned(self) -> bool:
        """True if the current task holds the lock, confirmed by a majority of masters.

        ConnectionFailedError when too few masters answered to tell."""
        hold = self._my_hold()
        if hold is None or hold.lost:
            return False
        value = hold.release_args[0].encode()
        replies = await self._each(
            lambda m: m.engine.call(m.lock_key(self.name), b"GET", m.lock_key(self.name))
        )
        return self._decide(replies, lambda r: r == value, "whether this task holds it")

    async def remaining_ttl(self) -> float | None:
        """Seconds the lock stays on a majority of masters (whoever holds it); None if unlocked."""
        replies = await self._each(
            lambda m: m.engine.call(m.lock_key(self.name), b"PTTL", m.lock_key(self.name))
        )
        if not self._decide(replies, lambda r: r != -2, "whether it is locked"):
            return None
        ttls = sorted(
            (
                math.inf if r == -1 else r / 1000.0
                for r in replies
                if isinstance(r, int) and r != -2
            ),
            reverse=True,
        )
        return ttls[self._quorum.majority - 1]

    async def force_release(self) -> bool:
        """Delete the lock on every master whoever holds it; True if it was held on any.

        The evicted holder's lease is lost: at once in this Redlock; in
        another, as soon as a majority of its masters told it through their
        eviction channels (pub/sub mode, connected), else at its next
        renewal or check (every ``lease / 3``, fixed leases included).
        Fencing tokens keep increasing.
        """
        name = self.name
        q = self._quorum
        replies = await self._each(
            lambda m: m.engine.eval(
                "redlock_force_release",
                (m.lock_key(name),),
                (m.channel(name), lost_prefix(m.engine.prefix)),
            )
        )
        hold = q.holds.get(name)
        if hold is not None:
            hold.mark_lost("force-released")
        if any(r == 1 for r in replies):
            return True
        # Nothing deleted where it answered: "not held" only if a majority said so.
        if sum(1 for r in replies if r == 0) > len(q.masters) - q.majority:
            return False
        raise too_few(
            f"Redlock {name!r}: force-release deleted nothing where it reached, and cannot "
            "tell whether it was held",
            replies,
            q.majority,
        )
