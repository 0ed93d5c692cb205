"""Altair charts. Bytes are drawn in one readable unit per chart; tooltips show exact sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import pandas as pd

from dashboard import model
from memtrack.units import BINARY_UNITS, format_seconds, format_size

VIEW_COLORS = {
    "framework allocated": "#1f77b4",
    "framework reserved": "#9467bd",
    "device (NVML)": "#ff7f0e",
    "host RSS": "#7f7f7f",
}
MARKER_COLORS = {
    "regression": "#d62728", "over_budget": "#d62728", "failed": "#d62728",
    "time_regression": "#ff9896", "improvement": "#2ca02c",
    "environment_changed": "#8c564b", "new": "#17becf",
}
BREAKDOWN = (
    ("weights_bytes", "weights"),
    ("intermediates_bytes", "intermediates"),
    ("caches_bytes", "caches"),
    ("training_state_bytes", "training state"),
    ("workspace_bytes", "workspace / runtime"),
)


def unit_for(largest: float) -> tuple[str, int]:
    for name, factor in BINARY_UNITS:
        if largest >= factor:
            return name, factor
    return "B", 1


def _short(sha: str | None) -> str:
    return (sha or "-")[:10]


def memory_chart(
    rows: Sequence[dict[str, Any]],
    envs: dict[str, dict[str, Any]],
    views: Sequence[str],
    budgets: Sequence[tuple[str, int]],
    band: tuple[str, int, int] | None,
    markers: Sequence[dict[str, Any]],
    env_changes: Sequence[dict[str, Any]],
) -> alt.LayerChart:
    """Peak per run for each view, with budget lines, the headroom band and event marks.

    budgets: (label, bytes); band: (label, low, high); markers: dicts with started_at,
    value (bytes or None), kind, message; env_changes: dicts with started_at and change.
    """
    records = []
    for r in rows:
        env = envs.get(r.get("env_id") or "") or {}
        common = {
            "time": r["started_at"], "commit": _short(r.get("git_commit")),
            "subject": r.get("git_subject") or "", "branch": r.get("git_branch") or "-",
            "status": r.get("status"), "versions": model.env_label(env),
            "run": (r.get("run_id") or "")[:12], "environment": model.env_label(env),
        }
        for metric in views:
            value = model.metric_value(r, metric)
            if value is not None:
                records.append({**common, "view": model.METRIC_LABELS[metric],
                                "bytes": value, "size": format_size(value)})
    limits = [b for _, b in budgets] + ([band[2]] if band else [])
    largest = max([x["bytes"] for x in records] + limits + [1])
    unit, factor = unit_for(largest)
    df = pd.DataFrame(records)
    y_title = f"peak memory ({unit})"
    layers: list[alt.Chart] = []
    if band is not None:
        label, low, high = band
        layers.append(
            alt.Chart(pd.DataFrame([{"low": low / factor, "high": high / factor, "what": label,
                                     "range": f"{format_size(low)} – {format_size(high)}"}]))
            .mark_rect(opacity=0.18, color="#2ca02c")
            .encode(y=alt.Y("low:Q", title=y_title), y2="high:Q",
                    tooltip=[alt.Tooltip("what:N", title="headroom"), "range:N"])
        )
    if not df.empty:
        df["value"] = df["bytes"] / factor
        colors = [c for v, c in VIEW_COLORS.items() if v in set(df["view"])]
        # One line per view and environment: a line never joins figures of different
        # software stacks, and each stack's points get their own shape.
        several_envs = df["environment"].nunique() > 1
        shape = (alt.Shape("environment:N", title=None, legend=alt.Legend(orient="bottom",
                                                                             labelLimit=600))
                 if several_envs else alt.Undefined)
        layers.append(
            alt.Chart(df).mark_line(point=alt.OverlayMarkDef(size=30), strokeWidth=1.6)
            .encode(
                detail="environment:N",
                shape=shape,
                x=alt.X("time:T", title=None),
                y=alt.Y("value:Q", title=y_title, scale=alt.Scale(zero=False)),
                color=alt.Color("view:N", title=None,
                                scale=alt.Scale(domain=[v for v in VIEW_COLORS if v in
                                                        set(df["view"])], range=colors),
                                legend=alt.Legend(orient="top")),
                tooltip=[
                    alt.Tooltip("view:N"), alt.Tooltip("size:N", title="peak"),
                    alt.Tooltip("commit:N"), alt.Tooltip("subject:N"),
                    alt.Tooltip("time:T", format="%Y-%m-%d %H:%M"), alt.Tooltip("branch:N"),
                    alt.Tooltip("versions:N"), alt.Tooltip("status:N"), alt.Tooltip("run:N"),
                ],
            )
        )
    for label, limit in budgets:
        bdf = pd.DataFrame([{"limit": limit / factor, "label": f"{label} {format_size(limit)}"}])
        rule = alt.Chart(bdf).mark_rule(color="#d62728", strokeDash=[6, 4], strokeWidth=2)
        layers.append(rule.encode(y="limit:Q", tooltip=[alt.Tooltip("label:N", title="budget")]))
        layers.append(
            alt.Chart(bdf).mark_text(align="left", baseline="bottom", dx=4, dy=-2,
                                     color="#d62728", fontWeight="bold")
            .encode(y="limit:Q", x=alt.value(0), text="label:N")
        )
    if env_changes:
        edf = pd.DataFrame(env_changes)
        layers.append(
            alt.Chart(edf).mark_rule(color="#8c564b", strokeDash=[2, 3], strokeWidth=1.5)
            .encode(x="started_at:T", tooltip=[alt.Tooltip("change:N", title="environment")])
        )
        layers.append(
            alt.Chart(edf).mark_text(align="left", baseline="top", dx=3, dy=2, angle=0,
                                     color="#8c564b", fontSize=11)
            .encode(x="started_at:T", y=alt.value(0), text="short:N")
        )
    if markers:
        mdf = pd.DataFrame(markers)
        mdf["value"] = [v / factor if v is not None else 0 for v in mdf["value"]]
        kinds = sorted(set(mdf["kind"]))
        marker_colors = [MARKER_COLORS.get(k, "#444") for k in kinds]
        layers.append(
            alt.Chart(mdf).mark_point(shape="triangle-down", size=140, filled=True, opacity=0.9)
            .encode(
                x="started_at:T", y="value:Q",
                color=alt.Color("kind:N", title=None, legend=alt.Legend(orient="top"),
                                                scale=alt.Scale(domain=kinds, range=marker_colors)),
                tooltip=[alt.Tooltip("kind:N"), alt.Tooltip("commit:N"),
                         alt.Tooltip("message:N")],
            )
        )
    chart = alt.layer(*layers).resolve_scale(color="independent").properties(height=360)
    return chart.interactive(bind_y=False)


def time_chart(rows: Sequence[dict[str, Any]]) -> alt.Chart | None:
    """Median and p95 iteration time per run."""
    records = []
    for r in rows:
        for col, label in (("time_median_s", "median"), ("time_p95_s", "p95")):
            if r.get(col) is not None:
                records.append({"time": r["started_at"], "stat": label, "seconds": r[col],
                                "shown": format_seconds(r[col]),
                                "commit": _short(r.get("git_commit")),
                                "subject": r.get("git_subject") or ""})
    if not records:
        return None
    df = pd.DataFrame(records)
    scale, unit = (1000, "ms") if df["seconds"].max() < 1 else (1, "s")
    df["value"] = df["seconds"] * scale
    return (
        alt.Chart(df).mark_line(point=alt.OverlayMarkDef(size=20), strokeWidth=1.4)
        .encode(
            x=alt.X("time:T", title=None),
            y=alt.Y("value:Q", title=f"iteration time ({unit})", scale=alt.Scale(zero=False),
                    axis=alt.Axis(format=".3~g")),
            color=alt.Color("stat:N", title=None, legend=alt.Legend(orient="top")),
            strokeDash=alt.StrokeDash("stat:N", legend=None),
            tooltip=["stat:N", alt.Tooltip("shown:N", title="time"), "commit:N", "subject:N",
                     alt.Tooltip("time:T", format="%Y-%m-%d %H:%M")],
        )
        .properties(height=200)
        .interactive(bind_y=False)
    )


def breakdown_chart(measurements: Sequence[dict[str, Any]]) -> alt.Chart | None:
    """One stacked bar per case: weights, intermediates, caches, training state, workspace."""
    records = []
    for m in measurements:
        for col, label in BREAKDOWN:
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
