"""The exception hierarchy. Every error aiolock raises derives from AiolockError."""

from __future__ import annotations

import re
from typing import Any

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "CANNOT_REACH",
    "TRANSIENT",
    "AiolockError",
    "AsyncioRequiredError",
    "ClientClosedError",
    "ConnectionFailedError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LockUpgradeError",
    "MasterChangedError",
    "ReplicationError",
    "ServerRefusedError",
    "ServerUnavailableError",
    "SharedCallError",
    "UnshareableResultError",
    "UnsupportedServerError",
    "WrongEventLoopError",
    "WrongTypeError",
    "asyncio_required",
    "clause",
    "from_redis",
    "sentence",
]


class AiolockError(Exception):
    """Base class of every error raised by aiolock."""


class LockTimeoutError(AiolockError, TimeoutError):
    """The wait for a lock ran out before it could be acquired.

    It is also a builtin :class:`TimeoutError`, so ``except TimeoutError``
    catches it together with ``asyncio.timeout()``'s.
    """


class LockNotOwnedError(AiolockError):
    """A release or extend of a hold the caller does not have.

    Raised when the current task holds nothing to release, or when Redis says
    the hold is gone (it expired or was force-released, and possibly taken by
    someone else since).
    """


class LockLostError(AiolockError):
    """The lease was lost while the lock was held.

    The watchdog found the hold gone or owned by someone else, or could not
    renew it before it expired, or a fixed lease ran out. Inside
    ``async with lock:`` the body was cancelled and this error replaces the
    cancellation, the way ``asyncio.timeout()`` raises ``TimeoutError``.
    """


class LockUpgradeError(AiolockError, RuntimeError):
    """A task that holds a read lock asked for the write lock of the same name.

    That would wait for ever (for itself to release its read hold), so it is
    refused at once. Release the read lock first, or take the write lock
    first and then the read lock (a downgrade is allowed).
    """


class ClientClosedError(AiolockError):
    """The Client was closed (``aclose()``); it cannot be used any more."""


class WrongEventLoopError(AiolockError, RuntimeError):
    """The Client was used from an event loop other than the one it is bound to.

    A Client, with its connections, listener and watchdog tasks, belongs to
    the first event loop it runs on. This usually happens when a Client is
    made at module level or in a session-scoped pytest fixture and then used
    from another loop (pytest-asyncio gives each test its own loop by default;
    every ``asyncio.run()`` makes a new one). Create the Client inside the
    loop that uses it (in a function-scoped fixture, or in your main
    coroutine): one Client per event loop.
    """


class UnsupportedServerError(AiolockError):
    """The server cannot run what this Client was asked to do, found when connecting.

    A cluster whose nodes run Redis older than 7.0 (or Valkey older than
    7.2): aiolock's cluster mode needs sharded pub/sub. Or a cluster node
    given as a plain ``redis.asyncio.Redis``: pass a
    ``redis.asyncio.RedisCluster``, or use ``Client.from_url(url)``. Or a
    mode that does not match the server: ``cluster=False`` on a cluster node
    (a MOVED or ASK reply; its ``__cause__`` is that reply), ``cluster=True``
    on a standalone server. Or Redis Functions asked for (``scripting=
    "functions"``, or ``"auto"`` where the ACL forbids EVAL) on a server
    without them (before Redis 7.0: FCALL is an unknown command; raised at
    the first call that needs them). Or what the capability probe found
    missing at the Client's first command (and after a Sentinel failover):
    a server that runs no scripts; one that refuses ``PUBLISH`` inside
    scripts while the Client's ``notify="pubsub"`` needs it (use
    ``notify="list"`` or ``"poll"``); ``replicas=N`` on a server without
    ``WAIT``. The message names the capability, the server (kind and
    version), and what to do. Nothing was changed in Redis.
    """


class ReplicationError(AiolockError):
    """Fewer replicas than the Client asks for (``replicas=N``) acknowledged
    an acquisition within ``replica_timeout``.

    The acquisition was undone before this error was raised: nothing of it
    is left in Redis (the lock was released by its own token; if Redis
    stopped answering meanwhile, the undo goes on in the background and the
    lock's TTL bounds it), and the caller does not hold it. A promoted
    replica could have lacked it, so granting it would have promised
    exclusion across a failover that the servers could not keep.

    ``acknowledged`` is how many replicas acknowledged it, ``required`` how
    many were asked for. Retry later, or check the replicas (``INFO
    replication`` on the master: ``connected_slaves`` and their lag).
    """

    def __init__(self, message: str, *, acknowledged: int = 0, required: int = 0) -> None:
        super().__init__(message)
        self.acknowledged = acknowledged
        self.required = required


class AsyncioRequiredError(AiolockError, RuntimeError):
    """aiolock was called without a running asyncio event loop.

    aiolock needs asyncio: anyio's asyncio backend is fine, its trio backend
    (and trio itself) are not supported.
    """


class ConnectionFailedError(AiolockError, ConnectionError):
    """Redis could not be reached: the connection was refused, lost, or stopped answering.

    It is also a builtin :class:`ConnectionError` (an ``OSError``). Its
    ``__cause__`` is redis-py's exception. The command did not complete; the
    next command reconnects. Tasks waiting for a lock ride out an outage
    (see ``acquire``), so this reaches you from a wait only when Redis stayed
    unreachable until the wait's timeout.
    """

    #: (Internal) the command was never written, its connection could not be
    #: opened: it did not run, and re-sending it elsewhere is safe.
    not_sent = False


class ServerUnavailableError(ConnectionFailedError):
    """The server answered but cannot serve commands for a while: it is loading
    its data set (LOADING), a long script blocks it (BUSY), a replica lost its
    master (MASTERDOWN), or a cluster slot is migrating (TRYAGAIN).

    ``code`` is that error code; the message quotes the server's reply, and
    ``__cause__`` is redis-py's exception. The command did not run. It is a
    ConnectionFailedError: waits, releases, renewals and the watchdog retry it
    as they ride out an outage.
    """

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class ServerRefusedError(AiolockError):
    """The server refused the command: authentication (NOAUTH, WRONGPASS), ACL
    (NOPERM), out of memory (OOM), a read-only replica (READONLY), ...

    ``code`` is the error code of the server's reply (``"NOPERM"``, ``"OOM"``,
    ...), and the message quotes the reply. Its ``__cause__`` is redis-py's
    exception. The command did not run (a script that fails half way is the
    server's business: aiolock's scripts check before they write). Retrying
    does not help until the server's configuration is fixed.
    """

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class WrongTypeError(ServerRefusedError):
    """A key aiolock uses holds a value aiolock did not write (Redis' WRONGTYPE).

    Another library (redis-py's own ``Lock``, for example) or another kind of
    aiolock primitive uses the same key, ``<prefix>:{<name>}``. Pick another
    name, or give the Client another ``prefix``. It is a ServerRefusedError
    with ``code == "WRONGTYPE"``.
    """


class InvalidArgumentError(AiolockError, ValueError):
    """An argument had the right type but a bad value (empty name, negative or NaN time)."""


class InvalidArgumentTypeError(AiolockError, TypeError):
    """An argument had the wrong type (a non-string name, a string timeout)."""


class SharedCallError(AiolockError):
    """A singleflight call whose function raised in the caller that ran it.

    The callers that waited for that run (in this Client or any other) get
    this error, carrying the original exception's ``type_name`` (its
    qualified name, ``"ValueError"`` or ``"myapp.errors.Gone"``) and
    ``message`` (``str(exc)``, at most 8 KiB); the exception object itself
    stays in the process that ran the function (it is not sent over Redis).
    ``name`` is the singleflight's name.
    """

    def __init__(self, name: str, type_name: str, message: str) -> None:
        super().__init__(f"singleflight {name!r}: the shared call raised {type_name}: {message}")
        self.name = name
        self.type_name = type_name
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.type_name, self.message))


class UnshareableResultError(AiolockError, TypeError):
    """A singleflight run's result could not be shared: the serializer failed on
    it (its cause is the serializer's exception), it was larger than
    ``max_size``, or a waiter could not decode it. Raised to the caller that
    ran the function and to every caller that waited for that run."""


#: How a plain connection failure's message begins (redis-py's text follows).
CANNOT_REACH = "cannot reach Redis: "


def clause(text: object) -> str:
    """``text`` (often redis-py's or the server's) to go on from with our own
    punctuation: its trailing spaces and periods dropped ("user is disabled."
    followed by ". Check" would read "disabled.. Check")."""
    return str(text).rstrip(" .")


def sentence(text: object) -> str:
    """``text`` ended as a sentence: one period, or its own "?" or "!"."""
    text = clause(text)
    return text if text.endswith(("?", "!")) else text + "."


def asyncio_required() -> AsyncioRequiredError:
    """The error for a call made without a running asyncio loop (trio, or no loop)."""
    return AsyncioRequiredError(
        "aiolock needs a running asyncio event loop: call it from asyncio code "
        "(anyio's asyncio backend is fine; trio, and anyio's trio backend, are not supported)"
    )


# What to do about each refusal, by the error code of the server's reply.
_ADVICE = {
    "NOAUTH": "The server requires a password: put it in the URL "
    "(redis://user:password@host:port) or in the redis.asyncio.Redis you pass to Client()",
    "WRONGPASS": "Check the username and password in the URL or in your redis.asyncio.Redis",
    "NOPERM": "The ACL user lacks a permission aiolock needs: it runs EVALSHA, SCRIPT LOAD, "
    "PUBLISH, SUBSCRIBE, EXISTS, PTTL and INFO (and BLPOP in notify='list' mode) on the keys "
    "and channels under its prefix; on a cluster SSUBSCRIBE and SPUBLISH instead of "
    "SUBSCRIBE and PUBLISH, and CLUSTER SLOTS, to find the cluster",
    "OOM": "The server is out of memory (maxmemory, with a noeviction policy): free memory, "
    "raise maxmemory or choose an eviction policy",
    "READONLY": "This server is a read-only replica: connect to the master",
    "MISCONF": "The server refuses writes because it cannot persist to disk: see its log",
    "BUSY": "A long-running script blocks the server: wait, or stop it with SCRIPT KILL",
    "LOADING": "The server is loading its data set: retry in a moment",
    "MASTERDOWN": "The replica lost its master: retry after the failover",
    "TRYAGAIN": "A cluster slot is being migrated: retry in a moment",
    "CLUSTERDOWN": "The cluster cannot serve this slot now (a failover in progress, or "
    "no master for it): retry after the failover",
    "CROSSSLOT": "The keys of one command fell on several cluster slots: a lock name that "
    "starts with '}' gives its keys an empty hash tag; rename it",
    "MOVED": "The cluster moved the slot again and again (a resharding in progress): retry",
    "ASK": "The cluster's slot migration kept redirecting the command: retry",
    "NOREPLICAS": "Not enough replicas are connected to accept writes",
    "NOSCRIPT": "The server lost aiolock's script twice in a row (SCRIPT FLUSH?): retry",
}
_CODES = re.compile(r"\b(" + "|".join(sorted(_ADVICE)) + r")\b")
#: Error codes of a server that cannot serve for a while (the command did not run).
UNAVAILABLE_CODES = frozenset(
    {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK"}
)


class MasterChangedError(ReadOnlyError):
    """Sentinel mode (not an AiolockError: redis-py's kind of exception, which
    ``from_redis`` turns into a ServerUnavailableError with code READONLY):
    the server this Client reached is not the master any more (a ``READONLY``
    reply, or a ROLE other than master after connecting). The command did
    not run; the next connection asks the Sentinels for the master again."""


def from_redis(exc: BaseException) -> AiolockError:
    """The AiolockError for an exception from redis-py or the connection layer.

    AiolockErrors pass through unchanged; the caller raises the result
    ``from exc`` (or sets ``__cause__``) so redis-py's exception stays the cause.
    """
    if isinstance(exc, AiolockError):
        return exc
    message = clause(str(exc) or type(exc).__name__)
    said = sentence(message)  # the same, ended: "...disabled." or "...correct?"
    error: AiolockError
    if isinstance(exc, MasterChangedError):
        error = ServerUnavailableError(
            f"the master changed (a Sentinel failover): {said} The Client drops its "
            "connections and follows the master the Sentinels name now; the command did "
            "not run, and aiolock retries it where it rides out an outage (waits, "
            "releases, renewals).",
            "READONLY",
        )
    elif isinstance(exc, AuthenticationError | AuthorizationError):
        code = "NOAUTH" if "NOAUTH" in message or "required" in message else "WRONGPASS"
        error = ServerRefusedError(
            f"Redis refused the connection ({code}): {said} {_ADVICE[code]}.", code
        )
    elif isinstance(exc, BusyLoadingError) or (
        isinstance(exc, ResponseError) and message.split(" ", 1)[0] in UNAVAILABLE_CODES
    ):
        # The whole command was turned away (the code opens the reply): transient.
        # (redis-py's BusyLoadingError has "LOADING" cut off its message.)
        code = "LOADING" if isinstance(exc, BusyLoadingError) else message.split(" ", 1)[0]
        error = ServerUnavailableError(
            f"Redis cannot serve commands now ({code}): {said} {_ADVICE[code]}; "
            "aiolock retries it where it rides out an outage.",
            code,
        )
    elif isinstance(exc, ResponseError):
        if "WRONGTYPE" in message:
            error = WrongTypeError(_wrong_type(message), "WRONGTYPE")
        else:
            first = message.split(" ", 1)[0]
            found = first if first in _ADVICE else None
            if found is None:  # an error inside a script may be wrapped ("ERR Error running...")
                match = _CODES.search(message)
                found = match.group(1) if match else None
            advice = _ADVICE[found] if found else "See the server's reply"
            code = found or (first if first.isupper() else "")
            error = ServerRefusedError(f"Redis refused the command: {said} {advice}.", code)
    elif isinstance(exc, RedisError | OSError):
        error = ConnectionFailedError(
            f"{CANNOT_REACH}{said} Check that the server is up and reachable; "
            "aiolock reconnects on the next command."
        )
    else:
        error = AiolockError(f"unexpected error talking to Redis: {said}")
    error.__cause__ = exc
    return error


#: aiolock's own refusal (scripts/_types.lua): which key holds what.
_OUR_WRONGTYPE = re.compile(r"key (?P<key>.+?) holds an? (?P<found>\w+), not the (?P<want>\w+)")


def _wrong_type(message: str) -> str:
    """The WrongTypeError message: which key holds what (when the script said),
    once, and what to do; not the server's wrapping (script SHA, line)."""
    mine = _OUR_WRONGTYPE.search(message)
    if mine is not None:
        what = f"key {mine['key']} holds a {mine['found']} where aiolock keeps a {mine['want']}"
    else:
        what = "a key of this lock holds a value of a type aiolock does not write there"
    return (
        f"Redis refused the command (WRONGTYPE): {what}. Another library (redis-py's Lock, "
        "say) or another kind of aiolock primitive uses the same name; nothing was "
        "changed. Pick another name, give the Client another prefix, or delete the key "
        "if nothing uses it."
    )


#: Connection failures and timeouts (ConnectionFailedError is an OSError): a
#: waiting task retries them, an idempotent clean-up too. (The primitives
#: name them here, never redis-py's exceptions.)
TRANSIENT: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


def no_reply(message: str) -> Exception:
    """The cause of a failure for want of a reply (redis-py's TimeoutError)."""
    return RedisTimeoutError(message)
