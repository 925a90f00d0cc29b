"""OpenTelemetry metrics and spans (imported only when ``opentelemetry-api`` is installed).

``OtelTelemetry`` is the ``Telemetry`` of observe/observer.py over the *global* meter
and tracer providers. Made before the application configured them, its
instruments are the API's proxies, which start recording the moment
``metrics.set_meter_provider`` / ``trace.set_tracer_provider`` is called;
with only the API installed (no SDK configured) they are no-ops.

Instruments (meter ``aiolock``; names stable, in OpenTelemetry's semantic
convention style, README "Metrics and traces"):

* ``aiolock.lock.wait.duration``: Histogram, ``s``; kind, outcome (, name)
* ``aiolock.lock.hold.duration``: Histogram, ``s``; kind (, name)
* ``aiolock.lock.acquisitions``: asynchronous Counter, ``{acquisition}``; kind, outcome (, name)
* ``aiolock.lock.losses``: asynchronous Counter, ``{lease}``; kind (, outcome
  ``max_hold`` for a hold its max_hold ended) (, name)
* ``aiolock.lock.holds``: asynchronous UpDownCounter, ``{hold}``; kind (, name)
* ``aiolock.lock.waiters``: asynchronous UpDownCounter, ``{task}``; kind (, name)

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

Cost on the hot path: one SDK record is about 80 Python calls (it cleans
and hashes the attributes, looks for an exemplar, takes a lock), a good
part of what an acquire + release costs the client, so an uncontended
acquire + release makes only two, the histograms'. The counters and
up-down counters are *asynchronous*: the Client adds to plain dicts
(``Counts``) and the SDK reads their sums when it collects. Attribute dicts
are cached per series; no span work unless the acquisition waited.
With only the API installed (no SDK configured yet), the histograms are the
API's proxies with nothing behind them: they are not called, and no span is
looked for while the tracer is the API's proxy with no global
TracerProvider set; the counts are kept all the same, so an SDK configured
later reads true holds and waiters at once. Without a ``lock_label`` the
Observer keeps them itself (``tally``: by kind, str keys) and calls nothing
here while nothing records (``recording``; observe/observer.py, ``Observer.live``).
A waited acquisition ends its wait in ``acquired`` (no separate
``waiting(-1)``), and a local handoff is one ``handed`` call (the hold
counts do not move). ``benchmarks/instrumentation.py`` measures it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
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

#: Distinct labels a Client takes from ``lock_label`` at most; beyond them
#: (a label function that is not bounded after all) the name is left out.
LABEL_LIMIT = 1000

log = logging.getLogger("aiolock.lock")

#: (kind, outcome or "", label or None): one series.
Key = tuple[str, str, "str | None"]


def _version() -> str:
    try:
        return version("aiolock")
    except PackageNotFoundError:  # run from a source tree
        return "0"


def _attributes(key: Key) -> dict[str, str]:
    kind, outcome, label = key
    attrs = {KIND: kind}
    if outcome:
        attrs[OUTCOME] = outcome
    if label is not None:
        attrs[NAME] = label
    return attrs


def _histogram(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    """A histogram in seconds with our buckets as advice (API >= 1.30; older: the SDK's)."""
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=BUCKETS
        )
    except TypeError:  # opentelemetry-api < 1.30: no advisory parameter
        return meter.create_histogram(name, unit="s", description=description)


class Counts:
    """One Client's counts by series, which the asynchronous instruments report.

    Written by the Client's event loop only; read (copied) by the metric
    reader, possibly from its own thread.
    """

    __slots__ = (
        "__weakref__",
        "acquired_by_kind",
        "acquisitions",
        "holds",
        "holds_by_kind",
        "losses",
        "waiters",
        "waiters_by_kind",
    )

    def __init__(self) -> None:
        self.acquisitions: dict[Key, int] = {}
        self.losses: dict[Key, int] = {}
        self.holds: dict[Key, int] = {}
        self.waiters: dict[Key, int] = {}
        # The Observer's own counts (observe/observer.py, Tally: no lock_label), by kind
        # alone, for the series (kind, "acquired" or "", None): a str key is
        # hashed once, a tuple at every lookup.
        self.acquired_by_kind: dict[str, int] = {}
        self.holds_by_kind: dict[str, int] = {}
        self.waiters_by_kind: dict[str, int] = {}

    def series(self, field: str) -> list[tuple[Key, int]]:
        """The counts of ``field`` by series (a copy: one C call per dict, atomic)."""
        found = list(getattr(self, field).copy().items())
        by_kind, outcome = {
            "acquisitions": (self.acquired_by_kind, "acquired"),
            "holds": (self.holds_by_kind, ""),
            "waiters": (self.waiters_by_kind, ""),
        }.get(field, (None, ""))
        if by_kind is not None:
            found.extend(((kind, outcome, None), n) for kind, n in by_kind.copy().items())
        return found


MONOTONIC = ("acquisitions", "losses")


class Instruments:
    """The instruments of one meter provider, shared by every Client that records there.

    The counters are asynchronous: the Clients count in plain dicts
    (``Counts``, no OpenTelemetry call on the hot path) and the reader
    collects the sums. A Client gone (garbage collected) leaves its counts
    acquisitions and losses to ``retired``, so the counters stay monotonic.
    """

    def __init__(self, meter: metrics.Meter) -> None:
        self.lock = threading.Lock()
        self.live: list[tuple[weakref.ref[Any], Counts]] = []
        self.retired = Counts()
        self.wait_time = _histogram(
            meter, WAIT, "Time spent acquiring a lock, parked or not, whatever the outcome"
        )
        self.hold_time = _histogram(
            meter, HOLD, "Time a lock was held, from its grant to its release or loss"
        )
        # Counters (they never go down) and up-down counters (right now).
        counter, up_down = meter.create_observable_counter, meter.create_observable_up_down_counter
        acquisitions = "Acquisitions, by outcome: acquired, timed_out, cancelled, failed"
        for create, name, field, unit, description in (
            (counter, ACQUISITIONS, "acquisitions", "{acquisition}", acquisitions),
            (counter, LOSSES, "losses", "{lease}", "Leases lost while held"),
            (up_down, HOLDS, "holds", "{hold}", "Locks held by this process right now"),
            (up_down, WAITERS, "waiters", "{task}", "Tasks waiting (parked) for a lock right now"),
        ):
            create(name, [self.observer(field)], unit=unit, description=description)

    def register(self, owner: object) -> Counts:
        counts = Counts()
        with self.lock:
            self.live.append((weakref.ref(owner), counts))
        return counts

    def observer(self, field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, _attributes(key)) for key, value in self.sums(field)]

        return observe

    def sums(self, field: str) -> list[tuple[Key, int]]:
        with self.lock:
            if any(ref() is None for ref, _ in self.live):
                alive = []
                for ref, counts in self.live:
                    if ref() is not None:
                        alive.append((ref, counts))
                        continue
                    # Its owner is gone: nobody writes these now. The counters
                    # keep its share (they never go down); the up-down counters
                    # (holds, waiters right now) drop it: a Client collected
                    # without aclose() holds and waits for nothing any more.
                    for name in MONOTONIC:
                        into = getattr(self.retired, name)
                        for key, value in counts.series(name):
                            into[key] = into.get(key, 0) + value
                self.live = alive
            sources = [self.retired, *(counts for _, counts in self.live)]
        totals: dict[Key, int] = {}
        for counts in sources:
            for key, value in counts.series(field):
                totals[key] = totals.get(key, 0) + value
        return list(totals.items())


_lock = threading.Lock()
_global: Instruments | None = None
_private: weakref.WeakKeyDictionary[metrics.MeterProvider, Instruments] = (
    weakref.WeakKeyDictionary()
)


def instruments(meter_provider: metrics.MeterProvider | None) -> Instruments:
    """The global provider's instruments (None), or a given provider's: made once each."""
    global _global
    with _lock:
        if meter_provider is None:
            if _global is None:
                _global = Instruments(metrics.get_meter("aiolock", _version()))
            return _global
        found = _private.get(meter_provider)
        if found is None:
            found = _private[meter_provider] = Instruments(
                meter_provider.get_meter("aiolock", _version())
            )
        return found


class OtelTelemetry:
    """Records the Observer's events as OpenTelemetry metrics and spans.

    ``meter_provider`` / ``tracer_provider``: for tests only; the library
    always uses the global ones (None).
    """

    __slots__ = (
        "__weakref__",
        "_attrs",
        "_complained",
        "_counts",
        "_hold_time",
        "_label",
        "_labels",
        "_proxy_tracer",
        "_tracer",
        "_wait_time",
    )

    def __init__(
        self,
        lock_label: Callable[[str], str | None] | None,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self._label = lock_label
        self._labels: set[str] = set()
        self._complained = False
        shared = instruments(meter_provider)
        self._counts = shared.register(self)
        self._wait_time = shared.wait_time
        self._hold_time = shared.hold_time
        self._tracer = trace.get_tracer("aiolock", _version(), tracer_provider)
        # The API's proxy tracer (no provider given): it makes no span until
        # the application sets a global TracerProvider (checked in acquired()).
        self._proxy_tracer = isinstance(self._tracer, trace.ProxyTracer)
        # One attribute dict per series: no allocation per event.
        self._attrs: dict[Key, dict[str, str]] = {}

    def _complain(self, message: str, *args: object, exc_info: bool = False) -> None:
        if not self._complained:
            self._complained = True
            log.error(
                message + ": metrics and spans are recorded without aiolock.lock.name "
                "when it does (logged once)",
                *args,
                exc_info=exc_info,
            )

    def _labelled(self, name: str) -> str | None:
        label: Any
        try:
            label = self._label(name) if self._label is not None else None
        except Exception:
            self._complain("lock_label raised for the lock name %r", name, exc_info=True)
            return None
        if label is None:
            return None
        if type(label) is not str:
            self._complain(
                "lock_label returned %r (a %s) for the lock name %r, not a str or None",
                label,
                type(label).__name__,
                name,
            )
            return None
        if label in self._labels:
            return label
        if len(self._labels) >= LABEL_LIMIT:
            self._complain(
                "lock_label returned more than %d distinct labels (now %r for %r): "
                "it must map lock names to a bounded set",
                LABEL_LIMIT,
                label,
                name,
            )
            return None
        self._labels.add(label)
        return label

    def _key(self, kind: str, outcome: str, name: str) -> Key:
        return (kind, outcome, self._labelled(name) if self._label is not None else None)

    def _attributes(self, key: Key) -> dict[str, str]:
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = self._attrs[key] = _attributes(key)
        return attrs

    @property
    def tally(self) -> Counts | None:
        """This Client's counts, for the Observer to keep itself (no call per
        event), when no ``lock_label`` names the series; else None."""
        return self._counts if self._label is None else None

    def recording(self) -> bool:
        """Whether a histogram or a span may record anything now: an SDK's
        MeterProvider or a TracerProvider is set (given, or set globally; a
        global one set later is seen at once). While not, with ``tally``,
        the Observer makes no call here (issue 20 item 8)."""
        return (
            getattr(self._wait_time, "_real_instrument", self) is not None
            or not self._proxy_tracer
            or getattr(trace, "_TRACER_PROVIDER", True) is not None
        )

    def acquired(self, kind: str, name: str, outcome: str, seconds: float, waited: bool) -> None:
        # (_key inlined without a lock_label, here and below: a call less per event)
        key = (kind, outcome, None) if self._label is None else self._key(kind, outcome, name)
        counts = self._counts.acquisitions
        counts[key] = counts.get(key, 0) + 1
        if waited:
            # It waited: it stops waiting now (one call per acquisition, not two).
            wkey = (kind, "", None) if self._label is None else self._key(kind, "", name)
            waiters = self._counts.waiters
            waiters[wkey] = waiters.get(wkey, 0) - 1
        self._timed_wait(key, outcome, seconds, waited)

    def timed_wait(self, kind: str, name: str, outcome: str, seconds: float, waited: bool) -> None:
        """``acquired`` but the counts (kept by the Observer: ``tally``)."""
        key = (kind, outcome, None) if self._label is None else self._key(kind, outcome, name)
        self._timed_wait(key, outcome, seconds, waited)

    def _timed_wait(self, key: Key, outcome: str, seconds: float, waited: bool) -> None:
        hist = self._wait_time
        # Not the API's proxy with no SDK behind it (its record() does nothing;
        # a MeterProvider set later gives it a real instrument, seen at once):
        # no attributes looked up, no call. Same for the hold time below.
        if getattr(hist, "_real_instrument", hist) is not None:
            hist.record(seconds, self._attributes(key))
        if not waited:
            return
        if (
            not self._proxy_tracer or getattr(trace, "_TRACER_PROVIDER", True) is not None
        ) and trace.get_current_span().get_span_context().is_valid:
            # (No span lookup while our tracer is the API's proxy and no global
            # TracerProvider is set: it could only make a non-recording span.)
            end = time.time_ns()
            span = self._tracer.start_span(
                SPAN, start_time=end - int(seconds * 1e9), attributes=self._attributes(key)
            )
            if outcome != "acquired":
                span.set_status(Status(StatusCode.ERROR, outcome))
            span.end(end_time=end)

    def waiting(self, kind: str, name: str, delta: int) -> None:
        key = (kind, "", None) if self._label is None else self._key(kind, "", name)
        counts = self._counts.waiters
        counts[key] = counts.get(key, 0) + delta

    def held(self, kind: str, name: str, delta: int, seconds: float) -> None:
        key = (kind, "", None) if self._label is None else self._key(kind, "", name)
        counts = self._counts.holds
        counts[key] = counts.get(key, 0) + delta
        if delta < 0:
            hist = self._hold_time
            if getattr(hist, "_real_instrument", hist) is not None:
                hist.record(seconds, self._attributes(key))

    def timed_hold(self, kind: str, name: str, seconds: float) -> None:
        """A hold ended after ``seconds``: its histogram only (``held(-1)`` and
        ``handed`` but the counts, kept by the Observer: ``tally``)."""
        self.handed(kind, name, seconds)

    def handed(self, kind: str, name: str, seconds: float) -> None:
        """A hold ended after ``seconds`` and the next began at once, in this
        Client (a local handoff): held(-1, seconds) then held(+1, 0) in one call."""
        hist = self._hold_time
        if getattr(hist, "_real_instrument", hist) is not None:
            key = (kind, "", None) if self._label is None else self._key(kind, "", name)
            hist.record(seconds, self._attributes(key))

    def lost(self, kind: str, name: str, reason: str = "") -> None:
        key = self._key(kind, reason, name)
        counts = self._counts.losses
        counts[key] = counts.get(key, 0) + 1
