"""Verdicts shown: a terminal table (rich renderables), compact Markdown, and JSON.

Nothing here decides: `memtrack.judge.check` and `memtrack.judge.history` do. Blocking items
come first everywhere; every verdict keeps its one-line arithmetic.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import TYPE_CHECKING, Any

from memtrack.escape import markdown_code, markdown_text, terminal_text
from memtrack.judge.check import CheckResult
from memtrack.judge.verdict import Verdict
from memtrack.units import format_seconds, format_size
from memtrack.workload.registry import short_case_labels

if TYPE_CHECKING:
    from memtrack.judge.history import HistoryResult

MARKDOWN_LIMIT = 1_000_000
"""GitHub refuses a job summary over 1 MiB; stay clearly below it."""
REPORT_VERSION = 1

_ORDER = {"failed": 0, "over_budget": 1, "regression": 2, "quality": 2, "noisy": 3,
          "time_regression": 4,
          "environment_changed": 5, "accepted": 6, "new": 7, "improvement": 8, "ok": 9}
_STYLE = {"failed": "bold red", "over_budget": "bold red", "regression": "bold red",
          "quality": "bold red", "noisy": "yellow", "time_regression": "yellow",
          "environment_changed": "yellow",
          "accepted": "magenta", "new": "cyan", "improvement": "green", "ok": "dim"}
_EMOJI = {"failed": "💥", "over_budget": "⛔", "regression": "🔺", "quality": "🎯", "noisy": "〰️",
          "time_regression": "🐢", "environment_changed": "🔀", "accepted": "☑️", "new": "🆕",
          "improvement": "🔻", "ok": "✅"}
_QUIET = ("ok", "improvement", "new", "accepted")
"""Kinds that are neither blocking nor a warning."""
SNAPSHOT_METRICS = ("allocated", "reserved", "requested", "device", "host", "host_step")
"""Metrics of the measured step, which `memtrack snapshot` captures (not the loading's)."""


def snapshot_hint(case_id: str) -> str:
    """The command that shows which allocations make a blocked case's step peak."""
    return "To see which allocation: memtrack snapshot '" + case_id.replace("'", "'\\''") + "'"


def _hinted(verdicts: list[Verdict]) -> set[int]:
    """Positions of the first blocking step-memory verdict of each case: one hint per case."""
    seen: set[str] = set()
    out = set()
    for i, v in enumerate(verdicts):
        if v.blocking and v.metric in SNAPSHOT_METRICS and v.case_id not in seen:
            seen.add(v.case_id)
            out.add(i)
    return out


def ordered(verdicts: tuple[Verdict, ...] | list[Verdict]) -> list[Verdict]:
    """Blocking first, then warnings, then the rest; by kind, then case."""
    return sorted(verdicts, key=lambda v: (not v.blocking, _ORDER.get(v.kind, 9), v.case_id,
                                           v.metric))


def label(v: Verdict) -> str:
    """'BLOCK regression', 'warn time regression', 'ok' ..."""
    words = v.kind.replace("_", " ")
    if v.blocking:
        return f"BLOCK {words}"
    if v.kind in _QUIET:
        return words + (" (provisional)" if v.provisional and v.kind != "new" else "")
    if v.context == "base" and v.kind in ("regression", "over_budget", "failed", "quality"):
        return f"REPORT {words}"  # on the base branch: recorded, never blocking
    return f"warn {words}"


def _value(v: Verdict, x: float | None) -> str:
    if x is None:
        return "-"
    return format_seconds(x) if v.metric == "time" else format_size(int(round(x)))


def _delta(v: Verdict) -> str:
    if v.delta is None:
        return "-"
    sign = "+" if v.delta >= 0 else "-"
    magnitude = (format_seconds(abs(v.delta)) if v.metric == "time"
                 else format_size(abs(int(round(v.delta)))))
    pct = f" ({v.delta_pct:+.2f}%)" if v.delta_pct is not None else ""
    return f"{sign}{magnitude}{pct}"


def _budget(v: Verdict) -> str:
    if v.budget_bytes is None:
        return "-"
    if v.candidate_value is None:
        return format_size(v.budget_bytes)
    margin = v.budget_bytes - int(v.candidate_value)
    return f"{format_size(v.budget_bytes)} ({'margin ' if margin >= 0 else 'over '}" \
           f"{format_size(abs(margin))})"


def summary_line(result: CheckResult) -> str:
    counts: dict[str, int] = {}
    for v in result.verdicts:
        counts[v.kind] = counts.get(v.kind, 0) + 1
    parts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in
                      sorted(counts.items(), key=lambda kv: _ORDER.get(kv[0], 9)))
    blocking = result.blocking
    if result.estimate_only:
        return (f"estimate run: nothing measured, nothing judged "
                f"({len(result.estimates)} case(s) estimated)")
    if result.context == "base":
        regressed = sum(v.kind in ("regression", "over_budget", "failed", "quality")
                        for v in result.verdicts)
        head = (f"base branch: {regressed} regression{'s' * (regressed != 1)} reported "
                "(never blocking)" if regressed else "base branch: no regression")
    else:
        head = (f"BLOCKED: {len(blocking)} blocking verdict{'s' * (len(blocking) != 1)}"
                if blocking else "passed: nothing blocks")
    return f"{head} ({parts or 'no verdicts'})"


def _where(result: CheckResult) -> str:
    commit = (result.commit or "no commit")[:12]
    return f"run {result.run_id[:12]} of {commit} ({result.branch or 'no branch'})"


def _baseline_line(result: CheckResult) -> str:
    if result.estimate_only:
        return "baseline: none (an estimate run is not compared)"
    if result.baseline_mode == "ancestry":
        how = f"at or before merge-base {(result.merge_base or '?')[:12]}"
    else:
        how = "by commit time (see note)"
    return (f"baseline: runs on {result.base_branch} {how}, same environment "
            f"({result.fingerprint[:12]})")


# -- terminal -------------------------------------------------------------------------------


def shown(text: str, style: str = "") -> Any:
    """A rich Text of recorded text, its control characters made visible, never acting."""
    from rich.text import Text

    return Text(terminal_text(text), style=style)


def terminal(result: CheckResult) -> list[Any]:
    """Rich renderables: header, table, one arithmetic line per verdict, the outcome."""
    from rich.table import Table

    out: list[Any] = [shown(f"memtrack check · {_where(result)} against {result.base_branch}",
                            style="bold"), shown(_baseline_line(result))]
    for note in result.notes:
        out.append(shown(f"note: {note}", style="yellow"))
    for change in result.budget_changes:
        out.append(shown(change.describe(), style="magenta"))
    verdicts = ordered(result.verdicts)
    t = Table(title_justify="left")
    for col in ("verdict", "case", "metric", "baseline", "threshold", "candidate", "delta",
                "budget"):
        t.add_column(col, justify="right" if col in ("baseline", "threshold", "candidate",
                                                      "delta", "budget") else "left")
    labels = short_case_labels(v.case_id for v in verdicts)  # full ids in the lines below
    for v in verdicts:
        cells = (labels[v.case_id], v.metric, _value(v, v.baseline_value), _value(v, v.threshold),
                 _value(v, v.candidate_value), _delta(v), _budget(v))
        # Text, not str: case ids like 'w[batch=8]' would be read as rich markup.
        t.add_row(shown(label(v), style=_STYLE.get(v.kind, "")), *(shown(c) for c in cells))
    if not result.estimate_only:
        out.append(t)
    hinted = _hinted(verdicts)
    for i, v in enumerate(verdicts):
        out.append(shown(f"{label(v)} · {v.case_id} · {v.message}",
                         style=_STYLE.get(v.kind, "") if v.kind != "ok" else ""))
        for line in v.details:
            out.append(shown(f"    {line}", style="dim"))
        if i in hinted:
            out.append(shown(f"    {snapshot_hint(v.case_id)}"))
    rows = quality_rows(result)
    if rows:
        q = Table(title="quality after a precision change: memory saved and quality kept",
                  title_justify="left")
        for col in _QUALITY_COLUMNS:
            q.add_column(col, justify="right" if col in ("framework peak", "full precision",
                                                           "saved") else "left")
        for v, row in rows:
            q.add_row(shown(label(v), style=_STYLE.get(v.kind, "")), *(shown(c) for c in row))
        out.append(q)
    for e in result.estimates:
        out.append(shown(f"estimate · {e.case_id} · {e.describe()}", style="cyan"))
    out.append(shown(summary_line(result), style="bold red" if result.blocking else "bold green"))
    return out


# -- quality --------------------------------------------------------------------------------

_QUALITY_COLUMNS = ("verdict", "case", "against", "framework peak", "full precision", "saved",
                    "quality")


def quality_rows(result: CheckResult) -> list[tuple[Verdict, tuple[str, ...]]]:
    """One row per quality verdict: the case, its reference, its framework peak against the
    full-precision sibling's in the same run, what that saves, and the quality kept."""
    from memtrack.judge.quality import precision_change

    rows: list[tuple[Verdict, tuple[str, ...]]] = []
    verdicts = ordered([v for v in result.verdicts if v.metric == "quality"])
    labels = short_case_labels([*{v.case_id for v in verdicts},
                                *{v.reference for v in verdicts if v.reference}])
    for v in verdicts:
        ref = v.reference or "-"
        changed = v.reference is not None and precision_change(v.case_id, v.reference)
        if v.baseline_value is not None and v.candidate_value is not None:
            full, own = int(v.baseline_value), int(v.candidate_value)
            saved = full - own
            pct = 100.0 * saved / full if full else 0.0
            saved_text = (f"{format_size(saved)} ({pct:.1f}%)" if saved >= 0
                          else f"none: {format_size(-saved)} more")
            peaks: tuple[str, ...] = (format_size(own), format_size(full), saved_text)
        else:
            peaks = ("-", "-", "-" if changed else "(full precision)")
        against = "itself" if ref == v.case_id else labels.get(ref, ref)
        rows.append((v, (labels[v.case_id], against, *peaks,
                         v.quality or "-")))
    return rows


# -- Markdown -------------------------------------------------------------------------------


def _cell(text: object) -> str:
    """Text within a Markdown line or a table cell, recorded or not: it shows as itself."""
    return markdown_text(text, inline=True)


def history_link(dashboard_url: str, case_id: str) -> str:
    """The dashboard's History of one case (the config's `dashboard_url` is validated)."""
    return f"{dashboard_url}/?page=History&case={urllib.parse.quote(case_id, safe='')}"


def _md_case(case_id: str, dashboard_url: str | None, *, in_table: bool = False) -> str:
    code = markdown_code(case_id, in_table=in_table)
    return f"[{code}]({history_link(dashboard_url, case_id)})" if dashboard_url else code


def _md_row(v: Verdict, dashboard_url: str | None = None) -> str:
    cells = [f"{_EMOJI.get(v.kind, '')} {_cell(label(v))}",
             _md_case(v.case_id, dashboard_url, in_table=True),
             *(_cell(c) for c in (v.metric, _value(v, v.baseline_value), _value(v, v.threshold),
                                  _value(v, v.candidate_value), _delta(v), _budget(v)))]
    return "| " + " | ".join(cells) + " |"


_MD_HEAD = ("| verdict | case | metric | baseline | threshold | candidate | delta | budget |\n"
            "|---|---|---|--:|--:|--:|--:|--:|")


def _md_item(v: Verdict, dashboard_url: str | None = None, hint: bool = False) -> str:
    lines = [f"- **{_cell(label(v))}** {_md_case(v.case_id, dashboard_url)}: "
             f"{_cell(v.message)}"]
    lines += [f"  - {_cell(d)}" for d in v.details]
    if hint:
        words, _, command = snapshot_hint(v.case_id).partition(": ")
        lines.append(f"  - {_cell(words)}: {markdown_code(command)}")
    return "\n".join(lines)


def markdown(result: CheckResult, *, limit: int = MARKDOWN_LIMIT,
             dashboard_url: str | None = None) -> str:
    """A compact summary: outcome, blocking items with their arithmetic, warnings, and the
    full table folded in <details>; cut to stay under `limit` bytes. With `dashboard_url`,
    each case links to its History there."""
    verdicts = ordered(result.verdicts)
    blocking = [v for v in verdicts if v.blocking]
    warnings = [v for v in verdicts if not v.blocking and v.kind not in _QUIET]
    accepted = [v for v in verdicts if v.kind == "accepted"]
    others = [v for v in verdicts if not v.blocking and v.kind in ("improvement", "new")]
    icon = "❌" if blocking else "✅"
    head = [f"## {icon} memtrack check: {_cell(summary_line(result))}", "",
            f"{markdown_text(_where(result))} against {markdown_code(result.base_branch)}. "
            f"{_cell(_baseline_line(result))}.", ""]
    if dashboard_url:
        head += [f"Each case links to its history on the [dashboard]({dashboard_url}/).", ""]
    for note in result.notes:
        head += [f"> **Note:** {_cell(note)}", ""]
    if result.budget_changes:
        head.append("**Budget changes in this revision:**")
        head += [f"- {_cell(c.describe())}" for c in result.budget_changes]
        head.append("")
    body: list[str] = []
    hinted = _hinted(blocking)  # under the blocking items only, not again in the full list
    for title, items in (("Blocking", blocking), ("Warnings", warnings),
                         ("Accepted (reviewed in this change)", accepted),
                         ("Improvements and new cases", others)):
        if items:
            body += [f"### {title}", "", _MD_HEAD,
                     *(_md_row(v, dashboard_url) for v in items), ""]
            body += [_md_item(v, dashboard_url, items is blocking and i in hinted)
                     for i, v in enumerate(items)]
            body.append("")
    quality = quality_rows(result)
    if quality:
        body += ["### Quality after a precision change", "",
                 "| " + " | ".join(_QUALITY_COLUMNS) + " |", "|---|---|---|--:|--:|--:|---|"]
        for v, (case, against, *rest) in quality:
            cells = (f"{_EMOJI.get(v.kind, '')} {_cell(label(v))}",
                     markdown_code(case, in_table=True),
                     against if against == "itself" else markdown_code(against, in_table=True),
                     *(_cell(c) for c in rest))
            body.append("| " + " | ".join(cells) + " |")
        body.append("")
    if result.estimates:
        # Small: one line per estimated case, information only.
        body += ["**Estimates** (fake tensors, `memtrack estimate`; not judged):", ""]
        body += [f"- {markdown_code(e.case_id)}: {_cell(e.describe())}"
                 for e in result.estimates[:50]]
        if len(result.estimates) > 50:
            body.append(f"- _{len(result.estimates) - 50} more in the JSON report_")
        body.append("")
    fixed = "\n".join(head + body)
    tail = "</details>\n"
    opening = (f"<details><summary>All {len(verdicts)} verdicts with their arithmetic"
               f"</summary>\n\n{_MD_HEAD}")
    budget = limit - len(fixed.encode()) - len(opening.encode()) - len(tail.encode()) - 200
    rows: list[str] = []
    lines: list[str] = []
    used = 0
    n_shown = 0
    for v in verdicts:
        row, item = _md_row(v, dashboard_url), _md_item(v, dashboard_url)
        size = len(row.encode()) + len(item.encode()) + 2
        if used + size > budget:
            break
        rows.append(row)
        lines.append(item)
        used += size
        n_shown += 1
    details = [opening, *rows, "", *lines, ""]
    if n_shown < len(verdicts):
        details.append(f"_{len(verdicts) - n_shown} more verdicts not shown (size limit); "
                       "see the JSON report or the dashboard._\n")
    text = fixed + "\n" + "\n".join(details) + tail
    if len(text.encode()) > limit:  # the fixed part alone is too big: keep the outcome
        text = "\n".join(head[:3]) + "\n\n_(report cut to the size limit; see the JSON report)_\n"
    return text


# -- JSON ----------------------------------------------------------------------------------


def to_json(result: CheckResult) -> dict[str, Any]:
    """The whole result as plain data, for machines."""
    data = dataclasses.asdict(result)
    data["verdicts"] = [dataclasses.asdict(v) for v in ordered(result.verdicts)]
    data["exit_code"] = result.exit_code
    data["blocking"] = len(result.blocking)
    data["summary"] = summary_line(result)
    data["report_version"] = REPORT_VERSION
    return data


# -- history --------------------------------------------------------------------------------


def history_terminal(h: HistoryResult) -> list[Any]:
    from rich.table import Table

    out: list[Any] = [shown(f"memtrack history · {h.base_branch} · {h.series} series, "
                            f"{h.commits} commits, environment {h.fingerprint[:12]}",
                            style="bold")]
    out += [shown(f"note: {n}", style="yellow") for n in h.notes]
    steps = Table(title="steps: the commits where a series moved", title_justify="left")
    for col in ("case", "metric", "commit", "subject", "before", "after", "delta"):
        steps.add_column(col)
    for s in h.steps:
        steps.add_row(*(shown(c) for c in (
            s.case_id, s.metric, s.commit[:12], (s.subject or "")[:50],
            format_size(int(s.before)), format_size(int(s.after)),
            f"{_signed(s.delta)} ({s.delta_pct:+.2f}%)")))
    out.append(steps if h.steps else shown("steps: none found"))
    creep = Table(title=shown(f"creep against {h.anchor_label}"), title_justify="left")
    for col in ("", "case", "metric", "anchor", "latest", "growth", "allowed", "steps"):
        creep.add_column(col)
    for c in h.creeps:
        creep.add_row(shown(_creep_label(c), style="bold red" if c.flagged else "dim"),
                      *(shown(x) for x in (
                          c.case_id, c.metric,
                          f"{format_size(int(c.anchor_value))} @{c.anchor_commit[:10]}",
                          format_size(int(c.latest_value)),
                          f"{_signed(c.delta)} ({c.delta_pct:+.2f}%)",
                          format_size(int(c.allowed)), str(c.steps_between))))
    out.append(creep if h.creeps else shown("creep: no series reaches back to the anchor"))
    for c in h.creeps:
        if c.flagged:
            out.append(shown(f"{_creep_label(c)} · {c.case_id} · {c.message}", style="red"))
    out.append(shown(_history_summary(h), style="bold red" if h.exit_code else "bold green"))
    return out


def _creep_label(c: Any) -> str:
    """CREEP: grown with no step to blame; GROWTH: grown, and steps explain it."""
    if not c.flagged:
        return "ok"
    return "GROWTH" if c.steps_between else "CREEP"


def _history_summary(h: HistoryResult) -> str:
    flagged = sum(c.flagged for c in h.creeps)
    return (f"{len(h.steps)} step(s), {flagged} series grown past the tolerance since the "
            "anchor")


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + format_size(abs(int(round(x))))


def history_markdown(h: HistoryResult, *, limit: int = MARKDOWN_LIMIT,
                     dashboard_url: str | None = None) -> str:
    flagged = [c for c in h.creeps if c.flagged]
    lines = [f"## {'❌' if flagged else '✅'} memtrack history: {_history_summary(h)}", "",
             f"Base branch {markdown_code(h.base_branch)}, {h.series} series over "
             f"{h.commits} commits; creep against {_cell(h.anchor_label)}.", ""]
    for n in h.notes:
        lines += [f"> **Note:** {_cell(n)}", ""]
    if flagged:
        lines += ["", "### Grown since the anchor", ""] + [
            f"- **{_creep_label(c)}** {_md_case(c.case_id, dashboard_url)} {_cell(c.metric)}: "
            f"{_cell(c.message)}"
            for c in flagged]
    if h.steps:
        lines += ["", "<details><summary>Steps</summary>", "",
                  "| case | metric | commit | subject | before | after | delta |",
                  "|---|---|---|---|--:|--:|--:|"]
        for s in h.steps:
            lines.append(f"| {_md_case(s.case_id, dashboard_url, in_table=True)} | "
                         f"{_cell(s.metric)} | {markdown_code(s.commit[:12], in_table=True)} | "
                         f"{_cell((s.subject or '')[:60])} | {format_size(int(s.before))} | "
                         f"{format_size(int(s.after))} | {_signed(s.delta)} "
                         f"({s.delta_pct:+.2f}%) |")
        lines += ["", "</details>"]
    text = "\n".join(lines) + "\n"
    return text if len(text.encode()) <= limit else text.encode()[:limit - 100].decode(
        "utf-8", "ignore") + "\n\n_(cut to the size limit)_\n"
