"""The planted bugs (tests/plant.py) still apply to the code as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plant import BUGS, ROOT, plant


def test_there_are_at_least_twenty_distinct_bugs() -> None:
    assert len({b.name for b in BUGS}) == len(BUGS) >= 20


@pytest.mark.parametrize("bug", BUGS, ids=[b.name for b in BUGS])
def test_each_bug_still_plants(bug: object, tmp_path: Path) -> None:
    target = tmp_path / bug.path  # type: ignore[attr-defined]
    target.parent.mkdir(parents=True)
    target.write_text((ROOT / bug.path).read_text())  # type: ignore[attr-defined]
    plant(bug, tmp_path)  # type: ignore[arg-type]
    assert target.read_text() != (ROOT / bug.path).read_text()  # type: ignore[attr-defined]
