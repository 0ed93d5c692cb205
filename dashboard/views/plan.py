"""Plan: how a workload's recorded peak grows with one param, the fitted curve, and the
memory of the catalog's GPUs, from the newest commit of the base branch (or the branch
chosen) that measured two or more values (`memtrack plan CASE --sweep PARAM=...` records
such a sweep). The fit answers only as far as its measurements carry it: the rule is the
library's (memtrack.plan.fit.carried_to), as `memtrack plan` applies it."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import streamlit as st
from memtrack.dashboard import charts, data, model
from memtrack.dashboard.views import Context, esc, goto, plain, short

from memtrack.errors import MemtrackError
from memtrack.plan.fit import (
    CARRY_RULE,
    Headroom,
    answer,
    fit,
    load_catalog,
    plan,
    refusal,
    show_value,
)
from memtrack.plan.sweep import PACKAGED_CATALOG, default_catalog
from memtrack.units import format_size

CURVE_POINTS = 60
ALL = ""


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


def _numeric_params(ctx: Context, workload: str) -> list[str]:
    """The numeric params of a workload's recorded cases."""
    found: dict[str, None] = {}
    for c in ctx.choices["cases"]:
        name, params = model.case_params(c)
        if name == workload:
            found.update({k: None for k, v in params.items() if model.number(v) is not None})
    return sorted(found)


def _unknown_workload(ctx: Context, asked: str, options: dict[str, list[str]]) -> None:
    """The address names a workload with no sweep to plan from: say so, and which have one,
    instead of showing another."""
    recorded = {model.case_params(c)[0] for c in ctx.choices["cases"]}
    swept = ", ".join(esc(w) for w in options)
    if asked in recorded:
        params = _numeric_params(ctx, asked)
        example = f"{params[0]}=1,2,4,8" if params else "PARAM=1,2,4,8"
        why = (
            f"{esc(asked, 80)} has not recorded two or more values of a numeric param: "
            f"nothing to fit. `memtrack plan {esc(asked, 80)} --sweep {esc(example)}` "
            "records a sweep."
        )
    else:
        why = f"There is no workload {esc(asked, 80)} in this database."
    st.warning(f"{why} The workloads with a sweep to plan from: {swept}.")
    st.selectbox(
        "Workload",
        list(options),
        index=None,
        key="plan_pick",
        placeholder="choose a workload",
        on_change=lambda: goto("Plan", plan_workload=st.session_state["plan_pick"]),
    )


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
    asked = st.query_params.get("plan_workload")
    if asked is not None and asked not in options:
        _unknown_workload(ctx, asked, options)
        return
    left, mid, right = st.columns(3)
    workload = left.selectbox("Workload", list(options), key="plan_workload", bind="query-params")
    params = options.get(workload or "", [])
    asked_param = st.query_params.get("plan_param")
    if asked_param is not None and asked_param not in params:
        st.warning(
            f"{esc(workload)} has no swept param {esc(asked_param, 80)}: its swept params "
            f"are {', '.join(esc(p) for p in params)}."
        )
    param = mid.selectbox("Swept param", params, key="plan_param", bind="query-params")
    others = [b for b in ctx.choices["branches"] if b and b != ctx.base_branch]
    branch = right.selectbox(
        "Branch",
        [ctx.base_branch, *others, ALL],
        key="plan_branch",
        bind="query-params",
        format_func=lambda b: b or "all branches",
        help=f"The base branch ({ctx.base_branch}) by default: a pull request's sweep is "
        "planned from only where it is chosen",
    )
    if not workload or not param:
        return
    sweep = model.newest_sweep(
        data.plan_rows(ctx.db, ctx.key, workload, param, branch, repository=ctx.repository), param
    )
    if sweep is None:
        _no_sweep(ctx, workload, param, branch or "")
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


def _no_sweep(ctx: Context, workload: str, param: str, branch: str) -> None:
    """Nothing to plan from on the chosen branch: say so, and where a sweep was recorded."""
    where = f"on {esc(branch)}" if branch else "on any branch"
    elsewhere = (
        model.newest_sweep(
            data.plan_rows(ctx.db, ctx.key, workload, param, repository=ctx.repository), param
        )
        if branch
        else None
    )
    st.info(
        f"No commit {where} measured two or more values of {esc(param)} for "
        f"{esc(workload)} (with its other params alike): `memtrack plan {esc(workload)} "
        f"--sweep {esc(param)}=1,2,4,8` records one."
        + (
            f" The newest sweep is on {esc(elsewhere['branch'] or '-')} at "
            f"{esc(short(elsewhere['commit']))}: choose its branch to plan from it."
            if elsewhere
            else ""
        )
    )


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
    carried = result.carried_to
    reach = [r.first_over for r in result.gpus if r.first_over is not None]
    # Drawn out to where a GPU is crossed, never past what the fit carries.
    hi = max(top, min(max([top, *reach]), carried))
    if any(r.refused for r in result.gpus):
        hi = carried
    st.markdown(
        f"{esc(workload)} at commit {esc(short(sweep['commit']))} on "
        f"{esc(sweep['branch'] or '-')} ({esc(sweep['subject'] or '', 60)}), "
        f"{esc(sweep['metric'])} view"
        + (
            f"; other params {esc(', '.join(f'{k}={v}' for k, v in sweep['others'].items()))}"
            if sweep["others"]
            else ""
        )
        + f".  \nModel: peak({esc(param)}) = {esc(f.formula())} ({esc(f.rule)}).  \n"
        f"Measured at {esc(', '.join(show_value(x) for x, _ in points))}: the fit answers "
        f"up to {esc(param)}={esc(show_value(carried))}."
    )
    refused = [r for r in result.gpus if r.refused]
    if refused:
        # The library's words, escaped, with its command shown as code.
        command = "`memtrack plan`"
        said = esc(refusal(param, top)).replace(esc(command), command)
        st.warning(
            f"{len(refused)} of {len(result.gpus)} GPUs hold more than {esc(param)}="
            f"{esc(show_value(carried))}, and no figure is given: {said} "
            f"({esc(CARRY_RULE)}).",
            icon=":material/straighten:",
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
            f"largest {param}": answer(r),
            "first not fitting": show_value(r.first_over),
            "need at largest": format_size(round(float(f.peak(r.largest)) * (1 + share)))
            if r.largest is not None
            else "-",
        }
        for r in result.gpus
    ]
    if rows:
        st.dataframe(plain(pd.DataFrame(rows)), hide_index=True)
    st.caption(
        f"Points: the newest figure of each value at that commit; dashed line: the fitted "
        f"model, drawn as far as it carries; red rules: each GPU's nominal memory per "
        f"device (devices do not pool). 'Largest' keeps {share:.0%} headroom above the "
        f"predicted peak (plan_headroom) and the fit's own error; an answer past the "
        f"values measured says how far past, and none is given past what the fit carries. "
        f"`memtrack plan` also uses the gate's headroom where a baseline exists. "
        + (
            "Measured on the CPU: on a GPU the CUDA context and the allocator's rounding come "
            "on top. "
            if sweep.get("device") == "cpu"
            else ""
        )
        + "Nominal memory is a round figure; `memtrack doctor` shows a GPU's real memory."
    )
