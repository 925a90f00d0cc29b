"""Redlock: one lock over several independent Redis masters, with fencing tokens.

``Redlock([client_a, client_b, client_c], drift=0.01)`` composes Clients (one
per master, same event loop); ``redlock.lock(name)`` is a ``RedlockLock``
with the ``AsyncLock`` API. It sits above ``_client`` (it takes Clients) and
below ``cli``.

The algorithm (Redis' Redlock, with a fencing write-back)
---------------------------------------------------------
An **attempt** sends ``redlock_acquire.lua`` to every master at once (one
round, no task per master: each reply is taken from its parse): set the
lock key to a value unique to the attempt (``<owner>|<random>``) with the
lease as TTL, and read the name's fence counter, the server clock, the
master's *generation* and its *roster* (below). The attempt also *proposes*
a token (above the last one this Redlock saw for the name, 0.5 s ahead of
its clock), which each master that granted the lock accepts or refuses by
the rule below, in the same script. It succeeds when

1. a majority granted the key,
2. a majority accepted the token: the proposal in the same round (the usual
   case, one round trip), or else a token chosen from what was read,
   ``max(counter + 1, server clock in us)`` over every reply, in a second
   round (``redlock_fence.lua``, the write-back),
3. all within the validity ``lease - elapsed - drift * lease - 2 ms``, and
   within ``ATTEMPT_LIMIT`` (4 s) of the attempt's start (its rounds take at
   most ``MASTER_TIMEOUT`` each: the limit only bounds a stalled process).

A failed attempt releases its value on **every** master (by value, so also
where its reply was lost or late; idempotent) before the task waits or
retries; an attempt cancelled anywhere is undone the same way, in the
background. A waiter parks on the name's channel on every master (each
Client's one listener, pub/sub whatever the Client's notify mode): any
release or undo publishes there, and every wait is bounded by the holder's
TTL, as everywhere in aiolock. Holds without ``lease=`` are renewed on every
master every ``lease / 3`` by one task per Redlock; a round that renews a
majority moves the validity on; when a majority can no longer be renewed
before the validity ends, or the key is found gone on a majority, the lease
is lost.

Fencing: the write-back rule
----------------------------
The largest counter of the quorum is not enough: the master that held it may
be missing from the next quorum. So a token is handed out only after a
majority *accepted* it (``fence_accept`` in ``_redlock_fence.lua``, run by
both scripts). A master accepts ``T`` when

* its counter ``t`` is present and ``t < T`` (then it records ``t = T``); or
* its counter is absent and its generation is *trusted*.

(A proposal below the master's clock is refused too, and a write-back token
is at least every clock read: tokens stay above the server clocks, the floor
for a counter that expired, as with one server.)

Each master keeps a generation marker (``<prefix>:redlock:gen``: a random id,
its creation time on the server's clock, and the server's ``run_id``; no
TTL), created by the first script that runs there, and created anew by the
first script that finds a ``run_id`` other than the server's (``INFO
server``, read in the script: a key cannot tell a new server life, as a
snapshot restores keys). So any new server life has a new, young
generation: a master that came back empty, one restarted from an RDB
snapshot or an AOF that missed its last writes (``appendfsync everysec``), a
replica promoted in its place (under Sentinel: its ``run_id`` is its own),
and also one restarted with all its data (the price: see below). Each fence
counter is tagged with the generation that wrote it (field ``g``); a counter
of another generation (restored from an older life, maybe stale) counts as
absent. The roster (``<prefix>:redlock:roster``, no TTL) holds the *founding*
generations: a Redlock whose attempt read no roster on *all* N masters
founds it with the N generations it read (a new deployment), and every
later attempt passes the roster it knows, added to a master that has none. A
generation is trusted if it is in the roster the attempt passes, or at least
``FENCE_RETENTION`` (24 h, the counters' retention) old on the server's
clock. A young generation not in the roster is a master in a new life: its
absent counters may be lost ones, so it accepts no token for them (its
counters written since, in this generation, are fine) until 24 h have
passed. Once a majority accepted a token, a master that refused it as
untrusted is *seeded* with it (in the background, and only if its
generation is still the one the attempt read: it did not start a new life
again meanwhile; and only if the attempt began ``ATTEMPT_LIMIT`` after that
generation did, see ``_seed``), so it vouches for that name from then on. Safety over
liveness: with one master down and another in a new life (any restart, a
failover), a name the latter has not been seeded with since cannot be
acquired (the attempt fails, and is retried until the caller's timeout).

Proof sketch. Let B hand out ``T_B`` after the majority ``V_B`` accepted it,
and let A's acceptances (its proposal or its write-back) begin after that
and succeed on the majority ``V_A``. Some master ``m`` is in both. If ``m``
is in the server life that accepted ``T_B`` (same ``run_id``, hence the same
generation and the counter it wrote: a life loses no write), its counter is
at least ``T_B`` when A's token reaches it, so accepting ``T_A`` means ``T_A >
T_B``. If ``m`` started a new life since (empty, from an older snapshot or
AOF, or promoted), its generation is younger than B's acceptance there, and
every counter it has from before is tagged with an older generation, so
absent; an absent counter is accepted only if the generation is 24 h old
(B's counter had then expired everywhere: the clock floor remains, as for
one server) or founding, and a founding after B's hand-out needs every
master without a roster, i.e. every master of ``V_B`` (a majority) emptied.
A counter of ``m``'s current generation was written by an acceptance under
the same rule, or by a seed of a token whose attempt began after every
attempt that reached ``m``'s previous life had ended (so it is above all
their tokens, by this argument), so the same holds by induction.
Hence tokens increase in the order of hand-out, whatever the quorums, unless
a majority of masters lose their data within 24 h (then only the clock floor
orders them) or a counter expires after 24 h unused. No timing assumption
beyond these: an attempt hands out its token within ``ATTEMPT_LIMIT`` of its
start on its own clock (checked), and server clocks run at the rate of the
clients' (the seed's age check and the 24 h rule read them: a server clock
jumping forward trusts a young generation early). Mutual exclusion itself still
rests on timing (bounded pauses, clock drift, delays), as in every
lease-based lock; the token is what makes a resource that checks it safe
anyway.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

from ._client import Client
from ._core.engine import FENCE_RETENTION
from ._core.errors import (
    AiolockError,
    ClientClosedError,
    ConnectionFailedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockNotOwnedError,
    UnsupportedServerError,
)
from ._core.evict import FORCE_RELEASED
from ._core.keys import RedlockKeys, lost_prefix
from ._core.lease import Hold, Lease, LostCallback
from ._core.notify import Waiter
from ._core.observe import CLIENT_CLOSED, FIXED_LEASE_EXPIRED, Observer
from ._core.outage import Outage
from ._core.validate import check_name, to_ms
from ._primitives.base import TRANSIENT, Acquirable, _Entry, compete, current_task

if TYPE_CHECKING:
    from ._core.engine import Engine

__all__ = ["Redlock", "RedlockLock"]

log = logging.getLogger("aiolock.redlock")

#: The constant of the validity (``lease - elapsed - drift * lease - CLOCK_SLACK``).
CLOCK_SLACK = 0.002
#: The longest an attempt waits for one master's reply (a paused master).
MASTER_TIMEOUT = 1.0
#: A failed attempt waits at most this long for its undo before the task waits or retries.
UNDO_WAIT = 0.5
#: An attempt hands out its token only this soon after it started (and within
#: its validity): its rounds take at most MASTER_TIMEOUT each. A master in a
#: new life is seeded only by an attempt that began this long after the new
#: life did: every attempt that reached its previous life has ended by then.
ATTEMPT_LIMIT = 4 * MASTER_TIMEOUT
_RETENTION_US = int(FENCE_RETENTION * 1_000_000)
#: A proposed token runs this far ahead of the proposer's clock (in microseconds),
#: so that it is not below the masters' clocks when it arrives.
PROPOSAL_LEAD_US = 500_000
#: Names whose last token a Redlock remembers for its proposals.
LAST_TOKENS = 1024


def engine_of(client: Client) -> Engine:
    """The Engine of ``client``: the one place Redlock reaches into a Client."""
    return client._engine


class _Master:
    """One master: its Client's Engine, and the names of the locks used on it."""

    __slots__ = ("_names", "engine", "failure")

    #: Names kept per master (rebuilt when more are used: cheap).
    NAMES = 4096

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._names: dict[str, RedlockKeys] = {}
        #: Why the last try to reach it (find its mode) failed, if it did.
        self.failure: BaseException | None = None

    def keys(self, name: str) -> RedlockKeys:
        keys = self._names.get(name)
        if keys is None:
            if len(self._names) >= self.NAMES:
                self._names.clear()
            keys = self._names[name] = RedlockKeys.of(self.engine.prefix, name)
        return keys

    def lock_key(self, name: str) -> str:
        return self.keys(name).lock

    def channel(self, name: str) -> bytes:
        return self.keys(name).channel


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _AnyWaiter:
    """A waiter on the name's channel on every master: woken by any of them.

    Live (``ready``) once a majority of the subscriptions are confirmed: a
    release deletes the key on a majority at least, and publishes on each.
    """

    __slots__ = ("_majority", "_waiters")

    def __init__(self, waiters: list[Waiter], majority: int) -> None:
        self._waiters = waiters
        self._majority = majority

    async def ready(self, bound: float | None) -> None:
        tasks = [asyncio.ensure_future(w.ready(bound)) for w in self._waiters]
        try:
            pending = set(tasks)
            done_count = 0
            while pending and done_count < self._majority:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                done_count += sum(1 for t in done if not t.cancelled() and t.exception() is None)
        finally:
            _cancel_all(tasks)

    async def wait(self, timeout: float | None) -> bool:
        tasks = [asyncio.ensure_future(w.wait(timeout)) for w in self._waiters]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            woken = False
            for task in done:
                error = task.exception()
                if isinstance(error, ClientClosedError):
                    raise error
                woken = woken or (error is None and bool(task.result()))
            return woken
        finally:
            _cancel_all(tasks)

    def close(self, *, linger: bool = False) -> None:
        for waiter in self._waiters:
            waiter.close(linger=linger)


def _cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the unfinished ``tasks``; their outcomes are collected (never unretrieved)."""
    for task in tasks:
        if task.done():
            _collect(task)
        else:
            task.cancel()
            task.add_done_callback(_collect)


def _collect(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _settled(master: _Master, task: asyncio.Future[Any]) -> None:
    """Keep why ``master`` could not be reached (the cause of "not reached yet")."""
    master.failure = None if task.cancelled() else task.exception()


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
    module's documentation (aiolock/_redlock.py): tokens are written back
    to a majority before they are handed out, so they keep increasing when
    the quorum changes, including across a master that comes back empty;
    mutual exclusion rests on timing assumptions (bounded process pauses,
    clock drift and network delays), as Kleppmann pointed out.
    """

    __slots__ = (
        "_changed",
        "_holds",
        "_last",
        "_masters",
        "_outage",
        "_renewer",
        "_roster",
        "_waiting",
        "_watched",
        "drift",
        "lease",
        "majority",
    )

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
        self._masters = [_Master(e) for e in engines]
        self.drift = float(drift)
        self.majority = len(clients) // 2 + 1
        self.lease = min(e.lease for e in engines)
        self._holds: dict[str, Hold] = {}
        # Tasks parked waiting, per name (for RedlockLock.statistics()).
        self._waiting: dict[str, int] = {}
        self._watched: dict[Hold, None] = {}
        self._renewer: asyncio.Task[None] | None = None
        # The founding generations last seen (passed with every attempt), and
        # the last token handed out per name, for the proposal (bounded).
        self._roster: tuple[str, ...] = ()
        self._last: dict[str, int] = {}
        # Set when the last watched hold leaves: the renewal task ends at once.
        self._changed: asyncio.Event | None = None
        self._outage = Outage()  # a run of renewal rounds short of a majority

    def lock(self, name: str) -> RedlockLock:
        """The lock ``name`` over these masters (cheap: no I/O)."""
        return RedlockLock(self, name)

    def __repr__(self) -> str:
        return f"<Redlock {len(self._masters)} masters, {len(self._holds)} held here>"

    # -- what compete() needs (base.Contender) -----------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._masters[0].engine.loop

    @property
    def closed(self) -> bool:
        return any(m.engine.closed for m in self._masters)

    @property
    def unreachable(self) -> Outage:
        return self._masters[0].engine.unreachable

    @property
    def command_timeout(self) -> float:
        """How long an attempt waits for a master (a first contact gives up after it)."""
        return MASTER_TIMEOUT

    # -- HoldEngine (aiolock/_core/lease.py) ---------------------------------------------------

    def untrack(self, hold: Hold) -> None:
        self._watched.pop(hold, None)
        value = hold.release_args[0] if hold.release_args else None
        for master in self._masters:
            master.engine.evictions.values.pop(value, None)  # type: ignore[arg-type]
        if not self._watched and self._changed is not None:
            self._changed.set()

    def _heed(self, hold: Hold) -> None:
        """Hear at once of a force release of ``hold`` (redlock_force_release.lua
        publishes "v <value>" on the eviction channel of the Client its owner
        id names, on each master): lost once a majority can no longer be had."""
        value: str = hold.release_args[0]
        cid = value.partition(":")[0]
        told: set[int] = set()
        for i, master in enumerate(self._masters):
            engine = master.engine
            evictions = engine.evictions

            def deleted(_: object, i: int = i) -> None:
                told.add(i)
                if len(told) > len(self._masters) - self.majority:
                    hold.gone(FORCE_RELEASED)

            evictions.values[value] = deleted
            if engine.notify == "pubsub":
                evictions.listen((lost_prefix(engine.prefix) + cid).encode())

    def run_callback(self, callback: LostCallback, lease: Lease) -> None:
        self._masters[0].engine.run_callback(callback, lease)

    def check_usable(self) -> None:
        for master in self._masters:
            master.engine.check_usable()

    @property
    def observer(self) -> Observer:
        """The first Client's: Redlock's acquisitions, holds and losses count there."""
        return self._masters[0].engine.observer

    def release_hold(self, hold: Hold) -> asyncio.Future[int]:
        """Release ``hold`` on every master; the future gets 1 (released) or 0 (gone).

        Sent at once, decided from the replies' parse (no task): once a
        majority confirmed they deleted the key, or once one did and the
        others had ``MASTER_TIMEOUT`` to answer (a paused master does not
        hold the release up), or once every master answered. A master that
        failed or did not answer is released again in the background (by
        value: idempotent); with no confirmation at all, the release waits
        for those retries. It completes whatever happens to its caller.
        """
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[int] = loop.create_future()
        hold.releasing = outcome
        name, value = hold.name, hold.release_args[0]
        n, majority = len(self._masters), self.majority
        replies: list[Any] = [None] * n
        answered = 0
        finished = False
        timed_out = False

        def finish() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            timer.cancel()
            self._release_decided(hold, outcome, replies)

        def expired() -> None:
            nonlocal timed_out
            timed_out = True
            if 1 in replies:
                finish()

        def on_reply(i: int, reply: Any, error: BaseException | None) -> None:
            nonlocal answered
            if finished:
                return
            replies[i] = error if error is not None else reply
            answered += 1
            confirmed = sum(1 for r in replies if r == 1)
            if confirmed >= majority or answered == n or (timed_out and confirmed):
                finish()

        timer = loop.call_later(MASTER_TIMEOUT, expired)
        self._send(
            "redlock_release", lambda m: ((m.lock_key(name),), (value, m.channel(name))), on_reply
        )
        return outcome

    async def extend_hold(self, hold: Hold, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        errors: list[BaseException] = []
        results = await self._renew_on_all([hold], seconds, MASTER_TIMEOUT, errors)
        if sum(1 for r in results if r is not None and r[0] == 1) < self.majority:
            gone = sum(1 for r in results if r is not None and r[0] == 0)
            if gone > len(results) - self.majority:
                hold.gone("the hold was gone on a majority of masters when extended")
                raise LockNotOwnedError(
                    f"{hold.name!r}: the hold was gone on a majority of masters when extended"
                )
            # Too few answered to know: the hold stands until its validity ends.
            raise _too_few(
                f"Redlock {hold.name!r}: not extended",
                [*(r for r in results if r is not None), *errors],
                self.majority,
                len(results),
            )
        new_expiry = sent + self._validity(seconds)
        if new_expiry > hold.expires_at:
            hold.expires_at = new_expiry
            if hold.timer is not None:
                hold.timer.cancel()
                hold.timer = loop.call_at(new_expiry, hold.gone, FIXED_LEASE_EXPIRED)

    # -- internals ------------------------------------------------------------------------------

    def _enter_task(self) -> asyncio.Task[Any]:
        task = current_task()
        for master in self._masters:
            engine = master.engine
            engine.enter_task()
            if engine.cluster is True:
                raise UnsupportedServerError(
                    "Redlock needs standalone masters (one Client per independent server); "
                    "a Client here is in cluster mode"
                )
        return task

    async def _settle(self) -> None:
        """Have every Client find out its mode (one INFO on first use), so that
        a round sends at once, in order, on every master it reaches; refuse
        cluster mode."""
        unsettled = [m for m in self._masters if m.engine.cluster is None]
        if unsettled:
            # At most MASTER_TIMEOUT (a paused master): a master not settled by
            # then is left out of this attempt (and tried again by the next).
            # Once a majority is settled, the others are not waited for (each
            # attempt would wait MASTER_TIMEOUT for a paused master before it
            # asks the others): they settle in the background, for the next.
            tasks = [asyncio.ensure_future(m.engine.is_cluster()) for m in unsettled]
            for master, task in zip(unsettled, tasks, strict=True):
                task.add_done_callback(_collect)
                task.add_done_callback(functools.partial(_settled, master))
            if len(self._masters) - len(unsettled) < self.majority:
                await asyncio.wait(tasks, timeout=MASTER_TIMEOUT)
        if any(m.engine.cluster for m in self._masters):
            raise UnsupportedServerError(
                "Redlock needs standalone masters (one Client per independent server); "
                "a Client here is in cluster mode"
            )

    def _validity(self, lease: float) -> float:
        return lease - self.drift * lease - CLOCK_SLACK

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self._masters[0].engine.spawn(coro)

    async def _on_all(
        self,
        call: Callable[[_Master], Awaitable[Any]],
        timeout: float,
        enough: Callable[[list[Any]], bool] | None = None,
    ) -> list[Any]:
        """Run ``call`` on every master at once; the replies in master order
        (an exception where it failed, None where none came in time).
        Returns early once ``enough(replies)``; a call still running then is
        cancelled (every call passed here is idempotent or undone by value)."""
        tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(call(m)) for m in self._masters]
        replies: list[Any] = [None] * len(tasks)
        try:
            pending: set[asyncio.Future[Any]] = set(tasks)
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            while pending:
                left = end - loop.time()
                if left <= 0:
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task.cancelled():
                        continue
                    error = task.exception()
                    replies[tasks.index(task)] = error if error is not None else task.result()
                if enough is not None and enough(replies):
                    break
        finally:
            _cancel_all(list(tasks))
        return replies

    def _send(
        self,
        script: str,
        call: Callable[[_Master], tuple[tuple[Any, ...], tuple[Any, ...]]],
        on_reply: Callable[[int, Any, BaseException | None], None],
    ) -> None:
        """Send ``script`` to every master at once (``call(master)``: its KEYS
        and ARGV); ``on_reply(i, reply, error)`` is called once per master,
        from the reply's parse (``Engine.send_script``: no task per call)."""

        def handler(i: int, master: _Master, keys: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
            retried = False

            def reply(value: Any, error: BaseException | None) -> None:
                nonlocal retried
                if isinstance(error, NoScriptError) and not retried:
                    # Flushed (a restart, SCRIPT FLUSH): load it and run it again,
                    # sent from this very reply, so that it stays ahead of any
                    # later command of ours (an undo must run after it).
                    retried = True
                    engine = master.engine
                    engine.mux.send(
                        b"SCRIPT", b"LOAD", engine.scripts[script].source, callback=_ignore
                    )
                    engine.send_script(script, keys, args, reply)
                    return
                on_reply(i, value, error)

            return reply

        for i, master in enumerate(self._masters):
            if master.engine.cluster is None:
                # Not settled (never reached): its first command would wait for
                # that, and a later undo could overtake it. Nothing is sent.
                error = ConnectionFailedError(
                    "this master was not reached yet"
                    + (f" ({master.failure})" if master.failure is not None else "")
                )
                if master.failure is not None:
                    error.__cause__ = _redis_cause(master.failure)
                on_reply(i, None, error)
                continue
            keys, args = call(master)
            master.engine.send_script(script, keys, args, handler(i, master, keys, args))

    async def _round(
        self,
        script: str,
        call: Callable[[_Master], tuple[tuple[Any, ...], tuple[Any, ...]]],
        timeout: float,
        enough: Callable[[list[Any]], bool] | None = None,
        late: Callable[[int], None] | None = None,
    ) -> list[Any]:
        """Send ``script`` to every master at once (``call(master)``: its KEYS
        and ARGV) and return the replies in master order: an exception where
        it failed, None where none came within ``timeout`` or before
        ``enough(replies)``. No task per call: each reply is taken from its
        parse (``Engine.send_script``). A reply that comes later is dropped
        (every script sent here is idempotent or undone by value), unless
        ``late`` is given: then it is stored in the returned list (which is
        the round's own) and ``late(i)`` is called."""
        loop = asyncio.get_running_loop()
        n = len(self._masters)
        replies: list[Any] = [None] * n
        answered = 0
        done: asyncio.Future[None] = loop.create_future()

        def on_reply(i: int, reply: Any, error: BaseException | None) -> None:
            nonlocal answered
            if done.done():
                if late is not None:
                    replies[i] = error if error is not None else reply
                    late(i)
                return
            replies[i] = error if error is not None else reply
            answered += 1
            if answered == n or (enough is not None and enough(replies)):
                done.set_result(None)

        self._send(script, call, on_reply)
        if not done.done():
            try:
                async with asyncio.timeout(timeout):
                    await done
            except TimeoutError:
                pass
        if not done.done():
            done.set_result(None)  # later replies are dropped (or given to `late`)
        return replies if late is not None else list(replies)

    def _undo(self, name: str, value: str) -> list[asyncio.Task[Any]]:
        """Release ``value`` on every master, in the background (retried,
        idempotent: also where the attempt's reply was lost or it never ran)."""

        async def one(master: _Master) -> None:
            try:
                await master.engine.retry(
                    "redlock_release", (master.lock_key(name),), (value, master.channel(name))
                )
            except Exception as exc:  # the key expires by its TTL
                log.debug("Redlock undo of %r failed on a master: %r", name, exc)

        return [self._spawn(one(m)) for m in self._masters]

    async def _undo_and_wait(self, name: str, value: str, replies: list[Any]) -> None:
        """``_undo``, awaited (at most ``UNDO_WAIT``) on the masters that answered;
        on the others it goes on in the background."""
        tasks = self._undo(name, value)
        answered = [t for t, r in zip(tasks, replies, strict=True) if isinstance(r, list)]
        if answered:
            await asyncio.wait(answered, timeout=UNDO_WAIT)

    async def _attempt(
        self, name: str, value: str, lease_s: float, loop: asyncio.AbstractEventLoop
    ) -> tuple[tuple[int, float] | None, float | None]:
        """One attempt with ``value`` (unique to it): ((token, validity end),
        None), or (None, how long to wait at most before the next).

        On failure everything it took is released before it returns; if it is
        cancelled or raises, the caller undoes ``value`` (``_undo``)."""
        await self._settle()
        start = loop.time()
        validity = self._validity(lease_s)
        ms = to_ms(lease_s)
        n = len(self._masters)
        majority = self.majority
        per_call = min(validity / 2, MASTER_TIMEOUT)
        known = self._roster
        # A proposed token, accepted in the same round trip where the masters
        # can (the usual case): above the last token seen for the name, ahead
        # of the clocks. None until the roster is known.
        proposed = (
            max(self._last.get(name, 0) + 1, time.time_ns() // 1000 + PROPOSAL_LEAD_US)
            if known
            else 0
        )
        common = (proposed, to_ms(FENCE_RETENTION), _RETENTION_US, *known)

        def acquire(master: _Master) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            # A random generation id of its own, used if the master has none yet.
            return master.keys(name).acquire, (value, ms, secrets.token_hex(8), *common)

        def decided(replies: list[Any]) -> bool:
            # A majority accepted the proposed token (it implies a grant); or
            # the outcome of a failed attempt is known: busy on more masters
            # than a minority (held, whatever the rest say), or failed on more
            # (too few can answer: ConnectionFailedError). A mix of both (one
            # busy, one unreachable of three) waits for the rest: a "busy"
            # still to come makes it busy, not a connection failure. Else a
            # majority granted (a master that answers later and grants too is
            # part of the hold: renewed and released by value). Until some
            # master shows the roster, wait for every reply (a new deployment
            # founds the roster only from all N).
            answers = [r for r in replies if isinstance(r, list)]
            if sum(1 for r in answers if r[6] == 1) >= majority:
                return True
            granted = sum(1 for r in answers if r[0] == 1)
            busy = len(answers) - granted
            failed = sum(1 for r in replies if r is not None) - len(answers)
            if busy > n - majority or failed > n - majority:
                return True
            rostered = any(r[5] for r in answers)
            return granted >= majority and (rostered or None not in replies)

        handed: list[int] = []  # the token, once handed out

        def late(i: int) -> None:
            # A read that came after the attempt decided: seed its master if it
            # refused or could not vouch (see _accepted); not if it accepted
            # the token handed out (the proposal).
            if not handed:
                return
            reply = replies[i]
            if not (isinstance(reply, list) and reply[6] == 1 and handed[0] == proposed):
                self._seed(name, handed[0], i, reply, None, start)

        replies = await self._round("redlock_acquire", acquire, per_call, decided, late)
        answers = [r for r in replies if isinstance(r, list)]
        granted = sum(1 for r in answers if r[0] == 1)
        for r in replies:
            if isinstance(r, BaseException) and not _transient(r):
                await self._undo_and_wait(name, value, replies)
                raise r
        gens = [_decode(r[4]) for r in answers]
        if len({g.split("/", 1)[0] for g in gens}) < len(gens):
            await self._undo_and_wait(name, value, replies)
            raise InvalidArgumentError(
                "two Clients of this Redlock reach the same server: Redlock needs one "
                "Client per independent master"
            )
        if granted < majority:
            await self._undo_and_wait(name, value, replies)
            if len(answers) < majority:
                raise _too_few(f"Redlock {name!r}", replies, majority)
            busy = [int(r[1]) for r in answers if r[0] == 0]
            ttls = [t for t in busy if t > 0]
            hint = min(ttls) / 1000.0 if ttls else (lease_s if busy else _backoff(lease_s))
            return None, hint
        roster: set[str] = set()
        for r in answers:
            roster.update(_decode(x) for x in r[5])
        if not roster and len(answers) == n:
            roster = {g.split("/", 1)[0] for g in gens}  # a new deployment: found the roster
        if roster:
            self._roster = tuple(sorted(roster))
        codes = [r[6] if isinstance(r, list) else None for r in replies]
        if sum(1 for c in codes if c == 1) >= majority:
            if loop.time() >= start + min(validity, ATTEMPT_LIMIT):
                await self._undo_and_wait(name, value, replies)
                return None, _backoff(lease_s)
            handed.append(proposed)
            self._accepted(name, proposed, replies, codes, start)
            return (proposed, start + validity), None
        # The write-back round: a token above every counter read (and above
        # the proposal, where it was accepted), never below a server clock.
        token = proposed + 1 if 1 in codes else 0
        for r in answers:
            counter = _decode(r[2])
            token = max(token, int(_decode(r[3])), int(counter) + 1 if counter else 0)
        founders = sorted(roster)

        def fence(master: _Master) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            keys = master.keys(name).write_back
            args = (
                token,
                to_ms(FENCE_RETENTION),
                _RETENTION_US,
                secrets.token_hex(8),
                "",
                0,
                *founders,
            )
            return keys, args

        def accepted(replies: list[Any]) -> int:
            return sum(1 for r in replies if isinstance(r, list) and r[0] == 1)

        left = start + validity - loop.time()
        acks = await self._round(
            "redlock_fence",
            fence,
            max(min(left, MASTER_TIMEOUT), 0.0),
            lambda rs: accepted(rs) >= majority,
        )
        if accepted(acks) >= majority and loop.time() < start + min(validity, ATTEMPT_LIMIT):
            handed.append(token)
            self._accepted(
                name,
                token,
                replies,
                [a[0] if isinstance(a, list) else None for a in acks],
                start,
            )
            return (token, start + validity), None
        await self._undo_and_wait(name, value, replies)
        return None, _backoff(lease_s)

    def _accepted(
        self, name: str, token: int, replies: list[Any], codes: list[Any], start: float
    ) -> None:
        """A majority accepted ``token``: remember it as the name's last, and
        seed it, in the background, on the masters that refused it as
        untrusted (back empty), so that they vouch for the name from now on.
        Safe: the token is above every token handed out before, and it is
        written only if the master's generation is still the one the attempt
        read (see redlock_fence.lua)."""
        last = self._last
        last.pop(name, None)
        last[name] = token
        if len(last) > LAST_TOKENS:
            del last[next(iter(last))]
        for i, (reply, code) in enumerate(zip(replies, codes, strict=True)):
            self._seed(name, token, i, reply, code, start)

    def _seed(self, name: str, token: int, i: int, reply: Any, code: Any, start: float) -> None:
        """Seed master ``i`` with ``token`` (a majority accepted it) if it
        refused it as untrusted (``code`` -1), or did not answer in time and
        its counter was absent when ``reply`` read it. A seed where it is not
        needed changes nothing; one is never sent without the read (its
        generation is the guard).

        Only if the attempt (started at ``start``, on the loop's clock) began
        at least ``ATTEMPT_LIMIT`` after the master's generation was created:
        its read there shows the generation's age on the server's clock, and
        the attempt began at most ``now - start`` before that read. Then every
        attempt that reached the master's previous life had ended (handed out
        or given up) before this one began, so ``token`` is above each token
        they handed out; a seed from an attempt that overlapped them could
        be below one (a late reply of a slow request, say)."""
        if not isinstance(reply, list) or not (
            code == -1 or (code is None and not _decode(reply[2]))
        ):
            return
        seed_gen, created = _decode(reply[4]).split("/")[:2]
        age_us = int(_decode(reply[3])) - int(created)
        before_read = asyncio.get_running_loop().time() - start
        if age_us < (ATTEMPT_LIMIT + before_read) * 1_000_000:
            return
        master = self._masters[i]
        keys = master.keys(name).write_back
        args = (
            token,
            to_ms(FENCE_RETENTION),
            _RETENTION_US,
            secrets.token_hex(8),
            seed_gen,
            int(ATTEMPT_LIMIT * 1_000_000),
        )
        self._spawn(self._quietly(master.engine.eval("redlock_fence", keys, args)))

    @staticmethod
    async def _quietly(call: Awaitable[Any]) -> None:
        try:
            await call
        except Exception as exc:  # a best effort: the next write-back may seed it
            log.debug("Redlock seed failed: %r", exc)

    def _release_decided(
        self, hold: Hold, outcome: asyncio.Future[int], replies: list[Any]
    ) -> None:
        """The first replies of a release are in (see ``release_hold``).
        Every master that failed or had not answered yet is released again
        in the background (by value: idempotent), also when a majority
        confirmed; the caller waits for those only when none confirmed."""
        name, value = hold.name, hold.release_args[0]

        async def again(master: _Master) -> Any:
            try:
                return await master.engine.retry(
                    "redlock_release", (master.lock_key(name),), (value, master.channel(name))
                )
            except Exception as exc:
                return exc

        retries = [
            self._spawn(again(m))
            for m, r in zip(self._masters, replies, strict=True)
            if isinstance(r, BaseException) or r is None
        ]
        if retries and 1 not in replies:
            self._spawn(self._release_slowly(hold, outcome, replies, retries))
        else:
            self._release_done(hold, outcome, replies)

    async def _release_slowly(
        self,
        hold: Hold,
        outcome: asyncio.Future[int],
        replies: list[Any],
        retries: list[asyncio.Task[Any]],
    ) -> None:
        try:
            await asyncio.wait(retries)
        except BaseException as exc:  # cancelled (the Client closing)
            hold.releasing = None
            hold.mark_lost(f"release failed: {exc!r}")
            if not outcome.done():
                outcome.set_exception(exc)
            raise
        self._release_done(hold, outcome, [*replies, *(t.result() for t in retries)])

    def _release_done(self, hold: Hold, outcome: asyncio.Future[int], replies: list[Any]) -> None:
        name = hold.name
        codes = [int(r) for r in replies if isinstance(r, int)]
        if not codes:
            error = next((r for r in replies if isinstance(r, BaseException)), None)
            hold.releasing = None
            hold.mark_lost(f"release failed: {error!r}")
            if not outcome.done():
                failure = ConnectionFailedError(
                    f"Redlock {name!r}: no master could be reached to release it; "
                    "it frees itself when its lease runs out"
                )
                failure.__cause__ = None if error is None else _redis_cause(error)
                outcome.set_exception(failure)
            return
        code = 1 if any(codes) else 0
        if code == 0 and not hold.lost:
            hold.mark_lost("the hold was gone when released (expired or force-released)")
        hold.detach()
        if not outcome.done():
            outcome.set_result(code)

    async def _renew_on_all(
        self,
        holds: list[Hold],
        seconds: float,
        timeout: float,
        errors: list[BaseException] | None = None,
    ) -> list[list[int] | None]:
        """Renew ``holds`` on every master (one call each): per master, one 1/0
        per hold, or None where it failed (the error added to ``errors``) or
        did not answer in time."""
        ms = to_ms(seconds) if seconds > 0 else 0  # (0: only check: fixed leases)

        def renew(master: _Master) -> Awaitable[Any]:
            keys = tuple(master.lock_key(h.name) for h in holds)
            args = (ms, *(h.release_args[0] for h in holds))
            engine = master.engine
            return engine.eval("redlock_renew", keys, args, mux=engine.renew_mux)

        replies = await self._on_all(renew, timeout)
        if errors is not None:
            errors.extend(r for r in replies if isinstance(r, BaseException))
        return [[int(x) for x in r] if isinstance(r, list) else None for r in replies]

    def _watch(self, hold: Hold) -> None:
        self._watched[hold] = None
        if self._renewer is None or self._renewer.done():
            self._renewer = self._spawn(self._renew_loop())

    async def _renew_loop(self) -> None:
        """The watchdog of this Redlock: every lease / 3, renew every watched
        hold on every master; a hold renewed on a majority gets a new
        validity; one gone on a majority, or past its validity, is lost."""
        try:
            await self._renew_rounds()
        except asyncio.CancelledError:
            # The Client is closing (aclose cancels its background tasks).
            for hold in list(self._watched):
                hold.mark_lost(CLIENT_CLOSED)
            raise

    async def _renew_rounds(self) -> None:
        loop = asyncio.get_running_loop()
        period = self.lease / 3
        next_round = loop.time() + period
        changed = self._changed = asyncio.Event()
        while self._watched:
            changed.clear()  # (set when the last hold left; holds were added since)
            now = loop.time()
            earliest = min((h.expires_at for h in self._watched if h.watchdog), default=next_round)
            if now < next_round:
                try:
                    async with asyncio.timeout(min(next_round, earliest) - now):
                        await changed.wait()  # set when nothing is left to renew
                except TimeoutError:
                    pass
                self._expire(loop.time())
                continue
            # Fixed leases are checked (lease 0: nothing extended), in a call of their own.
            renewed = [h for h in self._watched if h.watchdog]
            checked = [h for h in self._watched if not h.watchdog]
            sent = loop.time()
            timeout = max(min(period, earliest - sent), 0.001)
            rounds = [(hs, lease) for hs, lease in ((renewed, self.lease), (checked, 0.0)) if hs]
            try:
                replies = await asyncio.gather(
                    *(self._renew_on_all(holds, lease, timeout) for holds, lease in rounds)
                )
            except Exception as exc:  # never let the watchdog die
                log.warning("Redlock renewal round failed: %r", exc)
                replies = [[None] * len(self._masters) for _ in rounds]
            short = 0  # holds renewed on no majority this round
            for (holds, lease), results in zip(rounds, replies, strict=True):
                for i, hold in enumerate(holds):
                    if hold not in self._watched:
                        continue
                    alive = sum(1 for r in results if r is not None and r[i] == 1)
                    gone = sum(1 for r in results if r is not None and r[i] == 0)
                    if alive >= self.majority:
                        if lease:
                            hold.renewed(sent, self._validity(self.lease))
                    elif gone > len(self._masters) - self.majority:
                        hold.gone("the hold was gone on a majority of masters")
                    else:
                        short += 1
            lost = len(self._watched)
            self._expire(loop.time())
            lost -= len(self._watched)
            outage = self._outage
            if short:
                if outage.failed():
                    log.warning(
                        "Redlock renewals reached %d of %d masters, short of a majority "
                        "(%d); retrying each round, a lease is lost when its validity ends",
                        sum(1 for r in replies[0] if r is not None),
                        len(self._masters),
                        self.majority,
                    )
                outage.note(lost)
            else:
                run = outage.ended()
                if run is not None:
                    log.info(
                        "Redlock renewals reach a majority again after %.1f s; %d rounds "
                        "fell short meanwhile, %d leases lost",
                        run.seconds,
                        run.failures,
                        run.noted,
                    )
            next_round = sent + period
        run = self._outage.ended()
        if run is not None:
            log.info(
                "Redlock renewals fell short of a majority %d times over %.1f s, until "
                "nothing was left to renew; %d leases lost",
                run.failures,
                run.seconds,
                run.noted,
            )

    def _expire(self, now: float) -> None:
        for hold in list(self._watched):
            if now >= hold.expires_at:
                hold.gone("could not renew it on a majority of masters before its validity ended")


def _ignore(reply: Any, error: BaseException | None) -> None:
    return None


def _transient(exc: BaseException) -> bool:
    """A failure of one master that counts as "no reply" (the others decide)."""
    return isinstance(exc, (*TRANSIENT, TimeoutError))


def _too_few(
    message: str, replies: list[Any], majority: int, n: int | None = None
) -> ConnectionFailedError:
    """The error for a decision that too few masters answered to take: it
    says how many of ``n`` (``len(replies)``) answered (a reply other than
    None or an exception), and redis-py's error (the first one) is its cause."""
    causes = [_redis_cause(r) for r in replies if isinstance(r, BaseException)]
    answered = sum(1 for r in replies if r is not None and not isinstance(r, BaseException))
    n = n or len(replies)
    if len(causes) > n - majority:  # (decided without waiting for the others)
        why = f"{len(causes)} of {n} masters could not be reached ({causes[0]})"
    else:
        why = f"only {answered} of {n} masters answered"
    error = ConnectionFailedError(
        f"{message}: {why}; a majority ({majority}) must answer. Check that the masters "
        "are up and reachable"
    )
    # redis-py's error where one came back (a master not reached yet has none).
    error.__cause__ = next(
        (c for c in causes if not isinstance(c, AiolockError)), causes[0] if causes else None
    )
    return error


def _redis_cause(error: BaseException) -> BaseException:
    """redis-py's (or the OS') exception behind an AiolockError, else ``error``."""
    cause = error.__cause__
    return cause if isinstance(error, ConnectionFailedError) and cause is not None else error


def _backoff(lease: float) -> float:
    """A short random pause before retrying an attempt that failed without a holder."""
    return min(lease / 10, 0.05) * (0.5 + secrets.randbelow(1000) / 2000)


class RedlockLock(Acquirable[Lease]):
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
      quorum, including a master that came back empty (see the module
      documentation for the rule and its limits).
    """

    __slots__ = ("_entry_map", "_redlock", "name")

    def __init__(self, redlock: Redlock, name: str) -> None:
        self.name = check_name(name)
        self._redlock = redlock
        self._entry_map: dict[asyncio.Task[Any], list[_Entry]] = {}

    kind = "redlock"

    def _entries(self) -> dict[asyncio.Task[Any], list[_Entry]]:
        return self._entry_map

    def _observer(self) -> Observer:
        return self._redlock.observer

    def _my_hold(self) -> Hold | None:
        hold = self._redlock._holds.get(self.name)
        if hold is None or hold.task is not asyncio.current_task():
            return None
        return hold

    async def _acquire(self, timeout: float | None, lease: float | None) -> Lease:
        rl = self._redlock
        task = rl._enter_task()
        loop = task.get_loop()
        hold = rl._holds.get(self.name)
        if hold is not None and hold.task is task and hold.releasing is None and not hold.lost:
            return hold.new_lease()
        lease_s = rl.lease if lease is None else lease
        if rl._validity(lease_s) <= 0:
            raise InvalidArgumentError(
                f"lease {lease_s!r} s is too short for Redlock (drift {rl.drift}): "
                f"nothing of it would be valid"
            )
        owner = rl._masters[0].engine.owner(task)
        name = self.name
        deadline = None if timeout is None else loop.time() + timeout
        current: str | None = None

        async def attempt() -> tuple[tuple[int, float] | None, float | None]:
            nonlocal current
            # Known before anything is sent: an attempt cancelled anywhere is undone by it.
            current = f"{owner}|{secrets.token_hex(8)}"
            return await rl._attempt(name, current, lease_s, loop)

        def waiter() -> Waiter:
            return _AnyWaiter(
                [m.engine.pubsub_waiter(m.channel(name)) for m in rl._masters], rl.majority
            )

        def abandon() -> None:
            if current is not None:
                rl._undo(name, current)

        def parked(value: bool) -> None:
            waiting = rl._waiting.get(name, 0) + (1 if value else -1)
            if waiting > 0:
                rl._waiting[name] = waiting
            else:
                rl._waiting.pop(name, None)

        try:
            (token, valid_until), _ = await compete(
                rl,
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
            rl,
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
        rl._holds[name] = hold
        rl.observer.hold_began(hold)

        def detached(h: Hold) -> None:
            if rl._holds.get(name) is h:
                del rl._holds[name]

        hold.on_detach = detached
        if lease is not None:
            hold.timer = loop.call_at(valid_until, hold.gone, FIXED_LEASE_EXPIRED)
        rl._watch(hold)  # renewed, or (a fixed lease) checked each round
        rl._heed(hold)
        return hold.new_lease()

    async def release(self) -> None:
        """Release the current task's most recent acquisition (see ``Lease.release``)."""
        self._redlock.check_usable()
        hold = self._my_hold()
        if hold is None or not hold.leases:
            raise LockNotOwnedError(
                f"Redlock {self.name!r} is not held by the current task; "
                "release it from the task that acquired it, or call lease.release()"
            )
        await hold.leases[-1].release()

    async def _each(self, command: Callable[[_Master], Awaitable[Any]]) -> list[Any]:
        self._redlock._enter_task()
        return await self._redlock._on_all(command, MASTER_TIMEOUT)

    def _decide(self, replies: list[Any], yes: Callable[[Any], bool], what: str) -> bool:
        """True when ``yes`` holds for a majority of the answers, False when it
        fails for more than a minority; else too few masters answered to know:
        ConnectionFailedError (redis-py's error, or the timeout, as its cause)."""
        rl = self._redlock
        n, majority = len(rl._masters), rl.majority
        answers = [r for r in replies if r is not None and not isinstance(r, BaseException)]
        ayes = sum(1 for r in answers if yes(r))
        if ayes >= majority:
            return True
        if len(answers) - ayes > n - majority:
            return False
        raise _too_few(f"Redlock {self.name!r}: cannot tell {what}", replies, majority)

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

    async def hold_count(self) -> int:
        """How many times the current task holds the lock (0 if not). No round trip."""
        self._redlock._enter_task()
        hold = self._my_hold()
        return hold.count if hold is not None else 0

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
        return ttls[self._redlock.majority - 1]

    async def force_release(self) -> bool:
        """Delete the lock on every master whoever holds it; True if it was held on any.

        The evicted holder's lease is lost: at once in this Redlock; in
        another, as soon as a majority of its masters told it through their
        eviction channels (pub/sub mode, connected), else at its next
        renewal or check (every ``lease / 3``, fixed leases included).
        Fencing tokens keep increasing.
        """
        name = self.name
        replies = await self._each(
            lambda m: m.engine.eval(
                "redlock_force_release",
                (m.lock_key(name),),
                (m.channel(name), lost_prefix(m.engine.prefix)),
            )
        )
        hold = self._redlock._holds.get(name)
        if hold is not None:
            hold.mark_lost("force-released")
        if any(r == 1 for r in replies):
            return True
        # Nothing deleted where it answered: "not held" only if a majority said so.
        rl = self._redlock
        if sum(1 for r in replies if r == 0) > len(rl._masters) - rl.majority:
            return False
        raise _too_few(
            f"Redlock {name!r}: force-release deleted nothing where it reached, and cannot "
            "tell whether it was held",
            replies,
            rl.majority,
        )

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self._redlock.loop

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        """This process's hold of the name through this Redlock, and its parked tasks."""
        rl = self._redlock
        hold = rl._holds.get(self.name)
        return ((hold,) if hold is not None else ()), rl._waiting.get(self.name, 0)
