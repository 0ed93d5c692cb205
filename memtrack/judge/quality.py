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

from memtrack.judge.verdict import Quality, Verdict
from memtrack.records import Measurement
from memtrack.workload.registry import split_case_id


def missing_reference(v: Verdict) -> bool:
    """A quality verdict that only says no reference is recorded yet: on the base branch
    as on a pull request a warning, never a regression."""
    return isinstance(v.why, Quality) and v.why.status == "none"


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


def verdict(
    m: Measurement, sibling: Measurement | None, context: str = "pull_request"
) -> Verdict | None:
    """The quality verdict of one case; None where it declares no tolerance or failed (the
    `failed` verdict speaks for it)."""
    if m.quality_status is None or m.status != "ok" or not m.quality_reference:
        return None
    ref = m.quality_reference
    changed = precision_change(m.case_id, ref)
    s = saving(m, sibling) if changed else None
    status = {"ok": "ok", "none": "none", "error": "error"}.get(m.quality_status, "beyond")
    why = Quality(
        status,
        ref,
        changed,
        m.quality_reference_sha256,
        m.quality_message or "",
        sibling_measured=s is not None,
    )
    return Verdict(
        case_id=m.case_id,
        workload=m.workload,
        metric="quality",
        kind="ok" if status == "ok" else "quality",
        blocking=status in ("beyond", "error") and context != "base",
        context=context,
        why=why,
        baseline_value=float(s[0]) if s else None,
        candidate_value=float(s[1]) if s else None,
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


__all__ = ["missing_reference", "precision_change", "saving", "verdict", "verdicts"]
