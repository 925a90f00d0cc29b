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
The lower modules name what they need of it as Protocols (``HoldEngine``
in lease.py, ``Renewer`` in watchdog.py), which it satisfies structurally:
nothing below imports this module.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .connection import DID_NOT_RUN, CommandConnection, Orphan
from .errors import (
    ClientClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockNotOwnedError,
    WrongEventLoopError,
    asyncio_required,
    from_redis,
)
from .futures import Outcome
from .lease import Hold, Lease, LostCallback, call_lost_callback
from .listener import Channel, Listener
from .notify import Backoff, ListWaiter, PollWaiter, PubSubWaiter, SignalHub, Waiter
from .owner import task_serial
from .redis_compat import connection_factory
from .scripts import Script, load_scripts, refused
from .validate import check_lease, check_prefix, check_seconds, to_ms
from .watchdog import Renewable, Watchdog, plan_batches

__all__ = ["Call", "ClientStatistics", "Engine", "Notify", "Undo"]

log = logging.getLogger("aiolock")

Notify = Literal["pubsub", "list", "poll"]
_NOTIFY_MODES = ("pubsub", "list", "poll")
S = TypeVar("S")
A = TypeVar("A")
#: One idempotent script call: (script name, keys, args).
Call = tuple[str, tuple[Any, ...], tuple[Any, ...]]
#: Given an acquire's reply and its undo's calls, the calls that undo what it did.
OnReply = Callable[[Any, tuple[Call, ...]], tuple[Call, ...]]
#: Fence counters of names nobody used for this long expire (see DESIGN: fencing).
FENCE_RETENTION = 24 * 3600.0
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)  # OSError: ConnectionFailedError
_WRONG_LOOP = (
    "this aiolock Client is bound to the event loop it was first used on, and this is "
    "another one. This usually happens when a Client is made at module level or in a "
    "session-scoped pytest fixture and then used from another loop (pytest-asyncio gives "
    "each test its own loop by default; every asyncio.run() makes a new one). Create the "
    "Client inside the loop that uses it (in a function-scoped fixture, or in your main "
    "coroutine): one Client per event loop"
)


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


class Undo:
    """The one undo of an acquire call whose reply was lost (to a timeout or a
    cancellation), whatever the primitive: its ``orphan`` handler.

    The script may have run, so what it did is undone in the background, by
    idempotent scripts that target this call only (its attempt id, see
    ``Engine.attempt_id``), never the owner alone: an undo may run late (a
    retry after an outage), when the same task holds the lock again from a
    later call.

    * The reply was read after all (``error`` None): ``on_reply(reply,
      calls)`` says what to run (a release with the granted token, leaving
      a queue it joined, ...; nothing if it changed nothing); without
      ``on_reply``, ``calls`` are run whatever the reply.
    * The script failed (``DID_NOT_RUN``): it changed nothing, nothing to do.
    * Unknown whether it ran: ``calls`` (the primitive's clean-up of
      whatever this call may have done). ``abandon()`` and ``now()`` run them
      too (``compete`` gave up; the caller leaves).

    ``while_open``: skip the clean-up once the Client is closing (its
    ``aclose`` cleans up the holds itself).
    """

    __slots__ = ("calls", "engine", "on_reply", "while_open")

    def __init__(
        self,
        engine: Engine,
        calls: tuple[Call, ...],
        on_reply: OnReply | None,
        while_open: bool,
    ) -> None:
        self.engine = engine
        self.calls = calls
        self.on_reply = on_reply
        self.while_open = while_open

    def __call__(self, reply: Any, error: BaseException | None) -> None:
        if error is None:
            if self.on_reply is not None:
                self._run(self.on_reply(reply, self.calls))
                return
        elif isinstance(error, DID_NOT_RUN):
            return  # the script failed: it changed nothing
        self._run(self.calls)

    def now(self) -> None:
        """Clean up whatever this call may have done (unknown whether it ran)."""
        self._run(self.calls)

    abandon = now

    def _run(self, calls: tuple[Call, ...]) -> None:
        engine = self.engine
        if self.while_open and engine.closed:
            return
        for name, keys, args in calls:
            engine.clean_up(name, keys, args)


class Engine:
    """The engine of one Client: connections, listener, watchdog, scripts, holds.

    Made by ``Client``; the options are checked here. Bound to the event
    loop it is first entered from (``enter()``). The primitives use only
    its public attributes and methods; its ``_``-names are its own.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        prefix: str = "aiolock",
        lease: float = 30.0,
        notify: Notify = "pubsub",
        command_timeout: float = 10.0,
        backoff: Backoff | None = None,
    ) -> None:
        if not isinstance(redis, aioredis.Redis):
            raise InvalidArgumentTypeError(
                f"Client() takes a redis.asyncio.Redis, got {type(redis).__name__}; "
                "use Client.from_url('redis://...') to connect by URL"
            )
        self.prefix = check_prefix(prefix)
        lease_s = check_lease(lease, "lease")
        if lease_s is None or lease_s < 0.3:
            raise InvalidArgumentError(
                f"the Client's lease must be at least 0.3 seconds, got {lease!r}"
            )
        self.lease = lease_s
        if notify not in _NOTIFY_MODES:
            raise InvalidArgumentError(
                f"notify must be one of {', '.join(map(repr, _NOTIFY_MODES))}, got {notify!r}"
            )
        self.notify: Notify = notify
        self.command_timeout = check_seconds(command_timeout, "command_timeout", allow_zero=False)
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgumentTypeError(
                f"backoff must be an aiolock.Backoff, got {type(backoff).__name__}"
            )
        self.backoff = backoff or Backoff()
        self.id = secrets.token_hex(16)
        self._redis = redis
        # Every connection of this Client is made by it (see Dialer): the
        # redis client's settings, named after this Client on the server.
        self._new_connection = connection_factory(redis, f"aiolock:{self.id[:12]}")
        self.owns_redis = False
        self.scripts: dict[str, Script] = load_scripts()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._started = False
        self.background: set[asyncio.Task[Any]] = set()
        # Per-primitive local state, keyed by the primitive's main key.
        self.states: dict[str, Any] = {}
        # The connection epoch: bumped whenever an established connection to
        # the server is lost, since the server behind the next one may have
        # lost every key (a restart without persistence, a failover). A hold
        # confirmed by the server in an earlier epoch is verified at once
        # (_verify_holds) and hands out no reserved token meanwhile.
        self.epoch = 0
        # Loop time of the last epoch change: an acquire sent after it was
        # granted in the current epoch (see track).
        self.epoch_since = -math.inf
        self.verifier: asyncio.Task[None] | None = None
        self.mux = CommandConnection(
            self._new_connection,
            command_timeout=self.command_timeout,
            on_connect=self._preload,
            on_reset=self._connection_reset,
        )
        # The watchdog's own lane: renewals never queue behind a burst of
        # acquires and releases on the main connection (connected on first use).
        self.renew_mux = CommandConnection(
            self._new_connection,
            command_timeout=self.command_timeout,
            on_connect=self._preload,
            on_reset=self._connection_reset,
        )
        self.listener = Listener(self._new_connection, on_reset=self._connection_reset)
        self.signals = SignalHub(self._new_connection, command_timeout=self.command_timeout)
        # Tasks parked in Redis-side waits of primitives without a LocalQueue.
        self.parked = 0
        self._attempts = 0
        # The command connection's connect count when a waiting task last
        # warned that Redis is unreachable (one warning per outage).
        self.outage_warned = -1
        self.watchdog = Watchdog(self, self.lease)
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
        self._started = True
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
        """Close the Client. Idempotent. See the class docstring for what happens to holds."""
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
                "close the aiolock Client from the event loop it was first used on. " + _WRONG_LOOP
            )
        self.closed = True
        for state in list(self.states.values()):
            state.close()
        holds = [h for state in list(self.states.values()) for h in state.holds()]
        for hold in holds:
            hold.mark_lost("the Client was closed")
        if self._started:
            releases = [
                self.submit_script(h.release_script, h.release_keys, h.release_args) for h in holds
            ]
            # Leave the plain locks' waiting sets, so that no release is aimed at us.
            for state in list(self.states.values()):
                leave = getattr(state, "leave", None)
                left = leave() if leave is not None else None
                if left is not None:
                    releases.append(left)
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
            verifier, self.verifier = self.verifier, None
            if verifier is not None:
                verifier.cancel()
                await asyncio.gather(verifier, return_exceptions=True)
            await self.watchdog.aclose()
            await self.listener.aclose()
            await self.signals.aclose()
            await self.mux.drain(0.5)
            await self.mux.aclose()
            await self.renew_mux.aclose()
        if self.owns_redis:
            await self._redis.aclose()

    # -- introspection -------------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        holds = sum(len(state.holds()) for state in self.states.values())
        waiting = self.parked + sum(state.waiting() for state in self.states.values())
        return ClientStatistics(
            holds=holds,
            waiting=waiting,
            subscriptions=self.listener.active + self.signals.active,
            watched=len(self.watchdog),
            in_flight=self.mux.in_flight + self.renew_mux.in_flight,
            background=len(self.background),
            command_connects=self.mux.connects,
            pubsub_connects=self.listener.connects,
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
    # * Holds: ``new_hold`` makes, wires and tracks every hold; ``release_hold``
    #   (and ``release_failed`` / ``release_finished`` for a primitive's own
    #   release script) ends it; ``undo`` cleans up an acquire whose reply was
    #   lost; ``attempt_id`` numbers every acquire call.
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

    # -- Redis, routed by key ------------------------------------------------------------------

    def _route(self, key: Any) -> CommandConnection:
        """The command connection that serves ``key`` (standalone: always the one).

        The only place that picks a connection for a primitive's command: a
        Cluster router replaces this method.
        """
        return self.mux

    async def call(self, key: Any, *command: Any) -> Any:
        """Send a plain command about ``key`` (its first argument after the name)
        and return the reply, e.g. ``call(key, b"PTTL", key)``."""
        return await self._route(key).call(*command)

    def _preload(self) -> list[tuple[Any, ...]]:
        return [(b"SCRIPT", b"LOAD", s.source) for s in self.scripts.values()]

    def submit_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]
    ) -> asyncio.Future[Any]:
        """Send a script for ``keys[0]`` now; the future gets its reply."""
        script = self.scripts[name]
        return self._route(keys[0]).submit(b"EVALSHA", script.sha, len(keys), *keys, *args)

    def send_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], callback: Orphan
    ) -> None:
        """Send a script for ``keys[0]``; ``callback(reply, error)`` runs from the reply's parse.

        It must not raise: an exception is logged, and the callback is given
        no second call. (A NOSCRIPT error is passed on like any other.)
        """
        script = self.scripts[name]

        def guarded(reply: Any, error: BaseException | None) -> None:
            try:
                callback(reply, error)
            except Exception:
                log.exception("aiolock: reply handler of %r failed", name)

        self._route(keys[0]).send(b"EVALSHA", script.sha, len(keys), *keys, *args, callback=guarded)

    async def eval(
        self,
        name: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Any = None,
        mux: CommandConnection | None = None,
    ) -> Any:
        """Run a script for ``keys[0]``; reload it once on NOSCRIPT (safe: NOSCRIPT
        means it did not run). ``orphan(reply, error)`` runs if the caller gives
        up before the reply (see ``undo``); ``mux`` is the watchdog's own lane."""
        script = self.scripts[name]
        mux = mux or self._route(keys[0])
        try:
            return await mux.call(b"EVALSHA", script.sha, len(keys), *keys, *args, orphan=orphan)
        except NoScriptError:
            await mux.call(b"SCRIPT", b"LOAD", script.source)
            try:
                return await mux.call(
                    b"EVALSHA", script.sha, len(keys), *keys, *args, orphan=orphan
                )
            except NoScriptError as exc:  # flushed again at once: give up
                raise from_redis(exc) from exc

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("aiolock background task failed: %r", task.exception())

    def run_callback(self, callback: LostCallback, lease: Lease) -> None:
        try:
            awaitable = call_lost_callback(callback, lease)
        except Exception:
            log.exception("aiolock: on_lost callback %r raised", callback)
            return
        if awaitable is not None:

            async def run() -> None:
                try:
                    await awaitable  # type: ignore[misc]
                except Exception:
                    log.exception("aiolock: on_lost callback %r raised", callback)

            self.spawn(run())

    async def retry(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], attempts: int = 5
    ) -> Any:
        """Run an idempotent script, retrying transient errors with backoff."""
        delay = 0.05
        for attempt in range(attempts):
            try:
                return await self.eval(name, keys, args)
            except _TRANSIENT:
                if attempt == attempts - 1 or self.closed:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def clean_up(self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]) -> None:
        """Run an idempotent clean-up script in the background (``retry``, spawned)."""
        self.spawn(self.retry(name, keys, args))

    def undo(
        self,
        calls: tuple[Call, ...],
        on_reply: OnReply | None = None,
        *,
        while_open: bool = False,
    ) -> Undo:
        """The undo of one acquire call, used as its ``orphan`` handler: see ``Undo``."""
        return Undo(self, calls, on_reply, while_open)

    # -- holds: make, release, extend, renew ----------------------------------------------

    def new_hold(
        self,
        name: str,
        owner: str,
        token: int,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        lease_s: float,
        sent: float,
        *,
        release: tuple[str, tuple[Any, ...], tuple[Any, ...]],
        renew: tuple[str, str, tuple[Any, ...]],
        on_detach: Callable[[Hold], None],
        on_release: Callable[[Hold], asyncio.Future[int]] | None = None,
        confirmed: int = -1,
    ) -> Hold:
        """The one place a hold is made: build it, wire it and start keeping it alive.

        ``lease`` is what the caller asked for (None: the watchdog renews the
        hold; else it simply expires), ``lease_s`` its length in seconds and
        ``sent`` the send time of the acquire that was granted, so the hold
        expires at ``sent + lease_s``. ``release``/``renew``: the scripts (see
        ``Hold``); ``on_detach`` frees the primitive's local gate when the
        hold ends; ``on_release`` replaces ``release_hold`` (the plain lock's
        handoff). ``confirmed``: the connection epoch in which the server
        granted it, if the primitive knows (see ``track``). The primitive
        records the returned hold in its local state.
        """
        hold = Hold(
            self,
            name,
            owner,
            token,
            task,
            lease_s,
            lease is None,
            sent + lease_s,
            release=release,
            renew=renew,
        )
        hold.on_detach = on_detach
        hold.on_release = on_release
        hold.confirmed = confirmed
        self.track(hold)
        return hold

    def release_hold(self, hold: Hold) -> asyncio.Future[int]:
        """Start releasing a hold in Redis; the returned future resolves with the
        script's code (1 released, 2 already released, 0 not owned).

        The release completes even if nobody awaits the future any more.
        """
        outcome = Outcome(loop=self.loop)
        hold.releasing = outcome
        script, keys, args = hold.release_script, hold.release_keys, hold.release_args

        def done(reply: Any, error: BaseException | None) -> None:
            # Straight from the reply's parse: the caller wakes on the next turn.
            if error is not None:
                self.spawn(self._release_slowly(hold, outcome, script, keys, args))
            else:
                self.release_finished(hold, outcome, int(reply))

        self.send_script(script, keys, args, done)
        return outcome

    async def _release_slowly(
        self,
        hold: Hold,
        outcome: asyncio.Future[int],
        script: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
    ) -> None:
        try:
            code = int(await self.retry(script, keys, args))
        except BaseException as exc:
            self.release_failed(hold, outcome, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.release_finished(hold, outcome, code)

    def release_failed(self, hold: Hold, outcome: asyncio.Future[int], exc: BaseException) -> None:
        """The one ending of a release that failed for good (after its retries).

        Refused (``refused(exc)``: a key of the name holds a value aiolock did
        not write): nothing changed, the hold is still ours and still renewed,
        and the caller may release again once the key is fixed. Otherwise give
        up: the hold is lost (no longer renewed) and expires by itself within
        one lease. Either way the caller gets ``exc``.
        """
        hold.releasing = None
        if not refused(exc):
            hold.mark_lost(f"release failed: {exc!r}")
        if not outcome.done():
            outcome.set_exception(exc)

    def release_finished(self, hold: Hold, outcome: asyncio.Future[int], code: int) -> None:
        """The one ending of a release Redis answered: ``code`` 1 or 2 (released)
        or 0 (the hold was gone: lost, unless it already was). Ends the hold."""
        if code == 0 and not hold.lost:
            hold.mark_lost("the hold was gone when released (expired or force-released)")
        hold.detach()
        if not outcome.done():
            outcome.set_result(code)

    async def extend_hold(self, hold: Hold, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        ms = to_ms(seconds)
        reply = await self.retry(hold.renew_script, (hold.renew_key,), (ms, *hold.renew_args))
        if int(reply[0]) != 1:
            hold.gone("the hold was gone when extended")
            raise LockNotOwnedError(f"{hold.name!r}: the hold was gone when extended")
        new_expiry = sent + seconds
        if new_expiry > hold.expires_at:
            hold.expires_at = new_expiry
            if hold.timer is not None:
                hold.timer.cancel()
                hold.timer = loop.call_at(new_expiry, hold.gone, "the fixed lease expired")

    def track(self, hold: Hold) -> None:
        """Start keeping a new hold alive: the watchdog, or a timer for a fixed lease.

        Every primitive's new hold passes here, its ``expires_at`` being the
        send time of the acquire that was granted plus its lease. If that
        acquire was sent after the last connection reset (no reset since,
        until now: the reply came on the current connections), the grant
        confirms the hold in the current epoch; otherwise (or if a primitive
        sets an older ``confirmed`` afterwards, synchronously) it is verified
        at once, as after a reset.
        """
        if hold.confirmed < 0 and self.epoch_since < hold.expires_at - hold.lease - 1e-6:
            hold.confirmed = self.epoch
        if hold.confirmed != self.epoch:
            self.start_verifier()
        if hold.watchdog:
            self.watchdog.add(hold)
        else:
            hold.timer = asyncio.get_running_loop().call_at(
                hold.expires_at, hold.gone, "the fixed lease expired"
            )

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

    def first_outage_warning(self) -> bool:
        """True once per outage (per command connection lost): whether to log it."""
        if self.outage_warned == self.mux.connects:
            return False
        self.outage_warned = self.mux.connects
        return True

    def renew_batch(self, script: str, items: list[Any], lease: float) -> asyncio.Future[Any]:
        """Renew ``items`` (to last at least ``lease`` seconds) in one script call.

        A hold found alive is confirmed for the current connection epoch, if
        no connection was lost between the call and its reply.
        """
        keys = tuple(item.renew_key for item in items)
        args: list[Any] = [to_ms(lease)]
        for item in items:
            args.extend(item.renew_args)
        epoch = self.epoch
        fut = asyncio.ensure_future(self.eval(script, keys, tuple(args), mux=self.renew_mux))

        def confirm(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled() or fut.exception() is not None or self.epoch != epoch:
                return
            for item, alive in zip(items, fut.result(), strict=False):
                if alive == 1 and isinstance(item, Hold):
                    item.confirmed = epoch

        fut.add_done_callback(confirm)
        return fut

    # -- connection epochs: a restart or failover may have lost every hold ---------------

    def _connection_reset(self) -> None:
        """An established connection to the server was lost: start a new epoch
        and verify every hold as soon as the server answers again."""
        self.epoch += 1
        self.epoch_since = self.loop.time() if self.loop is not None else math.inf
        self.start_verifier()

    def start_verifier(self) -> None:
        """Run _verify_holds unless it runs already."""
        if self.closed or self.loop is None:
            return
        if self.verifier is None or self.verifier.done():
            self.verifier = self.loop.create_task(self._verify_holds(), name="aiolock-verify-holds")

    async def _verify_holds(self) -> None:
        """Verify every hold not confirmed in the current epoch, until none is left.

        Watchdog holds are renewed (as the watchdog would); a fixed lease is
        only checked, by the same script asked for no more than its remaining
        time (renewals never shorten). A hold the server no longer has is
        lost at once, not at the watchdog's next round (``lease / 3``) or at
        the fixed lease's end. A round that fails (the server is still down)
        is retried with backoff; the watchdog and the fixed leases' timers
        still mark holds lost at their expiry meanwhile.
        """
        delay = 0.05
        while not self.closed:
            now = self.loop_time()
            epoch = self.epoch
            holds = [
                h
                for state in list(self.states.values())
                for h in state.holds()
                if h.confirmed != epoch and not h.lost and (h.watchdog or h.expires_at > now)
            ]
            if not holds:
                return
            if not await self._verify_round(holds, now) and self.epoch == epoch:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _verify_round(self, holds: list[Hold], sent: float) -> bool:
        """One verification of ``holds``; False if some call failed."""
        calls: list[tuple[list[Hold], float | None, asyncio.Future[Any]]] = []
        by_script: dict[str, list[Hold]] = {}
        for hold in holds:
            if hold.watchdog:
                by_script.setdefault(hold.renew_script, []).append(hold)
            else:
                fut = self.renew_batch(hold.renew_script, [hold], hold.expires_at - sent)
                calls.append(([hold], None, fut))
        for script, group in by_script.items():
            for batch in plan_batches(group):
                calls.append((batch, self.lease, self.renew_batch(script, batch, self.lease)))
        results = await asyncio.gather(*(fut for _, _, fut in calls), return_exceptions=True)
        current = {h for state in list(self.states.values()) for h in state.holds()}
        ok = True
        for (batch, lease, _), result in zip(calls, results, strict=True):
            if isinstance(result, BaseException):
                ok = False
                continue
            for hold, alive in zip(batch, result, strict=False):
                if alive == 1:
                    if lease is not None:
                        hold.renewed(sent, lease)
                elif hold in current and hold.releasing is None:
                    hold.mark_lost(
                        "the server no longer has the hold (lost on a restart or failover)"
                    )
        return ok
