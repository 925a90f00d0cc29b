"""Latch: a distributed count-down latch (Redisson's RCountDownLatch, asyncio-native)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .._core.errors import InvalidArgumentError, InvalidArgumentTypeError
from .._core.futures import retrieve
from .._core.holds.lease import Hold
from .._core.options import LockStatistics
from .._core.protocol.keys import LatchKeys
from .._core.validate import check_timeout
from .base import Primitive
from .compete import compete
from .stats import lock_statistics

if TYPE_CHECKING:
    from .._core.view import EngineView

__all__ = ["MAX_COUNT", "Latch"]

#: The largest count a latch may be set to.
MAX_COUNT = 2**53


def check_count(value: object, *, allow_zero: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"latch count must be an int, got {type(value).__name__}: {value!r}"
        )
    low = 0 if allow_zero else 1
    if not low <= value <= MAX_COUNT:
        raise InvalidArgumentError(
            f"latch count must be between {low} and {MAX_COUNT}, got {value!r}"
        )
    return value


class Latch(Primitive):
    """A count-down latch shared by every Client: waiters pass once the count is zero.

    ``client.latch(name, count)``; ``count`` is what :meth:`try_set_count`
    sets when called without an argument (0: nothing, for objects that only
    wait or count down).

    * ``await try_set_count(n=None)``: start counting from ``n``, only if the
      latch is not counting already (True if it was set). A latch that
      reached zero may be set again.
    * ``await count_down()``: one less; at zero every waiter on every Client
      is woken at once. Counting down an open latch does nothing. Not
      idempotent: if it raises a connection error it may or may not have
      counted. If the calling task is cancelled while it is on the wire, it
      still completes.
    * ``await wait(timeout=None)``: return True once the count is zero (at
      once if it already is, or was never set); raise LockTimeoutError (a
      TimeoutError) when ``timeout`` seconds pass first. A waiter is
      registered before its last check, so it never misses the zero; and a
      waiter that saw the latch counting returns once it has opened, even if
      somebody set it counting again before the waiter looked. A cancelled
      wait leaves nothing behind.
    * ``await count()``: the current count (0 when open).
    * **Keys:** one hash ``<prefix>:{<name>}`` (count and generation). It
      lives for the Client's fence retention (24 h) after the last
      ``try_set_count``/``count_down``, and while anyone waits on it. A latch
      nobody counts down or waits on for that long is forgotten: it then
      reads as open (count 0), like a latch that was never set. (Redisson
      keeps such a latch for ever; we keep Redis memory bounded.)
    * ``notify="list"``: reaching zero pushes 16 wake-ups, so at most 16
      Clients are woken by it at once; the others see the zero at their
      next check (every ``client.lease`` at most).
    """

    __slots__ = ("_count",)

    _keys_type = LatchKeys
    kind = "latch"
    _names: LatchKeys

    def __init__(self, engine: EngineView, name: str, count: int) -> None:
        super().__init__(engine, name)
        self._count = check_count(count, allow_zero=True)

    @property
    def initial_count(self) -> int:
        """What :meth:`try_set_count` sets when called without an argument."""
        return self._count

    async def try_set_count(self, count: int | None = None) -> bool:
        """Set the count (default: the constructor's) unless the latch is counting.

        Returns True if it was set, False if the latch was already counting
        (it is left unchanged).
        """
        if count is None:
            if self._count == 0:
                raise InvalidArgumentError(
                    f"latch {self.name!r} was created with count 0: pass try_set_count(n)"
                )
            value = self._count
        else:
            value = check_count(count, allow_zero=False)
        engine = self._engine
        engine.enter()
        reply = await engine.eval("latch_set", self._names.down, (value, engine.retention_ms))
        return int(reply) == 1

    async def count_down(self) -> int:
        """Count down by one; return the count left (0: open; every waiter is woken)."""
        engine = self._engine
        engine.enter()
        keys = self._names.down
        args = (self._channel, engine.retention_ms)
        # Written now, in call order (a try_set_count called next runs after it),
        # and shielded: a cancelled caller does not stop it.
        # (A script the server lost is loaded and sent again by the engine.)
        sent = engine.submit_script("latch_down", keys, args)
        sent.add_done_callback(retrieve)
        reply = await asyncio.shield(sent)
        return int(reply)

    async def count(self) -> int:
        """The current count; 0 when the latch is open (or was never set)."""
        engine = self._engine
        engine.enter()
        value = await engine.call(self._key, b"HGET", self._key, b"c")
        return int(value) if value is not None else 0

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until the count is zero; return True.

        ``timeout``: seconds at most (None: for ever); raises LockTimeoutError
        (a TimeoutError) when it passes. ``timeout=0`` checks once.
        """
        checked = check_timeout(timeout)
        engine = self._engine
        loop = engine.enter()
        deadline = None if checked is None else loop.time() + checked
        keys = (self._key,)
        args = (engine.retention_ms,)
        # A waiter that finds it counting re-checks at least this often, in case
        # a wake-up was lost (list mode wakes at most 16 Clients per opening).
        bound = engine.lease
        seen: list[int] = []

        async def attempt() -> tuple[bool | None, float | None]:
            reply = await engine.eval("latch_check", keys, args)
            count, generation = int(reply[0]), int(reply[1])
            if count <= 0:
                return True, None
            if not seen:
                seen.append(generation)
            elif generation != seen[0]:
                return True, None  # it opened, and was set counting again since
            return None, bound

        local = self._names.local
        state = engine.state(local, _LatchState, engine)
        state.active += 1
        try:
            await compete(
                engine,
                what=f"latch {self.name!r} to open",
                deadline=deadline,
                attempt=attempt,
                waiter=self._waiter,
                parked=state.set_parked,
            )
        finally:
            state.active -= 1
            if not state.active:
                engine.drop_state(local, state)
        return True

    def statistics(self) -> LockStatistics:
        """This Client's view of the latch: how many of its tasks wait for it to
        open (``waiting``; parked, not counting a first check on the wire).

        A latch has no holder: ``locked`` is False and the hold fields are
        empty. Its count lives in Redis only: ``await latch.count()``. Local,
        no round trip, safe from any thread.
        """
        state: _LatchState | None = self._engine.peek_state(self._names.local)
        waiting = state.parked if state is not None else 0
        return lock_statistics(self.kind, self.name, self._engine.loop, (), waiting)

    def __repr__(self) -> str:
        # Plain attributes only: valid from any thread.
        head = f"<Latch {self.name!r} initial count {self._count}"
        if self._engine.loop is None:
            return f"{head}, not used yet>"
        return f"{head}, {self.statistics().waiting} waiting here>"


class _LatchState:
    """One latch name in one Client: its tasks in ``wait()`` (``Engine.state``)."""

    __slots__ = ("active", "parked")

    def __init__(self, engine: EngineView) -> None:
        self.active = 0  # tasks in wait()
        self.parked = 0  # of which registered as waiters

    def holds(self) -> list[Hold]:
        return []

    def waiting(self) -> int:
        return self.parked

    def set_parked(self, value: bool) -> None:
        self.parked += 1 if value else -1

    def close(self) -> None:
        return None  # parked tasks are failed by their channel or by compete()
