"""``aiolock top``'s views: a live rich table on a terminal, plain lines elsewhere.

``make_view`` picks: rich (the ``demo`` extra) when ``out`` is a terminal and
``plain`` was not asked for, else ``PlainView``. Both take the listed
primitives of one refresh in ``update`` and are stopped by ``close``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol, TextIO

from aiolock.cli.ops_state import Primitive
from aiolock.cli.ops_text import LS_HEADER, ls_rows, shown_url, waiting_legend

if TYPE_CHECKING:
    from rich.live import Live

__all__ = ["PlainView", "RichView", "Target", "View", "make_view"]


class Target(Protocol):
    """Where ``top`` looks (``ops_connect.Target``): its URL and key prefix."""

    @property
    def url(self) -> str: ...

    @property
    def prefix(self) -> str: ...


class View(Protocol):
    def update(self, listed: list[Primitive]) -> None: ...

    def close(self) -> None: ...


def _summary(listed: list[Primitive]) -> str:
    """Counts in the words ``ls``, ``inspect`` and ``force-release`` use (a latch is
    never "held": it is counting down)."""
    held = sum(1 for p in listed if p.held)
    contended = sum(1 for p in listed if p.contended)
    latches = sum(1 for p in listed if p.counting_down)
    text = f"{held} held, {contended} contended"
    if latches:
        text += f", {latches} latch{'es' if latches != 1 else ''} counting down"
    return text


class PlainView:
    """One header line per refresh, then a line per holder (tab-separated ``ls``
    columns); what WAITING cannot show is explained once per kind seen."""

    def __init__(self, target: Target, out: TextIO) -> None:
        self.target = target
        self.out = out
        self.explained: set[str] = set()

    def update(self, listed: list[Primitive]) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(
            f"{stamp} {shown_url(self.target.url)} prefix {self.target.prefix}: {_summary(listed)}",
            file=self.out,
        )
        for p in listed:
            for row in ls_rows(p):
                print("\t".join(row), file=self.out)
        legend = waiting_legend(listed)
        if legend and not set(legend) <= self.explained:
            self.explained.update(legend)
            for line in legend:
                print(line, file=self.out)
        self.out.flush()

    def close(self) -> None:
        pass


class RichView:
    """A live table, redrawn in place each refresh."""

    def __init__(self, target: Target) -> None:
        from rich.console import Console
        from rich.live import Live

        self.target = target
        self.live: Live = Live(console=Console(), auto_refresh=False, transient=False)
        self.live.start()

    def update(self, listed: list[Primitive]) -> None:
        from rich.table import Table

        title = (
            f"aiolock top · {shown_url(self.target.url)} · prefix {self.target.prefix} · "
            f"{time.strftime('%H:%M:%S')} · {_summary(listed)}"
        )
        legend = waiting_legend(listed)
        table = Table(
            title=title,
            title_justify="left",
            caption="\n".join(legend) or None,
            caption_justify="left",
        )
        for column in LS_HEADER:
            table.add_column(column, overflow="fold", no_wrap=column == "KIND")
        for p in listed:
            style = "bold red" if p.contended else None
            for row in ls_rows(p):
                table.add_row(*row, style=style)
        if not listed:
            table.add_row("(none)", *[""] * (len(LS_HEADER) - 1))
        self.live.update(table, refresh=True)

    def close(self) -> None:
        self.live.stop()


def make_view(target: Target, *, plain: bool, out: TextIO) -> View:
    """A RichView when ``out`` is a terminal, rich is installed and not ``plain``; else plain."""
    if not plain and out.isatty():
        try:
            return RichView(target)
        except ImportError:
            pass
    return PlainView(target, out)
