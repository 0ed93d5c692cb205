"""Overview: every case's latest status, its peak against its budget, a trend, the last step."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import data, model
from dashboard.views import STATUS_LOOK, Context, goto, short, status_cell_style, when
from memtrack.units import format_size

TREND_POINTS = 30
ALL = ""


def _fingerprints(ctx: Context) -> dict[str, str]:
    """fingerprint -> a readable label (one environment row per distinct stack)."""
    out: dict[str, str] = {}
    for env in ctx.choices["environments"].values():
        out.setdefault(env["fingerprint"], model.env_label(env))
    return out


def _row(ctx: Context, case: dict[str, Any]) -> tuple[model.CaseStatus, dict[str, Any]]:
    rows, latest = case["rows"], case["rows"][0]
    budgets = ctx.budgets(latest, case["budget_verdicts"])
    status = model.case_status(latest, budgets, case["verdicts"])
    trend = [model.metric_value(r, status.metric) for r in reversed(rows)]
    moved = model.steps(rows, status.metric)
    last_change = (
        f"{moved[0].describe()} at {short(moved[0].row['git_commit'])}, "
        f"{when(moved[0].row['started_at'])}" if moved
        else f"none in the last {len(rows)} runs"
    )
    margin = status.margin
    return status, {
        "status": status.status,
        "case id": case["case_id"],
        "view": model.METRIC_LABELS.get(status.metric, status.metric),
        "peak": format_size(status.value),
        "budget": format_size(status.budget.limit_bytes) if status.budget else "none",
        "used": None if status.used is None else round(status.used * 100, 1),
        "margin": "" if margin is None else (
            f"{format_size(-margin)} over" if margin < 0 else f"{format_size(margin)} left"),
        "trend": [v / 2**20 for v in trend if v is not None],
        "last change": last_change,
        "latest run": when(latest["started_at"]),
        "commit": short(latest["git_commit"]),
        "branch": latest["git_branch"] or "-",
        "environment": model.env_label(ctx.env(latest["env_id"])),
        "note": status.note,
    }


def _open_history(table_key: str, cases: list[str]) -> None:
    rows = st.session_state[table_key].selection.rows
    if rows:
        goto("History", case=cases[rows[0]])


def render(ctx: Context) -> None:
    st.title("Overview")
    branches = ctx.choices["branches"]
    fps = _fingerprints(ctx)
    left, right = st.columns(2)
    branch_opts = [ALL, *branches]
    branch = left.selectbox(
        "Branch", branch_opts, key="ov_branch",
        index=branch_opts.index(ctx.base_branch) if ctx.base_branch in branches else 0,
        format_func=lambda b: b or "all branches",
    )
    fp = right.selectbox("Environment", [ALL, *fps], key="ov_env",
                         format_func=lambda f: fps.get(f, "all environments"))
    cases = data.latest_by_case(ctx.db, ctx.key, branch or None, fp or None, TREND_POINTS)
    if not cases:
        st.info("No measurements match these filters. Choose *all branches* or another "
                "environment.")
        return
    pairs = [_row(ctx, c) for c in cases]
    labels = model.short_case_labels(row["case id"] for _, row in pairs)
    for _, row in pairs:
        row["case"] = labels[row["case id"]]
    pairs.sort(key=lambda p: (model.STATUSES.index(p[0].status), -(p[0].used or 0),
                              p[1]["case id"]))
    statuses = [s for s, _ in pairs]

    counts = {s: sum(1 for x in statuses if x.status == s) for s in model.STATUSES}
    cols = st.columns(len(model.STATUSES) + 1)
    cols[0].metric("workload cases", len(statuses))
    for col, name in zip(cols[1:], model.STATUSES, strict=True):
        col.metric(name, counts[name], icon=STATUS_LOOK[name][1])

    scope = f"on {branch}" if branch else "on all branches"
    attention = [(s, row) for s, row in pairs if s.status != "ok"]
    if not attention:
        budgeted = sum(1 for s in statuses if s.budget is not None)
        st.success(f"All {len(statuses)} cases are ok {scope} ({budgeted} with a budget, "
                   f"all under {model.NEAR_BUDGET:.0%} of it).")
    for s, row in attention[:12]:
        line = f"**{s.status}** · `{row['case id']}` · {model.describe_status(s)}"
        show = st.warning if s.status in ("near budget", "regression") else st.error
        show(line, icon=STATUS_LOOK[s.status][1])
    if len(attention) > 12:
        st.caption(f"... and {len(attention) - 12} more in the table below.")

    df = pd.DataFrame([row for _, row in pairs])
    st.caption(f"Latest run of each case {scope}, most urgent first; *used* is the share of "
               f"the budget, the trend is the last {TREND_POINTS} runs (MiB). "
               "Select a row to open its history.")
    st.dataframe(
        df.style.map(status_cell_style, subset=["status"]),
        hide_index=True,
        key="overview_table",
        on_select=lambda: _open_history("overview_table", list(df["case id"])),
        selection_mode="single-row",
        column_order=["status", "case", "peak", "budget", "used", "margin", "trend",
                      "last change", "view", "latest run", "commit", "branch", "environment",
                      "note", "case id"],
        column_config={
            "case": st.column_config.TextColumn(
                width="medium",
                help="The workload and the parameters that set its cases apart; the full "
                     "id is the last column"),
            "used": st.column_config.ProgressColumn(
                "used", format="%.0f%%", min_value=0, max_value=100, color="blue",
                help="Peak as a share of the budget (over 100%: over budget)"),
            "trend": st.column_config.LineChartColumn(f"trend ({TREND_POINTS} runs)"),
            "last change": st.column_config.TextColumn(
                help="Newest step: a shift of the series' level past its noise "
                     f"(at least {format_size(model.STEP_MIN_BYTES)})"),
        },
    )
