"""``client.adopt(handle)``: take over a hold another Client gave out with ``lease.handle``.

The contract (see also _core/holds/handoff.py, the README's "Handing a hold over"):

* **What moves:** the whole hold, by one atomic script per kind
  (``adopt.lua``: lock, spin lock, fair lock; ``rw_adopt.lua``: write
  lock; ``sem_adopt.lua``: a semaphore permit). Same name, same fencing
  token; the holder in Redis becomes the adopting task's owner id, as for a
  fresh acquire by that task. A re-entrant hold moves whole: the giver's
  re-entries all end (their leases report ``released``), and the adopter
  gets one Lease (release it once).
* **Renewal:** a hold the watchdog renewed is renewed by the adopting
  Client's watchdog (the script makes it last at least that Client's lease);
  a fixed lease keeps its expiry and is not renewed.
* **The giver** stops renewing it and its leases report ``released`` (not
  lost) as soon as its Client learns: at its next renewal round, release,
  extend or check, whichever comes first.
* **Once:** a handle is adopted once. A handle whose hold expired, was
  released, force-released or adopted already: LockNotOwnedError, nothing
  changed. A malformed handle: InvalidArgumentError (a ValueError), a
  non-str one InvalidArgumentTypeError, before any round trip; so is a
  handle of another key prefix, or one made by this very Client (pass the
  Lease itself: it releases from any task), or, for a lock or write lock,
  a handle adopted while a task of this Client holds or waits for it.
* **Cancellation:** cancelled before the script ran: nothing changed (the
  giver keeps it). Cancelled after it ran, its reply unread: the hold is
  given back to the giver (``mode "back"``) if the giver's Client has not
  learned of the handoff yet, else released; either way exactly one owner,
  or none, never two.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._core.errors import InvalidArgumentError, LockNotOwnedError
from .._core.holds.handoff import Handle, decode, handed_key
from .._core.holds.lease import Hold, Lease
from .._core.owner import task_serial
from .._core.validate import to_ms
from .fair import _MODES, FairLock
from .lock import AsyncLock, new_queue
from .rwlock import ReadWriteLock
from .semaphore import Permit, Semaphore, new_state
from .spin import SpinLock

if TYPE_CHECKING:
    from .._core.holds.undo import Call
    from .._core.view import EngineView

__all__ = ["adopt"]

#: How long a handed record outlives the hold's expiry (ms): the giver's
#: Client reads it at its next renewal round, which comes well before.
HANDED_MS = 120_000


async def adopt(engine: EngineView, handle: object) -> Lease:
    """``client.adopt(handle)`` (see the module doc)."""
    h = decode(handle)
    if h.prefix != engine.prefix:
        raise InvalidArgumentError(
            f"the handle of {h.kind} {h.name!r} was made by a Client with key prefix "
            f"{h.prefix!r}, not {engine.prefix!r}: adopt it with a Client of the same prefix"
        )
    if h.client == engine.id:
        raise InvalidArgumentError(
            f"{h.kind} {h.name!r}: this Client made the handle; pass the Lease itself "
            "(lease.release() works from any task)"
        )
    if h.kind in ("lock", "spin_lock"):
        lock = AsyncLock(engine, h.name) if h.kind == "lock" else SpinLock(engine, h.name)
        return await _adopt_lock(engine, lock, h)
    if h.kind == "fair_lock":
        return await _adopt_fair(engine, FairLock(engine, h.name), h)
    if h.kind == "write_lock":
        return await _adopt_write(engine, ReadWriteLock(engine, h.name), h)
    return await _adopt_permit(engine, Semaphore(engine, h.name, h.default_n), h)


def _calls(
    script: str, keys: tuple[Any, ...], h: Handle, to: str, lease_ms: int, release: Call
) -> tuple[tuple[Any, ...], Call, Call]:
    """The adopt call's args, its give-back, and the release that follows it
    (a no-op once given back) for an adopt whose reply was lost."""
    args = (h.holder, h.entry_token, to, lease_ms, HANDED_MS, "adopt")
    back = (script, keys, (h.holder, h.entry_token, to, 0, 0, "back"))
    return args, back, release


def _replied(reply: Any, calls: tuple[Call, ...]) -> tuple[Call, ...]:
    """The undo of an adopt whose reply came after its caller gave up."""
    return calls if reply and int(reply[0]) == 1 else ()


async def _run(
    engine: EngineView,
    script: str,
    keys: tuple[Any, ...],
    args: tuple[Any, ...],
    undo_calls: tuple[Call, ...],
    h: Handle,
) -> tuple[float, float, int]:
    """Run the adopt script: (its send time, seconds left of the hold, the
    connection epoch that confirmed it or -1); LockNotOwnedError if stale."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    epoch = engine.epoch
    reply = await engine.eval(script, keys, args, engine.undo(undo_calls, _replied))
    if int(reply[0]) != 1:
        raise LockNotOwnedError(
            f"{h.kind.replace('_', ' ')} {h.name!r}: the handle's hold (fencing token "
            f"{h.token}) is gone: it expired, was released or force-released, or was "
            "adopted already"
        )
    left = int(reply[1])
    confirmed = epoch if engine.epoch == epoch else -1
    return sent, (left / 1000.0 if left > 0 else h.lease), confirmed


def _adopted_already(h: Handle) -> LockNotOwnedError:
    return LockNotOwnedError(
        f"{h.kind.replace('_', ' ')} {h.name!r}: this Client adopted the handle's hold "
        f"(fencing token {h.token}) already"
    )


def _lease_of(engine: EngineView, h: Handle, left: float) -> tuple[float | None, float]:
    """``(lease, lease_s)`` for ``new_hold``: renewed as the Client's, or the fixed rest."""
    if h.watchdog:
        return None, engine.lease
    return h.lease, left


async def _adopt_lock(engine: EngineView, lock: AsyncLock, h: Handle) -> Lease:
    task = engine.enter_task()
    key = lock._key
    state = engine.peek_state(key)
    if state is not None and state.hold is not None and state.hold.token == h.token:
        raise _adopted_already(h)
    if state is not None and (state.busy or state.hold is not None):
        raise InvalidArgumentError(
            f"lock {h.name!r}: a task of this Client holds or waits for it; adopt it with "
            "a Client that does not use it meanwhile"
        )
    if state is None:
        state = engine.state(key, new_queue, lock)
    elif state.lock is None:
        state.lock = lock
    state.busy = True
    try:
        owner = engine.owner(task)
        names = lock._names
        keys = (key, handed_key(engine.prefix, h.name))
        release: Call = (
            "release",
            names.free,
            (owner, h.entry_token, lock._channel, names.wait_prefix, engine.retention_ms),
        )
        lease_ms = engine.lease_ms if h.watchdog else 0
        args, back, release = _calls("adopt", keys, h, owner, lease_ms, release)
        sent, left, confirmed = await _run(engine, "adopt", keys, args, (back, release), h)
    except BaseException:
        state.pass_turn()
        raise
    lease, lease_s = _lease_of(engine, h, left)
    hold = lock._install(state, task, owner, h.entry_token, lease, lease_s, sent, confirmed)
    # The lease's token, as the giver's (a hold passed on locally keeps its
    # entry's token in Redis, and its own was reserved by that entry).
    hold.token = h.token
    hold.reserve = 0  # no fencing token reserved for local handoffs: the next goes to Redis
    return hold.new_lease()


async def _adopt_fair(engine: EngineView, lock: FairLock, h: Handle) -> Lease:
    task = engine.enter_task()
    state = lock._state()
    lease_ms = engine.lease_ms if h.watchdog else 0
    # A waiter id like a fresh acquire's (fair.py): this Client, this task, a new attempt.
    own_ms = engine.lease_ms if h.watchdog else to_ms(h.lease)
    wid = (
        f"{engine.id}:{task_serial(task)}:{engine.attempt_id()}:{own_ms}:{engine.lease_ms}:"
        f"{_MODES[engine.notify]}"
    )
    names = lock._names
    keys = (lock._key, handed_key(engine.prefix, h.name))
    release: Call = (
        "fair_release",
        names.all,
        (wid, h.token, engine.retention_ms, *names.templates),
    )
    args, back, release = _calls("adopt", keys, h, wid, lease_ms, release)
    sent, left, _ = await _run(engine, "adopt", keys, args, (back, release), h)
    lease, lease_s = _lease_of(engine, h, left)
    hold = lock._install(state, task, wid, h.token, lease, lease_s, sent)
    return hold.new_lease()


async def _adopt_write(engine: EngineView, rw: ReadWriteLock, h: Handle) -> Lease:
    task = engine.enter_task()
    state = rw._local()
    if state is not None and state.hold is not None and state.hold.token == h.token:
        raise _adopted_already(h)
    if state is not None and (state.busy or state.hold is not None or task in state.reads):
        raise InvalidArgumentError(
            f"write lock {h.name!r}: a task of this Client holds or waits for it; adopt it "
            "with a Client that does not use it meanwhile"
        )
    state = rw._local_or_new()
    state.busy = True
    try:
        owner = engine.owner(task)
        names = rw._names
        keys = (rw._key, handed_key(engine.prefix, h.name))
        release: Call = (
            "rw_release_write",
            names.release_write,
            (owner, h.token, rw._channel, names.wchannel, ""),
        )
        lease_ms = engine.lease_ms if h.watchdog else 0
        args, back, release = _calls("rw_adopt", keys, h, owner, lease_ms, release)
        sent, left, confirmed = await _run(engine, "rw_adopt", keys, args, (back, release), h)
    except BaseException:
        state.pass_turn()
        raise
    lease, lease_s = _lease_of(engine, h, left)
    hold = state.hold = engine.new_hold(
        rw.name,
        owner,
        h.token,
        task,
        lease,
        lease_s,
        sent,
        release=release,
        renew=("rw_renew", rw._key, ("w", owner, h.token)),
        on_detach=state.hold_ended,
        confirmed=confirmed,
        kind="write_lock",
    )
    return hold.new_lease()


async def _adopt_permit(engine: EngineView, sem: Semaphore, h: Handle) -> Lease:
    task = engine.enter_task()
    owner = engine.owner(task)
    member = f"{h.permits}|{owner}:{engine.attempt_id()}"
    names = sem._names
    keys = (names.holders, handed_key(engine.prefix, h.name))
    release: Call = (
        "sem_release",
        names.release,
        (member, sem.permits, engine.retention_ms, sem._channel),
    )
    lease_ms = engine.lease_ms if h.watchdog else 0
    args, back, release = _calls("sem_adopt", keys, h, member, lease_ms, release)
    state = engine.state(names.local, new_state, sem)
    state.active += 1
    try:
        sent, left, confirmed = await _run(engine, "sem_adopt", keys, args, (back, release), h)
    finally:
        state.active -= 1
        if not state.held:
            state.drop_if_idle()
    lease, lease_s = _lease_of(engine, h, left)
    hold: Hold = engine.new_hold(
        sem.name,
        owner,
        h.token,
        task,
        lease,
        lease_s,
        sent,
        release=release,
        renew=("sem_renew", names.holders, (member,)),
        on_detach=state.hold_ended,
        confirmed=confirmed,
        kind=sem.kind,
    )
    permit = Permit(hold, h.permits)
    hold.leases.append(permit)
    state.held[hold] = None
    return permit
