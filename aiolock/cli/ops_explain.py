"""The operator commands' rendering: JSON documents and ``inspect``'s sentences.

Pure: no I/O, no redis-py. ``primitive_json`` / ``state_json`` are the JSON
fields the README documents (``ls --json``, ``inspect --json``); ``explain`` is
``inspect``'s text, ``table`` ``ls``'s, ``told`` what ``force-release`` says it
did to the holders. What a kind is called and how it reads comes from its
declaration (``aiolock.cli.ops_state``, ``aiolock.cli.ops_text``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, TextIO

from aiolock.cli.ops_state import NameState, Primitive
from aiolock.cli.ops_text import LS_HEADER, UNTRACKED_TEXT, latch_text, secs

__all__ = ["explain", "primitive_json", "state_json", "table", "told"]


def primitive_json(p: Primitive) -> dict[str, Any]:
    """A primitive as JSON (the fields the README documents)."""
    return {
        "name": p.name,
        "kind": p.kind,
        "key": p.key,
        "state": p.state,
        "held": p.held,
        "ttl_ms": p.ttl_ms,
        "holders": [asdict(h) for h in p.holders],
        "waiters": [asdict(w) for w in p.waiters],
        "untracked_waiters": p.untracked_waiters,
        "waiters_not_shown": p.not_shown,
        "last_token": p.last_token,
        "last_released": p.last_released,
        "details": dict(p.details),
    }


def state_json(s: NameState) -> dict[str, Any]:
    """A name's state as JSON (``inspect --json``)."""
    return {
        "prefix": s.prefix,
        "name": s.name,
        "exists": s.exists,
        "last_token": s.last_token,
        "last_released": s.last_released,
        "primitives": [primitive_json(p) for p in s.primitives],
        "keys": [asdict(k) for k in s.keys],
    }


def table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in [LS_HEADER, *rows]) for i in range(len(LS_HEADER))]
    for row in [LS_HEADER, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def explain(s: NameState) -> list[str]:
    """``inspect``'s text: what is kept for the name, in sentences."""
    lines: list[str] = []
    if not s.exists:
        return [f"nothing is kept for {s.name!r} under prefix {s.prefix!r}."]
    for p in s.primitives:
        lines.append(f"{p.spec.words} {p.name!r} (key {p.key}):")
        lines.extend("  " + line for line in _explain_primitive(p))
    if not s.primitives:
        lines.append(f"{s.name!r} is not held; only its fencing counter is kept.")
    if s.last_token is not None:
        released = f"; last released {s.last_released}" if s.last_released is not None else ""
        lines.append(
            f"fencing counter: last token issued {s.last_token} (counting tokens a Client "
            f"reserved for local handoffs){released}."
        )
    lines.append("keys:")
    lines.extend(f"  {k.key}  {k.type}, {secs(k.ttl_ms)}" for k in s.keys)
    return lines


def _who(client_id: str, task: int | None) -> str:
    if task is None:
        return f"client {client_id}"
    return f"task {task} of client {client_id}"


def _explain_primitive(p: Primitive) -> list[str]:
    spec = p.spec
    if spec.foreign:
        return [f"holds a {p.details.get('type')} aiolock did not write; aiolock refuses to use it"]
    if spec.gate:
        return [
            f"{latch_text(p)}; opened {p.details.get('generation', 0)} time(s); kept "
            f"{secs(p.ttl_ms)} more",
            f"waiting: {p.not_shown}",
        ]
    out: list[str] = []
    if spec.summary:
        out.append(spec.summary.format(**p.details))
    for h in p.holders:
        role = {"exclusive": "held", "write": "held for writing", "read": "held for reading"}.get(
            h.role, f"{h.permits} permit(s) held"
        )
        token = f", fencing token {h.token}" if h.token is not None else ""
        holds = ""
        if h.role in ("exclusive", "write", "read") and spec.holds_counted:
            holds = f", {h.count} hold recorded (re-entries are counted in its Client)"
        out.append(
            f"{role} by {_who(h.client_id, h.task)} (owner {h.owner}){holds}, "
            f"{secs(h.ttl_ms)} left{token}"
        )
    if not p.holders and not spec.summary:
        out.append("free: nobody holds it")
    if spec.counter_note and p.last_token is not None:
        out.append(spec.counter_note.format(last_token=p.last_token))
    if spec.holder_note and p.holders:
        out.append(spec.holder_note)
    if not spec.waiters_recorded:
        out.append(f"waiting: {p.not_shown}")
    elif p.waiters:
        clients = len({w.client_id for w in p.waiters})
        out.append(
            f"waiting: {len(p.waiters)} recorded in Redis ({clients} "
            f"Client{'s' if clients != 1 else ''}):"
        )
        for i, w in enumerate(p.waiters, 1):
            what = {
                "task": f"{_who(w.client_id, w.task)} (its Client's other tasks queue behind it)",
                "queued": f"#{i} {_who(w.client_id, w.task)}",
                "writer": f"writer {_who(w.client_id, w.task)}",
                "readers": f"readers of client {w.client_id}",
                "claim": f"{_who(w.client_id, w.task)} claims {w.permits} permit(s) "
                "(it has waited longest)",
            }[w.role]
            out.append(f"  {what}; entry lapses in {secs(w.ttl_ms)} unless renewed")
    else:
        out.append("waiting: none recorded in Redis")
    if p.untracked_waiters:
        out.append(f"and possibly more: {UNTRACKED_TEXT}; the release wakes them")
    if p.not_shown and spec.waiters_recorded:
        out.append(f"not visible from Redis: {p.not_shown}")
    return out


def told(p: Primitive) -> str:
    """What a force release did to the holders, and how long one may still run."""
    ttls = [h.ttl_ms for h in p.holders if h.ttl_ms is not None and h.ttl_ms >= 0]
    if not ttls and p.ttl_ms is not None and p.ttl_ms >= 0:
        ttls = [p.ttl_ms]
    left = f"{max(ttls) / 1000:.1f} s" if ttls else "its lease"
    return (
        "The holder's Client was told on its eviction channel: if connected (pub/sub mode) "
        "it marks the lease lost now, its `async with` body is cancelled and raises "
        "LockLostError. A Client that did not hear it (list or poll mode, or not subscribed "
        "yet) finds the hold gone at its watchdog's next check, within lease/3 of its Client "
        f"lease (10 s by default). A holder cut off from Redis may run on until its own lease "
        f"ends: at most {left} from when it was looked up (the hold's remaining TTL)."
    )
