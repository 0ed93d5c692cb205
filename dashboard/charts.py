"""Charts: History panels as Vega-Lite specs, the breakdown with Altair. Bytes are drawn in
one readable unit per panel; tooltips show exact sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from dashboard import model
from memtrack.units import BINARY_UNITS, format_seconds, format_size

if TYPE_CHECKING:
    import altair as alt

VIEW_COLORS = {
    "allocated": "#1f77b4",
    "reserved": "#9467bd",
    "requested": "#17becf",
    "device": "#ff7f0e",
    "host": "#7f7f7f",
    "host_step": "#8c564b",
}
MARKER_COLORS = {
    "regression": "#d62728", "over_budget": "#d62728", "failed": "#d62728",
    "time_regression": "#ff9896", "improvement": "#2ca02c", "accepted": "#e377c2",
    "noisy": "#bcbd22", "environment_changed": "#8c564b", "new": "#17becf",
    "estimate": "#9467bd",
}
OTHER_BRANCHES = "other branches"
BREAKDOWN = (
    ("weights_bytes", "weights"),
    ("caches_bytes", "caches"),
    ("gradients_bytes", "gradients"),
    ("optimizer_state_bytes", "optimizer state"),
    ("training_state_bytes", "training state"),
    ("intermediates_bytes", "intermediates"),
    ("unattributed_bytes", "unattributed"),
    ("workspace_bytes", "workspace / runtime"),
)
SVG = {"embedOptions": {"renderer": "svg"}}
"""Drawn as SVG: axes stay text in the page (readable by tests and screen readers)."""


def unit_for(largest: float) -> tuple[str, int]:
    for name, factor in BINARY_UNITS:
        if largest >= factor:
            return name, factor
    return "B", 1


def _short(sha: str | None) -> str:
    return (sha or "-")[:10]


# The History charts are written as plain Vega-Lite specs: building them through Altair
# validates every encoding against the schema, which took most of a History page's time.


def time_axis(times: Sequence[str]) -> dict[str, Any]:
    """The x encoding of a page: dates (and hours over short spans) that stay readable."""
    days = sorted(times)
    span = (_epoch(days[-1]) - _epoch(days[0])) if days else 0.0
    fmt = "%b %d %H:%M" if span < 3 * 86400 else "%b %d" if span < 300 * 86400 else "%Y-%m-%d"
    return {"field": "x", "type": "temporal", "title": None,
            "axis": {"format": fmt, "labelOverlap": "greedy", "tickCount": 8, "labelAngle": 0}}


def _epoch(iso: str) -> float:
    return pd.Timestamp(iso).timestamp()


def _frame(times: Sequence[str], x: dict[str, Any]) -> dict[str, Any]:
    """An invisible layer at the page's first and last time: every panel spans the same
    dates, so a change lines up across views."""
    first, last = pd.Timestamp(min(times)), pd.Timestamp(max(times))
    pad = max((last - first) * 0.015, pd.Timedelta(minutes=5))  # the last mark stays whole
    return {"data": {"values": [{"x": (first - pad).isoformat()},
                                {"x": (last + pad).isoformat()}]},
            "mark": {"type": "point", "opacity": 0}, "encoding": {"x": x}}


def _y(field: str, title: str) -> dict[str, Any]:
    """A y encoding on its own scale (not from 0), its title reading as the panel's name."""
    return {"field": field, "type": "quantitative", "scale": {"zero": False, "padding": 10},
            "axis": {"title": title, "format": ",.4~g", "titleAngle": 0, "titleAlign": "left",
                     "titleAnchor": "end", "titleY": -10, "titleX": -45, "titleFontSize": 12,
                     "titleFontWeight": "bold", "titleColor": "#333"}}


def _tip(field: str, title: str | None = None, **more: Any) -> dict[str, Any]:
    return {"field": field, "type": more.pop("type", "nominal"), "title": title or field,
            **more}


def _panel(layers: list[dict[str, Any]], height: int) -> dict[str, Any]:
    # Pan and zoom along x on the first data layer; SVG keeps the axes in the page as text.
    layers[1].setdefault("params", []).append(
        {"name": "zoom", "select": {"type": "interval", "encodings": ["x"]}, "bind": "scales"})
    return {"layer": layers, "height": height, "width": "container", "padding": {"top": 24},
            "usermeta": SVG}


def view_panel(
    metric: str,
    points: Sequence[dict[str, Any]],
    x: dict[str, Any],
    budget: tuple[str, int] | None,
    band: tuple[str, str, str, int, int] | None,
    marks: Sequence[dict[str, Any]],
    env_changes: Sequence[dict[str, Any]],
    times: Sequence[str],
) -> dict[str, Any]:
    """One view of a case on its own y-scale: the base branch as a line per environment,
    other branches as separate points, the budget line, the headroom band over the current
    level, and marks (failures where they were seen, verdicts at their figure).

    points: dicts with x (ISO time), bytes, line ('base' or OTHER_BRANCHES), environment,
    commit, subject, branch; budget: (label, bytes); band: (label, x from, x to, low,
    high); marks: dicts with x, bytes, kind, commit, message.
    """
    label = model.METRIC_LABELS[metric]
    limits = [budget[1]] if budget else []
    limits += [band[4]] if band else []
    unit, factor = unit_for(max([p["bytes"] for p in points] + limits + [1]))
    title = f"{label} ({unit})"
    values = [{**p, "value": p["bytes"] / factor, "size": format_size(p["bytes"])}
              for p in points]
    tooltip = [_tip("size", label), _tip("commit"), _tip("subject"), _tip("branch"),
               _tip("x", "time", type="temporal", format="%Y-%m-%d %H:%M"),
               _tip("environment")]
    y = _y("value", title)
    color = VIEW_COLORS.get(metric, "#1f77b4")
    layers: list[dict[str, Any]] = [_frame(times, x)]
    base = [v for v in values if v["line"] == "base"]
    other = [v for v in values if v["line"] != "base"]
    if base:
        # One line per environment: figures of two software stacks are never joined.
        layers.append({"data": {"values": base},
                       "mark": {"type": "line", "strokeWidth": 1.6, "color": color,
                                "point": {"size": 28, "color": color}},
                       "encoding": {"x": x, "y": y, "detail": {"field": "environment"},
                                    "tooltip": tooltip}})
    if other:
        layers.append({"data": {"values": other},
                       "mark": {"type": "point", "shape": "diamond", "size": 55,
                                "filled": False, "strokeWidth": 1.5, "color": "#555"},
                       "encoding": {"x": x, "y": y, "tooltip": tooltip}})
    if band is not None:
        what, x0, x1, low, high = band
        layers.append({"data": {"values": [{"x": x0, "x2": x1, "low": low / factor,
                                            "high": high / factor, "what": what,
                                            "range": f"{format_size(low)} – "
                                                     f"{format_size(high)}"}]},
                       "mark": {"type": "rect", "opacity": 0.18, "color": "#2ca02c"},
                       "encoding": {"x": x, "x2": {"field": "x2"}, "y": _y("low", title),
                                    "y2": {"field": "high"},
                                    "tooltip": [_tip("what", "headroom"), _tip("range")]}})
    if budget is not None:
        text, limit = budget
        row = [{"limit": limit / factor, "label": f"budget {format_size(limit)}{text}"}]
        layers.append({"data": {"values": row},
                       "mark": {"type": "rule", "color": "#d62728", "strokeDash": [6, 4],
                                "strokeWidth": 2},
                       "encoding": {"y": {"field": "limit", "type": "quantitative"},
                                    "tooltip": [_tip("label", "budget")]}})
        layers.append({"data": {"values": row},
                       "mark": {"type": "text", "align": "left", "baseline": "top", "dx": 4,
                                "dy": 3, "color": "#d62728", "fontWeight": "bold"},
                       "encoding": {"y": {"field": "limit", "type": "quantitative"},
                                    "x": {"value": 0}, "text": {"field": "label"}}})
    if env_changes:
        layers.append({"data": {"values": list(env_changes)},
                       "mark": {"type": "rule", "color": "#8c564b", "strokeDash": [2, 3],
                                "strokeWidth": 1.5},
                       "encoding": {"x": x, "tooltip": [_tip("change", "environment")]}})
    if marks:
        kinds = sorted({m["kind"] for m in marks})
        layers.append({"data": {"values": [{**m, "value": m["bytes"] / factor}
                                           for m in marks]},
                       "mark": {"type": "point", "shape": "triangle-down", "size": 150,
                                "filled": True, "opacity": 0.9},
                       "encoding": {"x": x, "y": {"field": "value", "type": "quantitative"},
                                    "color": {"field": "kind", "type": "nominal", "title": None,
                                              "legend": {"orient": "top"},
                                              "scale": {"domain": kinds, "range": [
                                                  MARKER_COLORS.get(k, "#444")
                                                  for k in kinds]}},
                                    "tooltip": [_tip("kind"), _tip("commit"),
                                                _tip("message")]}})
    return _panel(layers, 200)


def time_chart(rows: Sequence[dict[str, Any]], x: dict[str, Any]) -> dict[str, Any] | None:
    """Median and p95 iteration time per run (rows carry their x)."""
    records = [{"x": r["x"], "stat": label, "seconds": r[col],
                "shown": format_seconds(r[col]), "commit": _short(r.get("git_commit")),
                "subject": (r.get("git_subject") or "")[:60]}
               for r in rows
               for col, label in (("time_median_s", "median"), ("time_p95_s", "p95"))
               if r.get(col) is not None]
    if not records:
        return None
    scale, unit = (1000, "ms") if max(r["seconds"] for r in records) < 1 else (1, "s")
    for r in records:
        r["value"] = r["seconds"] * scale
    line = {"data": {"values": records},
            "mark": {"type": "line", "point": {"size": 20}, "strokeWidth": 1.4},
            "encoding": {"x": x, "y": _y("value", f"iteration time ({unit})"),
                         "color": {"field": "stat", "type": "nominal", "title": None,
                                   "legend": {"orient": "top"}},
                         "strokeDash": {"field": "stat", "type": "nominal", "legend": None},
                         "tooltip": [_tip("stat"), _tip("shown", "time"), _tip("commit"),
                                     _tip("subject"), _tip("x", "at", type="temporal",
                                                           format="%Y-%m-%d %H:%M")]}}
    return _panel([_frame([r["x"] for r in rows], x), line], 170)


def breakdown_chart(measurements: Sequence[dict[str, Any]]) -> alt.Chart | None:
    """One stacked bar per case: the breakdown's parts (training state only for rows
    recorded before gradients and optimizer state were told apart)."""
    import altair as alt  # only this chart is built with Altair: keep it off the other pages

    records = []
    for m in measurements:
        split = m.get("gradients_bytes") is not None or m.get("optimizer_state_bytes") is not None
        for col, label in BREAKDOWN:
            if col == "training_state_bytes" and split:
                continue
            value = m.get(col)
            if value:
                records.append({"case": m["case_id"], "part": label, "bytes": value,
                                "size": format_size(value)})
    if not records:
        return None
    df = pd.DataFrame(records)
    unit, factor = unit_for(df.groupby("case")["bytes"].sum().max())
    df["value"] = df["bytes"] / factor
    order = [label for _, label in BREAKDOWN]
    return (
        alt.Chart(df).mark_bar()
        .encode(
            y=alt.Y("case:N", title=None, axis=alt.Axis(labelLimit=420)),
            x=alt.X("value:Q", title=f"memory ({unit})", stack="zero"),
            color=alt.Color("part:N", title=None, sort=order,
                            scale=alt.Scale(domain=order, scheme="tableau10"),
                            legend=alt.Legend(orient="top")),
            order=alt.Order("order:Q"),
            tooltip=["case:N", "part:N", alt.Tooltip("size:N", title="size")],
        )
        .transform_calculate(order=f"indexof({order!r}, datum.part)")
        # Streamlit sizes a chart to this height including its legend and axis.
        .properties(height=130 + 40 * df["case"].nunique())
    )


def plan_chart(param: str, points: Sequence[tuple[float, int]],
               curve: Sequence[tuple[float, float]],
               gpus: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """The Plan page: measured peaks against the swept value, the fitted curve, and a
    horizontal rule at each GPU's memory. Both axes are logarithmic where the values allow
    (a sweep doubles; GPU memory is orders of magnitude above a small case)."""
    log_x = all(x > 0 for x, _ in points)
    x_enc = {"field": "x", "type": "quantitative", "title": param,
             "scale": {"type": "log" if log_x else "linear"},
             "axis": {"format": ",.4~g"}}
    y_enc = {"field": "gib", "type": "quantitative", "title": "peak (GiB)",
             "scale": {"type": "log"}, "axis": {"format": ",.4~g"}}
    gib = float(2**30)
    layers: list[dict[str, Any]] = [
        {"data": {"values": [{"x": x, "gib": y / gib} for x, y in curve if y > 0]},
         "mark": {"type": "line", "color": "#1f77b4", "strokeDash": [4, 3]},
         "encoding": {"x": x_enc, "y": y_enc}},
        {"data": {"values": [{"x": x, "gib": y / gib, "peak": format_size(y),
                              "bytes": f"{y:,} B"} for x, y in points]},
         "mark": {"type": "point", "filled": True, "size": 70, "color": "#1f77b4"},
         "encoding": {"x": x_enc, "y": y_enc,
                      "tooltip": [_tip("x", param, type="quantitative"), _tip("peak"),
                                  _tip("bytes")]}},
    ]
    if gpus:
        rules = [{"gpu": name, "gib": memory / gib, "memory": f"{memory:,} B"}
                 for name, memory in gpus]
        layers += [
            {"data": {"values": rules}, "mark": {"type": "rule", "color": "#d62728",
                                                 "strokeDash": [6, 4]},
             "encoding": {"y": y_enc, "tooltip": [_tip("gpu"), _tip("memory")]}},
            {"data": {"values": rules},
             "mark": {"type": "text", "align": "left", "dx": 4, "dy": -6, "color": "#d62728",
                      "x": 0},
             "encoding": {"y": y_enc, "text": {"field": "gpu"}}},
        ]
    return {"layer": layers, "height": 420, "width": "container", "usermeta": SVG}
