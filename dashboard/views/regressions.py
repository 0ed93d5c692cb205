"""Regressions: every step of every series on the base branch, newest first, with what the
gate said about it and whether a later step fixed it; and every regression the gate found
there that no step tells (a merge reverted after one run), with the run that fixed it."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pandas as pd
import streamlit as st
from memtrack.dashboard import data, model
from memtrack.dashboard.views import Context, esc, goto, plain, short

from memtrack.units import format_size

POINTS = 200
_REPOSITORY = re.compile(r"/([\w-][\w.-]*/[\w-][\w.-]*)/actions/runs/\d+", re.ASCII)
"""The path of a CI run address below the forge's: owner/repo/actions/runs/N."""
_SHA = re.compile(r"^[0-9a-f]{7,64}$")


def forge(rows: list[dict[str, Any]], forge_url: str) -> str | None:
    """The repository's web address on the configured forge, named by a CI run address the
    runs recorded there (FORGE/owner/repo/actions/runs/N); None without one. The host comes
    from the config only: a record can name a repository, never where a link goes."""
    base = urlsplit(forge_url)
    for r in rows:
        try:
            run = urlsplit(r.get("ci_run_url") or "")
        except ValueError:
            continue
        if (
            (run.scheme, run.netloc.lower()) != (base.scheme, base.netloc.lower())
            or run.query
            or run.fragment
            or not run.path.startswith(base.path + "/")
        ):
            continue
        found = _REPOSITORY.fullmatch(run.path[len(base.path) :])
        if found:
            return f"{forge_url}/{found.group(1)}"
    return None


def _verdict(steps: list[model.Step], verdicts: list[dict[str, Any]]) -> tuple[str, str]:
    """What the gate recorded about a step's run on the views that moved:
    (verdict, component)."""
    run = steps[0].row["run_id"]
    moved = {s.metric for s in steps}
    mine = [v for v in verdicts if v["run_id"] == run and v.get("metric") in moved]
    v = next(
        (
            v
            for v in mine
            if v.get("kind") in ("regression", "accepted", "improvement", "over_budget", "noisy")
        ),
        None,
    )
    if v is None:
        return ("not judged" if not mine else mine[0].get("kind") or "-"), ""
    said = v["kind"]
    if said == "accepted" and v.get("accepted_reason"):
        said = f"accepted: {v['accepted_reason']}"
    component = v.get("component") or ""
    if component and v.get("component_delta") is not None:
        d = int(v["component_delta"])
        component += f" {'+' if d > 0 else ''}{format_size(d)}"
    return said, component


def _rows(ctx: Context) -> list[dict[str, Any]]:
    series = data.base_series(
        ctx.db, ctx.key, ctx.base_branch, POINTS, ctx.headroom_factor, repository=ctx.repository
    )
    labels = model.short_case_labels(c["case_id"] for c in series)
    out = []
    for c in series:
        repo = forge(c["rows"], ctx.forge_url)
        # One row per case, commit and direction: the views that moved together are one
        # change, told by the first of allocated, reserved, device, host.
        grouped: dict[tuple[str, bool], list[model.Step]] = {}
        for metric in model.CHART_METRICS:
            for s in c["steps"][metric]:
                grouped.setdefault((s.row["run_id"], s.delta > 0), []).append(s)
        mine = [_step_row(group, c, labels[c["case_id"]], repo) for group in grouped.values()]
        mine += _gate_rows(c, mine, labels[c["case_id"]], repo, ctx.base_branch)
        # What the gate found on the base branch and is still open, where no row of the
        # window tells it (older than the window).
        told = {(r["commit"], r["view"]) for r in mine}
        mine += [
            row
            for o in c.get("open", [])
            if (row := _open_row(o, c["case_id"], labels[c["case_id"]], repo)) is not None
            and (row["commit"], row["view"]) not in told
        ]
        out += mine
    out.sort(key=lambda r: r["time"], reverse=True)
    return out


def _gate_rows(
    c: dict[str, Any], steps: list[dict[str, Any]], label: str, repo: str | None, base: str
) -> list[dict[str, Any]]:
    """The regressions the gate found on the base branch in the window, with what ended
    them, where no step tells them (a merge reverted after one run is one odd run to the
    step finder): a view of a step up at the same commit is one more view that moved with
    it; the others are rows of their own, one per commit."""
    ups = {r["commit"]: r for r in steps if r["up"]}
    out: dict[str, dict[str, Any]] = {}
    for g in model.gate_regressions(c["rows"], c["verdicts"], base):
        view = model.SHORT_LABELS.get(g.metric, g.metric)
        commit = short(g.row.get("git_commit"))
        row = ups.get(commit) or out.get(commit)
        if row is not None:
            moved = [x for x in row["also moved"].split(", ") if x]
            if view != row["view"] and view not in moved:
                row["also moved"] = ", ".join([*moved, view])
            continue
        out[commit] = _regression_row(g, c["case_id"], label, repo)
    return list(out.values())


def _regression_row(
    g: model.GateRegression, case_id: str, label: str, repo: str | None
) -> dict[str, Any]:
    """A regression the gate found, as a row: fixed by the run back within its threshold,
    or accepted, or not yet."""
    v, sha = g.verdict, g.row.get("git_commit") or ""
    base, now = v.get("baseline_value"), v.get("candidate_value")
    if g.fixed_by is not None:
        fixed = short(g.fixed_by.get("git_commit"))
    elif g.accepted_by is not None:
        fixed = f"accepted at {short(g.accepted_by.get('git_commit'))}"
    else:
        fixed = "not yet"
    return {
        "time": g.row["started_at"],
        "when": (g.row["started_at"] or "")[:16].replace("T", " "),
        "case": label,
        "case id": case_id,
        "view": model.SHORT_LABELS.get(g.metric, g.metric),
        "change": g.describe(),
        "level": f"{format_size(int(base))} → {format_size(int(now))}"
        if base is not None and now is not None
        else "",
        "also moved": "",
        "commit": short(sha),
        "subject": g.row.get("git_subject") or "",
        "component": v.get("component") or "",
        "verdict": "regression",
        "fixed by": fixed,
        "on forge": f"{repo}/commit/{sha}" if repo and _SHA.match(sha) else None,
        "compare": None,
        "up": True,
    }


def _step_row(
    group: list[model.Step], c: dict[str, Any], label: str, repo: str | None
) -> dict[str, Any]:
    """One change of a case: the views that stepped together at one run, one direction."""
    s = group[0]
    said, component = _verdict(group, c["verdicts"])
    sha, prev = s.row.get("git_commit") or "", s.previous.get("git_commit") or ""
    linkable = repo and _SHA.match(sha)
    return {
        "time": s.row["started_at"],
        "when": (s.row["started_at"] or "")[:16].replace("T", " "),
        "case": label,
        "case id": c["case_id"],
        "view": model.SHORT_LABELS[s.metric],
        "change": s.describe(),
        "level": f"{format_size(s.before)} → {format_size(s.after)}",
        "also moved": ", ".join(model.SHORT_LABELS[x.metric] for x in group[1:]),
        "commit": short(sha),
        "subject": s.row.get("git_subject") or "",
        "component": component,
        "verdict": said,
        "fixed by": short(s.fixed_by.get("git_commit"))
        if s.fixed_by
        else ("" if s.delta < 0 else "accepted" if said.startswith("accepted") else "not yet"),
        "on forge": f"{repo}/commit/{sha}" if linkable else None,
        "compare": f"{repo}/compare/{prev}...{sha}" if linkable and _SHA.match(prev) else None,
        "up": s.delta > 0,
    }


def _open_row(o: dict[str, Any], case_id: str, label: str, repo: str | None) -> dict[str, Any]:
    """A regression the gate found on the base branch and still open."""
    sha = o.get("commit") or ""
    delta = o.get("delta")
    return {
        "time": o["started_at"],
        "when": (o["started_at"] or "")[:16].replace("T", " "),
        "case": label,
        "case id": case_id,
        "view": model.SHORT_LABELS.get(o["metric"], o["metric"]),
        "change": ""
        if delta is None
        else f"{'+' if delta >= 0 else '-'}{format_size(abs(int(delta)))}"
        + (f" ({o['delta_pct']:+.1f}%)" if o.get("delta_pct") is not None else ""),
        "level": (
            f"{format_size(int(o['baseline_value']))} → {format_size(int(o['candidate_value']))}"
            if o.get("baseline_value") is not None and o.get("candidate_value") is not None
            else ""
        ),
        "also moved": "",
        "commit": short(sha),
        "subject": o.get("subject") or "",
        "component": o.get("component") or "",
        "verdict": "regression",
        "fixed by": "not yet",
        "on forge": f"{repo}/commit/{sha}" if repo and _SHA.match(sha) else None,
        "compare": None,
        "up": True,
    }


def _open_history(table_key: str, cases: list[str]) -> None:
    rows = st.session_state[table_key].selection.rows
    if rows:
        goto("History", case=cases[rows[0]])


def render(ctx: Context) -> None:
    st.title("Regressions")
    only_up = st.toggle("Only steps up", value=True, key="rg_up", bind="query-params")
    rows = _rows(ctx)
    if only_up:
        rows = [r for r in rows if r["up"]]
    if not rows:
        st.success(
            f"No step {'up ' if only_up else ''}in the newest {POINTS} runs of each "
            f"case on {esc(ctx.base_branch)}."
        )
        return
    still = [r for r in rows if r["up"] and r["fixed by"] == "not yet"]
    st.markdown(
        f"{len(rows)} change(s) on {esc(ctx.base_branch)} in the newest {POINTS} runs "
        f"of each case; **{len(still)} up and not fixed or accepted**"
        + (
            "".join(
                f"\n- {esc(r['case'])} {esc(r['view'])} {esc(r['change'])} since "
                f"{esc(r['commit'])} ({esc(r['subject'], 80)})"
                for r in still[:5]
            )
            if still
            else "."
        )
    )
    df = pd.DataFrame(rows)
    st.dataframe(
        plain(df),
        hide_index=True,
        key="rg_table",
        selection_mode="single-row",
        on_select=lambda: _open_history("rg_table", list(df["case id"])),
        column_order=[
            "when",
            "case",
            "view",
            "change",
            "commit",
            "verdict",
            "fixed by",
            "component",
            "level",
            "subject",
            "also moved",
            "on forge",
            "compare",
            "case id",
        ],
        column_config={
            "when": st.column_config.TextColumn(width=125),
            "case": st.column_config.TextColumn(width=200),
            "view": st.column_config.TextColumn(width=90),
            "change": st.column_config.TextColumn(width=140),
            "verdict": st.column_config.TextColumn(width=230),
            "commit": st.column_config.TextColumn(
                "first bad commit", width=110, help="The first commit at the new level"
            ),
            "fixed by": st.column_config.TextColumn(
                width=90, help="The first commit of a later step back to the old level or below"
            ),
            "on forge": st.column_config.LinkColumn(display_text="commit"),
            "compare": st.column_config.LinkColumn(display_text="compare"),
        },
    )
    st.caption(
        "A step is a shift of a series' level past its headroom on the base branch, "
        "found as `memtrack check --history` finds it; the verdict is what the gate "
        "recorded about that run. A regression the gate found that no step tells (a "
        "merge reverted after one run) has a row of its own, with the run that fixed it. "
        "Select a row to open the case's history."
    )
