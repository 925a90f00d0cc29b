"""The capability probe (issue 23 item 1), on real servers.

* Every server of the matrix is named (kind and version, from ``INFO``),
  with what it allows: Functions and sharded pub/sub from Redis 7.0 / any
  Valkey, PUBLISH inside scripts.
* A server that refuses PUBLISH inside scripts (renamed away, or forbidden
  by the ACL, as Alibaba Tair's cluster does): the default
  ``notify="pubsub"`` is refused at first use with UnsupportedServerError
  naming PUBLISH, the server and ``notify='list'``, nothing written; with
  ``notify="list"`` or ``"poll"`` the unpublished scripts run, and every
  primitive hands over on release (long before a lease runs out). The
  same on a Cluster whose ACL denies ``SPUBLISH``; a Redlock's waiters poll
  there. ``Election.observe()``, which only notices tell, is refused.
* After a Sentinel failover the new master is probed again
  (tests/test_sentinel.py::test_the_new_master_is_probed_again).
* A server that runs no scripts (EVAL, EVALSHA and SCRIPT renamed away):
  ``auto`` runs them as Functions; with Functions gone too, the Client
  refuses naming scripts, nothing written.
* ``replicas=N`` where WAIT is missing: refused by the probe, before any
  script of the Client ran.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from aiolock import Client, Redlock, UnsupportedServerError
from aiolock._core.capabilities import Capabilities
from aiolock._redlock import quorum_of
from tests.cluster_servers import ClusterProcess
from tests.conftest import kind_and_binary
from tests.core_util import assert_clean, eventually
from tests.servers import RedisServer, ServerProcess

#: A lease far longer than a hand-over takes: a waiter still waiting at half
#: of it was not woken by the release (it would have waited for the TTL).
LEASE = 60.0
NO_PUBLISH = ("--rename-command", "PUBLISH", "")


def probed(client: Client) -> Capabilities:
    found = client._engine.capabilities
    assert found.probed
    return found


@pytest.mark.parametrize("backend", ["redis", "valkey", "redis-6.2", "valkey-9.1"])
async def test_the_probe_names_the_server_and_what_it_allows(backend: str) -> None:
    kind, binary = kind_and_binary(backend)
    with ServerProcess(kind, binary) as server:
        info = server.info("server")
        async with Client.from_url(server.url) as client:
            async with client.lock("a"):
                pass
            found = probed(client)
        version = str(info.get("valkey_version", info["redis_version"]))
        assert found.kind == kind
        assert found.server == f"{kind.capitalize()} {version}"
        assert found.version == tuple(int(part) for part in version.split(".")[:2])
        assert found.publish_in_scripts and found.publish_refusal is None
        modern = backend != "redis-6.2"
        assert found.functions is modern and found.sharded_pubsub is modern
        assert found.wait is None  # (asked only with replicas=N)


async def test_a_user_without_info_leaves_the_server_unnamed(server: RedisServer) -> None:
    server.execute(
        "ACL", "SETUSER", "probe-no-info", "on", ">pw", "~*", "&*", "+@all", "-info"
    )  # fmt: skip
    try:
        url = server.url.replace("redis://", "redis://probe-no-info:pw@")
        async with Client.from_url(url, cluster=False) as client:
            async with client.lock("a"):
                pass
            found = probed(client)
            assert found.server == "the server" and found.kind is None
            assert found.publish_in_scripts and found.functions is None
    finally:
        server.execute("ACL", "DELUSER", "probe-no-info")


def _no_publish(how: str) -> ServerProcess:
    """A Redis whose scripts may not PUBLISH: renamed away, or denied to the
    ``app`` user by the ACL (its URL: ``_url``)."""
    if how == "renamed":
        return ServerProcess("redis", extra_args=NO_PUBLISH)
    return ServerProcess("redis")


def _url(server: ServerProcess, how: str) -> str:
    if how == "renamed":
        return server.url
    server.execute("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-publish")
    return server.url.replace("redis://", "redis://app:pw@")


@pytest.mark.parametrize("how", ["renamed", "acl"])
async def test_publish_refused_in_scripts_refuses_the_pubsub_mode(how: str) -> None:
    with _no_publish(how) as server:
        url = _url(server, how)
        async with Client.from_url(url) as client:
            lock = client.lock("a")
            for attempt in (lock.acquire(timeout=30), lock.try_acquire()):
                with pytest.raises(UnsupportedServerError) as caught:
                    await attempt
                message = str(caught.value)
                assert "PUBLISH inside scripts" in message, message
                assert "Redis 7" in message and "notify='list'" in message, message
            assert server.execute("DBSIZE") == 0


@pytest.mark.parametrize("notify", ["list", "poll"])
@pytest.mark.parametrize("how", ["renamed", "acl"])
async def test_publish_refused_in_scripts_list_and_poll_modes_work(how: str, notify: Any) -> None:
    with _no_publish(how) as server:
        url = _url(server, how)
        async with (
            Client.from_url(url, notify=notify, lease=LEASE) as one,
            Client.from_url(url, notify=notify, lease=LEASE) as two,
        ):
            # Every primitive: held by one Client, waited for by the other, and
            # handed over by the release (not by the lease running out).
            pairs: list[tuple[Any, Any]] = [
                (one.lock("l"), two.lock("l")),
                (one.fair_lock("f"), two.fair_lock("f")),
                (one.rw_lock("rw").write, two.rw_lock("rw").write),
                (one.semaphore("s", 1), two.semaphore("s", 1)),
                (one.spin_lock("sp"), two.spin_lock("sp")),
            ]
            for mine, theirs in pairs:
                held = await mine.acquire()
                waiter = asyncio.create_task(theirs.acquire(timeout=LEASE / 2))
                await eventually(lambda: two.statistics().waiting == 1, what="the waiter")
                await held.release()
                async with asyncio.timeout(LEASE / 2):
                    taken = await waiter
                await taken.release()
            # A latch's waiters are told by its last count-down.
            assert await one.latch("c", 1).try_set_count()
            waiting = asyncio.create_task(two.latch("c", 1).wait(timeout=LEASE / 2))
            await eventually(lambda: two.statistics().waiting == 1, what="the latch waiter")
            assert await one.latch("c", 1).count_down() == 0
            assert await waiting is True
            scripts = one._engine.scripts
            assert not any(
                "'PUBLISH'" in s.source or "'SPUBLISH'" in s.source
                for name, s in scripts.items()
                if name != "probe"
            )
            assert not probed(one).publish_in_scripts
            await assert_clean(one, two)


async def test_election_observe_is_refused_where_scripts_may_not_publish() -> None:
    with _no_publish("renamed") as server:
        async with Client.from_url(server.url, notify="list") as client:
            election = client.election("e")
            term = await election.campaign("me")
            leader = await election.leader()
            assert leader is not None and leader.value == "me"
            with pytest.raises(UnsupportedServerError, match="observe"):
                async for _ in election.observe():
                    pass
            await term.resign()


async def test_a_server_without_eval_runs_functions_and_one_without_scripts_is_refused() -> None:
    no_eval = ("EVAL", "EVALSHA", "SCRIPT")
    renamed = tuple(arg for name in no_eval for arg in ("--rename-command", name, ""))
    with ServerProcess("redis", extra_args=renamed) as server:
        async with Client.from_url(server.url) as client:  # auto
            async with client.lock("a"):
                pass
            assert client._engine.runner.functions
        async with Client.from_url(server.url, scripting="eval") as client:
            with pytest.raises(UnsupportedServerError, match="runs no scripts") as caught:
                await client.lock("b").acquire(timeout=30)
            assert "scripting='functions'" in str(caught.value)
            assert caught.value.__cause__ is not None
        assert server.execute("EXISTS", "aiolock:{b}") == 0
    none = (*renamed, "--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
    with ServerProcess("redis", extra_args=none) as server:
        async with Client.from_url(server.url) as client:
            with pytest.raises(UnsupportedServerError, match="runs no scripts") as caught:
                await client.lock("a").acquire(timeout=30)
            assert caught.value.__cause__ is not None
        assert server.execute("DBSIZE") == 0


async def test_replicas_without_wait_are_refused_before_any_script() -> None:
    with ServerProcess("redis", extra_args=("--rename-command", "WAIT", "")) as server:
        async with Client.from_url(server.url, replicas=1, replica_timeout=0.05) as client:
            with pytest.raises(UnsupportedServerError, match="needs the WAIT command") as caught:
                await client.lock("a").acquire()
            assert "nothing was changed in Redis" in str(caught.value)
            assert caught.value.__cause__ is not None
            # Refused before the acquire script ran (only the probe's was loaded).
            acquire = client._engine.scripts["acquire"].sha
            assert server.execute("SCRIPT", "EXISTS", acquire) == [0]
        assert server.execute("DBSIZE") == 0


async def test_a_cluster_whose_scripts_may_not_spublish(cluster: ClusterProcess) -> None:
    """Alibaba Tair's cluster refuses PUBLISH inside scripts; here every node's
    ACL denies the Client's user SPUBLISH. The default mode is refused; with
    ``notify="list"`` the unpublished cluster scripts run and a release hands
    the lock over to another Client's waiter."""
    user = ("ACL", "SETUSER", "no-spublish", "on", ">pw", "~*", "&*", "+@all", "-spublish")
    for node in cluster.nodes:
        node.execute(*user)
    url = cluster.url.replace("redis://", "redis://no-spublish:pw@")
    try:
        async with Client.from_url(url) as client:
            with pytest.raises(UnsupportedServerError, match="PUBLISH inside scripts"):
                await client.lock("a").acquire(timeout=30)
        async with (
            Client.from_url(url, notify="list", lease=LEASE) as one,
            Client.from_url(url, notify="list", lease=LEASE) as two,
        ):
            for name in ("a", "b", "c"):  # (slots of different masters, likely)
                held = await one.lock(name).acquire()
                waiter = asyncio.create_task(two.lock(name).acquire(timeout=LEASE / 2))
                await eventually(lambda: two.statistics().waiting == 1, what="the waiter")
                await held.release()
                async with asyncio.timeout(LEASE / 2):
                    await (await waiter).release()
            found = probed(one)
            assert found.sharded and not found.publish_in_scripts
            await assert_clean(one, two)
    finally:
        for node in cluster.nodes:
            node.execute("ACL", "DELUSER", "no-spublish")


async def test_a_redlock_over_masters_whose_scripts_may_not_publish() -> None:
    """Redlock's waiters poll there (no release would wake them): a release
    hands the lock over to another Redlock's waiter long before the lease."""
    with (
        ServerProcess("redis", extra_args=NO_PUBLISH) as a,
        ServerProcess("redis", extra_args=NO_PUBLISH) as b,
        ServerProcess("redis", extra_args=NO_PUBLISH) as c,
    ):
        urls = [a.url, b.url, c.url]
        async with contextlib.AsyncExitStack() as stack:
            mine = [
                await stack.enter_async_context(Client.from_url(u, notify="list", lease=LEASE))
                for u in urls
            ]
            theirs = [
                await stack.enter_async_context(Client.from_url(u, notify="list", lease=LEASE))
                for u in urls
            ]
            held = await Redlock(mine).lock("r").acquire()
            other = Redlock(theirs)
            waiter = asyncio.create_task(other.lock("r").acquire(timeout=LEASE / 2))
            await eventually(lambda: "r" in quorum_of(other).waiting, what="the Redlock waiter")
            await held.release()
            async with asyncio.timeout(LEASE / 2):
                taken = await waiter
            assert taken.fencing_token > held.fencing_token
            await taken.release()
