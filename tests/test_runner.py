"""The script runner (``aiolock/_core/protocol/runner.py``, issue 21 item 1), on real servers.

* A new connection loads a script only when it first runs it there, in the
  same write as that command: nothing for the scripts it never runs, and no
  NOSCRIPT on the way (checked with the server's command and error counts).
* A script the server loses mid-connection (SCRIPT FLUSH) is loaded and run
  again once, on every path: ``eval`` (acquire), ``send_script`` (release),
  ``submit_script`` (a latch's count-down); standalone, on the acknowledged
  lane (``replicas=1``) and on a cluster node. A load the server refuses is
  the caller's error, with the refusal's own code (not "NOSCRIPT").
* A first call cancelled anywhere, or a connection reset between a script's
  load and its run, leaves the connection usable and nothing held.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

import aiolock
from aiolock import Client, ConnectionFailedError, ServerRefusedError
from tests.cluster_servers import ClusterNode, ClusterProcess
from tests.core_util import assert_clean, cancel_after_turns, eventually
from tests.replication_servers import ReplicatedPair
from tests.servers import RedisServer, ServerProcess


def script_loads(server: RedisServer | ClusterNode) -> int:
    stats = server.info("commandstats")
    return int(stats.get("cmdstat_script|load", {}).get("calls", 0))


def noscript_errors(server: RedisServer | ClusterNode) -> int:
    stats: dict[str, Any] = server.info("errorstats")
    return int(stats.get("errorstat_NOSCRIPT", {}).get("count", 0))


def loaded_scripts(server: RedisServer | ClusterNode, client: Client) -> set[str]:
    """The names of ``client``'s scripts that ``server`` has in its script cache."""
    scripts = client._engine.scripts
    exists = server.execute("SCRIPT", "EXISTS", *(s.sha for s in scripts.values()))
    return {name for name, there in zip(scripts, exists, strict=True) if there}


async def test_a_new_connection_loads_only_the_scripts_it_runs(server: RedisServer) -> None:
    server.execute("CONFIG", "RESETSTAT")
    async with Client.from_url(server.url, cluster=False) as client:
        assert loaded_scripts(server, client) == set()
        async with client.lock("a"):
            pass
        # The capability probe (run when the Client settles), the acquire and
        # the release, each loaded once, in the write of its first run: never
        # a NOSCRIPT, never a script this Client did not run.
        assert loaded_scripts(server, client) == {"probe", "acquire", "release"}
        assert script_loads(server) == 3
        assert noscript_errors(server) == 0
        async with client.lock("b"):  # loaded already on this connection
            pass
        assert script_loads(server) == 3
        await assert_clean(client)


async def test_script_flush_mid_connection_every_path(server: RedisServer) -> None:
    async with Client.from_url(server.url, cluster=False) as client:
        lock = client.lock("a")
        latch = client.latch("l", 2)
        assert await latch.try_set_count()
        async with lock:
            pass
        assert await latch.count_down() == 1
        before = noscript_errors(server)

        server.script_flush()
        lease = await lock.acquire()  # eval: NOSCRIPT, loaded, run again
        assert await lock.is_locked()
        server.script_flush()
        await lease.release()  # send_script: recovered from the reply's parse
        assert not await lock.is_locked()
        server.script_flush()
        assert await latch.count_down() == 0  # submit_script
        assert noscript_errors(server) - before == 3, "each path recovered once"
        async with lock:  # the acquire and the release were flushed since: once each
            pass
        assert noscript_errors(server) - before == 5
        async with lock:  # loaded again on this connection: no NOSCRIPT more
            pass
        assert noscript_errors(server) - before == 5
        await assert_clean(client)


async def test_a_refused_load_is_the_callers_error(fresh_server: ServerProcess) -> None:
    """SCRIPT LOAD refused (an ACL user without it): the script is missing on
    the second try too, and the caller gets the refusal (NOPERM), not NOSCRIPT."""
    fresh_server.execute(
        "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-script|load"
    )
    url = fresh_server.url.replace("redis://", "redis://limited:pw@")
    # (scripting="eval": "auto" would run Functions instead, test_functions.py)
    async with Client.from_url(url, cluster=False, scripting="eval") as client:
        lock = client.lock("a")
        with pytest.raises(ServerRefusedError) as info:
            async with asyncio.timeout(30):
                await lock.acquire(timeout=60)
        assert info.value.code == "NOPERM", info.value
        assert "script" in str(info.value).lower()
        # Tried twice (loaded with it, then loaded again); a clean-up of the
        # failed acquire's own may meet the same refusal.
        assert noscript_errors(fresh_server) >= 2
        assert not await lock.is_locked()
        await assert_clean(client)


async def test_script_flush_on_the_acknowledged_lane(replicated_pair: ReplicatedPair) -> None:
    master = replicated_pair.master
    async with Client.from_url(master.url, replicas=1, replica_timeout=5.0) as client:
        lock = client.lock("a")
        async with lock:
            pass
        lane = client._engine.acked_lane
        assert lane is not None
        waits = lane.waits  # type: ignore[attr-defined]
        before = noscript_errors(master)
        master.script_flush()
        lease = await lock.acquire()  # on the acknowledged lane: loaded, run again, WAIT
        assert noscript_errors(master) - before == 1
        assert lane.waits > waits  # type: ignore[attr-defined]
        await eventually(
            lambda: replicated_pair.replica.execute("EXISTS", "aiolock:{a}") == 1,
            what="the acknowledged hold on the replica",
        )
        await lease.release()
        await assert_clean(client)


def _name_on(cluster: ClusterProcess, master: ClusterNode) -> str:
    for i in range(100_000):
        name = f"r{i}"
        if cluster.master_for_key(f"aiolock:{{{name}}}").node_id == master.node_id:
            return name
    raise AssertionError("no name found")


async def test_cluster_nodes_load_what_they_run_and_recover(cluster: ClusterProcess) -> None:
    masters = cluster.masters()
    names = {m.address: _name_on(cluster, m) for m in masters}
    async with Client.from_url(cluster.url) as client:
        for name in names.values():
            async with client.lock(name):
                pass
        for node in masters:  # each node's connection loaded what it ran there
            # (and one node the capability probe, which ran on its slot)
            loaded = loaded_scripts(node, client) - {"probe"}
            assert loaded == {"acquire", "release"}, node.address
        flushed = masters[0]
        lock = client.lock(names[flushed.address])
        before = noscript_errors(flushed)
        flushed.script_flush()
        lease = await lock.acquire()  # eval, through the ClusterMux
        flushed.script_flush()
        await lease.release()  # send_script
        assert noscript_errors(flushed) - before == 2
        assert loaded_scripts(flushed, client) == {"release"}
        for node in masters[1:]:
            assert noscript_errors(node) == 0
        await assert_clean(client)


@pytest.mark.parametrize("turns", range(8))
async def test_a_cancelled_first_call_leaves_the_connection_usable(
    server: RedisServer, turns: int
) -> None:
    """The first acquire of a new Client (its connection made, the script's
    load and the script written together) cancelled after ``turns`` loop
    turns: the replies are read in order, nothing is held afterwards, and
    the next call works."""
    async with Client.from_url(server.url, cluster=False) as client:
        lock = client.lock("a")
        lease = await cancel_after_turns(lock.acquire(), turns)
        if lease is not None:
            await lease.release()
        async with lock:
            assert await lock.is_owned()
        assert await client.lock("b").try_acquire() is not None
        await client.lock("b").release()
        await assert_clean(client)
        assert server.execute("EXISTS", "aiolock:{a}") == 0


async def test_cancelled_while_the_load_and_the_script_are_in_flight(
    server: RedisServer,
) -> None:
    async with Client.from_url(server.url, cluster=False) as client:
        lock = client.lock("a")
        mux = client._engine.mux
        task = asyncio.create_task(lock.acquire())
        # The load and the acquire written, neither reply read yet.
        await eventually(lambda: mux.in_flight >= 2, interval=0, what="load + acquire sent")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(
            lambda: server.execute("EXISTS", "aiolock:{a}") == 0, what="the acquire undone"
        )
        async with lock:
            pass
        await assert_clean(client)


async def test_a_reset_between_the_load_and_the_script(server: RedisServer) -> None:
    """The connection is dropped while a script's load and its first run are
    in flight: the next connection loads it again (it remembers nothing of
    the old one), so the server never answers NOSCRIPT."""
    async with Client.from_url(server.url, cluster=False) as client:
        lock = client.lock("a")
        mux = client._engine.mux
        before = noscript_errors(server)
        task = asyncio.create_task(lock.acquire())
        await eventually(lambda: mux.in_flight >= 2, interval=0, what="load + acquire sent")
        mux.reset("test: dropped between the load and the script")  # type: ignore[attr-defined]
        server.script_flush()  # the new connection's server lacks it, whatever ran
        try:
            lease = await task
        except ConnectionFailedError:
            pass  # the acquire's fate was unknown: undone
        else:
            await lease.release()
        async with lock:
            pass
        assert noscript_errors(server) == before
        await assert_clean(client)
        assert server.execute("EXISTS", "aiolock:{a}") == 0


async def test_cluster_acknowledged_lane_recovers(cluster: ClusterProcess) -> None:
    """``replicas=1`` in a cluster: the acquisitions' lane is a ClusterMux of
    acknowledged connections; a node that lost the script is loaded again
    there and the acquisition acknowledged."""
    node = cluster.masters()[0]
    name = _name_on(cluster, node)
    async with Client.from_url(cluster.url, replicas=1, replica_timeout=5.0) as client:
        lock = client.lock(name)
        async with lock:
            pass
        before = noscript_errors(node)
        node.script_flush()
        async with lock:
            assert await lock.is_owned()
        assert noscript_errors(node) - before >= 1
        assert "acquire" in loaded_scripts(node, client)
        await assert_clean(client)


def test_no_module_but_the_runner_names_evalsha_or_noscript() -> None:
    """The runner alone sends scripts and recovers from NOSCRIPT (issue 21):
    Redis Functions (FCALL) would then change it and nothing else. (errors.py
    may name them in the texts it shows users.)"""
    root = Path(aiolock.__file__).parent
    allowed = {root / "_core" / "protocol" / "runner.py", root / "_core" / "errors.py"}
    # `aiolock doctor` asks a server whether EVALSHA is allowed (ACL DRYRUN, and a
    # one-line probe script of its own) and names it in its report; it never runs
    # aiolock's scripts.
    allowed |= set((root / "cli").glob("doctor*.py"))
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted(root.rglob("*.py"))
        if path not in allowed
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"EVALSHA|NOSCRIPT|NoScriptError", line)
    ]
    assert found == [], f"EVALSHA / NOSCRIPT named outside the script runner: {found}"
