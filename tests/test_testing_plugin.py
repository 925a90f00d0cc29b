"""The pytest plugin for users (``pytest_plugins = ["aiolock.testing"]``), run as users do.

Each test runs a small user test module with ``pytester``, in-process (fast:
no new interpreter), against the shared server through ``$AIOLOCK_TEST_URL``,
but the one that checks the embedded server is started and stopped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis

import aiolock
from aiolock._servers import ping

pytest_plugins = ["pytester"]

#: A user's conftest.py.
CONFTEST = 'pytest_plugins = ["aiolock.testing"]\n'

#: A user's test module: fixtures, a leaked hold, the expire/force-release helpers.
USER_TESTS = """
import asyncio
import os

import pytest

import aiolock
import aiolock.testing


async def test_fixtures_work(aiolock_client, aiolock_url):
    assert aiolock_url == os.environ["AIOLOCK_TEST_URL"]
    assert aiolock_client.prefix.startswith("aiolock-test-test_fixtures_work-")
    async with aiolock_client.lock("a") as lease:
        assert lease.fencing_token > 0
    assert await aiolock_client.fenced_set("doc", "v", lease.fencing_token)
    with pytest.raises(aiolock.LockLostError):
        async with aiolock_client.semaphore("s", 2) as permit:
            await aiolock.testing.force_release(permit)  # its settings stay 24 h: no leak
            await asyncio.Event().wait()


async def test_leaks_a_hold(aiolock_client):
    await aiolock_client.lock("leaked").acquire()


@pytest.mark.parametrize("helper", ["expire", "force_release"])
@pytest.mark.parametrize("kind", ["lock", "fixed_lease", "fair_lock", "write"])
async def test_helper_makes_the_lease_lost(aiolock_client, helper, kind):
    if kind == "write":
        lock = aiolock_client.rw_lock("h").write
    elif kind == "fixed_lease":  # no watchdog renews it: the check still finds it gone
        lock = aiolock_client.lock("h")(lease=300)
    else:
        lock = getattr(aiolock_client, kind)("h")
    lost = asyncio.Event()
    with pytest.raises(aiolock.LockLostError):
        async with lock as lease:
            lease.on_lost(lambda _: lost.set())
            await getattr(aiolock.testing, helper)(lease)
            assert lease.lost
            await asyncio.Event().wait()  # cancelled: the lock was lost
    await lost.wait()


async def test_helpers_refuse_what_they_cannot_end(aiolock_client):
    async with aiolock_client.lock("r") as lease:
        pass
    with pytest.raises(aiolock.InvalidArgumentError, match="already released"):
        await aiolock.testing.expire(lease)
    with pytest.raises(aiolock.InvalidArgumentTypeError, match="takes a Lease"):
        await aiolock.testing.force_release("r")
    async with aiolock_client.semaphore("s", 1) as permit:
        with pytest.raises(aiolock.InvalidArgumentTypeError, match="use force_release"):
            await aiolock.testing.expire(permit)
"""

#: What a user's pytest.ini may say: strict or auto mode.
INI = """
[pytest]
asyncio_mode = {mode}
asyncio_default_fixture_loop_scope = function
"""
#: The user's run: in this process; only the plugins it needs (faster to
#: set up); aiolock.testing is imported already here, so pytest cannot
#: rewrite its asserts (it has none) and would warn.
ARGS = ("-p", "pytest_asyncio.plugin", "-p", "no:cacheprovider")
ARGS += ("-W", "ignore::pytest.PytestAssertRewriteWarning")


def readme_section(title: str) -> str:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert match, f"README has no '## {title}'"
    return match.group(1)


@pytest.fixture
def user_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(CONFTEST)
    return pytester


def test_a_user_test_module(
    user_run: pytest.Pytester, _server_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$AIOLOCK_TEST_URL`` is honoured; the fixtures work (auto mode); a
    leaked hold fails its test with the list; ``expire``/``force_release``
    make ``async with`` raise LockLostError and run ``on_lost`` callbacks
    at once; every test's keys are deleted after it."""
    url = _server_pool.get("redis").url
    monkeypatch.setenv("AIOLOCK_TEST_URL", url)
    user_run.makeini(INI.format(mode="auto"))
    # The README's example too, as written.
    blocks = re.findall(r"```python\n(.*?)```", readme_section("Testing your code"), re.S)
    assert len(blocks) == 2 and blocks[0] == CONFTEST, "the README's conftest line changed"
    user_run.makepyfile(test_user=USER_TESTS, test_readme=blocks[1])
    result = user_run.runpytest_inprocess(*ARGS)
    result.assert_outcomes(passed=13, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_a_hold*",
            "*aiolock_client: the test left behind (prefix 'aiolock-test-test_leaks_a_hold-*):",
            "*- hold: lock 'leaked' (fencing token *, 1 acquisition(s) not released)",
            "*- key: 'aiolock-test-test_leaks_a_hold-*:{leaked}' (hash, TTL *)",
        ]
    )
    r = redis.Redis.from_url(url)
    try:
        assert not list(r.scan_iter(match="aiolock-test-*"))
    finally:
        r.close()


def test_strict_mode_and_the_embedded_server(
    user_run: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Strict mode; without ``$AIOLOCK_TEST_URL`` one embedded server serves
    the whole session (two tests see one URL) and is stopped at its end."""
    monkeypatch.delenv("AIOLOCK_TEST_URL", raising=False)
    seen = tmp_path / "urls.txt"
    user_run.makeini(INI.format(mode="strict"))
    user_run.makepyfile(
        test_embedded=f"""
        import asyncio

        import pytest

        import aiolock
        import aiolock.testing


        @pytest.mark.asyncio
        async def test_one(aiolock_client, aiolock_url):
            with pytest.raises(aiolock.LockLostError):
                async with aiolock_client.lock("x") as lease:
                    await aiolock.testing.expire(lease)
                    await asyncio.Event().wait()
            with open({str(seen)!r}, "a") as f:
                f.write(aiolock_url + "\\n")


        def test_two(aiolock_url):
            with open({str(seen)!r}, "a") as f:
                f.write(aiolock_url + "\\n")
        """
    )
    result = user_run.runpytest_inprocess(*ARGS)
    result.assert_outcomes(passed=2)
    urls = seen.read_text().split()
    assert len(urls) == 2 and urls[0] == urls[1]
    address = urlparse(urls[0])
    assert address.hostname and address.port
    assert ping(address.hostname, address.port) is None  # stopped with the session


#: An import statement's first line: what it imports from.
IMPORT = re.compile(r"^\s*(?:from\s+(\S+)\s+import\s+(.*)|import\s+(.*))$", re.M)


def test_importing_aiolock_imports_no_pytest() -> None:
    """Only aiolock.testing imports pytest, and no module outside it imports
    aiolock.testing: ``import aiolock`` (the library, the command line, the
    launcher) never brings pytest in. Read from the source, every import
    statement (a function's too)."""
    package = Path(aiolock.__file__).parent
    testing = package / "testing"
    for path in package.rglob("*.py"):
        if testing in path.parents:
            continue
        for source, names, plain in IMPORT.findall(path.read_text()):
            words = re.split(r"[\s.,()]+", f"{source} {names} {plain}")
            assert not {"pytest", "_pytest", "pytest_asyncio", "testing"} & set(words), (
                path,
                source or plain,
            )
