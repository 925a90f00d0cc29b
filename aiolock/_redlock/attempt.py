"""One Redlock acquisition attempt: the acquire round, and the write-back round if needed.

An **attempt** sends ``redlock_acquire.lua`` to every master at once (one
round, ``quorum``): set the lock key to a value unique to the attempt
(``<owner>|<random>``) with the lease as TTL, and read the name's fence
counter, the server clock, the master's generation and its roster. The
attempt also *proposes* a token (``fencing.proposal``), which each master
that granted the lock accepts or refuses in the same script. It succeeds when

1. a majority granted the key,
2. a majority accepted the token: the proposal in the same round (the usual
   case, one round trip), or else the token ``fencing.write_back`` chooses
   from what was read, in a second round (``redlock_fence.lua``),
3. all within the validity ``lease - elapsed - drift * lease - 2 ms``, and
   within ``ATTEMPT_LIMIT`` of the attempt's start.

A failed attempt releases its value on every master (by value, so also where
its reply was lost or late; idempotent) before it returns; an attempt
cancelled anywhere is undone the same way by its caller, in the background.
Once a majority accepted a token, the masters that refused it as untrusted
are seeded with it (``fencing.seed_generation``), whenever their reply comes.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from typing import Any, Protocol

from .._core.engine import FENCE_RETENTION
from .._core.errors import InvalidArgumentError
from .._core.validate import to_ms
from . import fencing
from .calls import Master, backoff, quorum, too_few, transient
from .fencing import Read

__all__ = ["ATTEMPT_LIMIT", "MASTER_TIMEOUT", "Attempting", "attempt", "seed_args"]

#: The longest an attempt waits for one master's reply (a paused master).
MASTER_TIMEOUT = 1.0
#: An attempt hands out its token only this soon after it started (and within
#: its validity): its rounds take at most MASTER_TIMEOUT each. A master in a
#: new life is seeded only by an attempt that began this long after the new
#: life did: every attempt that reached its previous life has ended by then.
ATTEMPT_LIMIT = 4 * MASTER_TIMEOUT
RETENTION_US = int(FENCE_RETENTION * 1_000_000)

#: (token, validity end on the loop's clock), or None with how long to wait at most.
Outcome = tuple[tuple[int, float] | None, float | None]


class Attempting(Protocol):
    """What an attempt needs of the quorum engine (``QuorumEngine``, structurally)."""

    masters: list[Master]
    majority: int
    roster: tuple[str, ...]

    def validity(self, lease: float) -> float: ...

    def last_token(self, name: str) -> int: ...

    def accepted(self, name: str, token: int) -> None: ...

    async def settle(self) -> None: ...

    async def undo_and_wait(self, name: str, value: str, replies: Sequence[Any]) -> None: ...

    def seed(
        self, name: str, token: int, i: int, reply: Any, code: int | None, start: float
    ) -> None: ...


async def attempt(
    q: Attempting, name: str, value: str, lease_s: float, loop: asyncio.AbstractEventLoop
) -> Outcome:
    """One attempt with ``value`` (unique to it): ((token, validity end),
    None), or (None, how long to wait at most before the next).

    On failure everything it took is released before it returns; if it is
    cancelled or raises, the caller undoes ``value``."""
    await q.settle()
    start = loop.time()
    validity = q.validity(lease_s)
    ms = to_ms(lease_s)
    masters = q.masters
    n, majority = len(masters), q.majority
    per_call = min(validity / 2, MASTER_TIMEOUT)
    known = q.roster
    proposed = fencing.proposal(q.last_token(name), time.time_ns() // 1000, bool(known))
    common = (proposed, to_ms(FENCE_RETENTION), RETENTION_US, *known)
    handed: list[int] = []  # the token, once handed out
    # Reads that came after the first round decided but before a hand-out (in
    # the write-back round, or before the attempt resumed): handled at the
    # hand-out, if there is one, as if they had come after it.
    early: list[tuple[int, Any]] = []

    def late(i: int, reply: Any) -> None:
        # A read that came after the attempt decided: seed its master if it
        # refused or could not vouch; not if it accepted the proposal handed out.
        if not handed:
            early.append((i, reply))
            return
        accepted_it = isinstance(reply, list) and int(reply[6]) == fencing.ACCEPTED
        if not (accepted_it and handed[0] == proposed):
            q.seed(name, handed[0], i, reply, None, start)

    def hand_out(token: int, codes: Sequence[int | None]) -> Outcome:
        handed.append(token)
        _hand_out(q, name, token, replies, codes, start)
        for i, reply in early:
            late(i, reply)
        early.clear()
        return (token, start + validity), None

    # A random generation id of its own, used if the master has none yet.
    calls = [
        m.script(
            "redlock_acquire", m.keys(name).acquire, (value, ms, secrets.token_hex(8), *common)
        )
        for m in masters
    ]
    parsed: dict[int, Read] = {}  # each reply parsed once

    def read(i: int, reply: Any) -> Read | BaseException | None:
        if not isinstance(reply, list):
            return reply  # type: ignore[no-any-return]
        if i not in parsed:
            parsed[i] = Read.parse(reply)
        return parsed[i]

    def decided(rs: list[Any]) -> bool:
        return fencing.decided([read(i, r) for i, r in enumerate(rs)], n, majority)

    replies = await quorum(calls, per_call, decided, late)
    for r in replies:
        if isinstance(r, BaseException) and not transient(r):
            await q.undo_and_wait(name, value, replies)
            raise r
    reads = [r for r in (read(i, x) for i, x in enumerate(replies)) if isinstance(r, Read)]
    if fencing.same_server(reads):
        await q.undo_and_wait(name, value, replies)
        raise InvalidArgumentError(
            "two Clients of this Redlock reach the same server: Redlock needs one "
            "Client per independent master"
        )
    if sum(1 for r in reads if r.granted) < majority:
        await q.undo_and_wait(name, value, replies)
        if len(reads) < majority:
            raise too_few(f"Redlock {name!r}", replies, majority)
        busy = [r.pttl_ms for r in reads if not r.granted]
        ttls = [t for t in busy if t > 0]
        hint = min(ttls) / 1000.0 if ttls else (lease_s if busy else backoff(lease_s))
        return None, hint
    founders = fencing.roster(reads, n)
    if founders:
        q.roster = founders
    codes = [int(r[6]) if isinstance(r, list) else None for r in replies]
    too_late = start + min(validity, ATTEMPT_LIMIT)
    if fencing.handed_out(codes, majority):
        if loop.time() >= too_late:
            await q.undo_and_wait(name, value, replies)
            return None, backoff(lease_s)
        return hand_out(proposed, codes)
    # The write-back round.
    token = fencing.write_back(proposed, reads)
    fence = [
        m.script(
            "redlock_fence",
            m.keys(name).write_back,
            (token, to_ms(FENCE_RETENTION), RETENTION_US, secrets.token_hex(8), "", 0, *founders),
        )
        for m in masters
    ]

    def ack(reply: Any) -> int | None:
        return int(reply[0]) if isinstance(reply, list) else None

    left = start + validity - loop.time()
    acks = await quorum(
        fence,
        max(min(left, MASTER_TIMEOUT), 0.0),
        lambda rs: fencing.handed_out([ack(a) for a in rs], majority),
    )
    codes = [ack(a) for a in acks]
    if fencing.handed_out(codes, majority) and loop.time() < too_late:
        return hand_out(token, codes)
    await q.undo_and_wait(name, value, replies)
    return None, backoff(lease_s)


def _hand_out(
    q: Attempting,
    name: str,
    token: int,
    replies: Sequence[Any],
    codes: Sequence[int | None],
    start: float,
) -> None:
    """A majority accepted ``token``: remember it as the name's last, and seed
    it, in the background, on the masters that refused it as untrusted."""
    q.accepted(name, token)
    for i, (reply, code) in enumerate(zip(replies, codes, strict=True)):
        q.seed(name, token, i, reply, code, start)


def seed_args(token: int, generation: str) -> tuple[Any, ...]:
    """ARGV of ``redlock_fence.lua`` for a seed: written only if the master's
    generation is still ``generation`` and at least ``ATTEMPT_LIMIT`` old."""
    return (
        token,
        to_ms(FENCE_RETENTION),
        RETENTION_US,
        secrets.token_hex(8),
        generation,
        int(ATTEMPT_LIMIT * 1_000_000),
    )
