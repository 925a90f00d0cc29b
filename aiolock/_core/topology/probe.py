"""The capability probe: what the server behind a Client is, and what it allows.

Run when a Client settles (the Engine's first command waits for it, after
the deployment's own discovery), and again when a Sentinel failover names
another master (the next command waits for it then). It sends, at once, on
the command lane (so through the same ACL user, proxy and TLS as every
command):

* ``INFO server``: the kind and version of the server (Redis, Valkey,
  Dragonfly, Garnet, or whatever else answers ``INFO``), for every message
  that names it; whether it has Functions and sharded pub/sub (Redis 7.0+,
  Valkey). A user without ``INFO`` leaves them unknown (None);
* the probe script (``probe.lua``), through the script runner as every
  script runs (as a script, or a Redis Function where the ACL forbids EVAL
  or the Client asks for them): whether scripts run at all, and whether a script may
  ``PUBLISH`` (``SPUBLISH`` in a cluster). Alibaba Tair's cluster refuses
  it; so does a server whose ``PUBLISH`` is renamed away;
* with ``replicas=N`` only, the Client's ``WAIT`` (or ``WAITAOF``) asking
  for no replica: whether the server can acknowledge at all (Garnet has no
  WAIT).

What the Client needs and the server lacks is refused then, before any of
the Client's scripts ran (``refusal``): an ``UnsupportedServerError`` that
names the capability, the server, and what to do. Nothing half-works:

* no scripts (no Lua: Garnet without ``--lua``; the script commands
  unknown, and no Functions either): refused (the runner's words);
* ``PUBLISH`` refused inside scripts: ``notify="pubsub"`` (the default) is
  refused, since no waiting task would ever be woken; with ``notify="list"``
  or ``"poll"`` the Client runs the unpublished variant of every script
  (scripts.py) and works (waiters wake from the signal lists or by polling);
* ``replicas=N`` on a server without WAIT (or ``wait_aof`` without
  WAITAOF or an append-only file): refused.

A probe that fails for a transient reason (the server unreachable, a
timeout) fails the settling like any command: the next command probes again.
A probe script refused for another reason (an ACL that forbids every way
to run a script, out of memory) leaves the capabilities unknown (``probed`` False):
every script then meets that refusal in its own words, and plain commands
work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from ..capabilities import Capabilities
from ..errors import AiolockError, ServerRefusedError, UnsupportedServerError
from ..transport.replication import Acknowledgement

__all__ = ["describe", "probe", "refusal", "server_of"]

log = logging.getLogger("aiolock.connection")

#: ``call(key, *command)``: a plain command on the lane that serves ``key``.
Call = Callable[..., Awaitable[Any]]
#: ``run(script name, keys, args)``: a script through the runner.
Run = Callable[[str, tuple[Any, ...], tuple[Any, ...]], Awaitable[Any]]

#: ``INFO server`` fields that name a Redis-compatible server, before the
#: ``redis_version`` they all report (the Redis version they are compatible with).
_KINDS = (
    ("valkey_version", "valkey", "Valkey"),
    ("dragonfly_version", "dragonfly", "Dragonfly"),
    ("garnet_version", "garnet", "Garnet"),
    ("keydb_version", "keydb", "KeyDB"),
    ("redis_version", "redis", "Redis"),
)
_VERSION = re.compile(r"^(\d+)\.(\d+)")


def server_of(info: str) -> tuple[str | None, tuple[int, int] | None, str]:
    """The kind, ``(major, minor)`` version and name ("Valkey 8.1.8") of the
    server whose ``INFO server`` text is ``info``."""
    fields = dict(
        (name, value.strip())
        for name, _, value in (line.partition(":") for line in info.splitlines())
        if value
    )
    for field, kind, shown in _KINDS:
        version = fields.get(field)
        if version is None:
            continue
        if kind == "redis" and fields.get("server_name", "").lower() not in ("", "redis"):
            shown = kind = fields["server_name"]  # (Valkey 8 says server_name:valkey)
        match = _VERSION.match(version)
        parsed = (int(match.group(1)), int(match.group(2))) if match else None
        return kind, parsed, f"{shown} {version}"
    return None, None, "the server"


def _modern(kind: str | None, version: tuple[int, int] | None) -> bool | None:
    """Functions and sharded pub/sub: Redis 7.0+, any Valkey; None: not known."""
    if kind == "valkey":
        return True
    if kind == "redis" and version is not None:
        return version >= (7, 0)
    return None


async def probe(
    call: Call,
    run: Run,
    found: Capabilities,
    *,
    prefix: str,
    ack: Acknowledgement | None,
    no_scripts: Callable[[AiolockError, str], AiolockError | None] = lambda error, server: None,
) -> Capabilities:
    """``found`` (the deployment's capabilities) with what the server says
    now; raises what a command would (unreachable: the next command probes
    again), or UnsupportedServerError for a server that runs no scripts or
    cannot acknowledge (``ack``: the Client's replicas=N). Sends nothing
    that writes: the probe script's message reaches nobody.
    ``no_scripts(error, server)``: the probe script's failure as the error
    of a server that runs no scripts, if it says so (the runner's)."""
    key = f"{prefix}:{{aiolock-probe}}"
    asked: list[Awaitable[Any]] = [
        call(b"server", b"INFO", b"server"),
        run("probe", (key,), (key + ":ch",)),
    ]
    if ack is not None:
        asked.append(call(key, *ack.probe))
    replies = await asyncio.gather(*asked, return_exceptions=True)
    info, published = replies[0], replies[1]
    kind: str | None = None
    version: tuple[int, int] | None = None
    server = "the server"
    if isinstance(info, bytes | str):
        kind, version, server = server_of(info.decode() if isinstance(info, bytes) else info)
    else:  # refused (an ACL user without INFO, a proxy): not known
        log.debug("INFO refused (%s); the server's kind and version are not known", info)
    if isinstance(published, AiolockError):
        no_lua = no_scripts(published, server)
        if no_lua is not None:
            raise no_lua
    for reply in replies:  # a transient failure: the settling fails, as a command would
        if isinstance(reply, BaseException) and not isinstance(reply, ServerRefusedError):
            raise reply
    if isinstance(published, ServerRefusedError):
        # Scripts refused otherwise (an ACL that forbids scripts, a load
        # refused, out of memory): not known. Each script meets the refusal
        # itself, in its own words; a plain command (EXISTS) still works.
        log.info("the capability probe's script was refused (%s): not checked", published)
        return dataclasses.replace(found, server=server, kind=kind, version=version)
    wait: bool | None = None
    if ack is not None:
        waited = replies[2]
        if isinstance(waited, BaseException):
            refused = ack.refusal(waited)
            if refused is not None:
                raise refused
            # Refused otherwise (ACL): acquisitions meet the same error, clearly.
        wait = not isinstance(waited, BaseException)
    refusal_text = published.decode() if isinstance(published, bytes) else str(published or "")
    modern = _modern(kind, version)
    return dataclasses.replace(
        found,
        probed=True,
        server=server,
        kind=kind,
        version=version,
        publish_in_scripts=not refusal_text,
        publish_refusal=refusal_text or None,
        functions=modern,
        sharded_pubsub=modern,
        wait=wait,
    )


def refusal(found: Capabilities, *, notify: str) -> AiolockError | None:
    """What this Client (its ``notify`` mode) needs of the server and
    ``found`` lacks, as the error to raise at first use; None: nothing."""
    if not found.publish_in_scripts and notify == "pubsub":
        return UnsupportedServerError(
            f"{found.server} refuses PUBLISH inside scripts (a script's PUBLISH got "
            f"{found.publish_refusal!r}), and this Client's notify='pubsub' (the default) "
            "wakes waiting tasks with it. Make the Client with notify='list' (waiting tasks "
            "block on signal lists) or notify='poll': its scripts then publish nothing and "
            "every primitive works. Nothing was changed in Redis"
        )
    return None


def describe(found: Capabilities, functions: bool) -> str:
    """One line for the log: what answered and what it allows."""
    scripts = "as Redis Functions (FCALL)" if functions else "as Lua scripts"
    publish = "allowed" if found.publish_in_scripts else f"refused ({found.publish_refusal})"
    if not found.probed:
        publish = "not checked (the probe script was refused)"
    return f"{found.server}; scripts run {scripts}; PUBLISH in scripts {publish}"
