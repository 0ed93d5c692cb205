"""Compare: two runs (or commits) side by side, per case and view, with deltas."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import data, model
from dashboard.views import Context, resolve_run, run_label, short, when
from memtrack.units import format_seconds, format_size

VIEWS = ("allocated", "reserved", "requested", "device", "host")


def _pick(side: str) -> None:
    st.session_state[side] = st.session_state[f"{side}_pick"]


def _delta_style(pct: float | None) -> str:
    """Growth in red, shrinkage in green."""
    if pct is None or pct != pct or pct == 0:  # None, NaN or no change
        return ""
    return "color: #b91c1c; font-weight: 600" if pct > 0 else "color: #15803d; font-weight: 600"


def _defaults(ctx: Context, recent: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """B: the newest run; A: the newest earlier run on the base branch, else the one before."""
    if not recent:
        return None, None
    earlier = recent[1:]
    base = [r for r in earlier if r["git_branch"] == ctx.base_branch] or earlier
    return (base[0]["run_id"] if base else None), recent[0]["run_id"]


def _side(ctx: Context, side: str, title: str, default: str | None,
          labels: dict[str, str]) -> str | None:
    st.markdown(f"**{title}**")
    text = st.text_input(f"{side.upper()}: run id or commit", key=side, bind="query-params",
                         placeholder=short(default) if default else "run id or commit")
    run_id = resolve_run(ctx, text) if text else default
    st.selectbox(f"... or a recent run as {side.upper()}", list(labels), key=f"{side}_pick",
                 index=list(labels).index(run_id) if run_id in labels else None,
                 format_func=lambda r: labels[r], on_change=_pick, args=(side,),
                 placeholder="choose a recent run")
    if text and run_id is None:
        st.warning(f"No run or commit starts with {text!r}.")
    return run_id


def _delta_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    ma = {m["case_id"]: m for m in a["measurements"]}
    mb = {m["case_id"]: m for m in b["measurements"]}
    rows = []
    for case in sorted(set(ma) | set(mb)):
        x, y = ma.get(case), mb.get(case)
        if x is None or y is None:
            rows.append({"case": case, "view": "present", "A": "yes" if x else "no",
                         "B": "yes" if y else "no", "delta": "", "delta %": None, "changed": True})
            continue
        if x["status"] != y["status"]:
            rows.append({"case": case, "view": "status", "A": x["status"], "B": y["status"],
                         "delta": "changed", "delta %": None, "changed": True})
        for view in VIEWS:
            va, vb = model.metric_value(x, view), model.metric_value(y, view)
            if va is None and vb is None:
                continue
            delta = None if va is None or vb is None else vb - va
            rows.append({
                "case": case, "view": model.METRIC_LABELS[view], "A": format_size(va),
                "B": format_size(vb),
                "delta": "-" if delta is None else
                         ("+" if delta > 0 else "") + format_size(delta),
                "delta %": None if delta is None or not va else round(100 * delta / va, 2),
                "changed": va != vb,
            })
        ta, tb = x.get("time_median_s"), y.get("time_median_s")
        if ta is not None or tb is not None:
            rows.append({
                "case": case, "view": "median time", "A": format_seconds(ta),
                "B": format_seconds(tb),
                "delta": "-" if ta is None or tb is None else
                         ("+" if tb >= ta else "-") + format_seconds(abs(tb - ta)),
                "delta %": None if ta is None or tb is None or not ta
                else round(100 * (tb - ta) / ta, 2),
                "changed": ta != tb,
            })
    return rows


def render(ctx: Context) -> None:
    st.title("Compare")
    recent = data.recent_runs(ctx.db, ctx.key)
    labels = {r["run_id"]: run_label(r) for r in recent}
    default_a, default_b = _defaults(ctx, recent)
    left, right = st.columns(2)
    with left:
        a_id = _side(ctx, "a", "A (before)", default_a, labels)
    with right:
        b_id = _side(ctx, "b", "B (after)", default_b, labels)
    if a_id is None or b_id is None:
        st.info("Choose two runs to compare.")
        return
    a, b = data.run_detail(ctx.db, ctx.key, a_id), data.run_detail(ctx.db, ctx.key, b_id)
    if a is None or b is None:
        st.warning("One of these runs is gone from the database.")
        return
    for name, r in (("A", a), ("B", b)):
        st.markdown(f"**{name}** `{short(r['git_commit'])}` on `{r['git_branch'] or '-'}` · "
                    f"{when(r['started_at'])} · {r['git_subject'] or ''} · "
                    f"{model.env_label(r['environment'])}")
    if a["fingerprint"] != b["fingerprint"]:
        st.warning("Different environments, so the figures are not like for like: "
                   + "; ".join(model.env_changes(a["environment"], b["environment"])))
    rows = _delta_rows(a, b)
    only = st.toggle("Only what changed", key="cmp_only_changes")
    if only:
        rows = [r for r in rows if r["changed"]]
    grew = [r for r in rows if (r["delta %"] or 0) > 0 and r["view"] in
            {model.METRIC_LABELS[v] for v in VIEWS}]
    if grew:
        top = max(grew, key=lambda r: r["delta %"])
        st.markdown(f"{len(grew)} figure(s) grew from A to B; the largest: `{top['case']}` "
                    f"{top['view']} {top['delta']} ({top['delta %']:+.2f}%).")
    if not rows:
        st.info("Nothing differs between these two runs.")
        return
    df = pd.DataFrame(rows)
    st.dataframe(
        df.style.map(_delta_style, subset=["delta %"]), hide_index=True, key="cmp_table",
        height=min(35 * (len(df) + 1) + 3, 800),
        column_order=["case", "view", "A", "B", "delta", "delta %"],
        column_config={
            "case": st.column_config.TextColumn(width="large"),
            "delta %": st.column_config.NumberColumn(format="%+.2f%%"),
        },
    )
