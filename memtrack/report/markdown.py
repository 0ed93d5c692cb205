"""A check as Markdown: the pull request's comment and the job summary.

It formats the rows of `memtrack.report.rows` (what is listed, counted and hinted is decided
there): one line of outcome, links to the dashboard, a short table of what blocks or warns,
the rest counted, and the details folded. Everything recorded is escaped to show as itself.
"""

from __future__ import annotations

import urllib.parse

from memtrack.escape import markdown_code, markdown_text
from memtrack.judge.decide import CheckResult
from memtrack.judge.verdict import Headroom, Verdict
from memtrack.judge.where import Change, Where, each, shown_line
from memtrack.records import metrics, pair_parts
from memtrack.report import words
from memtrack.report.rows import (
    EMOJI,
    QUALITY_COLUMNS,
    WORD,
    CheckRows,
    Row,
    baseline_line,
    check_rows,
    counts,
    found_words,
    known_failures,
    label,
    param_changes,
    quality_title,
    snapshot_command,
    snapshot_words,
    summary_line,
    value,
    where,
)
from memtrack.units import format_size

MARKDOWN_LIMIT = 1_000_000
"""GitHub refuses a job summary over 1 MiB; stay clearly below it."""
TABLE_ROWS = 12
"""Rows of what blocks or warns shown above the fold; the rest are counted there, listed in
the folded arithmetic."""
WHAT_FAILED = 40
"""Characters of a failure's reason in the outcome line."""
_MD_HEAD = (
    "| | case | metric | baseline | candidate | delta | threshold |\n|---|---|---|--:|--:|--:|--:|"
)
"""The threshold is shown as the terminal shows it (rows.limit): the growth the headroom
allows over the baseline ('+512 B', where two sizes that round alike would hide it), or
the budget broken ('40.00 MiB budget')."""
ACCEPTED_SHOWN = 3
"""Acceptances (a trailer's reason and what it accepted) said above the fold."""


def cell(text: object) -> str:
    """Text within a Markdown line or a table cell, recorded or not: it shows as itself."""
    return markdown_text(text, inline=True)


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


def case_link(case_id: str, dashboard_url: str | None, text: str | None = None) -> str:
    """A case as `text` (its short label; its full id without one), linked to its History.
    Brackets and what ends a table cell are escaped inside the link, as everywhere."""
    if dashboard_url:
        return f"[{cell(text or case_id)}]({history_link(dashboard_url, case_id)})"
    return markdown_code(case_id, in_table=True) if text is None else cell(text)


def _row(r: Row, dashboard_url: str | None) -> str:
    # the case is escaped by case_link, the figures are memtrack's own; the rest is recorded
    cells = [
        r.emoji,
        case_link(r.verdict.case_id, dashboard_url, r.case),
        cell(r.verdict.metric),
        r.baseline,
        cell(r.outcome),
        r.short_delta,
        r.limit,
    ]
    return "| " + " | ".join(cells) + " |"


def _item(r: Row) -> str:
    """A verdict's arithmetic, its further lines and the snapshot hint, as a list item."""
    v = r.verdict
    full = f" ({markdown_code(v.case_id)})" if r.case != v.case_id else ""
    text = words.message(v)
    lines = [f"- **{cell(r.label)}** {markdown_code(r.case)}{full}: {_with_where(v, text)}"]
    lines += [f"  - {_with_where(v, d)}" for d in words.details(v)]
    if r.hint:
        command = markdown_code(snapshot_command(v.case_id))
        lines.append(f"  - {cell(snapshot_words(v.case_id))}: {command}")
    return "\n".join(lines)


def _what(r: Row) -> str:
    """One blocking item in words: 'decoder[sessions=4] allocated +2.00 MiB (+17.1%),
    caches grew'."""
    v = r.verdict
    name = markdown_code(r.case)
    if v.rename:  # a renamed series: what changed says more than the new name
        name = f"{markdown_code(v.workload)} {cell(v.rename.change)}:"
    if v.kind == "failed":
        return f"{name} failed ({cell((words.failure(v) or '')[:WHAT_FAILED])})"
    if v.kind == "over_budget" and v.budget_bytes is not None:
        return (
            f"{name} {v.metric} {value(v, v.candidate_value)} over its "
            f"{format_size(v.budget_bytes)} budget"
        )
    if v.kind == "quality":
        return f"{name} quality beyond its tolerance"
    if v.kind == "leak":
        return f"{name} leaks {value(v, v.candidate_value)} per iteration"
    component = v.why.component if isinstance(v.why, Headroom) else None
    grew = f", {component} grew" if component else ""
    return f"{name} {v.metric} {r.short_delta}{grew}"


def _outcome(s: CheckRows) -> str:
    result, listed = s.result, s.listed
    blocking = [r for r in listed if r.verdict.blocking]
    warnings = [r for r in listed if not r.verdict.blocking]
    if result.estimate_only:
        return f"ℹ️ memtrack: {summary_line(result)}"
    if result.context == "base":
        found = [r for r in listed if r.reported]
        opened = len(result.open_regressions)
        parts = (
            [
                f"{found_words([r.verdict for r in found])} found here: "
                + "; ".join(_what(r) for r in found[:2])
                + (f"; {len(found) - 2} more" if len(found) > 2 else "")
            ]
            if found
            else ["no new regression"]
        )
        if opened:
            parts.append(f"{opened} still open")
        icon = "📌" if found or opened else "✅"
        return f"{icon} memtrack on {cell(result.base_branch)}: {'; '.join(parts)} (never blocking)"
    named = blocking[0].verdict.case_id if blocking else None
    changed = "".join(f"; {cell(c)}" for c in param_changes(result, but=named))
    not_gated = known_failures(result, lambda c: markdown_code(c))
    changed += f"; not gated: {not_gated}" if not_gated else ""
    if blocking:
        n = len(blocking) - 1
        # said apart from the first one's words, which may end in what grew
        more = f"; {n} more verdict{'s' * (n != 1)} block{'s' * (n == 1)}" if n else ""
        return f"❌ memtrack: blocked by {_what(blocking[0])}{more}{changed}"
    tail = f"; {len(warnings)} warning{'s' * (len(warnings) != 1)}" if warnings else ""
    return f"✅ memtrack: nothing blocks{tail}{changed}"


def _accepted(s: CheckRows) -> list[str]:
    """What the change's trailers accepted, each trailer once: its reason, its commit, and
    the cases and metrics it let through (a few; the rest are counted)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in s.accepted:
        v = r.verdict
        a = v.acceptance
        groups.setdefault((a.reason if a else "", a.commit if a else ""), []).append(r)
    lines = []
    for (reason, commit), rows in list(groups.items())[:ACCEPTED_SHOWN]:
        by_case: dict[str, list[str]] = {}
        for r in rows:
            by_case.setdefault(r.case, []).append(f"{cell(r.verdict.metric)} {r.short_delta}")
        what = " · ".join(
            f"{markdown_code(case)} {', '.join(items)}" for case, items in list(by_case.items())[:4]
        )
        more = len(by_case) - 4
        what += f" and {more} more case{'s' * (more != 1)}" if more > 0 else ""
        where = f" (commit {markdown_code(commit[:12])})" if commit else ""
        lines.append(f"- {EMOJI['accepted']} **accepted**{where}: {cell(reason)} — {what}")
    if len(groups) > ACCEPTED_SHOWN:
        lines.append(f"- and {len(groups) - ACCEPTED_SHOWN} more acceptances in the arithmetic")
    return [*lines, ""] if lines else []


def _noisy_line(r: Row) -> str:
    v = r.verdict
    room = v.room or 0.0
    pct = f" ({100 * room / v.baseline_value:.0f}% of it)" if v.baseline_value else ""
    return (
        f"- {markdown_code(r.case)} {v.metric}: a growth under "
        f"{format_size(int(room))}{pct} cannot be told from its noise"
        + (f"; to sharpen it: {cell(words.sharpen(v))}" if words.sharpen(v) else "")
    )


def _folded(summary: str, lines: list[str]) -> list[str]:
    return [f"<details><summary>{summary}</summary>", "", *lines, "", "</details>", ""]


def _head(s: CheckRows, dashboard_url: str | None) -> list[str]:
    """The outcome, where the run is, and the links to the dashboard."""
    result = s.result
    line = f"{cell(where(result))} against {markdown_code(result.base_branch)}"
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
        line += " · " + " · ".join(links)
    return [f"### {_outcome(s)}", "", line, ""]


def _table(s: CheckRows, dashboard_url: str | None) -> list[str]:
    """What blocks or warns, its first TABLE_ROWS rows, and what each emoji is."""
    listed = s.listed
    if not listed:
        return []
    body = [_MD_HEAD, *(_row(r, dashboard_url) for r in listed[:TABLE_ROWS])]
    if len(listed) > TABLE_ROWS:
        body.append(f"| | _{len(listed) - TABLE_ROWS} more in the arithmetic below_ | | | | | |")
    # The first column is an emoji, which keeps the table within a comment's width
    # (760 px unwrapped for the shipped suite); this line says what each one is.
    shown: dict[str, Row] = {}
    for r in listed[:TABLE_ROWS]:
        shown.setdefault(r.emoji, r)
    legend = (f"{mark} {r.word}: {s.says(r)}" for mark, r in shown.items())
    return [*body, "", " · ".join(legend), ""]


ALLOCATOR_WHERE = {
    "outside": "outside the caching allocator (the CUDA context, cuBLAS/cuDNN workspaces, "
    "NCCL's buffers, other libraries)",
    "fragmentation": "reserved beyond what is allocated (segments' free parts, rounding, "
    "cached blocks)",
}
"""Where the allocator's two views beside the device view grew, in words."""


def _with_where(v: Verdict, text: str) -> str:
    """`text` as a cell, its where-line (the verdict's own words for `v.where`) written as
    Markdown: module paths in code spans, not in escaped backticks."""
    if v.where is None or v.where.text() not in text:
        return cell(text)
    w = v.where
    said = f"+{format_size(w.grew)} {w.what}: {', '.join(w.parts(lambda c: _site(c, None)))}"
    return said.join(cell(part) for part in text.split(w.text()))


def _where_lines(s: CheckRows, source_url: str | None) -> list[str]:
    """Where each blocking case grew at its peak, one line per case: the pairs that grew
    most, each file linked at the candidate's commit where `source_url` is known."""
    cases: dict[tuple[str, str], tuple[Where, list[str]]] = {}
    lines = []
    for r in s.listed:
        v = r.verdict
        if v.blocking and v.where is not None:  # by site, or the tree's by process
            cases.setdefault((r.case, v.where.text()), (v.where, []))[1].append(v.metric)
        elif v.blocking and v.metric in metrics.ALLOCATOR_VIEWS and v.delta:
            lines.append(
                f"- 📍 {markdown_code(r.case)} {cell(v.metric)}: +{format_size(int(v.delta))} "
                f"{cell(ALLOCATOR_WHERE[v.metric])}"
            )
    for (case, _), (w, grown) in cases.items():
        parts = w.parts(lambda c: _site(c, source_url))
        lines.append(
            f"- 📍 {markdown_code(case)} {cell('/'.join(grown))}: "
            f"+{format_size(w.grew)} {w.what}, {', '.join(parts)}"
        )
    return [*lines, ""] if lines else []


def _site(c: Change, source_url: str | None) -> str:
    """A pair in words, its file linked at the commit: only a relative path inside the
    repository, since a recorded name is never trusted into a link."""
    if c.grouping == "process":
        return f"process {markdown_code(c.key)}"
    module, source = pair_parts(c.key)
    at = shown_line(c)
    line = f" (line {at})" if at else ""
    place = cell(source + line)
    file = source.rpartition(":")[0]
    inside = file and not file.startswith("/") and ".." not in file.split("/")
    if source_url and inside:
        anchor = f"#L{at}" if at else ""
        place = f"[{place}]({source_url}{urllib.parse.quote(file, safe='/')}{anchor})"
    if c.count > 1:
        return f"{c.count} x {markdown_code(module)} at {place} ({cell(each(c))})"
    return f"{markdown_code(module)} at {place}" if module else place


def _open(s: CheckRows) -> list[str]:
    """The base branch's open regressions (three of them) and the budget changes."""
    result, body = s.result, []
    if result.open_regressions:
        where_open = "" if result.context == "base" else ", not caused here"
        body.append(
            f"**Open on {cell(result.base_branch)}{where_open}** (until fixed or accepted):"
        )
        for o in result.open_regressions[:3]:
            fixed = " — this change is back within it" if o.fixed_here else ""
            if o.predates:
                fixed = " — this branch was cut before it merged: not in this change"
            body.append(
                f"- {markdown_code(s.labels.get(o.case_id, o.case_id))} {cell(o.describe())}{fixed}"
            )
        if len(result.open_regressions) > 3:
            body.append(f"- and {len(result.open_regressions) - 3} more (see the JSON report)")
        body.append("")
    if result.budget_changes:
        body.append("**Budget changes in this revision:**")
        body += [f"- {cell(words.budget_change(c))}" for c in result.budget_changes]
        body.append("")
    return body


def _folds(s: CheckRows) -> list[str]:
    """The folded rest: noise, the arithmetic, notes, quality and estimates."""
    result, body = s.result, []
    noisy = s.noisy
    if noisy:
        body += _folded(
            f"〰️ {len(noisy)} figure{'s' * (len(noisy) != 1)} too noisy to judge "
            "a small growth: a property of the case, not of this change",
            [_noisy_line(r) for r in noisy],
        )
    items = [_item(r) for r in s.listed]
    if items:
        what = "blocks or warns" if result.context != "base" else "is reported"
        body += _folded(
            f"The arithmetic of what {what} ({len(items)})",
            [f"{baseline_line(result)}.", "", *items],
        )
    if result.notes:
        body += _folded(f"Notes ({len(result.notes)})", [f"- {cell(n)}" for n in result.notes])
    if s.quality:
        rows = ["| " + " | ".join(QUALITY_COLUMNS) + " |", "|---|---|---|--:|--:|--:|---|"]
        for v, (case, against, *rest) in s.quality:
            cells = (
                f"{EMOJI.get(v.kind, '')} {cell(label(v))}",
                markdown_code(case, in_table=True),
                against if against == "itself" else markdown_code(against, in_table=True),
                *(cell(c) for c in rest),
            )
            rows.append("| " + " | ".join(cells) + " |")
        body += _folded(quality_title(result), rows)
    if result.estimates:
        est = [
            f"- {markdown_code(e.case_id)}: {cell(words.estimate(e))}"
            for e in result.estimates[:50]
        ]
        if len(result.estimates) > 50:
            est.append(f"- _{len(result.estimates) - 50} more in the JSON report_")
        body += _folded(f"Estimates ({len(result.estimates)}, fake tensors, not judged)", est)
    return body


def markdown(
    result: CheckResult,
    *,
    limit: int = MARKDOWN_LIMIT,
    dashboard_url: str | None = None,
    source_url: str | None = None,
) -> str:
    """What a reviewer reads in ten seconds: one line of outcome, links to the run and to a
    Compare with its merge-base (with `dashboard_url`), a short table of what blocks or
    warns, every other verdict counted, the base branch's open regressions, and the rest
    folded: noise (a property of a case, said once), the arithmetic, notes, quality and
    estimates. Where a blocking case grew at its peak is one line under the table, its
    files linked under `source_url` (the repository's files at the candidate's commit).
    Cut to stay under `limit` bytes."""
    s = check_rows(result)
    head = _head(s, dashboard_url)
    table = _table(s, dashboard_url) + _where_lines(s, source_url)
    body = list(table)
    quiet = s.quiet
    if quiet:
        kinds = " · ".join(
            f"{EMOJI.get(k, '')} {n} {WORD.get(k, k)}" for k, n in counts(r.verdict for r in quiet)
        )
        body += [f"Not listed: {kinds}.", ""]
    body += _accepted(s) + _open(s) + _folds(s)
    text = "\n".join(head + body).rstrip() + "\n"
    if len(text.encode()) > limit:  # keep the outcome and the table, cut the folded rest
        kept = "\n".join(head + table[: table.index("") + 1] if table else head)
        text = kept + "\n_(report cut to the size limit; see the JSON report)_\n"
    return text


__all__ = [
    "MARKDOWN_LIMIT",
    "TABLE_ROWS",
    "case_link",
    "cell",
    "compare_link",
    "history_link",
    "markdown",
    "run_link",
]
