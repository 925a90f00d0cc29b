"""The log lines an operator sees: loggers under ``aiolock``, one line per
outage each way, a lost lease named with its token and reason, and a DEBUG
trace that costs nothing when it is off.

Counts of records are asserted after the events that produce them (a
reconnect counted by the listener, a renewal round that returned), never
after a guessed sleep.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from aiolock import Client, ConnectionFailedError
from aiolock._core.outage import Outage
from aiolock._core.waiting.notify import Waiter
from aiolock._primitives.compete import compete
from aiolock.testing import seam
from tests.core_util import eventually, pubsub_subscribers
from tests.servers import RedisServer, ServerProcess

ROOT = Path(__file__).resolve().parent.parent


def records(caplog: pytest.LogCaptureFixture, logger: str, level: int, text: str = "") -> list[str]:
    """The messages logged on ``logger`` (exactly) at ``level`` (exactly) containing ``text``."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == logger and r.levelno == level and text in r.getMessage()
    ]


def address(server: RedisServer) -> str:
    return f"{server.host}:{server.port}"


# --------------------------------------------------------------------------- the helper


def test_outage_reports_a_run_once_each_way() -> None:
    outage = Outage()
    assert outage.ended() is None  # no run: nothing to report
    outage.note()  # ignored outside a run
    assert outage.failed() is True  # the first failure starts the run: log it
    assert [outage.failed() for _ in range(4)] == [False] * 4  # counted, not logged
    outage.note(2)
    assert outage.ongoing
    run = outage.ended()
    assert run is not None and run.failures == 5 and run.noted == 2 and run.seconds >= 0
    assert not outage.ongoing and outage.ended() is None
    assert outage.failed() is True  # the next outage is logged again


# --------------------------------------------------------------------------- (a) silent


def test_package_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("aiolock").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


def test_nothing_is_printed_without_logging_configured(server: RedisServer) -> None:
    """A process that loses a lease (a WARNING) and closes its Client while
    holding (an INFO) prints nothing when it configured no logging: the
    NullHandler keeps logging's last-resort handler from printing WARNINGs."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        from aiolock import Client

        async def main():
            async with Client.from_url(sys.argv[1], prefix="quiet") as client:
                lease = await client.lock("x").acquire()
                assert await client.lock("x").force_release()
                assert lease.lost, "the lease was not lost"
                await client.lock("y").acquire()  # still held at aclose()
            print("done")

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-c", script, server.url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    assert done.stderr == ""


# --------------------------------------------------------------------------- (b) losses


async def test_lost_lease_is_one_warning_naming_lock_token_and_reason(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiolock")
    # Poll mode: no eviction channel, so the watchdog is what finds out (in
    # pub/sub mode the Client is told at once: the reason is "force-released").
    async with (
        Client.from_url(server.url, prefix="log", lease=4.5, notify="poll") as holder,
        Client.from_url(server.url, prefix="log") as other,
    ):
        lease = await holder.lock("lost-one").acquire()
        assert await other.lock("lost-one").force_release()
        # The holder's watchdog finds the hold gone at its next round (every 1.5 s).
        await eventually(lambda: lease.lost, timeout=4.5 + 10, what="the lease lost")
    warnings = records(caplog, "aiolock.lease", logging.WARNING)
    assert len(warnings) == 1, warnings
    (line,) = warnings
    assert "'lost-one'" in line
    assert f"fencing token {lease.fencing_token}" in line
    assert "the watchdog found the hold gone" in line
    assert records(caplog, "aiolock.lease", logging.INFO) == []


async def test_lease_given_up_by_aclose_is_info(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing the Client while holding is the user's doing: INFO, not WARNING."""
    caplog.set_level(logging.INFO, logger="aiolock")
    async with Client.from_url(server.url, prefix="log") as client:
        lease = await client.lock("held-at-close").acquire()
    assert lease.lost
    assert records(caplog, "aiolock.lease", logging.WARNING) == []
    (line,) = records(caplog, "aiolock.lease", logging.INFO)
    assert "'held-at-close'" in line and "the Client was closed" in line
    assert f"fencing token {lease.fencing_token}" in line


# --------------------------------------------------------------------------- (c) pub/sub


async def test_pubsub_drop_is_one_warning_and_one_info(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiolock")
    # The holder polls: no pub/sub connection of its own (its eviction channel)
    # whose loss would be logged too.
    async with (
        Client.from_url(server.url, prefix="log", notify="poll") as holder,
        Client.from_url(server.url, prefix="log") as waiter,
    ):
        held = await holder.lock("ps").acquire()
        task = asyncio.create_task(waiter.lock("ps").acquire())
        listener = seam.listener(waiter)
        await eventually(
            lambda: any(c.is_confirmed for c in listener.channels.values()),
            what="the waiter's subscription confirmed",
        )
        assert server.kill_pubsub_clients() >= 1
        await eventually(lambda: listener.connects >= 2, what="the listener's reconnect")
        await eventually(
            lambda: all(c.is_confirmed for c in listener.channels.values()),
            what="the resubscription confirmed",
        )
        await held.release()
        await (await asyncio.wait_for(task, 20)).release()
    where = f"pub/sub connection to {address(server)}"
    warnings = records(caplog, "aiolock.listener", logging.WARNING)
    assert warnings == [m for m in warnings if m.startswith(f"{where} lost (")], warnings
    assert len(warnings) == 1, warnings
    infos = records(caplog, "aiolock.listener", logging.INFO)
    assert len(infos) == 1, infos
    assert re.fullmatch(
        rf"{re.escape(where)} back after \d+\.\d s; 0 connect attempts failed meanwhile; "
        r"resubscribing \d+ channels?",
        infos[0],
    ), infos


# --------------------------------------------------------------------------- (d) outage


async def test_outage_is_one_warning_per_connection_and_one_info_with_counts(
    fresh_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A paused server: every renewal round and every command fails, again and
    again; each connection (and the watchdog) says so once, and once that it
    is back, with the count."""
    caplog.set_level(logging.INFO, logger="aiolock")
    rounds = 4
    async with Client.from_url(fresh_server.url, prefix="log", command_timeout=0.5) as client:
        lock = client.lock("outage")
        lease = await lock.acquire()  # 30 s lease: it outlives the outage
        watchdog = seam.watchdog(client)
        assert await watchdog.renew_all()  # the renewal connection is up
        with fresh_server.paused():
            for _ in range(rounds):
                # Each round fails (a reply overdue, then connects unanswered).
                assert not await watchdog.renew_all()
                with pytest.raises(ConnectionFailedError):
                    await lock.is_locked()
            assert watchdog.outage.failures >= rounds
        assert await watchdog.renew_all()
        assert await lock.is_locked()
        assert not lease.lost
        await lease.release()
    where = address(fresh_server)
    for role in ("renewal", "command"):
        warnings = records(caplog, "aiolock.connection", logging.WARNING, f"{role} connection")
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith(f"{role} connection to {where} lost ("), warnings
        (info,) = records(caplog, "aiolock.connection", logging.INFO, f"{role} connection")
        match = re.fullmatch(
            rf"{role} connection to {re.escape(where)} back after \d+\.\d s; "
            r"(\d+) connect attempts failed meanwhile",
            info,
        )
        assert match is not None, info
        assert int(match.group(1)) >= rounds - 1  # the first round lost the connection
    (warning,) = records(caplog, "aiolock.watchdog", logging.WARNING)
    assert warning.startswith("lease renewals failed (")
    (info,) = records(caplog, "aiolock.watchdog", logging.INFO)
    match = re.fullmatch(
        r"lease renewals failed (\d+) times over \d+\.\d s, until they succeed again; "
        r"0 leases or queue places lost meanwhile",
        info,
    )
    assert match is not None, info
    assert int(match.group(1)) >= rounds
    assert records(caplog, "aiolock.listener", logging.WARNING) == []
    assert records(caplog, "aiolock.lease", logging.WARNING) == []


# --------------------------------------------------------------------------- (e) trace


async def test_debug_trace_of_acquire_handoff_grant_release(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiolock.lock")
    async with (
        Client.from_url(server.url, prefix="log") as client,
        Client.from_url(server.url, prefix="log") as other,
    ):
        lock = client.lock("traced")
        # A local handoff: a second task of this Client waits for the first.
        first = await lock.acquire()
        second = asyncio.create_task(lock.acquire())
        await eventually(lambda: client.statistics().waiting == 1, what="the second task parked")
        await first.release()
        await (await asyncio.wait_for(second, 20)).release()
        # A grant: another Client's release hands the lock to this Client's waiter.
        held = await other.lock("traced").acquire()
        waiting = asyncio.create_task(lock.acquire())
        # Its entry in the lock's waiting set, registered by a try made once
        # its channel was confirmed: the release grants the lock to it.
        channel = f"log:{{traced}}:w:{client.id}"
        await eventually(
            lambda: (
                server.execute("ZCARD", "log:{traced}:wq") == 1
                and pubsub_subscribers(server, channel) == 1
            ),
            what="the waiter's entry registered and its channel subscribed",
        )
        await held.release()
        await (await asyncio.wait_for(waiting, 20)).release()
    trace = records(caplog, "aiolock.lock", logging.DEBUG)
    assert any(re.match(r"lock 'traced': acquired after .* fencing token \d+", m) for m in trace)
    assert any(m.startswith("lock 'traced': handed from ") for m in trace), trace
    assert any(m.startswith("lock 'traced': granted by a release") for m in trace), trace
    assert any(m.startswith("lock 'traced': released by ") for m in trace), trace


class Spy(str):
    """A lock name that counts how often it is formatted for a message."""

    formatted = 0

    def __repr__(self) -> str:
        Spy.formatted += 1
        return str.__repr__(self)


async def test_trace_formats_nothing_when_debug_is_off(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aiolock")
    async with Client.from_url(server.url, prefix="log") as client:
        lock = client.lock(Spy("quiet"))
        Spy.formatted = 0  # (the lock object words its messages once, when made)
        for _ in range(3):
            first = await lock.acquire()
            second = asyncio.create_task(lock.acquire())
            await eventually(lambda: client.statistics().waiting == 1, what="the task parked")
            await first.release()  # a local handoff
            await (await asyncio.wait_for(second, 20)).release()
    assert Spy.formatted == 0
    assert not logging.getLogger("aiolock.lock").isEnabledFor(logging.DEBUG)


# --------------------------------------------------------------------------- docs


async def test_waiting_tasks_outage_lasts_until_the_last_failing_task_recovers(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """One outage of the waiting tasks is one WARNING and one INFO, however
    many replies other tasks get meanwhile: a lock whose node is down (here:
    tries that fail until a gate opens) while other locks' tries are answered
    (one cluster master down, the others up) does not flap WARNING/INFO."""
    caplog.set_level(logging.INFO, logger="aiolock.lock")
    await client.lock("warm").is_locked()  # the Client is bound to this loop
    engine = seam.engine(client)
    loop = asyncio.get_running_loop()
    down = True
    failed = 0

    async def on_a_node_that_is_down() -> tuple[int | None, float | None]:
        nonlocal failed
        if down:
            failed += 1
            raise RedisConnectionError("node down")
        return 1, None

    async def answered() -> tuple[int | None, float | None]:
        return 1, None

    def no_waiter() -> Waiter:
        raise AssertionError("nothing waits here: every try is answered or fails")

    blocked = asyncio.create_task(
        compete(
            engine,
            what="lock 'down'",
            deadline=loop.time() + 60.0,
            attempt=on_a_node_that_is_down,
            waiter=no_waiter,
        )
    )
    await eventually(lambda: failed >= 1, what="a first failed try")
    for _ in range(3):  # other locks' tries get replies between the failures
        await compete(engine, what="lock 'up'", deadline=None, attempt=answered, waiter=no_waiter)
        seen = failed
        await eventually(lambda seen=seen: failed > seen, what="another failed try")
    assert len(records(caplog, "aiolock.lock", logging.WARNING, "Redis unreachable")) == 1
    assert records(caplog, "aiolock.lock", logging.INFO, "answers again") == []
    down = False
    await blocked
    infos = records(caplog, "aiolock.lock", logging.INFO, "answers again")
    assert len(infos) == 1 and "lock 'down'" in infos[0], infos
    assert len(records(caplog, "aiolock.lock", logging.WARNING, "Redis unreachable")) == 1


def test_every_logger_is_under_aiolock_and_in_the_readme() -> None:
    """Each module logs on a named child of ``aiolock``, and the README's
    "Operating aiolock" section lists every one."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^## Operating aiolock\n(.*?)(?=^## )", readme, re.M | re.S)
    assert match, "README has no '## Operating aiolock' section"
    names = set()
    for path in (ROOT / "aiolock").rglob("*.py"):
        if "cli" in path.relative_to(ROOT / "aiolock").parts:
            continue
        for name in re.findall(r"getLogger\(\"([^\"]*)\"\)", path.read_text()):
            names.add(name)
    assert names - {"aiolock"}, "no logger found"
    for name in names - {"aiolock"}:
        assert name.startswith("aiolock."), name
        assert f"`{name}`" in match.group(1), f"{name} is not in the README's table"
