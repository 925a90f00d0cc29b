"""One multiplexed command connection shared by every task of a Client.

Commands are written synchronously, in the order they are submitted, and the
connection's protocol resolves one future per reply as it parses it, in the
same order (no reader task). So:

* thousands of tasks share one connection: no pool to exhaust, and commands
  from many tasks are pipelined for free;
* no await sits between "the command is on the wire" and "its future is
  queued": a task cancelled while waiting for its reply leaves the
  connection in sync. The reply is still read and handed to the caller's
  ``orphan`` callback, which undoes what the command did if that matters (an
  acquire that succeeded after its caller gave up);
* redis-py's command retries and its ``asyncio.wait_for`` socket timeouts are
  never on this path (redis-py does the handshake, see ``dialer``; our
  protocol reads the replies), so a script is never re-sent behind our back
  and a cancellation is never swallowed;
* a connection that stops answering (a paused server, a black-holed network)
  is detected: if no reply arrives for ``command_timeout`` seconds while
  commands are pending, it is closed and every pending command fails with a
  ``redis.exceptions.ConnectionError``. The next command reconnects.

Every error a command fails with is an AiolockError (``_errors.from_redis``,
redis-py's exception as its ``__cause__``): ConnectionFailedError when the
connection failed, ServerRefusedError (or WrongTypeError) for an error
reply.

A command may run a *script* (``script=``, a ``Loadable`` of the script
runner, runner.py): each connection remembers the scripts it loaded since it
connected, and writes a script's ``load`` command just before the first
command that runs it, in the same write (its reply goes to the script's
``loaded``): no round trip more, and nothing loaded that is never run there.
``reload=True`` writes the load whatever the connection remembers (the
runner's one re-send after the server said it lacks the script). What a
script is, how it is loaded and what says it is missing are the runner's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ..capabilities import STANDALONE, Capabilities
from ..errors import (
    ClientClosedError,
    ConnectionFailedError,
    ServerRefusedError,
    ServerUnavailableError,
    UnsupportedServerError,
    from_redis,
)
from ..futures import retrieve, stop
from ..outage import Outage
from .dialer import Dialer, Link
from .redis_compat import ConnectionFactory
from .resp import ReplyProtocol, pack

# (pack is resp.py's, re-exported here.)
__all__ = [
    "DID_NOT_RUN",
    "CommandConnection",
    "ConnectionFactory",
    "Lane",
    "Loadable",
    "Orphan",
    "pack",
]

#: The errors that say a command did not run (an error reply, a refusal):
#: an orphaned acquire that failed with one of these needs no undo.
DID_NOT_RUN = (ServerRefusedError, ServerUnavailableError, UnsupportedServerError, ResponseError)

#: Where command, renewal and BLPOP connections log their outages (see Dialer).
conn_log = logging.getLogger("aiolock.connection")


#: Receives the reply (or the error) of a command whose caller stopped waiting.
Orphan = Callable[[Any, BaseException | None], None]


class Loadable(Protocol):
    """A script as a connection sees it (the runner's, runner.py): what to
    write once per connection before the first command that runs it."""

    @property
    def load(self) -> tuple[Any, ...] | None:
        """The command that loads it on a connection (its reply: ``loaded``);
        None: nothing is written before its first run (a Functions library is
        loaded once per server, when a call finds it missing: the runner's
        ``reload`` then gives a Loadable that has a load)."""
        ...

    def loaded(self, reply: Any, error: BaseException | None) -> None:
        """The reply of a ``load`` (from the reply's parse; must not raise)."""
        ...


#: A command waiting for the connection: its arguments, future (None: ``send``),
#: orphan or callback, script, reload flag and ``before`` command.
_Backlogged = tuple[
    tuple[Any, ...],
    asyncio.Future[Any] | None,
    Orphan | None,
    Loadable | None,
    bool,
    tuple[Any, ...] | None,
]


class Lane(Protocol):
    """What the Engine sends commands through: one ``CommandConnection``
    (standalone) or a ``ClusterMux`` (cluster mode: one per master).

    ``script``: the command runs that script (see ``Loadable``; only the
    script runner gives one); ``reload``: load it again first, wherever the
    command runs."""

    @property
    def connects(self) -> int: ...

    @property
    def in_flight(self) -> int: ...

    def submit(
        self,
        *args: Any,
        orphan: Orphan | None = None,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> asyncio.Future[Any]: ...

    def send(
        self,
        *args: Any,
        callback: Orphan,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> None: ...

    async def call(
        self,
        *args: Any,
        orphan: Orphan | None = None,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> Any: ...

    async def drain(self, seconds: float) -> None: ...

    async def aclose(self) -> None: ...


class SafeCalls:
    """The cancellation-safe ``call`` of every lane (a standalone connection,
    a cluster's mux, an acknowledged connection): written once here.

    A lane's ``submit(*args, orphan=)`` sends at once and returns the reply's
    future; if that future is cancelled before the reply, ``orphan`` gets the
    reply. ``call`` awaits it, and covers the one gap the lane cannot see: a
    reply that arrived in the loop iteration the caller was cancelled in (the
    future was done, not cancelled, so the lane did not call ``orphan``).
    """

    __slots__ = ()

    def submit(
        self,
        *args: Any,
        orphan: Orphan | None = None,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> asyncio.Future[Any]:
        raise NotImplementedError

    async def call(
        self,
        *args: Any,
        orphan: Orphan | None = None,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> Any:
        """Submit a command and wait for its reply (see ``submit`` for ``orphan``)."""
        fut = self.submit(*args, orphan=orphan, script=script, reload=reload)
        try:
            return await fut
        except asyncio.CancelledError:
            if orphan is not None and fut.done() and not fut.cancelled():
                exc = fut.exception()
                orphan(None if exc is not None else fut.result(), exc)
            raise


def reply_future(orphan: Orphan | None) -> tuple[asyncio.Future[Any], Orphan]:
    """A reply future and the callback that settles it, for a lane that is
    given callbacks: a reply for a cancelled future goes to ``orphan``."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def done(reply: Any, error: BaseException | None) -> None:
        if fut.cancelled():
            if orphan is not None:
                orphan(reply, error)
        elif error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(reply)

    return fut, done


class CommandConnection(SafeCalls):
    """A lazily connected, pipelined, cancellation-safe command connection."""

    def __init__(
        self,
        factory: ConnectionFactory,
        *,
        command_timeout: float,
        on_connect: Callable[[], Iterable[tuple[Any, ...]]] = tuple,
        on_reset: Callable[[], None] | None = None,
        redirects: bool = False,
        capabilities: Capabilities = STANDALONE,
        role: str = "command",
        log: logging.Logger | None = conn_log,
        outage: Outage | None = None,
    ) -> None:
        # capabilities.follows_master (a master named by Sentinels): a READONLY
        # reply says it was demoted (a failover): that command fails with a
        # retryable ServerUnavailableError (code READONLY), and the connection
        # is dropped, so that the next one asks the Sentinels for the master.
        # on_reset: called when an established connection is lost (not on
        # close): the server behind the next one may have lost every key.
        # redirects: a cluster node's lane (topology/mux.py follows MOVED and ASK);
        # standalone, a MOVED or ASK reply means the server is a cluster node
        # this Client was told is not one: UnsupportedServerError.
        self.redirects = redirects
        self.capabilities = capabilities
        # role, log, outage: how its outages are logged (see Dialer).
        self.dialer = Dialer(factory, on_reset=on_reset, role=role, log=log, outage=outage)
        self._command_timeout = command_timeout
        self._on_connect = on_connect
        self._link: Link | None = None  # the connection, once connected
        # Futures of commands on the wire, in send order, with their orphan
        # handlers; or (None, callback) for a command sent with send().
        self._pending: deque[tuple[asyncio.Future[Any] | None, Orphan | None]] = deque()
        # Commands submitted while (re)connecting, sent once connected.
        self._backlog: list[_Backlogged] = []
        # The scripts loaded on the current connection since it connected (see
        # ``Loadable``): a new connection starts with none.
        self._loaded: set[Loadable] = set()
        # Resolved when nothing is pending any more (see drain()).
        self._idle: asyncio.Future[None] | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._replies = 0
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._closers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it runs on

    @property
    def connects(self) -> int:
        return self.dialer.connects

    # -- submitting -----------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._backlog)

    def submit(
        self,
        *args: Any,
        orphan: Orphan | None = None,
        script: Loadable | None = None,
        reload: bool = False,
    ) -> asyncio.Future[Any]:
        """Send a command now (or as soon as connected) and return its reply future.

        If the future is cancelled before the reply arrives, ``orphan`` is
        called exactly once with ``(reply, None)`` or ``(None, error)``.
        ``script``, ``reload``: see ``Loadable``.
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            fut.set_exception(_closed_error())
            return fut
        link = self._link
        if link is None:
            self._backlog.append((args, fut, orphan, script, reload, None))
            if self._connect_task is None:
                self._connect_task = loop.create_task(self._connect(), name="aiolock-connect")
            return fut
        if script is None or (not reload and script in self._loaded):
            link.transport.write(pack(args))
        else:
            self._write(link, args, script, reload, None)
        self._queued(fut, orphan)
        return fut

    def send(
        self,
        *args: Any,
        callback: Orphan,
        script: Loadable | None = None,
        reload: bool = False,
        before: tuple[Any, ...] | None = None,
    ) -> None:
        """Send a command now (or as soon as connected); ``callback(reply, error)``
        is called exactly once, from the reply's parse (no loop turn in between)
        or with the error that failed it. The callback must not raise.

        ``script``, ``reload``: see ``Loadable``. ``before``: a command written
        just before this one, after its script's load, its reply ignored (a
        cluster's ``ASKING``, which applies to the next command only)."""
        if self._closed:
            callback(None, _closed_error())
            return
        link = self._link
        if link is None:
            self._backlog.append((args, None, callback, script, reload, before))
            if self._connect_task is None:
                loop = asyncio.get_running_loop()
                self._connect_task = loop.create_task(self._connect(), name="aiolock-connect")
            return
        if before is None and (script is None or (not reload and script in self._loaded)):
            link.transport.write(pack(args))
        else:
            self._write(link, args, script, reload, before)
        self._queued(None, callback)

    def _write(
        self,
        link: Link,
        args: tuple[Any, ...],
        script: Loadable | None,
        reload: bool,
        before: tuple[Any, ...] | None,
    ) -> None:
        """Write one command, preceded (in the same write) by its script's load
        if this connection has not loaded it (or ``reload``), then ``before``.
        The caller queues the command's own reply."""
        command = pack(args)  # first: an argument it refuses leaves nothing queued
        parts = []
        if script is not None and (reload or script not in self._loaded):
            self._loaded.add(script)
            load = script.load
            if load is not None:  # (None: loaded only on the runner's reload)
                parts.append(pack(load))
                self._queued(None, script.loaded)
        if before is not None:
            parts.append(pack(before))
            self._queued(None, _ignore)
        parts.append(command)
        link.transport.write(b"".join(parts))

    def _queued(self, fut: asyncio.Future[Any] | None, orphan: Orphan | None) -> None:
        self._pending.append((fut, orphan))
        if self._timer is None:
            self._arm_timer()

    # -- liveness ---------------------------------------------------------------

    def _arm_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._command_timeout, self._check_alive, self._replies)

    def _check_alive(self, replies_at_arm: int) -> None:
        self._timer = None
        if not self._pending:
            return
        if self._replies == replies_at_arm:
            # Nothing came back for a whole command_timeout: the server or the
            # network is gone. Fail everything pending; the next call reconnects.
            self._drop(
                RedisConnectionError(
                    f"no reply from Redis for {self._command_timeout:g} s; connection closed"
                )
            )
            return
        self._arm_timer()

    # -- connecting and reading -------------------------------------------------

    async def _connect(self) -> None:
        try:
            # The handshake (AUTH, SELECT...) may hang on a paused server.
            # From then on our protocol parses replies as they arrive and
            # resolves the callers' futures at once: no reader task.
            link = await self.dialer.open(self._reply_protocol, self._command_timeout)
        except BaseException as exc:
            self._connect_task = None
            backlog, self._backlog = self._backlog, []
            cause: Exception = (
                exc if isinstance(exc, Exception) else RedisConnectionError(repr(exc))
            )
            # Not a refusal (AUTH...): the commands were never written (not_sent).
            not_sent = type(from_redis(cause)) is ConnectionFailedError
            for _, fut, orphan, *_rest in backlog:
                _fail(fut, orphan, cause, not_sent)
            if not isinstance(exc, Exception):
                raise
            return
        self._connect_task = None
        if self._closed:
            await link.close()
            return
        self._link = link
        self._loaded = set()  # a new connection: no script loaded on it yet
        write = link.transport.write
        # Session set-up first, then whatever queued meanwhile.
        for args in self._on_connect():
            write(pack(args))
            self._queued(None, _ignore)
        backlog, self._backlog = self._backlog, []
        for args, fut, orphan, script, reload, before in backlog:
            if fut is not None and fut.cancelled():
                continue  # its caller gave up before it was ever sent
            self._write(link, args, script, reload, before)
            self._queued(fut, orphan)

    def _reply_protocol(self, link: Link) -> ReplyProtocol:
        return ReplyProtocol(self, link)

    def _deliver(self, reply: Any, error: BaseException | None) -> None:
        """Hand one reply to the oldest pending command."""
        self._replies += 1
        fut, orphan = self._pending.popleft()
        if not self._pending and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        if fut is None:
            assert orphan is not None
            orphan(reply, error)
        elif fut.cancelled():
            if orphan is not None:
                orphan(reply, error)
        elif error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(reply)

    def _drop(self, error: BaseException, link: Link | None = None) -> None:
        """Forget the current connection and fail every command pending on it,
        each with its own ConnectionFailedError caused by ``error`` (redis-py's)."""
        if link is not None and link is not self._link:
            return
        link, self._link = self._link, None
        if link is not None:
            link.abort()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if link is not None and not self._closed:
            self.dialer.lost(error)
        pending, self._pending = self._pending, deque()
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        for fut, orphan in pending:
            _fail(fut, orphan, error)
        if link is not None:
            task = asyncio.get_running_loop().create_task(link.close())
            self._closers.add(task)
            task.add_done_callback(self._closers.discard)
            task.add_done_callback(retrieve)  # (aclose waits for it, not for its outcome)

    def reset(self, reason: str) -> None:
        """Drop the connection (if any) as if it were lost: pending commands
        fail with ConnectionFailedError, the owner's ``on_reset`` runs, and the
        next command connects again (Sentinel mode: to the master named now)."""
        if self._link is not None:
            self._drop(RedisConnectionError(reason))

    async def drain(self, seconds: float) -> None:
        """Wait until every command submitted so far is answered, at most ``seconds``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (self._pending or self._backlog) and loop.time() < deadline:
            if self._idle is None or self._idle.done():
                self._idle = loop.create_future()
            if not self._pending:  # only a backlog: it is sent once connected
                await asyncio.sleep(0.01)
                continue
            await asyncio.wait([self._idle], timeout=deadline - loop.time())

    async def aclose(self) -> None:
        self._closed = True
        await stop(self._connect_task)
        self._drop(RedisConnectionError("aiolock command connection is closed"))
        if self._closers:
            # wait(), not gather(): a close cancelled here must not cancel the
            # closes it started (one cancelled before it ran leaves redis-py's
            # connection unclosed); a second aclose() waits for them.
            await asyncio.wait(list(self._closers))


def _closed_error() -> ClientClosedError:
    return ClientClosedError("the aiolock Client was closed; create a new one")


def _ignore(reply: Any, error: BaseException | None) -> None:
    return None


def _fail(
    fut: asyncio.Future[Any] | None,
    orphan: Orphan | None,
    cause: BaseException,
    not_sent: bool = False,
) -> None:
    """Fail one command with its own AiolockError caused by ``cause`` (redis-py's
    or the OS' error): an exception object is never shared by the tasks that
    raise it (each raise would add to its traceback and rewrite its cause).
    ``not_sent``: it was never written (ConnectionFailedError.not_sent)."""
    error = from_redis(cause)
    if not_sent and isinstance(error, ConnectionFailedError):
        error.not_sent = True
    if fut is None or fut.cancelled():
        if orphan is not None:
            orphan(None, error)
    elif not fut.done():
        fut.set_exception(error)
