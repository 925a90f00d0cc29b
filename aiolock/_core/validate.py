"""Argument checks, run at the call before any round trip to Redis."""

from __future__ import annotations

import math

from .errors import InvalidArgumentError, InvalidArgumentTypeError

#: Leases and timeouts above this are refused: Redis TTLs are 64-bit
#: milliseconds, but a lease of more than a year is a bug, not a wish.
MAX_SECONDS = 365 * 24 * 3600.0


def check_name(name: object, what: str = "lock name") -> str:
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"{what} must be a str, got {type(name).__name__}: {name!r}")
    if not name:
        raise InvalidArgumentError(f"{what} must be a non-empty string")
    return name


def check_prefix(prefix: object) -> str:
    prefix = check_name(prefix, "prefix")
    if "{" in prefix or "}" in prefix:
        raise InvalidArgumentError(
            f"prefix must not contain braces (they delimit the cluster hash tag): {prefix!r}"
        )
    return prefix


def check_seconds(value: object, what: str, *, allow_zero: bool) -> float:
    """A finite, non-negative number of seconds (positive unless allow_zero)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentTypeError(
            f"{what} must be a number of seconds (int or float), got {type(value).__name__}: "
            f"{value!r}"
        )
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidArgumentError(f"{what} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise InvalidArgumentError(f"{what} must be {bound} seconds, got {value!r}")
    if seconds > MAX_SECONDS:
        raise InvalidArgumentError(
            f"{what} must be at most {MAX_SECONDS:.0f} seconds (one year), got {value!r}"
        )
    return seconds


def check_timeout(value: object, what: str = "timeout") -> float | None:
    """None (wait for ever) or a finite number of seconds >= 0."""
    if value is None:
        return None
    return check_seconds(value, what, allow_zero=True)


def check_lease(value: object, what: str = "lease") -> float | None:
    """None (the watchdog renews it) or a finite number of seconds > 0."""
    if value is None:
        return None
    seconds = check_seconds(value, what, allow_zero=False)
    if seconds < 0.001:
        raise InvalidArgumentError(f"{what} must be at least 0.001 seconds, got {value!r}")
    return seconds


def to_ms(seconds: float) -> int:
    """Seconds to whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))
