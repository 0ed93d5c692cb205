"""GitHub Actions annotations of a check: one workflow command per blocking verdict
(`::error`) and per warning (`::warning`), at the site that grew where it is a file of the
repository, so that GitHub shows it at that line of the pull request's Files view and on
the check's page.

The diff decides the line: of the frames a growing site's memory was made through (the
allocating line, the calls that led there, where its module or tensor was made:
Site.frames), the deepest one on a line the pull request changed; where none is, the line
that allocated (or made) it. The message says which.

GitHub shows at most 10 error and 10 warning annotations of a step (and 50 of a job): the
largest growths come first, and one `::notice` counts the rest. Every value is escaped as
the workflow-command format requires (`%`, CR and LF in the message; `:` and `,` too in a
property), so that a case name or a path from a record cannot end the command or forge
another.
"""

from __future__ import annotations

from pathlib import Path

from memtrack.judge.decide import CheckResult
from memtrack.judge.verdict import Verdict
from memtrack.judge.where import made_at, shown_line
from memtrack.records import pair_parts
from memtrack.report.rows import label, signed_delta
from memtrack.report.words import message

PER_LEVEL = 10
"""Annotations GitHub shows of one level (error, warning) in one step."""


def escape_data(text: str) -> str:
    """A workflow command's message: `%`, CR and LF as %25, %0D, %0A."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value: as a message, and `:` and `,` as %3A, %2C."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_commands(result: CheckResult, root: Path) -> list[str]:
    """The workflow commands of `result`'s blocking verdicts and warnings, largest growth
    first, each level cut at PER_LEVEL, and one notice counting what was left out."""
    errors = _largest_first([v for v in result.verdicts if v.blocking])
    warnings = _largest_first(
        [v for v in result.verdicts if not v.blocking and label(v).startswith(("warn", "REPORT"))]
    )
    changed = {f: frozenset(lines) for f, lines in result.changed_lines.items()}
    out = [_command("error", v, root, changed) for v in errors[:PER_LEVEL]]
    out += [_command("warning", v, root, changed) for v in warnings[:PER_LEVEL]]
    left = len(errors[PER_LEVEL:]) + len(warnings[PER_LEVEL:])
    if left:
        out.append(
            f"::notice title=memtrack::{left} more verdict{'s' * (left != 1)} not annotated "
            "(GitHub shows 10 of each level): the job summary lists them all"
        )
    return out


def _largest_first(verdicts: list[Verdict]) -> list[Verdict]:
    return sorted(verdicts, key=lambda v: -(v.delta or 0))


def _command(level: str, v: Verdict, root: Path, changed: dict[str, frozenset[int]]) -> str:
    """'::error file=src/model.py,line=42,title=memtrack: case allocated +10.78 MiB::...'."""
    grew = f" {signed_delta(v, 1)}" if v.delta is not None else ""
    title = f"memtrack: {v.case_id} {v.metric}{grew}"
    props, why = _site(v, root, changed)
    text = f"{label(v)}: {message(v)}" + (f" (annotated {why})" if why else "")
    return f"::{level} {','.join([*props, f'title={escape_property(title)}'])}::{escape_data(text)}"


ON_A_CHANGED_LINE = "on a line this pull request changed, through which the memory was made"
WHERE_MADE = "where the memory was made: no line this pull request changed is among its frames"


def _site(v: Verdict, root: Path, changed: dict[str, frozenset[int]]) -> tuple[list[str], str]:
    """`file=...` and `line=...` of the annotation, and why there: the deepest frame of the
    named sites that grew (in their order) on a changed line; else the first named site that
    is a file of the repository (its path relative to the root), at its line where the file
    has it (a weight's or buffer's: the line that made it). None where no named site is one."""
    if v.where is None:
        return [], ""
    places = [c for c in v.where.named if c.grouping != "process"]  # a process: no file
    for change in places:
        for frame in change.frames if shown_line(change) or made_at(change) else ():
            file, _, line = frame.rpartition(":")
            if line.isdigit() and int(line) in changed.get(file, ()):
                found = _at(file, int(line), root)
                if found:
                    return found, ON_A_CHANGED_LINE
    for change in places:
        made = made_at(change)
        if made is not None:
            file, _, line = made.rpartition(":")
            found = _at(file, int(line) if line.isdigit() else None, root)
        else:
            source = pair_parts(change.key)[1] if change.grouping == "pair" else change.key
            found = _at(source.rpartition(":")[0], shown_line(change), root)
        if found:
            return found, WHERE_MADE if changed else ""
    return [], ""


def _at(file: str, line: int | None, root: Path) -> list[str]:
    """`file=` and `line=` where `file` is a file of the repository (its line where the file
    has it); none where it is not."""
    path = _in_repository(file, root)
    if path is None:
        return []
    props = [f"file={escape_property(file)}"]
    if line and line <= _lines(root / path):
        props.append(f"line={line}")
    return props


def _in_repository(file: str, root: Path) -> Path | None:
    """`file` as a path relative to the repository's root, where it names a file inside it
    (a record's path is untrusted: '..' and absolute paths lead nowhere)."""
    if not file or file.startswith("/") or "\\" in file:
        return None
    top = root.resolve()
    try:
        path = (top / file).resolve()
        inside = path.relative_to(top)
    except (ValueError, OSError):
        return None
    return inside if path.is_file() else None


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


__all__ = ["PER_LEVEL", "workflow_commands", "escape_data", "escape_property"]
