"""``aiolock doctor``'s vocabulary: what is read from a server, and what is asked of it.

Pure: no I/O, no redis-py. ``aiolock.cli.doctor`` reads each master into a
``NodeFacts`` (the Sentinels into ``SentinelFacts``), every reply a
``Reply``; ``aiolock.cli.doctor_checks`` judges them into ``Check`` lines.
``acl_probes`` lists every command a Client of the deployment sends, for
``ACL DRYRUN``: the scripts' own read from the ``.lua`` files
(``script_commands``), the rest named with where the code sends them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

__all__ = [
    "SAMPLE_ARGS",
    "Check",
    "NodeFacts",
    "Probe",
    "Reply",
    "SentinelFacts",
    "Settings",
    "Status",
    "acl_probes",
    "script_commands",
]

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    detail: str


@dataclass(frozen=True, slots=True)
class Reply:
    """What one command answered: ``ok`` (it ran; ``value``), ``refused``
    (NOPERM: the ACL), ``missing`` (unknown command: an older server, or
    renamed) or ``error`` (any other error reply; ``detail``)."""

    outcome: Literal["ok", "refused", "missing", "error"]
    value: Any = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass(frozen=True, slots=True)
class Settings:
    """What the deployment is checked against (the command line's options)."""

    lease: float
    cluster: bool
    sentinel: bool
    #: This aiolock version's Functions library (its name carries the version).
    library: str = ""


@dataclass(slots=True)
class NodeFacts:
    """What was read from one server (a master, or the only server)."""

    address: str
    #: ``INFO`` (server, memory, persistence, replication, cluster), merged.
    info: Reply
    #: ``CONFIG GET *``; ``refused`` on a managed service (the policy then comes from INFO).
    config: Reply
    pings_ms: list[float]
    script_load: Reply  # SCRIPT LOAD of a one-line probe
    evalsha: Reply  # EVALSHA of it, on a key under the prefix
    publish: Reply  # a script that (S)PUBLISHes on a channel under the prefix
    fcall: Reply  # FCALL of a function that does not exist: refused, or "not found"
    function_load: Reply  # FUNCTION LOAD of a library without functions: refused, or not
    functions: Reply  # FUNCTION LIST: the libraries' names
    wait: Reply  # WAIT 0 0
    cluster_info: Reply | None  # CLUSTER INFO, on a cluster
    whoami: Reply
    #: ACL DRYRUN per probe (``acl_probes``), or None when it could not run.
    dryrun: dict[str, Reply] | None = None
    dryrun_error: str = ""


@dataclass(frozen=True, slots=True)
class SentinelFacts:
    """What one Sentinel said of the service."""

    address: str
    master: Reply  # SENTINEL get-master-addr-by-name: (host, port)
    ckquorum: Reply  # SENTINEL CKQUORUM
    state: Reply  # SENTINEL MASTER: its fields (quorum, flags, num-slaves, ...)


@dataclass(frozen=True, slots=True)
class Probe:
    """One command aiolock sends, as ``ACL DRYRUN`` is asked about it."""

    name: str
    args: tuple[str, ...]  # K: a key under the prefix, C: a channel under it
    required: bool
    why: str


#: Arguments that satisfy each command's arity, for ``ACL DRYRUN``.
SAMPLE_ARGS: dict[str, tuple[str, ...]] = {
    "DEL": ("K",), "EXISTS": ("K",), "GET": ("K",), "SET": ("K", "v"), "TYPE": ("K",),
    "PTTL": ("K",), "PEXPIRE": ("K", "1000"), "TIME": (), "INFO": ("server",),
    "HDEL": ("K", "f"), "HEXISTS": ("K", "f"), "HGET": ("K", "f"), "HGETALL": ("K",),
    "HINCRBY": ("K", "f", "1"), "HKEYS": ("K",), "HMGET": ("K", "f"), "HSET": ("K", "f", "v"),
    "LPOS": ("K", "v"), "LPUSH": ("K", "v"), "RPUSH": ("K", "v"), "LTRIM": ("K", "0", "-1"),
    "SADD": ("K", "m"), "SMEMBERS": ("K",), "ZADD": ("K", "1", "m"), "ZCARD": ("K",),
    "ZCOUNT": ("K", "0", "1"), "ZRANGE": ("K", "0", "-1"), "ZRANGEBYSCORE": ("K", "0", "1"),
    "ZREM": ("K", "m"), "ZREMRANGEBYRANK": ("K", "0", "1"),
    "ZREMRANGEBYSCORE": ("K", "0", "1"), "ZREVRANGEBYSCORE": ("K", "1", "0"),
    "ZSCORE": ("K", "m"), "PUBLISH": ("C", "m"), "SPUBLISH": ("C", "m"),
}  # fmt: skip

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'")


def script_commands() -> frozenset[str]:
    """The commands the Lua scripts run (``redis.call('X', ...)``), read from
    ``aiolock/scripts/*.lua`` (ACL rules apply to a script's commands too)."""
    found: set[str] = set()
    for entry in resources.files("aiolock").joinpath("scripts").iterdir():
        if entry.name.endswith(".lua"):
            found.update(m.upper() for m in _CALL.findall(entry.read_text("utf-8")))
    return frozenset(found)


def acl_probes(settings: Settings) -> list[Probe]:
    """Every command a Client of this deployment sends, required or optional."""
    publish = "SPUBLISH" if settings.cluster else "PUBLISH"
    probes = [
        Probe(
            publish if cmd == "PUBLISH" else cmd,
            SAMPLE_ARGS.get(cmd, ("K",)),
            True,
            "run by the scripts",
        )
        for cmd in sorted(script_commands())
    ]
    sub, unsub = (
        ("SSUBSCRIBE", "SUNSUBSCRIBE") if settings.cluster else ("SUBSCRIBE", "UNSUBSCRIBE")
    )
    where = settings.cluster or settings.sentinel
    probes += [
        # protocol/runner.py: EVALSHA, and SCRIPT LOAD after a NOSCRIPT
        Probe("EVALSHA", ("0" * 40, "1", "K"), True, "runs every script"),
        Probe("SCRIPT", ("LOAD", "return 1"), True, "loads the scripts"),
        Probe("PING", (), True, "checks the connections"),
        # waiting/listener.py: the pub/sub listener (notify="pubsub", the default)
        Probe(sub, ("C",), False, "waiters are woken (else they poll at TTL-bound intervals)"),
        Probe(unsub, ("C",), False, "the listener leaves a channel"),
        # topology/: cluster discovery and redirections; the master's role
        Probe("INFO", ("server",), settings.cluster, "detects a cluster, checks its version"),
        Probe("ROLE", (), where, "checks that a node is still a master"),
        # waiting/notify.py (notify="list"); transport/replication.py (replicas=N)
        Probe("BLPOP", ("K", "1"), False, 'notify="list"'),
        Probe("WAIT", ("0", "0"), False, "replicas=N"),
        Probe("WAITAOF", ("0", "0", "0"), False, "wait_aof=True"),
        # protocol/runner.py with scripting="functions" (or "auto" where EVAL is refused)
        Probe("FCALL", ("f", "1", "K"), False, 'scripting="functions"'),
        Probe("FUNCTION", ("LOAD", "#!lua name=x"), False, "loads the Functions library"),
    ]
    if settings.cluster:
        probes += [
            Probe("CLUSTER", ("SLOTS",), True, "finds the slots' masters"),
            Probe("ASKING", (), True, "follows a migrating slot"),
        ]
    return probes
