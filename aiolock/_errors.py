"""The exception hierarchy. Every error aiolock raises derives from AiolockError."""

from __future__ import annotations

__all__ = [
    "AiolockError",
    "ClientClosedError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LockUpgradeError",
    "WrongEventLoopError",
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

    A Client, with its listener and watchdog tasks, belongs to the first event
    loop it runs on. Create one Client per event loop (per thread).
    """


class InvalidArgumentError(AiolockError, ValueError):
    """An argument had the right type but a bad value (empty name, negative or NaN time)."""


class InvalidArgumentTypeError(AiolockError, TypeError):
    """An argument had the wrong type (a non-string name, a string timeout)."""
