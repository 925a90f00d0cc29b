"""Redlock's fencing rule, client side: pure functions, no I/O.

How a token is chosen across the masters and written back, so that tokens
keep increasing in the order they are handed out whatever the quorum. The
masters' side (``fence_accept`` in ``scripts/_redlock_fence.lua``) decides
whether one master accepts a token; this module decides what to propose,
whether a round is decided, which token to write back, which roster to pass
and which master to seed. ``tests/test_redlock_fencing.py`` tests each
branch without a server.

The rule
--------
A token is handed out only after a majority *accepted* it. A master accepts
``T`` when

* its counter ``t`` is present and ``t < T`` (then it records ``t = T``); or
* its counter is absent and its generation is *trusted*.

(A proposal below the master's clock is refused too, and a write-back token
is at least every clock read: tokens stay above the server clocks, the floor
for a counter that expired, as with one server.)

Each master keeps a generation marker (``<prefix>:redlock:gen``: a random id,
its creation time on the server's clock, and the server's ``run_id``; no
TTL), created by the first script that runs there, and created anew by the
first script that finds a ``run_id`` other than the server's. So any new
server life (back empty, restored from an older snapshot or AOF, a replica
promoted in its place, or restarted with all its data) has a new, young
generation. Each fence counter is tagged with the generation that wrote it;
a counter of another generation counts as absent. The roster
(``<prefix>:redlock:roster``, no TTL) holds the *founding* generations: an
attempt that read no roster on *all* N masters founds it with the N
generations it read (``roster``), and every later attempt passes the roster
it knows. A generation is trusted if it is in that roster, or at least
``FENCE_RETENTION`` (24 h, the counters' retention) old on the server's
clock. A young generation not in the roster accepts no token for an absent
counter until then; once a majority accepted a token, such a master is
*seeded* with it (``seed_generation``), so that it vouches for that name
from then on. Safety over liveness: with one master down and another in a
new life, a name the latter has not been seeded with cannot be acquired.

Proof sketch. Let B hand out ``T_B`` after the majority ``V_B`` accepted it,
and let A's acceptances (its proposal or its write-back) begin after that
and succeed on the majority ``V_A``. Some master ``m`` is in both. If ``m``
is in the server life that accepted ``T_B``, its counter is at least ``T_B``
when A's token reaches it, so accepting ``T_A`` means ``T_A > T_B``. If
``m`` started a new life since, every counter it has from before is tagged
with an older generation, so absent; an absent counter is accepted only if
the generation is 24 h old (B's counter had then expired everywhere: the
clock floor remains) or founding, and a founding after B's hand-out needs
every master of ``V_B`` emptied. A counter of ``m``'s current generation was
written by an acceptance under the same rule, or by a seed of a token whose
attempt began after every attempt that reached ``m``'s previous life had
ended (``seed_generation``'s age check), so the same holds by induction.
Hence tokens increase in the order of hand-out, unless a majority of masters
lose their data within 24 h or a counter expires after 24 h unused. Mutual
exclusion itself still rests on timing, as in every lease-based lock; the
token is what makes a resource that checks it safe anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACCEPTED",
    "PROPOSAL_LEAD_US",
    "UNTRUSTED",
    "Read",
    "decided",
    "handed_out",
    "proposal",
    "roster",
    "same_server",
    "seed_generation",
    "write_back",
]

#: A proposed token runs this far ahead of the proposer's clock (in microseconds),
#: so that it is not below the masters' clocks when it arrives.
PROPOSAL_LEAD_US = 500_000
#: fence_accept's answers: accepted; refused as untrusted (a young generation
#: not in the roster, its counter absent). 0: refused, its counter is ahead.
ACCEPTED = 1
UNTRUSTED = -1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Read:
    """One master's reply to ``redlock_acquire.lua`` (see that script)."""

    #: The lock key holds the attempt's value.
    granted: bool
    #: The holder's remaining TTL in ms when not granted (-1: none), else 0.
    pttl_ms: int
    #: The fence counter of the master's current generation, None if absent.
    counter: int | None
    #: The server clock, in microseconds.
    clock_us: int
    #: The master's generation id, and its creation on the server's clock (us).
    generation: str
    created_us: int
    #: The founding generation ids the master knows (maybe none).
    roster: tuple[str, ...]
    #: The proposed token's fate: ACCEPTED, 0, or UNTRUSTED (0 too when none was offered).
    accepted: int

    @classmethod
    def parse(cls, reply: Sequence[Any]) -> Read:
        granted, pttl, counter, clock, generation, known, accepted = reply
        gen_id, created = _text(generation).split("/")[:2]
        count = _text(counter)
        return cls(
            granted=int(granted) == 1,
            pttl_ms=int(pttl),
            counter=int(count) if count else None,
            clock_us=int(_text(clock)),
            generation=gen_id,
            created_us=int(created),
            roster=tuple(_text(g) for g in known),
            accepted=int(accepted),
        )


def proposal(last: int, now_us: int, roster_known: bool) -> int:
    """The token an attempt proposes in its first round: above the last one
    handed out here for the name, ``PROPOSAL_LEAD_US`` ahead of the local
    clock; 0 (none) while no roster is known (a new deployment founds it
    first, from a round that reads every master)."""
    if not roster_known:
        return 0
    return max(last + 1, now_us + PROPOSAL_LEAD_US)


def decided(replies: Sequence[Read | BaseException | None], n: int, majority: int) -> bool:
    """Whether the first round may stop waiting for the masters still silent.

    Yes once a majority accepted the proposal (that implies a grant); or once
    a failure is certain: busy on more than a minority (held, whatever the
    rest say), or failed on more (too few can answer). A mix of both waits
    for the rest (a "busy" still to come makes it busy, not a connection
    failure). Else once a majority granted, but, until some master shows the
    roster, only with every reply in (a new deployment founds it from all N).
    """
    reads = [r for r in replies if isinstance(r, Read)]
    if sum(1 for r in reads if r.accepted == ACCEPTED) >= majority:
        return True
    granted = sum(1 for r in reads if r.granted)
    busy = len(reads) - granted
    failed = sum(1 for r in replies if r is not None) - len(reads)
    if busy > n - majority or failed > n - majority:
        return True
    rostered = any(r.roster for r in reads)
    return granted >= majority and (rostered or None not in replies)


def same_server(reads: Sequence[Read]) -> bool:
    """Two replies from one server (one generation id twice): two Clients of
    the Redlock reach the same master."""
    ids = [r.generation for r in reads]
    return len(set(ids)) < len(ids)


def roster(reads: Sequence[Read], n: int) -> tuple[str, ...]:
    """The roster to pass from now on: every founding generation the masters
    showed; if none showed one and all ``n`` answered, a new deployment:
    found it with their generations. Empty: not known yet."""
    known: set[str] = set()
    for r in reads:
        known.update(r.roster)
    if not known and len(reads) == n:
        known = {r.generation for r in reads}
    return tuple(sorted(known))


def handed_out(codes: Sequence[int | None], majority: int) -> bool:
    """A token may be handed out: a majority accepted it."""
    return sum(1 for c in codes if c == ACCEPTED) >= majority


def write_back(proposed: int, reads: Sequence[Read]) -> int:
    """The token of the write-back round (the proposal was not accepted by a
    majority): above every counter read, above the proposal where some master
    accepted it (its counter now holds it), and never below a server clock."""
    token = proposed + 1 if any(r.accepted == ACCEPTED for r in reads) else 0
    for r in reads:
        token = max(token, r.clock_us, r.counter + 1 if r.counter is not None else 0)
    return token


def seed_generation(
    read: Read | None, code: int | None, before_read_s: float, limit_s: float
) -> str | None:
    """The generation to seed a master with a token a majority accepted, or
    None: no seed.

    A master is seeded if it refused the token as untrusted (``code``
    UNTRUSTED), or gave no answer in time (``code`` None) and its counter
    was absent when ``read``; never without a read (its generation is the
    guard against a new life since). And only if the attempt began at least
    ``limit_s`` (the longest an attempt may take) after that generation was
    created: the read shows the generation's age on the server's clock, and
    the attempt began at most ``before_read_s`` before that read. Then every
    attempt that reached the master's previous life had ended before this
    one began, so the token is above each token they handed out.
    """
    if read is None or not (code == UNTRUSTED or (code is None and read.counter is None)):
        return None
    age_us = read.clock_us - read.created_us
    if age_us < (limit_s + before_read_s) * 1_000_000:
        return None
    return read.generation
