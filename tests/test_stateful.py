"""Stateful property tests: every held primitive against its model, on real servers.

The machine is tests/stateful.py (its docstring lists the rules and the
checks), the models tests/model.py. Each primitive runs on one server, on
the shared Cluster, on a server of its own that the machine restarts
without persistence, and as a Redlock over three masters. Each run is
seeded (``derandomize``): a CI run is reproducible. A deeper run, for a
release check (more examples, longer sequences, every deployment):

    AIOLOCK_STATEFUL_EXAMPLES=150 AIOLOCK_STATEFUL_STEPS=50 \\
        python -m pytest -n 0 --timeout 3600 tests/test_stateful.py
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.servers import RedisServer
from tests.stateful import latch_machine, machine

EXAMPLES = int(os.environ.get("AIOLOCK_STATEFUL_EXAMPLES", "6"))
STEPS = int(os.environ.get("AIOLOCK_STATEFUL_STEPS", "20"))
HELD = ["lock", "fair", "spin", "rw", "semaphore", "multi"]
#: Kinds whose scripts differ enough to be worth a restart of their own.
RESTARTED = ["lock", "fair", "rw", "semaphore"]


def run(cls: Any, examples: int = EXAMPLES, steps: int = STEPS) -> None:
    run_state_machine_as_test(
        cls,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=True,  # a fixed seed: a CI run is reproducible
            suppress_health_check=list(HealthCheck),
            database=None,
            # No 'explain' phase: it re-runs a failing example under a tracer.
            # AIOLOCK_STATEFUL_SHRINK=0 (tests.plant): report the first failure
            # found, unshrunk (the steps are in its message).
            phases=[Phase.explicit, Phase.reuse, Phase.generate]
            + ([Phase.shrink] if os.environ.get("AIOLOCK_STATEFUL_SHRINK", "1") != "0" else []),
        ),
    )


@pytest.mark.parametrize("kind", HELD)
@pytest.mark.parametrize("server", ["redis"], indirect=True)
def test_agrees_with_its_model(kind: str, url: str, server: Any) -> None:
    run(machine(kind, [url]))


@pytest.mark.parametrize("server", ["valkey"], indirect=True)
def test_the_latch_agrees_with_its_model(url: str, server: Any) -> None:
    run(latch_machine(url))


@pytest.mark.parametrize("kind", HELD)
@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
def test_agrees_with_its_model_on_a_cluster(kind: str, cluster_url: str) -> None:
    run(machine(kind, [cluster_url]), examples=max(2, EXAMPLES // 3))


@pytest.mark.parametrize("kind", RESTARTED)
@pytest.mark.parametrize("fresh_server", ["redis"], indirect=True)
def test_agrees_with_its_model_across_restarts(kind: str, fresh_server: Any) -> None:
    run(machine(kind, [fresh_server.url], fresh=fresh_server), examples=max(2, EXAMPLES // 3))


@pytest.mark.parametrize("server", ["redis"], indirect=True)
def test_redlock_agrees_with_its_model(server: RedisServer) -> None:
    # Three databases of one server stand for three masters: the model
    # checks the quorum's bookkeeping, not the masters' independence
    # (tests/test_redlock.py runs three server processes for that).
    urls = [f"redis://{server.host}:{server.port}/{db}" for db in (1, 2, 3)]
    run(machine("redlock", urls))


# -- counterexamples found by the machine, kept as regression tests -----------------------


@pytest.mark.parametrize("fresh_server", ["redis"], indirect=True)
def test_a_restart_loses_the_fair_queue_and_every_waiter_is_still_served(
    fresh_server: Any,
) -> None:
    """Found by the deep run: b0 holds a fair lock, a1 (another Client) and then
    b1 (b0's Client) queue; the server restarts without persistence. The
    queue is gone with the data: b1 is served first (its Client learns of
    the loss first), which the model first took for a FIFO violation. Now
    documented (README, fair_lock); what must hold: every waiter is served,
    once, with a token above every earlier one, and nothing is left."""
    m = machine("fair", [fresh_server.url], fresh=fresh_server)()
    try:
        m.try_acquire(who="b0", side="x")
        m.wait_for_it(who="a1", side="x")
        m.wait_for_it(who="b1", side="x")
        assert list(m.model.waiters) == ["a1", "b1"]
        m.restart_server()
        m.holders_agree()
        served = m.model.holders()
        assert len(served) == 1 and m.model.waiters.keys() == {"a1", "b1"} - served
        (first,) = served
        m.release(who=first)  # the other waiter is served next
        m.holders_agree()
        assert not m.model.waiters and len(m.model.holders()) == 1
    finally:
        m.teardown()
