"""OpenTelemetry metrics and spans (imported only when ``opentelemetry-api`` is installed).

``OtelTelemetry`` is the ``Telemetry`` of observe.py over the *global* meter
and tracer providers. Made before the application configured them, its
instruments are the API's proxies, which start recording the moment
``metrics.set_meter_provider`` / ``trace.set_tracer_provider`` is called;
with only the API installed (no SDK configured) they are no-ops.

Instruments (meter ``aiolock``; names stable, in OpenTelemetry's semantic
convention style, README "Metrics and traces"):

* ``aiolock.lock.wait.duration``: Histogram, ``s``; kind, outcome (, name)
* ``aiolock.lock.hold.duration``: Histogram, ``s``; kind (, name)
* ``aiolock.lock.acquisitions``: Counter, ``{acquisition}``; kind, outcome (, name)
* ``aiolock.lock.losses``: Counter, ``{lease}``; kind (, name)
* ``aiolock.lock.holds``: UpDownCounter, ``{hold}``; kind (, name)
* ``aiolock.lock.waiters``: UpDownCounter, ``{task}``; kind (, name)

* wait: from the call to its end (acquired, timed_out, cancelled or
  failed), parked or not; hold: from the grant to the release or loss.
* ``aiolock.lock.kind``: the primitive ("lock", "fair_lock", "read_lock",
  ...); ``aiolock.lock.outcome``: acquired, timed_out, cancelled, failed;
  ``aiolock.lock.name``: only with ``Client(lock_label=...)``, the label the
  user's function returned for the lock's name (never the raw name:
  ``order:<id>`` names would explode the series). A label function that
  raises or returns something other than a str (or None) never breaks an
  acquisition: it is logged once on ``aiolock.lock`` and the event is
  recorded without a name.

Spans: an acquisition that had to wait (parked), when a span is current
(so an idle service, or one that does not trace, emits nothing), gets a
span ``aiolock.acquire``, child of the current span, from the start of the
acquisition to its end, with the attributes above and an ERROR status
unless acquired. Uncontended acquisitions never make a span.

Cost on the hot path: one attribute dict per (kind, outcome, label),
cached; no span work unless the acquisition waited.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Status, StatusCode

__all__ = ["ATTRIBUTES", "INSTRUMENTS", "OtelTelemetry"]

KIND = "aiolock.lock.kind"
OUTCOME = "aiolock.lock.outcome"
NAME = "aiolock.lock.name"
ATTRIBUTES = (KIND, OUTCOME, NAME)

WAIT = "aiolock.lock.wait.duration"
HOLD = "aiolock.lock.hold.duration"
ACQUISITIONS = "aiolock.lock.acquisitions"
LOSSES = "aiolock.lock.losses"
HOLDS = "aiolock.lock.holds"
WAITERS = "aiolock.lock.waiters"
INSTRUMENTS = (WAIT, HOLD, ACQUISITIONS, LOSSES, HOLDS, WAITERS)

SPAN = "aiolock.acquire"

#: Seconds: from sub-millisecond acquisitions to waits of minutes.
BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip

#: Attribute sets kept in the cache at most: a label function that is not
#: bounded after all costs the cache no more than this (the SDK has its own
#: cardinality limit per instrument, 2000 by default).
CACHE_LIMIT = 1024

log = logging.getLogger("aiolock.lock")


def _version() -> str:
    try:
        return version("aiolock")
    except PackageNotFoundError:  # run from a source tree
        return "0"


def _histogram(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    """A histogram in seconds with our buckets as advice (API >= 1.30; older: the SDK's)."""
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=BUCKETS
        )
    except TypeError:  # opentelemetry-api < 1.30: no advisory parameter
        return meter.create_histogram(name, unit="s", description=description)


class OtelTelemetry:
    """Records the Observer's events as OpenTelemetry metrics and spans.

    ``meter_provider`` / ``tracer_provider``: for tests only; the library
    always uses the global ones (None).
    """

    __slots__ = (
        "_acquisitions",
        "_attrs",
        "_complained",
        "_hold_time",
        "_holds",
        "_label",
        "_losses",
        "_tracer",
        "_wait_time",
        "_waiters",
    )

    def __init__(
        self,
        lock_label: Callable[[str], str | None] | None,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self._label = lock_label
        self._complained = False
        if meter_provider is None:
            meter = metrics.get_meter("aiolock", _version())
        else:
            meter = meter_provider.get_meter("aiolock", _version())
        self._wait_time = _histogram(
            meter, WAIT, "Time spent acquiring a lock, parked or not, whatever the outcome"
        )
        self._hold_time = _histogram(
            meter, HOLD, "Time a lock was held, from its grant to its release or loss"
        )
        self._acquisitions = meter.create_counter(
            ACQUISITIONS,
            unit="{acquisition}",
            description="Acquisitions, by outcome: acquired, timed_out, cancelled, failed",
        )
        self._losses = meter.create_counter(
            LOSSES, unit="{lease}", description="Leases lost while held"
        )
        self._holds = meter.create_up_down_counter(
            HOLDS, unit="{hold}", description="Locks held by this process right now"
        )
        self._waiters = meter.create_up_down_counter(
            WAITERS, unit="{task}", description="Tasks waiting (parked) for a lock right now"
        )
        self._tracer = trace.get_tracer("aiolock", _version(), tracer_provider)
        # One attribute dict per (kind, outcome, label): no allocation per event.
        self._attrs: dict[tuple[str, str, str | None], dict[str, str]] = {}

    def _labelled(self, name: str) -> str | None:
        label: Any
        try:
            label = self._label(name) if self._label is not None else None
        except Exception:
            if not self._complained:
                self._complained = True
                log.exception(
                    "lock_label raised for the lock name %r: metrics and spans are "
                    "recorded without aiolock.lock.name when it does (logged once)",
                    name,
                )
            return None
        if label is None or type(label) is str:
            return label
        if not self._complained:
            self._complained = True
            log.error(
                "lock_label returned %r (a %s) for the lock name %r, not a str or None: "
                "metrics and spans are recorded without aiolock.lock.name when it does "
                "(logged once)",
                label,
                type(label).__name__,
                name,
            )
        return None

    def _attributes(self, kind: str, outcome: str, name: str) -> dict[str, str]:
        label = self._labelled(name) if self._label is not None else None
        key = (kind, outcome, label)
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = {KIND: kind}
            if outcome:
                attrs[OUTCOME] = outcome
            if label is not None:
                attrs[NAME] = label
            if len(self._attrs) < CACHE_LIMIT:
                self._attrs[key] = attrs
        return attrs

    def acquired(self, kind: str, name: str, outcome: str, seconds: float, waited: bool) -> None:
        attrs = self._attributes(kind, outcome, name)
        self._wait_time.record(seconds, attrs)
        self._acquisitions.add(1, attrs)
        if waited and trace.get_current_span().get_span_context().is_valid:
            end = time.time_ns()
            span = self._tracer.start_span(
                SPAN, start_time=end - int(seconds * 1e9), attributes=attrs
            )
            if outcome != "acquired":
                span.set_status(Status(StatusCode.ERROR, outcome))
            span.end(end_time=end)

    def waiting(self, kind: str, name: str, delta: int) -> None:
        self._waiters.add(delta, self._attributes(kind, "", name))

    def held(self, kind: str, name: str, delta: int, seconds: float) -> None:
        attrs = self._attributes(kind, "", name)
        self._holds.add(delta, attrs)
        if delta < 0:
            self._hold_time.record(seconds, attrs)

    def lost(self, kind: str, name: str) -> None:
        self._losses.add(1, self._attributes(kind, "", name))
