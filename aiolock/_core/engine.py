"""The Engine: what the primitives run on, one per Client (so one per event loop).

It owns the shared resources of aiolock: one multiplexed command connection,
the one pub/sub listener (with its own connection), the one watchdog (whose
renewals have a command connection of their own, so that they never queue
behind a burst of acquires), the loaded scripts, the client id and the
registry of every primitive's local state. The primitives call its public
methods (run this script for this key, track this hold, wait on this
channel) and nothing else; ``Client`` is the public facade that creates it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .connection import CommandConnection, Orphan
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
from .listener import Listener
from .notify import Backoff, ListWaiter, PollWaiter, PubSubWaiter, SignalHub, Waiter
from .owner import task_serial
from .scripts import Script, load_scripts, refused
from .validate import check_lease, check_prefix, check_seconds, to_ms
from .watchdog import Watchdog, plan_batches

__all__ = ["ClientStatistics", "Engine", "Notify"]

log = logging.getLogger("aiolock")

Notify = Literal["pubsub", "list", "poll"]
_NOTIFY_MODES = ("pubsub", "list", "poll")
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
        # granted in the current epoch (see _track).
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
        self.listener = Listener(self._new_connection)
        self.listener.on_reset = self._connection_reset
        self.signals = SignalHub(self._new_connection)
        # Tasks parked in Redis-side waits of primitives without a LocalQueue.
        self.parked = 0
        self._attempts = 0
        # The command connection's connect count when a waiting task last
        # warned that Redis is unreachable (one warning per outage).
        self.outage_warned = -1
        self.watchdog = Watchdog(self, self.lease)
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

    # -- plumbing used by the primitives ----------------------------------------------------

    def owner(self, task: asyncio.Task[Any]) -> str:
        return f"{self.id}:{task_serial(task)}"

    def attempt_id(self) -> int:
        """A number unique per acquisition attempt of this Client (see acquire.lua)."""
        self._attempts += 1
        return self._attempts

    def _new_connection(self) -> AbstractConnection:
        pool = self._redis.connection_pool
        kwargs = dict(pool.connection_kwargs)
        # aiolock's own connections: raw bytes, RESP2, no socket read timeout
        # (liveness is checked per command), never retried behind our back.
        kwargs.update(
            socket_timeout=None,
            decode_responses=False,
            protocol=2,
            retry=None,
            client_name=f"aiolock:{self.id[:12]}",
        )
        kwargs.pop("connection_pool", None)
        conn: AbstractConnection = pool.connection_class(**kwargs)
        return conn

    def _preload(self) -> list[tuple[Any, ...]]:
        return [(b"SCRIPT", b"LOAD", s.source) for s in self.scripts.values()]

    def submit_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]
    ) -> asyncio.Future[Any]:
        script = self.scripts[name]
        return self.mux.submit(b"EVALSHA", script.sha, len(keys), *keys, *args)

    def send_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], callback: Orphan
    ) -> None:
        """Send a script; ``callback(reply, error)`` runs from the reply's parse.

        It must not raise: an exception is logged, and the callback is given
        no second call. (A NOSCRIPT error is passed on like any other.)
        """
        script = self.scripts[name]

        def guarded(reply: Any, error: BaseException | None) -> None:
            try:
                callback(reply, error)
            except Exception:
                log.exception("aiolock: reply handler of %r failed", name)

        self.mux.send(b"EVALSHA", script.sha, len(keys), *keys, *args, callback=guarded)

    async def eval(
        self,
        name: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Any = None,
        mux: CommandConnection | None = None,
    ) -> Any:
        """Run a script; reload it once on NOSCRIPT (safe: NOSCRIPT means it did not run)."""
        script = self.scripts[name]
        mux = mux or self.mux
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

    # -- holds: release, extend, renew -------------------------------------------------

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
            hold.releasing = None
            if refused(exc):
                # Nothing changed: the hold is still ours (and still renewed);
                # the caller may release again once the key is fixed.
                if not outcome.done():
                    outcome.set_exception(exc)
                return
            # Give up: stop renewing, so the hold expires by itself within one lease.
            hold.mark_lost(f"release failed: {exc!r}")
            if not outcome.done():
                outcome.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.release_finished(hold, outcome, code)

    def release_finished(self, hold: Hold, outcome: asyncio.Future[int], code: int) -> None:
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

    def waiter(self, channel: bytes, signal: str) -> Waiter:
        """A registration for a waiting task, by this Client's notify mode."""
        if self.notify == "pubsub":
            return PubSubWaiter(self.listener, channel)
        if self.notify == "list":
            return ListWaiter(self.signals, signal.encode())
        return PollWaiter(self.backoff)

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
