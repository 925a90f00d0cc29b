"""Each kind declared once (aiolock/_core/protocol/kinds.py, registered in
aiolock._primitives.KINDS).

The registry is checked when made (one name per kind, no suffix claimed by
two primitives of one name or with two types); the runner's renewal scripts
are all some kind's; and, against a real server, every registered kind is
walked: a held and contended instance writes only the keys its spec
declares, and the operator commands describe, list, inspect and
force-release it (or refuse to, saying why) from the declaration alone. A
new kind that forgets a part of its declaration, or whose instance the
command line cannot handle, fails here.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from aiolock import Client, Redlock
from aiolock._core.protocol.keys import main_key
from aiolock._core.protocol.kinds import FOREIGN, KindSpec, Part, Registry, Release
from aiolock._core.protocol.scripts import RENEWALS, script_names
from aiolock._primitives import KINDS
from aiolock.cli import main
from aiolock.cli.ops import Server, Target
from tests.core_util import eventually

Take = Callable[[Client, str], Awaitable[Any]]

#: How to hold an instance of each kind, and how another Client contends for
#: it (a call that waits). A new kind adds its line here: the walk below
#: checks that every registered kind has one.
HOLD: dict[str, tuple[Take, Take]] = {
    "lock": (
        lambda c, n: c.lock(n).acquire(),
        lambda c, n: c.lock(n).acquire(),
    ),
    "fair_lock": (
        lambda c, n: c.fair_lock(n).acquire(),
        lambda c, n: c.fair_lock(n).acquire(),
    ),
    "rw_lock": (
        lambda c, n: c.rw_lock(n).read.acquire(),
        lambda c, n: c.rw_lock(n).write.acquire(),
    ),
    "semaphore": (
        lambda c, n: c.semaphore(n, 1).acquire(),
        lambda c, n: c.semaphore(n, 1).acquire(),
    ),
    "latch": (
        lambda c, n: c.latch(n, 2).try_set_count(),
        lambda c, n: c.latch(n, 2).wait(),
    ),
    "redlock": (
        lambda c, n: Redlock([c]).lock(n).acquire(),
        lambda c, n: Redlock([c]).lock(n).acquire(),
    ),
    "singleflight": (
        lambda c, n: _SingleflightRun.start(c, n),
        lambda c, n: c.singleflight(n).run(_never_run),
    ),
    "election": (
        lambda c, n: c.election(n).campaign("leader"),
        lambda c, n: c.election(n).campaign("candidate"),
    ),
}


class _SingleflightRun:
    """A singleflight run kept under way until ``release()`` (a run is its "hold")."""

    lost = False

    def __init__(self, task: asyncio.Task[int], gate: asyncio.Event) -> None:
        self.task = task
        self.gate = gate

    @classmethod
    async def start(cls, client: Client, name: str) -> _SingleflightRun:
        gate, started = asyncio.Event(), asyncio.Event()

        async def run() -> int:
            started.set()
            await gate.wait()
            return 1

        task = asyncio.create_task(client.singleflight(name).run(run))
        await started.wait()
        return cls(task, gate)

    async def release(self) -> None:
        self.gate.set()
        await self.task


async def _never_run() -> int:
    raise AssertionError("the contender of a run under way ran the function")


def _reader(raw: Any, anchor: Any) -> None:
    return None


# --------------------------------------------------------------------------- the registry


def test_no_two_primitives_of_a_name_claim_one_suffix() -> None:
    """Kinds of different anchors (two primitives that may live under one
    name) share no key; kinds of one anchor (one name's one primitive) may
    share a key, of one type."""
    by_suffix: dict[str, list[tuple[KindSpec, Part]]] = {}
    for spec in KINDS:
        suffixes = [p.suffix for p in spec.parts]
        assert len(suffixes) == len(set(suffixes)), spec.name
        for part in spec.parts:
            by_suffix.setdefault(part.suffix, []).append((spec, part))
    for suffix, claims in by_suffix.items():
        assert len({spec.anchor.suffix for spec, _ in claims}) == 1, suffix
        assert len({part.type for _, part in claims}) == 1, suffix
    assert len({spec.name for spec in KINDS}) == len(KINDS)
    assert FOREIGN.name not in {spec.name for spec in KINDS}


def test_the_registry_refuses_a_conflicting_declaration() -> None:
    lock = KINDS["lock"]
    clash = KindSpec(
        "other", "other", (Part(":rl:x", "hash", ""), Part(":wq", "zset", "")), _reader
    )
    with pytest.raises(ValueError, match="different anchors"):
        Registry(lock, clash)
    retyped = KindSpec("other", "other", (Part("", "hash", ""), Part(":wq", "list", "")), _reader)
    with pytest.raises(ValueError, match="a zset for 'lock', a list for 'other'"):
        Registry(lock, retyped)
    with pytest.raises(ValueError, match="more than one default kind"):
        Registry(lock, KindSpec("other", "other", (Part("", "hash", ""),), _reader))
    with pytest.raises(ValueError, match="two kinds named 'lock'"):
        Registry(lock, lock)


def test_every_kind_declares_its_operations() -> None:
    """The renewal scripts the runner knows (``--@runner renewal``) are all some
    kind's; every script a kind names exists; a kind either can be
    force-released from the command line (a Client factory of that name) or
    says why not."""
    scripts = set(script_names())
    declared = {name for spec in KINDS for name in spec.renewals}
    assert RENEWALS <= declared
    assert declared <= scripts
    for spec in KINDS:
        if spec.release is None:
            assert spec.cannot_release, f"{spec.name}: no release and no reason"
            continue
        assert spec.release.script in scripts, spec.name
        assert callable(getattr(Client, spec.release.factory, None)), spec.name
    assert set(HOLD) == {spec.name for spec in KINDS}, "a kind without a line in HOLD"
    assert isinstance(KINDS["lock"].release, Release)


def test_state_suffixes_come_from_the_declarations() -> None:
    from aiolock.cli.ops_state import KEY_SUFFIXES

    assert KEY_SUFFIXES == {p.suffix: p.type for spec in KINDS for p in spec.parts}
    assert next(iter(KEY_SUFFIXES)) == ""  # the main key first


# --------------------------------------------------------------------------- the walk


async def _run(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, [*args, "--url", url])
    out, err = capsys.readouterr()
    return code, out, err


async def _keys_of(admin: aioredis.Redis, name: str) -> set[str]:
    main = main_key("aiolock", name)
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", main) + "*"
    return {key[len(main) :] async for key in admin.scan_iter(match=pattern)}


@pytest.mark.parametrize("kind", [spec.name for spec in KINDS])
async def test_the_command_line_handles_every_kind(
    kind: str,
    url: str,
    client: Client,
    other_client: Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = KINDS[kind]
    take, contend = HOLD[kind]
    name = f"walk:{kind}"
    held = await take(client, name)
    contender = asyncio.create_task(contend(other_client, name))
    admin = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        await asyncio.sleep(0.3)  # the contender registers where its kind records waiters
        assert not contender.done()

        # Its keys are the ones its spec declares (state parts or wake-up lists).
        declared = {p.suffix for p in spec.parts}
        wakeup = re.compile("|".join(spec.wakeups)) if spec.wakeups else None
        for suffix in await _keys_of(admin, name):
            assert suffix in declared or (wakeup and wakeup.fullmatch(suffix)), (kind, suffix)

        # Described as its kind, from the declarations alone.
        server = await Server.open(Target(url, "aiolock", None, {}))
        try:
            state = await server.state(name)
        finally:
            await server.aclose()
        (found,) = state.primitives
        assert found.kind == kind and found.spec is spec
        assert found.active
        if spec.gate:
            assert found.counting_down and not found.held
        else:
            assert {h.client_id for h in found.holders} == {client.id}

        code, out, _ = await _run(capsys, url, "ls", name, "--json")
        assert code == 0
        assert [(p["name"], p["kind"]) for p in json.loads(out)["locks"]] == [(name, kind)]
        code, out, _ = await _run(capsys, url, "inspect", name)
        assert code == 0
        assert out.startswith(f"{spec.words} {name!r} (key ")

        code, out, err = await _run(capsys, url, "force-release", name, "--yes")
        if spec.release is None:
            assert code == 1 and spec.cannot_release in err
            assert (await _keys_of(admin, name)) >= {spec.anchor.suffix}
        else:
            assert code == 0, err
            assert out.startswith("force-released ")
            assert "waiters woken" in out
            await eventually(lambda: held.lost, what="the holder's loss", timeout=10)
    finally:
        contender.cancel()
        results = await asyncio.gather(contender, return_exceptions=True)
        for leftover in [held, *results]:
            release = getattr(leftover, "release", None)
            if release is not None and not leftover.lost:
                await release()
        if spec.gate:
            for _ in range(2):
                await client.latch(name, 2).count_down()
        await admin.aclose()
