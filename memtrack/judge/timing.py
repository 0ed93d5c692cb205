"""Time verdicts, judged at the level of runs, on the figure load moves least.

Iterations of one run share its process, caches and the machine's mood of the moment: they
are not independent samples, and pooling them overstates the evidence. So each run counts
once, by its median iteration time. A candidate is slower only when its median is beyond
both the effect threshold (the run-to-run spread times the factor, and at least 5 %) and
every baseline run's median: the rank p-value of that is 1 / (n + 1).

The figure is the one other processes move least: CUDA event time on a GPU, process CPU
time on the CPU, the wall clock only for records that hold neither. A run timed while the
machine was oversubscribed (see memtrack.judge.load) is no evidence either way: the gate
abstains on such a candidate, in one line saying why, and leaves such runs out of the
baseline.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from memtrack.config import Config
from memtrack.judge.baseline import Point
from memtrack.judge.load import Load
from memtrack.judge.memory import Candidate, fmt_pct, pct
from memtrack.judge.verdict import Verdict
from memtrack.records import Measurement
from memtrack.units import format_seconds

TIME_MIN_EFFECT = 0.05
"""Time is noisy: a median slowdown under 5 % (or under the observed run-to-run spread times
the factor) is not a finding."""

_Of = tuple[str, Callable[[Measurement], Sequence[float]], Callable[[Point], Sequence[float]]]
_FIGURES: tuple[_Of, ...] = (
    ("device time", lambda m: m.iteration_device_times_s, lambda p: p.device_times),
    ("CPU time", lambda m: m.iteration_cpu_times_s, lambda p: p.cpu_times),
    ("wall time", lambda m: m.iteration_times_s, lambda p: p.times),
)
"""The figures time is judged on, the one load moves least first."""


def _figure(m: Measurement, points: list[Point]) -> tuple[str, list[float], list[float]] | None:
    """The first figure that the candidate and a baseline run both hold: its name, the
    candidate's iterations and each baseline run's median."""
    for name, of_m, of_p in _FIGURES:
        cand = [t for t in of_m(m) if t is not None]
        medians = [float(statistics.median(of_p(p))) for p in points if of_p(p)]
        if cand and medians:
            return name, cand, medians
    return None


def verdict(c: Candidate, config: Config) -> Verdict | None:
    m = c.m
    common: dict[str, Any] = dict(
        case_id=m.case_id, workload=m.workload, metric="time", context=c.context
    )
    busy = Load.of(m).oversubscribed()
    if busy:
        words = f"not judged: the machine was oversubscribed while this case was timed ({busy})"
        return Verdict(
            kind="abstained", blocking=False, message=f"time: {words}", words=words, **common
        )
    quiet = [p for p in c.points if p.status == "ok" and not p.load.oversubscribed()]
    found = _figure(m, quiet)
    if found is None:
        return None
    what, cand, medians = found
    left_out = sum(p.status == "ok" and bool(p.load.oversubscribed()) for p in c.points)
    value = statistics.median(cand)
    base = statistics.median(medians)
    delta = value - base
    delta_pct = pct(delta, base)
    spread = 0.0
    if len(medians) >= 2:
        spread = 1.4826 * statistics.median(abs(x - base) for x in medians)
    floor = TIME_MIN_EFFECT * base
    factor = config.headroom_factor
    threshold = base + max(factor * spread, floor)
    n = len(medians)
    as_slow = sum(x >= value for x in medians)
    p_value = (as_slow + 1) / (n + 1)
    provisional = n < config.min_baseline_runs
    if value > threshold and as_slow == 0:
        kind = "time_regression"
        words = f"slower than all {n} baseline run{'s' * (n != 1)} (rank p = {p_value:.2g})"
    else:
        kind = "ok"
        words = (
            "within the threshold"
            if value <= threshold
            else f"{as_slow} of {n} baseline runs were as slow: not a finding"
        )
    blocking = (
        kind == "time_regression"
        and config.time_regression == "block"
        and not provisional
        and c.context != "base"
    )
    if kind == "time_regression" and not blocking:
        words += " (warning)"
    message = (
        f"time ({what}): baseline {format_seconds(base)} (median of {n} run median"
        f"{'s' * (n != 1)}{', provisional' if provisional else ''}"
        + (
            f"; {left_out} run{'s' * (left_out != 1)} timed on an oversubscribed machine left out"
            if left_out
            else ""
        )
        + f"), run-to-run spread {format_seconds(spread)} x factor {factor:g}, floor "
        f"{TIME_MIN_EFFECT:.0%} = {format_seconds(floor)} -> threshold "
        f"{format_seconds(threshold)}; candidate median {format_seconds(value)} of {len(cand)} "
        f"iterations, delta {fmt_pct(delta_pct)}: {words}"
    )
    return Verdict(
        kind=kind,
        blocking=blocking,
        message=message,
        provisional=provisional,
        baseline_value=base,
        spread=spread,
        factor=factor,
        floor=floor,
        threshold=threshold,
        candidate_value=value,
        delta=delta,
        delta_pct=delta_pct,
        baseline_runs=n,
        p_value=p_value,
        words=words,
        **common,
    )


__all__ = ["TIME_MIN_EFFECT", "verdict"]
