"""Quality verdicts: a case's output against its full-precision reference, and the memory a
precision or format change saves against the sibling measured in the same run.

A case beyond its tolerance blocks, whether its precision differs from its reference's (the
change costs too much quality) or not (at the reference's own precision, the result
changed). A reference refused by its checksum, or an output that cannot be compared, blocks
too: a tampered reference must not pass in silence. A case with no reference recorded yet
warns. Within tolerance, the verdict is `ok` and carries the saving: framework peak of the
case against its full-precision sibling's, bytes and %.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memtrack.judge.verdict import Verdict
from memtrack.records import Measurement
from memtrack.units import format_size
from memtrack.workload.registry import split_case_id

NOT_COMPARED = "not compared"
"""How a quality verdict without a reference recorded yet begins: a warning, anywhere."""


def missing_reference(v: Verdict) -> bool:
    """A quality verdict that only says no reference is recorded yet: on the base branch
    as on a pull request a warning, never a regression."""
    return v.kind == "quality" and v.words == NOT_COMPARED


def precision_change(case_id: str, reference: str) -> str | None:
    """'dtype bfloat16 (reference float32)' for the params in which a case differs from its
    reference; None where it is at the reference's own precision."""
    mine, ref = split_case_id(case_id), split_case_id(reference)
    if mine is None or ref is None:  # a value holding ',' or '=': the ids still tell
        return None if case_id == reference else f"params differ from {reference}"
    if mine == ref:
        return None
    diffs = [
        f"{k} {mine[1].get(k, '-')} (reference {ref[1].get(k, '-')})"
        for k in sorted(set(mine[1]) | set(ref[1]))
        if mine[1].get(k) != ref[1].get(k)
    ]
    return ", ".join(diffs) or None


def saving(m: Measurement, sibling: Measurement | None) -> tuple[int, int, float] | None:
    """(sibling's framework peak, this case's, saved bytes as a % of the sibling's): the
    full-precision sibling measured in the same run; None where either lacks the figure."""
    if sibling is None or sibling.status != "ok" or sibling.case_id == m.case_id:
        return None
    full, own = sibling.peak_allocated_bytes, m.peak_allocated_bytes
    if not full or own is None:
        return None
    return full, own, 100.0 * (full - own) / full


def saving_text(s: tuple[int, int, float] | None) -> str:
    if s is None:
        return "-"
    full, own, pct = s
    saved = full - own
    if saved >= 0:
        return f"{format_size(saved)} ({pct:.1f}%)"
    return f"none: {format_size(-saved)} more ({-pct:.1f}%)"


def verdict(
    m: Measurement, sibling: Measurement | None, context: str = "pull_request"
) -> Verdict | None:
    """The quality verdict of one case; None where it declares no tolerance or failed (the
    `failed` verdict speaks for it)."""
    if m.quality_status is None or m.status != "ok" or not m.quality_reference:
        return None
    ref = m.quality_reference
    changed = precision_change(m.case_id, ref)
    pinned = f" (sha256 {m.quality_reference_sha256[:12]})" if m.quality_reference_sha256 else ""
    against = (
        f"{changed} against {ref}{pinned}"
        if changed
        else f"at the reference's own precision, against {ref}{pinned}"
    )
    s = saving(m, sibling) if changed else None
    figures: dict[str, Any] = dict(
        baseline_value=float(s[0]) if s else None,
        candidate_value=float(s[1]) if s else None,
        delta=float(s[1] - s[0]) if s else None,
        delta_pct=100.0 * (s[1] - s[0]) / s[0] if s else None,
        quality=m.quality_message,
        reference=ref,
    )
    base: dict[str, Any] = dict(
        case_id=m.case_id, workload=m.workload, metric="quality", context=context
    )
    status = m.quality_status
    if status == "ok":
        memory = ""
        if changed:
            memory = (
                f"; framework peak {format_size(s[1])} against {format_size(s[0])} at "
                f"full precision: saves {saving_text(s)}"
                if s
                else "; the full-precision sibling was not measured in this run: no saving shown"
            )
        return Verdict(
            **base,
            kind="ok",
            blocking=False,
            message=f"quality kept, {against}: {m.quality_message}{memory}",
            words="quality kept",
            **figures,
        )
    if status == "none":
        return Verdict(
            **base,
            kind="quality",
            blocking=False,
            message=f"{NOT_COMPARED}: {m.quality_message}",
            words=NOT_COMPARED,
            **figures,
        )
    what = "the precision change breaks its tolerance" if changed else "the result changed"
    if status == "error":
        what = "quality error"
    return Verdict(
        **base,
        kind="quality",
        blocking=context != "base",
        message=f"{what} ({against}): {m.quality_message}",
        words=what,
        **figures,
    )


def verdicts(measurements: Iterable[Measurement], context: str = "pull_request") -> list[Verdict]:
    """Every case's quality verdict, each with its full-precision sibling of the same run."""
    ms = list(measurements)
    by_id = {m.case_id: m for m in ms}
    out = []
    for m in ms:
        v = verdict(m, by_id.get(m.quality_reference or ""), context)
        if v is not None:
            out.append(v)
    return out


__all__ = [
    "NOT_COMPARED",
    "missing_reference",
    "precision_change",
    "saving",
    "saving_text",
    "verdict",
    "verdicts",
]
