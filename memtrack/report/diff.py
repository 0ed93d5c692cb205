"""`memtrack diff`: the site diff of two runs or snapshots, as a table and as JSON."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from memtrack.escape import terminal_text
from memtrack.judge.where import Change
from memtrack.units import format_size


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "") + format_size(abs(n))


def diff_table(case: str, changes: list[Change]) -> Table:
    """Every site that changed, largest growth first, then the count of those that did not."""
    moved = [c for c in changes if c.delta]
    same = len(changes) - len(moved)
    before, after = sum(c.before for c in changes), sum(c.after for c in changes)
    sizes = f"{format_size(before)} -> {format_size(after)}"
    t = Table(
        title=f"{escape(terminal_text(case))}: {sizes} at the peak ({_signed(after - before)})",
        title_justify="left",
        caption=f"{same} site(s) unchanged" if same else None,
    )
    for name in ("site", "line", "A", "B", "change"):
        t.add_column(name, justify="right" if name != "site" else "left")
    for c in moved:
        t.add_row(
            escape(terminal_text(c.key)),
            str(c.line) if c.line else "",
            format_size(c.before),
            format_size(c.after),
            _signed(c.delta),
        )
    if not moved:
        t.add_row("(no site changed)", "", "", "", "")
    return t


def diff_json(found: list[tuple[str, list[Change]]]) -> list[dict[str, Any]]:
    return [
        {
            "case": case,
            "sites": [
                {
                    "grouping": c.grouping,
                    "key": c.key,
                    "line": c.line,
                    "a_bytes": c.before,
                    "b_bytes": c.after,
                    "delta_bytes": c.delta,
                }
                for c in changes
            ],
        }
        for case, changes in found
    ]
