"""OpenTelemetry: metrics and spans with the real SDK, against real servers.

The global providers can be set only once per process, so most tests hand
the Client's telemetry a private MeterProvider (an ``InMemoryMetricReader``)
and TracerProvider (an ``InMemorySpanExporter``) through ``OtelTelemetry``'s
test-only parameters; the globals themselves, set after the Client was
made, and the absence of any OpenTelemetry import without the API, are
checked in subprocesses.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import textwrap
import weakref
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

import aiolock
from aiolock._core.observe.otel import (
    ACQUISITIONS,
    BUCKETS,
    HOLD,
    HOLDS,
    KIND,
    LABEL_LIMIT,
    LOSSES,
    NAME,
    OUTCOME,
    SPAN,
    WAIT,
    WAITERS,
    OtelTelemetry,
)
from aiolock.testing import seam
from tests.core_util import eventually
from tests.servers import RedisServer

SUBPROCESS_TIMEOUT = 60


class Otel:
    """A private MeterProvider and TracerProvider, read in memory."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.tracers.get_tracer("test")

    def instrument(self, client: aiolock.Client, lock_label: Any = None) -> aiolock.Client:
        """Send ``client``'s telemetry here instead of to the global providers."""
        seam.observer(client).telemetry = OtelTelemetry(
            lock_label, meter_provider=self.meters, tracer_provider=self.tracers
        )
        return client

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def value(self, instrument: str, /, **attributes: str) -> float:
        """The sum (counters) or count (histograms) of the points with those attributes."""
        wanted = {f"aiolock.lock.{key}": value for key, value in attributes.items()}
        total = 0.0
        for point in self.points(instrument):
            if wanted.items() <= dict(point.attributes).items():
                total += point.count if hasattr(point, "count") else point.value
        return total

    def attribute_sets(self) -> list[dict[str, Any]]:
        return [
            dict(point.attributes)
            for name in (WAIT, HOLD, ACQUISITIONS, LOSSES, HOLDS, WAITERS)
            for point in self.points(name)
        ]

    def spans(self, name: str = SPAN) -> list[Any]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


@pytest.fixture
def otel() -> Otel:
    return Otel()


async def parked(client: aiolock.Client, count: int = 1) -> None:
    await eventually(lambda: client.statistics().waiting == count, what=f"{count} parked")


# --------------------------------------------------------------------------- outcomes


async def test_an_acquisition_and_its_hold_are_recorded(client: aiolock.Client, otel: Otel) -> None:
    otel.instrument(client)
    async with client.lock("plain"):
        assert otel.value(HOLDS, kind="lock") == 1
    assert otel.value(ACQUISITIONS, kind="lock", outcome="acquired") == 1
    assert otel.value(WAIT, kind="lock", outcome="acquired") == 1
    assert otel.value(HOLD, kind="lock") == 1
    assert otel.value(HOLDS, kind="lock") == 0
    (wait,) = otel.points(WAIT)
    assert tuple(wait.explicit_bounds) == BUCKETS  # the advice was taken
    assert 0 < wait.sum < 10
    # No name without lock_label; the outcome only where it means something.
    assert {frozenset(attrs) for attrs in otel.attribute_sets()} == {
        frozenset({KIND, OUTCOME}),
        frozenset({KIND}),
    }
    assert otel.spans() == []  # nothing waited, no span current


async def test_timed_out_cancelled_and_parked_tasks_are_counted(
    client: aiolock.Client, otel: Otel
) -> None:
    otel.instrument(client)
    lock = client.lock("busy")
    lease = await lock.acquire()

    async def other_task() -> aiolock.Lease | None:
        return await lock.try_acquire()

    assert await asyncio.create_task(other_task()) is None
    assert otel.value(ACQUISITIONS, outcome="timed_out") == 1
    assert otel.value(WAIT, outcome="timed_out") == 1

    waiter = asyncio.create_task(lock.acquire())
    await parked(client)
    assert otel.value(WAITERS, kind="lock") == 1
    assert otel.value(HOLDS, kind="lock") == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert otel.value(ACQUISITIONS, outcome="cancelled") == 1
    assert otel.value(WAITERS, kind="lock") == 0

    await lease.release()
    assert otel.value(HOLDS, kind="lock") == 0
    assert otel.value(ACQUISITIONS, outcome="acquired") == 1
    assert otel.value(HOLD, kind="lock") == 1


async def test_a_waiter_on_another_client_is_counted_while_parked(
    client: aiolock.Client, other_client: aiolock.Client, otel: Otel
) -> None:
    otel.instrument(other_client)
    lease = await client.lock("remote").acquire()
    waiter = asyncio.create_task(other_client.lock("remote").acquire())
    await parked(other_client)
    assert otel.value(WAITERS, kind="lock") == 1
    assert otel.value(HOLDS) == 0  # the hold is the other Client's
    await lease.release()
    got = await waiter
    assert otel.value(WAITERS, kind="lock") == 0
    assert otel.value(HOLDS, kind="lock") == 1
    await got.release()
    assert otel.value(HOLDS, kind="lock") == 0
    assert otel.value(ACQUISITIONS, kind="lock", outcome="acquired") == 1


async def test_a_failed_acquisition_is_counted(
    client: aiolock.Client, server: RedisServer, otel: Otel
) -> None:
    otel.instrument(client)
    server.execute("RPUSH", "aiolock:{listed}", "not a lock")
    with pytest.raises(aiolock.WrongTypeError):
        await client.lock("listed").acquire()
    assert otel.value(ACQUISITIONS, kind="lock", outcome="failed") == 1
    assert otel.value(WAIT, kind="lock", outcome="failed") == 1
    assert otel.value(HOLDS) == 0


async def test_a_lost_lease_is_counted(
    make_client: Any, other_client: aiolock.Client, otel: Otel
) -> None:
    # A 4.5 s lease: the watchdog looks every 1.5 s and finds it gone.
    client = otel.instrument(await make_client(lease=4.5))
    lease = await client.lock("stolen").acquire()
    assert otel.value(HOLDS, kind="lock") == 1
    assert await other_client.lock("stolen").force_release()
    await eventually(lambda: lease.lost, what="the lease lost")
    assert otel.value(LOSSES, kind="lock") == 1
    assert otel.value(HOLDS, kind="lock") == 0
    assert otel.value(HOLD, kind="lock") == 1


async def test_kinds_are_told_apart(client: aiolock.Client, otel: Otel) -> None:
    otel.instrument(client)
    rw = client.rw_lock("doc")
    async with rw.read:
        pass
    async with client.semaphore("pool", 2):
        pass
    kinds = {attrs[KIND] for attrs in otel.attribute_sets()}
    assert kinds == {"read_lock", "semaphore"}


async def test_counters_add_up_over_clients_and_outlive_them(make_client: Any, otel: Otel) -> None:
    first = otel.instrument(await make_client())
    second = otel.instrument(await make_client())
    async with first.lock("a"), second.lock("b"):
        assert otel.value(HOLDS, kind="lock") == 2
    assert otel.value(ACQUISITIONS, kind="lock", outcome="acquired") == 2
    await first.aclose()
    telemetry = weakref.ref(seam.observer(first).telemetry)
    seam.observer(first).telemetry = None
    gc.collect()
    assert telemetry() is None
    # A counter never goes down: the counts of a Client gone are kept.
    assert otel.value(ACQUISITIONS, kind="lock", outcome="acquired") == 2
    async with second.lock("b"):
        pass
    assert otel.value(ACQUISITIONS, kind="lock", outcome="acquired") == 3


async def test_a_client_gone_while_holding_leaves_no_hold_in_the_gauge(
    make_client: Any, otel: Otel
) -> None:
    """Its acquisitions stay counted; its holds (right now) go with it."""
    gone = otel.instrument(await make_client())
    await gone.lock("kept").acquire()
    assert otel.value(HOLDS, kind="lock") == 1
    telemetry = weakref.ref(seam.observer(gone).telemetry)
    seam.observer(gone).telemetry = None  # as if the Client were collected, unclosed
    gc.collect()
    assert telemetry() is None
    assert otel.value(HOLDS, kind="lock") == 0
    assert otel.value(ACQUISITIONS, kind="lock", outcome="acquired") == 1
    await gone.aclose()


async def test_closing_a_client_while_holding_is_not_a_loss(make_client: Any, otel: Otel) -> None:
    client = otel.instrument(await make_client())
    await client.lock("held at close").acquire()
    await client.aclose()
    assert client.statistics().losses == 0
    assert otel.value(LOSSES, kind="lock") == 0
    assert otel.value(HOLDS, kind="lock") == 0


async def test_a_raising_span_processor_never_leaks_a_lock(
    client: aiolock.Client,
    other_client: aiolock.Client,
    otel: Otel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exporter's bug (a span processor that raises when the acquire's span
    ends) must not reach the caller past the grant: the lock would stay held,
    renewed, with nobody to release it. The acquisition succeeds, the error
    is logged once."""

    class Broken(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            if span.name == SPAN:
                raise RuntimeError("exporter bug")

    otel.tracers.add_span_processor(Broken())
    otel.instrument(client)
    lock = client.lock("contended")
    holder = await other_client.lock("contended").acquire()
    with otel.tracer.start_as_current_span("request"):
        waiter = asyncio.create_task(lock.acquire(timeout=30))
        await parked(client)
        await holder.release()
        lease = await waiter  # parked, so it makes a span: the processor raises
    assert lease.fencing_token > 0
    await lease.release()
    assert not await lock.is_locked()
    errors = [r for r in caplog.records if r.name == "aiolock.lock" and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "OpenTelemetry raised" in errors[0].getMessage()


# --------------------------------------------------------------------------- lock_label


async def test_lock_label_names_the_series(client: aiolock.Client, otel: Otel) -> None:
    otel.instrument(client, lock_label=lambda name: name.split(":")[0])
    for order in range(3):
        async with client.lock(f"order:{order}"):
            pass
    assert otel.value(ACQUISITIONS, kind="lock", outcome="acquired", name="order") == 3
    assert otel.value(HOLD, name="order") == 3
    assert {attrs[NAME] for attrs in otel.attribute_sets()} == {"order"}


@pytest.mark.parametrize("label", ["raises", "returns an int"])
async def test_a_broken_lock_label_never_breaks_an_acquisition(
    client: aiolock.Client, otel: Otel, label: str, caplog: pytest.LogCaptureFixture
) -> None:
    def raising(name: str) -> str:
        raise ValueError(name)

    otel.instrument(client, lock_label=raising if label == "raises" else lambda name: 42)
    with caplog.at_level(logging.ERROR, logger="aiolock.lock"):
        for _ in range(2):
            async with client.lock("order:1"):
                pass
    assert otel.value(ACQUISITIONS, kind="lock", outcome="acquired") == 2
    assert all(NAME not in attrs for attrs in otel.attribute_sets())
    complaints = [r for r in caplog.records if "lock_label" in r.getMessage()]
    assert len(complaints) == 1, complaints  # once, not per event


def test_an_unbounded_lock_label_is_capped(otel: Otel, caplog: pytest.LogCaptureFixture) -> None:
    telemetry = OtelTelemetry(lambda name: name, meter_provider=otel.meters)
    with caplog.at_level(logging.ERROR, logger="aiolock.lock"):
        for order in range(LABEL_LIMIT + 10):
            telemetry.acquired("lock", f"order:{order}", "acquired", 0.001, False)
    names = {attrs.get(NAME) for attrs in otel.attribute_sets()}
    assert len(names) == LABEL_LIMIT + 1 and None in names  # the rest: without a name
    assert otel.value(ACQUISITIONS) == LABEL_LIMIT + 10
    assert len([r for r in caplog.records if "distinct labels" in r.getMessage()]) == 1


# --------------------------------------------------------------------------- spans


async def test_a_span_only_for_an_acquisition_that_waited_under_a_current_span(
    client: aiolock.Client, otel: Otel
) -> None:
    otel.instrument(client)
    lock = client.lock("traced")

    # Uncontended, inside a span: no acquire span.
    with otel.tracer.start_as_current_span("quick"):
        async with lock:
            pass
    assert otel.spans() == []

    # Contended, no current span: none either.
    lease = await lock.acquire()
    waiter = asyncio.create_task(lock.acquire())
    await parked(client)
    await lease.release()
    await (await waiter).release()
    assert otel.spans() == []

    # Contended, inside a span: one, its child.
    lease = await lock.acquire()

    async def request() -> None:
        with otel.tracer.start_as_current_span("request"):
            async with lock:
                pass

    task = asyncio.create_task(request())
    await parked(client)
    await lease.release()
    await task
    (span,) = otel.spans()
    (parent,) = otel.spans("request")
    assert span.parent is not None and span.parent.span_id == parent.context.span_id
    assert span.context.trace_id == parent.context.trace_id
    assert dict(span.attributes) == {KIND: "lock", OUTCOME: "acquired"}
    assert span.status.status_code is StatusCode.UNSET
    assert parent.start_time <= span.start_time < span.end_time <= parent.end_time


async def test_a_wait_that_timed_out_has_an_error_span(
    client: aiolock.Client, other_client: aiolock.Client, otel: Otel
) -> None:
    otel.instrument(other_client)
    lease = await client.lock("slow").acquire()
    with otel.tracer.start_as_current_span("request"):
        with pytest.raises(aiolock.LockTimeoutError):
            await other_client.lock("slow").acquire(timeout=0.2)
    (span,) = otel.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "timed_out"
    assert dict(span.attributes)[OUTCOME] == "timed_out"
    assert otel.value(WAITERS) == 0
    await lease.release()


# --------------------------------------------------------------------------- switches and globals


async def test_telemetry_false_makes_no_telemetry(make_client: Any) -> None:
    client = await make_client(telemetry=False)
    assert seam.observer(client).telemetry is None
    async with client.lock("quiet"):
        pass
    assert client.statistics().acquisitions == 1


def run_python(code: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


#: How the scripts below begin: ``install_sdk()`` sets the SDK's global
#: providers, in memory (after the Client was made, as an application may);
#: ``contended(client, lock)`` takes ``lock`` in a "request" span while it is
#: held, so that the acquisition waits and is then handed the lock.
SDK = """
import asyncio, sys
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import aiolock

def install_sdk():
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    exporter = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracers)
    return reader, exporter

async def contended(client, lock):
    lease = await lock.acquire()
    async def request():
        with trace.get_tracer("app").start_as_current_span("request"):
            async with lock:
                pass
    task = asyncio.create_task(request())
    while client.statistics().waiting == 0:
        await asyncio.sleep(0.005)
    await lease.release()
    await task
"""

GLOBALS = SDK + """
async def main():
    url = sys.argv[1]
    # Made before the application configures OpenTelemetry.
    async with aiolock.Client.from_url(url, lock_label=lambda n: n.split(":")[0]) as client, \\
            aiolock.Client.from_url(url, telemetry=False) as quiet:
        reader, exporter = install_sdk()
        await contended(client, client.lock("order:7"))
        async with quiet.lock("quiet:1"):
            pass

        names = set()
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        attrs = dict(p.attributes)
                        assert attrs["aiolock.lock.name"] == "order", attrs
                        if m.name == "aiolock.lock.wait.duration":
                            print("wait", attrs["aiolock.lock.outcome"], p.count)
                    names.add(m.name)
        print("instruments", " ".join(sorted(names)))
        print("spans", " ".join(s.name for s in exporter.get_finished_spans()))

asyncio.run(main())
"""


# Import-time behaviour, in subprocesses (seconds each under load): one server kind is enough.
ONE_SERVER = pytest.mark.parametrize("server", ["redis"], indirect=True)


@ONE_SERVER
def test_the_global_providers_are_used_even_when_set_after_the_client(url: str) -> None:
    out = run_python(GLOBALS, url)
    assert "wait acquired 2\n" in out, out
    assert (
        "instruments aiolock.lock.acquisitions aiolock.lock.hold.duration aiolock.lock.holds "
        "aiolock.lock.wait.duration aiolock.lock.waiters\n"
    ) in out, out
    assert "spans aiolock.acquire request\n" in out, out


UNLABELLED = SDK + """
from aiolock.testing import seam

async def main():
    url = sys.argv[1]
    async with aiolock.Client.from_url(url) as client:  # no lock_label: the Observer counts
        lock = client.lock("plain")
        async with lock:  # before any SDK: counted, not timed
            pass
        assert not seam.observer(client).live
        reader, exporter = install_sdk()

        async with lock:  # uncontended: the SDK is seen at once
            pass
        await contended(client, lock)  # handed on locally

        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        attrs = dict(p.attributes)
                        value = getattr(p, "count", None)
                        if value is None:
                            value = p.value
                        print(m.name, attrs.get("aiolock.lock.outcome", "-"), value)
        print("spans", " ".join(s.name for s in exporter.get_finished_spans()))

asyncio.run(main())
"""


@ONE_SERVER
def test_counts_are_exact_and_times_recorded_when_an_sdk_comes_after_the_client(url: str) -> None:
    """Without a lock_label the Observer keeps the counts itself and, while no
    SDK or tracer provider is set, makes no telemetry call (issue 20 item 8);
    one configured later is seen at the next uncontended acquisition."""
    out = run_python(UNLABELLED, url)
    assert "aiolock.lock.acquisitions acquired 4\n" in out, out  # the one before the SDK too
    assert "aiolock.lock.wait.duration acquired 3\n" in out, out  # timed from the SDK on
    assert "aiolock.lock.hold.duration - 3\n" in out, out
    assert "aiolock.lock.holds - 0\n" in out, out
    assert "aiolock.lock.waiters - 0\n" in out, out
    assert "spans aiolock.acquire request\n" in out, out


NO_OTEL = """
import asyncio, sys

def otel_modules():
    return {m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m]}

if sys.argv[2] == "blocked":  # as if opentelemetry were not installed
    sys.modules["opentelemetry"] = None
import redis.asyncio  # which imports OpenTelemetry itself, if it can (redis-py >= 7)
before = otel_modules()
import aiolock
from aiolock.testing import seam

async def acquire(**options):
    async with aiolock.Client.from_url(sys.argv[1], **options) as client:
        async with client.lock("plain") as lease:
            assert lease.fencing_token > 0
        assert seam.observer(client).telemetry is None
        assert client.statistics().acquisitions == 1

asyncio.run(acquire(telemetry=False) if sys.argv[2] == "off" else acquire())
assert otel_modules() == before, otel_modules() - before
assert "aiolock._core.observe.otel" not in sys.modules
print("ok")
"""


@ONE_SERVER
@pytest.mark.parametrize("how", ["blocked", "off"])
def test_nothing_of_opentelemetry_is_imported_without_it_or_when_off(url: str, how: str) -> None:
    """Not installed: aiolock works and imports nothing; ``telemetry=False``: not loaded."""
    assert run_python(NO_OTEL, url, how) == "ok\n"
