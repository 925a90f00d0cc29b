"""Redis Functions (``scripting="functions"`` / ``"auto"``, issue 23), on real servers.

* Every primitive's basic path runs as FCALLs of one versioned library, and
  no EVALSHA is sent (lock, fair, rw, semaphore, spin, latch, multi, the
  watchdog's renewal, fencing tokens).
* Two library versions side by side on one server: both work, and exclude
  each other (the same keys).
* The library lost (FUNCTION FLUSH, a restart without persistence) is loaded
  again by the first call that finds it missing, once.
* An ACL user with ``-eval -evalsha -script -function +fcall``: ``auto``
  switches to Functions, and before the library is loaded the error names
  ``aiolock functions load``; the CLI loads it (idempotent), then the
  FCALL-only user works; a cancelled first call leaves nothing behind.
* A server without Functions (FCALL and FUNCTION renamed away, as on Redis
  6): UnsupportedServerError, nothing written.
* A cluster: the CLI loads the cluster library on every master, and a
  Client runs there without a "Function not found".
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from typing import Any

import pytest
import redis.asyncio

import aiolock.cli
from aiolock import (
    Client,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ServerRefusedError,
    UnsupportedServerError,
)
from aiolock._core.protocol import functions
from aiolock._core.protocol.functions import library_text
from aiolock._core.protocol.scripts import load_scripts
from tests.cluster_servers import ClusterProcess
from tests.conftest import kind_and_binary
from tests.core_util import assert_clean, evalsha_calls, eventually
from tests.replication_servers import ReplicatedPair
from tests.servers import RedisServer, ServerProcess


def libraries(server: Any) -> set[str]:
    """The names of the Functions libraries ``server`` has."""
    listed = server.execute("FUNCTION", "LIST")
    names = set()
    for lib in listed:
        fields = dict(zip(lib[::2], lib[1::2], strict=True))
        name = fields.get("library_name", fields.get(b"library_name"))
        names.add(name.decode() if isinstance(name, bytes) else name)
    return names


def not_found(server: Any) -> int:
    """FCALLs the server refused (the only failures here: "Function not found")."""
    stats = server.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("failed_calls", 0))


def ours(cluster: bool = False) -> str:
    return library_text(load_scripts(cluster=cluster)).name


def cli(*argv: str) -> tuple[int, str]:
    """``aiolock ...`` in this process (its own event loop: call it in a thread)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = aiolock.cli.main(list(argv))
    return code, out.getvalue()


async def test_every_primitive_runs_as_functions(server: RedisServer) -> None:
    server.execute("FUNCTION", "FLUSH")
    evals = evalsha_calls(server)
    refused = not_found(server)  # the shared server's count since it started
    async with (
        Client.from_url(server.url, scripting="functions", lease=3.0) as one,
        Client.from_url(server.url, scripting="functions") as two,
    ):
        # A lock, contended: the release (FCALL) wakes the other Client's waiter.
        lease = await one.lock("l").acquire()
        waiter = asyncio.create_task(two.lock("l").acquire(timeout=30))
        await eventually(lambda: server.execute("EXISTS", "aiolock:{l}:wq") == 1, what="queued")
        first = lease.fencing_token
        await lease.release()
        second = await waiter
        assert second.fencing_token > first
        await second.release()
        # The watchdog renews through FCALL: the TTL falls, then is set back.
        async with one.lock("w") as held:
            start = server.execute("PTTL", "aiolock:{w}")
            await eventually(
                lambda: server.execute("PTTL", "aiolock:{w}") < start - 200, what="decay"
            )
            low = server.execute("PTTL", "aiolock:{w}")
            await eventually(lambda: server.execute("PTTL", "aiolock:{w}") > low, what="a renewal")
            assert not held.lost
        async with one.fair_lock("f") as fair:
            assert await one.fair_lock("f").is_owned() and not fair.lost
            assert await two.fair_lock("f").try_acquire() is None
        rw = one.rw_lock("rw")
        async with rw.read:  # (is_owned, is_locked: the no-writes functions)
            assert await rw.read.is_owned() and await two.rw_lock("rw").read.is_locked()
            assert await two.rw_lock("rw").write.try_acquire() is None
            shared = await two.rw_lock("rw").read.try_acquire()
            assert shared is not None
            await shared.release()
        async with rw.write:
            assert await two.rw_lock("rw").read.try_acquire() is None
        sem = one.semaphore("s", 2)
        async with sem, two.semaphore("s", 2):
            assert await sem.try_acquire() is None
        async with one.spin_lock("sp"):
            assert await two.spin_lock("sp").try_acquire() is None
        async with one.multi_lock(one.lock("m1"), one.lock("m2")):
            assert await two.lock("m2").try_acquire() is None
        latch = one.latch("c", 1)
        assert await latch.try_set_count()
        assert await two.latch("c", 1).count_down() == 0
        await latch.wait(timeout=30)
        assert await one.lock("l").is_locked() is False
        await assert_clean(one, two)
    assert evalsha_calls(server) == evals, "no EVALSHA in functions mode"
    assert libraries(server) == {ours()}
    assert not_found(server) - refused == 1, "loaded once, by the first call that found it missing"


async def test_acknowledged_lane_and_the_replica(replicated_pair: ReplicatedPair) -> None:
    """``replicas=1``: the acquisitions' FCALLs are acknowledged; the library
    loaded on the master reaches the replica (a promoted one has it)."""
    master = replicated_pair.master
    master.execute("FUNCTION", "FLUSH")
    async with Client.from_url(
        master.url, scripting="functions", replicas=1, replica_timeout=5.0
    ) as client:
        async with client.lock("a") as lease:
            assert lease.fencing_token > 0
        await assert_clean(client)
    await eventually(
        lambda: libraries(replicated_pair.replica) == {ours()}, what="the library replicated"
    )


async def test_two_versions_side_by_side(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Client.from_url(server.url, scripting="functions") as current:
        monkeypatch.setattr(functions, "VERSION", "9.9.9-next")
        async with Client.from_url(server.url, scripting="functions") as other:
            async with current.lock("v") as lease:
                assert await other.lock("v").try_acquire() is None
            async with other.lock("v") as later:
                assert later.fencing_token > lease.fencing_token
                assert await current.lock("v").try_acquire() is None
            await assert_clean(current, other)
    found = libraries(server)
    assert ours() in found
    assert any(name.startswith("aiolock_9_9_9_next_") for name in found), found


async def test_reload_after_flush_and_restart(fresh_server: ServerProcess) -> None:
    async with Client.from_url(fresh_server.url, scripting="functions") as client:
        lock = client.lock("r")
        async with lock:
            pass
        assert not_found(fresh_server) == 1
        fresh_server.execute("FUNCTION", "FLUSH")
        async with lock:  # acquire and release: found missing once, loaded again
            pass
        assert not_found(fresh_server) == 2
        await asyncio.to_thread(fresh_server.restart)
        async with lock:  # a restart without persistence lost it too
            pass
        assert libraries(fresh_server) == {ours()}
        assert not_found(fresh_server) == 1  # (the restart reset the counts)
        # An acquire cancelled after each number of loop turns while the
        # library is missing (FCALL refused, then loaded and sent again):
        # nothing is left, and the next acquire works.
        for turns in range(6):
            fresh_server.execute("FUNCTION", "FLUSH")
            task = asyncio.create_task(lock.acquire())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await (await task).release()
            await assert_clean(client)
            await eventually(
                lambda: fresh_server.execute("EXISTS", "aiolock:{r}") == 0, what="undone"
            )
            async with lock:
                pass
        await assert_clean(client)


async def test_out_of_memory_as_with_eval(fresh_server: ServerProcess) -> None:
    """Under maxmemory (noeviction) an acquire is refused (OOM, nothing
    taken), and a release and a renewal still run (``allow-oom``), as their
    EVAL forms do: a hold is never stranded by a full server."""
    async with Client.from_url(fresh_server.url, scripting="functions") as client:
        lease = await client.lock("held").acquire()
        fresh_server.execute("CONFIG", "SET", "maxmemory-policy", "noeviction")
        fresh_server.execute("CONFIG", "SET", "maxmemory", "1")
        try:
            with pytest.raises(ServerRefusedError) as info:
                await client.lock("new").acquire(timeout=30)
            assert info.value.code == "OOM"
            assert fresh_server.execute("EXISTS", "aiolock:{new}") == 0
            await lease.extend(60)  # the renewal function
            assert fresh_server.execute("PTTL", "aiolock:{held}") > 30_000
            await lease.release()
            assert fresh_server.execute("EXISTS", "aiolock:{held}") == 0
        finally:
            fresh_server.execute("CONFIG", "SET", "maxmemory", "0")
        await assert_clean(client)


async def test_fcall_only_user_needs_the_operator_load(fresh_server: ServerProcess) -> None:
    fresh_server.execute(
        "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all",
        "-eval", "-evalsha", "-script", "-function", "+fcall",
    )  # fmt: skip
    url = fresh_server.url.replace("redis://", "redis://limited:pw@")
    async with Client.from_url(url) as client:  # scripting="auto"
        lock = client.lock("a")
        with pytest.raises(ServerRefusedError) as info:
            async with asyncio.timeout(30):
                await lock.acquire(timeout=60)
        assert info.value.code == "NOPERM"
        assert "aiolock functions load" in str(info.value), info.value
        assert info.value.__cause__ is not None
        assert fresh_server.execute("DBSIZE") == 0, "nothing written"

        code, out = await asyncio.to_thread(cli, "functions", "load", "--url", fresh_server.url)
        assert code == 0 and out.splitlines()[0] == ours() and "loaded" in out, out
        code, out = await asyncio.to_thread(cli, "functions", "load", "--url", fresh_server.url)
        assert code == 0 and "already loaded" in out, out

        async with lock as lease:  # the same Client: Functions from now on
            assert lease.fencing_token > 0
        await assert_clean(client)
    # A new auto Client's first acquire (EVALSHA refused, sent again as an
    # FCALL), cancelled after each number of loop turns: nothing is left.
    for turns in range(6):
        async with Client.from_url(url) as client:
            task = asyncio.create_task(client.lock("c").acquire())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await (await task).release()
            await assert_clean(client)
            await eventually(
                lambda: fresh_server.execute("EXISTS", "aiolock:{c}") == 0, what="undone"
            )
            async with client.lock("c"):
                pass


@pytest.mark.parametrize("backend", ["renamed", "redis-6.2"])
async def test_a_server_without_functions(backend: str) -> None:
    """Redis 6.2 (the matrix's), and a Redis 7 with FCALL and FUNCTION
    renamed away (it answers as Redis 6 does)."""
    if backend == "renamed":
        old = ServerProcess(
            "redis",
            extra_args=("--rename-command", "FCALL", "", "--rename-command", "FUNCTION", ""),
        )
    else:
        old = ServerProcess(*kind_and_binary(backend))
    with old:
        async with Client.from_url(old.url, scripting="functions") as client:
            with pytest.raises(UnsupportedServerError) as info:
                await client.lock("a").acquire(timeout=30)
            message = str(info.value)
            assert "Functions" in message and "scripting='eval'" in message, message
            assert f"127.0.0.1:{old.port}" in message, message
            assert info.value.__cause__ is not None
            assert old.execute("DBSIZE") == 0
        async with Client.from_url(old.url) as client:  # auto: EVALSHA, as ever
            async with client.lock("a"):
                pass
        # auto, EVAL forbidden by the ACL, and no Functions to fall back on.
        old.execute(
            "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all",
            "-eval", "-evalsha", "-script",
        )  # fmt: skip
        url = old.url.replace("redis://", "redis://limited:pw@")
        keys = old.execute("DBSIZE")  # (the fence counter of the lock above)
        async with Client.from_url(url) as client:
            with pytest.raises(UnsupportedServerError) as info:
                await client.lock("a").acquire(timeout=30)
            assert "Functions" in str(info.value), info.value
            assert old.execute("DBSIZE") == keys


def test_bad_scripting_is_refused_before_any_io() -> None:
    with pytest.raises(InvalidArgumentError, match="scripting"):
        Client.from_url("redis://127.0.0.1:1", scripting="lua")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="scripting"):
        Client.from_url("redis://127.0.0.1:1", scripting=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="scripting"):
        Client.from_sentinel([("127.0.0.1", 1)], "svc", scripting="EVAL")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="scripting"):
        Client(redis.asyncio.Redis(port=1), scripting="")  # type: ignore[arg-type]


def test_cli_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert aiolock.cli.main(["functions", "load", "--url", "redis://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiolock functions load: ") and err.count("\n") == 1, err
    assert aiolock.cli.main(["functions"]) == 2


async def test_cluster(cluster: ClusterProcess) -> None:
    masters = cluster.masters()
    for node in masters:
        node.execute("FUNCTION", "FLUSH")
    code, out = await asyncio.to_thread(cli, "functions", "load", "--url", cluster.url)
    assert code == 0 and out.splitlines()[0] == ours(cluster=True), out
    assert out.count(": loaded") == len(masters), out
    before = [not_found(node) for node in masters]
    async with Client.from_url(cluster.url, scripting="functions", lease=3.0) as client:
        for i in range(8):  # names on several masters
            async with client.lock(f"c{i}") as lease:
                assert lease.fencing_token > 0
        async with client.multi_lock(client.lock("c1"), client.lock("c2")):
            pass
        # Held across renewals: the watchdog's batches of many slots per
        # master run as the renewal's node-form function.
        leases = [await client.lock(f"c{i}").acquire() for i in range(8)]
        key = "aiolock:{c0}"
        node = cluster.master_for_key(key)
        start = node.execute("PTTL", key)
        await eventually(lambda: node.execute("PTTL", key) < start - 200, what="decay")
        low = node.execute("PTTL", key)
        await eventually(lambda: node.execute("PTTL", key) > low, what="a renewal")
        for lease in leases:
            assert not lease.lost
            await lease.release()
        await assert_clean(client)
    assert [not_found(node) for node in masters] == before
    for node in masters:
        assert libraries(node) == {ours(cluster=True)}


@pytest.mark.parametrize("form", ["standalone", "cluster"])
def test_the_library_compiles_on_lua_51_and_54(form: str) -> None:
    """The library as ``FUNCTION LOAD`` gets it (its shebang line aside) is
    Lua 5.1 and 5.4 (Redis and Valkey; Dragonfly and other compatible servers)."""
    from lupa import lua51, lua54

    text = library_text(load_scripts(cluster=form == "cluster")).source
    shebang, _, body = text.partition("\n")
    assert shebang.startswith("#!lua name=aiolock_")
    for runtime in (lua51.LuaRuntime(), lua54.LuaRuntime()):
        loader = runtime.eval("function(s) local f, err = (loadstring or load)(s) "
                              "if f then return 'ok' end return err end")  # fmt: skip
        assert loader(body) == "ok"
