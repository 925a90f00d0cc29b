"""A server restart that loses every key: holds are reported lost at once, and
a Client never hands out, without a round trip, a fencing token from a hold
the server has not confirmed since the Client's connections were re-established
(DESIGN: fencing tokens)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError

from aiolock import Client, Lease, LockLostError, LockNotOwnedError
from aiolock._history import Op, check
from aiolock.testing import seam
from tests.core_util import assert_clean, evalsha_calls, eventually
from tests.servers import RedisServer, ServerProcess

if TYPE_CHECKING:
    from aiolock._core.transport.connection import CommandConnection

#: Long enough that the watchdog's first round (lease / 3 = 10 s after the
#: acquisition) cannot be what notices anything in these tests.
LEASE = 30.0


async def test_restart_never_hands_a_local_waiter_a_lower_token(
    fresh_server: ServerProcess,
) -> None:
    """The issue's reproduction: A's t1 holds x, A's t2 waits locally; the server
    restarts empty; B acquires x; then t1 releases. t1 must learn its lease is
    lost, and t2 must never hold x while B does, nor with a token below B's."""
    async with (
        Client.from_url(fresh_server.url, prefix="rs", lease=LEASE) as a,
        Client.from_url(fresh_server.url, prefix="rs", lease=LEASE) as b,
    ):
        lock_a, lock_b = a.lock("x"), b.lock("x")
        await lock_b.is_locked()  # B is connected before the restart, like A
        t1_invoked = time.monotonic_ns()
        first = await lock_a.acquire()
        t1_at = [t1_invoked, time.monotonic_ns(), 0]
        t1_told: list[int] = []
        first.on_lost(lambda _: t1_told.append(time.monotonic_ns()))
        t_at: dict[str, tuple[int, int]] = {}
        t_released: dict[str, int] = {}
        # Who holds x, in the order they got it: (who, token); "-who" when it left.
        log: list[tuple[str, int]] = []
        inside: set[str] = set()

        def enter(who: str, lease: Lease) -> None:
            assert not inside, f"{who} got x while {inside} held it"
            inside.add(who)
            log.append((who, lease.fencing_token))

        def leave(who: str) -> None:
            inside.discard(who)
            t_released[who] = time.monotonic_ns()

        async def t2() -> int:
            invoked = time.monotonic_ns()
            lease = await lock_a.acquire()
            t_at["t2"] = (invoked, time.monotonic_ns())
            enter("t2", lease)
            await asyncio.sleep(0.05)
            leave("t2")
            await lease.release()
            return lease.fencing_token

        waiter = asyncio.create_task(t2())
        state = seam.local_states(a)[lock_a._key]
        await eventually(lambda: len(state.lot) == 1, what="t2 to queue behind t1 locally")

        fresh_server.restart()  # every key gone, fence counters too

        b_invoked = time.monotonic_ns()
        held_b = await asyncio.wait_for(lock_b.acquire(), 20)
        b_at = (b_invoked, time.monotonic_ns())
        enter("B", held_b)
        with pytest.raises(LockNotOwnedError):
            await first.release()
        t1_at[2] = time.monotonic_ns()
        assert first.lost, "t1's lease is reported lost"
        # A buggy local handoff gives t2 the lock within a loop turn of t1's
        # release; give it far more than that to show itself.
        await asyncio.sleep(0.5)
        leave("B")
        await held_b.release()
        t2_token = await asyncio.wait_for(waiter, 20)

        # The same, proved by the history checker over every hold of x: t1's
        # (lost: the server said not owned), B's and t2's.
        history = [
            Op("x", first.fencing_token, t1_at[0], t1_at[1], t1_at[2], lost=t1_told[0],
               confirmed_gone=True, who="t1"),
            Op("x", held_b.fencing_token, *b_at, t_released["B"], who="B"),
            Op("x", t2_token, *t_at["t2"], t_released["t2"], who="t2"),
        ]  # fmt: skip
        assert not check(history), check(history)
        assert {who for who, _ in log} == {"t2", "B"}
        tokens = [token for _, token in log]
        assert tokens == sorted(tokens) and len(set(tokens)) == 2, (
            f"tokens rise in the order x was held: {log}"
        )
        assert t2_token > first.fencing_token
        await assert_clean(a, b)


async def test_restart_reports_every_hold_lost_at_once(fresh_server: ServerProcess) -> None:
    """After the reconnect every hold is checked at once: a watchdog hold is lost
    before the watchdog's first round, a fixed lease long before it runs out,
    and an ``async with`` body is cancelled with LockLostError."""
    async with Client.from_url(fresh_server.url, prefix="rs", lease=LEASE) as a:
        renewed = await a.lock("w").acquire()
        fixed = await a.lock("f").acquire(lease=120)
        rounds_at_loss: list[int] = []
        renewed.on_lost(lambda _: rounds_at_loss.append(seam.watchdog_rounds(a)))
        fixed_lost = asyncio.Event()
        fixed.on_lost(lambda _: fixed_lost.set())
        in_body = asyncio.Event()

        async def body() -> None:
            async with a.lock("b"):
                in_body.set()
                await asyncio.Event().wait()  # until the lease is lost

        task = asyncio.create_task(body())
        await in_body.wait()

        fresh_server.restart()

        with pytest.raises(LockLostError):
            await asyncio.wait_for(task, 60)
        await asyncio.wait_for(fixed_lost.wait(), 60)  # its own expiry is 120 s away
        await eventually(lambda: renewed.lost, timeout=60, what="the watchdog hold lost")
        assert rounds_at_loss == [0], "found lost by the check after the reconnect, not by a round"
        for lease in (renewed, fixed):
            with pytest.raises(LockNotOwnedError):
                await lease.release()
        await assert_clean(a)


async def test_healthy_reconnect_keeps_holds_and_free_local_handoffs(
    fresh_server: ServerProcess,
) -> None:
    """Connections killed, data intact: the holds are verified at once (the
    watchdog hold renewed, the fixed lease left as it was), none is lost, and
    the lock passes to a local waiter without a round trip again."""
    async with Client.from_url(fresh_server.url, prefix="rs", lease=LEASE) as a:
        lock = a.lock("h")
        first = await lock.acquire()
        fixed = await a.lock("f").acquire(lease=120)
        # As if 10 s of the lease had passed (and the watchdog were late).
        fresh_server.execute("PEXPIRE", "rs:{h}", 20_000)
        fixed_ttl = int(fresh_server.execute("PTTL", "rs:{f}"))

        assert fresh_server.kill_normal_clients() >= 1

        def renewed() -> bool:
            return int(fresh_server.execute("PTTL", "rs:{h}")) > 25_000

        await eventually(renewed, timeout=60, what="the hold renewed after the reconnect")
        assert seam.watchdog_rounds(a) == 0, (
            "renewed by the check after the reconnect, not a round"
        )
        assert 0 < int(fresh_server.execute("PTTL", "rs:{f}")) <= fixed_ttl, "never extended"
        assert not first.lost and not fixed.lost
        await eventually(lambda: seam.verifier(a) is not None and seam.verifier(a).done())

        waiter = asyncio.create_task(lock.acquire())
        state = seam.local_states(a)[lock._key]
        await eventually(lambda: len(state.lot) == 1, what="the waiter to queue locally")
        calls = evalsha_calls(fresh_server)
        await first.release()
        second = await asyncio.wait_for(waiter, 20)
        assert evalsha_calls(fresh_server) == calls, "the local handoff made a round trip"
        assert second.fencing_token == first.fencing_token + 1
        await second.release()
        await fixed.release()
        await assert_clean(a)


async def test_release_before_the_check_goes_to_the_server(fresh_server: ServerProcess) -> None:
    """t1 releases as soon as the Client sees its connection drop, before any
    check could have answered: the lock is not passed to t2 locally (t1's hold
    was not confirmed since), so the release finds the hold gone (t1's lease is
    lost) and t2 gets x from the server, really held there."""
    async with Client.from_url(fresh_server.url, prefix="rs", lease=LEASE) as a:
        lock = a.lock("x")
        first = await lock.acquire()
        waiter = asyncio.create_task(lock.acquire())
        state = seam.local_states(a)[lock._key]
        await eventually(lambda: len(state.lot) == 1, what="t2 to queue behind t1 locally")
        epoch = seam.connection_epoch(a)

        fresh_server.restart()

        await eventually(  # the drop is seen; nothing was sent since
            lambda: seam.connection_epoch(a) != epoch,
            timeout=20,
            interval=0,
            what="the Client to see its connection drop",
        )
        with pytest.raises(LockNotOwnedError):
            await first.release()
        assert first.lost
        second = await asyncio.wait_for(waiter, 20)
        assert fresh_server.execute("EXISTS", "rs:{x}") == 1, "t2's hold is in Redis"
        assert second.fencing_token > first.fencing_token
        await second.release()
        await assert_clean(a)


async def test_pubsub_connection_loss_alone_verifies_the_holds(
    fresh_server: ServerProcess,
) -> None:
    """A loss seen only by the listener (its pub/sub connection dropped, the
    command connections untouched) starts a new epoch too: the holds are
    checked at once."""
    async with (
        Client.from_url(fresh_server.url, prefix="rs", lease=LEASE) as a,
        Client.from_url(fresh_server.url, prefix="rs", lease=LEASE) as b,
    ):
        held = await a.lock("h").acquire()
        busy = await b.lock("busy").acquire()
        waiter = asyncio.create_task(a.lock("busy").acquire())  # keeps A's listener busy
        name = f"rs:{{busy}}:w:{a.id}".encode()  # A's channel of the lock (targeted)

        def subscribed() -> bool:
            channel = seam.listener_channels(a).get(name)
            return channel is not None and channel.is_confirmed

        await eventually(subscribed, what="A's waiter to be subscribed")
        fresh_server.execute("PEXPIRE", "rs:{h}", 20_000)  # as if 10 s had passed
        epoch, connects = seam.connection_epoch(a), a.statistics().command_connects

        assert fresh_server.kill_pubsub_clients() >= 1

        def renewed() -> bool:
            return int(fresh_server.execute("PTTL", "rs:{h}")) > 25_000

        await eventually(renewed, timeout=60, what="the hold renewed after the pub/sub loss")
        assert seam.watchdog_rounds(a) == 0, "renewed by the check, not by a watchdog round"
        assert seam.connection_epoch(a) > epoch and a.statistics().command_connects == connects
        assert not held.lost
        await busy.release()
        await (await asyncio.wait_for(waiter, 20)).release()
        await held.release()
        await assert_clean(a, b)


async def test_restart_reports_holds_of_every_primitive_lost_at_once(
    fresh_server: ServerProcess,
) -> None:
    """The check after a reconnect covers every kind of hold, not just AsyncLock's."""
    async with Client.from_url(fresh_server.url, prefix="rs", lease=LEASE) as a:
        leases = [
            await a.fair_lock("fair").acquire(),
            await a.rw_lock("rw").write.acquire(),
            await a.rw_lock("rr").read.acquire(),
            await a.semaphore("sem", 2).acquire(),
            await a.spin_lock("spin").acquire(),
        ]
        rounds_at_loss: list[int] = []
        for lease in leases:
            lease.on_lost(lambda _: rounds_at_loss.append(seam.watchdog_rounds(a)))

        fresh_server.restart()

        await eventually(
            lambda: all(lease.lost for lease in leases), timeout=60, what="every hold lost"
        )
        assert rounds_at_loss == [0] * len(leases), "found by the check, not by a watchdog round"
        for lease in leases:
            with pytest.raises(LockNotOwnedError):
                await lease.release()
        await assert_clean(a)


async def test_acquire_rides_out_a_server_loading_its_data(fresh_server: ServerProcess) -> None:
    """A server restarted with its data answers LOADING while it loads it: a
    transient state (ServerUnavailableError), retried like an outage, not a
    refusal that fails the wait at once."""
    fresh_server.execute("DEBUG", "POPULATE", "6000")
    fresh_server.execute("SAVE")  # loaded again by the restart
    # 1 ms per key: seconds of loading, with LOADING replies to clients meanwhile.
    fresh_server.extra_args = (
        "--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024",
    )  # fmt: skip
    # No retries of its own: each LOADING the server counts for it is one it raises.
    probe = aioredis.Redis(
        host=fresh_server.host, port=fresh_server.port, retry=Retry(NoBackoff(), 0)
    )
    async with Client.from_url(fresh_server.url, prefix="ld", lease=LEASE) as client:
        async with client.lock("warm"):
            pass  # connected before the restart

        loading_replies = 0

        async def loading() -> bool:
            nonlocal loading_replies
            try:
                await probe.get("x")
            except (BusyLoadingError, RedisConnectionError) as exc:
                loading_replies += isinstance(exc, BusyLoadingError)
                return isinstance(exc, BusyLoadingError)
            return False

        restart = asyncio.create_task(asyncio.to_thread(fresh_server.restart))
        try:
            await eventually(loading, timeout=20, what="the server loading its data")
            lease = await client.lock("k").acquire(timeout=120)
        finally:
            await restart
            await probe.aclose()
        errors = fresh_server.info("errorstats")
        assert errors["errorstat_LOADING"]["count"] > loading_replies, "the acquire met LOADING"
        assert fresh_server.info("persistence")["loading"] == 0
        await lease.release()
        await assert_clean(client)


async def _one_of_each(client: Client, tag: str) -> list[Lease]:
    """A fresh hold of every primitive (watchdog and fixed leases)."""
    multi = await client.multi_lock(client.lock(f"m1{tag}"), client.lock(f"m2{tag}")).acquire()
    return [
        await client.lock(f"l{tag}").acquire(),
        await client.lock(f"lf{tag}").acquire(lease=LEASE),
        await client.fair_lock(f"f{tag}").acquire(),
        await client.rw_lock(f"r{tag}").read.acquire(),
        await client.rw_lock(f"w{tag}").write.acquire(),
        await client.semaphore(f"s{tag}", 2).acquire(),
        await client.semaphore(f"sf{tag}", 2).acquire(lease=LEASE),
        *multi.leases,
    ]


async def test_every_primitive_confirms_its_new_holds(server: RedisServer) -> None:
    """A grant confirms a hold of any primitive in the epoch it was sent in:
    the verifier after a reset checks only the holds from before it, and
    ends after its round while new holds keep coming."""
    async with Client.from_url(server.url, prefix="cf", lease=LEASE) as client:
        before = await _one_of_each(client, "a")
        for lease in before:
            assert lease._hold.confirmed == seam.connection_epoch(client), lease
        epoch = seam.connection_epoch(client)
        # Each established connection lost is a new epoch: wait for them all.
        connected = sum(
            mux._link is not None
            for mux in (seam.command_lane(client), seam.renewal_lane(client))
        )
        assert server.kill_normal_clients() >= connected >= 1  # a reset
        await eventually(
            lambda: seam.connection_epoch(client) == epoch + connected,
            what="the connection losses seen",
        )
        after = await _one_of_each(client, "b")  # acquired while the verifier runs
        for lease in after:
            assert lease._hold.confirmed == seam.connection_epoch(client), lease
        verifier = seam.verifier(client)
        assert verifier is not None
        await asyncio.wait_for(asyncio.shield(verifier), 20)
        for lease in before:  # verified in the new epoch, not lost
            assert lease._hold.confirmed == seam.connection_epoch(client) and not lease.lost, (
                lease
            )
        more = await _one_of_each(client, "c")
        assert seam.verifier(client) is verifier and verifier.done(), "no verification needed"
        for lease in before + after + more:
            await lease.release()
        await assert_clean(client)


def spy_commands(
    monkeypatch: pytest.MonkeyPatch, mux: CommandConnection, task: asyncio.Task[Any]
) -> list[tuple[Any, ...]]:
    """The commands ``task`` itself submits on ``mux`` from now on (a list that
    grows): exact, unlike a count of pending commands, where another command's
    reply arriving at the same moment can hide the new one."""
    sent: list[tuple[Any, ...]] = []
    for name in ("submit", "send"):
        real = getattr(mux, name)

        def spy(*args: Any, real: Callable[..., Any] = real, **kwargs: Any) -> Any:
            if asyncio.current_task() is task:
                sent.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(mux, name, spy)
    return sent


async def test_hold_granted_across_a_reset_is_verified_at_once(
    fresh_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acquire sent before a reset and answered after it installs a hold
    from an older epoch: it is verified at once, even though the verifier the
    reset started found nothing to verify and ended."""
    async with (
        Client.from_url(fresh_server.url, prefix="cf", lease=LEASE) as client,
        Client.from_url(fresh_server.url, prefix="cf", lease=LEASE) as other,
    ):
        busy = await other.lock("busy").acquire()
        waiter = asyncio.create_task(client.lock("busy").acquire())  # connects the listener
        # (``other``'s too: it holds a lock, so it listens on its eviction channel.)
        await eventually(lambda: fresh_server.client_count("pubsub") >= 2, what="listeners")
        epoch = seam.connection_epoch(client)
        fresh_server.execute("CLIENT", "PAUSE", "30000", "WRITE")  # holds back scripts
        try:
            acquire = asyncio.create_task(client.semaphore("s", 2).acquire())
            sent_by_acquire = spy_commands(monkeypatch, seam.command_lane(client), acquire)
            await eventually(lambda: sent_by_acquire, what="the acquire sent")
            assert fresh_server.kill_pubsub_clients() >= 1  # a reset while it is held back
            await eventually(
                lambda: seam.connection_epoch(client) > epoch, what="the connection loss seen"
            )
            verifier = seam.verifier(client)
            assert verifier is not None
            await asyncio.wait_for(asyncio.shield(verifier), 20)  # nothing to verify yet
            assert not acquire.done()
        finally:
            fresh_server.execute("CLIENT", "UNPAUSE")
        permit = await asyncio.wait_for(acquire, 20)
        # Granted, but confirmed only in the epoch it was sent in: checked at once.
        await eventually(
            lambda: permit._hold.confirmed == seam.connection_epoch(client),
            what="the new hold verified",
        )
        assert seam.verifier(client) is not verifier
        await permit.release()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await busy.release()
        await assert_clean(client, other)
