"""hiredis, which parses every reply aiolock reads (a hard dependency).

aiolock depends on ``redis[hiredis]``: every connection of aiolock (see
``dialer``) hands redis-py's connected transport to one of two protocols, the
command connection's or the pub/sub listener's, which feed the bytes to
``hiredis.Reader`` as they arrive (no reader task). There
is no second, pure-Python path: an install without hiredis fails at import,
saying how to fix it, rather than running code no test covers.
"""

from __future__ import annotations

try:
    import hiredis
except ImportError as exc:  # a broken install: redis without its [hiredis] extra
    raise ImportError(
        "aiolock needs hiredis to parse Redis replies, and it is not installed "
        "(aiolock depends on redis[hiredis]): pip install 'redis[hiredis]'"
    ) from exc

__all__ = ["hiredis"]
