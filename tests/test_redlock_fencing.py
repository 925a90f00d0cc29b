"""Redlock's fencing rule, client side (aiolock/_redlock/fencing.py): no server.

Each branch of the rule: the quorum agrees on the proposal; a minority is
ahead; a server is behind; ties; restarts (a master in a new life, the
roster founded, seeds); and when the first round may stop waiting.
"""

from __future__ import annotations

from typing import Any

import pytest

from aiolock._redlock import fencing
from aiolock._redlock.fencing import ACCEPTED, PROPOSAL_LEAD_US, UNTRUSTED, Read

NOW = 1_800_000_000_000_000  # a server clock, in microseconds
DAY_US = 86_400 * 1_000_000


def read(
    *,
    granted: bool = True,
    counter: int | None = None,
    clock: int = NOW,
    gen: str = "g1",
    created: int = NOW - DAY_US,
    roster: tuple[str, ...] = ("g1", "g2", "g3"),
    accepted: int = 0,
    pttl: int = 0,
) -> Read:
    return Read(granted, pttl, counter, clock, gen, created, roster, accepted)


def reply(
    *,
    granted: int = 1,
    counter: str = "",
    clock: int = NOW,
    gen: str = "g1",
    created: int = NOW - DAY_US,
    roster: tuple[bytes, ...] = (b"g1",),
    accepted: int = 0,
) -> list[Any]:
    """A reply of redlock_acquire.lua, as redis-py hands it over (bytes)."""
    return [
        granted,
        0,
        counter.encode(),
        str(clock).encode(),
        f"{gen}/{created}/0123abcd".encode(),
        list(roster),
        accepted,
    ]


# -- parsing -------------------------------------------------------------------------------


def test_a_reply_is_parsed() -> None:
    r = Read.parse(reply(counter="42", accepted=UNTRUSTED, roster=(b"g1", b"g2")))
    assert r == read(counter=42, accepted=UNTRUSTED, roster=("g1", "g2"))
    assert Read.parse(reply(counter="")).counter is None  # absent in this generation


# -- the proposal --------------------------------------------------------------------------


def test_no_proposal_before_the_roster_is_known() -> None:
    """A new deployment proposes nothing: it founds the roster from a round first."""
    assert fencing.proposal(last=10, now_us=NOW, roster_known=False) == 0


def test_the_proposal_runs_ahead_of_the_clock() -> None:
    assert fencing.proposal(last=0, now_us=NOW, roster_known=True) == NOW + PROPOSAL_LEAD_US


def test_the_proposal_is_above_the_last_token_handed_out_here() -> None:
    """A clock that went back never proposes a token at or below the last one."""
    last = NOW + 10 * PROPOSAL_LEAD_US
    assert fencing.proposal(last=last, now_us=NOW, roster_known=True) == last + 1


# -- the quorum agrees: the proposal handed out in one round ---------------------------------


def test_a_majority_accepting_hands_the_proposal_out() -> None:
    assert fencing.handed_out([ACCEPTED, ACCEPTED, 0], majority=2)
    assert fencing.handed_out([ACCEPTED, None, ACCEPTED], majority=2)


def test_a_minority_accepting_does_not() -> None:
    assert not fencing.handed_out([ACCEPTED, 0, None], majority=2)
    assert not fencing.handed_out([ACCEPTED, UNTRUSTED, 0], majority=2)
    assert not fencing.handed_out([], majority=2)


# -- the write-back token ------------------------------------------------------------------


def test_a_minority_ahead_sets_the_token() -> None:
    """One master's counter far ahead (it accepted a token the others never
    saw): the write-back goes above it, whatever the majority read."""
    ahead = NOW + 10**12
    reads = [read(counter=5), read(counter=ahead, gen="g2"), read(counter=7, gen="g3")]
    assert fencing.write_back(0, reads) == ahead + 1


def test_a_server_behind_does_not_pull_the_token_down() -> None:
    """A master whose counter is behind (missed the last write-back) changes nothing."""
    high = NOW + 5 * PROPOSAL_LEAD_US
    reads = [read(counter=high), read(counter=high, gen="g2"), read(counter=3, gen="g3")]
    assert fencing.write_back(0, reads) == high + 1


def test_an_absent_counter_gives_the_clock_floor() -> None:
    """Counters absent (expired, or never written): the token is the largest clock read."""
    reads = [read(clock=NOW), read(clock=NOW + 7, gen="g2"), read(clock=NOW - 3, gen="g3")]
    assert fencing.write_back(0, reads) == NOW + 7


def test_ties_counter_and_clock() -> None:
    """A counter one below the clock ties with it: the token is the clock (it
    is above the counter); equal counters give their successor."""
    assert fencing.write_back(0, [read(counter=NOW - 1, clock=NOW)]) == NOW
    equal = [read(counter=NOW + 9), read(counter=NOW + 9, gen="g2")]
    assert fencing.write_back(0, equal) == NOW + 10


def test_a_proposal_accepted_by_a_minority_is_written_back_above() -> None:
    """Where a master accepted the proposal its counter holds it now (the read
    came before): the write-back token must be above it."""
    proposed = NOW + 10**9
    reads = [read(accepted=ACCEPTED, counter=NOW), read(accepted=0, counter=NOW, gen="g2")]
    assert fencing.write_back(proposed, reads) == proposed + 1
    # Not accepted anywhere: the proposal does not count.
    refused = [read(accepted=0, counter=NOW), read(accepted=UNTRUSTED, gen="g2")]
    assert fencing.write_back(proposed, refused) == NOW + 1


# -- restarts: the roster, a master in a new life, seeds ----------------------------------------


def test_the_roster_is_the_union_of_what_the_masters_show() -> None:
    reads = [read(roster=("g1", "g2")), read(gen="g2", roster=()), read(gen="g3", roster=("g3",))]
    assert fencing.roster(reads, n=3) == ("g1", "g2", "g3")


def test_a_new_deployment_founds_the_roster_only_from_every_master() -> None:
    fresh = [read(gen="a", roster=()), read(gen="b", roster=()), read(gen="c", roster=())]
    assert fencing.roster(fresh, n=3) == ("a", "b", "c")
    # Two of three read: a master unheard of may hold the roster (not founded).
    assert fencing.roster(fresh[:2], n=3) == ()


def test_two_clients_on_one_server_are_found() -> None:
    assert fencing.same_server([read(gen="a"), read(gen="a"), read(gen="c")])
    assert not fencing.same_server([read(gen="a"), read(gen="b"), read(gen="c")])


LIMIT = 4.0  # ATTEMPT_LIMIT


def test_a_master_that_refused_as_untrusted_is_seeded_once_its_life_is_old_enough() -> None:
    old = read(gen="new", created=NOW - 5_000_000, accepted=UNTRUSTED)
    assert fencing.seed_generation(old, UNTRUSTED, before_read_s=0.1, limit_s=LIMIT) == "new"


def test_a_young_life_is_not_seeded() -> None:
    """A generation younger than ATTEMPT_LIMIT (plus the attempt's time before
    the read) may have overlapped an attempt that reached its previous life."""
    young = read(gen="new", created=NOW - 3_000_000)
    assert fencing.seed_generation(young, UNTRUSTED, before_read_s=0.0, limit_s=LIMIT) is None
    # Old enough at the read, but not at the attempt's start.
    edge = read(gen="new", created=NOW - int(4.5 * 1_000_000))
    assert fencing.seed_generation(edge, UNTRUSTED, before_read_s=0.0, limit_s=LIMIT) == "new"
    assert fencing.seed_generation(edge, UNTRUSTED, before_read_s=1.0, limit_s=LIMIT) is None


def test_a_silent_master_is_seeded_only_if_its_counter_was_absent() -> None:
    absent = read(gen="g3", counter=None)
    present = read(gen="g3", counter=NOW)
    assert fencing.seed_generation(absent, None, before_read_s=0.0, limit_s=LIMIT) == "g3"
    assert fencing.seed_generation(present, None, before_read_s=0.0, limit_s=LIMIT) is None


@pytest.mark.parametrize("code", [ACCEPTED, 0])
def test_a_master_that_accepted_or_is_ahead_is_not_seeded(code: int) -> None:
    assert fencing.seed_generation(read(), code, before_read_s=0.0, limit_s=LIMIT) is None


def test_no_seed_without_a_read() -> None:
    """The generation read is the guard: a master never read is never seeded."""
    assert fencing.seed_generation(None, UNTRUSTED, before_read_s=0.0, limit_s=LIMIT) is None


# -- when the first round is decided -----------------------------------------------------------


def test_decided_once_a_majority_accepted() -> None:
    accepted = read(accepted=ACCEPTED)
    assert fencing.decided([accepted, read(gen="g2", accepted=ACCEPTED), None], 3, 2)


def test_decided_when_busy_or_failed_on_more_than_a_minority() -> None:
    busy = read(granted=False, pttl=500)
    assert fencing.decided([busy, read(gen="g2", granted=False), None], 3, 2)
    error = ConnectionError("down")
    assert fencing.decided([error, error, None], 3, 2)
    # One busy, one unreachable: a busy still to come makes it busy, so wait.
    assert not fencing.decided([busy, error, None], 3, 2)


def test_a_majority_granted_waits_for_every_master_until_the_roster_is_known() -> None:
    fresh = [read(gen="a", roster=()), read(gen="b", roster=()), None]
    assert not fencing.decided(fresh, 3, 2)  # the third may hold the roster (or found it)
    assert fencing.decided([*fresh[:2], read(gen="c", roster=())], 3, 2)
    rostered = [read(), read(gen="g2"), None]
    assert fencing.decided(rostered, 3, 2)
