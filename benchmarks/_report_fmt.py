# ruff: noqa: RUF001  (a report writer: an en dash stands for a figure not measured)
"""The small helpers every report section shares: a safe ratio, a target row
(measured against its limit), and how a figure or a verdict is shown.

``_report`` and its sections (``_report_cluster``, ``_report_failover``) import
them from here, so no section imports ``_report`` back.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["_div", "_f", "_met", "_t"]


def _div(a: float, b: float) -> float:
    if not b or math.isnan(b) or math.isnan(a):
        return math.inf if b == 0 and a > 0 else math.nan
    return a / b


def _t(
    target: str, loop: str, measured: float | None, limit: float, op: str, show: str, note: str = ""
) -> dict[str, Any]:
    if measured is None or (isinstance(measured, float) and math.isnan(measured)):
        met: bool | None = None
        margin = "not measured"
    else:
        if op == "<=":
            met = measured <= limit
        elif op == "<":
            met = measured < limit
        elif op == ">=":
            met = measured >= limit
        else:
            met = measured == limit
        if op in ("<=", "<") and limit:
            margin = f"{measured / limit:.2f}x the limit"
        elif op == ">=" and limit:
            margin = f"{measured / limit:.2f}x the minimum"
        else:
            margin = ""
    return {
        "target": target,
        "loop": loop,
        "measured": show,
        "required": f"{op} {limit:g}",
        "met": met,
        "margin": margin,
        "note": note,
    }


def _f(x: Any, fmt: str = ".0f") -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isnan(x):
        return "–"
    return format(x, fmt)


def _met(m: bool | None) -> str:
    return "n/a" if m is None else ("**met**" if m else "**NOT met**")
