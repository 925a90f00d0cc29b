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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis

from aiolock import Client
from aiolock._core.scripts import Script, script_names
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
    rounds = client._engine.watchdog.rounds
    await eventually(lambda: client._engine.watchdog.rounds >= rounds + 2, what="2 renewal rounds")
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
    assert await other_client.rw_lock("n").write.try_acquire() is None
    await admin.delete("t:{n}:rel")
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
    reply = await client._engine.eval(
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
        await client._engine.eval(script, keys, args)
    assert names_key(info.value, keys[bad])
    assert await snapshot(admin) == before


# The batch renewals never fail: (script, ARGV after lease_ms for two entries).
RENEWALS = [
    ("renew", ("ab:1", "1", "ab:2", "2")),
    ("fair_renew", ("ab:1:1:1:1:p", "1", "ab:2:1:1:1:p", "2")),
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
    reply = await client._engine.eval(script, ("t:{x}", "t:{y}"), (60000, *args))
    assert [int(x) for x in reply] == [0, 0]
    assert await snapshot(admin) == before


# Scripts that only read (their snippets' write helpers are never called).
READ_ONLY = {"owned", "fair_owned", "rw_owned", "rw_state"}


@pytest.mark.parametrize("name", sorted(set(script_names()) - READ_ONLY))
def test_every_writing_script_checks_its_keys_first(name: str) -> None:
    """A script that writes checks its keys' types before any code of its own
    runs (check_types / check_all), or never fails on them (is_type)."""
    source = Script.from_file(name).source
    body = source[source.index("local function is_type") :]
    body = body[body.index("\nend\n") + 5 :]  # the script's own code, after the snippets
    first = body.lstrip().splitlines()[0] if "is_type(" not in body else "is_type"
    assert first.startswith(("check_types(KEYS", "check_all(KEYS")) or first == "is_type", name


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
    code = await client._engine.eval(
        "fair_release",
        ("t:{f}", "t:{f}:fence", "t:{f}:q"),
        (holder, 5, 60000, "t:{f}:ch:", "t:{f}:sig:"),
    )
    assert int(code) == 1
    assert await admin.hexists("t:{f}", waiter)  # handed over
    assert await admin.get("t:{f}:sig:bb") == b"planted"
