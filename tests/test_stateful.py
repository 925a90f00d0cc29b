"""Stateful property tests: the plain lock against its model, on a real server.

Hypothesis picks sequences of operations by four actors (two tasks in each
of two Clients) on one lock: a try that will not wait, an acquire that
waits (one waiter at a time, so that a sequence replays to the same
state), a release, cancelling a waiting acquire, and a force release by a
third Client. After every step the lock, the server and the model must
agree: who holds (each actor's live leases), whether the key exists, the
fencing tokens (above every earlier one; a re-entry keeps its hold's), who
waits; a waiter is served once the lock is free; an evicted holder is told
(its leases are lost). At the end every actor lets go, the Clients close,
nothing is left in Redis, and the history checker (aiolock/_history.py)
proves mutual exclusion and token order over every hold.

Hypothesis runs rules synchronously: each rule drives a private event loop
until the event it waits for (a reply, a park, a grant), never for a time.
The in-suite run is small and seeded (reproducible in CI); a deeper one:

    AIOLOCK_STATEFUL_EXAMPLES=500 AIOLOCK_STATEFUL_STEPS=50 \
        python -m pytest -n 0 --timeout 3600 tests/test_stateful.py
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from hypothesis.strategies import sampled_from  # noqa: E402

from aiolock import Client, Lease, LockNotOwnedError  # noqa: E402
from aiolock._history import Op, check  # noqa: E402
from tests.core_util import eventually  # noqa: E402
from tests.model import LockModel  # noqa: E402

T = TypeVar("T")

ACTORS = ("a0", "a1", "b0", "b1")
#: The longest one event may take on a loaded machine (a reply, a wake-up):
#: only a bound for a step that never comes, never waited out otherwise.
EVENT = 10.0
#: The actors' Client lease (renewed by the watchdog every LEASE / 3).
LEASE = 3.0
EXAMPLES = int(os.environ.get("AIOLOCK_STATEFUL_EXAMPLES", "12"))
STEPS = int(os.environ.get("AIOLOCK_STATEFUL_STEPS", "25"))


class Actor:
    """One task that runs commands one at a time: its holds are its own (reentrancy is per task)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, client: Client) -> None:
        self.loop, self.name, self.client = loop, name, client
        self.leases: list[Lease] = []
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
        """Cancel whatever the task is doing (a waiting acquire) and start a fresh task."""
        self.task.cancel()
        self.loop.run_until_complete(asyncio.gather(self.task, return_exceptions=True))
        self.waiting = None
        self._start()


class LockMachine(RuleBasedStateMachine):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.name = f"sm-{uuid.uuid4().hex[:8]}"
        self.prefix = "sm"
        # A short Client lease: a hold evicted before its Client's eviction
        # channel is confirmed (its first hold) is found by the watchdog,
        # within LEASE / 3 (README "Force release"); otherwise at once.
        self.clients = [
            Client.from_url(url, prefix=self.prefix, lease=LEASE),
            Client.from_url(url, prefix=self.prefix, lease=LEASE),
        ]
        self.admin = Client.from_url(url, prefix=self.prefix)
        for c in [*self.clients, self.admin]:
            self.run(c.__aenter__())
        self.actors = {
            name: Actor(self.loop, name, self.clients[0 if name[0] == "a" else 1])
            for name in ACTORS
        }
        self.model = LockModel()
        self.history: list[Op] = []
        self.acquired_at: dict[str, int] = {}
        self.invoked_at: dict[str, int] = {}

    # -- driving the loop ------------------------------------------------------------------

    def run(self, aw: Awaitable[T], what: str = "a reply") -> T:
        async def bounded() -> T:
            try:
                async with asyncio.timeout(EVENT):
                    return await aw
            except TimeoutError:
                raise AssertionError(f"no {what} within {EVENT} s") from None

        return self.loop.run_until_complete(bounded())

    def until(self, predicate: Callable[[], bool], what: str) -> None:
        self.loop.run_until_complete(eventually(predicate, timeout=EVENT, what=what))

    def lock_of(self, actor: Actor) -> Any:
        return actor.client.lock(self.name)

    def holds(self, actor: Actor) -> bool:
        return any(not lease.lost for lease in actor.leases)

    # -- what the model sees ---------------------------------------------------------------

    def _granted(self, actor: Actor, lease: Lease) -> None:
        if self.model.holder == actor.name:
            self.model.reentered(actor.name, lease.fencing_token)
        else:
            self.model.granted(actor.name, lease.fencing_token)
            self.acquired_at[actor.name] = time.monotonic_ns()
            self.invoked_at[actor.name] = actor.invoked
        actor.leases.append(lease)

    def _let_go(self, actor: Actor, *, lost: int | None = None) -> None:
        """``actor``'s hold ended (released or lost): into the history."""
        self.history.append(
            Op(
                self.name,
                self.model.token if lost is None else self._last_token(actor),
                self.invoked_at.pop(actor.name),
                self.acquired_at.pop(actor.name),
                time.monotonic_ns(),
                lost=lost,
                confirmed_gone=lost is not None,
                who=actor.name,
            )
        )

    def _last_token(self, actor: Actor) -> int:
        return actor.leases[-1].fencing_token

    def _serve_waiters(self) -> None:
        """The lock is free: if anyone waits, one of them gets it, and only one."""
        candidates = self.model.may_be_granted()
        if not candidates:
            return
        waiting = {n: self.actors[n].waiting for n in candidates}
        self.until(
            lambda: any(f is not None and f.done() for f in waiting.values()),
            "a waiter served after the lock was freed",
        )
        done = [n for n, f in waiting.items() if f is not None and f.done()]
        assert len(done) == 1, f"two waiters served at once: {done}"
        actor = self.actors[done[0]]
        fut, actor.waiting = waiting[done[0]], None
        assert fut is not None
        self._granted(actor, fut.result())

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: any(a.waiting is None for a in self.actors.values()))
    @rule(who=sampled_from(ACTORS))
    def try_acquire(self, who: str) -> None:
        actor = self.actors[who]
        if actor.waiting is not None:
            return
        expected = self.model.try_acquire(who)
        actor.invoked = time.monotonic_ns()
        lease = self.run(actor.do(lambda: self.lock_of(actor).try_acquire()))
        if expected == "busy":
            assert lease is None, f"{who} got a lock the model says {self.model.holder} holds"
            return
        assert lease is not None, f"{who}: try_acquire on a lock the model says is {expected}"
        self._granted(actor, lease)

    # One waiter at a time: which of two waiters a release serves is the
    # server's choice, and Hypothesis must replay a sequence to the same state.
    @precondition(lambda self: self.model.holder is not None and not self.model.waiters)
    @rule(who=sampled_from(ACTORS))
    def wait_for_it(self, who: str) -> None:
        """An acquire that waits: it parks (the lock is held by another actor)."""
        actor = self.actors[who]
        if actor.waiting is not None or self.model.holder == who:
            return
        client = actor.client
        before = client.statistics().waiting
        actor.invoked = time.monotonic_ns()
        actor.waiting = actor.do(lambda: self.lock_of(actor).acquire())
        self.model.waiters.add(who)
        self.until(lambda: client.statistics().waiting > before, f"{who} parked")
        assert not actor.waiting.done(), f"{who} acquired a lock held by {self.model.holder}"

    @precondition(lambda self: self.model.holder is not None)
    @rule()
    def release(self) -> None:
        holder = self.model.holder
        assert holder is not None
        actor = self.actors[holder]
        lease = actor.leases.pop()
        self.run(actor.do(lease.release))
        actor.leases.append(lease)  # (for _let_go's token)
        freed = self.model.released(holder)
        actor.leases.pop()
        if freed:
            self.history.append(
                Op(
                    self.name,
                    lease.fencing_token,
                    self.invoked_at.pop(holder),
                    self.acquired_at.pop(holder),
                    time.monotonic_ns(),
                    who=holder,
                )
            )
            assert not actor.leases
            self._serve_waiters()

    @precondition(lambda self: bool(self.model.waiters))
    @rule(who=sampled_from(ACTORS))
    def cancel_a_waiter(self, who: str) -> None:
        actor = self.actors[who]
        if actor.waiting is None:
            return
        client = actor.client
        before = client.statistics().waiting
        actor.restart()
        self.model.waiters.discard(who)
        self.until(lambda: client.statistics().waiting < before, f"{who} stopped waiting")

    @rule()
    def force_release(self) -> None:
        deleted = self.run(self.admin.lock(self.name).force_release())
        evicted = self.model.force_released()
        assert deleted == (evicted is not None), f"force_release said {deleted}, held by {evicted}"
        if evicted is None:
            return
        actor = self.actors[evicted]
        self.until(lambda: all(lease.lost for lease in actor.leases), f"{evicted} told")
        token = actor.leases[-1].fencing_token
        for lease in actor.leases:
            with pytest.raises(LockNotOwnedError):
                self.run(actor.do(lease.release))
        actor.leases.clear()
        self.history.append(
            Op(
                self.name,
                token,
                self.invoked_at.pop(evicted),
                self.acquired_at.pop(evicted),
                time.monotonic_ns(),
                lost=time.monotonic_ns(),
                confirmed_gone=True,
                who=evicted,
            )
        )
        self._serve_waiters()

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def holders_agree(self) -> None:
        for name, actor in self.actors.items():
            assert self.holds(actor) == (self.model.holder == name), (
                f"{name} holds: {self.holds(actor)}, model: {self.model.holder}"
            )
            if self.model.holder == name:
                assert len(actor.leases) == self.model.count
        locked = self.run(self.admin.lock(self.name).is_locked())
        assert locked == (self.model.holder is not None), f"server locked: {locked}"
        waiting = {n for n, a in self.actors.items() if a.waiting is not None}
        assert waiting == self.model.waiters
        for name in waiting:
            fut = self.actors[name].waiting
            assert fut is not None and not fut.done(), f"{name} served while the lock was held"

    def teardown(self) -> None:
        try:
            for actor in self.actors.values():
                if actor.waiting is not None:
                    actor.restart()
                for lease in reversed(actor.leases):
                    self.run(actor.do(lease.release))
                actor.leases.clear()
            for actor in self.actors.values():
                actor.task.cancel()
            self.run(
                asyncio.gather(*(a.task for a in self.actors.values()), return_exceptions=True)
            )
            for c in [*self.clients, self.admin]:
                self.run(c.__aexit__(None, None, None))
            violations = check(self.history)
            assert not violations, violations
        finally:
            self.loop.close()


@pytest.mark.parametrize("server", ["redis"], indirect=True)
def test_the_lock_agrees_with_its_model(url: str, server: Any) -> None:
    run_state_machine_as_test(
        lambda: LockMachine(url),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=True,  # a fixed seed: a CI run is reproducible
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
