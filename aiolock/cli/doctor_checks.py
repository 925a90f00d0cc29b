"""``aiolock doctor``'s judgement: what was read from the servers, to checks.

Pure: no I/O, no redis-py. ``aiolock.cli.doctor`` reads each master (and
the Sentinels) into a ``NodeFacts`` (``SentinelFacts``); the functions here
turn them into ``Check`` lines (``ok``, ``warn``, ``fail``) and the closing
statement of what the deployment promises. What is read, and the commands
the ACL is asked about, are ``aiolock.cli.doctor_facts``'s.

Decisions the README states (Operating aiolock, The command line):

* ``maxmemory-policy``: ``noeviction`` is ok. ``allkeys-*`` fails: it may
  evict a held lock's key. ``volatile-*`` evicts only keys with a TTL, and
  every key aiolock writes has one (a hold its lease, the fencing counter
  24 h), so it drops held locks just as readily (``volatile-ttl`` picks them
  first): a fail when a ``maxmemory`` limit is set, a warn without one
  (nothing is evicted until a limit is set).
* persistence: ``appendonly yes`` with ``appendfsync always`` is ok; anything
  less is a warn, never a fail: a restart that loses holds is detected (the
  holders' Clients report them lost when they reconnect) and fencing tokens
  keep increasing through their clock floor, but another Client may take
  the lock before the old holder hears, so the resource must check tokens.
* a check whose input could not be read (``CONFIG`` or ``INFO`` refused, as
  managed services do) is a warn saying so, never a crash.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from aiolock.cli.doctor_facts import (
    Check,
    NodeFacts,
    Reply,
    SentinelFacts,
    Settings,
    Status,
    acl_probes,
)

__all__ = [
    "latency_check",
    "memory_check",
    "merge",
    "node_checks",
    "promise",
    "replicas_check",
    "sentinel_check",
    "verdict",
]

_RANK: dict[Status, int] = {"ok": 0, "warn": 1, "fail": 2}


def _worst(statuses: Iterable[Status]) -> Status:
    return max(statuses, key=lambda s: _RANK[s], default="ok")


def verdict(checks: Sequence[Check]) -> Status:
    return _worst(c.status for c in checks)


def _refusal(what: str, reply: Reply) -> str:
    why = {"refused": "refused by the ACL", "missing": "unknown command"}.get(
        reply.outcome, reply.detail
    )
    return f"could not read {what} ({why})"


def _config(facts: NodeFacts, key: str) -> str | None:
    if not facts.config.ok:
        return None
    value = facts.config.value.get(key)
    return None if value is None else str(value)


def _config_refused(facts: NodeFacts) -> str:
    if facts.config.outcome in ("refused", "missing"):
        return "CONFIG refused"
    return f"CONFIG failed: {facts.config.detail}"


def _version(info: dict[str, Any]) -> tuple[int, ...]:
    text = str(info.get("valkey_version") or info.get("redis_version") or "0")
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3]) or (0,)


def server_check(facts: NodeFacts) -> Check:
    if not facts.info.ok:
        return Check("server", "warn", _refusal("INFO server", facts.info))
    info = facts.info.value
    version = str(info.get("redis_version", "?"))
    redis = _version({"redis_version": version})  # (Valkey reports a Redis version too)
    if info.get("server_name") == "valkey" or "valkey_version" in info:
        kind = f"Valkey {info.get('valkey_version', version)}"
    elif "dragonfly_version" in info:
        kind = f"Dragonfly {info['dragonfly_version']} (Redis {version} compatible)"
        return Check("server", "warn", f"{kind}: not a server aiolock is tested on")
    else:
        kind = f"Redis {version}"
    mode = str(info.get("redis_mode", "standalone"))
    if redis >= (7,):
        return Check("server", "ok", f"{kind} ({mode})")
    if redis >= (6, 2):
        return Check(
            "server",
            "ok",
            f"{kind} ({mode}): no Functions, no sharded pub/sub (a cluster needs 7.0), "
            "no ACL DRYRUN",
        )
    return Check("server", "fail", f"{kind} ({mode}): aiolock needs Redis 6.2 or newer")


def scripts_check(facts: NodeFacts, settings: Settings) -> Check:
    if facts.evalsha.ok and facts.script_load.ok:
        return Check("scripts", "ok", "SCRIPT LOAD and EVALSHA allowed on the prefix's keys")
    refused = [
        f"{name} ({reply.detail or reply.outcome})"
        for name, reply in (("EVALSHA", facts.evalsha), ("SCRIPT LOAD", facts.script_load))
        if not reply.ok
    ]
    why = " and ".join(refused)
    if _functions_usable(facts, settings):
        loaded = settings.library in _libraries(facts)
        how = "its library is loaded" if loaded else "the Client loads its library"
        return Check(
            "scripts",
            "warn",
            f"refused: {why}; scripting='auto' runs Redis Functions instead ({how})",
        )
    return Check(
        "scripts",
        "fail",
        f"refused: {why}: no aiolock operation can run; grant +evalsha +script|load, or "
        "+fcall and load the Functions library once: aiolock functions load --url ...",
    )


def _functions_usable(facts: NodeFacts, settings: Settings) -> bool:
    """scripting='auto' can run on Redis Functions here: FCALL allowed, and this
    version's library loaded or loadable by this user."""
    loaded = settings.library in _libraries(facts)
    return facts.fcall.ok and (loaded or facts.function_load.ok)


def _libraries(facts: NodeFacts) -> list[str]:
    if not facts.functions.ok:
        return []
    return [str(n) for n in facts.functions.value if str(n).startswith("aiolock")]


def functions_check(facts: NodeFacts, settings: Settings) -> Check:
    reply = facts.functions
    if reply.outcome == "missing":
        return Check("functions", "ok", "not available (Redis before 7.0); EVALSHA is used")
    if not reply.ok:
        return Check("functions", "warn", _refusal("FUNCTION LIST", reply))
    libraries = _libraries(facts)
    fcall = "FCALL allowed" if facts.fcall.ok else f"FCALL {facts.fcall.outcome}"
    load = "FUNCTION LOAD allowed" if facts.function_load.ok else "FUNCTION LOAD refused"
    others = [n for n in libraries if n != settings.library]
    mine = (
        f"this version's library {settings.library} loaded"
        if settings.library in libraries
        else f"this version's library {settings.library} not loaded"
    )
    also = f"; other versions' {', '.join(others)}" if others else ""
    return Check("functions", "ok", f"available; {mine}{also}; {fcall}, {load}")


def publish_check(facts: NodeFacts, settings: Settings) -> Check:
    command = "SPUBLISH" if settings.cluster else "PUBLISH"
    if facts.publish.ok:
        return Check("publish-in-scripts", "ok", f"a script may {command} on the prefix's channels")
    if not facts.evalsha.ok:
        return Check("publish-in-scripts", "warn", "could not check (EVALSHA refused)")
    return Check(
        "publish-in-scripts",
        "warn",
        f"a script's {command} failed ({facts.publish.detail or facts.publish.outcome}): "
        "Clients with notify='pubsub' (the default) are refused here (UnsupportedServerError); "
        "use notify='list' or 'poll' (their scripts publish nothing; Election.observe() is "
        f"refused), or grant +{command.lower()} and the channels &<prefix>:*",
    )


def sharded_check(facts: NodeFacts, settings: Settings) -> Check:
    if not facts.info.ok:
        return Check("sharded-pubsub", "warn", _refusal("the version", facts.info))
    major = _version({"redis_version": facts.info.value.get("redis_version", "0")})[0]
    if major >= 7:
        return Check("sharded-pubsub", "ok", "available (SSUBSCRIBE, SPUBLISH)")
    if settings.cluster:
        return Check("sharded-pubsub", "fail", "missing: cluster mode needs Redis 7.0 / Valkey 7.2")
    return Check("sharded-pubsub", "ok", "missing, not needed standalone")


def wait_check(facts: NodeFacts) -> Check:
    if facts.wait.ok:
        return Check("wait", "ok", "WAIT allowed: replicas=N can be used")
    return Check(
        "wait", "warn", f"WAIT {facts.wait.outcome} ({facts.wait.detail}): replicas=N fails"
    )


def cluster_check(facts: NodeFacts, settings: Settings) -> Check:
    if not settings.cluster:
        return Check("cluster", "ok", "not a cluster")
    reply = facts.cluster_info
    if reply is None or not reply.ok:
        return Check("cluster", "warn", _refusal("CLUSTER INFO", reply or Reply("error")))
    state = reply.value.get("cluster_state", "?")
    slots = reply.value.get("cluster_slots_ok", "?")
    if state == "ok":
        return Check("cluster", "ok", f"cluster_state ok, {slots} slots served")
    return Check("cluster", "fail", f"cluster_state {state} ({slots} of 16384 slots ok)")


def memory_check(facts: NodeFacts) -> Check:
    policy = _config(facts, "maxmemory-policy")
    limit = _config(facts, "maxmemory")
    source = ""
    if policy is None and facts.info.ok and "maxmemory_policy" in facts.info.value:
        # INFO memory says it too: a managed service that refuses CONFIG still tells.
        policy = str(facts.info.value["maxmemory_policy"])
        limit = str(facts.info.value.get("maxmemory", "0"))
        source = f" (from INFO; {_config_refused(facts)})"
    if policy is None:
        return Check(
            "maxmemory-policy",
            "warn",
            f"could not read maxmemory-policy ({_config_refused(facts)})",
        )
    limited = limit not in (None, "0")
    at = f"maxmemory {limit} bytes" if limited else "no maxmemory set"
    if policy == "noeviction":
        return Check("maxmemory-policy", "ok", f"noeviction{source}: no held lock is evicted")
    if policy.startswith("allkeys-"):
        return Check(
            "maxmemory-policy",
            "fail",
            f"{policy}{source}, {at}: Redis may evict a held lock's key, and another "
            "process then gets the lock while the holder runs on; use noeviction",
        )
    if policy.startswith("volatile-"):
        why = (
            f"{policy}{source}: every aiolock key carries a TTL, so it may be evicted "
            "like any other (volatile-ttl picks the locks first): a held lock can vanish"
        )
        if limited:
            return Check("maxmemory-policy", "fail", f"{why} once {at} is reached; use noeviction")
        return Check(
            "maxmemory-policy", "warn", f"{why} as soon as a maxmemory is set; use noeviction"
        )
    return Check("maxmemory-policy", "warn", f"{policy}{source}: unknown policy, {at}")


def persistence_check(facts: NodeFacts) -> Check:
    aof = _config(facts, "appendonly")
    fsync = _config(facts, "appendfsync")
    save = _config(facts, "save")
    if aof is None or fsync is None:
        known = ""
        if facts.info.ok and "aof_enabled" in facts.info.value:
            known = f"; INFO says aof_enabled:{facts.info.value['aof_enabled']}"
        return Check(
            "persistence",
            "warn",
            f"could not read appendonly/appendfsync/save ({_config_refused(facts)}){known}",
        )
    lost = (
        ": held locks are lost; their Clients report it on reconnecting, another process "
        "may take a lock first, fencing tokens keep increasing"
    )
    if aof == "yes" and fsync == "always":
        return Check(
            "persistence", "ok", "appendonly yes, appendfsync always: a restart keeps every lock"
        )
    if aof == "yes":
        return Check(
            "persistence",
            "warn",
            f"appendonly yes, appendfsync {fsync}: a crash loses the last writes" + lost,
        )
    if save:
        return Check(
            "persistence",
            "warn",
            f"RDB snapshots only (save {save!r}): a restart goes back to the last one" + lost,
        )
    return Check("persistence", "warn", "none (appendonly no, save ''): a restart is empty" + lost)


def replicas_check(facts: NodeFacts) -> Check:
    if not facts.info.ok:
        return Check("replicas", "warn", _refusal("INFO replication", facts.info))
    info = facts.info.value
    if info.get("role") not in (None, "master"):
        return Check(
            "replicas",
            "fail",
            f"this server is a replica (role:{info.get('role')}): aiolock needs the master "
            "(a replica refuses every acquire, READONLY)",
        )
    count = int(info.get("connected_slaves", 0))
    offset = int(info.get("master_repl_offset", 0))
    parts: list[str] = []
    status: Status = "ok"
    for i in range(count):
        replica = info.get(f"slave{i}")
        if not isinstance(replica, dict):
            continue
        behind = offset - int(replica.get("offset", offset))
        lag = int(replica.get("lag", 0))
        state = str(replica.get("state", "?"))
        if state != "online" or lag > 1:
            status = "warn"
        parts.append(
            f"{replica.get('ip')}:{replica.get('port')} {state}, {behind} bytes behind, lag {lag} s"
        )
    minimum = _config(facts, "min-replicas-to-write")
    if minimum is None:
        floor = f"min-replicas-to-write unknown ({_config_refused(facts)})"
    else:
        floor = f"min-replicas-to-write {minimum}"
        if int(minimum) > count:
            status = "fail"
            floor += f": more than the {count} connected, every acquire is refused (NOREPLICAS)"
    if count == 0:
        return Check("replicas", status, f"none; {floor}; replicas=N cannot be used")
    return Check(
        "replicas",
        status,
        f"{count}: {'; '.join(parts)}; {floor}; replicas=N (N <= {count}) keeps a lock "
        "through a failover to an acknowledging replica",
    )


def latency_check(facts: NodeFacts, settings: Settings) -> Check:
    if not facts.pings_ms:
        return Check("latency", "fail", "no PING answered")
    median = statistics.median(facts.pings_ms)
    share = median / (settings.lease * 1000)
    detail = (
        f"PING median {median:.2f} ms of {len(facts.pings_ms)} "
        f"({share:.4%} of the {settings.lease:g} s lease)"
    )
    if share >= 0.1:
        return Check(
            "latency", "fail", detail + ": renewals (every lease/3) will not keep up; "
            "use a longer lease"
        )  # fmt: skip
    if share >= 0.01:
        return Check("latency", "warn", detail + ": slow for this lease")
    return Check("latency", "ok", detail)


def acl_check(facts: NodeFacts, settings: Settings) -> Check:
    user = str(facts.whoami.value) if facts.whoami.ok else "?"
    if facts.dryrun is None:
        return Check(
            "acl", "warn", f"could not check user {user}'s permissions ({facts.dryrun_error})"
        )
    denied: list[str] = []
    optional: list[str] = []
    unchecked: list[str] = []
    # With Redis Functions usable, EVALSHA and SCRIPT LOAD are not needed.
    scripting = {"EVALSHA", "SCRIPT"} if _functions_usable(facts, settings) else set()
    for probe in acl_probes(settings):
        reply = facts.dryrun.get(probe.name)
        if probe.name in scripting:
            probe = replace(probe, required=False)
        if reply is None:
            unchecked.append(probe.name)
        elif reply.ok and str(reply.value) != "OK":  # the reason it would be refused
            (denied if probe.required else optional).append(f"{probe.name} ({probe.why})")
        elif not reply.ok and (probe.required or "not found" not in reply.detail):
            unchecked.append(f"{probe.name} ({reply.detail})")
    checked = len(acl_probes(settings))
    if denied:
        return Check("acl", "fail", f"user {user} may not run: {', '.join(denied)}")
    notes = []
    if optional:
        notes.append(f"not allowed, optional: {', '.join(optional)}")
    if unchecked:
        notes.append(f"could not check: {', '.join(unchecked)}")
    if notes:
        return Check("acl", "warn", f"user {user}: " + "; ".join(notes))
    return Check("acl", "ok", f"user {user} may run all {checked} commands aiolock uses")


def node_checks(facts: NodeFacts, settings: Settings) -> list[Check]:
    """Every check of one server, in report order."""
    return [
        server_check(facts),
        scripts_check(facts, settings),
        functions_check(facts, settings),
        publish_check(facts, settings),
        sharded_check(facts, settings),
        wait_check(facts),
        cluster_check(facts, settings),
        memory_check(facts),
        persistence_check(facts),
        replicas_check(facts),
        latency_check(facts, settings),
        acl_check(facts, settings),
    ]


def merge(per_node: dict[str, list[Check]]) -> list[Check]:
    """One line per check over several masters: the worst status; one detail
    when they agree, else each master's."""
    if len(per_node) == 1:
        return next(iter(per_node.values()))
    merged: list[Check] = []
    for column in zip(*per_node.values(), strict=True):
        details = {c.detail for c in column}
        if len(details) == 1:
            detail = f"all {len(column)} masters: {column[0].detail}"
        else:
            detail = "; ".join(
                f"{address}: {c.detail}" for address, c in zip(per_node, column, strict=True)
            )
        merged.append(Check(column[0].name, _worst(c.status for c in column), detail))
    return merged


def sentinel_check(sentinels: Sequence[SentinelFacts], master: str) -> Check:
    """The Sentinels agree on the master and can reach their quorum."""
    answered = [s for s in sentinels if s.master.ok]
    if not answered:
        return Check("sentinel", "fail", "no Sentinel named the master")
    named = {f"{s.master.value[0]}:{s.master.value[1]}" for s in answered}
    parts = [f"{len(answered)} of {len(sentinels)} given answered"]
    status: Status = "ok"
    if len(named) > 1:
        status = "warn"
        parts.append(f"they disagree on the master: {', '.join(sorted(named))}")
    else:
        parts.append(f"master {master}")
    state = next((s.state.value for s in answered if s.state.ok), None)
    if isinstance(state, dict):
        others = int(state.get("num-other-sentinels", 0))
        parts.append(f"quorum {state.get('quorum', '?')} of {others + 1} Sentinels")
        if others + 1 < 3:
            status = _worst([status, "warn"])
            parts.append("fewer than 3 Sentinels: one lost Sentinel can stop a failover")
        flags = str(state.get("flags", ""))
        if "down" in flags:
            status = "fail"
            parts.append(f"master flags {flags}")
    quorum = next((s.ckquorum for s in answered), Reply("error"))
    if quorum.ok:
        parts.append("CKQUORUM ok")
    else:
        status = _worst([status, "warn"])
        parts.append(f"CKQUORUM: {quorum.detail or quorum.outcome}: a failover cannot be decided")
    return Check("sentinel", status, "; ".join(parts))


def promise(checks: Sequence[Check], facts: Sequence[NodeFacts], settings: Settings) -> str:
    """What this deployment promises, in a few sentences (the report's end)."""
    status = {c.name: c.status for c in checks}
    if verdict(checks) == "fail":
        failed = ", ".join(c.name for c in checks if c.status == "fail")
        return (
            f"This deployment does not give aiolock's guarantees until the failed checks "
            f"({failed}) are fixed."
        )
    lines = [
        f"aiolock promises here: one holder per lock while its lease ({settings.lease:g} s) "
        "is renewed, and fencing tokens strictly increasing per name."
    ]
    if status.get("persistence") != "ok":
        lines.append(
            "A restart may lose held locks: pass the fencing token to the resource, which "
            "must refuse an older one."
        )
    replicas = sum(int(f.info.value.get("connected_slaves", 0)) for f in facts if f.info.ok)
    if replicas or settings.cluster or settings.sentinel:
        lines.append(
            "A failover may lose a lock granted just before it unless acquisitions use replicas=N."
        )
    if any(c.status == "warn" for c in checks):
        lines.append("See the warnings above.")
    return " ".join(lines)
