"""Charts drawn by Vega-Lite in the browser: the breakdown (Altair) and the Plan page's
curve; History's panels are SVG from dashboard.panels. Bytes are drawn in
one readable unit per panel; tooltips show exact sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from memtrack.units import BINARY_UNITS, format_size

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
    "failed": "#7f1d1d",
    "over_budget": "#d62728",
    "regression": "#ff7f0e",
    "leak": "#a0522d",
    "time_regression": "#bc6c25",
    "improvement": "#2ca02c",
    "accepted": "#e377c2",
    "noisy": "#bcbd22",
    "environment_changed": "#8c564b",
    "new": "#17becf",
    "estimate": "#9467bd",
}
"""Each kind of mark its own colour (and, on History, its own shape): a failure, a budget
broken and a regression are three different things."""
MARKER_NAMES = {
    "failed": "failed",
    "over_budget": "over budget",
    "regression": "regression",
    "leak": "leak",
    "time_regression": "time regression",
    "improvement": "improvement",
    "accepted": "accepted",
    "noisy": "noisy",
    "environment_changed": "environment changed",
    "new": "new",
    "estimate": "estimate (not measured)",
}
"""Marks as legends and tooltips name them."""
OTHER_BRANCHES = "other branches"
BRANCH_COLORS = ("#1b9e77", "#e6ab02", "#7a0177", "#000000", "#808000", "#66a61e", "#e7298a")
"""Each other branch's colour on History, the newest branches first: none a view's line's
(VIEW_COLORS), and the first ones far from the marks' too."""
MORE_BRANCHES = "#999999"
"""The branches past the palette share this one."""


def branch_colors(branches: Sequence[str]) -> dict[str, str]:
    """Each branch of `branches` (the newest first) its own colour, the same on every panel
    of the page; those past BRANCH_COLORS share MORE_BRANCHES."""
    return {
        b: BRANCH_COLORS[i] if i < len(BRANCH_COLORS) else MORE_BRANCHES
        for i, b in enumerate(dict.fromkeys(branches))
    }


SVG = {"embedOptions": {"renderer": "svg"}}
"""Drawn as SVG: axes stay text in the page (readable by tests and screen readers)."""
BREAKDOWN = (
    ("weights_bytes", "weights"),
    ("inputs_bytes", "inputs"),
    ("caches_bytes", "caches"),
    ("gradients_bytes", "gradients"),
    ("optimizer_state_bytes", "optimizer state"),
    ("training_state_bytes", "training state"),
    ("intermediates_bytes", "intermediates"),
    ("unattributed_bytes", "unattributed"),
)
"""The parts of the framework's peak (tensor memory), drawn as one stacked bar per case."""
PART_COLORS = dict(
    zip(
        (label for _, label in BREAKDOWN),
        ("#4c78a8", "#9d755d", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2"),
        strict=True,
    )
)
"""Each part its own colour, whichever parts a run has."""
RUNTIME = {
    "cpu": "host RSS beyond tensors",
    "cuda": "device beyond reserved",
}
"""What the workspace figure is, per device: beyond the framework, so not drawn on the
tensors' scale (on the CPU, the interpreter and libraries dwarf a small model's tensors)."""


def unit_for(largest: float) -> tuple[str, int]:
    for name, factor in BINARY_UNITS:
        if largest >= factor:
            return name, factor
    return "B", 1


def _tip(field: str, title: str | None = None, **more: Any) -> dict[str, Any]:
    return {"field": field, "type": more.pop("type", "nominal"), "title": title or field, **more}


def _breakdown_rows(
    measurements: Sequence[dict[str, Any]], labels: dict[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The breakdown chart's bar segments (a case's parts) and runtime figures (at the end
    of its bar)."""
    records, runtime = [], []
    for m in measurements:
        case = labels.get(m["case_id"], m["case_id"])
        split = m.get("gradients_bytes") is not None or m.get("optimizer_state_bytes") is not None
        total = 0
        for col, label in BREAKDOWN:
            value = m.get(col)
            if not value or (col == "training_state_bytes" and split):
                continue
            total += value
            records.append(
                {
                    "case": case,
                    "case id": m["case_id"],
                    "part": label,
                    "bytes": value,
                    "size": format_size(value),
                }
            )
        gap = m.get("workspace_bytes")
        if gap and total:
            what = RUNTIME.get(m.get("device") or "", "workspace / runtime")
            runtime.append(
                {
                    "case": case,
                    "case id": m["case_id"],
                    "bytes": total,
                    "runtime": f"+ {format_size(gap)} runtime: {what}",
                    "size": format_size(gap),
                }
            )
    return records, runtime


def breakdown_chart(
    measurements: Sequence[dict[str, Any]], labels: dict[str, str] | None = None
) -> alt.LayerChart | None:
    """One stacked bar per case of its framework peak's parts (training state only for rows
    recorded before gradients and optimizer state were told apart), on the tensors' own
    scale; the runtime beyond them (workspace: host RSS beyond tensors on the CPU, the
    device view beyond reserved on a GPU) is a figure written at the bar's end, not a part
    of it. Cases are named by `labels` (short labels that tell them apart), their full id
    in the tooltip."""
    import altair as alt  # only this chart is built with Altair: keep it off the other pages

    records, runtime = _breakdown_rows(measurements, labels or {})
    if not records:
        return None
    df = pd.DataFrame(records)
    largest = df.groupby("case")["bytes"].sum().max()
    unit, factor = unit_for(largest)
    df["value"] = df["bytes"] / factor
    shown = set(df["part"])
    order = [label for _, label in BREAKDOWN if label in shown]
    # Room right of the longest bar for its runtime figure.
    x = alt.X(
        "value:Q",
        title=f"tensor memory ({unit})",
        stack="zero",
        scale=alt.Scale(domain=[0, largest / factor * (1.6 if runtime else 1.0)], nice=False),
    )
    y = alt.Y(
        "case:N", title=None, sort=list(dict.fromkeys(df["case"])), axis=alt.Axis(labelLimit=0)
    )
    bars = (
        alt.Chart(df)
        .mark_bar()
        .encode(
            y=y,
            x=x,
            color=alt.Color(
                "part:N",
                title=None,
                sort=order,
                scale=alt.Scale(domain=order, range=[PART_COLORS[p] for p in order]),
                legend=alt.Legend(orient="top"),
            ),
            order=alt.Order("order:Q"),
            tooltip=[
                alt.Tooltip("case id:N", title="case"),
                "part:N",
                alt.Tooltip("size:N", title="size"),
            ],
        )
        .transform_calculate(order=f"indexof({order!r}, datum.part)")
    )
    layers: list[Any] = [bars]
    if runtime:
        rt = pd.DataFrame(runtime)
        rt["value"] = rt["bytes"] / factor
        layers.append(
            alt.Chart(rt)
            .mark_text(align="left", dx=6, color="#555")
            .encode(
                y=y,
                x=alt.X("value:Q"),
                text="runtime:N",
                tooltip=[alt.Tooltip("case id:N", title="case"), alt.Tooltip("runtime:N")],
            )
        )
    # Streamlit sizes a chart to this height including its legend and axis.
    return alt.layer(*layers).properties(height=130 + 40 * df["case"].nunique())


def plan_chart(
    param: str,
    points: Sequence[tuple[float, int]],
    curve: Sequence[tuple[float, float]],
    gpus: Sequence[tuple[str, int]],
) -> dict[str, Any]:
    """The Plan page: measured peaks against the swept value, the fitted curve, and a
    horizontal rule at each GPU's memory. Both axes are logarithmic where the values allow
    (a sweep doubles; GPU memory is orders of magnitude above a small case)."""
    log_x = all(x > 0 for x, _ in points)
    x_enc = {
        "field": "x",
        "type": "quantitative",
        "title": param,
        "scale": {"type": "log" if log_x else "linear"},
        "axis": {"format": ",.4~g"},
    }
    y_enc = {
        "field": "gib",
        "type": "quantitative",
        "title": "peak (GiB)",
        "scale": {"type": "log"},
        "axis": {"format": ",.4~g"},
    }
    gib = float(2**30)
    layers: list[dict[str, Any]] = [
        {
            "data": {"values": [{"x": x, "gib": y / gib} for x, y in curve if y > 0]},
            "mark": {"type": "line", "color": "#1f77b4", "strokeDash": [4, 3]},
            "encoding": {"x": x_enc, "y": y_enc},
        },
        {
            "data": {
                "values": [
                    {"x": x, "gib": y / gib, "peak": format_size(y), "bytes": f"{y:,} B"}
                    for x, y in points
                ]
            },
            "mark": {"type": "point", "filled": True, "size": 70, "color": "#1f77b4"},
            "encoding": {
                "x": x_enc,
                "y": y_enc,
                "tooltip": [_tip("x", param, type="quantitative"), _tip("peak"), _tip("bytes")],
            },
        },
    ]
    if gpus:
        rules = [
            {"gpu": name, "gib": memory / gib, "memory": f"{memory:,} B"} for name, memory in gpus
        ]
        # GPUs of equal memory share one rule's height: one label names them all, or
        # their labels would be drawn over each other.
        same: dict[int, list[str]] = {}
        for name, memory in gpus:
            same.setdefault(memory, []).append(name)
        names = [{"gpu": " · ".join(ns), "gib": memory / gib} for memory, ns in same.items()]
        layers += [
            {
                "data": {"values": rules},
                "mark": {"type": "rule", "color": "#d62728", "strokeDash": [6, 4]},
                "encoding": {"y": y_enc, "tooltip": [_tip("gpu"), _tip("memory")]},
            },
            {
                "data": {"values": names},
                "mark": {
                    "type": "text",
                    "align": "left",
                    "dx": 4,
                    "dy": -6,
                    "color": "#d62728",
                    "x": 0,
                },
                "encoding": {"y": y_enc, "text": {"field": "gpu"}},
            },
        ]
    return {"layer": layers, "height": 420, "width": "container", "usermeta": SVG}
