"""``aiolock doctor`` against deliberately misconfigured real servers.

Each misconfiguration is made on a private server (``fresh_server``) with
``CONFIG SET`` or ``ACL SETUSER`` at run time, and the command runs
in-process (``aiolock.cli.main`` in a worker thread, as in test_cli_ops.py)
with ``--json``, whose shape is checked once in full. The judgement's edges
that need no server (thresholds, merging the masters of a cluster, the list
of commands the ACL is asked about) are tested on ``doctor_checks`` directly.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiolock
from aiolock.cli import main
from aiolock.cli.doctor import DEFAULT_LEASE
from aiolock.cli.doctor_checks import (
    latency_check,
    memory_check,
    merge,
    replicas_check,
    verdict,
)
from aiolock.cli.doctor_facts import (
    SAMPLE_ARGS,
    Check,
    NodeFacts,
    Reply,
    Settings,
    acl_probes,
    script_commands,
)
from tests.core_util import eventually
from tests.servers import ServerProcess, find_free_port

#: The lease the doctor judges latency by here (see the ``doctor`` fixture).
LONG_LEASE = 600

Doctor = Callable[..., Awaitable[tuple[int, dict[str, Any]]]]

#: Every check a standalone server gets, in report order.
STANDALONE_CHECKS = [
    "server", "scripts", "functions", "publish-in-scripts", "sharded-pubsub", "wait",
    "cluster", "maxmemory-policy", "persistence", "replicas", "latency", "acl",
]  # fmt: skip


@pytest.fixture
def doctor(capsys: pytest.CaptureFixture[str]) -> Doctor:
    """``await doctor(url, *more)``: ``aiolock doctor --json``; (exit code, JSON).

    With ``--lease 600`` (unless ``more`` gives another): the latency check
    fails only when a PING takes a minute, so a loaded machine changes no
    exit code."""

    async def run(url: str, *more: str) -> tuple[int, dict[str, Any]]:
        capsys.readouterr()
        argv = ["doctor", "--url", url, "--json", "--lease", str(LONG_LEASE), *more]
        code = await asyncio.to_thread(main, argv)
        out, err = capsys.readouterr()
        assert err == ""
        return code, json.loads(out)

    return run


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["checks"]}


@pytest.fixture
async def admin(fresh_server: ServerProcess) -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(fresh_server.url, decode_responses=True)
    yield connection
    await connection.aclose()


def user_url(server: ServerProcess, user: str) -> str:
    return f"redis://{user}:pw@{server.host}:{server.port}/0"


# --------------------------------------------------------------------------- real servers


async def test_healthy_server_json_shape(url: str, doctor: Doctor) -> None:
    """The shared test server (no persistence: a warn) passes: exit 0, and the
    JSON is exactly {"checks": [{"name", "status", "detail"}], "verdict"}."""
    code, doc = await doctor(url)
    assert set(doc) == {"checks", "verdict"}
    assert [c["name"] for c in doc["checks"]] == STANDALONE_CHECKS
    for check in doc["checks"]:
        assert set(check) == {"name", "status", "detail"}
        assert check["status"] in ("ok", "warn", "fail")
        assert isinstance(check["detail"], str) and check["detail"]
    statuses = {c["name"]: c["status"] for c in doc["checks"]}
    assert statuses["persistence"] == "warn"  # the harness runs servers without it
    assert all(s == "ok" for n, s in statuses.items() if n != "persistence"), doc
    assert doc["verdict"] == "warn"
    assert code == 0


async def test_eviction_policies(
    fresh_server: ServerProcess, admin: aioredis.Redis, doctor: Doctor
) -> None:
    """allkeys-* fails (exit 1); volatile-* warns without a maxmemory and
    fails with one (every aiolock key has a TTL); noeviction is ok."""
    await admin.config_set("maxmemory-policy", "allkeys-lru")
    code, doc = await doctor(fresh_server.url)
    check = by_name(doc)["maxmemory-policy"]
    assert (check["status"], code, doc["verdict"]) == ("fail", 1, "fail"), check
    assert "allkeys-lru" in check["detail"]

    await admin.config_set("maxmemory-policy", "volatile-ttl")
    code, doc = await doctor(fresh_server.url)
    assert by_name(doc)["maxmemory-policy"]["status"] == "warn"
    assert code == 0

    await admin.config_set("maxmemory", "512mb")
    code, doc = await doctor(fresh_server.url)
    check = by_name(doc)["maxmemory-policy"]
    assert (check["status"], code) == ("fail", 1), check
    assert "TTL" in check["detail"]

    await admin.config_set("maxmemory-policy", "noeviction")
    code, doc = await doctor(fresh_server.url)
    assert by_name(doc)["maxmemory-policy"]["status"] == "ok"
    assert code == 0


async def test_persistence_off_and_on(
    fresh_server: ServerProcess, admin: aioredis.Redis, doctor: Doctor
) -> None:
    code, doc = await doctor(fresh_server.url)
    check = by_name(doc)["persistence"]
    assert check["status"] == "warn" and "appendonly no" in check["detail"], check

    await admin.config_set("save", "900 1")
    _, doc = await doctor(fresh_server.url)
    check = by_name(doc)["persistence"]
    assert check["status"] == "warn" and "RDB" in check["detail"], check

    await admin.config_set("appendonly", "yes")
    await admin.config_set("appendfsync", "everysec")

    async def initial_aof_written() -> bool:
        # (a server writing its first AOF ignores SIGTERM: the teardown would hang)
        info = await admin.info("persistence")
        return not (info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"])

    await eventually(initial_aof_written, what="the initial AOF rewrite")
    _, doc = await doctor(fresh_server.url)
    check = by_name(doc)["persistence"]
    assert check["status"] == "warn" and "everysec" in check["detail"], check

    await admin.config_set("appendfsync", "always")
    code, doc = await doctor(fresh_server.url)
    assert by_name(doc)["persistence"]["status"] == "ok"
    assert (doc["verdict"], code) == ("ok", 0), doc


async def test_user_without_scripts_fails(
    fresh_server: ServerProcess, admin: aioredis.Redis, doctor: Doctor
) -> None:
    """An ACL user that may not run scripts (EVAL, EVALSHA, nor Functions:
    -@scripting): the scripts check fails, exit 1."""
    await admin.acl_setuser(
        "noeval", enabled=True, passwords=["+pw"], keys=["aiolock:*"], channels=["aiolock:*"],
        commands=["+@all", "-@scripting"],
    )  # fmt: skip
    code, doc = await doctor(user_url(fresh_server, "noeval"))
    checks = by_name(doc)
    assert checks["scripts"]["status"] == "fail", checks["scripts"]
    assert "evalsha" in checks["scripts"]["detail"].lower()
    assert checks["acl"]["status"] == "fail"  # the user may run ACL DRYRUN: it says so too
    assert "EVALSHA" in checks["acl"]["detail"]
    assert (code, doc["verdict"]) == (1, "fail")


async def test_user_whose_scripts_may_not_publish_warns(
    fresh_server: ServerProcess, admin: aioredis.Redis, doctor: Doctor
) -> None:
    """An ACL user without PUBLISH (as Alibaba Tair's cluster refuses it in
    scripts): a warning naming notify='list', which works there."""
    await admin.acl_setuser(
        "nopublish", enabled=True, passwords=["+pw"], keys=["aiolock:*"], channels=["aiolock:*"],
        commands=["+@all", "-publish"],
    )  # fmt: skip
    _, doc = await doctor(user_url(fresh_server, "nopublish"))
    check = by_name(doc)["publish-in-scripts"]
    assert check["status"] == "warn", check
    assert "notify='list'" in check["detail"], check


async def test_user_with_functions_only_warns(
    fresh_server: ServerProcess, admin: aioredis.Redis, doctor: Doctor
) -> None:
    """No EVAL, EVALSHA or SCRIPT, but FCALL and FUNCTION LOAD: scripting="auto"
    runs on Redis Functions, so the scripts check warns and says so (exit 0),
    and a Client of that user does acquire."""
    await admin.acl_setuser(
        "fonly", enabled=True, passwords=["+pw"], keys=["aiolock:*"], channels=["aiolock:*"],
        commands=["+@all", "-eval", "-evalsha", "-script"],
    )  # fmt: skip
    url = user_url(fresh_server, "fonly")
    code, doc = await doctor(url)
    checks = by_name(doc)
    assert checks["scripts"]["status"] == "warn", checks["scripts"]
    assert "Functions" in checks["scripts"]["detail"]
    assert checks["acl"]["status"] == "warn", checks["acl"]  # EVALSHA: optional here
    assert code == 0, doc
    async with aiolock.Client.from_url(url) as client:
        lease = await client.lock("doctor").acquire()
        await lease.release()


async def test_user_without_a_script_command(
    fresh_server: ServerProcess, admin: aioredis.Redis, doctor: Doctor
) -> None:
    """A command a script runs (read from the .lua files) refused by the ACL:
    ACL DRYRUN finds it, though EVALSHA itself is allowed."""
    await admin.acl_setuser(
        "nozadd", enabled=True, passwords=["+pw"], keys=["aiolock:*"], channels=["aiolock:*"],
        commands=["+@all", "-zadd"],
    )  # fmt: skip
    code, doc = await doctor(user_url(fresh_server, "nozadd"))
    checks = by_name(doc)
    assert checks["scripts"]["status"] == "ok"
    assert checks["acl"]["status"] == "fail" and "ZADD" in checks["acl"]["detail"], checks["acl"]
    assert code == 1


async def test_config_and_dryrun_refused_warn(
    fresh_server: ServerProcess, admin: aioredis.Redis, doctor: Doctor
) -> None:
    """The README's ACL user (no @dangerous: no CONFIG, no ACL DRYRUN, but INFO):
    the checks that need CONFIG or DRYRUN warn that they could not read it,
    the policy comes from INFO, nothing crashes, exit 0."""
    await admin.acl_setuser(
        "locker", enabled=True, passwords=["+pw"], keys=["aiolock:*"], channels=["aiolock:*"],
        commands=["+@all", "-@dangerous", "+info", "+role"],
    )  # fmt: skip
    code, doc = await doctor(user_url(fresh_server, "locker"))
    checks = by_name(doc)
    assert checks["persistence"]["status"] == "warn"
    assert "could not read" in checks["persistence"]["detail"]
    assert "CONFIG refused" in checks["persistence"]["detail"]
    assert checks["maxmemory-policy"]["status"] == "ok"
    assert "from INFO" in checks["maxmemory-policy"]["detail"]
    assert checks["acl"]["status"] == "warn" and "could not check" in checks["acl"]["detail"]
    assert checks["scripts"]["status"] == "ok"
    assert code == 0


async def test_min_replicas_above_the_replicas_fails(
    fresh_server: ServerProcess, admin: aioredis.Redis, doctor: Doctor
) -> None:
    """min-replicas-to-write 1 with no replica: the master refuses every write."""
    await admin.config_set("min-replicas-to-write", "1")
    code, doc = await doctor(fresh_server.url)
    check = by_name(doc)["replicas"]
    assert check["status"] == "fail" and "NOREPLICAS" in check["detail"], check
    assert code == 1
    # ... as an acquisition finds out:
    with pytest.raises(aiolock.ServerRefusedError, match="NOREPLICAS"):
        async with aiolock.Client.from_url(fresh_server.url) as client:
            await client.lock("x").acquire()


async def test_latency_against_a_tiny_lease(url: str, doctor: Doctor) -> None:
    """--lease 1e-6 s: no PING round trip is under a tenth of a microsecond."""
    code, doc = await doctor(url, "--lease", "1e-6")
    assert by_name(doc)["latency"]["status"] == "fail"
    assert code == 1


async def test_unreachable_server_is_a_failed_check(doctor: Doctor) -> None:
    code, doc = await doctor(f"redis://127.0.0.1:{find_free_port()}/0", "--timeout", "2")
    assert [c["name"] for c in doc["checks"]] == ["connect"]
    assert (doc["verdict"], code) == ("fail", 1)


def test_plain_output_and_usage(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Plain lines ``<status> <name>  <detail>`` and the closing promise; a bad
    --lease is a usage error (exit 2)."""
    assert main(["doctor", "--url", url, "--lease", str(LONG_LEASE)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for line in lines[:-2]:
        assert re.fullmatch(r"(ok|warn|fail) +[a-z-]+ {2,}\S.*", line), line
    assert len(lines) == len(STANDALONE_CHECKS) + 2 and lines[-2] == ""
    assert lines[-1].startswith("aiolock promises here")
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--url", url, "--lease", "0"])
    assert exited.value.code == 2


async def test_redis_6_2(_server_pool: Any, doctor: Doctor) -> None:
    """The oldest server aiolock supports: what 7.0 added is missing (FUNCTION,
    ACL DRYRUN: "could not check"), said without a failure."""
    server = _server_pool.get("redis-6.2")
    code, doc = await doctor(server.url)
    checks = by_name(doc)
    assert checks["server"]["status"] == "ok" and "Redis 6.2" in checks["server"]["detail"]
    assert checks["functions"]["detail"].startswith("not available")
    assert checks["sharded-pubsub"]["status"] == "ok"  # not needed on one server
    assert checks["acl"]["status"] == "warn" and "could not check" in checks["acl"]["detail"]
    assert (code, doc["verdict"]) == (0, "warn"), doc


# A topology's reading is the same code on both backends, and its servers are
# costly to start: these two run with one backend (the session's shared ones).


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
async def test_cluster_every_master(cluster_url: str, doctor: Doctor) -> None:
    code, doc = await doctor(cluster_url)
    checks = by_name(doc)
    assert checks["cluster"]["status"] == "ok" and "16384" in checks["cluster"]["detail"]
    assert checks["server"]["detail"].startswith("all 3 masters: ")
    assert "SPUBLISH" in checks["publish-in-scripts"]["detail"]
    assert checks["publish-in-scripts"]["status"] == checks["scripts"]["status"] == "ok"
    assert checks["acl"]["status"] == "ok"
    assert code == 0, doc


@pytest.mark.parametrize("_shared_sentinel_set", ["redis"], indirect=True)
async def test_through_sentinels(sentinel_set: Any, doctor: Doctor) -> None:
    """--sentinel/--service: the Sentinels' view first, then the master they name."""
    more = [f"--sentinel={host}:{port}" for host, port in sentinel_set.sentinel_addresses]
    code, doc = await doctor("redis://", *more, "--service", sentinel_set.service)
    checks = by_name(doc)
    assert doc["checks"][0]["name"] == "sentinel"
    host, port = sentinel_set.named_master()
    assert checks["sentinel"]["status"] == "ok", checks["sentinel"]
    assert f"master {host}:{port}" in checks["sentinel"]["detail"]
    assert "quorum 2 of 3" in checks["sentinel"]["detail"]
    assert checks["replicas"]["detail"].startswith("2: "), checks["replicas"]
    assert code == 0, doc


# --------------------------------------------------------------------------- pure


def test_default_lease_is_the_clients() -> None:
    assert inspect.signature(aiolock.Client).parameters["lease"].default == DEFAULT_LEASE


def test_every_command_aiolock_sends_is_asked_about() -> None:
    """The scripts' commands each have sample arguments (ACL DRYRUN checks the
    arity), and every command named for the Python side is named in the
    library's code (a literal it sends, or redis-py's call it documents)."""
    assert script_commands() <= set(SAMPLE_ARGS), script_commands() - set(SAMPLE_ARGS)
    assert {"HSET", "PEXPIRE", "PUBLISH", "TIME"} <= script_commands()
    root = Path(aiolock.__file__).parent
    code = "\n".join(
        p.read_text() for p in root.rglob("*.py") if "cli" not in p.relative_to(root).parts
    )
    scripted = script_commands() | {"SPUBLISH"}
    for cluster in (False, True):
        for probe in acl_probes(Settings(30.0, cluster, False)):
            if probe.name not in scripted:
                assert re.search(rf"\b{probe.name}\b", code), probe.name


def _facts(**config: str) -> NodeFacts:
    ok = Reply("ok", None)
    return NodeFacts(
        "h:1", Reply("refused"), Reply("ok", config), [1.0, 2.0, 50.0],
        ok, ok, ok, ok, ok, Reply("ok", []), ok, None, ok,
    )  # fmt: skip


def test_judgement_edges() -> None:
    refused = _facts()
    refused.config = Reply("refused", detail="NOPERM")
    assert memory_check(refused).status == "warn"
    assert "CONFIG refused" in memory_check(refused).detail
    assert memory_check(_facts(**{"maxmemory-policy": "allkeys-random"})).status == "fail"
    limited = _facts(**{"maxmemory-policy": "volatile-lru", "maxmemory": "1000"})
    assert memory_check(limited).status == "fail"
    replica = _facts()
    replica.info = Reply("ok", {"role": "slave", "connected_slaves": 0})
    assert replicas_check(replica).status == "fail"
    assert "replica" in replicas_check(replica).detail
    # the median, not the worst PING (2 ms), against lease fractions of 1% and 10%
    assert latency_check(_facts(), Settings(1.0, False, False)).status == "ok"
    assert latency_check(_facts(), Settings(0.1, False, False)).status == "warn"
    assert latency_check(_facts(), Settings(0.02, False, False)).status == "fail"
    merged = merge(
        {
            "a:1": [Check("x", "ok", "same"), Check("y", "ok", "one")],
            "b:2": [Check("x", "ok", "same"), Check("y", "fail", "two")],
        }
    )
    assert merged == [
        Check("x", "ok", "all 2 masters: same"),
        Check("y", "fail", "a:1: one; b:2: two"),
    ]
    assert verdict(merged) == "fail" and verdict([]) == "ok"
