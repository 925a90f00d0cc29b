"""Text of the operator commands' tables: rows, columns and the WAITING legend.

Shared by ``ls`` and ``force-release`` (``ops``) and ``top`` (``ops_view``);
pure functions of ``ops_state``'s description, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aiolock.cli.ops_state import Primitive


def shown_url(url: str) -> str:
    """``url`` without its password, for messages."""
    return re.sub(r"//[^/@]*@", "//***@", url)


def secs(ms: int | None) -> str:
    if ms is None:
        return "no expiry"
    if ms >= 3_600_000:
        return f"{ms // 3_600_000}h{ms % 3_600_000 // 60_000:02d}m"
    if ms >= 120_000:
        return f"{ms // 60_000}m{ms % 60_000 // 1000:02d}s"
    return f"{ms / 1000:.1f} s"


def short(client_id: str) -> str:
    return client_id[:8] + "…" if len(client_id) > 9 else client_id


def holder_text(p: Primitive) -> str:
    """Who holds ``p``, in a few words (``top`` and ``force-release``)."""
    if p.spec.gate:
        return latch_text(p)
    if not p.holders:
        return "nobody"
    parts = []
    for h in p.holders:
        what = f"{h.owner}"
        if h.role in ("read", "write"):
            what += f" ({h.role})"
        if h.permits is not None:
            what += f" ({h.permits} permit{'s' if h.permits != 1 else ''})"
        parts.append(what)
    return ", ".join(parts)


def latch_text(p: Primitive) -> str:
    """A latch's state, the same words in every command: "counting down: N to go" or "open"."""
    count = p.details.get("count", 0)
    return f"counting down: {count} to go" if p.counting_down else "open"


def ls_rows(p: Primitive) -> list[list[str]]:
    """Table rows of one primitive: one per holder (at least one)."""
    waiting = p.waiting
    if p.spec.gate:
        return [[p.name, p.kind, f"({latch_text(p)})", "-", secs(p.ttl_ms), "-", waiting]]
    holders = p.holders or ()
    if not holders:
        return [[p.name, p.kind, "-", "-", "-", tok(p.last_token), waiting]]
    rows = []
    for h in holders:
        owner = h.owner
        if h.role in ("read", "write"):
            owner += f" ({h.role})"
        count = str(h.permits) + "p" if h.permits is not None else str(h.count)
        token = tok(h.token) if h.token is not None else tok(p.last_token) + "*"
        rows.append([p.name, p.kind, owner, count, secs(h.ttl_ms), token, waiting])
    return rows


def tok(token: int | None) -> str:
    return "-" if token is None else str(token)


LS_HEADER = ["NAME", "KIND", "HOLDER", "HOLDS", "TTL", "TOKEN", "WAITING"]

#: What a ``+`` in WAITING (``untracked_waiters``) means.
UNTRACKED_TEXT = (
    "a task that does not register (list or poll notify mode, a spin or multi lock) "
    "found the lock held and waits for it; how many is not recorded, and one that gave "
    "up is still counted until its next try would have been due (the hold's TTL then "
    "plus its Client's lease)"
)


def waiting_legend(listed: Sequence[Primitive]) -> list[str]:
    """What the WAITING column counts and, for the kinds in ``listed``, which
    waiters Redis does not record (``ls`` and ``top`` print it under the table)."""
    lines = ["WAITING: the waiters recorded in Redis. Not visible from Redis:"]
    kinds = {p.kind: p.not_shown for p in listed if p.not_shown and p.waiting != "?"}
    lines.extend(f"  {kind}: {text}" for kind, text in kinds.items())
    unrecorded = {p.kind: p.not_shown for p in listed if p.waiting == "?"}
    for kind, text in unrecorded.items():
        lines.append(f"  ? ({kind}): {text}")
    if any(p.untracked_waiters for p in listed):
        lines.append(f"  +: {UNTRACKED_TEXT}")
    return lines if len(lines) > 1 else []
