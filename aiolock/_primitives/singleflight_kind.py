"""The singleflight kind: Singleflight (_primitives/singleflight.py).

Its key layout (``SingleflightKeys``: the names its scripts are given) and its
declaration (aiolock/_core/protocol/kinds.py): layout, member formats and
reader, operations. Data and a pure reader, no runtime: the operator commands
read it without the primitive's code (registered in
aiolock/_primitives/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._core.protocol import kinds
from .._core.protocol.keys import Keys, main_key

__all__ = ["KIND", "RESULT", "RUN", "RUN_FENCE", "SingleflightKeys"]

# Apart from a lock's keys (``:sf...``): a singleflight and a lock of one name
# are two different things. Member formats (scripts/singleflight_*.lua): the
# run hash holds the runner, ``<client id>:<task serial>:<attempt>`` = 1, and
# its fencing token in ``~fence`` (the lock hash's layout, so that the
# watchdog renews it with renew.lua); the fence hash's ``t`` is the last token
# issued; the result hash the last outcome: ``t`` the token of the run that
# wrote it, ``k`` its kind (v value, e exception, x unshareable), ``v`` the
# payload, ``c`` 1 if later callers may take it (ttl > 0).
RUN = ":sf"
RUN_FENCE = ":sf:fence"
RESULT = ":sf:res"


@dataclass(frozen=True, slots=True)
class SingleflightKeys(Keys):
    """Singleflight: ``main`` the run hash (``<prefix>:{<name>}:sf``), ``fence``,
    ``result``; ``channel`` / ``signal`` wake its waiters. The tuples are the
    KEYS of singleflight_begin, _done and _abandon."""

    fence: str
    result: str
    local: str
    begin: tuple[str, str, str]
    done: tuple[str, str, str]
    abandon: tuple[str, str]

    @classmethod
    def of(cls, prefix: str, name: str) -> SingleflightKeys:
        base = main_key(prefix, name)
        run, fence, result = base + RUN, base + RUN_FENCE, base + RESULT
        signal = f"{run}:signal"
        return cls(
            main=run,
            channel=f"{run}:ch".encode(),
            signal=signal,
            fence=fence,
            result=result,
            local=f"{run}:local",
            begin=(run, fence, result),
            done=(run, result, signal),
            abandon=(run, signal),
        )


def _read(raw: kinds.RawName, run: kinds.RawKey | None) -> kinds.Description | None:
    fence = raw.get(RUN_FENCE, "hash")
    result = raw.get(RESULT, "hash")
    if run is None and fence is None and result is None:
        return None
    last = kinds.to_int(fence.value.get("t")) if fence else None
    details: dict[str, object] = {"running": "running" if run is not None else "no run"}
    if result is None:
        details["outcome"] = "no outcome kept"
    else:
        kind = {"v": "a value", "e": "an exception", "x": "an unshareable result"}.get(
            result.value.get("k", ""), "an unknown record"
        )
        kept = "for later callers" if result.value.get("c") == "1" else "for its waiters"
        left = kinds.ttl(result.pttl)
        until = f", {left / 1000:.1f} s more" if left is not None else ""
        details["outcome"] = f"last outcome {kind}, kept {kept}{until}"
    if run is None:
        key = f"{raw.prefix}:{{{raw.name}}}{RUN}"
        return kinds.Description(KIND, raw.name, key, None, last_token=last, details=details)
    holders = []
    token = kinds.to_int(run.value.get("~fence"))
    for field in run.value:
        if field == "~fence":
            continue
        client_id, _, rest = field.partition(":")
        serial = kinds.to_int(rest.partition(":")[0])
        holders.append(
            kinds.Holder(
                field.rpartition(":")[0],
                client_id,
                serial or 0,
                "exclusive",
                kinds.ttl(run.pttl),
                token=token,
            )
        )
    ttl = kinds.ttl(run.pttl)
    return kinds.Description(
        KIND, raw.name, run.key, ttl, tuple(holders), last_token=last, details=details
    )


KIND = kinds.KindSpec(
    name="singleflight",
    words="singleflight",
    parts=(
        kinds.Part(RUN, "hash", "the runner (<owner>:<attempt>) and its token (~fence)"),
        kinds.Part(RUN_FENCE, "hash", "t: the last fencing token issued"),
        kinds.Part(RESULT, "hash", "the last outcome: t token, k kind, v payload, c cacheable"),
    ),
    read=_read,
    wakeups=(r":sf:signal",),
    renewals=("renew",),
    cannot_release="a run ends when its function returns; a runner that dies frees it "
    "within one lease",
    keys=SingleflightKeys.of,
    waiters_recorded=False,
    not_shown="callers waiting for the run are not recorded in Redis",
    holds_counted=False,
    summary="{running}; {outcome}",
    holder_note="running the function",
    counter_note="last fencing token issued: {last_token}",
)
