"""The script runner: the one place that loads, sends and recovers aiolock's scripts.

Every Lua script a Client runs goes through ``ScriptRunner`` (the Engine's
``eval``, ``submit_script`` and ``send_script`` delegate to it). It alone

* holds the Client's scripts (scripts.py: standalone text, or the cluster
  variants once the Engine finds a cluster) as ``Program`` objects;
* builds the command that runs one (``Program.command``: ``EVALSHA``, its
  SHA1, the keys and the arguments; Redis Functions would be a change here
  and in ``Program.load``, nowhere else);
* says how a script is loaded (``Program.load``: ``SCRIPT LOAD``) and what
  says it is missing (``NOSCRIPT``): the connections load a script lazily,
  in the same write as the first command that runs it on that connection
  (connection.py's ``Loadable``), so a new connection sends nothing before
  its first command, and then only the script that command runs;
* recovers from ``NOSCRIPT`` (the server lost the script mid-connection:
  SCRIPT FLUSH, or a load that failed): the script did not run, so the
  command is sent once more, by the same route, with ``reload`` (its load
  written again first, on whichever connection or cluster node it lands);
  a second NOSCRIPT in a row is the caller's error;
* routes by key: the lane the Engine's ``route(key)`` gives (the standalone
  connection, or the cluster's ``ClusterMux``, which picks the node), or the
  lane a caller names (the watchdog's);
* serves the acknowledged lane (``replicas=N``, replication.py): an
  acquisition (a call with an ``orphan``) runs there, and one that was not
  acknowledged is undone (its orphan) before ``ReplicationError`` is raised.

Cancellation: nothing here stands between a command on the wire and its
reply's handler but the lanes' own cancellation-safe ``call`` (connection.py):
a caller cancelled while its first try is in flight leaves its ``orphan`` to
handle the reply; a caller cancelled after the reply said NOSCRIPT is not
sent again (the script did not run: its orphan is told so).

The runner names no primitive: what it needs to know of a script (a
watchdog renewal batch, keys of many slots) the script's header says
(``--@runner``, read by scripts.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..errors import ServerRefusedError, from_redis
from ..transport.connection import Lane, Orphan, reply_future
from ..transport.replication import Unacknowledged
from .scripts import Script, load_scripts

__all__ = ["Program", "ScriptRunner", "missing"]

log = logging.getLogger("aiolock.lock")

#: The command that runs a loaded script, and the one that loads it.
_RUN = b"EVALSHA"
_LOAD = (b"SCRIPT", b"LOAD")
#: The error code of a server that lacks the script.
_MISSING = "NOSCRIPT"


def missing(error: BaseException | None) -> bool:
    """Whether ``error`` says the server lacks the script (it did not run)."""
    return isinstance(error, ServerRefusedError) and error.code == _MISSING


class Program:
    """One script of one Client as the runner sends it (a connection's
    ``Loadable``): identity-hashed, so a connection's set of loaded scripts
    costs one lookup per command."""

    __slots__ = ("failure", "head", "load", "name", "script")

    def __init__(self, script: Script) -> None:
        self.script = script
        self.name = script.name
        #: The command's start: what runs the script (then its keys and args).
        self.head = (_RUN, script.sha.encode())
        #: What loads it on a connection (connection.py writes it when needed).
        self.load: tuple[Any, ...] = (*_LOAD, script.source.encode())
        #: The last load's refusal (ACL, memory...), None once one succeeded.
        self.failure: BaseException | None = None

    def command(self, keys: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The command that runs this script on ``keys`` and ``args``."""
        return (*self.head, len(keys), *keys, *args)

    def loaded(self, reply: Any, error: BaseException | None) -> None:
        self.failure = error if isinstance(error, ServerRefusedError) else None

    def lost(self, error: BaseException) -> BaseException:
        """The caller's error after a second NOSCRIPT in a row: why its load
        was refused, if it was (the real cause: a copy of its own, redis-py's
        exception its cause), else that NOSCRIPT."""
        failure = self.failure
        if failure is None or failure.__cause__ is None:
            return error
        copy = from_redis(failure.__cause__)
        copy.__cause__ = failure.__cause__
        return copy

    def __repr__(self) -> str:
        return f"<Program {self.name} {self.script.sha[:8]}>"


class _Resend:
    """The callback of one script sent with a callback (``send``, ``submit``):
    on NOSCRIPT it sends the command once more, with ``reload``, from the
    reply's parse (no loop turn: it stays ahead of the caller's later
    commands), unless its caller stopped waiting (``gone``). The caller's
    callback must not raise: an exception is logged."""

    __slots__ = ("callback", "command", "gone", "lane", "program", "reloaded")

    def __init__(
        self,
        lane: Lane,
        program: Program,
        command: tuple[Any, ...],
        callback: Orphan,
        gone: Callable[[], bool] | None,
    ) -> None:
        self.lane = lane
        self.program = program
        self.command = command
        self.callback = callback
        self.gone = gone
        self.reloaded = False

    def __call__(self, reply: Any, error: BaseException | None) -> None:
        if error is not None and missing(error):
            if not self.reloaded and (self.gone is None or not self.gone()):
                self.reloaded = True
                self.lane.send(*self.command, callback=self, script=self.program, reload=True)
                return
            if self.reloaded:
                error = self.program.lost(error)
        try:
            self.callback(reply, error)
        except Exception:
            log.exception("reply handler of the script %r failed", self.program.name)


class ScriptRunner:
    """Runs the Client's scripts (see the module docstring).

    ``route(key)``: the lane that serves ``key`` (the Engine's routing);
    ``acked()``: the acknowledged lane, or None; ``background``: the
    Engine's background tasks (an unacknowledged acquisition's undo is one);
    ``command_timeout``: how long an undo is waited for.
    """

    def __init__(
        self,
        *,
        route: Callable[[Any], Lane],
        acked: Callable[[], Lane | None],
        background: set[asyncio.Task[Any]],
        command_timeout: float,
    ) -> None:
        self._route = route
        self._acked = acked
        self._background = background
        self._command_timeout = command_timeout
        self.programs: dict[str, Program] = {}
        self.use(load_scripts())

    # -- the scripts ---------------------------------------------------------------------------

    @property
    def scripts(self) -> dict[str, Script]:
        """The scripts by name (their text and SHA1)."""
        return {name: program.script for name, program in self.programs.items()}

    def use(self, scripts: dict[str, Script]) -> None:
        """Run these scripts from now on (the cluster variants, once a cluster
        is found). Each connection loads one when it first runs it."""
        self.programs = {name: Program(script) for name, script in scripts.items()}

    def use_cluster(self) -> None:
        """The cluster variant of every script (scripts.py: SPUBLISH, the
        renewals' node form, the cross-slot flag)."""
        self.use(load_scripts(cluster=True))

    # -- running -------------------------------------------------------------------------------

    def submit(
        self,
        name: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Orphan | None = None,
    ) -> asyncio.Future[Any]:
        """Send a script for ``keys[0]`` now; the future gets its reply (after
        one NOSCRIPT recovery if need be). A cancelled future's reply goes to
        ``orphan``."""
        program = self.programs[name]
        lane = self._route(keys[0])
        fut, done = reply_future(orphan)
        command = program.command(keys, args)
        resend = _Resend(lane, program, command, done, fut.cancelled)
        lane.send(*command, callback=resend, script=program)
        return fut

    def send(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], callback: Orphan
    ) -> None:
        """Send a script for ``keys[0]``; ``callback(reply, error)`` runs once,
        from the reply's parse (after one NOSCRIPT recovery if need be). It
        must not raise."""
        program = self.programs[name]
        lane = self._route(keys[0])
        command = program.command(keys, args)
        resend = _Resend(lane, program, command, callback, None)
        lane.send(*command, callback=resend, script=program)

    async def eval(
        self,
        name: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Orphan | None = None,
        lane: Lane | None = None,
    ) -> Any:
        """Run a script for ``keys[0]`` and return its reply. ``orphan(reply,
        error)`` runs if the caller gives up before the reply; ``lane``: this
        lane instead of the key's (the watchdog's).

        An acquisition (``orphan`` given, no ``lane``) runs on the
        acknowledged lane when there is one (replicas=N): it returns once the
        replicas acknowledged it, else it was undone by ``orphan`` and
        ReplicationError is raised.
        """
        program = self.programs[name]
        command = program.command(keys, args)
        if lane is None:
            acked = self._acked() if orphan is not None else None
            if acked is not None:
                return await self._eval_acked(acked, program, command, orphan)
            lane = self._route(keys[0])
        try:
            return await lane.call(*command, orphan=orphan, script=program)
        except ServerRefusedError as exc:
            if not missing(exc):
                raise
        try:  # it did not run: once more, loaded again first
            return await lane.call(*command, orphan=orphan, script=program, reload=True)
        except ServerRefusedError as exc:
            if missing(exc):  # lost again at once: give up
                raise program.lost(exc)  # noqa: B904 (its cause: the server's reply)
            raise

    async def _eval_acked(
        self, lane: Lane, program: Program, command: tuple[Any, ...], orphan: Orphan | None
    ) -> Any:
        assert orphan is not None
        for reload in (False, True):
            try:
                return await lane.call(*command, orphan=orphan, script=program, reload=reload)
            except Unacknowledged as exc:
                # Granted but not acknowledged: undo exactly what it took, and
                # let the caller see the error once the undo ran (its first
                # try, within command_timeout): nothing of the acquisition is
                # left in Redis then. A cancelled caller leaves the undo
                # running in the background (asyncio.wait cancels nothing).
                before = set(self._background)
                orphan(exc.reply, None)
                undoing = self._background - before
                if undoing:
                    await asyncio.wait(undoing, timeout=self._command_timeout)
                raise exc.error from exc.error.__cause__
            except ServerRefusedError as exc:
                if not missing(exc):
                    raise
                if reload:
                    raise program.lost(exc)  # noqa: B904 (its cause: the server's reply)
        raise AssertionError("unreachable")
