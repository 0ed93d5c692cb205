"""Altair charts. Bytes are drawn in one readable unit per chart; tooltips show exact sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import pandas as pd

from dashboard import model
from memtrack.units import BINARY_UNITS, format_seconds, format_size

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


def time_axis(times: Sequence[str]) -> alt.X:
    """A temporal x axis whose labels say the date (and the hour over short spans)."""
    days = pd.to_datetime(pd.Series(list(times)), utc=True, format="ISO8601")
    span = (days.max() - days.min()).total_seconds() if len(days) else 0
    fmt = "%b %d %H:%M" if span < 3 * 86400 else "%b %d" if span < 300 * 86400 else "%Y-%m-%d"
    return alt.X("x:T", title=None,
                 axis=alt.Axis(format=fmt, labelOverlap="greedy", tickCount=8, labelAngle=0))


def _frame(times: Sequence[str], x_axis: alt.X) -> alt.Chart:
    """An invisible layer at the first and last time of the page: every panel then spans
    the same dates, so a change lines up across views."""
    return (alt.Chart(pd.DataFrame({"x": [min(times), max(times)]}))
            .mark_point(opacity=0).encode(x=x_axis))


def _y_title(title: str) -> alt.Axis:
    """A y axis whose title reads horizontally above it: a panel's name."""
    return alt.Axis(title=title, format=",.4~g", titleAngle=0, titleAlign="left",
                    titleAnchor="end", titleY=-10, titleX=-45, titleFontSize=12,
                    titleFontWeight="bold", titleColor="#333")


def view_panel(
    metric: str,
    points: Sequence[dict[str, Any]],
    x_axis: alt.X,
    budget: tuple[str, int] | None,
    band: tuple[str, str, str, int, int] | None,
    marks: Sequence[dict[str, Any]],
    env_changes: Sequence[dict[str, Any]],
    times: Sequence[str],
) -> alt.LayerChart:
    """One view of a case on its own y-scale: the base branch as a line per environment,
    other branches as separate points, the budget line, the headroom band over the current
    level, and marks (failures where they were seen, verdicts at their figure).

    points: dicts with x (ISO time), bytes, line ('base' or OTHER_BRANCHES), environment,
    commit, subject, branch; budget: (label, bytes); band: (label, x from,
    x to, low, high); marks: dicts with x, bytes, kind, commit, message.
    """
    label = model.METRIC_LABELS[metric]
    limits = [budget[1]] if budget else []
    limits += [band[4]] if band else []
    largest = max([p["bytes"] for p in points] + limits + [1])
    unit, factor = unit_for(largest)
    title = f"{label} ({unit})"
    df = pd.DataFrame(points)
    df["value"] = df["bytes"] / factor
    df["size"] = [format_size(b) for b in df["bytes"]]
    y = alt.Y("value:Q", scale=alt.Scale(zero=False), axis=_y_title(title))
    tooltip = [alt.Tooltip("size:N", title=label), "commit:N", "subject:N", "branch:N",
               alt.Tooltip("x:T", title="time", format="%Y-%m-%d %H:%M"),
               "environment:N"]
    layers: list[alt.Chart] = [_frame(times, x_axis)]
    if band is not None:
        what, x0, x1, low, high = band
        layers.append(
            alt.Chart(pd.DataFrame([{"x": x0, "x2": x1, "low": low / factor,
                                     "high": high / factor, "what": what,
                                     "range": f"{format_size(low)} – {format_size(high)}"}]))
            .mark_rect(opacity=0.18, color="#2ca02c")
            .encode(x=x_axis, x2="x2:T",
                    y=alt.Y("low:Q", axis=_y_title(title)), y2="high:Q",
                    tooltip=[alt.Tooltip("what:N", title="headroom"), "range:N"]))
    base = df[df["line"] == "base"]
    if not base.empty:
        layers.append(
            alt.Chart(base).mark_line(point=alt.OverlayMarkDef(size=28), strokeWidth=1.6,
                                      color=VIEW_COLORS.get(metric, "#1f77b4"))
            # One line per environment: figures of two software stacks are never joined.
            .encode(x=x_axis, y=y, detail="environment:N", tooltip=tooltip))
    other = df[df["line"] != "base"]
    if not other.empty:
        layers.append(
            alt.Chart(other).mark_point(shape="diamond", size=55, filled=False,
                                        strokeWidth=1.5, color="#555")
            .encode(x=x_axis, y=y, tooltip=tooltip))
    if budget is not None:
        text, limit = budget
        bdf = pd.DataFrame([{"limit": limit / factor,
                             "label": f"budget {format_size(limit)}{text}"}])
        layers.append(alt.Chart(bdf).mark_rule(color="#d62728", strokeDash=[6, 4],
                                               strokeWidth=2)
                      .encode(y="limit:Q", tooltip=[alt.Tooltip("label:N", title="budget")]))
        layers.append(alt.Chart(bdf).mark_text(align="left", baseline="top", dx=4, dy=3,
                                               color="#d62728", fontWeight="bold")
                      .encode(y="limit:Q", x=alt.value(0), text="label:N"))
    if env_changes:
        edf = pd.DataFrame(env_changes)
        layers.append(alt.Chart(edf).mark_rule(color="#8c564b", strokeDash=[2, 3],
                                               strokeWidth=1.5)
                      .encode(x="x:T", tooltip=[alt.Tooltip("change:N", title="environment")]))
    if marks:
        mdf = pd.DataFrame(marks)
        mdf["value"] = mdf["bytes"] / factor
        kinds = sorted(set(mdf["kind"]))
        layers.append(
            alt.Chart(mdf).mark_point(shape="triangle-down", size=150, filled=True, opacity=0.9)
            .encode(x="x:T", y="value:Q",
                    color=alt.Color("kind:N", title=None, legend=alt.Legend(orient="top"),
                                    scale=alt.Scale(domain=kinds, range=[
                                        MARKER_COLORS.get(k, "#444") for k in kinds])),
                    tooltip=[alt.Tooltip("kind:N"), alt.Tooltip("commit:N"),
                             alt.Tooltip("message:N")]))
    chart = alt.layer(*layers).properties(height=200, usermeta=SVG, padding={"top": 24})
    return chart.interactive(bind_y=False)


def time_chart(rows: Sequence[dict[str, Any]], x_axis: alt.X) -> alt.LayerChart | None:
    """Median and p95 iteration time per run (rows carry their x)."""
    records = []
    for r in rows:
        for col, label in (("time_median_s", "median"), ("time_p95_s", "p95")):
            if r.get(col) is not None:
                records.append({"x": r["x"], "stat": label, "seconds": r[col],
                                "shown": format_seconds(r[col]),
                                "commit": _short(r.get("git_commit")),
                                "subject": r.get("git_subject") or ""})
    if not records:
        return None
    df = pd.DataFrame(records)
    scale, unit = (1000, "ms") if df["seconds"].max() < 1 else (1, "s")
    df["value"] = df["seconds"] * scale
    line = (
        alt.Chart(df).mark_line(point=alt.OverlayMarkDef(size=20), strokeWidth=1.4)
        .encode(
            x=x_axis,
            y=alt.Y("value:Q", scale=alt.Scale(zero=False),
                    axis=_y_title(f"iteration time ({unit})")),
            color=alt.Color("stat:N", title=None, legend=alt.Legend(orient="top")),
            strokeDash=alt.StrokeDash("stat:N", legend=None),
            tooltip=["stat:N", alt.Tooltip("shown:N", title="time"), "commit:N", "subject:N",
                     alt.Tooltip("x:T", title="at", format="%Y-%m-%d %H:%M")],
        )
    )
    return (alt.layer(_frame([r["x"] for r in rows], x_axis), line)
            .properties(height=170, usermeta=SVG, padding={"top": 24})
            .interactive(bind_y=False))


def breakdown_chart(measurements: Sequence[dict[str, Any]]) -> alt.Chart | None:
    """One stacked bar per case: the breakdown's parts (training state only for rows
    recorded before gradients and optimizer state were told apart)."""
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
