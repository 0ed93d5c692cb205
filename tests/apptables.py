"""The dashboard's tables as a test reads them, in page order: a grid (`st.dataframe`) by
its value, a table drawn as HTML (dashboard/tables.py) read back cell by cell from its
markup. A linked cell's address is the column `<name> href`; a sparkline's cell is its list
of values; a tooltip that names what it holds (`data-tip`, a case's full id) is that
column."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pandas as pd
from streamlit.testing.v1 import AppTest

HTML_TABLE = '<div class="mt-table"'


def read_html_table(markup: str) -> pd.DataFrame:
    """One table of dashboard/tables.py as a DataFrame of its shown texts."""
    root = ET.fromstring(markup)
    rows = []
    for tr in root.find("table/tbody") or []:
        row: dict[str, Any] = {}
        for td in tr:
            col = td.get("data-col") or ""
            spark = td.find("svg")
            link = td.find("a")
            if spark is not None:
                row[col] = [float(v) for v in (spark.get("data-values") or "").split()]
            else:
                row[col] = "".join(td.itertext())
            if link is not None:
                row[f"{col} href"] = link.get("href")
            if td.get("data-tip"):
                row[td.get("data-tip") or ""] = td.get("title") or ""
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs["id"] = root.get("id")
    return frame


def drawn(app: str, **query: str) -> AppTest:
    """The app (its arguments as sys.argv holds them) run once at the address `query`
    names, having raised nothing."""
    at = AppTest.from_file(app, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def tables(at: AppTest) -> list[pd.DataFrame]:
    """Every table of the main area, in the order the page shows them."""
    out = []
    for el in at.main:  # the whole tree, depth first, in page order
        if el.type == "dataframe":
            out.append(el.value)
        elif el.type == "markdown" and str(el.value).startswith(HTML_TABLE):
            out.append(read_html_table(el.value))
    return out


def table(at: AppTest, which: int | str = 0) -> pd.DataFrame:
    """A table of the page: by its place among them, or an HTML table by its key."""
    found = tables(at)
    if isinstance(which, str):
        (hit,) = [t for t in found if t.attrs.get("id") == which]
        return hit
    return found[which]
