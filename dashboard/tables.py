"""Tables drawn on the server as HTML: the Overview's cases and pull requests, History's
events. A link in a cell opens what its row is about (a case's History, a run's detail, a
Compare) in the same tab, by the dashboard's own URL, so the address bar can be shared.

One small `st.dataframe` cost a new visitor 0.38 s in Chromium beside an empty page
(scripts/bench_dashboard.py: its grid library is loaded by every fresh browser), for tables
of tens of rows that need no grid. A table here
arrives drawn, through Markdown as an HTML block, as History's panels do: one line, no blank
line, every recorded text escaped (memtrack.escape.html_text), so neither Markdown nor math
reads inside it. The markup is well-formed XML, and each cell names its column
(`data-col`): a test, or a script, reads it back cell by cell.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from memtrack.escape import html_text

SPARK_WIDTH, SPARK_HEIGHT = 100, 22


@dataclass(frozen=True)
class Column:
    """One column of a table."""

    name: str
    """The row's key of the cell's value, and the header unless `title` is given."""
    title: str | None = None
    """The header, when it differs from `name`."""
    width: int | None = None
    """The column's least width in pixels."""
    wrap: bool = False
    """Long text wraps within `width` (every other column keeps a cell on one line)."""
    help: str | None = None
    """The header's tooltip."""
    style: Callable[[Any], str] | None = None
    """CSS for a cell, from its value ('' for none)."""
    link: str | None = None
    """The row's key of the URL the cell opens (none where that value is empty)."""
    text: str | None = None
    """The link's text, for a column that shows a link and no value of its own."""
    spark: bool = False
    """The value is a list of numbers, drawn as a sparkline."""


def page_url(page: str, **params: str) -> str:
    """The dashboard's own address of a page and its selections: '?page=History&case=...'.
    Every value is percent-encoded, so none can end the query, add a parameter or leave
    the dashboard."""
    return "?" + urlencode({"page": page, **params}, quote_via=quote, safe="")


def sparkline(values: Sequence[float]) -> str:
    """A small inline SVG of `values` (oldest first), scaled to their own range; the values
    themselves in `data-values`."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = SPARK_WIDTH / max(len(values) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{SPARK_HEIGHT - 2 - (v - low) / span * (SPARK_HEIGHT - 4):.1f}"
        for i, v in enumerate(values)
    )
    return (
        f'<svg class="spark" width="{SPARK_WIDTH}" height="{SPARK_HEIGHT}" '
        f'viewBox="0 0 {SPARK_WIDTH} {SPARK_HEIGHT}" role="img" '
        f'aria-label="{len(values)} values" data-values="{" ".join(repr(v) for v in values)}">'
        f'<polyline points="{points}" fill="none" stroke="#1f77b4" stroke-width="1.5"/></svg>'
    )


def _cell(col: Column, row: dict[str, Any]) -> str:
    value = row.get(col.name)
    if col.spark:
        inner = sparkline(value or [])
    else:
        inner = html_text(col.text if col.text is not None else ("" if value is None else value))
    href = row.get(col.link) if col.link else None
    if href:
        # A URL made by page_url: percent-encoded, so escaping for the attribute is enough
        # (html_text's word joiners would change the address).
        inner = f'<a href="{html.escape(href)}" target="_self">{inner}</a>'
    css = col.style(value) if col.style else ""
    if col.wrap:
        css = f"white-space: normal; {css}"
    style = f' style="{html.escape(css)}"' if css else ""
    return f'<td data-col="{html_text(col.name)}"{style}>{inner}</td>'


def _head(col: Column) -> str:
    tip = f' title="{html_text(col.help)}"' if col.help else ""
    width = f' style="min-width: {int(col.width)}px"' if col.width else ""
    return f"<th{tip}{width}>{html_text(col.title or col.name)}</th>"


def html_table(key: str, rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """The rows as one HTML table, in a box that scrolls sideways when it is wider than the
    page; `key` is its id, as a widget's key names a widget."""
    head = "".join(_head(c) for c in columns)
    body = "".join("<tr>" + "".join(_cell(c, row) for c in columns) + "</tr>" for row in rows)
    return (
        f'<div class="mt-table" id="{html_text(key)}" style="overflow-x: auto">'
        '<table style="font-size: 0.85rem; white-space: nowrap">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )
