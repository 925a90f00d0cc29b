"""Singleflight: concurrent calls of one name, in any process, run a function once.

One run at a time per name across every Client on the same Redis: the first
caller takes the run's hold (a hash under the name's hash tag, with a fencing
token and a watchdog-renewed lease, as a lock's), runs the function and
records its outcome with that token; every other caller waits on the name's
channel (the Client's one listener; no polling) for the run to end, bounded
by the runner's lease, and takes the recorded outcome. Inside one Client the
local callers share one wait: one of them talks to Redis, the others wait for
it locally.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast, runtime_checkable

from .._core.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SharedCallError,
    UnshareableResultError,
)
from .._core.holds.lease import Hold
from .._core.options import LockStatistics
from .._core.validate import check_seconds, to_ms
from .base import Primitive
from .compete import compete
from .singleflight_kind import SingleflightKeys
from .stats import lock_statistics

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["DEFAULT_MAX_SIZE", "JSONSerializer", "Serializer", "Singleflight"]

log = logging.getLogger("aiolock.singleflight")

P = ParamSpec("P")
R = TypeVar("R")

#: The largest serialized result a run records, by default (1 MiB).
DEFAULT_MAX_SIZE = 1 << 20
#: The longest exception message sent to the waiters (longer ones are cut).
MESSAGE_MAX = 8192

_VALUE, _EXCEPTION, _UNSHAREABLE = "v", "e", "x"


@runtime_checkable
class Serializer(Protocol):
    """How a singleflight turns a result into bytes for the other callers and back."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JSONSerializer:
    """The default: JSON (UTF-8). A tuple comes back as a list, a dict's keys as
    strings; anything ``json.dumps`` refuses is an UnshareableResultError.

    Why not pickle by default: a waiter unpickles whatever it finds under the
    name's key, and unpickling runs code chosen by whoever could write that
    key. Pass a pickle-based serializer only where everyone who can write to
    the Redis is trusted as much as the code itself."""

    __slots__ = ()

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


_JSON = JSONSerializer()


def _message(exc: BaseException) -> str:
    """``str(exc)``, at most MESSAGE_MAX characters (and never raising)."""
    try:
        message = str(exc)
    except Exception:
        message = f"<{type(exc).__name__} whose str() failed>"
    return message if len(message) <= MESSAGE_MAX else message[:MESSAGE_MAX] + "..."


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class _Outcome:
    """One run's outcome as every caller but the runner sees it (decoded per caller)."""

    __slots__ = ("kind", "payload")

    def __init__(self, kind: str, payload: bytes) -> None:
        self.kind = kind
        self.payload = payload

    def deliver(self, sf: Singleflight) -> Any:
        if self.kind == _VALUE:
            try:
                return sf.serializer.loads(self.payload)
            except Exception as exc:
                raise UnshareableResultError(
                    f"singleflight {sf.name!r}: the shared result could not be decoded "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
        if self.kind == _EXCEPTION:
            try:
                data = json.loads(self.payload)
                type_name, message = str(data["type"]), str(data["message"])
            except (ValueError, KeyError, TypeError):
                type_name, message = "?", self.payload.decode("utf-8", "replace")
            raise SharedCallError(sf.name, type_name, message)
        raise UnshareableResultError(self.payload.decode("utf-8", "replace"))


#: A flight's outcome when its leader left before an outcome: a follower leads.
_AGAIN = _Outcome("", b"")


class _Flight:
    """The one wait of one Client for one name: its leader talks to Redis; the
    other local callers await ``outcome``."""

    __slots__ = ("followers", "outcome")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.outcome: asyncio.Future[_Outcome] = loop.create_future()
        self.followers = 0

    def settle(self, outcome: _Outcome) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)


class _State:
    """One singleflight name in one Client (``Engine.state``): its flight, its run's hold."""

    __slots__ = ("active", "flight", "hold")

    def __init__(self, engine: EngineView) -> None:
        self.flight: _Flight | None = None
        self.hold: Hold | None = None
        self.active = 0  # callers in run()

    def holds(self) -> list[Hold]:
        return [] if self.hold is None else [self.hold]

    def waiting(self) -> int:
        return self.active - (self.hold is not None)

    def hold_ended(self, hold: Hold) -> None:
        if self.hold is hold:
            self.hold = None

    def close(self) -> None:
        return None  # the leader's wait fails (ClientClosedError); its run's hold is released


class Singleflight(Primitive):
    """Concurrent calls of one name run ``fn`` once, across every Client.

    ``sf = client.singleflight(name, *, ttl=0.0, serializer=JSONSerializer(),
    max_size=1 MiB)``; ``await sf.run(fn, *args, **kwargs)``; or
    ``@client.singleflight(name)`` on an ``async def`` (it keeps its signature).

    * **Once:** of the calls of one name that overlap, in any process on the
      same Redis, one (the *runner*) runs ``fn``; the others wait for it and
      get its outcome. A call that begins after a run ended runs ``fn`` again,
      unless ``ttl > 0``: then the result is kept ``ttl`` seconds and calls
      in that time get it without running ``fn`` (an exception is never kept).
    * **What each caller gets:** the runner, ``fn``'s result or exception
      unchanged. The others, the result through the serializer (``dumps`` by
      the runner, ``loads`` by each caller: a JSON round trip by default), or
      :class:`SharedCallError` with the exception's ``type_name`` and
      ``message``. A result the serializer refuses, or larger than
      ``max_size`` bytes serialized, is an :class:`UnshareableResultError`
      for every caller, the runner included (the waiters are told, not left
      waiting).
    * **Waiting** is event-driven (the name's channel on the Client's one
      listener, or the notify mode's), never polling, and each wait is bounded
      by the runner's lease: if the runner's process dies or pauses past its
      lease, one waiting caller runs ``fn`` instead. A runner's hold is
      renewed by the watchdog like a lock's; a runner that lost it (a pause
      past its lease) still returns its result to its own caller, but cannot
      record it: its token is older than the new runner's, so it cannot
      overwrite a newer result. Within one Client the local callers share one
      wait (one of them talks to Redis).
    * **Who runs, in what order:** the first call whose try reaches Redis
      while no run is under way; when a run is given up or its lease runs
      out, whichever waiting Client's retry reaches Redis first (no FIFO).
      Nothing is released by hand: a run ends when ``fn`` returns or raises.
    * **Cancellation:** a cancelled waiter affects nobody (if it was the one
      talking to Redis for its Client, another local caller takes over). A
      cancelled runner gives the run up at once (its hold is deleted and the
      waiters woken; one of them runs ``fn``) and re-raises. If the begin
      call's reply is lost to a cancellation, whatever it took is given up
      in the background. The outcome's record completes even if the runner
      is cancelled while it is on the wire.
    * **Keys:** ``<prefix>:{<name>}:sf`` (the run, while one runs),
      ``:sf:fence`` (its fencing counter, kept for the Client's retention),
      ``:sf:res`` (the last outcome: ``ttl`` seconds if cached, else one lease
      for the waiters of that run to read it). Apart from a lock's keys: a
      lock and a singleflight may share a name.
    * Not reentrant: an ``fn`` that calls its own singleflight (directly or
      from a task it awaits) waits for its own run, for ever (the run's lease
      is renewed meanwhile), as an ``asyncio.Lock`` taken twice would.
    """

    __slots__ = ("max_size", "serializer", "ttl")

    _keys_type = SingleflightKeys
    kind = "singleflight"
    _names: SingleflightKeys

    def __init__(
        self,
        engine: EngineView,
        name: str,
        *,
        ttl: float = 0.0,
        serializer: Serializer | None = None,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        super().__init__(engine, name)
        self.ttl = check_seconds(ttl, "singleflight ttl", allow_zero=True)
        if serializer is None:
            serializer = _JSON
        elif not isinstance(serializer, Serializer):
            raise InvalidArgumentTypeError(
                "serializer must have dumps(value) -> bytes and loads(bytes) methods, got "
                f"{type(serializer).__name__}"
            )
        self.serializer: Serializer = serializer
        if isinstance(max_size, bool) or not isinstance(max_size, int):
            raise InvalidArgumentTypeError(
                f"max_size must be an int, got {type(max_size).__name__}: {max_size!r}"
            )
        if not 1 <= max_size <= 512 * (1 << 20):
            raise InvalidArgumentError(
                f"max_size must be between 1 and 512 MiB (in bytes), got {max_size!r}"
            )
        self.max_size = max_size

    # -- the decorator -------------------------------------------------------------------

    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Callable[P, Coroutine[Any, Any, R]]:
        """``@client.singleflight(name)`` on an ``async def``: each call goes through ``run``."""
        if not inspect.iscoroutinefunction(fn):
            raise InvalidArgumentTypeError(
                f"@singleflight({self.name!r}) decorates an async def, got {fn!r}"
            )

        @functools.wraps(fn)
        async def shared(*args: P.args, **kwargs: P.kwargs) -> R:
            return await self.run(fn, *args, **kwargs)

        return shared

    # -- run -----------------------------------------------------------------------------

    async def run(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``await fn(*args, **kwargs)`` unless a run of this name is under way
        (or, with ``ttl``, ended less than ``ttl`` s ago): then get its outcome.

        The arguments do not take part: every call of the name shares one run
        (put what matters in the name). See the class docstring for what each
        caller gets and what cancellation does.
        """
        if not callable(fn):
            raise InvalidArgumentTypeError(
                f"singleflight {self.name!r}: fn must be callable, got {type(fn).__name__}"
            )
        engine = self._engine
        task = engine.enter_task()
        local = self._names.local
        state: _State = engine.state(local, _State, engine)
        state.active += 1
        try:
            while True:
                flight = state.flight
                if flight is None:
                    break
                flight.followers += 1
                try:
                    outcome = await asyncio.shield(flight.outcome)
                finally:
                    flight.followers -= 1
                if outcome is not _AGAIN:
                    return cast("R", outcome.deliver(self))
                # Its leader left without an outcome: one of us leads now.
            flight = state.flight = _Flight(engine.enter())
            try:
                return await self._lead(state, flight, task, fn, args, kwargs)
            finally:
                if state.flight is flight:
                    state.flight = None
                flight.settle(_AGAIN)
        finally:
            state.active -= 1
            if not state.active:
                engine.drop_state(local, state)

    async def _lead(
        self,
        state: _State,
        flight: _Flight,
        task: asyncio.Task[Any],
        fn: Callable[..., Awaitable[R]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> R:
        engine = self._engine
        names = self._names
        owner = engine.owner(task)
        rid = f"{owner}:{engine.attempt_id()}"
        abandon = ("singleflight_abandon", names.abandon, (rid, self._channel))

        def granted(reply: Any, calls: tuple[Any, ...]) -> tuple[Any, ...]:
            return calls if int(reply[0]) == 1 else ()

        undo = engine.undo((abandon,), granted)
        seen = 0
        begin_args = [rid, engine.lease_ms, engine.retention_ms, 0]

        async def attempt() -> tuple[tuple[Any, ...] | None, float | None]:
            nonlocal seen
            begin_args[3] = seen
            reply = await engine.eval("singleflight_begin", names.begin, tuple(begin_args), undo)
            code = int(reply[0])
            if code == 0:
                if not seen:
                    seen = int(reply[2])
                pttl = int(reply[1])
                return None, pttl / 1000.0 if pttl > 0 else None
            return tuple(reply), None

        reply, sent = await compete(
            engine,
            what=f"singleflight {self.name!r}",
            deadline=None,
            attempt=attempt,
            waiter=self._waiter,
            abandon=undo.abandon,
        )
        if int(reply[0]) == 2:
            payload = reply[2]
            outcome = _Outcome(_text(reply[1]), _bytes(payload))
            flight.settle(outcome)
            return cast("R", outcome.deliver(self))
        token = int(reply[1])
        hold = state.hold = engine.new_hold(
            self.name,
            owner,
            token,
            task,
            None,
            engine.lease,
            sent,
            release=abandon,
            renew=("renew", names.main, (rid, str(token))),
            on_detach=state.hold_ended,
            kind=self.kind,
        )
        try:
            return await self._run_and_record(flight, hold, rid, token, fn, args, kwargs)
        finally:
            # Cancelled (or the process is stopping), or anything else that kept
            # the outcome from being recorded: give the run up now, so that a
            # waiter runs fn. A no-op once the record was sent (or the hold lost);
            # the release completes whatever happens to us.
            self._give_up(hold)

    async def _run_and_record(
        self,
        flight: _Flight,
        hold: Hold,
        rid: str,
        token: int,
        fn: Callable[..., Awaitable[R]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> R:
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            message = _message(exc)
            data = json.dumps({"type": _type_name(exc), "message": message}).encode()
            outcome = _Outcome(_EXCEPTION, data)
            flight.settle(outcome)
            await self._record(hold, rid, token, outcome)
            raise
        try:
            payload = self.serializer.dumps(result)
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise TypeError(f"dumps() returned {type(payload).__name__}, not bytes")
            payload = bytes(payload)
        except Exception as exc:
            error = UnshareableResultError(
                f"singleflight {self.name!r}: the result ({type(result).__name__}) could not "
                f"be serialized: {type(exc).__name__}: {_message(exc)}"
            )
            await self._unshareable(flight, hold, rid, token, error)
            raise error from exc
        if len(payload) > self.max_size:
            error = UnshareableResultError(
                f"singleflight {self.name!r}: the serialized result is {len(payload)} bytes, "
                f"over max_size ({self.max_size} bytes)"
            )
            await self._unshareable(flight, hold, rid, token, error)
            raise error
        outcome = _Outcome(_VALUE, payload)
        flight.settle(outcome)
        await self._record(hold, rid, token, outcome)
        return result

    async def _unshareable(
        self, flight: _Flight, hold: Hold, rid: str, token: int, error: UnshareableResultError
    ) -> None:
        outcome = _Outcome(_UNSHAREABLE, str(error).encode())
        flight.settle(outcome)
        await self._record(hold, rid, token, outcome)

    async def _record(self, hold: Hold, rid: str, token: int, outcome: _Outcome) -> None:
        """End the run with its outcome: written with the run's token, every waiter woken.

        Completes even if the caller is cancelled meanwhile (then re-raised).
        A runner that lost its hold writes nothing (a newer runner may be at
        work); a record that cannot reach Redis is logged: the run's hold
        then expires within one lease and a waiter runs ``fn`` again.
        """
        if hold.lost:
            if self._engine.closed:
                return  # the Client was closed meanwhile: it gave the run up itself
            log.warning(
                "singleflight %r: the run's lease was lost (%s); its outcome is not shared",
                self.name,
                hold.lost_reason,
            )
            return
        cacheable = self.ttl > 0 and outcome.kind == _VALUE
        keep_ms = to_ms(self.ttl) if cacheable else self._engine.lease_ms
        hold.release_script = "singleflight_done"
        hold.release_keys = self._names.done
        hold.release_args = (
            rid,
            str(token),
            outcome.kind,
            outcome.payload,
            keep_ms,
            "1" if cacheable else "0",
            self._channel,
        )
        try:
            code = await asyncio.shield(self._engine.release_hold(hold))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("singleflight %r: its outcome could not be recorded: %s", self.name, exc)
            return
        if code == 0:
            log.warning(
                "singleflight %r: the run's hold was gone when its outcome was recorded "
                "(its lease ran out); its outcome is not shared",
                self.name,
            )

    def _give_up(self, hold: Hold) -> None:
        if hold.lost or hold.releasing is not None:
            return
        self._engine.release_hold(hold).add_done_callback(_ignore)

    def statistics(self) -> LockStatistics:
        """This Client's view of the name, locally (no round trip, safe from any
        thread): ``locked`` while one of its tasks runs the function (``holder``,
        ``fencing_token``, ``lease_remaining`` of the run), ``waiting`` its other
        callers (those sharing its wait included)."""
        state: _State | None = self._engine.peek_state(self._names.local)
        holds = state.holds() if state is not None else ()
        waiting = state.waiting() if state is not None else 0
        return lock_statistics(self.kind, self.name, self._engine.loop, holds, waiting, count=_one)

    def __repr__(self) -> str:
        head = f"<Singleflight {self.name!r} ttl {self.ttl:g} s"
        state: _State | None = self._engine.peek_state(self._names.local)
        if state is None:
            return f"{head}, idle here>"
        running = "running here" if state.hold is not None else "waiting"
        return f"{head}, {running}, {state.active} caller(s) here>"


def _one(hold: Hold) -> int:
    return 1


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ignore(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
