"""History of one workload case: every view per run, the budget, the headroom, the events."""

from __future__ import annotations

from datetime import date, timedelta
from itertools import pairwise
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, data, model
from dashboard.views import Context, badge, goto, short, when
from memtrack.units import format_seconds, format_size

MARKED_KINDS = ("regression", "over_budget", "failed", "time_regression", "improvement",
                "environment_changed")


def _day(iso: str | None) -> date | None:
    try:
        return date.fromisoformat((iso or "")[:10])
    except ValueError:
        return None


def _filters(ctx: Context) -> dict[str, Any]:
    envs = ctx.choices["environments"].values()
    fps: dict[str, str] = {}
    for e in envs:
        fps.setdefault(e["fingerprint"], model.env_label(e))
    c1, c2, c3, c4 = st.columns([2, 2, 2, 1])
    branches = c1.multiselect("Branches", ctx.choices["branches"], key="h_branches",
                              placeholder="all branches")
    fingerprints = c2.multiselect("Environments", list(fps), key="h_envs",
                                  format_func=lambda f: fps[f], placeholder="all environments")
    first, last = _day(ctx.summary["first"]), _day(ctx.summary["last"])
    since = until = None
    if first and last:
        picked = c3.date_input("Time range", value=(first, last), min_value=first,
                               max_value=last, key="h_range")
        if isinstance(picked, (tuple, list)) and len(picked) == 2:
            lo, hi = picked
            if lo > first:
                since = lo.isoformat()
            if hi < last:
                until = (hi + timedelta(days=1)).isoformat()
    limit = c4.number_input("Newest runs", min_value=10, max_value=5000, value=500, step=100,
                            key="h_limit")
    return {"branches": tuple(branches), "fingerprints": tuple(fingerprints),
            "since": since, "until": until, "limit": int(limit)}


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
            out.append({"started_at": cur["started_at"], "change": "; ".join(changes),
                        "short": changes[0], "commit": short(cur["git_commit"]),
                        "run_id": cur["run_id"]})
    return out


def _markers(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]],
             metric: str) -> list[dict[str, Any]]:
    by_run = {r["run_id"]: r for r in rows}
    out = []
    for v in verdicts:
        r = by_run.get(v["run_id"])
        if r is None or v.get("kind") not in MARKED_KINDS:
            continue
        value = v.get("candidate_value") if v.get("metric") in model.METRIC_COLUMNS else None
        out.append({"started_at": r["started_at"], "kind": v["kind"],
                    "value": value if value is not None else model.metric_value(r, metric),
                    "commit": short(r["git_commit"]),
                    "message": v.get("message") or v["kind"]})
    seen = {m["started_at"] for m in out if m["kind"] == "failed"}
    for r in rows:
        if r["status"] != "ok" and r["started_at"] not in seen:
            out.append({"started_at": r["started_at"], "kind": "failed", "value": None,
                        "commit": short(r["git_commit"]),
                        "message": f"{r['status']}: {r.get('message') or ''}"})
    return out


def _open_run(table_key: str, run_ids: list[str]) -> None:
    rows = st.session_state[table_key].selection.rows
    if rows:
        goto("Run detail", run=run_ids[rows[0]])


def render(ctx: Context) -> None:
    cases = ctx.choices["cases"]
    st.title("History")
    case = st.selectbox("Workload case", cases, key="case", bind="query-params")
    f = _filters(ctx)
    hist = data.history(ctx.db, ctx.key, case, f["branches"], f["fingerprints"], f["since"],
                        f["until"], f["limit"])
    rows: list[dict[str, Any]] = hist["rows"]
    if not rows:
        st.info("No measurements of this case match the filters.")
        return
    latest = rows[0]
    latest_verdicts = [v for v in hist["verdicts"] if v["run_id"] == latest["run_id"]]
    budgets = ctx.budgets(latest, hist["latest_verdicts"])
    status = model.case_status(latest, budgets, latest_verdicts)
    st.markdown(f"{badge(status.status)} latest run "
                f"{when(latest['started_at'])} on `{latest['git_branch'] or '-'}` at "
                f"`{short(latest['git_commit'])}` · {model.describe_status(status)}")

    available = [m for m in model.CHART_METRICS
                 if any(model.metric_value(r, m) is not None for r in rows)]
    views = st.pills("Views", available, selection_mode="multi", default=available,
                     format_func=lambda m: model.METRIC_LABELS[m], key="h_views")
    old_first = list(reversed(rows))
    band = None
    for v in hist["latest_verdicts"]:
        found = model.headroom_band(v)
        if found and v["metric"] in views and (band is None or v["metric"] == status.metric):
            band = (f"{model.METRIC_LABELS[v['metric']]}, "
                    f"{'provisional, ' if v.get('provisional') else ''}checked "
                    f"{(v.get('checked_at') or '')[:10]}", *found)
    budget_lines = [(f"budget ({model.METRIC_LABELS[b.metric]})", b.limit_bytes)
                    for b in budgets if b.metric in views]
    markers = _markers(rows, hist["verdicts"], status.metric)
    env_changes = _env_changes(ctx, old_first)
    st.altair_chart(
        charts.memory_chart(old_first, ctx.choices["environments"], views, budget_lines, band,
                            markers, env_changes),
        width="stretch",
    )
    captions = [f"{len(rows)} runs, newest {when(latest['started_at'])}"]
    if budget_lines:
        captions.append("dashed red: budget" + "".join(
            f" ({b.reason})" for b in budgets if b.reason))
    if band:
        captions.append("green band: the justified headroom of the latest verdict")
    if env_changes:
        captions.append("brown rules: environment changes")
    st.caption(" · ".join(captions) + ". Drag to pan, scroll to zoom.")

    st.subheader("Completion time")
    tchart = charts.time_chart(old_first)
    if tchart is None:
        st.caption("No iteration times recorded for these runs.")
    else:
        st.altair_chart(tchart, width="stretch")

    st.subheader("Where the series moved")
    moved = model.steps(rows, status.metric)
    events = [{"time": s.row["started_at"][:16].replace("T", " "), "event": "step",
               "what": f"{model.METRIC_LABELS[status.metric]} {s.describe()}: "
                       f"{format_size(s.before)} → {format_size(s.after)}",
               "commit": short(s.row["git_commit"]), "branch": s.row["git_branch"],
               "subject": s.row["git_subject"], "run_id": s.row["run_id"]} for s in moved]
    by_run = {r["run_id"]: r for r in rows}
    events += [{"time": e["started_at"][:16].replace("T", " "), "event": "environment",
                "what": e["change"], "commit": e["commit"],
                "branch": by_run[e["run_id"]]["git_branch"],
                "subject": by_run[e["run_id"]]["git_subject"], "run_id": e["run_id"]}
               for e in env_changes]
    events += [{"time": by_run[v["run_id"]]["started_at"][:16].replace("T", " "),
                "event": v["kind"], "what": v.get("message") or "",
                "commit": short(by_run[v["run_id"]]["git_commit"]),
                "branch": by_run[v["run_id"]]["git_branch"],
                "subject": by_run[v["run_id"]]["git_subject"], "run_id": v["run_id"]}
               for v in hist["verdicts"] if v.get("kind") in MARKED_KINDS]
    if events:
        events.sort(key=lambda e: e["time"], reverse=True)
        ev = pd.DataFrame(events[:200])
        st.dataframe(ev, hide_index=True, key="h_events", selection_mode="single-row",
                     on_select=lambda: _open_run("h_events", list(ev["run_id"])),
                     column_order=["time", "event", "what", "commit", "branch", "subject"])
        st.caption("A step is a shift of the series' level (median of 3 runs on each side) "
                   f"past its noise, at least {format_size(model.STEP_MIN_BYTES)}; the run "
                   "named is the first at the new level. Select a row to open its run.")
    else:
        st.caption(f"No step, environment change or verdict among these {len(rows)} runs.")

    with st.expander(f"All {len(rows)} points"):
        points = pd.DataFrame([{
            "time": r["started_at"][:19].replace("T", " "), "branch": r["git_branch"],
            "commit": short(r["git_commit"]), "status": r["status"],
            **{model.METRIC_LABELS[m]: format_size(model.metric_value(r, m))
               for m in model.CHART_METRICS},
            "median time": format_seconds(r["time_median_s"]),
            "subject": r["git_subject"], "run_id": r["run_id"],
        } for r in rows])
        st.dataframe(points, hide_index=True, key="h_points", selection_mode="single-row",
                     on_select=lambda: _open_run("h_points", list(points["run_id"])))
