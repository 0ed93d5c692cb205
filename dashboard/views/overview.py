"""Overview: every case's status, its peak against its budget, a trend, every step, every
open regression of the base branch whatever its age, each case's noise, and the pull
requests with their latest verdict."""

from __future__ import annotations

from typing import Any

import streamlit as st
from memtrack.dashboard import data, model
from memtrack.dashboard.tables import Column, html_table, page_url
from memtrack.dashboard.views import STATUS_LOOK, Context, esc, short, status_cell_style, when

from memtrack.units import format_size

TREND_POINTS = 30
ALL = ""


def _fingerprints(ctx: Context) -> dict[str, str]:
    """fingerprint -> a readable label (one environment row per distinct stack)."""
    out: dict[str, str] = {}
    for env in ctx.choices["environments"].values():
        out.setdefault(env["fingerprint"], model.env_label(env))
    return out


def _changes(
    moved: list[model.Step],
    gate: list[model.GateRegression],
    accepted: dict[tuple[str, str], str],
    metric: str,
) -> str:
    """Every step of the window, newest first: '+2.00 MiB (+1.1%) at 1a2b3c4d5e, fixed at
    6f7a8b9c0d'; a step down that fixed one is told with it, a step up that was accepted
    with its reason. And what the gate found on the base branch that no step tells (a
    merge reverted after one run; another view, named), with what ended it."""
    fixes = {(s.fixed_by["run_id"], s.metric) for s in moved if s.fixed_by is not None}
    told = {s.row["run_id"] for s in moved}
    items: list[tuple[str, str]] = []
    for s in moved:
        if (s.row["run_id"], s.metric) in fixes:
            continue
        text = f"{s.describe()} at {short(s.row.get('git_commit'))}"
        if s.fixed_by:
            text += f", fixed at {short(s.fixed_by.get('git_commit'))}"
        reason = accepted.get((s.row["run_id"], s.metric)) if s.delta > 0 else None
        if reason:
            text += f", accepted: {reason}"
        items.append((s.row.get("started_at") or "", text))
    by_run: dict[str, list[model.GateRegression]] = {}
    for g in gate:
        if g.row["run_id"] not in told:
            by_run.setdefault(g.row["run_id"], []).append(g)
    for found in by_run.values():
        g = found[0]
        views = ", ".join(
            (f"{model.SHORT_LABELS.get(x.metric, x.metric)} " if x.metric != metric else "")
            + x.describe()
            for x in sorted(found, key=lambda x: x.metric != metric)
        )
        if g.fixed_by is not None:
            end = f"fixed at {short(g.fixed_by.get('git_commit'))}"
        elif g.accepted_by is not None:
            end = f"accepted at {short(g.accepted_by.get('git_commit'))}"
        else:
            end = "not fixed or accepted"
        text = f"{views} at {short(g.row.get('git_commit'))} (the gate's regression), {end}"
        items.append((g.row.get("started_at") or "", text))
    items.sort(key=lambda item: item[0], reverse=True)
    return " · ".join(text for _, text in items)


def _noise(verdicts: list[dict[str, Any]]) -> str:
    """A case's noise, a property of the case: each view whose newest verdict found its
    headroom too wide to judge, with that headroom ('allocated ±2.09 MiB (20%)')."""
    out = []
    for v in sorted(verdicts, key=lambda v: v.get("metric") or ""):
        base, threshold = v.get("baseline_value"), v.get("threshold")
        if v.get("kind") == "noisy" and base and threshold is not None:
            room = threshold - base
            out.append(
                f"{model.SHORT_LABELS.get(v['metric'], v['metric'])} "
                f"±{format_size(int(room))} ({room / base:.0%})"
            )
    return ", ".join(out)


def _runs(n: int) -> str:
    return f"{n} run{'s' * (n != 1)}"


def _row(ctx: Context, case: dict[str, Any], branch: str) -> tuple[model.CaseStatus, dict]:
    rows, latest = case["rows"], case["rows"][0]
    budgets = ctx.budgets(latest, case["budget_verdicts"])
    still_open = case.get("open", []) if branch == ctx.base_branch else []
    status = model.case_status(latest, budgets, case["verdicts"], still_open)
    trend = [model.metric_value(r, status.metric) for r in reversed(rows)]
    moved = case["steps"][status.metric]
    margin = status.margin
    return status, {
        "status": status.status,
        "case id": case["case_id"],
        "view": model.SHORT_LABELS.get(status.metric, status.metric),
        "peak": format_size(status.value),
        "budget": format_size(status.budget.limit_bytes) if status.budget else "none",
        "used": "-" if status.used is None else f"{status.used * 100:.1f}%",
        "margin": ""
        if margin is None
        else (f"{format_size(-margin)} over" if margin < 0 else f"{format_size(margin)} left"),
        "trend": [v / 2**20 for v in trend if v is not None],
        "last change": _changes(
            moved,
            model.gate_regressions(rows, case["window_verdicts"], ctx.base_branch),
            model.accepted_reasons(case["window_verdicts"]),
            status.metric,
        )
        or f"none in {_runs(len(rows))}",
        "noise": _noise(case["budget_verdicts"]),
        "open": still_open[0] if still_open else None,
        "latest run": when(latest["started_at"]),
        "commit": short(latest["git_commit"]),
        "run": page_url("Run detail", run=latest["run_id"]),
        "branch": latest["git_branch"] or "-",
        "environment": model.env_label(ctx.env(latest["env_id"])),
        "note": status.note,
    }


def _used_style(used: float | str | None) -> str:
    """Red past 100 %, amber from the near-budget share ('91.4%' or 91.4)."""
    if isinstance(used, str):
        try:
            used = float(used.rstrip("%"))
        except ValueError:
            return ""
    if used is None or used != used:
        return ""
    if used > 100:
        return "background-color: #fbd5d5; color: #7f1d1d; font-weight: 700"
    if used >= model.NEAR_BUDGET * 100:
        return "background-color: #fdf1bf; color: #5f4b00; font-weight: 600"
    return ""


CASE_COLUMNS = (
    Column("status", width=96, style=status_cell_style),
    Column(
        "case",
        width=200,
        link="history",
        tip="case id",
        help="The workload and the parameters that set its cases apart (hover for the full "
        "id); it opens the case's history",
    ),
    Column(
        "view", width=104, help="The view that decides the status: the one closest to its budget"
    ),
    Column("peak", width=86),
    Column("budget", width=86),
    Column(
        "used",
        width=62,
        style=_used_style,
        tip="margin",
        help="Peak as a share of the budget, red past 100% (hover for the margin)",
    ),
    Column("trend", width=114, spark=True, help=f"The last {TREND_POINTS} runs"),
    Column(
        "last change",
        help="Every step in the trend's window, newest first: a shift of the series' level "
        "past its headroom, at the first commit of the new level (hover for them all)",
    ),
    Column(
        "commit",
        width=88,
        link="run",
        tip="latest run",
        help="The commit of the case's latest run (hover for when); it opens the run",
    ),
    Column("branch", width=96),
)
"""The Overview's table of cases, in the order shown: one line a case, as wide as the page."""

DETAIL_COLUMNS = (
    Column("case id", width=220, wrap=True, link="history"),
    Column("latest run", width=116, wrap=True),
    Column("environment", width=130, wrap=True),
    Column(
        "noise",
        width=120,
        wrap=True,
        help="A property of the case: the views whose headroom its noise makes too wide to "
        "judge a small growth (the gate's newest verdict), and how wide",
    ),
    Column("last change", width=170, wrap=True),
    Column("note", wrap=True, help="Why: the failure's message, or the gate's"),
)
"""Under the Overview's table, opened on demand: each case in full."""

PR_COLUMNS = (
    Column(
        "verdict",
        width=150,
        style=lambda v: status_cell_style("failed") if v.startswith("BLOCKS") else "",
        help="What the gate recorded: blocks, or passes (with its warnings, and what a "
        "reviewed trailer accepted, with its reason)",
    ),
    Column("branch", width=150),
    Column("what blocks"),
    Column(
        "run", width=70, link="run", text="its run", help="The run's detail: what blocks and why"
    ),
    Column(
        "compare",
        width=150,
        link="compare",
        text="with its merge-base",
        help="Compare of the run with the base-branch commit it branched from",
    ),
    Column("commit", width=96),
    Column("subject"),
    Column("latest run", width=130),
)
"""The Overview's table of pull requests and other branches: one line a branch, as wide as
the page."""


def _callout(s: model.CaseStatus, row: dict[str, Any]) -> str:
    view = model.SHORT_LABELS.get(s.metric, s.metric)
    where = f"{esc(row['branch'])} at {esc(row['commit'])}"
    o = row.get("open")
    if s.status == "regression" and o is not None:
        # What regressed, by how much and since when, before anything long.
        delta = o.get("delta")
        size = (
            ""
            if delta is None
            else (f" {'+' if delta >= 0 else '-'}{format_size(abs(int(delta)))}")
        )
        pct = "" if o.get("delta_pct") is None else f" ({o['delta_pct']:+.1f}%)"
        grew = f", {esc(o['component'])} grew" if o.get("component") else ""
        subject = f" ({esc(o['subject'], 60)})" if o.get("subject") else ""
        return (
            f"**regression** · {esc(row['case'])} · {esc(view + size + pct)} since "
            f"{esc(short(o.get('commit')))}{subject}{grew}, not fixed or accepted · now "
            f"{row['peak']}, fixed when back within {format_size(int(o['threshold']))} · "
            f"{where}"
        )
    what = f"{row['peak']} {esc(view)}" + (
        f" of {row['budget']} ({row['used']}, {row['margin']})"
        if s.budget is not None and s.used is not None
        else ""
    )
    note = f" · {esc(s.note, 300)}" if s.note and s.status != "near budget" else ""
    return f"**{s.status}** · {esc(row['case'])} · {what} · {where}{note}"


def render(ctx: Context) -> None:
    st.title("Overview")
    branch, fp = _filters(ctx)
    cases = data.latest_by_case(
        ctx.db,
        ctx.key,
        branch or None,
        fp or None,
        TREND_POINTS,
        ctx.headroom_factor,
        ctx.base_branch,
        repository=ctx.repository,
    )
    if not cases:
        st.info(
            "No measurements match these filters. Choose *all branches* or another environment."
        )
        return
    pairs = [_row(ctx, c, branch or "") for c in cases]
    labels = model.short_case_labels(row["case id"] for _, row in pairs)
    for _, row in pairs:
        row["case"] = labels[row["case id"]]
    pairs.sort(
        key=lambda p: (model.STATUSES.index(p[0].status), -(p[0].used or 0), p[1]["case id"])
    )
    statuses = [s for s, _ in pairs]

    counts = {s: sum(1 for x in statuses if x.status == s) for s in model.STATUSES}
    cols = st.columns(len(model.STATUSES) + 1)
    cols[0].metric("workload cases", len(statuses))
    for col, name in zip(cols[1:], model.STATUSES, strict=True):
        col.metric(name, counts[name], icon=STATUS_LOOK[name][1])

    scope = f"on {esc(branch)}" if branch else "on all branches"
    attention = [(s, row) for s, row in pairs if s.status != "ok"]
    if not attention:
        budgeted = sum(1 for s in statuses if s.budget is not None)
        st.success(
            f"All {len(statuses)} cases are ok {scope} ({budgeted} with a budget, "
            f"all under {model.NEAR_BUDGET:.0%} of it)."
        )
    for s, row in attention[:8]:
        show = st.warning if s.status in ("near budget", "regression") else st.error
        show(_callout(s, row), icon=STATUS_LOOK[s.status][1])
    if len(attention) > 8:
        st.caption(f"... and {len(attention) - 8} more in the table below.")

    for _, row in pairs:
        row["history"] = page_url("History", case=row["case id"])
    rows = [row for _, row in pairs]
    st.markdown(html_table("overview_table", rows, CASE_COLUMNS, fit=True), unsafe_allow_html=True)
    st.caption(
        f"Latest run of each case {scope}, most urgent first. A regression the gate "
        "found on the base branch holds, whatever its age, until a later run is back "
        "within its threshold or it is accepted. A case's name opens its history, its "
        "commit the run; hover a cut cell for all of it."
    )
    told = sum(1 for row in rows if row["note"] or row["noise"])
    with st.expander(
        "Each case in full: its id, latest run, environment, noise and notes"
        + (f" ({told} with a note or noise)" if told else "")
    ):
        st.markdown(
            html_table("overview_details", rows, DETAIL_COLUMNS, fit=True), unsafe_allow_html=True
        )
    _pull_requests(ctx)


def _filters(ctx: Context) -> tuple[str, str]:
    """The branch and the environment shown ('' for all), as the visitor chose them. In a
    popover: select boxes drawn on the page cost a new visitor about 0.15 s in Chromium
    (their code loaded by every fresh browser); in a popover they are drawn, and their code
    loaded, only when it is opened."""
    branches = ctx.choices["branches"]
    fps = _fingerprints(ctx)
    pop = st.popover("Branch and environment", icon=":material/filter_list:")
    branch_opts = [ALL, *branches]
    branch = pop.selectbox(
        "Branch",
        branch_opts,
        key="ov_branch",
        bind="query-params",
        index=branch_opts.index(ctx.base_branch) if ctx.base_branch in branches else 0,
        format_func=lambda b: b or "all branches",
    )
    fp = pop.selectbox(
        "Environment",
        [ALL, *fps],
        key="ov_env",
        bind="query-params",
        format_func=lambda f: fps.get(f, "all environments"),
    )
    st.caption(
        f"Showing {esc(branch) if branch else 'all branches'} · "
        f"{esc(fps[fp]) if fp and fp in fps else 'all environments'}."
    )
    return branch or "", fp or ""


def _verdict_of(run: dict[str, Any], labels: dict[str, str]) -> tuple[str, str]:
    """(outcome, what blocks first) of a run's recorded verdicts."""
    vs = run["verdicts"]
    if not vs:
        return "not checked", ""
    blocking = [v for v in vs if v.get("blocking")]
    if not blocking:
        warned = [
            v for v in vs if v.get("kind") in ("time_regression", "environment_changed", "quality")
        ]
        accepted = [v for v in vs if v.get("kind") == "accepted"]
        reasons = "; ".join(dict.fromkeys(v.get("accepted_reason") or "" for v in accepted))
        return (
            "passes"
            + (f", {len(warned)} warning{'s' * (len(warned) != 1)}" if warned else "")
            + (f", {len(accepted)} accepted: {reasons}" if accepted else "")
        ), ""
    v = blocking[0]
    name = f"{labels.get(v['case_id'], v['case_id'])} {v.get('metric')}"
    delta = v.get("delta")
    if v.get("kind") == "over_budget" and v.get("budget_bytes") and v.get("candidate_value"):
        what = (
            f"{name} {format_size(int(v['candidate_value']))} over its "
            f"{format_size(int(v['budget_bytes']))} budget"
        )
    else:
        size = (
            ""
            if delta is None
            else (f" {'+' if delta >= 0 else '-'}{format_size(abs(int(delta)))}")
        )
        what = f"{name}{size} ({(v.get('kind') or '').replace('_', ' ')})"
    return f"BLOCKS ({len(blocking)})", what


def _pull_requests(ctx: Context) -> None:
    """The other branches' newest runs with their verdict: a blocking pull request is one
    click from here (its Run detail), and its Compare with its merge-base another."""
    runs = data.pull_requests(ctx.db, ctx.key, ctx.base_branch, repository=ctx.repository)
    if not runs:
        return
    st.subheader("Pull requests and branches")
    labels = model.short_case_labels({v["case_id"] for r in runs for v in r["verdicts"]})
    rows = []
    for r in runs:
        outcome, what = _verdict_of(r, labels)
        mb = r.get("git_merge_base")
        rows.append(
            {
                "verdict": outcome,
                "branch": r["git_branch"],
                "what blocks": what,
                "commit": short(r["git_commit"]),
                "subject": r.get("git_subject") or "",
                "latest run": when(r["started_at"]),
                "run": page_url("Run detail", run=r["run_id"]),
                "compare": (
                    page_url("Compare", a=mb, b=r["run_id"])
                    if mb and mb != r["git_commit"]
                    else page_url("Compare", b=r["run_id"])
                ),
            }
        )
    rows.sort(key=lambda x: (not x["verdict"].startswith("BLOCKS"), x["verdict"] == "not checked"))
    st.markdown(html_table("ov_prs", rows, PR_COLUMNS, fit=True), unsafe_allow_html=True)
    st.caption(
        f"The newest run of each branch other than {esc(ctx.base_branch)} among the "
        "newest 200 runs, blocking first, with what the gate recorded: its run says what "
        "blocks and why, its merge-base shows what changed since it branched."
    )
