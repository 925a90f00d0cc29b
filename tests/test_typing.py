"""Decorators keep coroutine functions coroutine functions, for mypy --strict and at runtime.

``@x`` and ``@x(...)``, for every primitive, turn ``async def f(...) -> R``
into a function typed as returning ``Coroutine[Any, Any, R]`` (so that
``asyncio.create_task(f())``, ``TaskGroup.create_task`` and anyio's
``start_soon(f)`` type-check), and that ``inspect.iscoroutinefunction``
recognises. The typing half runs mypy (one run over two user modules, in a
process of its own) on code written the way users write it; the runtime
half runs the decorated functions against a real server.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import aiolock
from aiolock import Client, InvalidArgumentTypeError, Redlock
from tests.core_util import assert_clean, mypy_strict

# A user module that must type-check under mypy --strict: every primitive's
# `@x` and `@x(...)`, methods, tasks, task groups, leases.
USER_OK = '''
"""A user module: aiolock's decorators and leases under mypy --strict."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

import aiolock

client = aiolock.Client.from_url("redis://localhost")
lock = client.lock("a")
fair = client.fair_lock("b")
spin = client.spin_lock("c")
rw = client.rw_lock("d")
sem = client.semaphore("e", 2)
multi = client.multi_lock(client.lock("f"), client.lock("g"))
red = aiolock.Redlock([client]).lock("h")
sf = client.singleflight("i", ttl=1.0)


@lock
async def bare(x: int) -> str:
    return str(x)


@sf
async def sf_bare(x: int) -> str:
    return str(x)


@client.singleflight("j", ttl=2.0, max_size=1024)
async def sf_called(x: int, *, y: str = "") -> str:
    return str(x) + y


@lock(timeout=1.0)
async def called(x: int) -> str:
    return str(x)


@lock()
async def empty(x: int) -> str:
    return str(x)


@lock(timeout=1.0, lease=5.0, on_lost="ignore")
async def all_options(x: int, *, y: str = "") -> str:
    return str(x) + y


@fair
async def fair_bare(x: int) -> str:
    return str(x)


@fair(timeout=1.0)
async def fair_called(x: int) -> str:
    return str(x)


@spin
async def spin_bare(x: int) -> str:
    return str(x)


@spin(timeout=1.0)
async def spin_called(x: int) -> str:
    return str(x)


@rw.read
async def read_bare(x: int) -> str:
    return str(x)


@rw.read(timeout=1.0)
async def read_called(x: int) -> str:
    return str(x)


@rw.write
async def write_bare(x: int) -> str:
    return str(x)


@rw.write(timeout=1.0)
async def write_called(x: int) -> str:
    return str(x)


@sem
async def sem_bare(x: int) -> str:
    return str(x)


@sem(permits=2, timeout=1.0)
async def sem_called(x: int) -> str:
    return str(x)


@multi
async def multi_bare(x: int) -> str:
    return str(x)


@multi(timeout=1.0)
async def multi_called(x: int) -> str:
    return str(x)


@red
async def red_bare(x: int) -> str:
    return str(x)


@red(timeout=1.0)
async def red_called(x: int) -> str:
    return str(x)


@lock
async def no_args() -> None:
    pass


class Service:
    @lock
    async def method(self, x: int) -> str:
        return str(x)

    @sem(timeout=1.0)
    async def sem_method(self, x: int) -> str:
        return str(x)


DECORATED: list[Callable[[int], Coroutine[Any, Any, str]]] = [
    bare, called, empty, all_options, fair_bare, fair_called, spin_bare, spin_called,
    read_bare, read_called, write_bare, write_called, sem_bare, sem_called,
    multi_bare, multi_called, red_bare, red_called, Service().method, Service().sem_method,
    sf_bare, sf_called,
]


async def main() -> None:
    c: Coroutine[Any, Any, str] = bare(1)
    s: str = await c
    s = await all_options(1, y="z")
    s = await Service().method(1)
    unbound: Coroutine[Any, Any, str] = Service.method(Service(), 1)
    s = await unbound
    for fn in DECORATED:
        task: asyncio.Task[str] = asyncio.create_task(fn(1))
        s = await task
    task = asyncio.create_task(multi_called(1))
    async with asyncio.TaskGroup() as tg:
        t2: asyncio.Task[str] = tg.create_task(called(2))
        tg.create_task(no_args())
        tg.create_task(rw.write(no_args)())
    s = t2.result()
    async with anyio.create_task_group() as atg:
        atg.start_soon(bare, 1)
        atg.start_soon(sem_called, 1)
        atg.start_soon(no_args)
        atg.start_soon(Service().method, 1)
    got: tuple[str, str] = await asyncio.gather(bare(1), red_called(2))
    ok: bool = inspect.iscoroutinefunction(bare)

    async with lock as lease:
        token: int = lease.fencing_token
    async with lock(timeout=1.0) as lease:
        token = lease.fencing_token
    async with rw.read(timeout=1.0) as lease:
        token = lease.fencing_token
    async with sem(permits=2) as permit:
        permit_: aiolock.Permit = permit
        token = permit.fencing_token
    async with multi as mlease:
        tokens: dict[str, int] = mlease.fencing_tokens
    async with red as lease:
        token = lease.fencing_token
    maybe: aiolock.Lease | None = await lock.try_acquire()
    maybe = await fair.try_acquire(1.0)
    maybe = await rw.write.try_acquire()
    maybe = await red.try_acquire()
    maybe_permit: aiolock.Permit | None = await sem.try_acquire()
    maybe_multi: aiolock.MultiLease | None = await multi.try_acquire()
    held: aiolock.Lease = await lock.acquire(timeout=1.0)
    s = await sf.run(bare, 1)
    s = await sf.run(sf_called, 1, y="z")
    s = await sf_called(2, y="w")
    print(s, got, ok, token, tokens, maybe, maybe_permit, maybe_multi, held, permit_, task)
'''

# Misuses mypy must report: each line marked `# E: <code>` gives exactly that error.
USER_BAD = """
from __future__ import annotations

import asyncio

import aiolock

lock = aiolock.Client.from_url("redis://localhost").lock("a")
sem = aiolock.Client.from_url("redis://localhost").semaphore("s", 2)
sf = aiolock.Client.from_url("redis://localhost").singleflight("sf")


@lock
async def f(x: int) -> str:
    return str(x)


@sem(permits=2)
async def g(x: int) -> str:
    return str(x)


def takes_int(n: int) -> None:
    pass


@lock  # E: arg-type
def not_async(x: int) -> str:
    return str(x)


@lock(timeout=1.0)  # E: arg-type
def not_async_either(x: int) -> str:
    return str(x)


@sf  # E: arg-type
def not_async_shared(x: int) -> str:
    return str(x)


@sf
async def shared(x: int) -> str:
    return str(x)


async def main() -> None:
    takes_int(f(1))  # E: arg-type
    takes_int(await f(1))  # E: arg-type
    n: int = await g(1)  # E: assignment
    await g("x")  # E: arg-type
    await f(1, 2)  # E: call-arg
    asyncio.create_task(f)  # E: arg-type
    lock(timeout="1")  # E: call-overload
    (await lock.try_acquire()).fencing_token  # E: union-attr
    await sf.run(f, "x")  # E: arg-type
    takes_int(await sf.run(f, 1))  # E: arg-type
    await shared(1, 2)  # E: call-arg
    print(n)
"""

_ERROR = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def _expected(source: str) -> set[tuple[int, str]]:
    return {
        (number, m.group(1))
        for number, line in enumerate(source.splitlines(), 1)
        if (m := re.search(r"# E: ([a-z-]+)$", line))
    }


def test_decorators_type_check_under_mypy_strict(tmp_path: Path) -> None:
    ok = tmp_path / "user_ok.py"
    bad = tmp_path / "user_bad.py"
    ok.write_text(textwrap.dedent(USER_OK))
    bad.write_text(textwrap.dedent(USER_BAD))
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")  # not the project's own configuration
    env = dict(os.environ)
    # Point mypy at the aiolock this test imports (a source checkout), so it
    # checks that one whatever is installed (tests/test_packaging.py checks
    # what the README's editable install gives type checkers).
    root = Path(aiolock.__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file():
        env["MYPYPATH"] = str(root)
    # A process of its own: mypy run in this one would leave ~650k objects
    # alive, and every later test's teardown gc.collect() would take 0.5 s more.
    done = subprocess.run(
        mypy_strict(config, tmp_path / "mypy_cache", ok, bad),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    stdout, stderr, status = done.stdout, done.stderr, done.returncode
    report = f"mypy exited {status}\n{stdout}{stderr}"
    errors: dict[str, set[tuple[int, str]]] = {}
    for line in stdout.splitlines():
        if m := _ERROR.match(line):
            errors.setdefault(Path(m["path"]).name, set()).add((int(m["line"]), m["code"]))
        else:
            assert ": note: " in line, report  # no crash, no unparsed error
    assert set(errors) <= {"user_ok.py", "user_bad.py"}, report
    assert errors.get("user_ok.py", set()) == set(), report
    assert errors.get("user_bad.py", set()) == _expected(USER_BAD), report
    assert status == 1, report


def _primitives(client: Client) -> dict[str, Any]:
    """One of each primitive kind; each is used as ``@x`` and ``@x(timeout=...)``."""
    rw = client.rw_lock("rw")
    return {
        "lock": client.lock("lock"),
        "fair_lock": client.fair_lock("fair"),
        "spin_lock": client.spin_lock("spin"),
        "read": rw.read,
        "write": rw.write,
        "semaphore": client.semaphore("sem", 2),
        "multi_lock": client.multi_lock(client.lock("m1"), client.lock("m2")),
        "redlock": Redlock([client]).lock("red"),
    }


async def _holding(primitive: Any) -> bool:
    if isinstance(primitive, aiolock.Semaphore):
        return await primitive.in_use() == 1
    return bool(await primitive.is_owned())


def _work(primitive: Any) -> Callable[..., Coroutine[Any, Any, tuple[int, bool]]]:
    async def work(x: int, *, y: int = 0) -> tuple[int, bool]:
        """Work under the lock."""
        return x + y, await _holding(primitive)

    return work


async def test_decorated_functions_are_coroutine_functions(client: Client) -> None:
    for kind, primitive in _primitives(client).items():
        for decorate in (primitive, primitive(timeout=5.0)):
            original = _work(primitive)
            decorated = decorate(original)
            assert inspect.iscoroutinefunction(decorated), kind
            if sys.version_info < (3, 14):  # deprecated (a warning) from 3.14 on
                assert asyncio.iscoroutinefunction(decorated), kind
            assert decorated.__name__ == original.__name__ == "work", kind
            assert decorated.__qualname__ == original.__qualname__, kind
            assert decorated.__doc__ == "Work under the lock.", kind
            assert decorated.__module__ == __name__, kind
            assert decorated.__wrapped__ is original, kind
            assert decorated.__annotations__ == original.__annotations__, kind
            coro = decorated(1, y=2)
            assert inspect.iscoroutine(coro), kind
            assert await asyncio.create_task(coro) == (3, True), kind
            assert not await _holding(primitive), kind
            async with asyncio.TaskGroup() as tg:
                task = tg.create_task(decorated(4))
            assert task.result() == (4, True), kind
    await assert_clean(client)


async def test_decorated_methods(client: Client) -> None:
    lock = client.lock("method")
    sem = client.semaphore("method-sem", 1)

    class Service:
        @lock
        async def method(self, x: int) -> int:
            assert await lock.is_owned()
            return x

        @sem(timeout=5.0)
        async def sem_method(self, x: int) -> int:
            assert await sem.in_use() == 1
            return x

    assert inspect.iscoroutinefunction(Service.method)
    assert inspect.iscoroutinefunction(Service().method)
    assert inspect.iscoroutinefunction(Service().sem_method)
    assert await asyncio.create_task(Service().method(1)) == 1
    assert await asyncio.create_task(Service().sem_method(2)) == 2
    await assert_clean(client)


async def test_decorating_a_non_async_function_is_refused(client: Client) -> None:
    def plain(x: int) -> int:
        return x

    async def coro_fn(x: int) -> int:
        return x

    def returns_awaitable(x: int) -> Awaitable[int]:
        return coro_fn(x)

    not_async: list[Callable[..., Any]] = [
        plain,
        returns_awaitable,
        functools.partial(plain, 1),
    ]
    for kind, primitive in _primitives(client).items():
        for decorate in (primitive, primitive(timeout=5.0)):
            for fn in not_async:
                with pytest.raises(InvalidArgumentTypeError):
                    decorate(fn)
            # a partial of an async function is a coroutine function: accepted
            partial: Callable[[], Coroutine[Any, Any, int]] = functools.partial(coro_fn, 1)
            assert await decorate(partial)() == 1, kind
    await assert_clean(client)
