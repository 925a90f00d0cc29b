"""``aiolock ls | inspect | top | force-release`` against real servers and real holders.

Most runs are in-process (``aiolock.cli.main`` in a worker thread, since it runs
its own event loop, while the holders' Clients keep running on the test's loop);
a few are subprocesses, as a user runs them: exit codes, stdin confirmation,
Ctrl-C, and ``top`` under a pseudo-terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from aiolock import Client, LockLostError, LockTimeoutError, Redlock
from aiolock._core.protocol.keys import main_key
from aiolock.cli import main
from aiolock.cli.ops import Server, Target, add_arguments, state_json
from aiolock.cli.ops_state import describe, glob_match, name_of_key
from tests.cluster_servers import ClusterProcess
from tests.conftest import MakeClient
from tests.core_util import eventually
from tests.servers import find_free_port

#: The fields of one primitive in ``ls --json`` / ``inspect --json`` (the README's).
PRIMITIVE_FIELDS = {
    "name", "kind", "key", "state", "held", "ttl_ms", "holders", "waiters",
    "untracked_waiters", "waiters_not_shown", "last_token", "last_released", "details",
}  # fmt: skip
HOLDER_FIELDS = {"owner", "client_id", "task", "role", "ttl_ms", "token", "count", "permits"}
WAITER_FIELDS = {"client_id", "role", "ttl_ms", "task", "owner", "permits"}
#: A watchdog-kept hold whose loss must be seen quickly: renewed every 1.5 s.
SHORT_LEASE = 4.5

Cli = Callable[..., Awaitable[tuple[int, str, str]]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], url: str) -> Cli:
    """``await cli("ls", ...)``: ``aiolock.cli.main`` on ``url`` in a thread; (code, out, err)."""

    async def run(*args: str, target: str | None = None) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, [*args, "--url", target or url])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
async def admin(url: str) -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(url, decode_responses=True)
    yield connection
    await connection.aclose()


@pytest.fixture
def one_backend(request: pytest.FixtureRequest) -> None:
    """What a command-line process does with stdin, a terminal or a signal does not
    depend on the server: such a test runs with one backend (skipped with valkey)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("server") == "valkey":
        pytest.skip("command-line process behaviour: run with one backend")


def aiolock_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiolock", *args]


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "REDIS_URL"}


def _default_sigint() -> None:
    # A terminal's Ctrl-C even when the suite runs in the background (see README_TESTING_NOTES).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def run_child(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *aiolock_argv(*args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def by_kind(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(p["name"], p["kind"]): p for p in doc["locks"]}


async def hold_until_lost(
    lock: Any, entered: asyncio.Event, owner: list[str], client: Client
) -> BaseException | None:
    """``async with lock:`` (on_lost="cancel") until the hold is lost; what it raised."""
    try:
        async with lock:
            task = asyncio.current_task()
            assert task is not None
            owner.append(client.owner(task))
            entered.set()
            await asyncio.sleep(3600)
    except LockLostError as exc:
        return exc
    return None


# --------------------------------------------------------------------------- pure helpers


def test_key_names_and_globs() -> None:
    assert name_of_key("aiolock", "aiolock:{a:b}") == "a:b"
    assert name_of_key("aiolock", "aiolock:{a}:fence") == "a"
    assert name_of_key("aiolock", "aiolock:{a}:rl:fence") == "a"
    assert name_of_key("aiolock", "aiolock:{a}:sig:0af3") == "a"
    assert name_of_key("aiolock", "aiolock:{a}:other") is None
    assert name_of_key("aiolock", "other:{a}") is None
    assert glob_match("orders:*", "orders:42")
    assert not glob_match("orders:*", "users:1")
    assert glob_match("o?d[a-z]rs", "orders")
    assert glob_match(r"a\*", "a*") and not glob_match(r"a\*", "ab")


def test_the_readme_documents_every_json_field() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "operating.md").read_text()
    found = re.search(r"^## The command line\n(.*?)(?=^## )", text, re.M | re.S)
    assert found, "docs/operating.md has no '## The command line'"
    documented = set(re.findall(r"`(\w+)`", found[1]))
    fields = PRIMITIVE_FIELDS | HOLDER_FIELDS | WAITER_FIELDS
    assert fields - documented == set()
    for top in ("prefix", "pattern", "cluster", "masters", "locks", "exists", "keys", "type"):
        assert f'"{top}"' in found[1], top


# --------------------------------------------------------------------------- ls, inspect


async def test_ls_and_inspect_show_every_kind(
    cli: Cli, admin: aioredis.Redis, client: Client, other_client: Client
) -> None:
    a, b = client, other_client
    me = a.owner(asyncio.current_task())  # type: ignore[arg-type]
    lock = await a.lock("k:lock").acquire()
    spin = await a.spin_lock("k:spin").acquire()
    fair = await a.fair_lock("k:fair").acquire()
    read_a = await a.rw_lock("k:rw").read.acquire()
    read_b = await b.rw_lock("k:rw").read.acquire()
    permit = await a.semaphore("k:sem", 2).acquire()
    assert await a.latch("k:latch", 2).try_set_count()
    red = await Redlock([a]).lock("k:red").acquire()
    waiters = [
        asyncio.create_task(b.lock("k:lock").acquire()),
        asyncio.create_task(b.fair_lock("k:fair").acquire()),
        asyncio.create_task(a.rw_lock("k:rw").write.acquire()),
        asyncio.create_task(b.semaphore("k:sem", 2).acquire(2)),
    ]
    try:
        await eventually(
            lambda: admin.zcard("aiolock:{k:lock}:wq"), what="the lock's waiter registered"
        )
        await eventually(
            lambda: admin.zcount("aiolock:{k:fair}:q", 1, "+inf"), what="the fair waiter queued"
        )
        await eventually(lambda: admin.zcard("aiolock:{k:rw}:wq"), what="the writer waiting")
        await eventually(lambda: admin.hexists("aiolock:{k:sem}", "c"), what="the semaphore claim")

        code, out, _ = await cli("ls", "--json")
        assert code == 0
        doc = json.loads(out)
        assert doc["prefix"] == "aiolock" and doc["cluster"] is False and doc["masters"] == 1
        found = by_kind(doc)
        assert set(found) == {
            ("k:lock", "lock"), ("k:spin", "lock"), ("k:fair", "fair_lock"),
            ("k:rw", "rw_lock"), ("k:sem", "semaphore"), ("k:latch", "latch"),
            ("k:red", "redlock"),
        }  # fmt: skip
        for p in doc["locks"]:
            assert set(p) == PRIMITIVE_FIELDS
            for h in p["holders"]:
                assert set(h) == HOLDER_FIELDS
                assert 0 < h["ttl_ms"] <= 30_000
            for w in p["waiters"]:
                assert set(w) == WAITER_FIELDS

        def holder(name: str, kind: str) -> dict[str, Any]:
            (h,) = found[(name, kind)]["holders"]
            return h

        for name, kind, lease in [
            ("k:lock", "lock", lock),
            ("k:spin", "lock", spin),
            ("k:fair", "fair_lock", fair),
        ]:
            h = holder(name, kind)
            assert (h["owner"], h["client_id"], h["token"], h["count"]) == (
                me,
                a.id,
                lease.fencing_token,
                1,
            )
            assert h["task"] == int(me.rsplit(":", 1)[1])
        assert found[("k:lock", "lock")]["waiters"][0]["client_id"] == b.id
        assert found[("k:lock", "lock")]["waiters"][0]["role"] == "task"
        assert found[("k:lock", "lock")]["last_token"] >= lock.fencing_token
        assert [w["client_id"] for w in found[("k:fair", "fair_lock")]["waiters"]] == [b.id]
        rw = found[("k:rw", "rw_lock")]
        assert {(h["client_id"], h["role"], h["token"]) for h in rw["holders"]} == {
            (a.id, "read", read_a.fencing_token),
            (b.id, "read", read_b.fencing_token),
        }
        assert [(w["client_id"], w["role"]) for w in rw["waiters"]] == [(a.id, "writer")]
        sem = found[("k:sem", "semaphore")]
        assert sem["details"] == {"permits": 2, "in_use": 1}
        assert (sem["holders"][0]["owner"], sem["holders"][0]["permits"]) == (me, 1)
        assert sem["last_token"] == permit.fencing_token
        assert [(w["client_id"], w["role"], w["permits"]) for w in sem["waiters"]] == [
            (b.id, "claim", 2)
        ]
        assert found[("k:latch", "latch")]["details"] == {"count": 2, "generation": 0}
        assert found[("k:latch", "latch")]["held"] is False  # nobody holds a latch
        assert found[("k:latch", "latch")]["state"] == "counting down"
        assert found[("k:lock", "lock")]["state"] == "held"
        assert holder("k:red", "redlock")["owner"] == me
        assert found[("k:red", "redlock")]["last_token"] == red.fencing_token

        code, out, _ = await cli("ls")
        assert code == 0
        assert out.splitlines()[0].split() == [
            "NAME", "KIND", "HOLDER", "HOLDS", "TTL", "TOKEN", "WAITING"
        ]  # fmt: skip
        line = next(x for x in out.splitlines() if x.startswith("k:lock "))
        assert me in line and str(lock.fencing_token) in line and line.split()[-1] == "1"

        code, out, _ = await cli("inspect", "k:lock")
        assert code == 0, out
        assert f"held by task {me.rsplit(':', 1)[1]} of client {a.id} (owner {me})" in out
        assert f"fencing token {lock.fencing_token}" in out
        assert "waiting: 1 recorded in Redis (1 Client):\n    task" in out
        assert f"of client {b.id}" in out
        assert "aiolock:{k:lock}:fence  hash" in out and "aiolock:{k:lock}:wq  zset" in out
        code, out, _ = await cli("inspect", "k:rw")
        assert out.count("held for reading by task") == 2 and "writer task" in out
        code, out, _ = await cli("inspect", "k:sem")
        assert "1 of 2 permits in use" in out and "claims 2 permit(s)" in out
        code, out, _ = await cli("inspect", "k:fair")
        assert "#1 task" in out and f"of client {b.id}" in out
        code, out, _ = await cli("inspect", "k:latch")
        assert "counting down: 2 to go" in out
        code, out, _ = await cli("inspect", "k:red")
        assert "Redlock lock" in out and f"(owner {me})" in out

        # --json: the same description the reader gives, field for field.
        code, out, _ = await cli("inspect", "k:rw", "--json")
        assert code == 0
        doc = json.loads(out)
        server = await Server.open(Target(url_of(admin), "aiolock", None, {}))
        try:
            assert doc["name"] == "k:rw" and doc["exists"] is True
            assert {k["key"] for k in doc["keys"]} >= {"aiolock:{k:rw}", "aiolock:{k:rw}:wq"}
            fresh = state_json(await server.state("k:rw"))
        finally:
            await server.aclose()
        for p, q in zip(doc["primitives"], fresh["primitives"], strict=True):
            assert [h["owner"] for h in p["holders"]] == [h["owner"] for h in q["holders"]]
            assert [h["token"] for h in p["holders"]] == [h["token"] for h in q["holders"]]
    finally:
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        for held in (lock, spin, fair, read_a, read_b, permit, red):
            await held.release()


def url_of(connection: aioredis.Redis) -> str:
    kw = connection.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


async def test_describe_is_pure_over_what_the_library_wrote(url: str, client: Client) -> None:
    # The reader's raw keys of a real hold, described at two server clocks:
    # the expiry rules are the scripts' (a hold past its expiry is gone).
    read = await client.rw_lock("pure").read.acquire(lease=60.0)
    permit = await client.semaphore("pure-sem", 3).acquire(2, lease=60.0)
    server = await Server.open(Target(url, "aiolock", None, {}))
    try:
        raw_rw, raw_sem = await server.read_raw(server.nodes[0], ["pure", "pure-sem"])
    finally:
        await server.aclose()
    (rw,) = describe(raw_rw).primitives
    assert [(h.role, h.token) for h in rw.holders] == [("read", read.fencing_token)]
    assert 30_000 < (rw.holders[0].ttl_ms or 0) <= 60_000  # the fixed 60 s lease
    (sem,) = describe(raw_sem).primitives
    assert sem.details == {"permits": 3, "in_use": 2} and sem.holders[0].permits == 2
    later = 61_000
    assert describe(replace(raw_rw, now_ms=raw_rw.now_ms + later)).primitives[0].holders == ()
    expired = describe(replace(raw_sem, now_ms=raw_sem.now_ms + later)).primitives[0]
    assert expired.holders == () and expired.details["in_use"] == 0
    await read.release()
    await permit.release()


async def test_ls_filters_by_pattern_with_scan_not_keys(
    cli: Cli, admin: aioredis.Redis, client: Client
) -> None:
    leases = [await client.lock(n).acquire() for n in ("orders:1", "orders:2", "users:1")]
    await client.lock("orders:gone").acquire(lease=60.0)
    await client.lock("orders:gone").force_release()  # only its fence counter is left
    before = await admin.info("commandstats")
    code, out, _ = await cli("ls", "orders:*", "--json")
    after = await admin.info("commandstats")
    assert code == 0
    assert [p["name"] for p in json.loads(out)["locks"]] == ["orders:1", "orders:2"]
    assert after.get("cmdstat_keys") == before.get("cmdstat_keys")
    assert after["cmdstat_scan"]["calls"] > before.get("cmdstat_scan", {"calls": 0})["calls"]
    code, out, _ = await cli("ls", "orders:*", "--all", "--json")
    assert [p["name"] for p in json.loads(out)["locks"]] == ["orders:1", "orders:2"]
    code, out, _ = await cli("ls", "nothing*")
    assert code == 0 and "no held or contended locks match 'nothing*'" in out
    code, out, _ = await cli("inspect", "orders:gone")
    assert code == 0 and "only its fencing counter is kept" in out
    await admin.set("aiolock:{weird}", "not ours")
    code, out, _ = await cli("inspect", "weird")
    assert code == 0 and "holds a string aiolock did not write" in out
    code, out, _ = await cli("ls", "weird", "--all", "--json")
    assert [p["kind"] for p in json.loads(out)["locks"]] == ["foreign"]
    code, out, _ = await cli("inspect", "never-used")
    assert code == 1 and "nothing is kept for 'never-used'" in out
    code, out, _ = await cli("ls", "--prefix", "other")
    assert code == 0 and "no held or contended locks" in out
    for lease in leases:
        await lease.release()


# --------------------------------------------------------------------------- force-release


def waiting_column(out: str) -> dict[str, list[str]]:
    """``ls``'s table rows by name (the legend under the table left out)."""
    lines = out.splitlines()
    assert lines[0].split()[-1] == "WAITING", out
    rows = {}
    for line in lines[1:]:
        if line.startswith("WAITING:"):
            break
        rows[line.split()[0]] = line.split()
    return rows


async def test_a_try_that_will_not_wait_leaves_no_trace(
    cli: Cli, admin: aioredis.Redis, make_client: MakeClient, notify: str
) -> None:
    # A failed try_acquire() used to flag the hold "~n" (untargeted waiters)
    # until the hold ended: `ls` showed WAITING "0+" although nobody waited.
    a = await make_client()
    b = await make_client(notify=notify)
    lock = await a.lock("t:busy").acquire()
    write = await a.rw_lock("t:rw").write.acquire()
    assert await b.lock("t:busy").try_acquire() is None
    assert await b.spin_lock("t:busy").try_acquire() is None
    assert await b.multi_lock(b.lock("t:free"), b.lock("t:busy")).try_acquire() is None
    assert await b.rw_lock("t:rw").read.try_acquire() is None
    assert not {"~n", "~w"} & set(await admin.hgetall("aiolock:{t:busy}"))
    assert await admin.exists("aiolock:{t:busy}:wq", "aiolock:{t:rw}:rq") == 0
    code, out, _ = await cli("ls", "t:*", "--json")
    assert code == 0
    found = by_kind(json.loads(out))
    assert set(found) == {("t:busy", "lock"), ("t:rw", "rw_lock")}
    for p in found.values():
        assert (p["waiters"], p["untracked_waiters"]) == ([], False)
    code, out, _ = await cli("ls", "t:*")
    assert {name: row[-1] for name, row in waiting_column(out).items()} == {
        "t:busy": "0",
        "t:rw": "0",
    }
    code, out, _ = await cli("inspect", "t:busy")
    assert "waiting: none recorded in Redis" in out and "possibly more" not in out

    # A task that does wait is still seen (registered, or flagged "+" when it
    # cannot register), and the release still wakes it, in every notify mode.
    waiter = asyncio.create_task(b.lock("t:busy").acquire())
    if notify == "pubsub":
        await eventually(lambda: admin.zcard("aiolock:{t:busy}:wq"), what="the waiter registered")
    else:
        await eventually(lambda: admin.hexists("aiolock:{t:busy}", "~n"), what="the waiter's flag")
    code, out, _ = await cli("ls", "t:busy")
    assert waiting_column(out)["t:busy"][-1] == ("1" if notify == "pubsub" else "0+")
    await lock.release()
    got = await asyncio.wait_for(waiter, 10)  # woken: long before the hold's 30 s TTL
    await got.release()
    await write.release()


@pytest.mark.parametrize("mode", ["list", "poll"])
async def test_an_unregistered_waiter_that_gave_up_stops_counting(
    url: str, make_client: MakeClient, mode: str
) -> None:
    # A task that cannot register flags the hold "~n" with "~nx", the time its
    # next try is due; once it is overdue the task is no longer counted,
    # although the flag stays for the release (described at a later clock).
    holder = await make_client()
    waiter = await make_client(notify=mode, lease=SHORT_LEASE)
    lease = await holder.lock("gone").acquire(lease=60.0)  # a fixed expiry: no renewal
    with pytest.raises(LockTimeoutError):
        await waiter.lock("gone").acquire(timeout=0.2)
    server = await Server.open(Target(url, "aiolock", None, {}))
    try:
        (raw,) = await server.read_raw(server.nodes[0], ["gone"])
    finally:
        await server.aclose()
    fields = raw.keys[""].value
    due = int(fields["~nx"])
    ttl = raw.keys[""].pttl
    assert raw.now_ms + ttl < due <= raw.now_ms + ttl + int(SHORT_LEASE * 1000) + 1000
    (now,) = describe(raw).primitives
    assert now.untracked_waiters and now.waiting == "0+"
    (later,) = describe(replace(raw, now_ms=due + 1)).primitives
    assert not later.untracked_waiters and later.waiting == "0"
    await lease.release()


async def test_a_force_release_grant_leaves_no_phantom_waiter(
    cli: Cli, admin: aioredis.Redis, make_client: MakeClient
) -> None:
    # force_release.lua used to mark the hold it granted to a registered waiter
    # "~n" (untargeted waiters) whether or not anyone waited so.
    a, b, c = await make_client(), await make_client(), await make_client()
    await a.lock("t:fr").acquire()
    waiter = asyncio.create_task(b.lock("t:fr").acquire())
    await eventually(lambda: admin.zcard("aiolock:{t:fr}:wq"), what="the waiter registered")
    assert await c.lock("t:fr").force_release()
    got = await asyncio.wait_for(waiter, 10)  # granted by the force-release
    assert "~n" not in await admin.hgetall("aiolock:{t:fr}")
    code, out, _ = await cli("ls", "t:fr", "--json")
    assert code == 0
    (p,) = json.loads(out)["locks"]
    assert (p["state"], p["waiters"], p["untracked_waiters"]) == ("held", [], False)
    await got.release()


async def test_every_command_says_what_redis_cannot_show(
    cli: Cli, admin: aioredis.Redis, client: Client, other_client: Client
) -> None:
    # Two tasks wait for the lock (one queued inside the holder's own Client,
    # one of another Client): Redis records one, and every output says so. A
    # latch counting down has the same word everywhere, and its waiters are
    # shown as not recorded, not as none.
    a, b = client, other_client
    lease = await a.lock("v:lock").acquire()
    tasks = [asyncio.create_task(a.lock("v:lock").acquire())]
    await eventually(lambda: a.lock("v:lock").statistics().waiting == 1, what="queued locally")
    tasks.append(asyncio.create_task(b.lock("v:lock").acquire()))
    await eventually(lambda: admin.zcard("aiolock:{v:lock}:wq"), what="the waiter registered")
    latch = a.latch("v:latch", 2)
    assert await latch.try_set_count()
    tasks.append(asyncio.create_task(b.latch("v:latch", 2).wait()))
    try:
        await eventually(lambda: b.latch("v:latch", 2).statistics().waiting == 1, what="parked")
        code, out, _ = await cli("ls", "v:*")
        assert code == 0
        rows = waiting_column(out)
        assert rows["v:lock"][-1] == "1"
        assert " ".join(rows["v:latch"][2:8]) == "(counting down: 2 to go) -"
        assert rows["v:latch"][-1] == "?"
        legend = out[out.index("WAITING: the waiters recorded in Redis") :]
        assert "tasks queued inside the holder's own Client, are not in Redis" in legend
        assert "? (latch): tasks in wait() are not recorded in Redis" in legend

        code, out, _ = await cli("ls", "v:*", "--json")
        found = by_kind(json.loads(out))
        the_latch, the_lock = found[("v:latch", "latch")], found[("v:lock", "lock")]
        assert (the_latch["state"], the_latch["held"]) == ("counting down", False)
        assert "wait()" in the_latch["waiters_not_shown"]
        assert "holder's own Client" in the_lock["waiters_not_shown"]

        code, out, _ = await cli("inspect", "v:lock")
        assert "waiting: 1 recorded in Redis (1 Client)" in out
        assert "not visible from Redis: a waiting Client registers one task" in out
        code, out, _ = await cli("inspect", "v:latch")
        assert "counting down: 2 to go" in out
        assert "waiting: tasks in wait() are not recorded in Redis" in out

        code, out, _ = await cli("top", "--plain", "--iterations", "1", "v:*")
        assert "1 held, 1 contended, 1 latch counting down" in out
        assert "? (latch): tasks in wait() are not recorded in Redis" in out

        code, out, err = await cli("force-release", "v:latch", "--yes")
        assert code == 1 and "held by nobody" not in err + out
        assert "latch 'v:latch' is counting down: 2 to go; a latch has no holder" in err
    finally:
        for task in tasks[:2]:
            task.cancel()
        await latch.count_down()
        await latch.count_down()
        await asyncio.gather(*tasks, return_exceptions=True)
        await lease.release()


@pytest.mark.usefixtures("one_backend")
async def test_force_release_asks_then_evicts_the_holder(
    cli: Cli, make_client: MakeClient, admin: aioredis.Redis, url: str
) -> None:
    holder = await make_client(lease=SHORT_LEASE)
    waiter = await make_client(lease=SHORT_LEASE)
    entered, owner = asyncio.Event(), []
    held = asyncio.create_task(hold_until_lost(holder.lock("job"), entered, owner, holder))
    await entered.wait()
    queued = asyncio.create_task(waiter.lock("job").acquire())
    await eventually(lambda: admin.zcard("aiolock:{job}:wq"), what="the waiter registered")
    fence = int(await admin.hget("aiolock:{job}:fence", "t"))  # type: ignore[arg-type]

    code, out, _ = await run_child("force-release", "job", "--url", url, stdin=b"n\n")
    assert code == 1
    assert f"force-release lock 'job' held by {owner[0]}? [y/N] " in out
    assert "nothing done" in out
    assert not held.done() and await holder.lock("job").is_locked()

    code, out, err = await run_child("force-release", "job", "--url", url, stdin=b"y\n")
    assert code == 0, err
    assert f"force-released lock 'job' held by {owner[0]}" in out
    assert "The holder's Client was told on its eviction channel" in out
    assert re.search(r"may run on until its own lease ends: at most \d+\.\d s", out)
    # The waiter is woken (granted) at once; the holder is told at once.
    lease = await asyncio.wait_for(queued, SHORT_LEASE)
    assert lease.fencing_token > fence  # the fencing counter was kept
    await lease.release()
    code, out, _ = await cli("force-release", "job", "--yes")
    assert code == 1 and "no lock named 'job' is held" in out
    assert isinstance(await asyncio.wait_for(held, 2 * SHORT_LEASE), LockLostError)


async def test_force_release_fair_and_rw_locks(cli: Cli, make_client: MakeClient) -> None:
    holder = await make_client(lease=SHORT_LEASE)
    cases = {
        "f": ("fair lock", holder.fair_lock("f")),
        "rw": ("read-write lock", holder.rw_lock("rw").write),
    }
    held, owners = {}, {}
    for name, (_, lock) in cases.items():
        entered, owner = asyncio.Event(), owners.setdefault(name, [])
        held[name] = asyncio.create_task(hold_until_lost(lock, entered, owner, holder))
        await entered.wait()
    for name, (words, _) in cases.items():
        code, out, _ = await cli("force-release", name, "--yes")
        assert code == 0, out
        assert f"force-released {words} '{name}' held by {owners[name][0]}" in out
        assert "The holder's Client was told on its eviction channel" in out
    # Both holders are told at once (or find out at their next renewal, lease / 3).
    for task in held.values():
        assert isinstance(await asyncio.wait_for(task, 2 * SHORT_LEASE), LockLostError)
    for name in cases:
        code, out, _ = await cli("force-release", name, "--yes")
        assert code == 1 and f"no lock named '{name}' is held" in out


async def test_force_release_a_semaphore(cli: Cli, make_client: MakeClient) -> None:
    holder = await make_client(lease=SHORT_LEASE)
    other = await make_client(lease=SHORT_LEASE)
    await holder.semaphore("s", 3).set_permits(4)  # N as Redis has it: kept
    entered, owner = asyncio.Event(), []
    sem = holder.semaphore("s", 3)
    held = asyncio.create_task(hold_until_lost(sem(permits=2), entered, owner, holder))
    await entered.wait()
    local = await other.semaphore("s", 3).acquire()
    code, out, err = await cli("force-release", "s", "--yes")
    assert code == 0, err
    assert "force-released semaphore 's': 3 permits held by " in out
    assert f"{owner[0]} (2 permits)" in out and f"{other.owner(asyncio.current_task())}" in out
    assert "The holder's Client was told on its eviction channel" in out
    # Every holder is told at once (or finds out at its next renewal, lease / 3).
    assert isinstance(await asyncio.wait_for(held, 2 * SHORT_LEASE), LockLostError)
    await eventually(lambda: local.lost, timeout=2 * SHORT_LEASE, what="the other holder's loss")
    assert await other.semaphore("s", 1).get_permits() == 4
    assert await other.semaphore("s", 1).in_use() == 0
    code, out, _ = await cli("force-release", "s", "--yes")
    assert code == 1 and "no lock named 's' is held" in out


@pytest.mark.parametrize("kind", ["lock", "fair_lock", "rw_lock", "semaphore"])
async def test_force_release_tells_a_fixed_lease_holder_at_once(
    cli: Cli, make_client: MakeClient, kind: str
) -> None:
    """Issue 20: the CLI's force release reaches a holder of a fixed lease (no
    renewal) whose Client's watchdog would not run during the test (a long
    Client lease): it is told on its eviction channel. The CLI says how long a
    holder cut off from Redis may still run: the hold's remaining TTL."""
    holder = await make_client(lease=90.0)
    await holder.lock("warm").acquire()  # its eviction channel, confirmed
    await eventually(
        lambda: all(c.is_confirmed for c in holder._engine.evictions._channels.values()),
        what="the eviction channel confirmed",
    )
    prim: Any = {
        "lock": holder.lock("fx"),
        "fair_lock": holder.fair_lock("fx"),
        "rw_lock": holder.rw_lock("fx").write,
        "semaphore": holder.semaphore("fx", 2),
    }[kind]
    entered, owner = asyncio.Event(), []
    held = asyncio.create_task(hold_until_lost(prim(lease=60.0), entered, owner, holder))
    await entered.wait()
    code, out, err = await cli("force-release", "fx", "--yes")
    assert code == 0, err
    found = re.search(r"at most (\d+\.\d) s from when it was looked up", out)
    assert found and 30.0 < float(found.group(1)) <= 60.0, out
    lost = await asyncio.wait_for(held, 10.0)  # the watchdog: not before 30 s
    assert isinstance(lost, LockLostError) and "(force-released)" in str(lost)


async def test_force_release_refuses_a_redlock_lock(cli: Cli, client: Client) -> None:
    red = await Redlock([client]).lock("r").acquire()
    code, _, err = await cli("force-release", "r", "--yes")
    assert code == 1 and "is held by" in err and "a Redlock spans several masters" in err
    assert not red.lost and await Redlock([client]).lock("r").is_locked()
    await red.release()


# --------------------------------------------------------------------------- errors


async def test_connection_and_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    port = find_free_port()
    code, out, err = await run_child("ls", "--url", f"redis://127.0.0.1:{port}")
    assert code == 2 and out == ""
    assert err.strip() == (
        f"aiolock: cannot connect to redis://127.0.0.1:{port}: Connection refused. "
        "Check --url or REDIS_URL"
    )
    with pytest.raises(SystemExit) as exited:  # argparse: NAME missing
        main(["inspect"])
    assert exited.value.code == 2 and "usage:" in capsys.readouterr().err


async def test_cluster_flag_on_a_standalone_server_exits_2(cli: Cli) -> None:
    code, out, err = await cli("ls", "--cluster")
    assert code == 2 and out == ""
    assert err.startswith("aiolock: ") and err.strip().endswith("Check --cluster")


def test_tls_options_become_redis_py_ssl_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser.add_subparsers(dest="command"))
    tls = ["--tls-ca-cert", "ca.pem", "--tls-cert", "c.pem", "--tls-key", "k.pem"]
    args = parser.parse_args(["ls", "--url", "redis://h:1/0", *tls, "--tls-insecure"])
    target = Target.of(args)
    assert target.url == "rediss://h:1/0"
    assert target.kwargs == {
        "socket_connect_timeout": 5.0,
        "socket_timeout": 5.0,
        "ssl_ca_certs": "ca.pem",
        "ssl_certfile": "c.pem",
        "ssl_keyfile": "k.pem",
        "ssl_cert_reqs": "none",
        "ssl_check_hostname": False,
    }
    plain = Target.of(parser.parse_args(["ls", "--url", "redis://h:1"]))
    assert plain.url == "redis://h:1" and not any(k.startswith("ssl") for k in plain.kwargs)
    assert Target.of(parser.parse_args(["ls", "--url", "rediss://h:1"])).url == "rediss://h:1"


# --------------------------------------------------------------------------- top


async def test_top_plain_lines_when_not_a_terminal(cli: Cli, client: Client) -> None:
    lease = await client.lock("top:plain").acquire()
    owner = client.owner(asyncio.current_task())  # type: ignore[arg-type]
    code, out, _ = await cli("top", "--iterations", "2", "--interval", "0.05")
    assert code == 0
    lines = out.splitlines()
    assert sum("prefix aiolock: 1 held, 0 contended" in x for x in lines) == 2
    rows = [x.split("\t") for x in lines if x.startswith("top:plain\t")]
    assert len(rows) == 2 and rows[0][:3] == ["top:plain", "lock", owner]
    await lease.release()


def _run_in_pty(argv: list[str], columns: int = 200) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as stdin/stdout/stderr; (exit code, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**child_env(), "TERM": "xterm-256color", "COLUMNS": str(columns)}
    with subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env) as proc:
        os.close(slave)
        chunks = []
        try:
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(master)
        code = proc.wait(timeout=60)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.mark.usefixtures("one_backend")
async def test_top_under_a_terminal_shows_the_rich_view(client: Client, url: str) -> None:
    pytest.importorskip("rich")
    lease = await client.lock("top:tty").acquire()
    owner = client.owner(asyncio.current_task())  # type: ignore[arg-type]
    argv = aiolock_argv("top", "--url", url, "--iterations", "3", "--interval", "0.1")
    code, out = await asyncio.to_thread(_run_in_pty, argv)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    assert code == 0, text
    assert "aiolock top · " in text and "1 held, 0 contended" in text
    assert "━" in text or "─" in text  # a rich table, not plain lines
    assert "top:tty" in text and owner in text
    assert str(lease.fencing_token) in text
    await lease.release()


@pytest.mark.usefixtures("one_backend")
async def test_top_exits_0_on_ctrl_c(client: Client, url: str) -> None:
    lease = await client.lock("top:int").acquire()
    proc = await asyncio.create_subprocess_exec(
        *aiolock_argv("top", "--url", url, "--interval", "0.1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        preexec_fn=_default_sigint,
    )
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert b"1 held" in first
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err
    await lease.release()


# --------------------------------------------------------------------------- cluster


async def test_ls_scans_every_master_of_a_cluster(
    cluster: ClusterProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(Client.from_url(cluster.url, lease=SHORT_LEASE))
        by_master: dict[int, str] = {}
        i = 0
        while len(by_master) < len(cluster.masters()):
            name = f"c{i}"
            by_master.setdefault(cluster.master_for_key(main_key("aiolock", name)).port, name)
            i += 1
        assert len(by_master) == 3
        leases = {name: await client.lock(name).acquire() for name in by_master.values()}

        async def run(*args: str) -> tuple[int, str]:
            capsys.readouterr()
            code = await asyncio.to_thread(main, [*args, "--url", cluster.url])
            return code, capsys.readouterr().out

        code, out = await run("ls", "c*", "--json")
        assert code == 0
        doc = json.loads(out)
        assert doc["cluster"] is True and doc["masters"] == 3
        tokens = {p["name"]: p["holders"][0]["token"] for p in doc["locks"]}
        assert tokens == {name: lease.fencing_token for name, lease in leases.items()}
        for name in leases:
            code, out = await run("inspect", name)
            assert code == 0 and f"fencing token {leases[name].fencing_token}" in out
        name = next(iter(leases))
        code, out = await run("force-release", name, "--yes")
        assert code == 0 and f"force-released lock '{name}'" in out
        assert not await client.lock(name).is_locked()
        await eventually(
            lambda: leases[name].lost, what="the holder's loss", timeout=2 * SHORT_LEASE
        )
        for other, lease in leases.items():
            if other != name:
                await lease.release()
