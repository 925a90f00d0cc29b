"""The Engine: what the primitives run on, one per Client (so one per event loop).

It owns the shared resources of aiolock: one multiplexed command connection,
the one pub/sub listener (with its own connection), the one watchdog (whose
renewals have a command connection of their own, so that they never queue
behind a burst of acquires), the loaded scripts, the client id and the
registry of every primitive's local state. The primitives call its public
methods (run this script for this key, send this command for this key, make
and track this hold, undo this acquire, wait on this channel, keep this
local state, spawn this background work: see "the primitives' interface"
below) and nothing else; ``Client`` is the public facade that creates it.

This module wires the parts; the parts live beside it:

* commands.py: ``Commands``, a base class of the Engine: a command routed
  to the lane that serves its key (``_route``, ``call``), the deployment
  settled on first use (``_settle``), the scripts run through the runner
  (``eval``, ``submit_script``, ``send_script``, ``retry``, ``clean_up``),
  background work (``spawn``);
* holds/lifecycle.py: ``Holds``, the hold life cycle (``new_hold``, ``track``,
  ``release_hold``, ``release_failed``, ``release_finished``,
  ``extend_hold``, ``renew_batch``, ``run_callback``), bound onto the Engine
  as its own methods;
* verifier.py: ``Verifier``, the connection epochs (``epoch`` stays an
  Engine attribute) and the verification of holds after a connection reset;
* undo.py: ``Undo``, the undo of an acquire whose reply was lost (``undo``);
* runner.py: ``ScriptRunner``, the one place that runs a script (``eval``,
  ``submit_script`` and ``send_script`` delegate to it): it builds the
  command, has each connection load a script with its first run there,
  recovers from a script the server lost, and serves the acknowledged lane;
* options.py: the Client's options (checked there once), ``Notify`` and
  ``ClientStatistics``;
* deployment.py: the ``Deployment`` the Engine holds (``Standalone``,
  ``Sentinel``, ``Cluster``, or ``Discover`` until the first command finds
  out): it makes the lanes, the listener and the signal hub, discovers what
  must be discovered (``settle``), follows failovers, says which server
  serves a key (``shard``) and what the server can do (``capabilities``).
  No other part of aiolock branches on the mode.

The lower modules name what they need of the Engine as Protocols
(``HoldOwner``, ``Verified``, ``Cleaner``, ``HoldEngine`` in lease.py,
``Renewer`` in watchdog.py), which it satisfies structurally: nothing below
imports this module.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from .commands import Commands
from .errors import (
    ClientClosedError,
    WrongEventLoopError,
    asyncio_required,
)
from .futures import retrieve, stop
from .holds.evict import Evictions
from .holds.lifecycle import Holds
from .holds.undo import Call, OnReply, Undo
from .holds.verifier import Verifier
from .holds.watchdog import Renewable, Watchdog
from .observe.observer import CLIENT_CLOSED, Observer, new_telemetry
from .options import ClientStatistics, Notify, Options
from .outage import Outage
from .owner import task_serial
from .protocol.runner import ScriptRunner
from .protocol.scripts import load_scripts
from .topology.deployment import Deployment, deployment_for
from .topology.probe import describe, probe, refusal
from .topology.sharded import ShardedListener
from .transport.connection import Lane
from .transport.redis_compat import ConnectionFactory, connection_factory
from .transport.replication import Acknowledgement
from .validate import to_ms
from .view import EngineView
from .waiting.channel import Channel
from .waiting.listener import Listener
from .waiting.notify import ListWaiter, PollWaiter, PubSubWaiter, SignalHub, Waiter

__all__ = ["Call", "ClientStatistics", "Engine", "Notify", "Undo"]

log = logging.getLogger("aiolock.lock")
conn_log = logging.getLogger("aiolock.connection")

S = TypeVar("S")
A = TypeVar("A")
#: Fence counters of names nobody used for this long expire (see DESIGN: fencing).
FENCE_RETENTION = 24 * 3600.0
_WRONG_LOOP = (
    "this aiolock Client is bound to the event loop it was first used on, and this is "
    "another one. This usually happens when a Client is made at module level or in a "
    "session-scoped pytest fixture and then used from another loop (pytest-asyncio gives "
    "each test its own loop by default; every asyncio.run() makes a new one). Create the "
    "Client inside the loop that uses it (in a function-scoped fixture, or in your main "
    "coroutine): one Client per event loop"
)


def _no_connection() -> Any:
    raise AssertionError("aiolock: a cluster-mode Client connects to the cluster's nodes only")


class Engine(Commands):
    """The engine of one Client: connections, listener, watchdog, scripts, holds.

    Made by ``Client`` with its checked ``Options``. Bound to the event
    loop it is first entered from (``enter()``). The primitives use only
    its public attributes and methods; its ``_``-names are its own.
    """

    def __init__(
        self,
        redis: aioredis.Redis | RedisCluster,
        options: Options,
        *,
        cluster: bool | None = False,
        cluster_client: Callable[[], RedisCluster] | None = None,
    ) -> None:
        """``redis``: the user's client (its settings make every connection).
        ``cluster``: True (a ``RedisCluster`` is given, or ``from_url(...,
        cluster=True)``), False (a standalone server, as given), or None:
        ask the server on first use (one ``INFO cluster``) and switch to
        cluster mode if it is a cluster node, discovering the cluster from
        ``cluster_client()`` (None: say that a RedisCluster is needed)."""
        self.prefix = options.prefix
        self.lease = options.lease
        self.notify: Notify = options.notify
        self.command_timeout = options.command_timeout
        self.backoff = options.backoff
        #: Replicas that must acknowledge acquisitions and renewals (WAIT), and for how long.
        self.replicas = options.replicas
        self.replica_timeout = options.replica_timeout
        self.wait_aof = options.wait_aof
        #: What "acknowledged" means (replication.py), or None: acquisitions are not waited for.
        self.ack: Acknowledgement | None = (
            Acknowledgement(self.replicas, self.replica_timeout, self.wait_aof)
            if self.replicas or self.wait_aof
            else None
        )
        self.id = secrets.token_hex(16)
        self._redis = redis
        #: How this Client reaches its server(s): discovery, routing, pub/sub,
        #: failover, and what the server can do (deployment.py).
        self.deployment: Deployment = deployment_for(
            redis, cluster=cluster, cluster_client=cluster_client
        )
        # Until the deployment is settled, the first command waits for it (_settle).
        self._settling: asyncio.Task[None] | None = None
        # The closing under way or done (aclose): a cancelled aclose leaves it running.
        self._closing: asyncio.Task[None] | None = None
        # (Every deployment settles once at least: the capability probe.)
        self._settled = False
        # Every connection of this Client is made by it (see Dialer): the
        # redis client's settings, named after this Client on the server.
        self.client_name = f"aiolock:{self.id[:12]}"
        self.new_connection: ConnectionFactory = (
            connection_factory(redis, self.client_name)
            if isinstance(redis, aioredis.Redis)
            else _no_connection
        )
        #: The Client made ``redis`` (from_url, from_sentinel): it closes it.
        self.owns_redis = False
        #: Counts every acquisition, hold and loss; feeds OpenTelemetry (observe/observer.py).
        self.observer = Observer(new_telemetry(options.lock_label) if options.telemetry else None)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        #: Entered once (listener and watchdog started).
        self.started = False
        self.background: set[asyncio.Task[Any]] = set()
        #: Every script runs through it (runner.py): routed by ``_route``,
        #: acquisitions on ``acked_lane`` when replicas acknowledge.
        self.runner = ScriptRunner(
            route=self._route,
            acked=lambda: self.acked_lane,
            background=self.background,
            command_timeout=self.command_timeout,
            scripting=options.scripting,
        )
        # Per-primitive local state, keyed by the primitive's main key.
        self.states: dict[str, Any] = {}
        # The connection epoch: bumped whenever an established connection to
        # the server is lost, since the server behind the next one may have
        # lost every key (a restart without persistence, a failover). A hold
        # confirmed by the server in an earlier epoch is verified at once
        # (verifier.py) and hands out no reserved token meanwhile. A plain
        # attribute: the local handoff reads it.
        self.epoch = 0
        # Loop time of the last epoch change: an acquire sent after it was
        # granted in the current epoch (see Holds.track).
        self.epoch_since = -math.inf
        self._verifier = Verifier(self)
        self.start_verifier = self._verifier.start
        #: An established connection was lost: the epoch moves on and every
        #: hold is verified (verifier.py). Every lane calls it.
        self.connection_reset: Callable[[], None] = self._verifier.connection_reset
        # The hold life cycle (holds/lifecycle.py), its methods bound once as the
        # Engine's own: no call frame more on the acquire and release paths.
        holds = Holds(self)
        self.new_hold = holds.new_hold
        self.pass_on = holds.pass_on
        self.track = holds.track
        self.release_hold = holds.release_hold
        self.release_failed = holds.release_failed
        self.release_finished = holds.release_finished
        self.extend_hold = holds.extend_hold
        self.renew_batch = holds.renew_batch
        self.run_callback = holds.run_callback
        # The lanes, the listener and the signal hub, as the deployment makes
        # them (a Cluster replaces them once it knows the slot map).
        self.mux: Lane
        self.renew_mux: Lane
        #: The acknowledged acquisitions' own lane (replication.py), with ``ack``.
        self.acked_lane: Lane | None
        self.listener: Listener | ShardedListener
        self.signals: SignalHub
        self.deployment.install(self)
        #: A release may grant the lock to a waiter in its own script (the
        #: local handoff, targeted grants): not when replicas must acknowledge
        #: every grant, which only the acknowledged lane waits for.
        self.grants_by_release = self.ack is None
        self._attempts = 0
        self._attempts = 0
        #: The run of failed tries of waiting tasks (``compete``): one WARNING, one INFO.
        self.unreachable = Outage()
        self.watchdog = Watchdog(self, self.lease)
        #: The eviction channels: a force release tells the holder's Client (evict.py).
        self.evictions = Evictions(self)
        # Bound once, as attributes: no call frame more on the release path.
        #: Stop renewing an item (a hold, or a ``renew`` item); a no-op if not renewed.
        self.untrack: Callable[[Renewable], None] = self.watchdog.remove
        #: The local state keyed ``key`` (see ``state``), or None: nothing is created.
        self.peek_state: Callable[[str], Any] = self.states.get
        self.lease_ms = to_ms(self.lease)
        self.retention_ms = to_ms(FENCE_RETENTION)

    # -- lifecycle -----------------------------------------------------------------------

    def enter(self) -> asyncio.AbstractEventLoop:
        """Check the Client is usable from here; start it on first use."""
        if self.closed:
            raise ClientClosedError("this aiolock Client was closed; create a new one")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise asyncio_required() from None
        if self.loop is loop:
            return loop
        if self.loop is not None:
            raise WrongEventLoopError(_WRONG_LOOP)
        self.loop = loop
        self.listener.start()
        self.watchdog.start()
        self.started = True
        return loop

    def enter_task(self) -> asyncio.Task[Any]:
        """``_enter()`` for a call that needs its task: one lookup serves both
        (each asyncio lookup of the running loop costs a getpid() system call)."""
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running asyncio loop (trio, or no loop at all)
            raise asyncio_required() from None
        if task is None:
            raise asyncio_required()
        if self.loop is not task.get_loop() or self.closed:
            self.enter()
        return task

    def loop_time(self) -> float:
        """The bound loop's clock (no running-loop lookup: see _enter_task)."""
        loop = self.loop or asyncio.get_running_loop()
        return loop.time()

    def check_usable(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise asyncio_required() from None
        if self.loop is not None and loop is not self.loop:
            raise WrongEventLoopError(_WRONG_LOOP)

    async def aclose(self) -> None:
        """Close the Client. Idempotent. See the class docstring for what happens to holds.

        Cancellation: the closing runs in a task of its own. A caller
        cancelled while it runs gets CancelledError, and the closing goes on
        to its end (releases sent, connections closed); another ``aclose()``
        waits for that same closing, and returns when it is done."""
        closing = self._closing
        if closing is None:
            if self.closed:
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise asyncio_required() from None
            # Checked before anything changes: a call from the wrong loop leaves the
            # Client as it was, so that aclose() from its own loop still does the work.
            if self.loop is not None and loop is not self.loop:
                raise WrongEventLoopError(
                    "close the aiolock Client from the event loop it was first used on. "
                    + _WRONG_LOOP
                )
            self.closed = True
            for state in list(self.states.values()):
                state.close()
            holds = [h for state in list(self.states.values()) for h in state.holds()]
            for hold in holds:
                hold.mark_lost(CLIENT_CLOSED)
            releases: list[Awaitable[Any]] = []
            if self.started:
                releases = [
                    self.submit_script(h.release_script, h.release_keys, h.release_args)
                    for h in holds
                ]
                # Leave the plain locks' waiting sets, so that no release is aimed at us.
                for state in list(self.states.values()):
                    leave = getattr(state, "leave", None)
                    left = leave() if leave is not None else None
                    if left is not None:
                        releases.append(left)
            closing = self._closing = loop.create_task(
                self._close(releases), name="aiolock-close"
            )
            closing.add_done_callback(retrieve)
        elif self.loop is not None and asyncio.get_running_loop() is not self.loop:
            raise WrongEventLoopError(
                "close the aiolock Client from the event loop it was first used on. " + _WRONG_LOOP
            )
        await asyncio.shield(closing)

    async def _close(self, releases: list[Awaitable[Any]]) -> None:
        """The part of ``aclose`` that waits: the releases (bounded), then
        every task and connection, in the order their parts need."""
        if self.started:
            if releases:
                try:
                    async with asyncio.timeout(min(self.command_timeout, 2.0)):
                        await asyncio.gather(*releases, return_exceptions=True)
                except TimeoutError:
                    pass
            if self.background:
                await asyncio.wait(list(self.background), timeout=min(self.command_timeout, 2.0))
                for task in list(self.background):
                    task.cancel()
            # First: a mode switch under way would install connections after
            # the ones below were closed.
            await stop(self._settling)
            await self._verifier.aclose()
            await self.watchdog.aclose()
            await self.listener.aclose()
            await self.signals.aclose()
            await self.mux.drain(0.5)
            await self.mux.aclose()
            await self.renew_mux.aclose()
            if self.acked_lane is not None:
                await self.acked_lane.aclose()
        await stop(self._settling)
        # The deployment closes what it made, and the client the Client made
        # (from_url, from_sentinel) in the order its parts need.
        await self.deployment.aclose(self._redis if self.owns_redis else None)

    # -- introspection -------------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        # A copy first, in one step: a repr may ask from another thread.
        states = tuple(self.states.values())
        holds = sum(len(state.holds()) for state in states)
        waiting = sum(state.waiting() for state in states)
        observer = self.observer
        return ClientStatistics(
            holds=holds,
            waiting=waiting,
            subscriptions=self.listener.active + self.signals.active - self.evictions.active,
            watched=len(self.watchdog) - self.watchdog.checked,
            in_flight=self.mux.in_flight
            + self.renew_mux.in_flight
            + (self.acked_lane.in_flight if self.acked_lane is not None else 0),
            background=len(self.background),
            command_connects=self.mux.connects,
            pubsub_connects=self.listener.connects,
            acquisitions=observer.acquisitions,
            timeouts=observer.timeouts,
            cancellations=observer.cancellations,
            failures=observer.failures,
            losses=observer.losses,
            wait_time=observer.wait_time,
        )

    # -- the primitives' interface: keys, owners, attempts ----------------------------------
    #
    # Everything a primitive asks of the engine goes through the methods below
    # (never through ``mux``, ``listener``, ``signals`` or ``watchdog``):
    #
    # * Redis, routed by key: ``eval`` / ``submit_script`` / ``send_script`` /
    #   ``retry`` run a script for ``keys[0]``, ``call`` sends a plain command
    #   for its key. ``_route`` picks the connection (standalone: the one
    #   command connection; a Cluster router replaces that one method).
    # * Holds (holds/lifecycle.py, bound in ``__init__``): ``new_hold`` makes, wires and
    #   tracks every hold; ``release_hold`` (and ``release_failed`` /
    #   ``release_finished`` for a primitive's own release script) ends it;
    #   ``undo`` (undo.py) cleans up an acquire whose reply was lost;
    #   ``attempt_id`` numbers every acquire call.
    # * Waiting: ``waiter`` / ``pubsub_waiter`` / ``subscribed`` / ``subscribe``
    #   / ``unsubscribe``; renewed items: ``renew`` / ``untrack`` / ``renewing``.
    # * Local state: ``state`` / ``peek_state`` / ``drop_state``; ``spawn`` for
    #   background work.

    def owner(self, task: asyncio.Task[Any]) -> str:
        return f"{self.id}:{task_serial(task)}"

    def attempt_id(self) -> int:
        """A number unique per acquire call (or attempt) of this Client.

        The one source of the ids that scripts use to tell one acquire from
        another of the same owner (acquire.lua's attempt id, the fair lock's
        waiter id, the read-write lock's nonce, the semaphore's holder id), so
        that a late undo or retry touches only what its own call did.
        """
        self._attempts += 1
        return self._attempts

    # -- local state ------------------------------------------------------------------------

    def state(self, key: str, factory: Callable[[A], S], arg: A) -> S:
        """The local state keyed ``key`` (one per primitive name and kind, shared
        by every object of that name in this Client), made by ``factory(arg)``
        if there is none. (A factory and its argument, not a closure: nothing
        is allocated when the state exists.) The engine asks every state for
        ``holds()``, ``waiting()`` and ``close()`` (and ``leave()``, if it has one).
        """
        state: S | None = self.states.get(key)
        if state is None:
            state = self.states[key] = factory(arg)
        return state

    def drop_state(self, key: str, state: object) -> None:
        """Forget the local state keyed ``key`` if it is ``state`` (it went idle)."""
        if self.states.get(key) is state:
            del self.states[key]

    # -- Redis, routed by key: the Engine's Commands (commands.py) -----------------------------

    async def _set_mode(self) -> None:
        deployment = self.deployment = await self.deployment.settle(self)
        # What the server is and allows (topology/probe.py): refused now if
        # this Client needs what it lacks, before any script of ours ran.
        runner = self.runner
        found = await probe(
            lambda key, *command: self._route(key).call(*command),
            runner.eval,
            deployment.capabilities,
            prefix=self.prefix,
            ack=self.ack,
            no_scripts=runner.no_scripts,
        )
        error = refusal(found, notify=self.notify)
        if error is not None:
            raise error
        if found.publish_in_scripts != deployment.capabilities.publish_in_scripts:
            # Scripts that publish nothing (or, after a failover to a server
            # that allows it again, the usual ones): scripts.py.
            self.scripts = load_scripts(
                cluster=bool(deployment.cluster), publish=found.publish_in_scripts
            )
        if found != deployment.capabilities:
            conn_log.info("aiolock: %s", describe(found, runner.functions))
        deployment.capabilities = found
        self._settled = True

    def reprobe(self) -> None:
        """Probe the server again before the next command (a failover named
        another master): that command waits for it, as for the first one."""
        if self._settled and not self.closed:
            self._settled = False

    def undo(
        self,
        calls: tuple[Call, ...],
        on_reply: OnReply | None = None,
        *,
        while_open: bool = False,
    ) -> Undo:
        """The undo of one acquire call, used as its ``orphan`` handler: see ``Undo``."""
        return Undo(self, calls, on_reply, while_open)

    # -- renewed items (besides holds: the fair lock's liveness, waiting writers) -----------

    def renew(self, item: Renewable) -> None:
        """Have the watchdog renew ``item`` until ``untrack(item)`` (or it is gone)."""
        self.watchdog.add(item)

    def renewing(self, item: Renewable) -> bool:
        return item in self.watchdog

    # -- waiting --------------------------------------------------------------------------------

    def waiter(self, channel: bytes, signal: str) -> Waiter:
        """A registration for a waiting task, by this Client's notify mode."""
        if self.notify == "pubsub":
            return PubSubWaiter(self.listener, channel)
        if self.notify == "list":
            return ListWaiter(self.signals, signal.encode())
        return PollWaiter(self.backoff)

    def pubsub_waiter(self, channel: bytes) -> Waiter:
        """A registration on pub/sub ``channel`` whatever the notify mode (targeted wake-ups)."""
        return PubSubWaiter(self.listener, channel)

    def subscribed(self, channel: bytes) -> Channel | None:
        """The listener's channel ``channel`` if some waiter registered it (maybe lingering)."""
        return self.listener.channels.get(channel)

    def subscribe(self, channel: bytes, signal: bytes) -> Channel | None:
        """Register a channel of one's own (a handler, no waiters) by notify mode:
        pub/sub ``channel``, the signal list ``signal``, or None when polling."""
        if self.notify == "pubsub":
            return self.listener.register(channel)
        if self.notify == "list":
            return self.signals.register(signal)
        return None

    def unsubscribe(self, channel: Channel) -> None:
        """Drop a channel registered with ``subscribe``."""
        if self.notify == "pubsub":
            self.listener.unregister(channel)
        else:
            self.signals.unregister(channel)

    @property
    def verifier(self) -> asyncio.Task[None] | None:
        """The running (or last) verification of the holds after a connection reset."""
        return self._verifier.task


if TYPE_CHECKING:

    def _is_a_view(engine: Engine) -> EngineView:
        """(mypy checks here that the Engine is what every primitive runs on.)"""
        return engine
