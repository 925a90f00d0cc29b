"""The Client's one pub/sub listener: its connection, its (un)subscriptions, its dispatch.

Waiting primitives park on its channels (``channel.py``: the reference
counting, the parking and the wake-up policy); the replies are parsed by
``wire.py`` and dispatched here.

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

from redis.crc import key_slot

from ..errors import ClientClosedError
from ..futures import retrieve, stop
from ..transport.dialer import Dialer, Link
from ..transport.redis_compat import ConnectionFactory
from ..transport.resp import pack
from .channel import WAKE_ALL, WAKE_BOUND, WAKE_ONE, Channel, Subscriber
from .wire import PubSubProtocol

# (Channel, Subscriber and the WAKE_ messages are channel.py's, re-exported here.)
__all__ = ["WAKE_ALL", "WAKE_BOUND", "WAKE_ONE", "Channel", "Listener", "Subscriber"]

log = logging.getLogger("aiolock.listener")

_SUBSCRIBE_REPLIES = frozenset((b"subscribe", b"unsubscribe", b"ssubscribe", b"sunsubscribe"))

_PING = pack((b"PING",))
_REDIRECT = re.compile(r"(?:MOVED|ASK) (\d+) ")
_ROLE = pack((b"ROLE",))
#: ``_order``'s entry for a ROLE (no channel name is empty).
_ROLE_DUE = (b"", False)


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
            lambda link: PubSubProtocol(self._dispatch, self._refused, link, ended),
            self._health_interval * 2,
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
