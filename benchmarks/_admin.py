"""The benchmark harness' admin view of a server: its own connections and commands.

Imported by the worker process, which may run an older aiolock (``--compare``
exports the base commit's package): this module imports nothing of aiolock.
"""

from __future__ import annotations

from typing import Any

import redis

ADMIN_NAME = "bench-admin"

#: Commands the harness itself sends (never counted as a library's requests).
ADMIN_COMMANDS = frozenset(
    {
        "config|resetstat",
        "config|set",
        "info",
        "client|list",
        "client|kill",
        "pubsub|channels",
        "pubsub|numsub",
        "dbsize",
        "flushall",
        "script|flush",
        "memory|usage",
        "cluster|info",
        "cluster|nodes",
        "pubsub|shardchannels",
        "replconf",  # a replica's acknowledgements to its master
    }
)


def admin_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, client_name=ADMIN_NAME, socket_timeout=30)


def clients(r: redis.Redis) -> list[dict[str, Any]]:
    """CLIENT LIST without the harness' own admin connections."""
    return [c for c in r.client_list() if c.get("name") != ADMIN_NAME]


def connection_counts(r: redis.Redis, name_prefix: str | None = None) -> dict[str, int]:
    """Connections of the library under test: command and pub/sub ones."""
    found = clients(r)
    if name_prefix is not None:
        found = [c for c in found if str(c.get("name", "")).startswith(name_prefix)]
    pubsub = [
        c
        for c in found
        if int(c.get("sub", 0)) + int(c.get("psub", 0)) > 0 or "P" in str(c.get("flags", ""))
    ]
    return {"total": len(found), "pubsub": len(pubsub), "command": len(found) - len(pubsub)}
