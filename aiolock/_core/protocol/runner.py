"""The script runner: the one place that loads, sends and recovers aiolock's scripts.

Every Lua script a Client runs goes through ``ScriptRunner`` (the Engine's
``eval``, ``submit_script`` and ``send_script`` delegate to it). It alone

* holds the Client's scripts (scripts.py: standalone text, or the cluster
  variants once the Engine finds a cluster) as ``Program`` objects;
* builds the command that runs one (``Program.command``: ``EVALSHA``, its
  SHA1, the keys and the arguments; ``Function.command``: ``FCALL``, the
  function's versioned name, the keys and the arguments);
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
sent again (the script did not run: its orphan is told so). The same holds
for every further try (``next_try``): a library missing, EVALSHA refused in
``auto`` mode; each is sent only when the previous one did not run, with the
same ``orphan``, so a cancellation at any of them leaves what one try left.

Scripting (the Client's ``scripting`` option):

* ``"eval"``: EVALSHA, as above.
* ``"functions"``: every script is a function of one Functions library
  (functions.py: its name and its functions' carry aiolock's version and a
  digest of its text). A call is sent bare (``FCALL``); the library is
  loaded once per server, when a call finds it missing ("Function not
  found": a new server, a restart, a failover or FUNCTION FLUSH that lost
  it): ``FUNCTION LOAD`` (never ``REPLACE``; "already exists" is success)
  and the call, in one write, once, as for NOSCRIPT. A user that may not
  load it gets a ServerRefusedError (NOPERM) naming ``aiolock functions
  load``, which an operator runs once; then users that may only FCALL work.
  A server without Functions (before Redis 7.0): UnsupportedServerError.
* ``"auto"`` (the default): EVALSHA, until a server refuses EVALSHA or
  SCRIPT LOAD to this user (ACL: NOPERM), or has no such command (renamed
  away). That call did not run: the Client
  switches to Functions for good (every script, every server: one ACL
  setting) and sends it again as an FCALL. No round trip more where EVAL
  is allowed.

The runner names no primitive: what it needs to know of a script (a
watchdog renewal batch, keys of many slots) the script's header says
(``--@runner``, read by scripts.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any, Literal

from ..errors import AiolockError, ServerRefusedError, UnsupportedServerError, clause, from_redis
from ..transport.connection import Lane, Loadable, Orphan, reply_future
from ..transport.replication import Unacknowledged
from .functions import LibraryText, library_text
from .scripts import Script, load_scripts

__all__ = ["SCRIPTING", "Function", "Library", "Program", "ScriptRunner", "Scripting", "missing"]

log = logging.getLogger("aiolock.lock")

#: How scripts run: EVALSHA, Redis Functions, or EVALSHA unless the ACL forbids it.
Scripting = Literal["auto", "eval", "functions"]
SCRIPTING = ("auto", "eval", "functions")

#: The command that runs a loaded script, and the one that loads it.
_RUN = b"EVALSHA"
_LOAD = (b"SCRIPT", b"LOAD")
#: The error code of a server that lacks the script.
_MISSING = "NOSCRIPT"
#: The command that calls a function, and the one that loads the library.
_FCALL = b"FCALL"
_FUNCTION_LOAD = (b"FUNCTION", b"LOAD")
#: What a server says of a function it lacks, and of a library it has.
_NO_FUNCTION = "function not found"
_EXISTS = re.compile(r"library '[^']*' already exists", re.IGNORECASE)
#: An ACL refusal of EVAL, EVALSHA or SCRIPT (auto: use Functions instead).
_NO_EVAL = re.compile(r"no permissions to run the '(?:evalsha|eval|script(?:\|\w+)?)' command")
#: A server without EVALSHA or SCRIPT (renamed away, or no Lua engine).
_NO_EVAL_COMMAND = re.compile(r"unknown command .?(?:evalsha|eval|script)\b")
#: A server without the command (Redis before 7.0 has no FCALL, FUNCTION).
_UNKNOWN = re.compile(r"unknown command", re.IGNORECASE)
#: What an operator runs once, for users that may not load the library.
LOAD_COMMAND = "aiolock functions load --url redis://..."


def _text(error: BaseException) -> str:
    """The server's own reply in ``error`` (redis-py's exception, its cause)."""
    return str(error.__cause__ if error.__cause__ is not None else error)


def missing(error: BaseException | None) -> bool:
    """Whether ``error`` says the server lacks the script or the function (it did not run)."""
    if not isinstance(error, ServerRefusedError):
        return False
    return error.code == _MISSING or _NO_FUNCTION in _text(error).lower()


def _eval_forbidden(error: BaseException) -> bool:
    """Whether ``error`` is the ACL's refusal of EVALSHA or SCRIPT LOAD itself
    (not of a command a script ran), or says the server has no such command
    (renamed away, or a server without Lua): the call did not run."""
    if not isinstance(error, ServerRefusedError):
        return False
    said = _text(error).lower()
    if error.code == "NOPERM":
        return _NO_EVAL.search(said) is not None
    return _NO_EVAL_COMMAND.search(said) is not None


def _caused(error: AiolockError, cause: BaseException) -> AiolockError:
    error.__cause__ = cause.__cause__ if cause.__cause__ is not None else cause
    return error


class Program:
    """One script of one Client as the runner sends it with EVALSHA (a
    connection's ``Loadable``): identity-hashed, so a connection's set of
    loaded scripts costs one lookup per command."""

    __slots__ = ("failure", "first", "head", "load", "name", "reloader", "script")

    #: Runs as a Redis Function (``Function``), not with EVALSHA.
    function = False

    def __init__(self, script: Script) -> None:
        self.script = script
        self.name = script.name
        #: The Loadable a first try passes (loaded with the first run on a
        #: connection), and the one a try after "missing" passes with ``reload``.
        self.first: Loadable = self
        self.reloader: Loadable = self
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

    def lost(self, error: BaseException, where: str = "the server") -> BaseException:
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


class Library:
    """The Client's Functions library as a connection loads it (a
    ``Loadable``, shared by every ``Function``): ``FUNCTION LOAD`` without
    ``REPLACE``, whose "already exists" is success."""

    __slots__ = ("failure", "load", "name")

    def __init__(self, text: LibraryText) -> None:
        self.name = text.name
        self.load: tuple[Any, ...] | None = (*_FUNCTION_LOAD, text.source.encode())
        #: The last load's refusal (ACL, an old server...), None once one succeeded.
        self.failure: BaseException | None = None

    def loaded(self, reply: Any, error: BaseException | None) -> None:
        if error is not None and _EXISTS.search(_text(error)):
            error = None
        self.failure = error if isinstance(error, ServerRefusedError) else None

    def __repr__(self) -> str:
        return f"<Library {self.name}>"


class _Routed:
    """A Function's first try: routed as a script (its first key), nothing
    loaded before it (the library is loaded once per server, on demand)."""

    __slots__ = ()
    load = None

    def loaded(self, reply: Any, error: BaseException | None) -> None:
        return None


_ROUTED = _Routed()


class Function:
    """One script of one Client as a function of its library (``FCALL``)."""

    __slots__ = ("first", "head", "library", "name", "reloader", "script")

    function = True

    def __init__(self, script: Script, library: Library, function: str) -> None:
        self.script = script
        self.name = script.name
        self.library = library
        self.head = (_FCALL, function.encode())
        self.first: Loadable = _ROUTED
        self.reloader: Loadable = library

    def command(self, keys: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The command that calls this function on ``keys`` and ``args``."""
        return (*self.head, len(keys), *keys, *args)

    def lost(self, error: BaseException, where: str = "the server") -> BaseException:
        """The caller's error after "Function not found" twice in a row: why
        the library's load was refused, if it was (``where``: the server)."""
        failure = self.library.failure
        if failure is None:
            return error
        said = clause(_text(failure))
        if _UNKNOWN.search(said):
            return _caused(_no_functions(said, where), failure)
        if isinstance(failure, ServerRefusedError) and failure.code == "NOPERM":
            return _caused(
                ServerRefusedError(
                    f"this Redis user may not load aiolock's Functions library "
                    f"{self.library.name} (FUNCTION LOAD: {said}), and the server lacks it. "
                    f"An operator loads it once, with `{LOAD_COMMAND}` (every master of a "
                    "cluster); then users that may only run FCALL work. Or use "
                    "scripting='eval' where EVALSHA is allowed",
                    "NOPERM",
                ),
                failure,
            )
        if failure.__cause__ is None:
            return failure
        return _caused(from_redis(failure.__cause__), failure)

    def __repr__(self) -> str:
        return f"<Function {self.head[1].decode()}>"


def _where(lane: Lane | None) -> str:
    """The server behind ``lane`` for a message: its address if it has one
    connection (a cluster's lane picks a node per key)."""
    address = getattr(getattr(lane, "dialer", None), "address", None)
    return f"the server at {address}" if address and address != "?" else "the server"


def _no_functions(said: str, where: str) -> UnsupportedServerError:
    return UnsupportedServerError(
        f"{where} does not support Redis Functions (it answered {said!r}): they need "
        "Redis 7.0+ or Valkey 7.2+. scripting='functions' (or scripting='auto' with "
        "EVAL and EVALSHA forbidden by the ACL) cannot run there: upgrade the server, or "
        "allow EVALSHA and SCRIPT LOAD to this user and use scripting='eval'. "
        "Nothing was changed in Redis"
    )


def _function_error(error: BaseException, auto: bool, where: str) -> BaseException:
    """A Function's failure as the caller sees it: an old server's "unknown
    command" is UnsupportedServerError; an ACL refusal of FCALL says which
    commands are forbidden."""
    said = clause(_text(error))
    if not isinstance(error, ServerRefusedError):
        return error
    if _UNKNOWN.search(said) and ("fcall" in said.lower() or "function" in said.lower()):
        return _caused(_no_functions(said, where), error)
    if error.code == "NOPERM" and "'fcall'" in said.lower():
        forbidden = "EVALSHA and FCALL are" if auto else "FCALL is"
        return _caused(
            ServerRefusedError(
                f"Redis refused the command: {said}. {forbidden} forbidden to this user by "
                "the ACL: aiolock runs its scripts with one of them (scripting='eval': "
                "EVALSHA and SCRIPT LOAD; 'functions': FCALL, and FUNCTION LOAD unless an "
                f"operator ran `{LOAD_COMMAND}`)",
                "NOPERM",
            ),
            error,
        )
    return error


#: What runs one script: EVALSHA (``Program``) or FCALL (``Function``).
Runnable = Program | Function


class _Resend:
    """The callback of one script sent with a callback (``send``, ``submit``):
    when the script did not run (NOSCRIPT, "Function not found", or, in
    ``auto`` mode, EVALSHA forbidden) it sends the command again (the
    runner's ``next_try``), from the reply's parse (no loop turn: it stays
    ahead of the caller's later commands), unless its caller stopped waiting
    (``gone``). The caller's callback must not raise: an exception is logged."""

    __slots__ = ("args", "callback", "gone", "keys", "lane", "program", "reloaded", "runner")

    def __init__(
        self,
        runner: ScriptRunner,
        lane: Lane,
        program: Runnable,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        callback: Orphan,
        gone: Callable[[], bool] | None,
    ) -> None:
        self.runner = runner
        self.lane = lane
        self.program = program
        self.keys = keys
        self.args = args
        self.callback = callback
        self.gone = gone
        self.reloaded = False

    def __call__(self, reply: Any, error: BaseException | None) -> None:
        if error is not None:
            step = self.runner.next_try(self.program, error, self.reloaded, self.lane)
            if isinstance(step, BaseException):
                error = step
            elif self.gone is None or not self.gone():
                self.program, self.reloaded = step
                self.runner.send_on(self.lane, self.program, self.keys, self.args, self, step[1])
                return
        try:
            self.callback(reply, error)
        except Exception:
            log.exception("reply handler of the script %r failed", self.program.name)


class ScriptRunner:
    """Runs the Client's scripts (see the module docstring).

    ``route(key)``: the lane that serves ``key`` (the Engine's routing);
    ``acked()``: the acknowledged lane, or None; ``background``: the
    Engine's background tasks (an unacknowledged acquisition's undo is one);
    ``command_timeout``: how long an undo is waited for; ``scripting``:
    EVALSHA, Functions, or ``auto`` (see the module docstring).
    """

    def __init__(
        self,
        *,
        route: Callable[[Any], Lane],
        acked: Callable[[], Lane | None],
        background: set[asyncio.Task[Any]],
        command_timeout: float,
        scripting: Scripting = "auto",
    ) -> None:
        self._route = route
        self._acked = acked
        self._background = background
        self._command_timeout = command_timeout
        #: ``auto``: switch to Functions when the ACL forbids EVALSHA (once).
        self.auto = scripting == "auto"
        #: Runs every script as a Redis Function (``scripting="functions"``,
        #: or ``auto`` once EVALSHA was refused).
        self.functions = scripting == "functions"
        #: Why ``auto`` switched to Functions (the server's refusal of EVALSHA), if it did.
        self.eval_refusal: str | None = None
        self._scripts: dict[str, Script] = {}
        self.programs: dict[str, Runnable] = {}
        #: The Functions library, once scripts run as functions.
        self.library: Library | None = None
        self.use(load_scripts())

    # -- the scripts ---------------------------------------------------------------------------

    @property
    def scripts(self) -> dict[str, Script]:
        """The scripts by name (their text and SHA1)."""
        return dict(self._scripts)

    def use(self, scripts: dict[str, Script]) -> None:
        """Run these scripts from now on (the cluster variants, once a cluster
        is found). Each connection loads one when it first runs it (EVALSHA);
        a server loads the library when a call first finds it missing (Functions)."""
        self._scripts = dict(scripts)
        if not self.functions:
            self.library = None
            self.programs = {name: Program(script) for name, script in scripts.items()}
            return
        text = library_text(scripts)
        library = self.library = Library(text)
        self.programs = {
            name: Function(script, library, text.functions[name])
            for name, script in scripts.items()
        }

    def use_cluster(self) -> None:
        """The cluster variant of every script (scripts.py: SPUBLISH, the
        renewals' node form, the cross-slot flag)."""
        self.use(load_scripts(cluster=True))

    def next_try(
        self, program: Runnable, error: BaseException, reloaded: bool, lane: Lane | None = None
    ) -> tuple[Runnable, bool] | BaseException:
        """After ``program`` failed with ``error``: what to send next (the
        program, and whether to load it again first), or the caller's error.

        Each step is taken only when the script did not run: missing on the
        server (sent once more, loaded again first; missing again at once is
        the caller's error, with why the load was refused), or, in ``auto``
        mode, EVALSHA or SCRIPT LOAD forbidden by the ACL (the Client switches
        to Functions, and the call goes again as an FCALL). So a call is sent
        at most four times (EVALSHA, with its load, FCALL, with the library)."""
        if missing(error):
            if not reloaded:
                return program, True
            error = program.lost(error, _where(lane))
        if not program.function:
            if self.auto and _eval_forbidden(error):
                if not self.functions:
                    log.info(
                        "this Redis user may not run EVALSHA or SCRIPT LOAD (%s): aiolock "
                        "runs its scripts as Redis Functions from now on (scripting='auto')",
                        clause(_text(error)),
                    )
                    self.eval_refusal = clause(_text(error))
                    self.functions = True
                    self.use(self._scripts)
                return self.programs[program.name], False
            return error
        return _function_error(error, self.auto, _where(lane))

    def no_scripts(self, error: AiolockError, server: str) -> AiolockError | None:
        """``error`` (a script's failure) as UnsupportedServerError if ``server``
        runs no scripts at all: EVALSHA unknown, and (``auto`` tried them next:
        ``eval_refusal``) Functions missing too. None: the error says what is
        wrong already (an ACL, a library not loaded)."""
        said = clause(_text(error))
        if _NO_EVAL_COMMAND.search(said.lower()):
            pass  # scripting="eval": EVALSHA is all it tries
        elif self.eval_refusal is None or not _NO_EVAL_COMMAND.search(self.eval_refusal.lower()):
            return None
        elif not isinstance(error, UnsupportedServerError):
            return None  # Functions were there, and refused otherwise: that error says it
        else:
            said = f"{self.eval_refusal}, and then: {said}"
        return _caused(
            UnsupportedServerError(
                f"{server} runs no scripts (it answered {said!r}): every aiolock primitive is "
                "a Lua script, run with EVALSHA or as a Redis Function with FCALL. Enable "
                "scripting on the server (Garnet: start it with --lua and "
                "--lua-transaction-mode; Valkey: keep its Lua engine loaded), or use "
                "scripting='functions' where FCALL is available. Nothing was changed in Redis"
            ),
            error,
        )

    # -- running -------------------------------------------------------------------------------

    def send_on(
        self,
        lane: Lane,
        program: Runnable,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        callback: Orphan,
        reload: bool = False,
    ) -> None:
        """Send ``program`` on ``lane``; ``callback`` gets the reply (``_Resend``)."""
        script = program.reloader if reload else program.first
        lane.send(*program.command(keys, args), callback=callback, script=script, reload=reload)

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
        resend = _Resend(self, lane, program, keys, args, done, fut.cancelled)
        lane.send(*program.command(keys, args), callback=resend, script=program.first)
        return fut

    def send(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], callback: Orphan
    ) -> None:
        """Send a script for ``keys[0]``; ``callback(reply, error)`` runs once,
        from the reply's parse (after one NOSCRIPT recovery if need be). It
        must not raise."""
        program = self.programs[name]
        lane = self._route(keys[0])
        resend = _Resend(self, lane, program, keys, args, callback, None)
        lane.send(*program.command(keys, args), callback=resend, script=program.first)

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
        if lane is None:
            acked = self._acked() if orphan is not None else None
            if acked is not None:
                return await self._eval_acked(acked, program, keys, args, orphan)
            lane = self._route(keys[0])
        reload = False
        while True:
            script = program.reloader if reload else program.first
            try:
                return await lane.call(
                    *program.command(keys, args), orphan=orphan, script=script, reload=reload
                )
            except ServerRefusedError as exc:
                step = self.next_try(program, exc, reload, lane)
                if isinstance(step, BaseException):
                    if step is exc:
                        raise
                    raise step  # noqa: B904 (its cause: the server's reply)
                program, reload = step

    async def _eval_acked(
        self,
        lane: Lane,
        program: Runnable,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Orphan | None,
    ) -> Any:
        assert orphan is not None
        reload = False
        while True:
            script = program.reloader if reload else program.first
            try:
                return await lane.call(
                    *program.command(keys, args), orphan=orphan, script=script, reload=reload
                )
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
                step = self.next_try(program, exc, reload, lane)
                if isinstance(step, BaseException):
                    if step is exc:
                        raise
                    raise step  # noqa: B904 (its cause: the server's reply)
                program, reload = step
