"""`memtrack check --history` shown: the steps of each series and the creep since an anchor,
as a terminal table (rich renderables) and as Markdown. `memtrack.judge.history` decides."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memtrack.escape import markdown_code
from memtrack.judge.bisect import command
from memtrack.report.markdown import MARKDOWN_LIMIT, case_link, cell
from memtrack.report.rows import shown
from memtrack.report.words import creep as creep_words
from memtrack.units import format_size

if TYPE_CHECKING:
    from memtrack.judge.history import HistoryResult, Step


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
    accepted = any(s.accepted for s in h.steps)  # the column only where one was
    for col in ("case", "metric", "commit", "subject", "before", "after", "delta"):
        steps.add_column(col)
    if accepted:
        steps.add_column("accepted")
    for s in h.steps:
        cells = [
            s.case_id,
            s.metric,
            s.commit[:12],
            (s.subject or "")[:50],
            format_size(int(s.before)),
            format_size(int(s.after)),
            f"{_signed(s.delta)} ({s.delta_pct:+.2f}%)",
        ]
        steps.add_row(*(shown(c) for c in cells + ([s.accepted or ""] if accepted else [])))
    out.append(steps if h.steps else shown("steps: none found"))
    for s in h.steps:
        if (found := bisect_command(s)) is not None:
            out.append(
                shown(f"{s.case_id} {s.metric}: the step spans {s.commits} commits; which one: ")
                + shown(found, style="bold")
            )
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
        if c.flagged or c.accepted:
            style = "red" if c.flagged else "magenta"
            out.append(shown(f"{_creep_label(c)} · {c.case_id} · {creep_words(c)}", style=style))
    out.append(shown(_history_summary(h), style="bold red" if h.exit_code else "bold green"))
    return out


def bisect_command(s: Step) -> str | None:
    """The `memtrack bisect` that finds the commit of a step that spans several, else None."""
    if not s.commits or s.commits < 2:
        return None
    return command(s.case_id, s.previous_commit, s.commit, s.metric)


def _creep_label(c: Any) -> str:
    """CREEP: grown with no step to blame; GROWTH: grown, and steps explain it; accepted:
    grown by steps a reviewed trailer allowed, and no more."""
    if not c.flagged:
        return "accepted" if c.accepted else "ok"
    return "GROWTH" if c.steps_between else "CREEP"


def _history_summary(h: HistoryResult) -> str:
    flagged = sum(c.flagged for c in h.creeps)
    accepted = sum(bool(c.accepted) and not c.flagged for c in h.creeps)
    return f"{len(h.steps)} step(s), {flagged} series grown past the tolerance since the anchor" + (
        f", {accepted} grown by accepted steps only" if accepted else ""
    )


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + format_size(abs(int(round(x))))


def _steps_table(h: HistoryResult, dashboard_url: str | None) -> list[str]:
    """The steps as a Markdown table; the reason of each accepted one where one was."""
    accepted = any(s.accepted for s in h.steps)
    lines = [
        "| case | metric | commit | subject | before | after | delta |"
        + (" accepted |" if accepted else ""),
        "|---|---|---|---|--:|--:|--:|" + ("---|" if accepted else ""),
    ]
    for s in h.steps:
        lines.append(
            f"| {case_link(s.case_id, dashboard_url)} | "
            f"{cell(s.metric)} | {markdown_code(s.commit[:12], in_table=True)} | "
            f"{cell((s.subject or '')[:60])} | {format_size(int(s.before))} | "
            f"{format_size(int(s.after))} | {_signed(s.delta)} "
            f"({s.delta_pct:+.2f}%) |" + (f" {cell(s.accepted or '')} |" if accepted else "")
        )
    return lines


def history_markdown(
    h: HistoryResult, *, limit: int = MARKDOWN_LIMIT, dashboard_url: str | None = None
) -> str:
    flagged = [c for c in h.creeps if c.flagged]
    lines = [
        f"## {'❌' if flagged else '✅'} memtrack history: {_history_summary(h)}",
        "",
        f"Base branch {markdown_code(h.base_branch)}, {h.series} series over "
        f"{h.commits} commits; creep against {cell(h.anchor_label)}.",
        "",
    ]
    for n in h.notes:
        lines += [f"> **Note:** {cell(n)}", ""]
    accepted = [c for c in h.creeps if c.accepted and not c.flagged]
    for title, creeps in (("Grown since the anchor", flagged), ("Accepted growth", accepted)):
        if creeps:
            lines += ["", f"### {title}", ""] + [
                f"- **{_creep_label(c)}** {case_link(c.case_id, dashboard_url)} "
                f"{cell(c.metric)}: {cell(creep_words(c))}"
                for c in creeps
            ]
    if h.steps:
        lines += ["", "<details><summary>Steps</summary>", "", *_steps_table(h, dashboard_url)]
        spans = [s for s in h.steps if bisect_command(s)]
        if spans:
            lines += [""] + [
                f"- {cell(s.case_id)} {cell(s.metric)}: the step spans {s.commits} commits; "
                f"which one: {markdown_code(bisect_command(s) or '')}"
                for s in spans
            ]
        lines += ["", "</details>"]
    text = "\n".join(lines) + "\n"
    return (
        text
        if len(text.encode()) <= limit
        else text.encode()[: limit - 100].decode("utf-8", "ignore")
        + "\n\n_(cut to the size limit)_\n"
    )


__all__ = ["history_markdown", "history_terminal"]
