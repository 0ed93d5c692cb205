"""Compare: two runs (or commits) side by side, per case and view, with deltas, each row
with its budget and the gate's verdict, and deltas coloured only past their headroom."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st
from memtrack.dashboard import data, model
from memtrack.dashboard.views import Context, esc, plain, resolve_run, run_label, short, when

from memtrack.records import metrics
from memtrack.units import format_seconds, format_size

VIEWS = metrics.COMPARED
TIME_EFFECT = 0.05
"""Time is noisy: a median moving less than this share is not a change (the gate's
smallest tested effect)."""


def _pick(side: str) -> None:
    st.session_state[side] = st.query_params[side] = st.session_state[f"{side}_pick"]


def _delta_style(row: pd.Series) -> list[str]:
    """Growth past the headroom in red, shrinkage past it in green; the rest plain."""
    colour = ""
    if row["beyond"]:
        pct = row["delta %"]
        colour = (
            "color: #b91c1c; font-weight: 600"
            if pct is not None and pct > 0
            else "color: #15803d; font-weight: 600"
        )
    return [colour if c in ("delta", "delta %") else "" for c in row.index]


def _defaults(
    ctx: Context, recent: list[dict[str, Any]], b_id: str | None
) -> tuple[str | None, str | None]:
    """B: the URL's, else the newest run. A: the newest run started before B, on the base
    branch where there is one."""
    if not recent:
        return None, b_id
    b_id = b_id or recent[0]["run_id"]
    b_at = next((r["started_at"] for r in recent if r["run_id"] == b_id), None)
    if b_at is None:
        found = data.run_detail(ctx.db, ctx.key, b_id, repository=ctx.repository)
        b_at = found["started_at"] if found else ""
    earlier = [r for r in recent if r["started_at"] < b_at and r["run_id"] != b_id]
    base = [r for r in earlier if r["git_branch"] == ctx.base_branch] or earlier
    return (base[0]["run_id"] if base else None), b_id


def _side(ctx: Context, side: str, title: str, labels: dict[str, str]) -> str | None:
    st.markdown(f"**{title}**")
    text = st.text_input(
        f"{side.upper()}: run id or commit",
        key=side,
        bind="query-params",
        placeholder="run id or commit (a prefix will do)",
    )
    run_id = resolve_run(ctx, text) if text else None
    if text and run_id is None:
        st.warning(f"No run or commit starts with “{esc(text, 40)}”.")
    return run_id


def _headroom(metric: str, before: int, verdict: dict[str, Any] | None) -> float:
    """How far a figure may move before it is a change: the gate's threshold less its
    baseline where it judged this case, else the metric's floor."""
    if verdict and verdict.get("threshold") is not None and verdict.get("baseline_value"):
        return max(
            float(verdict["threshold"]) - float(verdict["baseline_value"]),
            metrics.floor(metric, before),
        )
    return metrics.floor(metric, before)


def _delta_rows(ctx: Context, a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    ma = {m["case_id"]: m for m in a["measurements"]}
    mb = {m["case_id"]: m for m in b["measurements"]}
    labels = model.short_case_labels(set(ma) | set(mb))
    rows = []
    for case in sorted(set(ma) | set(mb)):
        x, y = ma.get(case), mb.get(case)
        common = {"case": labels[case], "case id": case}
        if x is None or y is None:
            rows.append(
                {
                    **common,
                    "view": "present",
                    "A": "yes" if x else "no",
                    "B": "yes" if y else "no",
                    "delta": "",
                    "delta %": None,
                    "beyond": True,
                    "budget": "",
                    "verdict": "",
                }
            )
            continue
        if x["status"] != y["status"]:
            rows.append(
                {
                    **common,
                    "view": "status",
                    "A": x["status"],
                    "B": y["status"],
                    "delta": "changed",
                    "delta %": None,
                    "beyond": True,
                    "budget": "",
                    "verdict": "failed" if y["status"] != "ok" else "",
                }
            )
        verdicts = {v["metric"]: v for v in b["verdicts"] if v["case_id"] == case}
        budgets = {
            bb.metric: bb
            for bb in ctx.budgets({**y, "env_id": b.get("env_id")}, list(verdicts.values()))
        }
        rows += [
            {**common, **row}
            for view in VIEWS
            if (row := _view_row(view, x, y, budgets.get(view), verdicts.get(view))) is not None
        ]
        time_row = _time_row(x, y, verdicts.get("time"))
        if time_row is not None:
            rows.append({**common, **time_row})
    return rows


def _view_row(
    view: str,
    x: dict[str, Any],
    y: dict[str, Any],
    budget: model.CaseBudget | None,
    verdict: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """One memory view of a case in A and B; None where neither measured it."""
    va, vb = model.metric_value(x, view), model.metric_value(y, view)
    if va is None and vb is None:
        return None
    delta = None if va is None or vb is None else vb - va
    used = f" ({vb / budget.limit_bytes:.0%})" if budget and vb is not None else ""
    return {
        "view": model.SHORT_LABELS[view],
        "A": format_size(va),
        "B": format_size(vb),
        "delta": "-" if delta is None else ("+" if delta > 0 else "") + format_size(delta),
        "delta %": None if delta is None or not va else round(100 * delta / va, 2),
        "beyond": delta is not None and abs(delta) > _headroom(view, va or 0, verdict),
        "budget": (
            f"{format_size(budget.limit_bytes)}{used}"
            + (" OVER" if vb is not None and vb > budget.limit_bytes else "")
            if budget
            else ""
        ),
        "verdict": (verdict or {}).get("kind") or "",
    }


def _time_row(
    x: dict[str, Any], y: dict[str, Any], verdict: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A case's median time in A and B; None where neither has one."""
    ta, tb = x.get("time_median_s"), y.get("time_median_s")
    if ta is None and tb is None:
        return None
    pct = None if ta is None or tb is None or not ta else (tb - ta) / ta
    return {
        "view": "median time",
        "A": format_seconds(ta),
        "B": format_seconds(tb),
        "delta": "-"
        if ta is None or tb is None
        else ("+" if tb >= ta else "-") + format_seconds(abs(tb - ta)),
        "delta %": None if pct is None else round(100 * pct, 2),
        "beyond": pct is not None and abs(pct) >= TIME_EFFECT,
        "budget": "",
        "verdict": (verdict or {}).get("kind") or "",
    }


def render(ctx: Context) -> None:
    st.title("Compare")
    recent = data.recent_runs(ctx.db, ctx.key, repository=ctx.repository)
    labels = {r["run_id"]: run_label(r) for r in recent}
    left, right = st.columns(2)
    with right:
        b_id = _side(ctx, "b", "B (after)", labels)
    with left:
        a_id = _side(ctx, "a", "A (before)", labels)
    default_a, default_b = _defaults(ctx, recent, b_id)
    a_id, b_id = a_id or default_a, b_id or default_b
    for col, side, chosen in ((left, "a", a_id), (right, "b", b_id)):
        col.selectbox(
            f"... or a recent run as {side.upper()}",
            list(labels),
            key=f"{side}_pick",
            index=list(labels).index(chosen) if chosen in labels else None,
            format_func=lambda r: labels[r],
            on_change=_pick,
            args=(side,),
            placeholder="choose a recent run",
        )
    if a_id is None or b_id is None:
        st.info("Choose two runs to compare (no run before B was found for A).")
        return
    a, b = (
        data.run_detail(ctx.db, ctx.key, a_id, repository=ctx.repository),
        data.run_detail(ctx.db, ctx.key, b_id, repository=ctx.repository),
    )
    if a is None or b is None:
        st.warning("One of these runs is gone from the database.")
        return
    _header(a, b)
    _table(_delta_rows(ctx, a, b))
    _site_diff(a, b)


SITES_SHOWN = 10


def _site_diff(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Where each case's peak changed from A to B: its sites matched by module and
    file:function (not by line), the largest changes first."""
    from memtrack.judge.where import diff

    before = {m["case_id"]: model.sites_of(m) for m in a["measurements"]}
    rows = []
    for m in b["measurements"]:
        old, new = before.get(m["case_id"]), model.sites_of(m)
        if not old or not new:
            continue
        changed = [c for c in diff(old, new, "pair") if c.delta]
        changed.sort(key=lambda c: -abs(c.delta))
        rows += [
            {
                "case": m["case_id"],
                "site": c.key,
                "line": c.line or "",
                "A": format_size(c.before),
                "B": format_size(c.after),
                "change": ("+" if c.delta > 0 else "-") + format_size(abs(c.delta)),
            }
            for c in changed[:SITES_SHOWN]
        ]
    if not rows:
        return
    st.subheader("Where the peak changed")
    st.dataframe(plain(pd.DataFrame(rows)), hide_index=True, key="site_diff")


def _header(a: dict[str, Any], b: dict[str, Any]) -> None:
    """The two runs, and whether their figures are like for like."""
    for name, r in (("A", a), ("B", b)):
        st.markdown(
            f"**{name}** {esc(short(r['git_commit']))} on "
            f"{esc(r['git_branch'] or '-')} · {esc(when(r['started_at']))} · "
            f"{esc(r['git_subject'] or '', 120)} · "
            f"{esc(model.env_label(r['environment']))}"
        )
    if a["started_at"] > b["started_at"]:
        st.caption("A ran after B: the deltas read from the newer run to the older one.")
    if a["fingerprint"] != b["fingerprint"]:
        st.warning(
            "Different environments, so the figures are not like for like: "
            + esc("; ".join(model.env_changes(a["environment"], b["environment"])))
        )
    else:
        st.caption(
            "Same environment (fingerprint "
            f"{esc(a['fingerprint'])}): the figures are like for like."
        )


def _table(rows: list[dict[str, Any]]) -> None:
    """The deltas, what grew the most said first."""
    only = st.toggle(
        "Only what changed past its headroom", key="cmp_only_changes", bind="query-params"
    )
    if only:
        rows = [r for r in rows if r["beyond"]]
    grew = [
        r for r in rows if r["beyond"] and (r["delta %"] or 0) > 0 and r["view"] != "median time"
    ]
    if grew:
        top = max(grew, key=lambda r: r["delta %"])
        st.markdown(
            f"{len(grew)} figure(s) grew past their headroom from A to B; the "
            f"largest: {esc(top['case'])} {esc(top['view'])} {esc(top['delta'])} "
            f"({top['delta %']:+.2f}%)."
        )
    if not rows:
        st.info("Nothing moved past its headroom between these two runs.")
        return
    df = pd.DataFrame(rows)
    st.dataframe(
        plain(df).style.apply(_delta_style, axis=1),
        hide_index=True,
        key="cmp_table",
        height=min(35 * (len(df) + 1) + 3, 800),
        column_order=["case", "view", "A", "B", "delta", "delta %", "budget", "verdict", "case id"],
        column_config={
            "case": st.column_config.TextColumn(width=220),
            "delta %": st.column_config.NumberColumn(format="%+.2f%%"),
            "budget": st.column_config.TextColumn(
                width=170, help="B's budget on this view and the share B uses"
            ),
            "verdict": st.column_config.TextColumn(help="What the gate recorded about B"),
        },
    )
    st.caption(
        "Deltas are coloured only past the view's justified headroom: the gate's "
        "threshold where it judged B, else the metric's floor (rounding, pages); "
        f"median time past {TIME_EFFECT:.0%}."
    )
