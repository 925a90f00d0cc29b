"""The history checker (aiolock/_history.py): each rule accepts the histories
a correct lock produces and refutes, naming the operations, each history
that breaks it. Pure: no server."""

from __future__ import annotations

import random

import pytest

from aiolock._history import Op, check, check_register, dumps, loads


def op(token: int, invoked: int, acquired: int, released: int, **extra: object) -> Op:
    return Op("x", token, invoked, acquired, released, **extra)  # type: ignore[arg-type]


def rules(ops: list[Op]) -> list[str]:
    return [v.rule for v in check(ops)]


def serial_history(n: int, seed: int) -> list[Op]:
    """``n`` holds one after another, with waits that overlap as a queue's do."""
    rng = random.Random(seed)
    ops, t = [], 0
    for token in range(1, n + 1):
        invoked = max(0, t - rng.randrange(0, 50))  # called while the previous one held
        acquired = t + rng.randrange(0, 5)
        released = acquired + rng.randrange(0, 20)
        ops.append(op(token * 3, invoked, acquired, released, who=f"p{rng.randrange(4)}"))
        t = released
    rng.shuffle(ops)  # the processes' files merge in any order
    return ops


@pytest.mark.parametrize("seed", range(5))
def test_a_correct_history_passes(seed: int) -> None:
    assert check(serial_history(200, seed)) == []


def test_two_holders_at_once_are_caught() -> None:
    found = check([op(1, 0, 0, 10), op(2, 5, 6, 12)])
    assert [v.rule for v in found] == ["mutual exclusion"]
    assert [o.token for o in found[0].ops] == [1, 2]


def test_a_hold_inside_a_long_one_is_caught() -> None:
    # The second overlaps the first, not the third: a sweep over pairs of
    # neighbours alone would miss it.
    assert rules([op(1, 0, 0, 100), op(2, 1, 10, 20), op(3, 2, 30, 40)]) == [
        "mutual exclusion",
        "mutual exclusion",
    ]


def test_a_hold_told_lost_stops_acting_then() -> None:
    first = op(1, 0, 0, 50, lost=10, confirmed_gone=True)
    assert check([first, op(2, 5, 20, 30)]) == []
    # Told only after the other began: both acted at once.
    late = op(1, 0, 0, 50, lost=25, confirmed_gone=True)
    assert rules([late, op(2, 5, 20, 30)]) == ["mutual exclusion"]


def test_a_lower_token_after_a_higher_one_is_caught() -> None:
    found = check([op(5, 0, 1, 2), op(4, 3, 4, 5)])
    assert [v.rule for v in found] == ["token order"]
    assert "token 4 was issued after token 5" in str(found[0])


def test_a_reused_token_is_caught() -> None:
    assert rules([op(5, 0, 1, 2), op(5, 3, 4, 5)]) == ["token order"]


def test_concurrent_invocations_may_get_tokens_in_either_order() -> None:
    # Both were waiting when the first was granted: no real-time order between
    # the second's invocation and the first's grant.
    assert check([op(7, 0, 10, 20), op(6, 5, 5, 8)]) == []


def test_a_loss_without_evidence_is_caught() -> None:
    found = check([op(1, 0, 0, 10, lost=5)])
    assert [v.rule for v in found] == ["loss happened"]
    # The server said so (release: not owned), or another hold began meanwhile.
    assert check([op(1, 0, 0, 10, lost=5, confirmed_gone=True)]) == []
    assert check([op(1, 0, 0, 10, lost=5), op(2, 1, 7, 12)]) == []


def test_names_are_checked_apart() -> None:
    a, b = Op("a", 1, 0, 0, 10), Op("b", 1, 0, 0, 10)
    assert check([a, b]) == []


def test_inconsistent_times_are_refused() -> None:
    with pytest.raises(ValueError, match="invoked <= acquired <= released"):
        check([op(1, 5, 4, 6)])


def test_lost_update() -> None:
    assert check_register(10, 10) == []
    assert [v.rule for v in check_register(9, 10)] == ["no lost update"]


def test_histories_round_trip_through_text() -> None:
    ops = [*serial_history(20, 1), op(99, 0, 1, 2, lost=1, confirmed_gone=True)]
    assert loads(dumps(ops)) == ops
