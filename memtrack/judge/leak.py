"""Leaks: memory a step keeps from one call to the next.

A step that frees what it makes leaves nothing allocated when it ends. One that leaves
memory behind in every measured iteration (a list of outputs kept at module level, a cache
without a bound) grows for as long as the process serves calls: a leak, a verdict of its
own, and never noise. Its growth from repeat to repeat must not become the spread that
sets the headroom: `steady` takes it out of the iterations' peaks.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from memtrack.judge.evidence import Point
from memtrack.judge.verdict import Leak, Verdict
from memtrack.records import Measurement

CALLS = 1000
"""The leak is also said as what this many calls would keep."""


def rate(retained: Sequence[int]) -> int | None:
    """Bytes per iteration where every measured iteration (two or more) left memory
    allocated when it ended; else None."""
    if len(retained) < 2 or min(retained) <= 0:
        return None
    return int(statistics.median(retained))


def steady(m: Measurement) -> tuple[int, ...]:
    """The iterations' peaks without a leak's growth: each less what the iterations before
    it kept (a leak raises every later peak by what it kept)."""
    if rate(m.retained_samples) is None:
        return m.allocated_samples
    kept, out = 0, []
    for i, peak in enumerate(m.allocated_samples):
        out.append(peak - kept)
        if i < len(m.retained_samples):
            kept += m.retained_samples[i]
    return tuple(out)


def verdict(m: Measurement, points: Sequence[Point], context: str) -> Verdict | None:
    """A leak verdict where the candidate leaks; None where it does not. It blocks a pull
    request that brought it: one whose baseline's newest run did not leak as much. Without a
    baseline run that recorded what it retained (a new case, the first run on a new
    environment, a record from before) nothing tells a leak the change made from memory the
    runtime keeps in the first calls (a bounded cache filling): reported, not blocking."""
    per = rate(m.retained_samples)
    if per is None:
        return None
    measured = [p for p in points if p.status == "ok" and p.retained]
    before = rate(measured[0].retained) if measured else None
    known = before is not None and before >= per
    return Verdict(
        case_id=m.case_id,
        workload=m.workload,
        metric="retained",
        kind="leak",
        blocking=bool(measured) and not known and context != "base",
        context=context,
        why=Leak(per, tuple(m.retained_samples), before, bool(measured), CALLS),
        baseline_value=float(before or 0),
        candidate_value=float(per),
    )


__all__ = ["CALLS", "rate", "steady", "verdict"]
