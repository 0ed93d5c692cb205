"""History of one workload case: one panel per view on its own scale, the budget, the
headroom of the current level, failures, steps and environment changes."""

from __future__ import annotations

from collections.abc import Collection
from datetime import date, timedelta
from itertools import pairwise
from typing import Any

import pandas as pd
import streamlit as st
from memtrack.dashboard import data, model, panels
from memtrack.dashboard.charts import MARKER_NAMES, branch_colors
from memtrack.dashboard.tables import Column, html_table, page_url
from memtrack.dashboard.views import Context, badge, esc, goto, plain, resolve_case, short, when

from memtrack.units import format_seconds, format_size

MARKED_KINDS = (
    "regression",
    "over_budget",
    "time_regression",
    "improvement",
    "accepted",
    "noisy",
    "environment_changed",
)
SCALES = {"data": "fit the data", "budget": "with the budget", "zero": "from zero"}
ZOOMS = {"all": "all", "100": "newest 100", "30": "newest 30"}
EVENT_COLUMNS = (
    Column("time"),
    Column("event"),
    Column("what", width=420, wrap=True),
    Column("commit", link="run", help="Opens the run's detail"),
    Column("branch"),
    Column("subject", width=240, wrap=True),
)
"""History's table of where the series moved."""


def _day(iso: str | None) -> date | None:
    try:
        return date.fromisoformat((iso or "")[:10])
    except ValueError:
        return None


def _pick_case(ctx: Context) -> str | None:
    """The case of the URL (an id, the Overview's short label, or a workload name with one
    case), or None after a warning that lists the candidates."""
    asked = st.query_params.get("case")
    if asked is not None and asked not in ctx.choices["cases"]:
        found, candidates = resolve_case(ctx, asked)
        if found is not None:  # say it right in the URL, then draw from it
            st.query_params["case"] = found
            st.rerun()
        else:
            options = candidates or ctx.choices["cases"]
            st.warning(
                f"No single case matches {esc(asked, 80)}"
                + (
                    f": it could be {', '.join(esc(c) for c in candidates[:10])}."
                    if candidates
                    else ". Choose one below."
                )
            )
            st.selectbox(
                "Workload case",
                options,
                index=None,
                key="case_pick",
                placeholder="choose a case",
                on_change=lambda: goto("History", case=st.session_state["case_pick"]),
            )
            return None
    # In a popover labelled with the case: a select box drawn on the page cost a new visitor
    # about 0.15 s in Chromium (its code loaded by every fresh browser); in a popover it is
    # drawn, and its code loaded, only when opened.
    cases = ctx.choices["cases"]
    shown = st.session_state.get("case")
    if shown not in cases:
        shown = asked if asked in cases else cases[0]
    pop = st.popover(esc(shown), icon=":material/swap_horiz:", help="Choose another case")
    return pop.selectbox("Workload case", cases, key="case", bind="query-params")


def _filters(ctx: Context) -> dict[str, Any]:
    fps: dict[str, str] = {}
    for e in ctx.choices["environments"].values():
        fps.setdefault(e["fingerprint"], model.env_label(e))
    # In a popover: its widgets are drawn (and their code loaded) only when it is opened,
    # which took about a third of a second off every History visit in Chromium.
    pop = st.popover("Filters: branches, environments, run dates, runs")
    branches = pop.multiselect(
        "Branches",
        ctx.choices["branches"],
        key="h_branches",
        bind="query-params",
        placeholder=f"all ({ctx.base_branch} as the line)",
    )
    fingerprints = pop.multiselect(
        "Environments",
        list(fps),
        key="h_envs",
        bind="query-params",
        format_func=lambda f: fps[f],
        placeholder="all environments",
    )
    first, last = _day(ctx.summary["first"]), _day(ctx.summary["last"])
    since = until = None
    lo = hi = None
    if first and last:
        picked = pop.date_input(
            "Runs started between",
            value=(first, last),
            min_value=first,
            max_value=last,
            key="h_range",
            help="When the runs were made; the time axis places each run at its commit's time",
        )
        if isinstance(picked, (tuple, list)) and len(picked) == 2:
            lo, hi = picked
            if lo > first:
                since = lo.isoformat()
            if hi < last:
                until = (hi + timedelta(days=1)).isoformat()
    # 200 runs keep a page quick in the browser (each is a mark on every panel).
    limit = pop.number_input(
        "Newest runs",
        min_value=10,
        max_value=5000,
        value=200,
        step=100,
        key="h_limit",
        bind="query-params",
    )
    shown = [
        ", ".join(esc(b) for b in branches) if branches else "all branches",
        f"{len(fingerprints)} environment(s)" if fingerprints else "all environments",
        f"runs started {lo} to {hi}" if since or until else "runs of any date",
        f"the newest {int(limit)} runs",
    ]
    st.caption("Showing " + " · ".join(shown) + ".")
    return {
        "branches": tuple(branches),
        "fingerprints": tuple(fingerprints),
        "since": since,
        "until": until,
        "limit": int(limit),
    }


def _env_changes(ctx: Context, rows_old_first: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where an environment replaced another: a fingerprint appears and the one before it
    never comes back. Runs that alternate between environments (a CPU and a GPU runner)
    are separate series, not changes."""
    last_seen = {r["fingerprint"]: i for i, r in enumerate(rows_old_first)}
    out = []
    seen = {rows_old_first[0]["fingerprint"]} if rows_old_first else set()
    for i, (prev, cur) in enumerate(pairwise(rows_old_first), start=1):
        if cur["fingerprint"] not in seen:
            seen.add(cur["fingerprint"])
            if last_seen[prev["fingerprint"]] > i:
                continue
            changes = model.env_changes(ctx.env(prev["env_id"]), ctx.env(cur["env_id"]))
            out.append({"x": cur["x"], "change": "; ".join(changes), "row": cur})
    return out


def _failure_marks(rows_old_first: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """A failed run, marked on a view where it was seen: at the level the view had just
    before it (after it, for a failure before any figure)."""
    out = []
    for i, r in enumerate(rows_old_first):
        if r["status"] == "ok":
            continue
        near = [model.metric_value(x, metric) for x in rows_old_first[:i][::-1]]
        near += [model.metric_value(x, metric) for x in rows_old_first[i + 1 :]]
        level = next((v for v in near if v is not None), None)
        if level is not None:
            out.append(
                {
                    "x": r["x"],
                    "bytes": level,
                    "kind": "failed",
                    "commit": short(r["git_commit"]),
                    "message": f"{r['status']}: {r.get('message') or ''}"[:200],
                }
            )
    return out


def _estimate_marks(
    estimates: list[dict[str, Any]], metric: str, measured: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`memtrack estimate`'s figures: marks of their own on the framework view (the figure
    they predict), never points of the series; each says what it holds and how far it is
    from the latest measured figure (`measured`, newest first)."""
    if metric != "allocated":
        return []
    return [
        {
            "x": e["x"],
            "bytes": e["peak_allocated_bytes"],
            "kind": "estimate",
            "commit": short(e["git_commit"]),
            "message": f"estimate for {e['device']} (fake tensors), not measured: "
            + estimate_drift(e, measured),
        }
        for e in estimates
        if e.get("peak_allocated_bytes") is not None
    ]


def estimate_drift(estimate: dict[str, Any], measured: list[dict[str, Any]]) -> str:
    """An estimate row's figure in words: its tensors and the kernel scratch added from a
    measured run (or that it excludes scratch), and its ratio to the latest measured
    framework peak of the same device kind among `measured` (newest first)."""
    peak, scratch = estimate["peak_allocated_bytes"], estimate.get("scratch_bytes")
    if scratch is None:
        text = "tensors only, excludes kernel scratch"
    else:
        text = f"{format_size(peak - scratch)} of tensors + {format_size(scratch)} kernel scratch"
    latest = next(
        (
            r
            for r in measured
            if r.get("status") == "ok"
            and r.get("device") == estimate.get("device")
            and r.get("peak_allocated_bytes")
        ),
        None,
    )
    if latest is None:
        return text + "; nothing measured to compare it with"
    ratio = peak / latest["peak_allocated_bytes"]
    text += f"; estimate / measured {ratio:.3f}"
    if scratch is not None:
        text += f" (tensors alone {(peak - scratch) / latest['peak_allocated_bytes']:.3f})"
    return text + f", against the latest measured run {short(latest['git_commit'])}"


def _verdict_marks(
    by_run: dict[str, dict[str, Any]], verdicts: list[dict[str, Any]], metric: str
) -> list[dict[str, Any]]:
    out = []
    for v in verdicts:
        r = by_run.get(v["run_id"])
        if r is None or v.get("kind") not in MARKED_KINDS or v.get("metric") != metric:
            continue
        value = v.get("candidate_value")
        value = model.metric_value(r, metric) if value is None else value
        if value is not None:
            out.append(
                {
                    "x": r["x"],
                    "bytes": value,
                    "kind": v["kind"],
                    "commit": short(r["git_commit"]),
                    "message": (v.get("accepted_reason") or v.get("message") or "")[:200],
                }
            )
    return out


def _band(
    ctx: Context,
    latest_verdicts: list[dict[str, Any]],
    metric: str,
    line: list[dict[str, Any]],
    moved: list[model.Step],
) -> tuple | None:
    """The latest verdict's headroom (baseline to threshold), over the current level only:
    from the newest step of this view (or the first point) to the newest point."""
    for v in latest_verdicts:
        found = model.headroom_band(v) if v.get("metric") == metric else None
        if found and line:
            start = moved[0].row["x"] if moved else line[0]["x"]
            what = (
                f"{'provisional, ' if v.get('provisional') else ''}checked "
                f"{(v.get('checked_at') or '')[:10]}"
            )
            return what, start, line[-1]["x"], *found
    return None


def _open_run(table_key: str, run_ids: list[str]) -> None:
    rows = st.session_state[table_key].selection.rows
    if rows:
        goto("Run detail", run=run_ids[rows[0]])


def render(ctx: Context) -> None:
    st.title("History")
    case = _pick_case(ctx)
    if case is None:
        return
    f = _filters(ctx)
    hist = data.history(
        ctx.db,
        ctx.key,
        case,
        **f,
        base_branch=ctx.base_branch,
        factor=ctx.headroom_factor,
        repository=ctx.repository,
    )
    rows: list[dict[str, Any]] = hist["rows"]
    if not rows:
        st.info("No measurements of this case match the filters.")
        return
    base = ctx.base_branch
    on_base = [r for r in rows if r["git_branch"] == base]
    status, budgets = _status(ctx, hist, on_base or rows)
    budgeted = {b.metric: b for b in budgets}
    flagged = {v.get("metric") for v in hist["verdicts"] if v.get("kind") == "regression"}
    views, scale, zoom = _controls(rows, status, budgeted, hist["steps"], flagged)
    old_first = sorted(rows, key=lambda r: (r["x"], r["started_at"]))
    if zoom != "all":
        old_first = old_first[-int(zoom) :]
    line_old_first = [r for r in old_first if not on_base or r["git_branch"] == base]
    by_run = {r["run_id"]: r for r in rows}
    env_changes = _env_changes(ctx, line_old_first)
    estimates = hist.get("estimates", [])
    if zoom != "all" and old_first:
        estimates = [e for e in estimates if e["x"] >= old_first[0]["x"]]
        env_changes = [e for e in env_changes if e["x"] >= old_first[0]["x"]]
    times = [r["x"] for r in old_first] + [e["x"] for e in estimates]
    fmt = panels.time_format(times)
    # each other branch its colour on every panel, the newest branches first
    newest_first = sorted(old_first, key=lambda r: (r["x"], r["started_at"]), reverse=True)
    branches = branch_colors(
        [r["git_branch"] or "-" for r in newest_first if on_base and r["git_branch"] != base]
    )
    moved_by_view: dict[str, list[model.Step]] = {}
    for metric in views or []:
        moved_by_view[metric] = hist["steps"][metric]
        panel = _view_panel(
            ctx,
            hist,
            metric,
            old_first,
            by_run,
            bool(on_base),
            estimates,
            env_changes,
            times,
            branches,
        )
        if panel is not None:
            st.markdown(panel(fmt, budgeted.get(metric), scale), unsafe_allow_html=True)
    st.caption(
        _captions(len(old_first), base, len(on_base) < len(rows), budgeted, estimates, env_changes)
    )
    if hist.get("estimates"):
        latest = hist["estimates"][0]
        drift = esc(estimate_drift(latest, rows))
        st.caption(
            f"Latest estimate ({short(latest['git_commit'])}): "
            f"{format_size(latest['peak_allocated_bytes'])}, {drift}."
        )

    st.subheader("Completion time")
    tchart = panels.time_panel(
        old_first, fmt, times, base=base if on_base else None, branches=branches
    )
    if tchart is None:
        st.caption("No iteration times recorded for these runs.")
    else:
        st.markdown(tchart, unsafe_allow_html=True)
    _moves(_events(ctx, case, rows, hist["verdicts"], moved_by_view, env_changes, by_run), rows)
    _points(rows)


def _moves(events: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Where the series moved: its steps, failures, environment changes and verdicts."""
    st.subheader("Where the series moved")
    if not events:
        st.caption(f"No step, failure, environment change or verdict among these {len(rows)} runs.")
        return
    events.sort(key=lambda e: e["time"], reverse=True)
    st.markdown(html_table("h_events", events[:300], EVENT_COLUMNS), unsafe_allow_html=True)
    st.caption(
        "A step is a shift of the series' level past its headroom (the gate's change points); "
        "the run named is the first at the new level. A commit opens its run."
    )


def _status(
    ctx: Context, hist: dict[str, Any], line_rows: list[dict[str, Any]]
) -> tuple[model.CaseStatus, list[model.CaseBudget]]:
    """The case's status at its newest run of the line (the base branch where shown), said
    in one line; and the budgets that apply to it."""
    latest = line_rows[0]
    latest_verdicts = [v for v in hist["verdicts"] if v["run_id"] == latest["run_id"]]
    budgets = ctx.budgets(latest, hist["latest_verdicts"])
    still_open = [
        o for o in hist.get("open", []) if o.get("fingerprint") == latest.get("fingerprint")
    ]
    status = model.case_status(latest, budgets, latest_verdicts, still_open)
    # the time axis places a run at its commit's time: said here beside the run's own
    st.markdown(
        f"{badge(status.status)} latest run on {esc(latest['git_branch'] or '-')}: "
        f"{esc(short(latest['git_commit']))}, on the time axis at {esc(_axis_time(latest))}; "
        f"run {esc(when(latest['started_at']))} · "
        f"{esc(model.describe_status(status), 300)}"
    )
    return status, budgets


def _axis_time(row: dict[str, Any]) -> str:
    """Where the time axis places the status line's run, in UTC as the axis labels it: its
    commit's time (where none was recorded, its start)."""
    at = str(row.get("x") or row["started_at"])[:16].replace("T", " ")
    how = "its commit's time" if row.get("git_committed_at") else "its start"
    return f"{at} UTC, {how}"


def _controls(
    rows: list[dict[str, Any]],
    status: model.CaseStatus,
    budgeted: dict[str, model.CaseBudget],
    steps: dict[str, list[model.Step]],
    flagged: Collection[Any] = (),
) -> tuple[list[str], str, str]:
    """The views to draw, the scale and the zoom, as the visitor picked them."""
    available = [
        m for m in model.CHART_METRICS if any(model.metric_value(r, m) is not None for r in rows)
    ]
    available.sort(key=lambda m: (m != status.metric, m not in budgeted))
    # Drawn at first: the view that decides the status, views with a budget, views that
    # moved in this window, and views the gate found a regression on (a merge reverted
    # after one run is no step); the others are a click away.
    shown = [
        m for m in available if m == status.metric or m in budgeted or steps.get(m) or m in flagged
    ] or available[:1]
    # The views on a row of their own: in a third of the page their chips were cut
    # ("host step growt").
    views = st.pills(
        "Views",
        available,
        selection_mode="multi",
        default=shown,
        format_func=lambda m: model.METRIC_LABELS[m],
        key="h_views",
    )
    mid, right, _ = st.columns([3, 3, 2])
    scale = (
        mid.segmented_control(
            "Scale",
            list(SCALES),
            default="data",
            key="h_scale",
            bind="query-params",
            format_func=SCALES.__getitem__,
            help="Fit the data (a far budget is a marker at the edge), take the budget in, or "
            "start at zero",
        )
        or "data"
    )
    zoom = (
        right.segmented_control(
            "Zoom",
            list(ZOOMS),
            default="all",
            key="h_zoom",
            bind="query-params",
            format_func=ZOOMS.__getitem__,
            help="The newest runs only, on every panel",
        )
        or "all"
    )
    return list(views or []), scale, zoom


def _view_panel(
    ctx: Context,
    hist: dict[str, Any],
    metric: str,
    old_first: list[dict[str, Any]],
    by_run: dict[str, dict[str, Any]],
    on_base: bool,
    estimates: list[dict[str, Any]],
    env_changes: list[dict[str, Any]],
    times: list[Any],
    branches: dict[str, str],
) -> Any:
    """One view's panel, to draw with the time format, its budget and the scale; None where
    no shown run has the figure. `branches`: each other branch's colour."""
    base = ctx.base_branch
    envs = {e: model.env_short(ctx.env(e)) for e in {r["env_id"] for r in hist["rows"]}}
    points = [
        {
            "x": r["x"],
            "bytes": v,
            "line": "base" if (not on_base or r["git_branch"] == base) else panels.OTHER_BRANCHES,
            "environment": envs[r["env_id"]],
            "commit": short(r["git_commit"]),
            "subject": (r["git_subject"] or "")[:60],
            "branch": r["git_branch"] or "-",
        }
        for r in old_first
        if (v := model.metric_value(r, metric)) is not None
    ]
    if not points:
        return None
    line = [p for p in points if p["line"] == "base"]
    band = _band(ctx, hist["latest_verdicts"], metric, line, hist["steps"][metric])
    shown_runs = {r["run_id"] for r in old_first}
    marks = (
        _failure_marks(old_first, metric)
        + _verdict_marks(
            {k: r for k, r in by_run.items() if k in shown_runs}, hist["verdicts"], metric
        )
        + _estimate_marks(estimates, metric, hist["rows"])
    )
    rules = [{"x": e["x"], "change": e["change"]} for e in env_changes]

    def draw(fmt: Any, b: model.CaseBudget | None, scale: str) -> str:
        budget = (f" ({b.reason})" if b.reason else "", b.limit_bytes) if b else None
        return panels.view_panel(
            metric, points, fmt, budget, band, marks, rules, times, scale=scale, branches=branches
        )

    return draw


def _captions(
    runs: int,
    base: str,
    other_branches: bool,
    budgeted: dict[str, model.CaseBudget],
    estimates: list[dict[str, Any]],
    env_changes: list[dict[str, Any]],
) -> str:
    """What the panels show, in one caption under them."""
    captions = [
        f"{runs} runs, each at its commit's time; {esc(base)} as a line in commit order"
        + (
            ", each other branch's runs as ◇ points in its own colour at its merge-base's "
            "time (several branches there side by side)"
            if other_branches
            else ""
        )
    ]
    if budgeted:
        captions.append(
            "dashed red: the budget (a marker at the edge where it is far from "
            "the data, unless the scale takes it in)"
        )
    captions.append(
        "green band: the justified headroom of the latest verdict, over the current level"
    )
    captions.append(
        "✕ failures (at the level last seen), ■ over budget, ▲ regressions, "
        "▼ improvements, ◆ accepted, ○ noisy"
        + (", ✚ estimates (fake tensors, not measured) on the framework view" if estimates else "")
    )
    if env_changes:
        captions.append("brown rules: environment changes")
    return (
        " · ".join(captions) + ". Each view has its own scale. Hover a mark for its "
        "figure and commit."
    )


def _points(rows: list[dict[str, Any]]) -> None:
    """The table of every point, sent only on request: it is most of a page's data. A pill,
    not a toggle: the page's pills have loaded its code already, where a toggle cost a new
    visitor about 0.05 s more in Chromium."""
    if not st.pills(
        "Table of points",
        ["all"],
        key="h_all",
        format_func=lambda _: f"Show all {len(rows)} points",
        label_visibility="collapsed",
    ):
        return
    points_df = pd.DataFrame(
        [
            {
                "time": r["started_at"][:19].replace("T", " "),
                "branch": r["git_branch"],
                "commit": short(r["git_commit"]),
                "status": r["status"],
                **{
                    model.SHORT_LABELS[m]: format_size(model.metric_value(r, m))
                    for m in model.CHART_METRICS
                },
                "median time": format_seconds(r["time_median_s"]),
                "subject": r["git_subject"],
                "run_id": r["run_id"],
            }
            for r in rows
        ]
    )
    st.dataframe(
        plain(points_df),
        hide_index=True,
        key="h_points",
        selection_mode="single-row",
        on_select=lambda: _open_run("h_points", list(points_df["run_id"])),
    )


def _events(
    ctx: Context,
    case: str,
    rows: list[dict[str, Any]],
    verdicts: list[dict[str, Any]],
    moved_by_view: dict[str, list[model.Step]],
    env_changes: list[dict[str, Any]],
    by_run: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    def event(r: dict[str, Any], kind: str, what: str) -> dict[str, Any]:
        return {
            "time": r["started_at"][:16].replace("T", " "),
            "event": kind,
            "what": what,
            "commit": short(r["git_commit"]),
            "branch": r["git_branch"],
            "subject": r["git_subject"],
            "run": page_url("Run detail", run=r["run_id"]),
        }

    out = []
    for metric, moved in moved_by_view.items():
        for s in moved:
            fixed = f"; fixed at {short(s.fixed_by['git_commit'])}" if s.fixed_by else ""
            command = s.bisect_command(case)
            which = f"; several commits brought it, to find which: {command}" if command else ""
            out.append(
                event(
                    s.row,
                    "step",
                    f"{model.METRIC_LABELS[metric]} {s.describe()}: "
                    f"{format_size(s.before)} → {format_size(s.after)}{fixed}{which}",
                )
            )
    out += [event(e["row"], "environment", e["change"]) for e in env_changes]
    out += [
        event(r, "failed", f"{r['status']}: {r.get('message') or ''}")
        for r in rows
        if r["status"] != "ok"
    ]
    out += [
        event(by_run[v["run_id"]], MARKER_NAMES.get(v["kind"], v["kind"]), _said(v))
        for v in verdicts
        if v.get("kind") in MARKED_KINDS and v["run_id"] in by_run
    ]
    return out


def _said(v: dict[str, Any]) -> str:
    """What a verdict said, once: its message names its metric first ('host: baseline
    ...'), a reason does not ('allocated: accepted: the feature')."""
    metric = v.get("metric") or ""
    if v.get("accepted_reason"):
        return f"{metric}: accepted: {v['accepted_reason']}"
    message = v.get("message") or ""
    return message if message.startswith((f"{metric}:", f"{metric} ")) else f"{metric}: {message}"
