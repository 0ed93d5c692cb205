"""Time verdicts, judged at the level of runs.

Iterations of one run share its process, caches and the machine's mood of the moment: they
are not independent samples, and pooling them overstates the evidence. So each run counts
once, by its median iteration time. A candidate is slower only when its median is beyond
both the effect threshold (the run-to-run spread times the factor, and at least 5 %) and
every baseline run's median: the rank p-value of that is 1 / (n + 1).
"""

from __future__ import annotations

import statistics

from memtrack.config import Config
from memtrack.judge.memory import Candidate, fmt_pct, pct
from memtrack.judge.verdict import Verdict
from memtrack.units import format_seconds

TIME_MIN_EFFECT = 0.05
"""Time is noisy: a median slowdown under 5 % (or under the observed run-to-run spread times
the factor) is not a finding."""


def verdict(c: Candidate, config: Config) -> Verdict | None:
    m = c.m
    cand = [t for t in m.iteration_times_s if t is not None]
    medians = [statistics.median(p.times) for p in c.points if p.status == "ok" and p.times]
    if not cand or not medians:
        return None
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
        f"time: baseline {format_seconds(base)} (median of {n} run median"
        f"{'s' * (n != 1)}{', provisional' if provisional else ''}), run-to-run spread "
        f"{format_seconds(spread)} x factor {factor:g}, floor {TIME_MIN_EFFECT:.0%} = "
        f"{format_seconds(floor)} -> threshold {format_seconds(threshold)}; candidate median "
        f"{format_seconds(value)} of {len(cand)} iterations, delta {fmt_pct(delta_pct)}: {words}"
    )
    return Verdict(
        case_id=m.case_id,
        workload=m.workload,
        metric="time",
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
        context=c.context,
    )


__all__ = ["TIME_MIN_EFFECT", "verdict"]
