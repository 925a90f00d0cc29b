"""The one undo of an acquire call whose reply was lost, whatever the primitive.

An acquire script whose reply is lost (to a timeout or a cancellation) may
have run: ``Undo`` is the call's ``orphan`` handler, and cleans up in the
background, by idempotent scripts that target this call only. The Engine
makes one per acquire call (``Engine.undo``); this module needs of it only
what ``Cleaner`` names (no import of the engine).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..transport.connection import DID_NOT_RUN

__all__ = ["Call", "Cleaner", "OnReply", "Undo"]

#: One idempotent script call: (script name, keys, args).
Call = tuple[str, tuple[Any, ...], tuple[Any, ...]]
#: Given an acquire's reply and its undo's calls, the calls that undo what it did.
OnReply = Callable[[Any, tuple[Call, ...]], tuple[Call, ...]]


class Cleaner(Protocol):
    """What an undo needs of the engine (``Engine`` satisfies it structurally)."""

    @property
    def closed(self) -> bool: ...

    def clean_up(self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]) -> None:
        """Run an idempotent clean-up script in the background, with retries."""


class Undo:
    """The undo of one acquire call whose reply was lost: its ``orphan`` handler.

    The script may have run, so what it did is undone in the background, by
    idempotent scripts that target this call only (its attempt id, see
    ``Engine.attempt_id``), never the owner alone: an undo may run late (a
    retry after an outage), when the same task holds the lock again from a
    later call.

    * The reply was read after all (``error`` None): ``on_reply(reply,
      calls)`` says what to run (a release with the granted token, leaving
      a queue it joined, ...; nothing if it changed nothing); without
      ``on_reply``, ``calls`` are run whatever the reply.
    * The script failed (``DID_NOT_RUN``): it changed nothing, nothing to do.
    * Unknown whether it ran: ``calls`` (the primitive's clean-up of
      whatever this call may have done). ``abandon()`` and ``now()`` run them
      too (``compete`` gave up; the caller leaves).

    ``while_open``: skip the clean-up once the Client is closing (its
    ``aclose`` cleans up the holds itself).
    """

    __slots__ = ("calls", "engine", "on_reply", "while_open")

    def __init__(
        self,
        engine: Cleaner,
        calls: tuple[Call, ...],
        on_reply: OnReply | None,
        while_open: bool,
    ) -> None:
        self.engine = engine
        self.calls = calls
        self.on_reply = on_reply
        self.while_open = while_open

    def __call__(self, reply: Any, error: BaseException | None) -> None:
        if error is None:
            if self.on_reply is not None:
                self._run(self.on_reply(reply, self.calls))
                return
        elif isinstance(error, DID_NOT_RUN):
            return  # the script failed: it changed nothing
        self._run(self.calls)

    def now(self) -> None:
        """Clean up whatever this call may have done (unknown whether it ran)."""
        self._run(self.calls)

    abandon = now

    def _run(self, calls: tuple[Call, ...]) -> None:
        engine = self.engine
        if self.while_open and engine.closed:
            return
        for name, keys, args in calls:
            engine.clean_up(name, keys, args)
