"""Election: leader election over a lock of its own kind (issue 24 item 1).

The election *is* a lock underneath (``ElectionLock``: the AsyncLock protocol
on the election's keys, ``_primitives/election_kind.py``): winning is
acquiring it, so the hold, the watchdog's renewals, the fencing token, the
loss of a lease and the cancellation contract are the lock's. On top of it:

* the leader's **value**, in the lock's own hash (``~v``, with ``~t`` the
  term's token), so it lives and dies with the hold: a release, an expiry or a
  force release removes it with the hash;
* a **notices channel** (``<prefix>:{<name>}:el:obs``) on which every change
  an election makes is published ("*"): an announcement (won, proclaimed), a
  resignation, a force release. Observers read the leader again when told.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .._core.errors import (
    AiolockError,
    ClientClosedError,
    InvalidArgumentTypeError,
    LockLostError,
    LockNotOwnedError,
    UnsupportedServerError,
)
from .._core.futures import retrieve
from .._core.holds.lease import Hold, Lease
from .._core.options import LockStatistics
from .._core.protocol.keys import LockKeys
from .._core.validate import check_timeout
from .base import Entry, LockLike
from .election_kind import ElectionKeys
from .lock import AsyncLock
from .stats import describe

if TYPE_CHECKING:
    from .._core.observe.observer import Observer
    from .._core.view import EngineView

__all__ = ["AlreadyLeadingError", "Election", "ElectionLock", "Leader", "Term"]


class AlreadyLeadingError(AiolockError, RuntimeError):
    """``campaign()`` from a task that already leads this election (in this
    Client): a term is one hold, never re-entered; resign it first."""


def check_value(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(
            f"election value must be a str, got {type(value).__name__}: {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads an election, as Redis says: the value it announced and its
    term's fencing token (strictly increasing per election name)."""

    value: str
    fencing_token: int


class ElectionLock(AsyncLock):
    """The lock an election is: AsyncLock's protocol and scripts on the
    election's keys (``<prefix>:{<name>}:el...``), its own kind."""

    __slots__ = ()

    _keys_type: ClassVar[type[LockKeys]] = ElectionKeys
    _names: ElectionKeys
    kind = "election"
    _kind = "election"

    def current_hold(self) -> Hold | None:
        """The current task's hold of it in this Client, if any."""
        return self._my_hold()


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class Term:
    """One term of leadership: what ``campaign()`` returns.

    * ``fencing_token``: strictly greater than every token issued before for
      this election name (every term is a fresh hold: a new token); pass it
      to the resource the leader acts on.
    * ``value``: the value this leader announced (``proclaim()`` changes it).
    * ``lost``: True once the hold was lost (the watchdog found it gone or
      could not renew it in time, or it was force-released); another
      candidate may lead already.
    * ``await proclaim(value)``: announce another value, keep leading.
    * ``await resign()``: step down (from any task); idempotent, and it
      completes even if the caller is cancelled meanwhile.
    """

    __slots__ = ("_election", "_hold", "_lease", "_resigning", "_value")

    def __init__(self, election: Election, lease: Lease, hold: Hold, value: str) -> None:
        self._election = election
        self._lease = lease
        self._hold = hold
        self._value = value
        self._resigning: asyncio.Task[None] | None = None
        lease.on_lost(self._lost)

    def _lost(self, lease: Lease) -> None:
        # Lost, or its Client is closing (which releases it right after, in the
        # same loop turn): tell the observers once the release is on the wire.
        asyncio.get_running_loop().call_soon(self._tell_lost)

    def _tell_lost(self) -> None:
        election = self._election
        names = election._names
        try:
            told = election._engine.submit_script(
                "election_notify", (names.main,), (names.notices,)
            )
        except AiolockError:
            return  # (closed: its observers read again at the TTL they read)
        told.add_done_callback(retrieve)

    @property
    def name(self) -> str:
        return self._election.name

    @property
    def fencing_token(self) -> int:
        return self._hold.token

    @property
    def value(self) -> str:
        return self._value

    @property
    def lost(self) -> bool:
        return self._hold.lost

    @property
    def lost_reason(self) -> str | None:
        """Why leadership was lost (None while it is not)."""
        return self._hold.lost_reason

    @property
    def resigned(self) -> bool:
        """``resign()`` was called."""
        return self._resigning is not None

    async def _announce(self, value: str) -> None:
        election = self._election
        if self._resigning is not None:
            raise LockNotOwnedError(f"election {election.name!r}: this term was resigned")
        hold = self._hold
        if hold.lost:
            raise LockLostError(
                f"election {election.name!r}: leadership was lost ({hold.lost_reason})"
            )
        owner, token = hold.renew_args[0], hold.renew_args[1]
        names = election._names
        reply = await election._engine.eval(
            "election_proclaim", (names.main,), (owner, token, hold.token, value, names.notices)
        )
        if int(reply) != 1:
            raise LockLostError(
                f"election {election.name!r}: leadership was lost "
                f"({hold.lost_reason or 'expired or force-released'})"
            )
        self._value = value

    async def proclaim(self, value: str) -> None:
        """Change the leader's value and keep leading; observers see the change.

        Raises LockNotOwnedError if this term was resigned, LockLostError if
        leadership was lost. Cancelled while on the wire, the new value may or
        may not be announced (``value`` keeps the old one until it is known).
        """
        await self._announce(check_value(value))

    async def resign(self) -> None:
        """Step down: the value is withdrawn (observers are told), then the
        hold is released, and the next candidate may win.

        Idempotent: a second call waits for the first. Works from any task.
        Cancelled, it still completes (in the background). A term already
        lost resigns quietly. Raises ConnectionFailedError if Redis stayed
        unreachable (then a later call tries again; the hold expires anyway).
        """
        task = self._resigning
        if task is None or (task.done() and not task.cancelled() and task.exception()):
            task = self._resigning = asyncio.get_running_loop().create_task(self._step_down())
            task.add_done_callback(retrieve)
        await asyncio.shield(task)

    async def release(self) -> None:
        """``resign()``: a Term is the lease of an ``async with election.leadership()``."""
        await self.resign()

    async def _step_down(self) -> None:
        election, hold = self._election, self._hold
        withdrawn: asyncio.Future[Any] | None = None
        if not hold.lost:
            # The withdrawal, then the release, written at once on the one
            # connection of the election's key: run in that order, one round trip.
            names = election._names
            withdrawn = election._engine.submit_script(
                "election_resign", (names.main,), (*hold.renew_args[:2], names.notices)
            )
            withdrawn.add_done_callback(retrieve)
        try:
            await self._lease.release()
        except LockNotOwnedError:
            pass  # lost meanwhile: nothing to release
        if withdrawn is not None:
            await withdrawn

    def _watch(self, context: Entry) -> None:
        self._lease._watch(context)

    def _unwatch(self, context: Entry) -> None:
        self._lease._unwatch(context)

    def __repr__(self) -> str:
        state = "lost" if self.lost else ("resigned" if self.resigned else "leading")
        return f"<Term {self.name!r} token={self.fencing_token} value={self._value!r} {state}>"


_UNSET: Any = object()


class Election:
    """Leader election among any number of tasks and Clients, named ``name``.

    * **Campaign:** ``term = await campaign(value, timeout=None)`` waits until
      this task leads (or raises LockTimeoutError); ``async with
      leadership(value) as term:`` runs its body while leading.
    * **Who may resign:** anyone holding the :class:`Term` (``term.resign()``,
      from any task); the ``async with`` resigns on exit.
    * **Not reentrant:** a task that leads may not campaign again in the same
      election (AlreadyLeadingError); every term is a fresh hold.
    * **Fairness:** the lock's: candidates of one Client queue FIFO locally;
      across Clients it is not fair.
    * **Lease expiry:** the term is renewed by the watchdog (the Client's
      ``lease``); a leader that cannot renew in time (paused, partitioned)
      loses its term: ``term.lost``, and inside ``leadership()`` the body is
      cancelled and LockLostError raised from the ``async with``, as ``async
      with lock`` does. A leader that dies is succeeded within its lease.
    * **Cancellation:** a campaign cancelled at any await leaves nothing
      behind: not waiting, not holding, and if its announcement may have
      run, it is withdrawn (observers are told). ``resign()`` completes even
      when cancelled.
    * **Fencing:** every term's ``fencing_token`` is strictly greater than
      every token issued before for this name.
    * **Observing:** ``await leader()`` reads the leader; ``observe()`` yields
      it at once and on every change, woken by pub/sub (see ``observe``).

    A leader is visible once it has announced its value (one round trip after
    it won the lock): until then ``leader()`` reads None. The value is written
    to the master only: with ``replicas=N`` the hold is acknowledged, the
    value is not waited for.
    """

    __slots__ = ("_engine", "_entry_map", "_lock", "_names", "name")

    def __init__(self, engine: EngineView, name: str) -> None:
        self._lock = ElectionLock(engine, name)
        self._engine = engine
        self.name = self._lock.name
        self._names: ElectionKeys = self._lock._names
        self._entry_map: dict[asyncio.Task[Any], list[Entry]] = {}

    # -- leading ---------------------------------------------------------------------

    async def campaign(self, value: str = "", *, timeout: float | None = None) -> Term:
        """Wait until this task leads, announce ``value``, and return the term.

        ``timeout``: seconds at most (None: for ever; 0: one try); raises
        LockTimeoutError (a TimeoutError) when it passes first.
        """
        return await self._campaign(check_value(value), check_timeout(timeout))

    async def _campaign(self, value: str, timeout: float | None) -> Term:
        lock = self._lock
        held = lock.current_hold()
        if held is not None and held.releasing is None and not held.lost:
            raise AlreadyLeadingError(
                f"election {self.name!r}: this task leads it already (token {held.token})"
            )
        lease = await lock.acquire(timeout=timeout)
        hold = lock.current_hold()
        assert hold is not None  # (no await since the acquire returned)
        term = Term(self, lease, hold, value)
        try:
            await term._announce(value)
        except BaseException:
            # Won but not announced (cancelled, lost, failed): step down. The
            # announcement may have run: resign() withdraws it, and releases.
            try:
                await term.resign()
            except asyncio.CancelledError:
                raise  # (the step down goes on in the background)
            except Exception:
                pass  # the hold expires (the original error says why)
            raise
        return term

    def leadership(self, value: str = "", *, timeout: float | None = None) -> Leadership:
        """``async with election.leadership(value) as term:`` the body runs
        while this task leads; it resigns on exit. If leadership is lost
        meanwhile, the body is cancelled and LockLostError is raised from the
        ``async with`` (as ``async with lock`` does)."""
        return Leadership(self, check_value(value), check_timeout(timeout))

    # -- observing -------------------------------------------------------------------

    async def _read(self) -> tuple[Leader | None, int]:
        self._engine.enter()
        value, token, pttl = await self._engine.eval("election_leader", (self._names.main,), ())
        token_text = _text(token)
        leader = Leader(_text(value), int(token_text)) if token_text else None
        return leader, int(pttl)

    async def leader(self) -> Leader | None:
        """The current leader (its value and term's fencing token), or None."""
        leader, _ = await self._read()
        return leader

    async def observe(self) -> AsyncIterator[Leader | None]:
        """Yield the leader (or None) at once, then on every change: a new
        leader, a proclaimed value, a resignation, a force release, a loss.
        Consecutive duplicates are not yielded.

        Woken by pub/sub (the election's notices channel, subscribed before
        the first read, whatever the Client's notify mode), never by
        polling: an announcement, a proclaim, a resign, a force release, a
        term lost or released by its Client's ``aclose()`` publishes a
        notice. A leader that dies (or is cut off) sends none: its hold
        expires. So
        each wait is bounded by the TTL of the hold it read (derived from the
        lease, not a polling interval): at that time it reads again. A change
        made while the consumer is busy is seen at its next iteration (the
        latest state only). Raises ClientClosedError when the Client closes.
        """
        engine = self._engine
        engine.enter()
        # The deployment settled first (a cluster listens by slot: its listener
        # is installed then), so that the subscription is made where it lasts.
        await engine.is_cluster()
        found = engine.capabilities
        if not found.publish_in_scripts:
            raise UnsupportedServerError(
                f"{found.server} refuses PUBLISH inside scripts ({found.publish_refusal!r}), "
                "and observe() learns of a new leader only from the notices that scripts "
                "publish. Read the leader with leader() when you need it (campaign(), "
                "resign() and leader() work there), or use a server that allows PUBLISH in "
                "scripts. Nothing was changed in Redis"
            )
        notices = self._names.notices
        local = self._names.main + ":observers"
        state = engine.state(local, _Notices, engine)
        state.active += 1
        waiter = engine.pubsub_waiter(notices)
        try:
            last: Leader | None = _UNSET
            while True:
                await waiter.ready(None)  # subscribed before reading: no change missed
                channel = engine.subscribed(notices)
                if channel is not None:
                    channel.handler = state.notice  # (every observer here is told)
                changed = state.changed  # set by the next notice from now on
                leader, pttl = await self._read()
                if leader != last:
                    last = leader
                    yield leader
                # -2: no hold (wait for a notice); else until the hold's TTL runs out.
                bound = None if pttl < 0 else max(pttl / 1000, 0.001)
                await state.wait(changed, bound)
        finally:
            waiter.close()
            state.active -= 1
            if not state.active:
                engine.drop_state(local, state)

    # -- operators -------------------------------------------------------------------

    async def force_release(self) -> bool:
        """Depose the leader, whoever it is (``aiolock force-release``); True if
        somebody held it. Its term is lost (see ``AsyncLock.force_release``),
        fencing tokens keep increasing, observers are told."""
        deleted = await self._lock.force_release()
        if deleted:
            names = self._names
            told = self._engine.submit_script("election_notify", (names.main,), (names.notices,))
            told.add_done_callback(retrieve)
            await asyncio.shield(told)
        return deleted

    def statistics(self) -> LockStatistics:
        """This Client's view of the election's lock: its leader here (``locked``,
        the token, the lease left) and how many of its tasks campaign. Local, no
        round trip (``await leader()`` asks the server)."""
        return self._lock.statistics()

    def __repr__(self) -> str:
        return f"<Election {describe(self.statistics(), self._engine.loop)}>"


class _Notices:
    """One election's observers in one Client (``Engine.state``): the notices
    they were told of. Each notice sets the current event and starts a new one,
    so an observer waits on the event it took before its read, and no notice
    is taken from one observer by another (each sees every change, latest
    state first)."""

    __slots__ = ("active", "changed", "closed")

    def __init__(self, engine: EngineView) -> None:
        self.active = 0  # observers
        self.changed = asyncio.Event()
        self.closed = False

    def notice(self, message: bytes) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def wait(self, changed: asyncio.Event, bound: float | None) -> None:
        """Until a notice came since ``changed`` was taken, or ``bound`` seconds."""
        try:
            async with asyncio.timeout(bound):
                await changed.wait()
        except TimeoutError:
            pass
        if self.closed:
            raise ClientClosedError("the aiolock Client was closed while observing")

    def holds(self) -> list[Hold]:
        return []

    def waiting(self) -> int:
        return 0  # (observers wait for no hold)

    def close(self) -> None:
        self.closed = True
        self.changed.set()


class Leadership(LockLike[Term]):
    """``election.leadership(value, timeout=...)``: ``async with`` (and
    decorator) over a campaign; its "lease" is the Term."""

    __slots__ = ("_election", "_timeout", "_value", "name")

    kind: ClassVar[str] = "election"

    def __init__(self, election: Election, value: str, timeout: float | None) -> None:
        self._election = election
        self._value = value
        self._timeout = timeout
        self.name = election.name

    async def _acquire(self, timeout: float | None, lease: float | None) -> Term:
        return await self._election._campaign(self._value, timeout)

    def _observed(self, timeout: float | None, lease: float | None) -> Any:
        return self._acquire(timeout, lease)  # (the lock's acquire observes itself)

    async def __aenter__(self) -> Term:
        return await self._enter_ctx(self._timeout, None, "cancel")

    def _observer(self) -> Observer:
        return self._election._engine.observer

    def _entries(self) -> dict[asyncio.Task[Any], list[Entry]]:
        return self._election._entry_map

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self._election._engine.loop

    def _local_view(self) -> tuple[Iterable[Hold], int]:
        return self._election._lock._local_view()
