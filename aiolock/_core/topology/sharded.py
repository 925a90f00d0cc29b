"""Redis Cluster and Valkey Cluster: the sharded pub/sub, each channel on its slot's master.

One sharded ``Listener`` (``waiting/listener.py``) per master, over
``cluster.py``'s slot map; channels move with their slots (see
``ShardedListener``).
"""

from __future__ import annotations

import asyncio
import math
from collections import ChainMap
from collections.abc import Callable

from ..errors import AiolockError, ClientClosedError, ConnectionFailedError
from ..futures import retrieve, stop
from ..protocol.slots import slot_of
from ..waiting.channel import Channel
from ..waiting.listener import Listener
from .cluster import RESEND_CAP, Topology

__all__ = ["ShardedListener"]


class ShardedListener:
    """The one pub/sub listener of a cluster-mode Client: one sharded
    ``Listener`` per master it listens on, each channel on its slot's master.

    The same interface as a ``Listener`` (``register``, ``unregister``,
    ``channels``, ``active``, ``connects``, ``start``, ``aclose``). When a
    slot changes owner (a failover, a migration: the server drops the
    channel with a ``sunsubscribe``, refuses it with ``MOVED``, or a slot map
    refresh shows it), its channels move, waiters and all, to the new
    master's listener; once subscribed there, their waiters are woken to try
    again, since a release may have been published meanwhile. A channel that
    was refused or dropped and that the map (which may lag the cluster for a
    moment) keeps where it is, is subscribed again, at most a second apart,
    until a node takes it; a lingering channel (nobody waits on it) whose slot
    moved is dropped. No waiter hangs: every wait is bounded by the holder's
    TTL besides.

    Safety: a grant goes to a Client only if the script's ``SPUBLISH`` counts
    it, and SPUBLISH counts the subscribers of the node that ran it, a
    master. A replica accepts ``SSUBSCRIBE`` for its master's slots and
    relays the master's messages, uncounted; so each sharded link asks its
    node ``ROLE`` first and subscribes (and acts on messages) only on a
    master (see ``Listener._master``): this listener never takes a grant the
    script did not count (classic pub/sub would: see ``_cluster_source`` in
    scripts.py and tests/test_cluster_primitives.py).
    """

    def __init__(self, topology: Topology, *, on_reset: Callable[[], None] | None = None) -> None:
        self._topology = topology
        self._on_reset = on_reset
        self._listeners: dict[str, Listener] = {}
        self._started = False
        self._closed = False
        self._rehoming: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        topology.watch(self._changed.set)
        self._connects_closed = 0
        self._last_round = -math.inf  # loop time of the last re-homing round
        self._pause = 0.0

    def _listener(self, name: str) -> Listener:
        listener = self._listeners.get(name)
        if listener is None:
            listener = self._listeners[name] = Listener(
                self._topology.factory(name),
                on_reset=self._lost,
                sharded=True,
                on_moved=self.moved,
                on_unreachable=self._unreachable,
            )
            if self._started:
                listener.start()
        return listener

    def _home(self, channel: bytes) -> str:
        name = self._topology.node(slot_of(channel))
        if name is None:  # not served right now: the first master; re-homed on refresh
            self._topology.refresh_soon()
            masters = self._topology.masters()
            if not masters:
                raise ConnectionFailedError("the cluster serves no slot right now; retry")
            name = masters[0]
        return name

    def _lost(self) -> None:
        self._unreachable()
        if self._on_reset is not None:
            self._on_reset()

    def _unreachable(self) -> None:
        """A node's pub/sub link was lost, or could not be opened (the node died
        before this listener reached it: nothing was lost, but its channels
        wait there all the same): watch the map for the promoted replica."""
        self._topology.refresh_soon()
        if not self._closed and (self._watching is None or self._watching.done()):
            self._watching = asyncio.get_running_loop().create_task(
                self._await_failover(), name="aiolock-cluster-watch"
            )
            self._watching.add_done_callback(retrieve)

    async def _await_failover(self) -> None:
        """A node's pub/sub link was lost or could not be opened: the node may be
        dead and its replica about to be promoted. Nothing else may ask for the map meanwhile (its
        waiters are parked, its listener only retries the dead node), so re-read
        it every ``RESEND_CAP`` until it changes (``on_change`` then re-homes the
        channels to the promoted replica) or for the topology's timeout (the
        node came back as it was)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self._topology.timeout
        self._changed.clear()
        while not self._closed and not self._changed.is_set() and loop.time() < end:
            try:
                await self._topology.refresh()
            except AiolockError:
                pass  # (logged by the refresh) tried again
            if self._changed.is_set():
                return
            await asyncio.sleep(RESEND_CAP)

    # -- the Listener interface -------------------------------------------------------------

    @property
    def channels(self) -> ChainMap[bytes, Channel]:
        return ChainMap(*(listener.channels for listener in self._listeners.values()))

    @property
    def active(self) -> int:
        return sum(listener.active for listener in tuple(self._listeners.values()))

    @property
    def connects(self) -> int:
        return self._connects_closed + sum(lst.connects for lst in tuple(self._listeners.values()))

    @property
    def nodes(self) -> list[str]:
        """The masters this listener has a (sharded) listener for."""
        return sorted(self._listeners)

    def start(self) -> None:
        self._started = True
        for listener in self._listeners.values():
            listener.start()

    def register(self, name: bytes) -> Channel:
        if self._closed:
            raise ClientClosedError("the aiolock Client is closed")
        for listener in self._listeners.values():
            if name in listener.channels:
                return listener.register(name)
        return self._listener(self._home(name)).register(name)

    def unregister(self, channel: Channel, *, linger: bool = False) -> None:
        for listener in self._listeners.values():
            if listener.channels.get(channel.name) is channel:
                listener.unregister(channel, linger=linger)
                return
        channel.refs -= 1  # (moved away while no listener had it: nothing to drop)

    # -- moves --------------------------------------------------------------------------------

    def moved(self) -> None:
        """A node dropped or refused a channel: refresh the map, then re-home."""
        if self._closed:
            return
        if self._rehoming is None or self._rehoming.done():
            self._rehoming = asyncio.get_running_loop().create_task(
                self._refresh_and_rehome(), name="aiolock-cluster-rehome"
            )
            self._rehoming.add_done_callback(retrieve)

    async def _refresh_and_rehome(self) -> None:
        """Refresh the map, move the channels whose slot moved, and subscribe
        again those a node refused or dropped that stay where they are: no
        channel is left unsubscribed while its slot is served. Refused again
        within a second of the last round (the nodes do not agree yet: a slot's
        new owner still being gossiped, a failover under way), it first waits,
        longer each time, at most a second: one round a second at most."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_round < 1.0:
            self._pause = min(max(self._pause * 2, 0.05), 1.0)
            await asyncio.sleep(self._pause)
        else:
            self._pause = 0.0
        delay = 0.05
        while not self._closed:
            try:
                await self._topology.refresh()
            except AiolockError:  # (logged by the refresh) tried again
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self.rehome()
            listeners = list(self._listeners.values())
            for listener in listeners:
                listener.resubscribe()
            self._last_round = loop.time()
            if any(listener.replica and listener.channels for listener in listeners):
                loop.call_soon(self.moved)  # another round, until the map moves them
            return

    def rehome(self) -> None:
        """Move every channel whose slot another master serves now to that master."""
        if self._closed:
            return
        for node, listener in list(self._listeners.items()):
            for name, channel in list(listener.channels.items()):
                home = self._topology.node(slot_of(name))
                if home is not None and home != node:
                    listener.disown(channel)
                    if channel.refs > 0:  # (a lingering one nobody waits on is dropped)
                        self._listener(home).adopt(channel)

    async def aclose(self) -> None:
        self._closed = True
        await stop(self._rehoming)
        await stop(self._watching)
        listeners = list(self._listeners.values())
        for listener in listeners:
            self._connects_closed += listener.connects
        await asyncio.gather(*(listener.aclose() for listener in listeners))
