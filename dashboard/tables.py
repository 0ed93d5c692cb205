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

A table drawn to `fit` is as wide as the page and never wider, so a reader sees every
column without scrolling sideways: each column is as wide as its `width` (the columns
without one share what is left), every row is one line, and text longer than its column
is cut with an ellipsis, the whole text in the cell's tooltip (`title`).
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
    """The column's least width in pixels (in a table drawn to fit: its width)."""
    wrap: bool = False
    """Long text wraps within `width` (every other column keeps a cell on one line)."""
    tip: str | None = None
    """The row's key of the cell's tooltip, where it is not the cell's own text (a case's
    full id beside its short label)."""
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


CLIP = "overflow: hidden; text-overflow: ellipsis"
PAD = "padding: 0.25rem 0.4rem"
"""A cell's padding in a table drawn to fit: narrower than Streamlit's, for more columns."""


def _cell(col: Column, row: dict[str, Any], fit: bool) -> str:
    value = row.get(col.name)
    tip = row.get(col.tip) if col.tip else None
    if col.spark:
        inner = sparkline(value or [])
    else:
        text = col.text if col.text is not None else ("" if value is None else value)
        inner = html_text(text)
        if fit and tip is None and not col.wrap:
            tip = text
    href = row.get(col.link) if col.link else None
    if href:
        # A URL made by page_url: percent-encoded, so escaping for the attribute is enough
        # (html_text's word joiners would change the address).
        inner = f'<a href="{html.escape(href)}" target="_self">{inner}</a>'
    css = col.style(value) if col.style else ""
    if col.wrap:
        css = f"white-space: normal; {css}"
    elif fit and not col.spark:
        css = f"{CLIP}; {css}"
    if fit:
        css = f"{PAD}; {css}"
    style = f' style="{html.escape(css.strip().rstrip(";"))}"' if css else ""
    title = f' title="{html_text(tip)}"' if tip not in (None, "") else ""
    if col.tip:  # what the tooltip holds, by name: a reader finds it there
        title += f' data-tip="{html_text(col.tip)}"'
    return f'<td data-col="{html_text(col.name)}"{title}{style}>{inner}</td>'


def _head(col: Column, fit: bool) -> str:
    tip = f' title="{html_text(col.help)}"' if col.help else ""
    if fit:
        width = f"width: {int(col.width)}px; " if col.width else ""
        style = f' style="{width}{PAD}; {CLIP}"'
    else:
        style = f' style="min-width: {int(col.width)}px"' if col.width else ""
    return f"<th{tip}{style}>{html_text(col.title or col.name)}</th>"


def html_table(
    key: str, rows: Sequence[dict[str, Any]], columns: Sequence[Column], *, fit: bool = False
) -> str:
    """The rows as one HTML table; `key` is its id, as a widget's key names a widget. Drawn
    to `fit`, it is as wide as the page and never wider (see the module's docstring); else
    it sits in a box that scrolls sideways when it is wider than the page."""
    head = "".join(_head(c, fit) for c in columns)
    body = "".join("<tr>" + "".join(_cell(c, row, fit) for c in columns) + "</tr>" for row in rows)
    layout = "; table-layout: fixed; width: 100%" if fit else ""
    return (
        f'<div class="mt-table" id="{html_text(key)}" style="overflow-x: auto">'
        f'<table style="font-size: 0.85rem; white-space: nowrap{layout}">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )
