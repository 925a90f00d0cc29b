"""The stateful machine: every held primitive against its model (tests/model.py).

Hypothesis picks sequences of operations by four actors (two tasks in each
of two Clients) on one name: a try that will not wait, an acquire that
waits, a release, a re-entry, an extend, cancelling a waiting acquire or an
acquire in flight (after a chosen number of event-loop steps), a hold with
a short fixed lease left to run out, a force release by a third Client,
killing every connection of the Clients (``CLIENT KILL``), and, on a
server of its own, a restart without persistence. After every step the
primitive, the server and the model must agree: who holds (each actor's
live leases, the holders the server records as the CLI reads them), the
fencing tokens (above every earlier one; a re-entry keeps its hold's), who
waits; a waiter is served once the model lets it in; a hold the model says
ended is reported lost, and no other is. At the end every actor lets go,
the Clients close, nothing is left in Redis but the fencing counter, and
the history checker (aiolock/_history.py) proves mutual exclusion and
token order over every exclusive hold.

No rule has a precondition: what Hypothesis draws never depends on the
state, which may differ between two runs of one sequence (an acquire
cancelled after n loop turns may or may not have had its reply); a rule
that does not apply returns at once. (Hypothesis refuses a search whose
draws change between replays: FlakyStrategyDefinition.)

Hypothesis runs rules synchronously: each rule drives a private event loop
until the event it waits for (a reply, a park, a grant, a loss report),
never for a time. ``EVENT`` only bounds an event that never comes.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
)
from hypothesis.strategies import integers, sampled_from

from aiolock import Backoff, Client, LockNotOwnedError, Redlock
from aiolock._history import Op, check
from aiolock.cli.ops import Server, Target
from tests.core_util import eventually
from tests.model import HoldsModel, LatchModel, Shape

T = TypeVar("T")

ACTORS = ("a0", "a1", "b0", "b1")
#: The longest one event may take on a loaded machine (a reply, a wake-up):
#: only a bound for a step that never comes, never waited out otherwise.
EVENT = 10.0
#: The actors' Client lease (renewed by the watchdog every LEASE / 3; a hold
#: ended on the server is found lost within LEASE / 3 at the latest).
LEASE = 3.0
#: A fixed lease left to run out.
FIXED = 0.3
PERMITS = 2
PREFIX = "sm"


@dataclass(frozen=True)
class Kind:
    """How the machine reaches one primitive: its model's shape and sides."""

    name: str
    shape: Shape
    sides: tuple[str, ...] = ("x",)
    #: Its waiters can be told apart by the Client's statistics (else the
    #: machine keeps one waiter at a time, or none).
    many_waiters: bool = False
    #: The history checker's exclusion rule applies to its holds.
    exclusive: bool = True


KINDS = {
    "lock": Kind("lock", "exclusive"),
    "fair": Kind("fair", "fair", many_waiters=True),
    "spin": Kind("spin", "exclusive"),
    "rw": Kind("rw", "rw", ("read", "write"), exclusive=False),
    "semaphore": Kind("semaphore", "semaphore", ("permit",), exclusive=False),
    "multi": Kind("multi", "exclusive"),
    "redlock": Kind("redlock", "exclusive"),
}


def traced(f: Callable[..., None]) -> Callable[..., None]:
    """Keep each step in ``self.trace``: a failure's message lists the steps
    that led to it (Hypothesis cannot always replay a run against a server)."""

    @functools.wraps(f)
    def step(self: Any, **kwargs: Any) -> None:
        self.trace.append(f"{f.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        try:
            f(self, **kwargs)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nsteps: {'; '.join(self.trace)}") from None

    return step


class Actor:
    """One task that runs commands one at a time: its holds are its own (reentrancy is per task)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, owner: Any) -> None:
        self.loop, self.name, self.owner = loop, name, owner  # owner: a Client or a Redlock
        self.leases: list[Any] = []
        self.side = ""
        self.waiting: asyncio.Future[Any] | None = None  # the acquire under way
        self.invoked = 0
        self._queue: asyncio.Queue[tuple[Callable[[], Awaitable[Any]], asyncio.Future[Any]]]
        self._start()

    def _start(self) -> None:
        self._queue = asyncio.Queue()
        self.task = self.loop.create_task(self._run(), name=f"actor-{self.name}")

    async def _run(self) -> None:
        while True:
            command, fut = await self._queue.get()
            try:
                result = await command()
            except Exception as exc:
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(result)

    def do(self, command: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = self.loop.create_future()
        self._queue.put_nowait((command, fut))  # type: ignore[arg-type]
        return fut

    def restart(self) -> None:
        """Cancel whatever the task is doing and start a fresh task (it must hold nothing)."""
        self.task.cancel()
        self.loop.run_until_complete(asyncio.gather(self.task, return_exceptions=True))
        self.waiting = None
        self._start()


class HoldsMachine(RuleBasedStateMachine):
    """Set ``kind``, ``urls`` (one; three for Redlock) and ``fresh`` (a
    ServerProcess to restart, or None) on a subclass."""

    kind: Kind = KINDS["lock"]
    urls: Sequence[str] = ()
    fresh: Any = None  # a tests.servers.ServerProcess: the restart rule

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.name = f"sm-{uuid.uuid4().hex[:8]}"
        self.clients: list[Client] = []
        self.clients_of: dict[int, list[Client]] = {}
        owners = [self._owner() for _ in range(2)]
        self.admin = self._owner(admin=True)
        self.actors = {n: Actor(self.loop, n, owners[0 if n[0] == "a" else 1]) for n in ACTORS}
        self.model = HoldsModel(self.kind.shape, PERMITS)
        self.trace: list[str] = []
        self.history: list[Op] = []
        self.began: dict[str, tuple[int, int, int]] = {}  # actor -> invoked, acquired, token
        self.view: Server | None = None
        if self.kind.name != "redlock":
            self.view = self.run(Server.open(Target(self.urls[0], PREFIX, None, {})))

    def _owner(self, *, admin: bool = False) -> Any:
        made = [Client.from_url(u, prefix=PREFIX, lease=LEASE) for u in self.urls]
        for c in made:
            self.run(c.__aenter__())
        self.clients.extend(made)
        owner = Redlock(made) if self.kind.name == "redlock" else made[0]
        self.clients_of[id(owner)] = made
        return owner

    # -- driving the loop ------------------------------------------------------------------

    def run(self, aw: Awaitable[T], what: str = "a reply") -> T:
        async def bounded() -> T:
            try:
                async with asyncio.timeout(EVENT):
                    return await aw
            except TimeoutError:
                raise AssertionError(f"no {what} within {EVENT} s") from None

        return self.loop.run_until_complete(bounded())

    def until(self, predicate: Callable[[], Any], what: str) -> None:
        self.loop.run_until_complete(eventually(predicate, timeout=EVENT, what=what))

    # -- the primitive ---------------------------------------------------------------------

    def handle(self, owner: Any, side: str) -> Any:
        k, n = self.kind.name, self.name
        if k == "redlock":
            return owner.lock(n)
        if k == "lock":
            return owner.lock(n)
        if k == "fair":
            return owner.fair_lock(n)
        if k == "spin":
            return owner.spin_lock(n, backoff=Backoff(initial=0.005, maximum=0.05))
        if k == "rw":
            rw = owner.rw_lock(n)
            return rw.read if side == "read" else rw.write
        if k == "semaphore":
            return owner.semaphore(n, PERMITS)
        assert k == "multi"
        return owner.multi_lock(owner.lock(n + "-1"), owner.lock(n + "-2"))

    def waiting_count(self, owner: Any) -> int:
        """The tasks of ``owner`` (a Client or a Redlock) waiting, as its statistics say."""
        if self.kind.name == "rw":
            rw = owner.rw_lock(self.name)
            return int(rw.read.statistics().waiting + rw.write.statistics().waiting)
        return int(self.handle(owner, self.kind.sides[0]).statistics().waiting)

    async def server_in_use(self) -> int:
        """Holders (permits for a semaphore) as the primitive reads them from the server."""
        h = self.handle(self.admin, self.kind.sides[0])
        if self.kind.name == "semaphore":
            return int(await h.in_use())
        if self.kind.name == "rw":
            return int(await self.admin.rw_lock(self.name).is_locked())
        return int(await h.is_locked())

    def _in_use(self) -> int:
        """What server_in_use must read, by the model."""
        if self.kind.name == "semaphore":
            return self.model.in_use()
        return int(bool(self.model.holders()))

    # -- what the model sees ---------------------------------------------------------------

    def _granted(self, actor: Actor, side: str, lease: Any) -> None:
        verdict = self.model.granted(actor.name, side, lease.fencing_token)
        if verdict == "acquired" and not actor.leases:
            self.began[actor.name] = (actor.invoked, time.monotonic_ns(), lease.fencing_token)
        actor.leases.append(lease)
        actor.side = side

    def _ended(self, actor: Actor, *, lost: bool) -> None:
        """``actor``'s holds all ended (released, or lost): into the history."""
        invoked, acquired, token = self.began.pop(actor.name)
        now = time.monotonic_ns()
        if self.kind.exclusive or actor.side == "write":
            self.history.append(
                Op(
                    self.name,
                    token,
                    invoked,
                    acquired,
                    now,
                    lost=now if lost else None,
                    confirmed_gone=lost,
                    who=actor.name,
                )
            )

    def _serve_waiters(self) -> None:
        """Room was made: the waiters the model lets in get it, and only they."""
        while True:
            candidates = self.model.may_be_granted()
            if not candidates:
                return
            waiting = {n: self.actors[n].waiting for n in self.model.waiters}
            self.until(
                lambda w=waiting, c=candidates: any(  # type: ignore[misc]
                    w[n] is not None and w[n].done() for n in c
                ),
                f"a waiter of {sorted(candidates)} served ({self.model.describe()})",
            )
            done = [n for n, f in waiting.items() if f is not None and f.done()]
            assert set(done) <= candidates, f"{done} served; the model lets in {candidates}"
            for n in done:
                actor = self.actors[n]
                fut, actor.waiting = actor.waiting, None
                assert fut is not None
                self._granted(actor, self.model.waiters[n], fut.result())

    def _lost(self, names: set[str]) -> None:
        """The model ended these actors' holds: each is told, and release says not owned."""
        for n in sorted(names):
            actor = self.actors[n]
            self.until(lambda a=actor: all(lease.lost for lease in a.leases), f"{n} told")
            for lease in actor.leases:
                with pytest.raises(LockNotOwnedError):
                    self.run(actor.do(lease.release))
            actor.leases.clear()
            self.model.ended(n)
            self._ended(actor, lost=True)

    # -- rules -------------------------------------------------------------------------------

    def _pick(self, who: str, eligible: Callable[[Actor], bool]) -> Actor | None:
        """The actor a rule acts on: the drawn one's index among those it can
        act on (a release picks one of the holders), so that a draw is never
        wasted; None if none can. (What is drawn does not depend on the state.)"""
        candidates = [a for a in self.actors.values() if eligible(a)]
        if not candidates:
            return None
        return candidates[ACTORS.index(who) % len(candidates)]

    def _side(self, actor: Actor, side: str) -> str:
        """An actor keeps to one side while it holds (no upgrade or downgrade here)."""
        return actor.side if actor.leases else side

    @rule(who=sampled_from(ACTORS), side=sampled_from(("read", "write")))
    @traced
    def try_acquire(self, who: str, side: str) -> None:
        actor = self.actors[who]
        if actor.waiting is not None:
            return
        side = self._side(actor, side) if self.kind.name == "rw" else self.kind.sides[0]
        expected = self.model.verdict(who, side)
        actor.invoked = time.monotonic_ns()
        h = self.handle(actor.owner, side)
        lease = self.run(actor.do(lambda: h.try_acquire()))
        if expected == "busy":
            assert lease is None, f"{who} got {side}; model: {self.model.describe()}"
            return
        assert lease is not None, (
            f"{who}: {side} refused; model says {expected}: {self.model.describe()}"
        )
        self._granted(actor, side, lease)

    def _may_wait(self) -> bool:
        if self.kind.many_waiters:
            return True
        return not self.model.waiters

    @rule(who=sampled_from(ACTORS), side=sampled_from(("read", "write")))
    @traced
    def wait_for_it(self, who: str, side: str) -> None:
        """An acquire that waits, when the model says it must: it parks."""
        actor = self.actors[who]
        side = self._side(actor, side) if self.kind.name == "rw" else self.kind.sides[0]
        if not self._may_wait() or actor.waiting is not None:
            return
        if self.model.verdict(who, side) != "busy":
            return
        before = self.waiting_count(actor.owner)
        actor.invoked = time.monotonic_ns()
        h = self.handle(actor.owner, side)
        actor.waiting = actor.do(lambda: h.acquire())
        self.model.waiters[who] = side
        self.until(lambda: self.waiting_count(actor.owner) > before, f"{who} parked")
        assert not actor.waiting.done(), f"{who} got {side}; model: {self.model.describe()}"

    @rule(who=sampled_from(ACTORS))
    @traced
    def release(self, who: str) -> None:
        # (a semaphore's holder may wait: it cannot release meanwhile)
        actor = self._pick(who, lambda a: bool(a.leases) and a.waiting is None)
        if actor is None:
            return
        who = actor.name
        lease = actor.leases.pop()
        self.run(actor.do(lease.release))
        room = self.model.released(who)
        if not actor.leases:
            self._ended(actor, lost=False)
        if room:
            self._serve_waiters()

    @rule(who=sampled_from(ACTORS), seconds=sampled_from((LEASE, 2 * LEASE)))
    @traced
    def extend(self, who: str, seconds: float) -> None:
        """A holder extends its hold: still held, nothing else changes."""
        actor = self._pick(who, lambda a: bool(a.leases) and a.waiting is None)
        if actor is None:
            return
        self.run(actor.do(lambda: actor.leases[-1].extend(seconds)))

    @rule(who=sampled_from(ACTORS))
    @traced
    def cancel_a_waiter(self, who: str) -> None:
        actor = self._pick(who, lambda a: a.waiting is not None and not a.leases)
        if actor is None:
            return
        who = actor.name
        before = self.waiting_count(actor.owner)
        actor.restart()
        self.model.left(who)
        self.until(lambda: self.waiting_count(actor.owner) < before, f"{who} stopped waiting")
        # A writer that gave up lets new readers in again; the head of a fair
        # queue that gave up passes the turn on.
        self._serve_waiters()

    @rule(who=sampled_from(ACTORS), steps=integers(0, 8), side=sampled_from(("read", "write")))
    @traced
    def cancel_in_flight(self, who: str, steps: int, side: str) -> None:
        """An acquire cancelled after ``steps`` turns of the loop, reply or not:
        it leaves no hold behind, on the server or in the Client."""
        actor = self.actors[who]
        if actor.waiting is not None or actor.leases:
            return
        side = side if self.kind.name == "rw" else self.kind.sides[0]
        h = self.handle(actor.owner, side)
        clients = self.clients_of[id(actor.owner)]
        before = [c.statistics().background for c in clients]  # (a Redlock's hold keeps one)
        actor.invoked = time.monotonic_ns()
        fut = actor.do(lambda: h.acquire())
        for _ in range(steps):
            self.loop.run_until_complete(asyncio.sleep(0))
        if fut.done():
            # It returned before the cancel came: a hold like any other.
            self._granted(actor, side, fut.result())
            return
        actor.restart()
        # An acquire granted as it was cancelled is undone in the background:
        # once the Client has nothing in flight, the server must agree.
        self.until(
            lambda: all(
                c.statistics().in_flight == 0 and c.statistics().background <= before[i]
                for i, c in enumerate(clients)
            ),
            "the cancelled acquire's commands to finish",
        )
        mismatch = self.run(self.server_disagrees())
        assert mismatch is None, f"after a cancelled acquire: {mismatch}"

    @rule(who=sampled_from(ACTORS), side=sampled_from(("read", "write")))
    @traced
    def run_out(self, who: str, side: str) -> None:
        """A hold on a short fixed lease, left to run out: reported lost, then gone."""
        actor = self.actors[who]
        if actor.waiting is not None or actor.leases or self.kind.name == "multi":
            return
        side = side if self.kind.name == "rw" else self.kind.sides[0]
        if self.model.verdict(who, side) != "acquired":
            return
        actor.invoked = time.monotonic_ns()
        h = self.handle(actor.owner, side)
        lease = self.run(actor.do(lambda: h.try_acquire(lease=FIXED)))
        assert lease is not None, f"{who}: {side} refused; model: {self.model.describe()}"
        self._granted(actor, side, lease)
        self._lost({who})
        # The Client calls a fixed lease lost when it ends by its own clock,
        # which started before the request: the key goes at most a round trip later.
        self._settle()
        self._serve_waiters()

    def _settle(self) -> None:
        async def settled() -> bool:
            return await self.server_disagrees() is None

        self.until(settled, f"the server to agree ({self.model.describe()})")

    async def server_disagrees(self) -> str | None:
        """How the server's state differs from the model's (None: it agrees):
        read by the primitive, and as the CLI describes it."""
        in_use, expected = await self.server_in_use(), self._in_use()
        if in_use != expected:
            return f"server: {in_use}; model: {self.model.describe()}"
        if self.view is None or self.kind.name == "multi":
            return None
        state = await self.view.state(self.name)
        recorded = sorted(
            (h.client_id, h.role)
            for p in state.primitives
            for h in p.holders
            for _ in range(h.permits or 1)
        )
        want = sorted(
            (self.actors[n].owner.id, _role(self.kind, self.model.side[n]))
            for n, ls in self.model.leases.items()
            for _ in range(len(ls) if self.kind.name == "semaphore" else 1)
            if ls
        )
        if recorded != want:
            return f"the CLI reads {recorded}; model: {self.model.describe()}"
        return None

    @rule()
    @traced
    def force_release(self) -> None:
        h = self.handle(self.admin, self.kind.sides[0])
        if self.kind.name == "rw":
            h = self.admin.rw_lock(self.name)
        deleted = self.run(h.force_release())
        evicted = self.model.holders()
        assert deleted == bool(evicted), f"force_release said {deleted}: {self.model.describe()}"
        self._lost(evicted)
        self.model.force_released()
        self._serve_waiters()

    @rule(thief=sampled_from(ACTORS))
    @traced
    def steal(self, thief: str) -> None:
        """An operator deletes the lock's key (a plain DEL: nobody is told) and
        ``thief`` takes the lock; the old holder's release, before or after
        its Client finds out, says not owned and leaves the thief's hold."""
        if self.kind.name not in ("lock", "spin", "fair") or self.model.waiters:
            return
        holders = self.model.holders()
        actor = self.actors[thief]
        if not holders or thief in holders or actor.waiting is not None or self.view is None:
            return
        (victim,) = holders
        if self.actors[victim].owner is actor.owner:
            return  # (a task of the holder's own Client queues behind it, locally)
        key = f"{PREFIX}:{{{self.name}}}"
        if self.view.slots is not None:
            self.run(self.view.slots.delete(key))
        else:
            self.run(self.view.nodes[0].delete(key))
        lease = self.run(actor.do(lambda: self.handle(actor.owner, "x").try_acquire()))
        assert lease is not None, f"{thief} refused a deleted lock"
        old = self.actors[victim]
        self.model.ended(victim)
        self._granted(actor, "x", lease)
        # (Not in the history: an operator's DEL breaks exclusion by design;
        # the fencing token is what protects the data then.)
        self.began.pop(victim)
        for held in reversed(old.leases[1:]):  # re-entries: released locally, or lost by now
            try:
                self.run(old.do(held.release))
            except LockNotOwnedError:
                pass
        with pytest.raises(LockNotOwnedError):
            self.run(old.do(old.leases[0].release))
        old.leases.clear()

    @rule()
    @traced
    def kill_connections(self) -> None:
        """Every normal connection cut: holds and waiters carry on, nothing is lost."""
        urls = list(self.urls)
        if self.view is not None and self.view.cluster:
            urls = [f"redis://{h}:{p}/0" for h, p in self.view.addresses]
        for url in urls:
            self.run(_kill(url))
        self._reopen_view()

    def _reopen_view(self) -> None:
        """The test's own reader lost its connection too: a new one."""
        if self.view is not None:
            self.run(self.view.aclose())
            self.view = self.run(Server.open(Target(self.urls[0], PREFIX, None, {})))

    @rule()
    @traced
    def restart_server(self) -> None:
        """A restart without persistence: every hold ends (each reported lost),
        and every later token is above every earlier one."""
        if self.fresh is None:
            return
        self.fresh.restart()
        self._reopen_view()
        evicted = self.model.holders()
        self._lost(evicted)
        self.model.restarted()
        self._serve_waiters()

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def holders_agree(self) -> None:
        try:
            self._holders_agree()
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nsteps: {'; '.join(self.trace)}") from None

    def _holders_agree(self) -> None:
        for name, actor in self.actors.items():
            held = [lease for lease in actor.leases if not lease.lost]
            assert len(held) == len(actor.leases), f"{name}: a live hold reported lost"
            assert len(actor.leases) == len(self.model.leases.get(name, ())), (
                f"{name} holds {len(actor.leases)}; model: {self.model.describe()}"
            )
        mismatch = self.run(self.server_disagrees())
        assert mismatch is None, mismatch
        waiting = {n for n, a in self.actors.items() if a.waiting is not None}
        assert waiting == set(self.model.waiters)
        for name in waiting:
            fut = self.actors[name].waiting
            assert fut is not None and not fut.done(), (
                f"{name} served; model: {self.model.describe()}"
            )

    def teardown(self) -> None:
        try:
            for actor in self.actors.values():  # waiters first: a release would serve them
                if actor.waiting is not None:
                    actor.restart()
            for actor in self.actors.values():
                for lease in reversed(actor.leases):
                    self.run(actor.do(lease.release))
                if actor.leases:
                    self._ended(actor, lost=False)
                actor.leases.clear()
            for actor in self.actors.values():
                actor.task.cancel()
            self.run(
                asyncio.gather(*(a.task for a in self.actors.values()), return_exceptions=True)
            )
            for c in self.clients:
                s = c.statistics()
                assert s.holds == 0 and s.waiting == 0, f"left in a Client: {s}"
                self.run(c.__aexit__(None, None, None))
            if self.view is not None:
                left = self.run(self.view.state(self.name))
                assert not any(p.held or p.waiters for p in left.primitives), (
                    f"left in Redis: {left}"
                )
            violations = check(self.history)
            assert not violations, violations
        finally:
            self._close()

    def _close(self) -> None:
        """Whatever happened, nothing of this example outlives its loop."""
        for actor in self.actors.values():
            actor.task.cancel()
        for c in self.clients:
            if not c.closed:
                self.loop.run_until_complete(c.aclose())
        if self.view is not None:
            self.loop.run_until_complete(self.view.aclose())
            self.view = None
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


def _role(kind: Kind, side: str) -> str:
    return {"read": "read", "write": "write", "permit": "permits"}.get(side, "exclusive")


async def _kill(url: str) -> None:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        await r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        await r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    finally:
        await r.aclose()


def machine(kind: str, urls: Sequence[str], fresh: Any = None) -> type[HoldsMachine]:
    """A machine class for ``kind`` on ``urls``."""
    return type(
        f"{kind.title()}Machine",
        (HoldsMachine,),
        {"kind": KINDS[kind], "urls": tuple(urls), "fresh": fresh},
    )


class LatchMachine(RuleBasedStateMachine):
    """The countdown latch against ``LatchModel``: set, count down, wait (parks
    while counting; every waiter passes once the count reaches zero), cancel
    a wait, cut every connection."""

    urls: Sequence[str] = ()

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.name = f"sm-{uuid.uuid4().hex[:8]}"
        self.clients = [Client.from_url(self.urls[0], prefix=PREFIX, lease=LEASE) for _ in range(2)]
        for c in self.clients:
            self.run(c.__aenter__())
        self.actors = {
            n: Actor(self.loop, n, self.clients[0 if n[0] == "a" else 1]) for n in ACTORS
        }
        self.model = LatchModel(0)
        self.trace: list[str] = []

    run = HoldsMachine.run
    until = HoldsMachine.until

    def latch(self, actor: Actor) -> Any:
        return actor.owner.latch(self.name, 0)

    def waiting_count(self, actor: Actor) -> int:
        return int(self.latch(actor).statistics().waiting)

    @rule(who=sampled_from(ACTORS), count=integers(1, 3))
    @traced
    def try_set_count(self, who: str, count: int) -> None:
        actor = self.actors[who]
        if actor.waiting is not None:
            return
        was_set = self.run(actor.do(lambda: self.latch(actor).try_set_count(count)))
        assert was_set == self.model.try_set_count(count), (
            f"set {was_set}, count {self.model.count}"
        )

    @rule(who=sampled_from(ACTORS))
    @traced
    def count_down(self, who: str) -> None:
        actor = self.actors[who]
        if actor.waiting is not None:
            return
        left = self.run(actor.do(lambda: self.latch(actor).count_down()))
        assert left == self.model.count_down(), f"count_down said {left}"
        if self.model.open:
            self._serve_waiters()

    def _serve_waiters(self) -> None:
        for n in sorted(self.model.waiters):
            actor = self.actors[n]
            fut = actor.waiting
            assert fut is not None
            self.until(fut.done, f"{n} passed the open latch")
            assert fut.result() is True
            actor.waiting = None
        self.model.waiters.clear()

    @rule(who=sampled_from(ACTORS))
    @traced
    def wait(self, who: str) -> None:
        actor = self.actors[who]
        if actor.waiting is not None:
            return
        before = self.waiting_count(actor)
        fut = actor.do(lambda: self.latch(actor).wait())
        if self.model.open:
            assert self.run(fut) is True
            return
        actor.waiting = fut
        self.model.waiters.add(who)
        self.until(lambda: self.waiting_count(actor) > before, f"{who} parked")
        assert not fut.done(), f"{who} passed a latch at {self.model.count}"

    @rule(who=sampled_from(ACTORS))
    @traced
    def cancel_a_waiter(self, who: str) -> None:
        actor = self.actors[who]
        if actor.waiting is None:
            return
        before = self.waiting_count(actor)
        actor.restart()
        self.model.waiters.discard(who)
        self.until(lambda: self.waiting_count(actor) < before, f"{who} stopped waiting")

    @rule()
    @traced
    def kill_connections(self) -> None:
        self.run(_kill(self.urls[0]))

    @invariant()
    def counts_agree(self) -> None:
        admin = next(iter(self.actors.values())).owner
        count = self.run(admin.latch(self.name, 0).count())
        assert count == self.model.count, f"server count {count}, model {self.model.count}"
        for n in self.model.waiters:
            fut = self.actors[n].waiting
            assert fut is not None and not fut.done(), f"{n} passed at count {count}"

    def teardown(self) -> None:
        try:
            for actor in self.actors.values():
                if actor.waiting is not None:
                    actor.restart()
                actor.task.cancel()
            self.run(
                asyncio.gather(*(a.task for a in self.actors.values()), return_exceptions=True)
            )
            for c in self.clients:
                s = c.statistics()
                assert s.waiting == 0, f"left in a Client: {s}"
                self.run(c.__aexit__(None, None, None))
        finally:
            self.view = None
            HoldsMachine._close(self)  # type: ignore[arg-type]


def latch_machine(url: str) -> type[LatchMachine]:
    return type("LatchMachine", (LatchMachine,), {"urls": (url,)})
