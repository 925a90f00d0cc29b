"""The Client's one pub/sub listener and its channels, where waiting primitives park.

Channels
--------
A waiting primitive (lock, fair lock, semaphore, latch, ...) registers
interest in its channel, tries, and if that failed it parks on the channel
until a message (or the holder's TTL) says "try again". The parked tasks of a
`Channel` are kept in a `ParkingLot` (see ``_core/waiting/parking.py``), the one wait
queue every local wait uses; the channel adds only its wake-up policy.

A `Channel` is reference counted: the listener subscribes when the first
waiter registers and unsubscribes after the last one leaves. One dedicated
connection carries every channel of the Client, whatever the number of waiting
tasks. A waiter must `await channel.confirmed(...)` before its retry attempt,
so a release that happens between "try" and "subscribe" is never missed.

Wake-ups are permits, not edges: a message that arrives while no waiter is
parked (it is busy retrying) is kept, and the next `wait()` returns at once.
A message "1" wakes one waiter, "*" wakes all, a number n wakes n, "b <ms>" wakes
all (a new hold that may expire within <ms>, before the bound they park on:
they try again and learn its TTL; see wake_bounds in scripts/_wake.lua). A woken waiter that is
cancelled before it ran passes its wake-up on. Lost messages cost at most one
wait bound (the holder's TTL), never a hang: every `wait()` has a timeout.

When the connection drops (or stops answering pings) the listener reconnects
with capped exponential backoff (its ``Dialer``), resubscribes every channel,
and wakes every waiter once its channel is confirmed again, since messages
may have been missed in between.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable
from typing import Protocol

from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from ..errors import ClientClosedError
from ..futures import retrieve, stop
from ..transport.connection import pack
from ..transport.dialer import Dialer, Link
from ..transport.hiredis import hiredis
from ..transport.redis_compat import ConnectionFactory
from .parking import Parked, ParkingLot

__all__ = ["WAKE_ALL", "WAKE_ONE", "Channel", "Listener", "Subscriber"]

log = logging.getLogger("aiolock.listener")

_SUBSCRIBE_REPLIES = frozenset((b"subscribe", b"unsubscribe", b"ssubscribe", b"sunsubscribe"))

WAKE_ONE = b"1"
WAKE_ALL = b"*"
#: "b <ms>": a new hold may expire before the bound the waiters park on.
WAKE_BOUND = b"b "
_PING = pack((b"PING",))
_REDIRECT = re.compile(r"(?:MOVED|ASK) (\d+) ")
_ROLE = pack((b"ROLE",))
#: ``_order``'s entry for a ROLE (no channel name is empty).
_ROLE_DUE = (b"", False)


class Channel:
    """A reference-counted subscription and the local tasks parked on it."""

    __slots__ = (
        "_confirmed",
        "_lot",
        "_permits",
        "closed",
        "grant_sink",
        "handler",
        "name",
        "refs",
        "resync",
    )

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.refs = 0
        self._confirmed: asyncio.Event | None = None
        # Parked waiters, FIFO (O(1) per waiter that gives up, even with
        # 100,000 parked at once: see _core/waiting/parking.py).
        self._lot: ParkingLot[Parked] = ParkingLot()
        self._permits = 0
        self.closed = False
        self.resync = False
        # If set, messages go to it instead of waking parked waiters (see above).
        self.handler: Callable[[bytes], None] | None = None
        # If set, a grant message ("g ...", see scripts/_wake.lua) is given to
        # it before it wakes a waiter as "1" does.
        self.grant_sink: Callable[[bytes], None] | None = None

    # -- subscription state (driven by the Listener) ---------------------------

    def _confirm_event(self) -> asyncio.Event:
        if self._confirmed is None:
            self._confirmed = asyncio.Event()
        return self._confirmed

    @property
    def is_confirmed(self) -> bool:
        return self._confirmed is not None and self._confirmed.is_set()

    def set_confirmed(self, value: bool) -> None:
        event = self._confirm_event()
        if value:
            event.set()
        else:
            event.clear()

    async def confirmed(self, timeout: float | None) -> bool:
        """Wait until the server confirmed the subscription (at most ``timeout`` s).

        Returns False on timeout: the caller goes on with TTL-bounded retries.
        """
        event = self._confirm_event()
        if event.is_set():
            return True
        if self.closed:
            raise ClientClosedError("the aiolock Client was closed while waiting")
        if timeout is not None and timeout <= 0:
            return False
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        if self.closed:
            raise ClientClosedError("the aiolock Client was closed while waiting")
        return True

    # -- parking ------------------------------------------------------------------

    @property
    def parked(self) -> int:
        return len(self._lot)

    async def wait(self, timeout: float | None) -> bool:
        """Park until woken (True) or until ``timeout`` seconds passed (False).

        Raises ClientClosedError if the Client is closed meanwhile.
        """
        if self._permits:
            self._permits -= 1
            return True
        if self.closed:
            raise ClientClosedError("the aiolock Client was closed while waiting")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        lot = self._lot
        timer = lot.park(Parked(fut), None if timeout is None else loop.time() + max(timeout, 0.0))
        try:
            woken = await fut
        except asyncio.CancelledError:
            if ParkingLot.handed(fut):
                self.wake_one()  # we were woken but will not run: pass it on
            raise
        finally:
            lot.unparked(timer)
        return woken

    def wake_one(self) -> None:
        if self._lot.unpark(True) is not None:
            return
        # Nobody parked right now: keep a permit for the next wait(), but never
        # more than there are registered waiters.
        if self._permits < self.refs:
            self._permits += 1

    def wake(self, message: bytes) -> None:
        """Dispatch a release message: "1" wakes one, "*" and "b <ms>" wake all, "<n>" wakes n,
        "g ..." (a lock granted to this Client) goes to ``grant_sink`` and wakes one."""
        if message[:2] == b"g " and self.grant_sink is not None:
            self.grant_sink(message)
            self.wake_one()
        elif self.handler is not None:
            self.handler(message)
        elif message == WAKE_ONE:
            self.wake_one()
        elif message == WAKE_ALL or message[:2] == WAKE_BOUND:
            self.wake_all()
        elif message.isdigit():
            for _ in range(min(int(message), max(self.refs, 1))):
                self.wake_one()
        else:
            self.wake_one()

    def wake_all(self) -> None:
        if self.handler is not None:
            self.handler(WAKE_ALL)
            return
        self._lot.unpark_all(True)
        self._permits = self.refs

    def close(self) -> None:
        """Fail every parked waiter with ClientClosedError."""
        self.closed = True
        self._lot.close()
        if self._confirmed is not None:
            self._confirmed.set()


class Subscriber(Protocol):
    """What a waiter needs of a listener: a ``Listener`` or, in cluster mode,
    a ``ShardedListener`` (cluster.py)."""

    def register(self, name: bytes) -> Channel: ...

    def unregister(self, channel: Channel, *, linger: bool = False) -> None: ...


class Listener:
    """One pub/sub connection, any number of channels, run by one task."""

    #: Seconds a channel stays subscribed after its last waiter left.
    LINGER = 1.0

    def __init__(
        self,
        factory: ConnectionFactory,
        *,
        health_interval: float = 5.0,
        backoff_cap: float = 2.0,
        on_reset: Callable[[], None] | None = None,
        sharded: bool = False,
        on_moved: Callable[[], None] | None = None,
        on_unreachable: Callable[[], None] | None = None,
        role: str = "pub/sub",
        logger: logging.Logger = log,
    ) -> None:
        # on_reset: called when an established pub/sub connection is lost (not on close).
        # role, logger: how its outages are logged (the Dialer logs them, once each).
        self._dialer = Dialer(
            factory,
            on_reset=on_reset,
            backoff_cap=backoff_cap,
            role=role,
            log=logger,
            back_note=self._back_note,
        )
        self._log = logger
        # Why the health check dropped the connection (for the dialer's line).
        self._why: str | None = None
        # on_unreachable: called when a connection could not be opened, once per
        # outage (again only after a connection succeeded). Cluster mode: the
        # node may have died before this listener ever reached it, so no
        # established connection is lost and on_reset never fires; the slot
        # map must be watched for its promoted replica all the same.
        self._on_unreachable = on_unreachable
        self._unreachable_told = False
        # Sharded (cluster mode): SSUBSCRIBE / SUNSUBSCRIBE on the master of
        # the channels' slots, one command per channel (a sharded command's
        # channels must share a slot). on_moved: the server dropped a channel
        # (a server-sent sunsubscribe after a failover or a slot migration) or
        # refused one (MOVED): the channels may belong to another node now.
        self.sharded = sharded
        self._on_moved = on_moved
        self._subscribe = b"SSUBSCRIBE" if sharded else b"SUBSCRIBE"
        self._unsubscribe_cmd = b"SUNSUBSCRIBE" if sharded else b"UNSUBSCRIBE"
        self._health_interval = health_interval
        self._channels: dict[bytes, Channel] = {}
        # Replies still due per channel, in send order: True = subscribe.
        self._expect: dict[bytes, deque[bool]] = {}
        # Sharded mode: every (un)subscription sent, in order (one channel per
        # command, each answered by one reply: its (un)subscribe push or an
        # error, which names no channel). Matching replies to it tells a
        # server-sent sunsubscribe from a reply and an error from whom.
        self._order: deque[tuple[bytes, bool]] = deque()
        # Sharded mode: whether this link's node said it is a master. A
        # replica accepts SSUBSCRIBE for its master's slots and passes on the
        # master's SPUBLISH messages, but the master's SPUBLISH does not count
        # its subscribers: a grant received there is one the script never
        # recorded (two holders). So each session asks ROLE first, and
        # subscribes (and acts on messages) only once the node says "master".
        self._master = not sharded
        #: Sharded mode: the node said it is a replica (its channels wait for
        #: the slot map to move them; see ShardedListener).
        self.replica = False
        self._role_refused = False  # warned once that the ACL user may not run ROLE
        self._link: Link | None = None  # the connection, once connected
        # (Un)subscriptions of this loop iteration, sent together at its end
        # (100,000 waiters cancelled at once unsubscribe 1,000 channels in one
        # command): [command, names] in order, for the connection in _batch_link.
        self._batch: list[tuple[bytes, list[bytes]]] = []
        self._batch_link: Link | None = None
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._ping_outstanding = False

    # -- public to the Client ---------------------------------------------------

    @property
    def channels(self) -> dict[bytes, Channel]:
        return self._channels

    @property
    def connected(self) -> bool:
        return self._link is not None

    @property
    def connects(self) -> int:
        return self._dialer.connects

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aiolock-listener")

    def register(self, name: bytes) -> Channel:
        """Take a reference on a channel, subscribing on the first one."""
        if self._closed:
            raise ClientClosedError("the aiolock Client is closed")
        channel = self._channels.get(name)
        if channel is None:
            channel = self._channels[name] = Channel(name)
            self._send(self._subscribe, [name])
            self._wanted.set()
        channel.refs += 1
        return channel

    def adopt(self, channel: Channel) -> None:
        """Take over ``channel`` from another node's listener (cluster mode: its
        slot moved here). Its waiters are woken once it is confirmed here,
        since messages may have been missed meanwhile."""
        if self._closed:
            channel.close()
            return
        channel.set_confirmed(False)
        channel.resync = True
        self._channels[channel.name] = channel
        self._send(self._subscribe, [channel.name])
        self._wanted.set()

    def resubscribe(self) -> None:
        """Subscribe again each channel that is not confirmed and has no reply
        due (cluster mode: a node refused it, with MOVED or CLUSTERDOWN, or
        dropped it, and the slot map says it belongs here after all). Its
        waiters are woken once it is confirmed. On a link whose node said it
        is a replica, the node is asked its role again instead (it may have
        been made a master since)."""
        if not self._master:
            if self._channels:
                self._send(self._subscribe, [])  # (asks the role again: see _send)
            return
        for name, channel in self._channels.items():
            if not channel.is_confirmed and not self._expect.get(name):
                channel.resync = True
                self._send(self._subscribe, [name])

    def disown(self, channel: Channel) -> None:
        """Give ``channel`` up to another node's listener (see ``adopt``)."""
        if self._channels.get(channel.name) is channel:
            del self._channels[channel.name]
            self._send(self._unsubscribe_cmd, [channel.name])

    def unregister(self, channel: Channel, *, linger: bool = False) -> None:
        """Drop a reference; unsubscribe after the last one.

        With ``linger`` (the waiter got what it waited for) the channel stays
        subscribed, and confirmed, ``LINGER`` seconds more, so that a task
        that waits on the same name again soon, the common case under
        contention, neither re-subscribes nor waits for a confirmation round
        trip. A waiter that gave up (cancelled, timed out) unsubscribes at once.
        """
        channel.refs -= 1
        if channel._permits > max(channel.refs, 0):
            channel._permits = max(channel.refs, 0)
        if channel.refs > 0 or self._channels.get(channel.name) is not channel:
            return
        if not linger or self.LINGER <= 0 or self._closed:
            self._unsubscribe(channel)
            return
        asyncio.get_running_loop().call_later(self.LINGER, self._unsubscribe, channel)

    def _unsubscribe(self, channel: Channel) -> None:
        if channel.refs > 0 or self._channels.get(channel.name) is not channel:
            return  # waited on again meanwhile
        del self._channels[channel.name]
        channel._permits = 0
        self._send(self._unsubscribe_cmd, [channel.name])

    @property
    def active(self) -> int:
        """Channels some task waits on right now (lingering ones not counted)."""
        # tuple(): one C call, so a statistics() from another thread never
        # sees the dict change size mid-iteration.
        return sum(1 for channel in tuple(self._channels.values()) if channel.refs > 0)

    def reset(self) -> None:
        """Drop the connection as if it were lost: the listener reconnects
        (Sentinel mode: to the master named now) and resubscribes."""
        link = self._link
        if link is not None:
            link.abort()

    async def aclose(self) -> None:
        self._closed = True
        for channel in self._channels.values():
            channel.close()
        task, self._task = self._task, None
        await stop(task)
        await self._disconnect()

    # -- the connection ----------------------------------------------------------

    def _send(self, command: bytes, names: list[bytes]) -> None:
        """(Un)subscribe ``names`` at the end of this loop iteration."""
        link = self._link
        if link is None:
            return  # (re)connecting: the session subscribes the whole set
        subscribe = command == self._subscribe
        if subscribe and not self._master:
            # Subscribed once the node says it is a master (_role). It said
            # "replica" last time: ask again (it may have been made a master).
            if self.replica and _ROLE_DUE not in self._order:
                self._ask_role()
            return
        for name in names:
            self._expect.setdefault(name, deque()).append(subscribe)
            if self.sharded:
                self._order.append((name, subscribe))
        batch = self._batch
        if batch and self._batch_link is link:
            if batch[-1][0] == command:
                batch[-1][1].extend(names)  # consecutive: merged, order kept
            else:
                batch.append((command, list(names)))
            return
        self._batch = [(command, list(names))]
        self._batch_link = link
        asyncio.get_running_loop().call_soon(self._flush)

    def _ask_role(self) -> None:
        """Sharded mode: ask the node its role (ROLE), in order with the
        (un)subscriptions; nothing is subscribed until it answers "master"."""
        link = self._link
        if link is None:
            return
        self._master = False
        self._order.append(_ROLE_DUE)
        if self._batch and self._batch_link is link:
            self._batch.append((b"ROLE", [b""]))
            return
        self._batch = [(b"ROLE", [b""])]
        self._batch_link = link
        asyncio.get_running_loop().call_soon(self._flush)

    def _role(self, master: bool) -> None:
        """The node answered ROLE: a master's link subscribes every channel; a
        replica's subscribes none (see ``_master``) and asks for a fresh slot map."""
        self.replica = not master
        if master:
            self._master = True
            if self._channels:
                self._send(self._subscribe, list(self._channels))
            return
        self._log.warning(
            "pub/sub connection to %s: the node the slot map names a master is a replica "
            "now; its channels wait for the slot map to move them",
            self._dialer.address,
        )
        if self._on_moved is not None:
            self._on_moved()

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        link, self._batch_link = self._batch_link, None
        if link is None or link is not self._link:
            return  # the connection went: the next session subscribes the whole set
        if self.sharded:  # one command per channel: a sharded command's channels share a slot
            data = b"".join(
                _ROLE if command == b"ROLE" else pack((command, name))
                for command, names in batch
                for name in names
            )
        else:
            data = b"".join(pack((command, *names)) for command, names in batch)
        try:
            link.write(data)
        except Exception:
            link.abort()

    async def _disconnect(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def _run(self) -> None:
        dialer = self._dialer
        while not self._closed:
            if not self._channels:
                self._wanted.clear()
                await self._wanted.wait()
            await dialer.pause()
            started = asyncio.get_running_loop().time()
            error: BaseException | None = None
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # (A connect that failed was logged by the dialer, once per outage;
                # a lost connection is, below.)
                error = exc
                if self._link is None and not self._unreachable_told:
                    self._unreachable_told = True  # (never connected: see on_unreachable)
                    if self._on_unreachable is not None:
                        self._on_unreachable()
                # A link that served for a health interval or more was sound: the
                # next attempt comes soon. One the server accepts and then drops
                # at once (a pub/sub output buffer limit, a proxy) backs off.
                if asyncio.get_running_loop().time() - started >= self._health_interval:
                    dialer.proven()
                dialer.failed()
            finally:
                for channel in self._channels.values():
                    channel.set_confirmed(False)
                    channel.resync = True
                self._expect.clear()
                self._order.clear()
                if self._link is not None and not self._closed:
                    why, self._why = self._why, None
                    dialer.lost(why or error)
                await self._disconnect()

    async def _session(self) -> None:
        """One connection, until it fails (it always ends with an exception)."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        ended.add_done_callback(retrieve)  # (it may end after we stopped waiting)
        # Messages are parsed as they arrive and dispatched at once: a woken
        # waiter runs on the next loop turn, with no listener task step between.
        self._link = await self._dialer.open(
            lambda link: _PubSubProtocol(self, link, ended), self._health_interval * 2
        )
        self._ping_outstanding = False
        self._unreachable_told = False
        if self.sharded:
            self._ask_role()  # subscribes once the node says it is a master
        elif self._channels:
            self._send(self._subscribe, list(self._channels))
        self._health_handle = loop.call_later(self._health_interval, self._health_check)
        try:
            await ended
        finally:
            self._health_timer_cancel()

    _health_handle: asyncio.TimerHandle | None = None

    def _health_timer_cancel(self) -> None:
        if self._health_handle is not None:
            self._health_handle.cancel()
            self._health_handle = None

    def _back_note(self) -> str:
        n = len(self._channels)
        return f"; resubscribing {n} channel{'' if n == 1 else 's'}" if n else ""

    def _health_check(self) -> None:
        """Ping every health_interval; a ping unanswered for a whole interval kills the link."""
        link = self._link
        if link is None:
            return
        if self._ping_outstanding:
            self._why = f"no answer to a PING for {self._health_interval:g} s"
            link.abort()
            return
        self._ping_outstanding = True
        try:
            link.write(_PING)
        except Exception:
            link.abort()
            return
        self._health_handle = asyncio.get_running_loop().call_later(
            self._health_interval, self._health_check
        )

    def _refused(self, reply: Exception) -> None:
        """An error reply to a (un)subscription: in cluster mode a MOVED or
        CLUSTERDOWN says a channel belongs to another node (or none, during a
        failover): the channels are re-homed from a fresh slot map."""
        message = str(reply)
        if self.sharded:
            self._answered(message)
        if (
            self.sharded
            and self._on_moved is not None
            and message.startswith(("MOVED", "CLUSTERDOWN", "TRYAGAIN", "ASK"))
        ):
            self._on_moved()
            return
        self._log.warning(
            "pub/sub connection to %s: Redis refused a subscription: %s",
            self._dialer.address,
            reply,
        )

    def _answered(self, error: str) -> None:
        """Sharded mode: the (un)subscription first in ``_order`` was refused
        with ``error``: no reply for it is due any more. (A MOVED or ASK that
        names another slot answers a command already matched: see
        ``_dispatch``, a server-sent sunsubscribe taken for its reply.)"""
        if not self._order:
            return
        if self._order[0] is _ROLE_DUE:
            self._order.popleft()
            if error.startswith("NOPERM"):
                # An ACL user without ROLE: subscribe as on a master (the map
                # names it one), warned once; the README's ACL line grants ROLE.
                if not self._role_refused:
                    self._role_refused = True
                    self._log.warning(
                        "pub/sub connection to %s: the ACL user may not run ROLE, so a "
                        "node the slot map names a master is not checked to be one; "
                        "grant +role",
                        self._dialer.address,
                    )
                self._role(True)
                return
            # ROLE refused otherwise: the link is still subscribed somewhere
            if self._link is not None:
                self._link.abort()  # the next session asks first
            return
        name, _ = self._order[0]
        match = _REDIRECT.match(error)
        if match is not None and int(match.group(1)) != key_slot(name):
            return
        self._order.popleft()
        expect = self._expect.get(name)
        if expect:
            expect.popleft()
            if not expect:
                del self._expect[name]

    def _dropped(self, name: bytes, left: object = None) -> None:
        """A sunsubscribe nobody asked for: the server dropped the channel (its
        slot moved, a failover). Listen again where the slot is now.

        ``left``: the subscriptions the link has left. None left (sharded
        mode): the node may have been made a replica (it drops every
        subscription then), so it is asked its role again before anything
        more is subscribed on the link (ROLE is allowed again on a link with
        no subscription)."""
        channel = self._channels.get(name)
        if channel is not None:
            channel.set_confirmed(False)
            channel.resync = True
            if self._on_moved is not None:
                self._on_moved()
        if self.sharded and left == 0 and self._master:
            for other in self._channels.values():
                other.set_confirmed(False)
                other.resync = True
            self._ask_role()

    def _dispatch(self, reply: object) -> None:
        if not isinstance(reply, list) or not reply:
            # A PING answered outside subscribed mode (no channel left): a
            # plain +PONG, not the ["pong", ""] of a subscribed connection.
            if reply == b"PONG":
                self._ping_outstanding = False
            return
        kind = reply[0]
        if self.sharded and self._order and self._order[0] is _ROLE_DUE:
            if kind in (b"master", b"slave", b"replica", b"sentinel"):
                self._order.popleft()
                self._role(kind == b"master")
                return
        if kind == b"smessage" and not self._master:
            return  # never acted on: see _master
        if kind == b"message" or kind == b"smessage":
            channel = self._channels.get(reply[1])
            if channel is not None:
                channel.wake(reply[2])
        elif kind in _SUBSCRIBE_REPLIES:
            name = reply[1]
            if self.sharded:
                order = self._order
                if order and order[0] == (name, kind == b"ssubscribe"):
                    order.popleft()  # the reply to the first command due
                elif kind == b"sunsubscribe":
                    self._dropped(name, reply[2] if len(reply) > 2 else None)  # server-sent
                    return
            expect = self._expect.get(name)
            if not expect and kind == b"sunsubscribe":
                self._dropped(name)
                return
            if expect:
                expect.popleft()
                if expect:
                    return  # a later (un)subscribe of the same channel is still due
                del self._expect[name]
            channel = self._channels.get(name)
            if (kind == b"subscribe" or kind == b"ssubscribe") and channel is not None:
                channel.set_confirmed(True)
                if channel.resync:
                    channel.resync = False
                    channel.wake_all()  # messages may have been missed while away
        elif kind == b"pong":
            self._ping_outstanding = False


class _PubSubProtocol(asyncio.Protocol):
    """Parses the pub/sub connection's replies with hiredis as bytes arrive and
    hands each to ``Listener._dispatch``; ``ended`` fails when the link does."""

    def __init__(self, listener: Listener, link: Link, ended: asyncio.Future[None]) -> None:
        self._listener = listener
        self._link = link
        self._ended = ended
        self._parser = hiredis.Reader()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        while True:
            try:
                reply = parser.gets()
            except Exception as exc:  # a protocol error: the stream is unusable
                self._end(f"bad reply from Redis: {exc}")
                self._link.abort()
                return
            if reply is False:
                return
            if isinstance(reply, hiredis.ReplyError):
                self._listener._refused(reply)
                continue
            try:
                self._listener._dispatch(reply)
            except Exception:
                log.exception("dispatching the pub/sub message %r failed", reply)

    def eof_received(self) -> bool | None:
        self._end("Redis closed the pub/sub connection")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(f"pub/sub connection lost: {exc}" if exc else "pub/sub connection closed")

    def _end(self, reason: str) -> None:
        if not self._ended.done():
            self._ended.set_exception(RedisConnectionError(reason))
