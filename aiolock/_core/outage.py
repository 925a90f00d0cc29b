"""One log line per outage, with a count: the ``Outage`` helper.

A connection that keeps failing to reconnect, a watchdog that keeps failing
to renew, tasks that keep retrying while Redis is away: each would log a
line per attempt (every 250 ms, for as long as the outage lasts), and the
line that matters, the first, would scroll away. So whatever retries
through an outage keeps one ``Outage``: it says when a run of failures
*starts* (the owner logs one WARNING then), counts the failures of the run,
and says when it *ends* (the owner logs one INFO with the downtime and the
count). The owner words both lines; the helper only decides when.

    if outage.failed():               # True once per run: the first failure
        log.warning("... lost (%s); reconnecting", exc)
    ...
    run = outage.ended()              # None unless a run was under way
    if run is not None:
        log.info("... back after %.1f s; %d attempts failed", run.seconds, run.failures)
    # (or, for that line: outage.ended_logged(log, "... back after %.1f s; %d attempts failed"))

Times are ``time.monotonic()``: no event loop is needed.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

__all__ = ["Outage", "Run"]


class Run(NamedTuple):
    """A run of failures that has ended."""

    #: Seconds from its first failure to its end.
    seconds: float
    #: Failures counted in it (the first included).
    failures: int
    #: Whatever else the owner counted meanwhile with ``Outage.note`` (e.g. leases lost).
    noted: int


class Outage:
    """A run of failures of one thing (a connection, the renewals...): when it began, how many."""

    __slots__ = ("failing", "failures", "noted", "started")

    def __init__(self) -> None:
        #: For owners whose run is shared by several retrying parties (the
        #: waiting tasks of a Client): how many of them are failing now. The
        #: owner ends the run when the last one recovers or gives up, not on
        #: the first reply any of them gets (one node of a cluster down while
        #: the others answer is one outage, not a WARNING/INFO pair per try).
        self.failing = 0
        #: ``time.monotonic()`` at the first failure of the run under way, or None.
        self.started: float | None = None
        self.failures = 0
        self.noted = 0

    @property
    def ongoing(self) -> bool:
        return self.started is not None

    def failed(self) -> bool:
        """Count one failure. True when it starts a run: the owner logs it (once per run)."""
        self.failures += 1
        if self.started is not None:
            return False
        self.started = time.monotonic()
        return True

    def note(self, count: int = 1) -> None:
        """Count something else that happened during the run (ignored outside a run)."""
        if self.started is not None:
            self.noted += count

    def ended(self) -> Run | None:
        """The thing works again: the run that ended (for the owner's one line), or None."""
        started = self.started
        if started is None:
            return None
        run = Run(time.monotonic() - started, self.failures, self.noted)
        self.started = None
        self.failures = 0
        self.noted = 0
        return run

    def ended_logged(self, log: logging.Logger, message: str) -> Run | None:
        """``ended()``, and the owner's INFO line if a run ended: ``message`` is
        formatted with the run's seconds, then its failures (``%.1f`` ... ``%d``)."""
        run = self.ended()
        if run is not None:
            log.info(message, run.seconds, run.failures)
        return run
