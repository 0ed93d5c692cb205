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

_ORDER = {
    "leak": 2,
    "failed": 0,
    "over_budget": 1,
    "regression": 2,
    "quality": 2,
    "noisy": 3,
    "time_regression": 4,
    "environment_changed": 5,
    "removed": 5,
    "abstained": 7,
    "accepted": 6,
    "new": 7,
    "improvement": 8,
    "ok": 9,
}
_STYLE = {
    "leak": "bold red",
    "failed": "bold red",
    "over_budget": "bold red",
    "regression": "bold red",
    "quality": "bold red",
    "noisy": "yellow",
    "time_regression": "yellow",
    "environment_changed": "yellow",
    "removed": "yellow",
    "abstained": "dim",
    "accepted": "magenta",
    "new": "cyan",
    "improvement": "green",
    "ok": "dim",
}
_EMOJI = {
    "leak": "🚰",
    "failed": "💥",
    "over_budget": "⛔",
    "regression": "🔺",
    "quality": "🎯",
    "noisy": "〰️",
    "time_regression": "🐢",
    "environment_changed": "🔀",
    "removed": "➖",
    "abstained": "⏸️",
    "accepted": "☑️",
    "new": "🆕",
    "improvement": "🔻",
    "ok": "✅",
}
_QUIET = ("ok", "improvement", "new", "accepted", "noisy", "abstained")
"""Kinds that are neither blocking nor a warning: counted, not listed. `noisy` is a property
of the case (its headroom too wide to judge a small growth), said once."""
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
    return sorted(
        verdicts, key=lambda v: (not v.blocking, _ORDER.get(v.kind, 9), v.case_id, v.metric)
    )


def label(v: Verdict) -> str:
    """'BLOCK regression', 'warn time regression', 'ok' ..."""
    words = v.kind.replace("_", " ")
    if v.blocking:
        return f"BLOCK {words}"
    if v.kind in _QUIET:
        return words + (" (provisional)" if v.provisional and v.kind != "new" else "")
    if v.context == "base" and _reported(v):
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
    magnitude = (
        format_seconds(abs(v.delta))
        if v.metric == "time"
        else format_size(abs(int(round(v.delta))))
    )
    pct = f" ({v.delta_pct:+.2f}%)" if v.delta_pct is not None else ""
    return f"{sign}{magnitude}{pct}"


def _budget(v: Verdict) -> str:
    if v.budget_bytes is None:
        return "-"
    if v.candidate_value is None:
        return format_size(v.budget_bytes)
    margin = v.budget_bytes - int(v.candidate_value)
    return (
        f"{format_size(v.budget_bytes)} ({'margin ' if margin >= 0 else 'over '}"
        f"{format_size(abs(margin))})"
    )


def summary_line(result: CheckResult) -> str:
    counts: dict[str, int] = {}
    for v in result.verdicts:
        counts[v.kind] = counts.get(v.kind, 0) + 1
    parts = ", ".join(
        f"{n} {k.replace('_', ' ')}"
        for k, n in sorted(counts.items(), key=lambda kv: _ORDER.get(kv[0], 9))
    )
    blocking = result.blocking
    if result.estimate_only:
        return (
            f"estimate run: nothing measured, nothing judged "
            f"({len(result.estimates)} case(s) estimated)"
        )
    if result.context == "base":
        regressed = sum(_reported(v) for v in result.verdicts)
        opened = len(result.open_regressions)
        head = (
            f"base branch: {regressed} regression{'s' * (regressed != 1)} reported"
            if regressed
            else "base branch: no new regression"
        )
        if opened:
            head += f", {opened} still open (not fixed or accepted)"
        head += " (never blocking)" if regressed or opened else ""
    else:
        head = (
            f"BLOCKED: {len(blocking)} blocking verdict{'s' * (len(blocking) != 1)}"
            if blocking
            else "passed: nothing blocks"
        )
    changed = "".join(f"; {c}" for c in param_changes(result))
    return f"{head} ({parts or 'no verdicts'}){changed}"


def param_changes(result: CheckResult, but: str | None = None) -> list[str]:
    """'vit_infer batch 16 -> 32: allocated +44.00 MiB (+44.00%)': each case whose params
    changed (but case `but`), against the case it replaced, by its first memory figure."""
    out, seen = [], {but}
    for v in result.verdicts:
        key = v.case_id
        if v.param_change is None or v.metric in ("status", "time") or key in seen:
            continue
        seen.add(key)
        out.append(f"{v.workload} {v.param_change}: {v.metric} {_delta(v)}")
    return out


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
    return (
        f"baseline: runs on {result.base_branch} {how}, same environment "
        f"({result.fingerprint[:12]})"
    )


# -- terminal -------------------------------------------------------------------------------


def shown(text: str, style: str = "") -> Any:
    """A rich Text of recorded text, its control characters made visible, never acting."""
    from rich.text import Text

    return Text(terminal_text(text), style=style)


def _counted(verdicts: list[Verdict], listed: list[Verdict]) -> str:
    """The verdicts left out of the table, counted by kind."""
    kinds: dict[str, int] = {}
    ids = {id(v) for v in listed}
    for v in verdicts:
        if id(v) not in ids:
            kinds[v.kind] = kinds.get(v.kind, 0) + 1
    counts = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    what = "nothing blocks or warns" if not listed else "not in the table"
    return f"{counts}: {what}; each has its line below"


def terminal(result: CheckResult) -> list[Any]:
    """Rich renderables: header, a table of what blocks or warns (the other verdicts
    counted), one arithmetic line per verdict, the outcome."""
    from rich.table import Table

    out: list[Any] = [
        shown(f"memtrack check · {_where(result)} against {result.base_branch}", style="bold"),
        shown(_baseline_line(result)),
    ]
    for note in result.notes:
        out.append(shown(f"note: {note}", style="yellow"))
    for change in result.budget_changes:
        out.append(shown(change.describe(), style="magenta"))
    verdicts = ordered(result.verdicts)
    t = Table(title_justify="left")
    for col in (
        "verdict",
        "case",
        "metric",
        "baseline",
        "threshold",
        "candidate",
        "delta",
        "budget",
    ):
        t.add_column(
            col,
            justify="right"
            if col in ("baseline", "threshold", "candidate", "delta", "budget")
            else "left",
        )
    labels = short_case_labels(v.case_id for v in verdicts)  # full ids in the lines below
    listed = _listed(result, verdicts)
    for v in listed:
        cells = (
            labels[v.case_id],
            v.metric,
            _value(v, v.baseline_value),
            _value(v, v.threshold),
            _value(v, v.candidate_value),
            _delta(v),
            _budget(v),
        )
        # Text, not str: case ids like 'w[batch=8]' would be read as rich markup.
        t.add_row(shown(label(v), style=_STYLE.get(v.kind, "")), *(shown(c) for c in cells))
    if not result.estimate_only:
        if listed:
            out.append(t)
        if len(listed) < len(verdicts):
            out.append(shown(_counted(verdicts, listed), style="dim"))
    hinted = _hinted(verdicts)
    for i, v in enumerate(verdicts):
        out.append(
            shown(
                f"{label(v)} · {v.case_id} · {v.message}",
                style=_STYLE.get(v.kind, "") if v.kind != "ok" else "",
            )
        )
        for line in v.details:
            out.append(shown(f"    {line}", style="dim"))
        if i in hinted:
            out.append(shown(f"    {snapshot_hint(v.case_id)}"))
    for o in result.open_regressions:
        fixed = "; this run is back within it" if o.fixed_here else ""
        out.append(
            shown(
                f"OPEN on {result.base_branch} · {o.case_id} · {o.describe()}: not "
                f"fixed or accepted, reported until it is (never blocking){fixed}",
                style="yellow",
            )
        )
    noisy = [v for v in verdicts if v.kind == "noisy" and not v.blocking]
    if noisy:
        out.append(
            shown(
                "noisy, a property of the case and not of this change: a growth "
                + ", ".join(
                    f"under {format_size(int(_room(v)))} of {labels[v.case_id]} {v.metric}"
                    for v in noisy
                )
                + " cannot be told from its noise",
                style="dim",
            )
        )
    rows = quality_rows(result)
    if rows:
        q = Table(
            title=quality_title(result).lower()[:1] + quality_title(result)[1:],
            title_justify="left",
        )
        for col in _QUALITY_COLUMNS:
            q.add_column(
                col,
                justify="right" if col in ("framework peak", "full precision", "saved") else "left",
            )
        for v, row in rows:
            q.add_row(shown(label(v), style=_STYLE.get(v.kind, "")), *(shown(c) for c in row))
        out.append(q)
    for e in result.estimates:
        out.append(shown(f"estimate · {e.case_id} · {e.describe()}", style="cyan"))
    out.append(shown(summary_line(result), style="bold red" if result.blocking else "bold green"))
    return out


# -- quality --------------------------------------------------------------------------------

_QUALITY_COLUMNS = (
    "verdict",
    "case",
    "against",
    "framework peak",
    "full precision",
    "saved",
    "quality",
)


def quality_title(result: CheckResult) -> str:
    """The quality table's title, as its rows read: kept, broken, or not compared yet."""
    from memtrack.judge.quality import missing_reference

    vs = [v for v in result.verdicts if v.metric == "quality"]
    broken = sum(v.kind == "quality" and not missing_reference(v) for v in vs)
    missing = sum(missing_reference(v) for v in vs)
    kept = len(vs) - broken - missing
    if not broken and not missing:
        words = "memory saved and quality kept"
    else:
        parts = [
            f"{broken} beyond tolerance" if broken else "",
            f"{missing} without a reference yet" if missing else "",
            f"{kept} kept" if kept else "",
        ]
        words = ", ".join(p for p in parts if p)
    return f"Quality after a precision change: {words}"


def quality_rows(result: CheckResult) -> list[tuple[Verdict, tuple[str, ...]]]:
    """One row per quality verdict: the case, its reference, its framework peak against the
    full-precision sibling's in the same run, what that saves, and the quality kept."""
    from memtrack.judge.quality import precision_change

    rows: list[tuple[Verdict, tuple[str, ...]]] = []
    verdicts = ordered([v for v in result.verdicts if v.metric == "quality"])
    labels = short_case_labels(
        [*{v.case_id for v in verdicts}, *{v.reference for v in verdicts if v.reference}]
    )
    for v in verdicts:
        ref = v.reference or "-"
        changed = v.reference is not None and precision_change(v.case_id, v.reference)
        if v.baseline_value is not None and v.candidate_value is not None:
            full, own = int(v.baseline_value), int(v.candidate_value)
            saved = full - own
            pct = 100.0 * saved / full if full else 0.0
            saved_text = (
                f"{format_size(saved)} ({pct:.1f}%)"
                if saved >= 0
                else f"none: {format_size(-saved)} more"
            )
            peaks: tuple[str, ...] = (format_size(own), format_size(full), saved_text)
        else:
            peaks = ("-", "-", "-" if changed else "(full precision)")
        against = "itself" if ref == v.case_id else labels.get(ref, ref)
        rows.append((v, (labels[v.case_id], against, *peaks, v.quality or "-")))
    return rows


# -- Markdown -------------------------------------------------------------------------------

TABLE_ROWS = 12
"""Rows of what blocks or warns shown above the fold; the rest are counted there, listed in
the folded arithmetic."""
_WORD = {
    "regression": "regression",
    "over_budget": "over budget",
    "failed": "failed",
    "quality": "quality",
    "time_regression": "slower",
    "environment_changed": "env. changed",
    "removed": "removed",
    "leak": "leak",
    "abstained": "time not judged",
    "noisy": "noisy",
    "accepted": "accepted",
    "new": "new",
    "improvement": "improvement",
    "ok": "ok",
}


def _cell(text: object) -> str:
    """Text within a Markdown line or a table cell, recorded or not: it shows as itself."""
    return markdown_text(text, inline=True)


def _link_text(text: str) -> str:
    """Text for inside a Markdown link: brackets and what ends a table cell escaped (as
    markdown_text escapes them everywhere)."""
    return _cell(text)


def _page(dashboard_url: str, **query: str) -> str:
    return f"{dashboard_url}/?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}"


def history_link(dashboard_url: str, case_id: str) -> str:
    """The dashboard's History of one case (the config's `dashboard_url` is validated)."""
    return _page(dashboard_url, page="History", case=case_id)


def run_link(dashboard_url: str, run_id: str) -> str:
    """The dashboard's Run detail of one run: its verdicts, and a banner where it blocks."""
    return _page(dashboard_url, page="Run detail", run=run_id)


def compare_link(dashboard_url: str, b: str, a: str | None = None) -> str:
    """The dashboard's Compare of run `b` against `a` (a run id or commit; without it, the
    newest base-branch run before b)."""
    return _page(dashboard_url, page="Compare", **({"a": a} if a else {}), b=b)


def _md_case(case_id: str, dashboard_url: str | None, labels: dict[str, str] | None = None) -> str:
    """A case as its short label (its full id without `labels`), linked to its History."""
    text = (labels or {}).get(case_id, case_id)
    if dashboard_url:
        return f"[{_link_text(text)}]({history_link(dashboard_url, case_id)})"
    return markdown_code(text, in_table=True) if labels is None else _link_text(text)


def _short_delta(v: Verdict) -> str:
    """'+2.00 MiB (+17.1%)': one decimal, to keep the table narrow."""
    if v.delta is None:
        return "-"
    sign = "+" if v.delta >= 0 else "-"
    magnitude = (
        format_seconds(abs(v.delta))
        if v.metric == "time"
        else format_size(abs(int(round(v.delta))))
    )
    pct = f" ({v.delta_pct:+.1f}%)" if v.delta_pct is not None else ""
    return f"{sign}{magnitude}{pct}"


def _limit(v: Verdict) -> str:
    """What a candidate had to stay under: the budget it broke, else the threshold as the
    headroom above the baseline ('+512 B': two sizes that round alike never hide it)."""
    if v.kind == "over_budget" and v.budget_bytes is not None:
        return f"{format_size(v.budget_bytes)} budget"
    if v.threshold is None or v.baseline_value is None:
        return _value(v, v.threshold)
    room = v.threshold - v.baseline_value
    return "+" + (format_seconds(room) if v.metric == "time" else format_size(int(room)))


def _md_row(v: Verdict, dashboard_url: str | None, labels: dict[str, str]) -> str:
    candidate = (
        _value(v, v.candidate_value)
        if v.candidate_value is not None
        else v.message.split(":", 1)[1].split(";")[0].strip()[:24]
        if v.kind == "failed"
        else "-"
    )
    # the case is escaped by _md_case, the figures are memtrack's own; the rest is recorded
    cells = [
        _EMOJI.get(v.kind, v.kind),
        _md_case(v.case_id, dashboard_url, labels),
        _cell(v.metric),
        _value(v, v.baseline_value),
        _cell(candidate),
        _short_delta(v),
        _limit(v),
    ]
    return "| " + " | ".join(cells) + " |"


_MD_HEAD = (
    "| | case | metric | baseline | candidate | delta | threshold |\n|---|---|---|--:|--:|--:|--:|"
)


def _md_item(v: Verdict, labels: dict[str, str], hint: bool = False) -> str:
    name = labels.get(v.case_id, v.case_id)
    full = f" ({markdown_code(v.case_id)})" if name != v.case_id else ""
    lines = [f"- **{_cell(label(v))}** {markdown_code(name)}{full}: {_cell(v.message)}"]
    lines += [f"  - {_cell(d)}" for d in v.details]
    if hint:
        words, _, command = snapshot_hint(v.case_id).partition(": ")
        lines.append(f"  - {_cell(words)}: {markdown_code(command)}")
    return "\n".join(lines)


def _what(v: Verdict, labels: dict[str, str]) -> str:
    """One blocking item in words: 'decoder[sessions=4] allocated +2.00 MiB (+17.1%),
    caches grew'."""
    name = markdown_code(labels.get(v.case_id, v.case_id))
    if v.param_change:  # a renamed series: what changed says more than the new name
        name = f"{markdown_code(v.workload)} {_cell(v.param_change)}:"
    if v.kind == "failed":
        return f"{name} failed ({_cell(v.message.split(':', 1)[1].split(';')[0].strip()[:40])})"
    if v.kind == "over_budget" and v.budget_bytes is not None:
        return (
            f"{name} {v.metric} {_value(v, v.candidate_value)} over its "
            f"{format_size(v.budget_bytes)} budget"
        )
    if v.kind == "quality":
        return f"{name} quality beyond its tolerance"
    if v.kind == "leak":
        return f"{name} leaks {_value(v, v.candidate_value)} per iteration"
    grew = f", {v.component} grew" if v.component else ""
    return f"{name} {v.metric} {_short_delta(v)}{grew}"


def _outcome(result: CheckResult, shown: list[Verdict], labels: dict[str, str]) -> str:
    blocking = [v for v in shown if v.blocking]
    warnings = [v for v in shown if not v.blocking]
    if result.estimate_only:
        return f"ℹ️ memtrack: {summary_line(result)}"
    if result.context == "base":
        found = [v for v in shown if _reported(v)]
        opened = len(result.open_regressions)
        parts = (
            [
                f"{len(found)} regression{'s' * (len(found) != 1)} found here: "
                + "; ".join(_what(v, labels) for v in found[:2])
                + (f" and {len(found) - 2} more" if len(found) > 2 else "")
            ]
            if found
            else ["no new regression"]
        )
        if opened:
            parts.append(f"{opened} still open")
        icon = "📌" if found or opened else "✅"
        return (
            f"{icon} memtrack on {_cell(result.base_branch)}: {'; '.join(parts)} (never blocking)"
        )
    named = blocking[0].case_id if blocking else None
    changed = "".join(f"; {_cell(c)}" for c in param_changes(result, but=named))
    if blocking:
        more = f" and {len(blocking) - 1} more" if len(blocking) > 1 else ""
        return f"❌ memtrack: blocked by {_what(blocking[0], labels)}{more}{changed}"
    tail = f"; {len(warnings)} warning{'s' * (len(warnings) != 1)}" if warnings else ""
    return f"✅ memtrack: nothing blocks{tail}{changed}"


def _listed(result: CheckResult, verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts a reviewer must read (what blocks or warns); the others are counted."""
    return [
        v
        for v in verdicts
        if v.blocking or v.kind not in _QUIET or (result.context == "base" and _reported(v))
    ]


def _reported(v: Verdict) -> bool:
    """On the base branch: what would have blocked a pull request."""
    from memtrack.judge.quality import missing_reference

    return v.kind in (
        "regression",
        "over_budget",
        "failed",
        "quality",
        "leak",
    ) and not missing_reference(v)


def _counts(verdicts: list[Verdict]) -> str:
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.kind] = counts.get(v.kind, 0) + 1
    return " · ".join(
        f"{_EMOJI.get(k, '')} {n} {_WORD.get(k, k)}"
        for k, n in sorted(counts.items(), key=lambda kv: _ORDER.get(kv[0], 9))
    )


def _room(v: Verdict) -> float:
    """The headroom a verdict allowed: threshold less baseline."""
    return (v.threshold or 0.0) - (v.baseline_value or 0.0)


def _noisy_line(v: Verdict, labels: dict[str, str]) -> str:
    room = _room(v)
    pct = f" ({100 * room / v.baseline_value:.0f}% of it)" if v.baseline_value else ""
    tip = v.message.split("to sharpen it: ", 1)[-1] if "to sharpen it: " in v.message else ""
    tip = tip.split("; budget ", 1)[0]  # the budget's own part is the arithmetic's
    return (
        f"- {markdown_code(labels.get(v.case_id, v.case_id))} {v.metric}: a growth under "
        f"{format_size(int(room))}{pct} cannot be told from its noise"
        + (f"; to sharpen it: {_cell(tip)}" if tip else "")
    )


def _folded(summary: str, lines: list[str]) -> list[str]:
    return [f"<details><summary>{summary}</summary>", "", *lines, "", "</details>", ""]


def markdown(
    result: CheckResult, *, limit: int = MARKDOWN_LIMIT, dashboard_url: str | None = None
) -> str:
    """What a reviewer reads in ten seconds: one line of outcome, links to the run and to a
    Compare with its merge-base (with `dashboard_url`), a short table of what blocks or
    warns, every other verdict counted, the base branch's open regressions, and the rest
    folded: noise (a property of a case, said once), the arithmetic, notes, quality and
    estimates. Cut to stay under `limit` bytes."""
    verdicts = ordered(result.verdicts)
    shown = _listed(result, verdicts)
    listed = {id(v) for v in shown}  # by identity: comparing verdicts field by field is n²
    quiet = [v for v in verdicts if id(v) not in listed]
    noisy = [v for v in quiet if v.kind == "noisy"]
    labels = short_case_labels(
        [*(v.case_id for v in verdicts), *(o.case_id for o in result.open_regressions)]
    )
    head = [f"### {_outcome(result, shown, labels)}", ""]
    where = f"{_cell(_where(result))} against {markdown_code(result.base_branch)}"
    if dashboard_url:
        links = [f"[run detail]({run_link(dashboard_url, result.run_id)})"]
        if result.context != "base" and result.merge_base:
            links.append(
                f"[compare with the merge-base {result.merge_base[:10]}]"
                f"({compare_link(dashboard_url, result.run_id, result.merge_base)})"
            )
        elif result.context == "base":
            links.append(
                f"[compare with the previous run]({compare_link(dashboard_url, result.run_id)})"
            )
        where += " · " + " · ".join(links)
    head += [where, ""]
    body: list[str] = []
    if shown:
        body += [_MD_HEAD, *(_md_row(v, dashboard_url, labels) for v in shown[:TABLE_ROWS])]
        if len(shown) > TABLE_ROWS:
            body.append(f"| | _{len(shown) - TABLE_ROWS} more in the arithmetic below_ | | | | | |")
        # The first column is an emoji, which keeps the table within a comment's width
        # (760 px unwrapped for the shipped suite); this line says what each one is.
        kinds = dict.fromkeys(v.kind for v in shown[:TABLE_ROWS])

        def said(k: str) -> str:
            if result.context == "base":
                return "reported"
            return "blocks" if any(v.blocking for v in shown if v.kind == k) else "warns"

        body += [
            "",
            " · ".join(f"{_EMOJI.get(k, k)} {_WORD.get(k, k)}: {said(k)}" for k in kinds),
            "",
        ]
    if quiet:
        body += [f"Not listed: {_counts(quiet)}.", ""]
    if result.open_regressions:
        where_open = "" if result.context == "base" else ", not caused here"
        body.append(
            f"**Open on {_cell(result.base_branch)}{where_open}** (until fixed or accepted):"
        )
        for o in result.open_regressions[:3]:
            fixed = " — this change is back within it" if o.fixed_here else ""
            body.append(
                f"- {markdown_code(labels.get(o.case_id, o.case_id))} {_cell(o.describe())}{fixed}"
            )
        if len(result.open_regressions) > 3:
            body.append(f"- and {len(result.open_regressions) - 3} more (see the JSON report)")
        body.append("")
    if result.budget_changes:
        body.append("**Budget changes in this revision:**")
        body += [f"- {_cell(c.describe())}" for c in result.budget_changes]
        body.append("")
    if noisy:
        body += _folded(
            f"〰️ {len(noisy)} figure{'s' * (len(noisy) != 1)} too noisy to judge "
            "a small growth: a property of the case, not of this change",
            [_noisy_line(v, labels) for v in noisy],
        )
    hinted = _hinted(shown)
    items = [_md_item(v, labels, i in hinted) for i, v in enumerate(shown)]
    if items:
        what = "blocks or warns" if result.context != "base" else "is reported"
        body += _folded(
            f"The arithmetic of what {what} ({len(items)})",
            [f"{_baseline_line(result)}.", "", *items],
        )
    if result.notes:
        body += _folded(f"Notes ({len(result.notes)})", [f"- {_cell(n)}" for n in result.notes])
    quality = quality_rows(result)
    if quality:
        rows = ["| " + " | ".join(_QUALITY_COLUMNS) + " |", "|---|---|---|--:|--:|--:|---|"]
        for v, (case, against, *rest) in quality:
            cells = (
                f"{_EMOJI.get(v.kind, '')} {_cell(label(v))}",
                markdown_code(case, in_table=True),
                against if against == "itself" else markdown_code(against, in_table=True),
                *(_cell(c) for c in rest),
            )
            rows.append("| " + " | ".join(cells) + " |")
        body += _folded(quality_title(result), rows)
    if result.estimates:
        est = [
            f"- {markdown_code(e.case_id)}: {_cell(e.describe())}" for e in result.estimates[:50]
        ]
        if len(result.estimates) > 50:
            est.append(f"- _{len(result.estimates) - 50} more in the JSON report_")
        body += _folded(f"Estimates ({len(result.estimates)}, fake tensors, not judged)", est)
    text = "\n".join(head + body).rstrip() + "\n"
    if len(text.encode()) > limit:  # keep the outcome and the table, cut the folded rest
        kept = "\n".join(head + body[: body.index("") + 1] if shown else head)
        text = kept + "\n_(report cut to the size limit; see the JSON report)_\n"
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

    out: list[Any] = [
        shown(
            f"memtrack history · {h.base_branch} · {h.series} series, "
            f"{h.commits} commits, environment {h.fingerprint[:12]}",
            style="bold",
        )
    ]
    out += [shown(f"note: {n}", style="yellow") for n in h.notes]
    steps = Table(title="steps: the commits where a series moved", title_justify="left")
    for col in ("case", "metric", "commit", "subject", "before", "after", "delta"):
        steps.add_column(col)
    for s in h.steps:
        steps.add_row(
            *(
                shown(c)
                for c in (
                    s.case_id,
                    s.metric,
                    s.commit[:12],
                    (s.subject or "")[:50],
                    format_size(int(s.before)),
                    format_size(int(s.after)),
                    f"{_signed(s.delta)} ({s.delta_pct:+.2f}%)",
                )
            )
        )
    out.append(steps if h.steps else shown("steps: none found"))
    creep = Table(title=shown(f"creep against {h.anchor_label}"), title_justify="left")
    for col in ("", "case", "metric", "anchor", "latest", "growth", "allowed", "steps"):
        creep.add_column(col)
    for c in h.creeps:
        creep.add_row(
            shown(_creep_label(c), style="bold red" if c.flagged else "dim"),
            *(
                shown(x)
                for x in (
                    c.case_id,
                    c.metric,
                    f"{format_size(int(c.anchor_value))} @{c.anchor_commit[:10]}",
                    format_size(int(c.latest_value)),
                    f"{_signed(c.delta)} ({c.delta_pct:+.2f}%)",
                    format_size(int(c.allowed)),
                    str(c.steps_between),
                )
            ),
        )
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
    return f"{len(h.steps)} step(s), {flagged} series grown past the tolerance since the anchor"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + format_size(abs(int(round(x))))


def history_markdown(
    h: HistoryResult, *, limit: int = MARKDOWN_LIMIT, dashboard_url: str | None = None
) -> str:
    flagged = [c for c in h.creeps if c.flagged]
    lines = [
        f"## {'❌' if flagged else '✅'} memtrack history: {_history_summary(h)}",
        "",
        f"Base branch {markdown_code(h.base_branch)}, {h.series} series over "
        f"{h.commits} commits; creep against {_cell(h.anchor_label)}.",
        "",
    ]
    for n in h.notes:
        lines += [f"> **Note:** {_cell(n)}", ""]
    if flagged:
        lines += ["", "### Grown since the anchor", ""] + [
            f"- **{_creep_label(c)}** {_md_case(c.case_id, dashboard_url)} {_cell(c.metric)}: "
            f"{_cell(c.message)}"
            for c in flagged
        ]
    if h.steps:
        lines += [
            "",
            "<details><summary>Steps</summary>",
            "",
            "| case | metric | commit | subject | before | after | delta |",
            "|---|---|---|---|--:|--:|--:|",
        ]
        for s in h.steps:
            lines.append(
                f"| {_md_case(s.case_id, dashboard_url)} | "
                f"{_cell(s.metric)} | {markdown_code(s.commit[:12], in_table=True)} | "
                f"{_cell((s.subject or '')[:60])} | {format_size(int(s.before))} | "
                f"{format_size(int(s.after))} | {_signed(s.delta)} "
                f"({s.delta_pct:+.2f}%) |"
            )
        lines += ["", "</details>"]
    text = "\n".join(lines) + "\n"
    return (
        text
        if len(text.encode()) <= limit
        else text.encode()[: limit - 100].decode("utf-8", "ignore")
        + "\n\n_(cut to the size limit)_\n"
    )
