"""A refused command changes nothing (issue 9, item 3).

A value aiolock did not write may sit at one of a primitive's keys (a string
at a semaphore's ``:h``, a hash at the rw lock's ``:rel``...). Every script
then fails before its first write: the command raises, naming the key, and
the keyspace (keys, types, values, expiry times) is exactly as it was. A
refused release leaves the hold as it was, in Redis and in the Client: still
owned (still renewed if the watchdog renews it), and releasable once the key
is fixed.

Each case prepares a state (a free name, a name another Client holds, a hold
of our own), plants a value of the wrong type at one key, snapshots the
keyspace, runs one operation and compares. Holds in these states have fixed
leases of a minute (no watchdog renewal moves an expiry time mid-test).

The fault campaign (issue 20, item 5; test_fault_campaign, at the end) runs
whole cycles instead, for every primitive and every key of its layout in
aiolock/_core/protocol/keys.py: a cycle works, or is refused at its acquire, never
half done (a release refused because a key only it writes held a value of
another type would leave the hold).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import pytest
import redis.asyncio as aioredis

from aiolock import Client, Redlock, WrongTypeError
from aiolock._core.protocol import keys as keys_module
from aiolock._core.protocol.scripts import Script, script_names
from aiolock.testing import seam
from tests.core_util import eventually

# Every key of a name "n" (prefix "t") is "t:{n}" + suffix.
EXPECTED = {  # suffix -> the type aiolock keeps there
    "": "hash",
    ":fence": "hash",
    ":wq": "zset",
    ":q": "zset",
    ":rq": "zset",
    ":h": "zset",
    ":r": "zset",
    ":rel": "list",
    ":signal": "list",
    ":wsignal": "list",
}
HOLD = 60.0  # the fixed lease of every hold a case sets up

Op = Callable[[], Awaitable[object]]
Prepare = Callable[[Client, Client], Awaitable[Op]]


@dataclass(frozen=True)
class Case:
    id: str
    name: str  # the primitive's name (its keys: t:{name}...)
    suffixes: tuple[str, ...]  # auxiliary keys the operation touches
    prepare: Prepare  # sets up the state, returns the operation to refuse


async def _plain_acquire_free(c: Client, o: Client) -> Op:
    return lambda: c.lock("n").acquire(timeout=5, lease=HOLD)


async def _plain_acquire_busy(c: Client, o: Client) -> Op:
    await o.lock("n").acquire(lease=HOLD)
    return lambda: c.lock("n").acquire(timeout=5, lease=HOLD)


async def _plain_release(c: Client, o: Client) -> Op:
    lease = await c.lock("n").acquire(lease=HOLD)
    return lease.release


async def _plain_release_handoff(c: Client, o: Client) -> Op:
    """Another task of the Client waits with a fixed lease: the release is a handoff."""
    lock = c.lock("n")
    lease = await lock.acquire(lease=HOLD)
    waiter = asyncio.create_task(lock.acquire(lease=HOLD))
    await eventually(lambda: c.statistics().waiting == 1, what="the local waiter")

    async def op() -> None:
        try:
            await lease.release()
        finally:
            assert not waiter.done()  # the lock stayed ours: nothing was handed over
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)

    return op


async def _plain_force_release(c: Client, o: Client) -> Op:
    await o.lock("n").acquire(lease=HOLD)
    return c.lock("n").force_release


async def _spin_acquire(c: Client, o: Client) -> Op:
    return lambda: c.spin_lock("n").acquire(timeout=5, lease=HOLD)


async def _spin_release(c: Client, o: Client) -> Op:
    lease = await c.spin_lock("n").acquire(lease=HOLD)
    return lease.release


async def _multi_acquire(c: Client, o: Client) -> Op:
    return lambda: c.multi_lock(c.lock("a"), c.lock("n")).acquire(timeout=5, lease=HOLD)


async def _fair_acquire_free(c: Client, o: Client) -> Op:
    return lambda: c.fair_lock("n").acquire(timeout=5, lease=HOLD)


async def _fair_acquire_busy(c: Client, o: Client) -> Op:
    await o.fair_lock("n").acquire(lease=HOLD)
    return lambda: c.fair_lock("n").acquire(timeout=5, lease=HOLD)


async def _fair_release(c: Client, o: Client) -> Op:
    lease = await c.fair_lock("n").acquire(lease=HOLD)
    return lease.release


async def _fair_force_release(c: Client, o: Client) -> Op:
    await o.fair_lock("n").acquire(lease=HOLD)
    return c.fair_lock("n").force_release


async def _read_acquire(c: Client, o: Client) -> Op:
    return lambda: c.rw_lock("n").read.acquire(timeout=5, lease=HOLD)


async def _read_acquire_behind_writer(c: Client, o: Client) -> Op:
    await o.rw_lock("n").write.acquire(lease=HOLD)
    return lambda: c.rw_lock("n").read.acquire(timeout=5, lease=HOLD)


async def _write_acquire(c: Client, o: Client) -> Op:
    return lambda: c.rw_lock("n").write.acquire(timeout=5, lease=HOLD)


async def _write_acquire_behind_reader(c: Client, o: Client) -> Op:
    await o.rw_lock("n").read.acquire(lease=HOLD)
    return lambda: c.rw_lock("n").write.acquire(timeout=5, lease=HOLD)


async def _read_release(c: Client, o: Client) -> Op:
    lease = await c.rw_lock("n").read.acquire(lease=HOLD)
    return lease.release


async def _write_release(c: Client, o: Client) -> Op:
    lease = await c.rw_lock("n").write.acquire(lease=HOLD)
    return lease.release


async def _rw_force_release(c: Client, o: Client) -> Op:
    await o.rw_lock("n").write.acquire(lease=HOLD)
    return c.rw_lock("n").write.force_release


async def _rw_force_release_read(c: Client, o: Client) -> Op:
    await o.rw_lock("n").read.acquire(lease=HOLD)
    return c.rw_lock("n").read.force_release


async def _sem_acquire(c: Client, o: Client) -> Op:
    await o.semaphore("n", 3).acquire(lease=HOLD)
    return lambda: c.semaphore("n", 3).acquire(timeout=5, lease=HOLD)


async def _sem_acquire_full(c: Client, o: Client) -> Op:
    await o.semaphore("n", 3).acquire(3, lease=HOLD)
    return lambda: c.semaphore("n", 3).acquire(timeout=5, lease=HOLD)


async def _sem_release(c: Client, o: Client) -> Op:
    await o.semaphore("n", 3).acquire(lease=HOLD)
    permit = await c.semaphore("n", 3).acquire(lease=HOLD)
    return permit.release


async def _sem_set_permits(c: Client, o: Client) -> Op:
    await o.semaphore("n", 3).acquire(lease=HOLD)
    return lambda: c.semaphore("n", 3).set_permits(5)


async def _sem_force_release(c: Client, o: Client) -> Op:
    await o.semaphore("n", 3).acquire(lease=HOLD)
    return c.semaphore("n", 3).force_release


async def _latch_count_down(c: Client, o: Client) -> Op:
    assert await c.latch("n", 1).try_set_count()
    return c.latch("n", 1).count_down


async def _latch_count_down_last(c: Client, o: Client) -> Op:
    assert await c.latch("n", 2).try_set_count()
    await c.latch("n", 2).count_down()
    return c.latch("n", 2).count_down


LOCK_RELEASE = (":fence", ":signal", ":wq")
CASES = [
    Case("lock-acquire-free", "n", (":fence", ":wq"), _plain_acquire_free),
    Case("lock-acquire-busy", "n", (":fence", ":wq"), _plain_acquire_busy),
    Case("lock-release", "n", LOCK_RELEASE, _plain_release),
    Case("lock-release-handoff", "n", LOCK_RELEASE, _plain_release_handoff),
    Case("lock-force_release", "n", LOCK_RELEASE, _plain_force_release),
    Case("spin-acquire", "n", (":fence", ":wq"), _spin_acquire),
    Case("spin-release", "n", LOCK_RELEASE, _spin_release),
    Case("multi-acquire", "n", (":fence",), _multi_acquire),
    Case("fair-acquire-free", "n", (":fence", ":q"), _fair_acquire_free),
    Case("fair-acquire-busy", "n", (":fence", ":q"), _fair_acquire_busy),
    Case("fair-release", "n", (":fence", ":q"), _fair_release),
    Case("fair-force_release", "n", (":fence", ":q"), _fair_force_release),
    Case("read-acquire", "n", (":fence", ":wq", ":rq"), _read_acquire),
    Case("read-acquire-behind-writer", "n", (":fence", ":wq", ":rq"), _read_acquire_behind_writer),
    Case("write-acquire", "n", (":fence", ":wq"), _write_acquire),
    Case("write-acquire-behind-reader", "n", (":fence", ":wq"), _write_acquire_behind_reader),
    Case("read-release", "n", (":rel", ":wsignal"), _read_release),
    Case(
        "write-release",
        "n",
        (":rel", ":wq", ":rq", ":signal", ":wsignal"),
        _write_release,
    ),
    Case("write-force_release", "n", (":wq", ":rq", ":signal", ":wsignal"), _rw_force_release),
    Case("read-force_release", "n", (":wq", ":rq", ":signal", ":wsignal"), _rw_force_release_read),
    Case("sem-acquire", "n", (":h", ":fence", ":signal"), _sem_acquire),
    Case("sem-acquire-full", "n", (":h", ":fence", ":signal"), _sem_acquire_full),
    Case("sem-release", "n", (":h", ":r", ":signal"), _sem_release),
    Case("sem-set_permits", "n", (":h", ":signal"), _sem_set_permits),
    Case("sem-force_release", "n", (":h", ":signal"), _sem_force_release),
    Case("latch-count_down", "n", (":signal",), _latch_count_down),
    Case("latch-count_down-not-last", "n", (":signal",), _latch_count_down_last),
]


def _params() -> list[Any]:
    out = []
    for case in CASES:
        for suffix in case.suffixes:
            # A string (no aiolock key is one), and a container of another type.
            other = "hash" if EXPECTED[suffix] != "hash" else "list"
            for planted in ("string", other):
                out.append(pytest.param(case, suffix, planted, id=f"{case.id}-{suffix}-{planted}"))
    return out


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {"prefix": "t"}


@pytest.fixture
async def admin(url: str) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(url)
    try:
        yield r
    finally:
        await r.aclose()


Snapshot = dict[bytes, tuple[bytes, bytes | None, int]]


async def snapshot(r: aioredis.Redis) -> Snapshot:
    """Every key: type, serialized value, absolute expiry time (ms, -1: none)."""
    out: Snapshot = {}
    for key in sorted(await r.keys("*")):
        out[key] = (
            await r.type(key),
            await r.dump(key),
            int(await r.execute_command("PEXPIRETIME", key)),
        )
    return out


async def plant(r: aioredis.Redis, key: str, kind: str) -> None:
    if kind == "string":
        await r.set(key, "planted")
    elif kind == "hash":
        await r.hset(key, "planted", "1")
    else:
        await r.rpush(key, "planted")


async def settled(*clients: Client) -> None:
    """Nothing of these Clients is on the wire or running in the background."""
    await eventually(
        lambda: not any(c.statistics().in_flight or c.statistics().background for c in clients),
        what="the Clients to settle",
    )


def names_key(exc: BaseException, key: str) -> bool:
    """The error (or the redis-py error it wraps) names the key."""
    return key in str(exc) or (exc.__cause__ is not None and key in str(exc.__cause__))


@pytest.mark.parametrize(("case", "suffix", "planted"), _params())
async def test_refused_command_changes_nothing(
    client: Client,
    other_client: Client,
    admin: aioredis.Redis,
    case: Case,
    suffix: str,
    planted: str,
) -> None:
    op = await case.prepare(client, other_client)
    key = f"t:{{{case.name}}}{suffix}"
    await admin.delete(key)
    await plant(admin, key, planted)
    before = await snapshot(admin)
    with pytest.raises(Exception) as info:  # any error for now: typed by the errors work
        await op()
    assert names_key(info.value, key), f"the error does not name {key}: {info.value!r}"
    await settled(client, other_client)
    assert await snapshot(admin) == before
    assert client.statistics().waiting == 0  # a refused acquire leaves no waiter


@pytest.mark.parametrize("local_waiter", [False, True], ids=["release", "handoff"])
async def test_refused_release_keeps_the_hold(
    url: str, admin: aioredis.Redis, local_waiter: bool
) -> None:
    """The hold stays the caller's, in Redis and in the Client: the watchdog
    still renews it, and once the key is fixed the release goes through (with
    another task of the Client waiting, the release is a handoff to it)."""
    async with Client.from_url(url, prefix="t", lease=4.5) as client:
        await _refused_release_keeps_the_hold(client, admin, local_waiter)


async def _refused_release_keeps_the_hold(
    client: Client, admin: aioredis.Redis, local_waiter: bool
) -> None:
    lock = client.lock("n")
    lease = await lock.acquire()
    waiter = asyncio.create_task(lock.acquire(lease=HOLD)) if local_waiter else None
    if waiter is not None:
        await eventually(lambda: client.statistics().waiting == 1, what="the local waiter")
    await admin.set("t:{n}:fence", "planted")
    with pytest.raises(Exception) as info:  # any error for now: typed by the errors work
        await lease.release()
    assert names_key(info.value, "t:{n}:fence")
    await settled(client)
    assert not lease.lost and not lease.released
    assert await lock.is_owned()
    assert waiter is None or not waiter.done()
    expiry = await admin.execute_command("PEXPIRETIME", "t:{n}")
    rounds = seam.watchdog_rounds(client)
    await eventually(lambda: seam.watchdog_rounds(client) >= rounds + 2, what="2 renewal rounds")
    assert await admin.execute_command("PEXPIRETIME", "t:{n}") > expiry  # still renewed
    assert not lease.lost
    await admin.delete("t:{n}:fence")
    await lease.release()
    assert lease.released
    if waiter is not None:
        handed = await asyncio.wait_for(waiter, 10)
        assert await admin.hexists("t:{n}", handed._hold.owner)
        await handed.release()
    assert await admin.exists("t:{n}") == 0


async def test_refused_read_release_keeps_the_hold(
    client: Client, other_client: Client, admin: aioredis.Redis
) -> None:
    """The issue's case: a wrong type at the rw lock's :rel key. The read hold
    stays, and a writer gets in as soon as the key is fixed and it is released."""
    rw = client.rw_lock("n")
    lease = await rw.read.acquire()
    await admin.hset("t:{n}:rel", "planted", "1")
    with pytest.raises(Exception) as info:  # any error for now: typed by the errors work
        await lease.release()
    assert names_key(info.value, "t:{n}:rel")
    await settled(client)
    assert not lease.lost and not lease.released
    assert await rw.read.is_owned()
    with pytest.raises(WrongTypeError):  # a writer's cycle would write :rel too: refused
        await other_client.rw_lock("n").write.try_acquire()
    await admin.delete("t:{n}:rel")
    assert await other_client.rw_lock("n").write.try_acquire() is None
    await lease.release()
    writer = await other_client.rw_lock("n").write.try_acquire()
    assert writer is not None
    await writer.release()


@pytest.mark.parametrize("planted", ["string", "list"])
async def test_batch_renewal_skips_a_key_of_another_type(
    client: Client, admin: aioredis.Redis, planted: str
) -> None:
    """The watchdog's batch renewal does not fail on a key someone overwrote:
    that hold is reported gone, the others of the batch are renewed."""
    kept = (await client.lock("kept").acquire(lease=HOLD))._hold
    gone = (await client.lock("gone").acquire(lease=HOLD))._hold
    await admin.delete("t:{gone}")
    await plant(admin, "t:{gone}", planted)
    reply = await seam.run_script(
        client,
        "renew",
        ("t:{gone}", "t:{kept}"),
        (int(HOLD * 2000), *gone.renew_args, *kept.renew_args),
    )
    assert [int(x) for x in reply] == [0, 1]
    assert await admin.pttl("t:{kept}") > HOLD * 1000
    assert await admin.type("t:{gone}") == planted.encode()


# Scripts the operations above do not reach (or only on rare paths), run directly.
# (script, key suffixes in KEYS order, ARGV, a state that gives it something to write)
DIRECT: list[tuple[str, tuple[str, ...], tuple[Any, ...], tuple[tuple[Any, ...], ...]]] = [
    (
        "unwait",
        ("", ":fence", ":signal", ":wq"),
        ("ab:1|7|0", 60000, "t:{d}:ch", "t:{d}:w:"),
        (("ZADD", "t:{d}:wq", 2**40, "ab:1|7|0"),),
    ),
    (
        "fair_leave",
        ("", ":fence", ":q"),
        ("ab:1:1:60000:30000:l", 60000, "t:{d}:ch:", "t:{d}:sig:"),
        (("ZADD", "t:{d}:q", 1, "ab:1:1:60000:30000:l", -(2**40), "~ab"),),
    ),
    (
        "rw_unwait",
        (":wq", "", ":rq", ":signal", ":wsignal"),
        ("ab:1#n1", "t:{d}:ch", "t:{d}:wch"),
        (("ZADD", "t:{d}:wq", 2**40, "ab:1#n1"), ("ZADD", "t:{d}:rq", 2**40, "cd")),
    ),
    ("sem_state", ("", ":h", ":signal"), (3, 60000, "t:{d}:ch"), ()),
    ("latch_set", ("",), (2, 60000), ()),
    ("latch_check", ("",), (60000,), ()),
]


@pytest.mark.parametrize(
    ("script", "suffixes", "args", "state", "bad"),
    [
        pytest.param(script, suffixes, args, state, i, id=f"{script}-{suffixes[i] or 'main'}")
        for script, suffixes, args, state in DIRECT
        for i in range(len(suffixes))
    ],
)
async def test_refused_script_changes_nothing(
    client: Client,
    admin: aioredis.Redis,
    script: str,
    suffixes: tuple[str, ...],
    args: tuple[Any, ...],
    state: tuple[tuple[Any, ...], ...],
    bad: int,
) -> None:
    for command in state:
        await admin.execute_command(*command)
    keys = tuple(f"t:{{d}}{suffix}" for suffix in suffixes)
    await admin.delete(keys[bad])
    await plant(admin, keys[bad], "string")
    before = await snapshot(admin)
    with pytest.raises(Exception) as info:  # any error for now: typed by the errors work
        await seam.run_script(client, script, keys, args)
    assert names_key(info.value, keys[bad])
    assert await snapshot(admin) == before


# The batch renewals never fail: (script, ARGV after lease_ms for two entries).
RENEWALS = [
    ("renew", ("ab:1", "1", "ab:2", "2")),
    ("rw_renew", ("w", "ab:1", "1", "r", "ab:2", "2")),
    ("sem_renew", ("1|ab", "1|cd")),
    ("fair_live", ("ab", "cd")),
    ("rw_renew_wait", ("ab:1#n", "ab:2#n")),
]


@pytest.mark.parametrize(("script", "args"), RENEWALS, ids=[r[0] for r in RENEWALS])
async def test_renewal_never_fails_on_a_key_of_another_type(
    client: Client, admin: aioredis.Redis, script: str, args: tuple[str, ...]
) -> None:
    await admin.set("t:{x}", "planted")
    await admin.rpush("t:{y}", "planted")
    before = await snapshot(admin)
    reply = await seam.run_script(client, script, ("t:{x}", "t:{y}"), (60000, *args))
    assert [int(x) for x in reply] == [0, 0]
    assert await snapshot(admin) == before


# Scripts that only read (their snippets' write helpers are never called).
READ_ONLY = {"owned", "rw_owned", "rw_state", "probe"}  # (probe: writes no key)


#: How a script's own code may begin: a type check of its keys (_types.lua),
#: or a typed read that fails before any write and names the key (the hot
#: path of the plain lock: no TYPE per key, see acquire.lua / release.lua).
FIRST_CHECKS = (
    "check_types(KEYS",
    "check_all(KEYS",
    "local kind = redis.call('TYPE', lock)",
    "local hold = typed(",
    "if typed(",
    "for i = 1, n do",  # multi_acquire: check_types per lock, first
)


def _own_code(name: str) -> list[str]:
    """The script's own statements (its file, without comments, includes and
    the naming of KEYS / ARGV)."""
    text = resources.files("aiolock").joinpath("scripts", f"{name}.lua").read_text("utf-8")
    return [
        line
        for line in text.splitlines()
        if line.strip()
        and not line.startswith("--")
        and not re.match(r"local [\w, ]+ = (KEYS|ARGV|tonumber\(ARGV|#KEYS)", line)
    ]


@pytest.mark.parametrize("name", sorted(set(script_names()) - READ_ONLY))
def test_every_writing_script_checks_its_keys_first(name: str) -> None:
    """A script that writes checks its keys' types before any code of its own
    runs (check_types / check_all, or a typed read that precedes every write),
    or never fails on them (is_type / read_typed)."""
    source = Script.from_file(name).source
    if "is_type(" in source.split("local function is_type")[1] or "read_typed('" in source:
        return  # the batch renewals: never fail
    first = _own_code(name)[0]
    assert first.startswith(FIRST_CHECKS), (name, first)
    if first.startswith("for i = 1, n do"):
        assert _own_code(name)[1].strip().startswith("check_types("), name


async def test_fair_handoff_skips_a_signal_key_of_another_type(
    client: Client, admin: aioredis.Redis
) -> None:
    """The list-mode signal key of the Client a fair lock is handed to is only
    known after the release's first write: a value of another type there is
    skipped (that Client is not told), the release goes through."""
    holder, waiter = "aa:1:1:60000:30000:p", "bb:1:1:60000:30000:l"
    await admin.hset("t:{f}", mapping={holder: 1, "~fence": 5})
    await admin.zadd("t:{f}:q", {waiter: 1, "~bb": -(2**45)})
    await admin.set("t:{f}:sig:bb", "planted")
    code = await seam.run_script(
        client,
        "fair_release",
        ("t:{f}", "t:{f}:fence", "t:{f}:q"),
        (holder, 5, 60000, "t:{f}:ch:", "t:{f}:sig:"),
    )
    assert int(code) == 1
    assert await admin.hexists("t:{f}", waiter)  # handed over
    assert await admin.get("t:{f}:sig:bb") == b"planted"


# --------------------------------------------------------------------------- the fault campaign
# For every primitive and every key of its layout (aiolock/_core/protocol/keys.py: a
# key added there is planted here too), a value of another type is planted at
# that key of a name nobody used yet, then a whole cycle runs: Client A takes
# the primitive, Client B (list mode: signal lists) and Client C (pub/sub:
# waiting sets, grants) wait for it, A lets go, B and C take it in turn and
# let go. A cycle either works, or its acquire is refused (WrongTypeError)
# having changed nothing; a release is never refused (the hold would stay).
# Afterwards the planted key is as it was, and every other key left is one
# the same cycle leaves on a name without a planted key (fence counters,
# released-token records, wake-up lists).


#: The type aiolock keeps in each key field of the keys.py descriptions. A new
#: key field fails test_every_key_field_is_known until it is listed here.
KEY_TYPES = {
    "main": "hash",
    "fence": "hash",
    "signal": "list",
    "wq": "zset",
    "queue": "zset",
    "rq": "zset",
    "rel": "list",
    "wsignal": "list",
    "holders": "zset",
    "released": "zset",
    "lock": "string",
    "generation": "string",
    "roster": "set",
    "signal_prefix": "list",  # a template: + client id is a Client's list (FairKeys)
}
#: String fields that name no Redis key: the Engine's local state key, and
#: the templates of channels (+ client id).
NOT_KEYS = {"local", "wait_prefix", "channel_prefix"}
#: Fields that are templates of a key: + the waiting Client's id.
KEY_TEMPLATES = {"signal_prefix"}
CAMPAIGN_HOLD = 30.0  # every hold's fixed lease: no renewal moves an expiry time


def key_fields(layout: object) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(layout)  # type: ignore[arg-type]
        if isinstance(getattr(layout, f.name), str) and f.name not in NOT_KEYS
    ]


def test_every_key_field_is_known() -> None:
    kinds = [
        keys_module.LockKeys,
        keys_module.FairKeys,
        keys_module.RWKeys,
        keys_module.SemaphoreKeys,
        keys_module.LatchKeys,
        keys_module.RedlockKeys,
    ]
    assert {cls.__name__ for cls in kinds} == {n for n in keys_module.__all__ if n.endswith("Keys")}
    for cls in kinds:
        for field in key_fields(cls.of("t", "n")):
            assert field in KEY_TYPES, f"{cls.__name__}.{field}: list its type in KEY_TYPES"


Release = Callable[[], Awaitable[object]]
Take = Callable[[Any], Awaitable[Release]]


async def _take_lease(primitive: Any) -> Release:
    lease = await primitive.acquire(lease=CAMPAIGN_HOLD)
    return lease.release  # type: ignore[no-any-return]


async def _latch_hold(latch: Any) -> Release:
    assert await latch.try_set_count()
    return latch.count_down  # type: ignore[no-any-return]


async def _latch_wait(latch: Any) -> Release:
    assert await latch.wait()

    async def nothing() -> None:
        return None

    return nothing


@dataclass(frozen=True)
class Primitive:
    id: str
    layouts: tuple[Any, ...]  # keys.py descriptions whose keys are planted
    hold: Callable[[Client], Any]  # what A takes (the primitive object of a Client)
    wait: Callable[[Client], Any]  # what B and C wait for (the same, or what A's hold keeps out)
    take_hold: Take = _take_lease
    take_wait: Take = _take_lease


PRIMITIVES = [
    Primitive("lock", (keys_module.LockKeys,), lambda c: c.lock("n"), lambda c: c.lock("n")),
    Primitive(
        "spin", (keys_module.LockKeys,), lambda c: c.spin_lock("n"), lambda c: c.spin_lock("n")
    ),
    Primitive(
        "multi",
        (keys_module.LockKeys,),
        lambda c: c.multi_lock(c.lock("a"), c.lock("n")),
        lambda c: c.multi_lock(c.lock("a"), c.lock("n")),
    ),
    Primitive(
        "fair", (keys_module.FairKeys,), lambda c: c.fair_lock("n"), lambda c: c.fair_lock("n")
    ),
    # readers wait for a writer
    Primitive(
        "read", (keys_module.RWKeys,), lambda c: c.rw_lock("n").write, lambda c: c.rw_lock("n").read
    ),
    # writers wait for a reader
    Primitive(
        "write",
        (keys_module.RWKeys,),
        lambda c: c.rw_lock("n").read,
        lambda c: c.rw_lock("n").write,
    ),
    Primitive(
        "semaphore",
        (keys_module.SemaphoreKeys,),
        lambda c: c.semaphore("n", 1),
        lambda c: c.semaphore("n", 1),
    ),
    Primitive(
        "latch",
        (keys_module.LatchKeys,),
        lambda c: c.latch("n", 1),
        lambda c: c.latch("n", 1),
        _latch_hold,
        _latch_wait,
    ),
    Primitive(  # one master per Redlock: its keys and scripts are those of N masters
        "redlock",
        (keys_module.RedlockKeys,),
        lambda c: Redlock([c]).lock("n"),
        lambda c: Redlock([c]).lock("n"),
    ),
]


def _campaign_params() -> list[Any]:
    out = []
    for prim in PRIMITIVES:
        for layout in prim.layouts:
            for field in key_fields(layout.of("t", "n")):
                want = KEY_TYPES[field]
                # A string (no aiolock key but Redlock's is one), and a hash
                # where a list is expected (a list-typed read of it fails too).
                kinds = ("string",) if want != "string" else ("hash",)
                for planted in kinds + (("hash",) if want == "list" else ()):
                    out.append(
                        pytest.param(prim, field, planted, id=f"{prim.id}-{field}-{planted}")
                    )
    return out


async def plant_any(r: aioredis.Redis, key: str, kind: str) -> None:
    if kind == "zset":
        await r.zadd(key, {"planted": 1})
    elif kind == "set":
        await r.sadd(key, "planted")
    else:
        await plant(r, key, kind)


class Cycle:
    """One campaign cycle of Clients a (pub/sub), b (list mode), c (pub/sub)."""

    def __init__(self, admin: aioredis.Redis, clients: list[Client]) -> None:
        self.admin = admin
        self.clients = clients
        self.refused: list[str] = []

    async def acquire(self, who: str, take: Take, primitive: Any) -> Release | None:
        """An acquisition: it works, or it is refused having changed nothing."""
        before = await snapshot(self.admin)
        try:
            return await take(primitive)
        except WrongTypeError:
            await settled(*self.clients)
            assert await snapshot(self.admin) == before, f"{who}'s refused acquire changed keys"
            self.refused.append(who)
            return None

    async def wait(self, who: str, take: Take, primitive: Any) -> Release | None:
        """A waiting acquisition (the lock is busy): refused, or it gets the
        lock later and lets it go at once."""
        try:
            release = await take(primitive)
        except WrongTypeError:
            self.refused.append(who)
            return None
        await release()  # at once: the other waiter waits for it
        return release

    async def run(self, prim: Primitive) -> None:
        a, b, c = self.clients
        release_a = await self.acquire("A", prim.take_hold, prim.hold(a))
        if release_a is None:
            return
        waiters = []
        for who, client in (("B", b), ("C", c)):
            primitive = prim.wait(client)
            task = asyncio.create_task(self.wait(who, prim.take_wait, primitive))
            # It waits (parked, or queued behind the holder), or was refused.
            await eventually(
                lambda t=task, p=primitive: t.done() or p.statistics().waiting > 0,  # type: ignore[misc]
                what=f"{who} to wait",
            )
            waiters.append(task)
        await release_a()
        await asyncio.gather(*waiters)
        await settled(*self.clients)


_BASELINES: dict[tuple[str, str], set[bytes]] = {}


async def _baseline(
    prim: Primitive, admin: aioredis.Redis, make_client: Any, url: str
) -> set[bytes]:
    """The keys a clean cycle leaves (prefix "b"), by their name under prefix "t"."""
    if (prim.id, url) not in _BASELINES:
        clients = [
            await make_client(prefix="b"),
            await make_client(prefix="b", notify="list"),
            await make_client(prefix="b"),
        ]
        cycle = Cycle(admin, clients)
        async with asyncio.timeout(30):
            await cycle.run(prim)
        assert cycle.refused == []
        left = {b"t:" + bytes(key)[2:] for key in await admin.keys("b:*")}
        if prim.id != "latch":  # nothing held: a kept hold shows (a latch keeps its hash)
            assert not left & {b"t:{n}", b"t:{n}:h", b"t:{n}:rl"}
        await admin.delete(*await admin.keys("b:*"))
        _BASELINES[prim.id, url] = left
    return _BASELINES[prim.id, url]


@pytest.mark.parametrize(("prim", "field", "planted"), _campaign_params())
async def test_fault_campaign(
    url: str,
    make_client: Any,
    admin: aioredis.Redis,
    prim: Primitive,
    field: str,
    planted: str,
) -> None:
    baseline = await _baseline(prim, admin, make_client, url)
    clients = [
        await make_client(prefix="t"),
        await make_client(prefix="t", notify="list"),
        await make_client(prefix="t"),
    ]
    layout = next(
        layout.of("t", "n") for layout in prim.layouts if field in key_fields(layout.of("t", "n"))
    )
    key = getattr(layout, field)
    if field in KEY_TEMPLATES:
        key += clients[1].id  # the list-mode Client's own key
    await plant_any(admin, key, planted)
    before = await snapshot(admin)
    cycle = Cycle(admin, clients)
    async with asyncio.timeout(30):
        await cycle.run(prim)
    after = await snapshot(admin)
    assert after.get(key.encode()) == before[key.encode()], "the planted key changed"
    left = set(after) - {key.encode()}
    assert left <= baseline, f"refused {cycle.refused}; left behind: {sorted(left - baseline)}"
    if prim.id == "latch" and field != "main":  # not left counting
        assert not await admin.hexists("t:{n}", "c")
    if cycle.refused and cycle.refused[0] == "A":
        assert after == before
