"""OpenTelemetry metrics and spans (imported only when ``opentelemetry-api`` is installed).

``OtelTelemetry`` is the ``Telemetry`` of observe.py over the global meter
and tracer providers: with only the API installed (no SDK configured) its
instruments are OpenTelemetry's no-ops.

Instruments (all under the meter ``aiolock``):

* ``aiolock.lock.wait_time`` (histogram, s): time spent in an acquisition,
  by kind and outcome;
* ``aiolock.lock.hold_time`` (histogram, s): time from a hold's grant to
  its end (release or loss), by kind;
* ``aiolock.lock.acquisitions`` (counter): acquisitions by kind and outcome
  (acquired, timed_out, cancelled, failed);
* ``aiolock.lock.lost`` (counter): leases lost, by kind;
* ``aiolock.lock.holds`` (up-down counter): holds of this process right now;
* ``aiolock.lock.waiting`` (up-down counter): tasks waiting for a lock right now.

Attributes: ``aiolock.lock.kind``, ``aiolock.lock.outcome`` and, only when
the Client was given ``lock_label``, ``aiolock.lock.name`` with the label it
returned for the lock's name (never the raw name: ``order:<id>`` names would
explode cardinality).

Spans: an acquisition that had to wait, when a span is current (so an idle
service, or one without tracing, emits nothing), gets a span
``aiolock.acquire`` from the start of the acquisition to its end, with the
attributes above (and ``error`` status unless acquired).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from opentelemetry import metrics, trace
from opentelemetry.trace import Status, StatusCode

__all__ = ["OtelTelemetry"]

KIND = "aiolock.lock.kind"
OUTCOME = "aiolock.lock.outcome"
NAME = "aiolock.lock.name"

#: Seconds: from sub-millisecond local handoffs to waits of minutes.
BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


def _version() -> str:
    try:
        return version("aiolock")
    except PackageNotFoundError:  # run from a source tree
        return "0"


class OtelTelemetry:
    """Records the Observer's events as OpenTelemetry metrics and spans."""

    __slots__ = (
        "_acquisitions",
        "_attrs",
        "_hold_time",
        "_holds",
        "_label",
        "_lost",
        "_tracer",
        "_wait_time",
        "_waiting",
    )

    def __init__(self, lock_label: Callable[[str], str | None] | None) -> None:
        self._label = lock_label
        meter = metrics.get_meter("aiolock", _version())
        self._wait_time = meter.create_histogram(
            "aiolock.lock.wait_time",
            unit="s",
            description="Time spent acquiring a lock, whatever the outcome",
            explicit_bucket_boundaries_advisory=list(BUCKETS),
        )
        self._hold_time = meter.create_histogram(
            "aiolock.lock.hold_time",
            unit="s",
            description="Time a lock was held, from its grant to its release or loss",
            explicit_bucket_boundaries_advisory=list(BUCKETS),
        )
        self._acquisitions = meter.create_counter(
            "aiolock.lock.acquisitions",
            unit="{acquisition}",
            description="Acquisitions, by outcome: acquired, timed_out, cancelled, failed",
        )
        self._lost = meter.create_counter(
            "aiolock.lock.lost", unit="{lease}", description="Leases lost while held"
        )
        self._holds = meter.create_up_down_counter(
            "aiolock.lock.holds", unit="{hold}", description="Locks held by this process"
        )
        self._waiting = meter.create_up_down_counter(
            "aiolock.lock.waiting", unit="{task}", description="Tasks waiting for a lock"
        )
        self._tracer = trace.get_tracer("aiolock", _version())
        # One attribute dict per (kind, outcome, label): no allocation per event.
        self._attrs: dict[tuple[str, str, str | None], dict[str, str]] = {}

    def _attributes(self, kind: str, outcome: str, name: str) -> dict[str, str]:
        label = self._label(name) if self._label is not None else None
        key = (kind, outcome, label)
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = {KIND: kind}
            if outcome:
                attrs[OUTCOME] = outcome
            if label is not None:
                attrs[NAME] = str(label)
            self._attrs[key] = attrs
        return attrs

    def acquired(self, kind: str, name: str, outcome: str, seconds: float, waited: bool) -> None:
        attrs = self._attributes(kind, outcome, name)
        self._wait_time.record(seconds, attrs)
        self._acquisitions.add(1, attrs)
        if waited and trace.get_current_span().get_span_context().is_valid:
            end = time.time_ns()
            span = self._tracer.start_span(
                "aiolock.acquire", start_time=end - int(seconds * 1e9), attributes=attrs
            )
            if outcome != "acquired":
                span.set_status(Status(StatusCode.ERROR, outcome))
            span.end(end_time=end)

    def waiting(self, kind: str, name: str, delta: int) -> None:
        self._waiting.add(delta, self._attributes(kind, "", name))

    def held(self, kind: str, name: str, delta: int, seconds: float) -> None:
        attrs = self._attributes(kind, "", name)
        self._holds.add(delta, attrs)
        if delta < 0:
            self._hold_time.record(seconds, attrs)

    def lost(self, kind: str, name: str) -> None:
        self._lost.add(1, self._attributes(kind, "", name))
