"""Plan: how a workload's recorded peak grows with one param, the fitted curve, and the
memory of the catalog's GPUs, from the newest commit that measured two or more values
(`memtrack plan CASE --sweep PARAM=...` records such a sweep)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import streamlit as st
from memtrack.dashboard import charts, data, model
from memtrack.dashboard.views import Context, esc, short

from memtrack.errors import MemtrackError
from memtrack.plan.fit import Headroom, fit, load_catalog, plan, show_value
from memtrack.plan.sweep import PACKAGED_CATALOG, default_catalog
from memtrack.units import format_size

CURVE_POINTS = 60


def _catalog(ctx: Context) -> tuple[Any, ...]:
    path = default_catalog(ctx.config) if ctx.config else PACKAGED_CATALOG
    try:
        return load_catalog(path)[0]
    except MemtrackError as exc:
        st.warning(f"GPU catalog not loaded: {esc(exc)}")
        return ()


def _curve(f: Any, lo: float, hi: float) -> list[tuple[float, float]]:
    """The fit sampled from lo to hi, evenly in log space where the axis is logarithmic."""
    if lo > 0:
        step = (math.log(hi) - math.log(lo)) / (CURVE_POINTS - 1)
        xs = [math.exp(math.log(lo) + i * step) for i in range(CURVE_POINTS)]
    else:
        xs = [lo + (hi - lo) * i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS)]
    return [(x, float(f.peak(x))) for x in xs]


def render(ctx: Context) -> None:
    st.title("Plan")
    options = model.sweepable(ctx.choices["cases"])
    if not options:
        st.info(
            "No workload has recorded two or more values of a numeric param yet. Record "
            "a sweep, e.g. `memtrack plan decoder_serve --sweep concurrency=1,2,4,8`, "
            "then reload this page."
        )
        return
    left, mid = st.columns(2)
    workload = left.selectbox("Workload", list(options), key="plan_workload", bind="query-params")
    params = options.get(workload or "", [])
    param = mid.selectbox("Swept param", params, key="plan_param", bind="query-params")
    if not workload or not param:
        return
    sweep = model.newest_sweep(data.plan_rows(ctx.db, ctx.key, workload, param), param)
    if sweep is None:
        st.info(
            f"No commit measured two or more values of {esc(param)} for {esc(workload)} "
            f"(with its other params alike): `memtrack plan {esc(workload)} --sweep "
            f"{esc(param)}=1,2,4,8` records one."
        )
        return
    catalog = _catalog(ctx)
    names = [g.name for g in catalog]
    chosen = st.multiselect("GPUs", names, default=names, key="plan_gpus", bind="query-params")
    gpus = [g for g in catalog if g.name in chosen]
    points = sweep["points"]
    f = fit(points)
    share = ctx.config.plan_headroom if ctx.config else 0.10
    room = Headroom(share, "config", f"plan_headroom = {share:.0%}")
    integer = all(isinstance(x, int) for x, _ in points)
    result = plan(
        points,
        catalog,
        room,
        case=workload,
        param=param,
        metric=sweep["metric"],
        metric_note="",
        integer=integer,
        params=sweep["others"],
        gpus=gpus,
    )
    _show(workload, param, sweep, f, result, gpus, share)


def _show(
    workload: str,
    param: str,
    sweep: dict[str, Any],
    f: Any,
    result: Any,
    gpus: list[Any],
    share: float,
) -> None:
    """The sweep's model, its chart and what fits on each GPU."""
    points = sweep["points"]
    lo, top = min(x for x, _ in points), max(x for x, _ in points)
    reach = [r.first_over for r in result.gpus if r.first_over is not None]
    hi = min(max([top, *reach]), top * 10**6)  # out to where the largest GPU is crossed
    st.markdown(
        f"{esc(workload)} at commit {esc(short(sweep['commit']))} on "
        f"{esc(sweep['branch'] or '-')} ({esc(sweep['subject'] or '', 60)}), "
        f"{esc(sweep['metric'])} view"
        + (
            f"; other params {esc(', '.join(f'{k}={v}' for k, v in sweep['others'].items()))}"
            if sweep["others"]
            else ""
        )
        + f".  \nModel: peak({esc(param)}) = {esc(f.formula())} ({esc(f.rule)})."
    )
    st.vega_lite_chart(
        charts.plan_chart(
            param, points, _curve(f, lo, hi), [(g.name, g.memory_bytes) for g in gpus]
        ),
        width="stretch",
    )
    rows = [
        {
            "GPU": r.gpu.name,
            "memory (nominal)": r.gpu.stated,
            f"largest {param}": "any" if r.unbounded else show_value(r.largest),
            "first not fitting": show_value(r.first_over),
            "extrapolated": "yes" if r.extrapolated else "",
            "need at largest": format_size(round(float(f.peak(r.largest)) * (1 + share)))
            if r.largest is not None
            else "-",
        }
        for r in result.gpus
    ]
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    st.caption(
        f"Points: the newest figure of each value at that commit; dashed line: the fitted "
        f"model; red rules: each GPU's nominal memory per device (devices do not pool). "
        f"'Largest' keeps {share:.0%} headroom above the predicted peak (plan_headroom); "
        f"`memtrack plan` also uses the gate's headroom where a baseline exists. "
        + (
            "Measured on the CPU: on a GPU the CUDA context and the allocator's rounding come "
            "on top. "
            if sweep.get("device") == "cpu"
            else ""
        )
        + "Nominal memory is a round figure; `memtrack doctor` shows a GPU's real memory."
    )
