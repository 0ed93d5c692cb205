"""A check shown: the terminal's table and lines (rich renderables) and the JSON report.

Both read the rows of `memtrack.report.rows`, which decides once what is listed, counted
and hinted; `memtrack.report.markdown` renders the same rows as the PR comment, and
`memtrack.report.history` renders `check --history`. The Markdown's public names are
importable from here too, as `memtrack check` imports them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memtrack.judge.decide import CheckResult
from memtrack.judge.verdict import Verdict
from memtrack.report import rows, words
from memtrack.report.markdown import (
    MARKDOWN_LIMIT,
    TABLE_ROWS,
    compare_link,
    history_link,
    markdown,
    run_link,
)
from memtrack.report.rows import label, quality_title, shown, summary_line, where
from memtrack.units import format_size

REPORT_VERSION = 2
"""2: a verdict's noise in its own fields (noise, widen, noise_runs), its arithmetic's words in
`message`, a failure's, a rename's and an acceptance's parts apart."""
TABLE_COLUMNS = (
    "verdict",
    "case",
    "metric",
    "baseline",
    "threshold",
    "candidate",
    "delta",
    "budget",
)
"""The terminal table's columns: three of words, then the figures, aligned right. The
threshold is said as the Markdown says it: the growth allowed over the baseline, or the
budget broken (the absolute figure is in the verdict's line of arithmetic)."""


def terminal(result: CheckResult) -> list[Any]:
    """Rich renderables: header, a table of what blocks or warns (the other verdicts
    counted), one arithmetic line per verdict, the outcome."""
    s = rows.check_rows(result)
    out: list[Any] = [
        shown(f"memtrack check · {where(result)} against {result.base_branch}", style="bold"),
        shown(rows.baseline_line(result)),
    ]
    out += [shown(f"note: {note}", style="yellow") for note in result.notes]
    out += [shown(words.budget_change(c), style="magenta") for c in result.budget_changes]
    if not result.estimate_only:
        out += _table(s)
    for row in s.rows:
        out += _verdict_lines(row)
    for o in result.open_regressions:
        fixed = "; this run is back within it" if o.fixed_here else ""
        if o.predates:
            fixed = "; this branch was cut before it merged: not in this change"
        out.append(
            shown(
                f"OPEN on {result.base_branch} · {o.case_id} · {o.describe()}: not "
                f"fixed or accepted, reported until it is (never blocking){fixed}",
                style="yellow",
            )
        )
    if s.noisy:
        out.append(
            shown(
                "noisy, a property of the case and not of this change: a growth "
                + ", ".join(
                    f"under {format_size(int(r.verdict.room or 0.0))} of {r.case} "
                    f"{r.verdict.metric}"
                    for r in s.noisy
                )
                + " cannot be told from its noise",
                style="dim",
            )
        )
    if s.quality:
        out.append(_quality_table(s))
    for e in result.estimates:
        out.append(shown(f"estimate · {e.case_id} · {words.estimate(e)}", style="cyan"))
    out.append(shown(summary_line(result), style="bold red" if result.blocking else "bold green"))
    return out


def _table(s: rows.CheckRows) -> list[Any]:
    """The table of what blocks or warns, and the other verdicts counted."""
    from rich.table import Table

    t = Table(title_justify="left")
    for i, col in enumerate(TABLE_COLUMNS):
        t.add_column(col, justify="left" if i < 3 else "right")
    for r in s.listed:
        v = r.verdict
        cells = (r.case, v.metric, r.baseline, r.limit, r.candidate, r.delta, r.budget)
        # Text, not str: case ids like 'w[batch=8]' would be read as rich markup.
        t.add_row(shown(r.label, style=r.style), *(shown(c) for c in cells))
    out: list[Any] = [t] if s.listed else []
    quiet = s.quiet
    if quiet:
        kinds = ", ".join(f"{n} {kind}" for kind, n in rows.counts(r.verdict for r in quiet))
        what = "not in the table" if s.listed else "nothing blocks or warns"
        out.append(shown(f"{kinds}: {what}; each has its line below", style="dim"))
    return out


def _verdict_lines(r: rows.Row) -> list[Any]:
    """A verdict's line of arithmetic, its further lines, and the snapshot hint."""
    v = r.verdict
    text = words.message(v)
    out = [shown(f"{r.label} · {v.case_id} · {text}", style="" if v.kind == "ok" else r.style)]
    # the where-line and what changed around are in the message already: said once
    said = [x for x in words.details(v) if x not in text]
    out += [shown(f"    {line}", style="dim") for line in said]
    if r.hint:
        out.append(shown(f"    {rows.snapshot_hint(v.case_id)}"))
    return out


def _quality_table(s: rows.CheckRows) -> Any:
    from rich.table import Table

    title = quality_title(s.result)
    q = Table(title=title.lower()[:1] + title[1:], title_justify="left")
    for col in rows.QUALITY_COLUMNS:
        q.add_column(
            col,
            justify="right" if col in ("framework peak", "full precision", "saved") else "left",
        )
    for v, row in s.quality:
        q.add_row(shown(label(v), style=rows.STYLE.get(v.kind, "")), *(shown(c) for c in row))
    return q


def flat(v: Verdict) -> dict[str, Any]:
    """A verdict as one flat record: its message, figures and what it rests on, the shape
    of the JSON report's verdicts and of the database's verdicts table."""
    why = v.why
    out: dict[str, Any] = {
        "case_id": v.case_id,
        "workload": v.workload,
        "metric": v.metric,
        "kind": v.kind,
        "blocking": v.blocking,
        "context": v.context,
        "message": words.message(v),
        "provisional": v.provisional,
        "baseline_value": v.baseline_value,
        "threshold": v.threshold,
        "candidate_value": v.candidate_value,
        "delta": v.delta,
        "delta_pct": v.delta_pct,
        "baseline_runs": v.baseline_runs,
        "budget_bytes": v.budget_bytes,
        "budget_reason": v.budget.reason if v.budget else None,
        "p_value": v.p_value,
        "details": words.details(v),
        "accepted_reason": v.acceptance.reason if v.acceptance else None,
        "accepted_commit": v.acceptance.commit if v.acceptance else None,
        "compared_with": v.rename.compared_with if v.rename else None,
        "param_change": v.rename.change if v.rename else None,
        "failure": words.failure(v),
        "where": dataclasses.asdict(v.where) if v.where else None,
    }
    out.update(_why_fields(why))
    return out


def _why_fields(why: Any) -> dict[str, Any]:
    """A memory verdict's noise and headroom; a quality verdict's reference and outcome."""
    from memtrack.judge.verdict import Headroom, Quality

    if isinstance(why, Headroom):
        return {
            "noise": why.noise,
            "widen": why.widen,
            "noise_runs": why.runs,
            "spread": why.spread,
            "factor": why.factor,
            "floor": why.floor,
            "bound": why.bound,
            "level_commit": why.level_since,
            "suggested_budget": why.suggested_budget,
            "component": why.component,
            "component_delta": why.component_delta,
            "sharpen": why.sharpen,
        }
    if isinstance(why, Quality):
        return {"reference": why.reference, "quality": why.outcome}
    return {}


def record(store: Any, result: CheckResult) -> int:
    """Record a check's verdicts in `store` (memtrack.store.database.Store), each as its flat
    record with its message: how many were written."""
    return int(store.save_verdicts(result, [flat(v) for v in result.verdicts]))


def to_json(result: CheckResult) -> dict[str, Any]:
    """The whole result as plain data, for machines."""
    data = dataclasses.asdict(result)
    del data["changed_lines"]  # the pull request's diff, for annotations only
    data["verdicts"] = [flat(r.verdict) for r in rows.check_rows(result).rows]
    data["notes"] = list(result.notes)
    data["budget_changes"] = [dataclasses.asdict(c) for c in result.budget_changes]
    data["open_regressions"] = [dataclasses.asdict(o) for o in result.open_regressions]
    data["exit_code"] = result.exit_code
    data["blocking"] = len(result.blocking)
    data["summary"] = summary_line(result)
    data["report_version"] = REPORT_VERSION
    return data


__all__ = [
    "MARKDOWN_LIMIT",
    "REPORT_VERSION",
    "TABLE_ROWS",
    "compare_link",
    "flat",
    "record",
    "history_link",
    "label",
    "markdown",
    "quality_title",
    "run_link",
    "shown",
    "summary_line",
    "terminal",
    "to_json",
]
