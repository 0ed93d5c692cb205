"""What `memtrack check` shows, decided once: the order of its verdicts, which of them are
listed, counted or folded, and each one's label, emoji, style and cells. The terminal
(`report.check`), the Markdown (`report.markdown`) and the JSON renderers read this model
and only format it.

Nothing here decides a verdict: `memtrack.judge.check` and `memtrack.judge.history` do, and
each verdict carries what is shown of it as fields (its failure, its sharpening advice, its
headroom), so that no renderer parses its message. Blocking items come first everywhere;
every verdict keeps its one-line arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from memtrack.escape import terminal_text
from memtrack.judge.decide import CheckResult
from memtrack.judge.quality import missing_reference, precision_change
from memtrack.judge.verdict import KINDS, Quality, Verdict
from memtrack.records import metrics
from memtrack.report import words as said
from memtrack.units import format_seconds, format_size
from memtrack.workload.registry import short_case_labels

ORDER = {k.name: k.order for k in KINDS.values()}
"""Kinds in the order they are shown, after what blocks."""
STYLE = {k.name: k.style for k in KINDS.values()}
EMOJI = {k.name: k.symbol for k in KINDS.values()}
WORD = {k.name: k.word for k in KINDS.values()}
QUIET = tuple(k.name for k in KINDS.values() if k.quiet)
"""Kinds that are neither blocking nor a warning: counted, not listed. `noisy` is a property
of the case (its headroom too wide to judge a small growth), said once."""
SNAPSHOT_METRICS = metrics.STEP
"""Metrics of the measured step, which `memtrack snapshot` captures (not the loading's)."""
SNAPSHOT_WORDS = "To see which allocation"
FAILURE_CELL = 24
"""Characters of a failure's reason in the candidate cell of the Markdown table."""


def is_test(case_id: str) -> bool:
    """A case the pytest plugin recorded: its id is a test's node id ('file.py::test')."""
    return "::" in case_id


def snapshot_command(case_id: str) -> str:
    """The command that shows which allocations make a blocked case's step peak: `memtrack
    snapshot` of a workload's case; a test run by pytest, whose failure over a memory_budget
    mark lists the sites of its peak."""
    quoted = "'" + case_id.replace("'", "'\\''") + "'"
    return f"pytest {quoted}" if is_test(case_id) else f"memtrack snapshot {quoted}"


def snapshot_words(case_id: str) -> str:
    """The words before `snapshot_command`."""
    if is_test(case_id):
        return f"{SNAPSHOT_WORDS}, under a memory_budget mark below its peak"
    return SNAPSHOT_WORDS


def snapshot_hint(case_id: str) -> str:
    """'To see which allocation: memtrack snapshot ...', the line under a blocked case."""
    return f"{snapshot_words(case_id)}: {snapshot_command(case_id)}"


def ordered(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """Blocking first, then warnings, then the rest; by kind, then case."""
    return sorted(
        verdicts, key=lambda v: (not v.blocking, ORDER.get(v.kind, 9), v.case_id, v.metric)
    )


def reported(v: Verdict) -> bool:
    """On the base branch: what would have blocked a pull request."""
    return KINDS[v.kind].blocks and not missing_reference(v)


def found_words(found: Sequence[Verdict]) -> str:
    """'2 regressions and 1 failed case': what the base branch reports, failures apart (a
    case that failed is no regression of its figures)."""
    failed = sum(v.kind == "failed" for v in found)
    regressed = len(found) - failed
    said = [f"{regressed} regression{'s' * (regressed != 1)}"] if regressed else []
    said += [f"{failed} failed case{'s' * (failed != 1)}"] if failed else []
    return " and ".join(said)


def label(v: Verdict) -> str:
    """'BLOCK regression', 'warn time regression', 'ok' ..."""
    words = v.kind.replace("_", " ")
    if v.blocking:
        return f"BLOCK {words}"
    if v.kind in QUIET:
        return words + (" (provisional)" if v.provisional and v.kind != "new" else "")
    if v.context == "base" and reported(v):
        return f"REPORT {words}"  # on the base branch: recorded, never blocking
    return f"warn {words}"


def value(v: Verdict, x: float | None) -> str:
    """A figure of a verdict: seconds for time, else bytes."""
    if x is None:
        return "-"
    return format_seconds(x) if v.metric == "time" else format_size(int(round(x)))


def signed_delta(v: Verdict, decimals: int = 2) -> str:
    """'+2.00 MiB (+17.14%)'; with one decimal, to keep the Markdown table narrow."""
    if v.delta is None:
        return "-"
    sign = "+" if v.delta >= 0 else "-"
    magnitude = (
        format_seconds(abs(v.delta))
        if v.metric == "time"
        else format_size(abs(int(round(v.delta))))
    )
    pct = f" ({v.delta_pct:+.{decimals}f}%)" if v.delta_pct is not None else ""
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


def _limit(v: Verdict) -> str:
    """What a candidate had to stay under: the budget it broke, else the threshold as the
    headroom above the baseline ('+512 B': two sizes that round alike never hide it)."""
    if v.kind == "over_budget" and v.budget_bytes is not None:
        return f"{format_size(v.budget_bytes)} budget"
    room = v.room
    if room is None:
        return value(v, v.threshold)
    return "+" + (format_seconds(room) if v.metric == "time" else format_size(int(room)))


def counts(verdicts: Iterable[Verdict]) -> list[tuple[str, int]]:
    """(kind, how many) in the order kinds are shown; kinds that share a place keep the
    order they came in."""
    found: dict[str, int] = {}
    for v in verdicts:
        found[v.kind] = found.get(v.kind, 0) + 1
    return sorted(found.items(), key=lambda kv: ORDER.get(kv[0], 9))


@dataclass(frozen=True)
class Row:
    """One verdict as every renderer shows it."""

    verdict: Verdict
    label: str
    """'BLOCK regression', 'REPORT failed', 'warn removed', 'ok (provisional)'."""
    case: str
    """The case's short label among the cases shown with it: 'decoder[sessions=4]'."""
    listed: bool
    """It blocks or warns (on the base branch: it is reported): in the table; the other
    verdicts are counted there."""
    reported: bool
    """It would have blocked a pull request (what a base-branch run reports)."""
    hint: bool
    """The first blocking step-memory verdict of its case: the snapshot command goes under
    it, once per case."""
    style: str
    """Its kind's terminal style (STYLE)."""
    emoji: str
    """Its kind's mark in the Markdown table (EMOJI)."""
    word: str
    """Its kind in a word or two, beside the emoji (WORD)."""
    baseline: str
    """The figures as shown, seconds for time and else bytes; '-' where there is none."""
    threshold: str
    """The absolute threshold (baseline + headroom), as the arithmetic says it."""
    candidate: str
    delta: str
    """'+2.00 MiB (+17.14%)'."""
    budget: str
    """The budget and the margin to it: '64.00 MiB (margin 2.00 MiB)'."""
    short_delta: str
    """The delta with one decimal of its %, for the Markdown table."""
    limit: str
    """The threshold as both tables show it: the budget broken ('40.00 MiB budget'), else
    the growth the headroom allows over the baseline ('+512 B')."""
    outcome: str
    """The candidate's figure, or a failed case's reason (cut for the Markdown table)."""


@dataclass(frozen=True)
class CheckRows:
    """A check as the reports show it: every verdict a row, in order, built once."""

    result: CheckResult
    rows: tuple[Row, ...]
    """Every verdict, ordered: blocking first, then warnings, then the rest."""
    labels: dict[str, str]
    """Case id -> its short label, among the verdicts' and the open regressions' cases."""
    quality: tuple[tuple[Verdict, tuple[str, ...]], ...]
    """The quality table's rows (see quality_rows)."""

    @property
    def listed(self) -> list[Row]:
        return [r for r in self.rows if r.listed]

    @property
    def quiet(self) -> list[Row]:
        """The rows counted, not listed."""
        return [r for r in self.rows if not r.listed]

    @property
    def noisy(self) -> list[Row]:
        """Noisy figures: a property of the case, said once, apart from the verdicts."""
        return [r for r in self.quiet if r.verdict.kind == "noisy"]

    def says(self, row: Row) -> str:
        """What a listed row does: 'blocks', 'warns', or on the base branch 'reported'.
        Rows of one mark all do the same (see marks)."""
        if self.result.context == "base":
            return "reported"
        return "blocks" if row.verdict.blocking else "warns"

    @property
    def accepted(self) -> list[Row]:
        """The accepted verdicts: counted with the rest, and said with their reason."""
        return [r for r in self.rows if r.verdict.kind == "accepted"]


def marks(v: Verdict, context: str) -> tuple[str, str]:
    """A verdict's mark and word in the Markdown table: its kind's, or, for a pull
    request's verdict that only warns where its kind can block, a mark of its own."""
    k = KINDS[v.kind]
    if context != "base" and not v.blocking and k.warn_symbol and k.warn_word:
        return k.warn_symbol, k.warn_word
    return k.symbol, k.word


def check_rows(result: CheckResult) -> CheckRows:
    """The rows of a check: what is listed, counted and hinted, and each one's cells."""
    verdicts = ordered(result.verdicts)
    labels = short_case_labels(
        [*(v.case_id for v in verdicts), *(o.case_id for o in result.open_regressions)]
    )
    hinted: set[str] = set()
    rows = []
    for v in verdicts:
        hint = v.blocking and v.metric in SNAPSHOT_METRICS and v.case_id not in hinted
        if hint:
            hinted.add(v.case_id)
        was_reported = reported(v)
        candidate = value(v, v.candidate_value)
        failed = v.candidate_value is None and v.kind == "failed"
        mark, word = marks(v, result.context)
        rows.append(
            Row(
                verdict=v,
                label=label(v),
                case=labels[v.case_id],
                listed=v.blocking
                or v.kind not in QUIET
                or (result.context == "base" and was_reported),
                reported=was_reported,
                hint=hint,
                style=STYLE.get(v.kind, ""),
                emoji=mark,
                word=word,
                baseline=value(v, v.baseline_value),
                threshold=value(v, v.threshold),
                candidate=candidate,
                delta=signed_delta(v),
                budget=_budget(v),
                short_delta=signed_delta(v, 1),
                limit=_limit(v),
                outcome=(said.failure(v) or "")[:FAILURE_CELL] if failed else candidate,
            )
        )
    return CheckRows(result, tuple(rows), labels, tuple(quality_rows(result)))


def summary_line(result: CheckResult) -> str:
    """The outcome in one line: what blocks counted apart from the rest, every verdict
    counted by kind, and the cases not gated because they fail on the base branch too."""
    if result.estimate_only:
        return (
            f"estimate run: nothing measured, nothing judged "
            f"({len(result.estimates)} case(s) estimated)"
        )
    blocking = result.blocking
    if result.context == "base":
        found = [v for v in result.verdicts if reported(v)]
        opened = len(result.open_regressions)
        head = (
            f"base branch: {found_words(found)} reported"
            if found
            else "base branch: no new regression"
        )
        if opened:
            head += f", {opened} still open (not fixed or accepted)"
        head += " (never blocking)" if found or opened else ""
        parts = _counted(result.verdicts) or "no verdicts"
    elif blocking:
        n = len(blocking)
        head = f"BLOCKED: {n} blocking verdict{'s' * (n != 1)} ({_counted(blocking)})"
        rest = [v for v in result.verdicts if not v.blocking]
        parts = f"also {_counted(rest)}" if rest else ""
    else:
        head, parts = "passed: nothing blocks", _counted(result.verdicts) or "no verdicts"
    said = (
        f"{head} ({parts})" if parts and not blocking else f"{head}{'; ' + parts if parts else ''}"
    )
    not_gated = known_failures(result)
    if not_gated:
        said += f"; not gated: {not_gated}"
    return said + "".join(f"; {c}" for c in param_changes(result))


def _counted(verdicts: Iterable[Verdict]) -> str:
    return ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts(verdicts))


def known_failures(result: CheckResult, code: Callable[[str], str] = str) -> str:
    """A pull request's cases that fail where the base branch's newest run failed too, in
    words ('`generate` fails on main too (timeout)'); '' where there is none. Never
    silence: a case that does not run is not gated, and the headline says so."""
    if result.context == "base":
        return ""
    found = [
        v for v in result.verdicts if v.kind == "failed" and not v.blocking and v.why is not None
    ]
    if not found:
        return ""
    labels = short_case_labels([v.case_id for v in found])
    status = {v.case_id: getattr(v.why, "status", "failed") for v in found}
    cases = ", ".join(f"{code(labels[c])} ({status[c]})" for c in dict.fromkeys(status))
    verb = "fails" if len(status) == 1 else "fail"
    return f"{cases} {verb} on {result.base_branch} too"


def param_changes(result: CheckResult, but: str | None = None) -> list[str]:
    """'vit_infer batch 16 -> 32: allocated +44.00 MiB (+44.00%)': each case whose params
    changed (but case `but`), against the case it replaced, by its first memory figure."""
    out, seen = [], {but}
    for v in result.verdicts:
        key = v.case_id
        if v.rename is None or v.metric in ("status", "time") or key in seen:
            continue
        seen.add(key)
        out.append(f"{v.workload} {v.rename.change}: {v.metric} {signed_delta(v)}")
    return out


def where(result: CheckResult) -> str:
    """'run 0007eeeeeeee of 0007ffffffff (feature/pr-7)'."""
    commit = (result.commit or "no commit")[:12]
    return f"run {result.run_id[:12]} of {commit} ({result.branch or 'no branch'})"


def baseline_line(result: CheckResult) -> str:
    """Which runs the candidate was judged against."""
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


def shown(text: str, style: str = "") -> Any:
    """A rich Text of recorded text, its control characters made visible, never acting."""
    from rich.text import Text

    return Text(terminal_text(text), style=style)


# -- quality --------------------------------------------------------------------------------

QUALITY_COLUMNS = (
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
    rows: list[tuple[Verdict, tuple[str, ...]]] = []
    verdicts = ordered([v for v in result.verdicts if v.metric == "quality"])
    labels = short_case_labels(
        [*{v.case_id for v in verdicts}, *{r for v in verdicts if (r := _reference(v))}]
    )
    for v in verdicts:
        ref = _reference(v) or "-"
        changed = ref != "-" and precision_change(v.case_id, ref)
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
            # at its reference's own precision, whatever that is: a case without a dtype
            # param may hold bf16 tensors (its notes say which the worker found)
            peaks = ("-", "-", "-" if changed else "(its own reference)")
        against = "itself" if ref == v.case_id else labels.get(ref, ref)
        outcome = v.why.outcome if isinstance(v.why, Quality) else ""
        rows.append((v, (labels[v.case_id], against, *peaks, outcome or "-")))
    return rows


def _reference(v: Verdict) -> str | None:
    return v.why.reference if isinstance(v.why, Quality) else None
