"""FairLock: a reentrant lock granted in strict FIFO order across every Client.

How it works
------------
Every acquire call that has to wait gets its own entry in a queue in Redis,
in the order the calls reached Redis (the tasks of one Client share one
pipelined connection, so their order is the order they called ``acquire``).
The entry names the call: a *waiter id* ``<client id>:<task>:<call>:<lease
ms>:<grace ms>:<mode>`` (see ``scripts/_fair_queue.lua`` for the layout).

* **Handoff.** A release hands the lock, inside its script, straight to the
  first live entry (a new fencing token, the entry's lease) and sends one
  message to that entry's Client only (``<prefix>:{<name>}:ch:<client id>``,
  or that Client's signal list in ``"list"`` mode). The message names the
  waiter, so the Client wakes that one task; it confirms with one more run
  of the acquire script and installs the hold. Nothing else is woken: the
  Redis work per handoff does not depend on the number of waiters.
* **Liveness.** An entry is live while its Client's liveness record for the
  name is: one record per (Client, name), refreshed by the acquire script
  and by the Client's watchdog (one batched script call per round, whatever
  the number of waiting tasks) every ``lease / 3``. So a waiter is never
  dropped however long it waits, and the entries of a Client that died lapse
  one lease after its last renewal and are skipped. A hold handed to a
  waiter that died in between lasts ``min(its lease, its Client's lease)``
  until it is confirmed: a crashed waiter delays the queue by at most one
  lease. (The next Client in line is told when that handed hold would
  expire, so it checks back then rather than at its own, possibly longer,
  bound; so it is when a waiter takes the lock from the head of the queue
  itself, and a Client whose hold ends without a release wakes its own
  waiting calls: a hold that simply runs out never leaves the lock idle for
  the longer TTL an older hold had.)
* **Leaving.** An acquire that gives up (cancelled, timed out, Client
  closed, reply lost) takes its entry out at once, and passes the lock on if
  it had been handed to it meanwhile (``fair_leave``, run in the background).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._core.errors import ClientClosedError
from .._core.futures import expire, retrieve
from .._core.holds.lease import Hold, Lease
from .._core.owner import task_serial
from .._core.protocol.keys import FairKeys
from .._core.validate import to_ms
from .._core.waiting.listener import WAKE_ALL, Channel
from .._core.waiting.parking import Parked, ParkingLot
from .base import Entry, SingleHolder, current_task
from .compete import compete, ttl_hint

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["FairLock"]

_MODES = {"pubsub": "p", "list": "l", "poll": "x"}


class _Ticket:
    """One waiting acquire call: its queue entry's id and how its task is woken.

    It is the ``Waiter`` that ``compete`` parks on, in the name's ParkingLot
    (``_parked``: its entry there while it is parked): ``wake()`` (the lock
    was handed to this call, or the channel was resynchronised) ends the park
    at once, or the next one if it is not parked now; ``nudge(s)`` only
    brings the end of the park forward to ``s`` seconds from now.
    """

    __slots__ = (
        "_parked",
        "_permit",
        "_polls",
        "_recheck",
        "_timer",
        "_until",
        "channel",
        "queued",
        "state",
        "wid",
    )

    def __init__(self, state: _FairState, wid: str) -> None:
        self.state = state
        self.wid = wid
        self.channel: Channel | None = None
        # True once Redis answered that the call is in the queue.
        self.queued = False
        self._parked: Parked | None = None
        self._permit = False
        self._recheck: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._until: float | None = None
        self._polls = 0

    # -- driven by messages ----------------------------------------------------------------

    def wake(self) -> None:
        parked = self._parked
        if parked is None or not self.state.lot.wake(parked):
            self._permit = True

    def nudge(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time() + seconds
        parked = self._parked
        if parked is not None and not parked.fut.done():
            fut = parked.fut
            if self._until is None or at < self._until:
                self._until = at
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = loop.call_at(at, expire, fut)
        elif self._recheck is None or at < self._recheck:
            self._recheck = at

    # -- the Waiter protocol (see _notify) ---------------------------------------------------

    def register(self) -> _Ticket:
        if self.channel is None:
            self.channel = self.state.subscribe()
        return self

    async def ready(self, bound: float | None) -> None:
        channel = self.channel
        if channel is not None and self.state.engine.notify == "pubsub":
            await channel.confirmed(bound)

    async def wait(self, timeout: float | None) -> bool:
        if self._permit:
            self._permit = False
            return True
        if self.state.closed:
            raise ClientClosedError("the aiolock Client was closed while waiting")
        loop = asyncio.get_running_loop()
        engine = self.state.engine
        if engine.notify == "poll":  # no messages: capped exponential backoff
            # ... and often enough to confirm a handoff well within its first TTL.
            delay = min(engine.backoff.delay(self._polls), engine.lease / 3)
            self._polls += 1
            timeout = delay if timeout is None else min(timeout, delay)
        until = None if timeout is None else loop.time() + max(timeout, 0.0)
        recheck, self._recheck = self._recheck, None
        if recheck is not None and (until is None or recheck < until):
            until = recheck
        fut: asyncio.Future[bool] = loop.create_future()
        self._parked = parked = Parked(fut)
        self._until = until
        lot = self.state.lot
        self._timer = lot.park(parked, until)
        try:
            return await fut
        finally:
            self._parked = None
            self._until = None
            lot.unparked(self._timer)  # (nudge() may have replaced the timer)
            self._timer = None

    def close(self, *, linger: bool = False) -> None:
        channel, self.channel = self.channel, None
        if channel is not None:
            self.state.unsubscribe(channel)


class _Liveness:
    """The watchdog's item for one (Client, name): keeps all its queue entries alive."""

    __slots__ = ("expires_at", "renew_args", "renew_key", "renew_script", "state")

    def __init__(self, state: _FairState) -> None:
        self.state = state
        self.renew_script = "fair_live"
        self.renew_key = state.queue_key
        self.renew_args: tuple[Any, ...] = (state.engine.id,)
        self.expires_at = 0.0

    def renewed(self, sent: float, lease: float) -> None:
        self.expires_at = max(self.expires_at, sent + lease)

    def gone(self, reason: str) -> None:
        # The record lapsed (renewals failed for a whole lease): entries may have
        # been dropped. Every waiter tries again, and queues up again if it must.
        self.state.engine.untrack(self)
        for ticket in list(self.state.tickets.values()):
            ticket.wake()


class _FairState:
    """One fair lock name in one Client: its local holds and waiting calls."""

    __slots__ = (
        "channel_name",
        "closed",
        "engine",
        "held",
        "key",
        "keys",
        "live",
        "lot",
        "queue_key",
        "signal_key",
        "tail",
        "tickets",
    )

    def __init__(self, lock: FairLock) -> None:
        engine = lock._engine
        self.engine = engine
        names = lock._names
        self.key = names.local
        self.keys = names.all
        self.tail = names.templates
        self.queue_key = names.queue
        self.channel_name = names.client_channel(engine.id)
        self.signal_key = names.client_signal(engine.id)
        self.held: list[Hold] = []
        self.tickets: dict[str, _Ticket] = {}
        # The calls' tickets parked right now (woken by id: see dispatch).
        self.lot: ParkingLot[Parked] = ParkingLot()
        self.live = _Liveness(self)
        self.closed = False

    # -- the Client's interface -----------------------------------------------------------

    def holds(self) -> list[Hold]:
        return list(self.held)

    def waiting(self) -> int:
        """Calls queued in Redis (a call whose first try is still on the wire is not yet)."""
        # (A copy first, in one step: statistics() may ask from another thread.)
        return sum(1 for ticket in tuple(self.tickets.values()) if ticket.queued)

    def close(self) -> None:
        """The Client is closing: fail the waiting calls and take their entries out now."""
        self.closed = True
        engine = self.engine
        engine.untrack(self.live)
        self.lot.close()
        for ticket in list(self.tickets.values()):
            args = (ticket.wid, engine.retention_ms, *self.tail)
            engine.submit_script("fair_leave", self.keys, args).add_done_callback(retrieve)

    # -- messages -------------------------------------------------------------------------

    def dispatch(self, message: bytes) -> None:
        """A message on this Client's channel (or list) of the name: see _fair_queue.lua."""
        if message == WAKE_ALL:  # resynchronised: messages may have been missed
            for each in list(self.tickets.values()):
                each.wake()
            return
        wid, _, ms = message.partition(b" ")
        ticket = self.tickets.get(wid.decode("ascii", "replace"))
        if ticket is None:
            return  # a call that has finished (its own retry confirmed, or it left)
        if not ms:
            ticket.wake()
        elif ms.isdigit():
            ticket.nudge(int(ms) / 1000.0)

    def subscribe(self) -> Channel | None:
        channel = self.engine.subscribe(self.channel_name, self.signal_key)
        if channel is not None:
            channel.handler = self.dispatch
        return channel

    def unsubscribe(self, channel: Channel) -> None:
        self.engine.unsubscribe(channel)

    # -- bookkeeping -------------------------------------------------------------------------

    def add(self, wid: str) -> _Ticket:
        ticket = self.tickets[wid] = _Ticket(self, wid)
        return ticket

    def remove(self, ticket: _Ticket) -> None:
        self.tickets.pop(ticket.wid, None)
        if not self.tickets:
            self.engine.untrack(self.live)
            self.live.expires_at = 0.0
        self._maybe_idle()

    def keep_alive(self, sent: float) -> None:
        """Redis refreshed this Client's liveness record: the watchdog keeps it up."""
        if self.closed or not self.tickets:
            return
        live = self.live
        live.expires_at = max(live.expires_at, sent + self.engine.lease)
        if not self.engine.renewing(live):
            self.engine.renew(live)

    def hold_ended(self, hold: Hold) -> None:
        try:
            self.held.remove(hold)
        except ValueError:
            pass
        if hold.lost_reason is not None:
            # It ended without a release (its fixed lease ran out, or it was
            # found gone): nobody tells this Client's waiting calls, which may
            # be next in line (the other Clients' next one was nudged when the
            # hold was taken, see fair_nudge): each tries again now.
            for ticket in list(self.tickets.values()):
                ticket.wake()
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if not self.held and not self.tickets:
            self.engine.drop_state(self.key, self)


class FairLock(SingleHolder):
    """A reentrant distributed lock granted in strict FIFO order across all Clients.

    * **Fairness:** strict FIFO per acquire call, across every Client and
      process: calls that must wait are queued in Redis in the order they
      reach it (one Client's tasks keep the order in which they called
      ``acquire``), and the lock goes to them in that order. A free lock is
      never taken past a live waiter, not even by ``try_acquire()``.
    * **Who may release:** the task that acquired it, with ``release()``; or
      anyone holding the returned :class:`Lease`, with ``lease.release()``.
      A release hands the lock directly to the next live waiter and wakes
      only that waiter's Client.
    * **Reentrant** per asyncio Task: the holder may acquire again (no round
      trip, no queueing) and must release as many times; a re-entry returns
      the holder's fencing token.
    * **Waiters and crashes:** a waiting Client keeps its queue entries alive
      (its watchdog renews them), so a live waiter is never dropped however
      long it waits, while the entries of a Client that died are skipped one
      lease after its last renewal; a hold handed to a waiter that died lasts
      at most one lease (``min(its lease, its Client's lease)``) unconfirmed.
    * **Lease expiry:** as :class:`AsyncLock`: without ``lease=`` the watchdog
      renews the hold; with ``lease=`` it simply expires. A hold that ends
      without a release is *lost*: ``lease.lost``, ``on_lost`` callbacks, and
      inside ``async with`` the body is cancelled and LockLostError raised
      (unless ``on_lost="ignore"``). The lock then goes to the next waiter.
    * **Cancellation:** an acquire cancelled at any await (even after Redis
      queued it or handed it the lock, before the reply was read) leaves the
      queue at once and passes on a lock handed to it; a cancelled release
      still completes; ``async with`` releases when its body raised or was
      cancelled. A timeout is a cancellation too: the call leaves the queue.
    * **Fencing:** every fresh acquisition, handoffs included, gets a token
      strictly greater than every token issued before for this name.
    * **max_hold / handing over:** as :class:`AsyncLock` (max_hold.py,
      adopt.py); an adopted hold keeps its place: the queue is not consulted.

    Keys: ``<prefix>:{<name>}`` (the hold, as for :class:`AsyncLock`, so a
    fair lock and a lock of the same name exclude each other; but a plain
    lock does not queue, so mixing them forfeits fairness),
    ``<prefix>:{<name>}:fence`` and ``<prefix>:{<name>}:q`` (the queue).
    """

    __slots__ = ("_entry_map",)

    _keys_type = FairKeys
    _names: FairKeys

    _kind = "fair lock"
    kind = "fair_lock"
    _owned_script = "owned"  # (the same hash layout as a lock's: wid -> 1, ~fence)

    def _owned_args(self, hold: Hold) -> tuple[Any, ...]:
        return (hold.owner, hold.token)

    def __init__(self, engine: EngineView, name: str) -> None:
        super().__init__(engine, name)
        self._entry_map: dict[asyncio.Task[Any], list[Entry]] = {}

    def _entries(self) -> dict[asyncio.Task[Any], list[Entry]]:
        return self._entry_map

    def _state(self) -> _FairState:
        return self._engine.state(self._names.local, _FairState, self)

    # -- acquire -----------------------------------------------------------------------

    async def _acquire(self, timeout: float | None, lease: float | None) -> Lease:
        engine = self._engine
        loop = engine.enter()
        task = current_task()
        state = self._state()
        hold = self._hold_of(state, task)
        if hold is not None:
            if hold.releasing is None:
                return hold.new_lease()
            # A release of ours is still on its way (its caller was cancelled):
            # let it finish, then queue up like anyone else.
            try:
                await asyncio.shield(hold.releasing)
            except Exception:
                pass
            state = self._state()
        deadline = None if timeout is None else loop.time() + timeout
        lease_s = engine.lease if lease is None else lease
        lease_ms = to_ms(lease_s)
        wid = (
            f"{engine.id}:{task_serial(task)}:{engine.attempt_id()}:{lease_ms}:{engine.lease_ms}:"
            f"{_MODES[engine.notify]}"
        )
        ticket = state.add(wid)
        names = self._names
        keys = names.all
        # Whatever became of a try (queued, granted, unknown): leave the queue,
        # passing on a lock handed to this call.
        leave = engine.undo((("fair_leave", keys, (wid, engine.retention_ms, *names.templates)),))
        # In list mode, also this Client's own signal list: written by the
        # release that hands the lock to this call, only type-checked here.
        acquire_keys: tuple[str | bytes, ...] = keys
        if engine.notify == "list":
            acquire_keys = (*keys, names.client_signal(engine.id))
        queued = False

        async def attempt() -> tuple[int | None, float | None]:
            nonlocal queued
            join = deadline is None or loop.time() < deadline
            sent = loop.time()
            args = (
                wid,
                lease_ms,
                engine.lease_ms,
                engine.retention_ms,
                1 if join else 0,
                *names.templates,
            )
            reply = await engine.eval("fair_acquire", acquire_keys, args, leave)
            if int(reply[0]) == 1:
                queued = ticket.queued = False
                return int(reply[1]), None
            queued = ticket.queued = join
            if join:
                state.keep_alive(sent)
            ttl = int(reply[1])
            return None, ttl_hint(ttl)

        try:
            token, sent = await compete(
                engine,
                what=f"fair lock {self.name!r}",
                deadline=deadline,
                attempt=attempt,
                waiter=ticket.register,
                abandon=leave.abandon,
            )
            if engine.closed:  # granted, but close() already sent our leave
                raise ClientClosedError("the aiolock Client was closed while waiting")
        except BaseException:
            state.remove(ticket)
            if queued and not engine.closed:
                leave.now()  # at once, in the background (a cancelled task can't wait)
            raise
        hold = self._install(state, task, wid, token, lease, lease_s, sent)
        state.remove(ticket)
        return hold.new_lease()

    def _install(
        self,
        state: _FairState,
        task: asyncio.Task[Any],
        wid: str,
        token: int,
        lease: float | None,
        lease_s: float,
        sent: float,
    ) -> Hold:
        engine = self._engine
        hold = engine.new_hold(
            self.name,
            wid,
            token,
            task,
            lease,
            lease_s,
            sent,
            release=(
                "fair_release",
                self._names.all,
                (wid, token, engine.retention_ms, *self._names.templates),
            ),
            renew=("renew", self._key, (wid, token)),
            on_detach=state.hold_ended,
            kind=self.kind,
        )
        state.held.append(hold)
        return hold

    # -- release -------------------------------------------------------------------------

    @staticmethod
    def _hold_of(state: _FairState | None, task: asyncio.Task[Any] | None) -> Hold | None:
        if state is None:
            return None
        for hold in state.held:
            if hold.task is task:
                return hold
        return None

    def _my_hold(self) -> Hold | None:
        state: _FairState | None = self._engine.peek_state(self._names.local)
        return self._hold_of(state, asyncio.current_task())

    # -- queries ----------------------------------------------------------------------------

    async def queue_length(self) -> int:
        """How many acquire calls are queued in Redis (any Client), one round trip.

        Entries of a crashed Client count until they are skipped (at most one
        lease after its last renewal, when they reach the head).
        """
        self._engine.enter()
        queue = self._names.queue
        return int(await self._engine.call(queue, b"ZCOUNT", queue, 1, "+inf"))

    async def force_release(self) -> bool:
        """Delete the lock whoever holds it (True if it was held); the next waiter gets it.

        The evicted holder's lease is lost: at once if it is in this Client;
        else its Client is told at once, through its eviction channel (pub/sub
        mode, connected: within about a round trip); otherwise its watchdog
        finds the hold gone within its Client's ``lease / 3``, fixed leases
        included.
        Fencing tokens keep increasing.
        """
        engine = self._engine
        engine.enter()
        deleted = int(
            await engine.eval(
                "fair_force_release",
                self._names.all,
                (
                    engine.retention_ms,
                    *self._names.templates,
                    await engine.evictions.template(self._names.main),
                ),
            )
        )
        state: _FairState | None = engine.peek_state(self._names.local)
        if state is not None:
            for hold in list(state.held):
                hold.mark_lost("force-released")
        return deleted == 1

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        state: _FairState | None = self._engine.peek_state(self._names.local)
        if state is None:
            return (), 0
        return state.held, state.waiting()
