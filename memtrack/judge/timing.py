"""Time verdicts: paired where the run measured a pair, else against the history's runs.

A paired timing (`memtrack run --against REF`) measured REF and the candidate in the same job,
their timing passes alternating (measure.pairs), so that both sides saw the same
machine. Each round gives one ratio, candidate over REF, taken in logs (times multiply).
The candidate is slower when the median ratio is beyond max((1 + spread) ^ factor, 1.05),
the spread half the range of the rounds' ratios, and a one-sided sign test of the rounds
(how many were slower, of k, each slower or faster with chance 1/2 were nothing changed)
has p <= TIME_ALPHA. Load does not matter to a pair: it is why there is one.

Without a pair, the candidate's run is compared with the history's runs. Iterations of one
run share its process, caches and the machine's mood of the moment: they are not independent
samples, so each run counts once, by its median iteration time. The candidate is slower only
when its median is beyond the effect threshold (the run-to-run spread times the factor, and
at least 5 %) and beyond the slowest baseline run's median by 5 % too, and the rank p-value
of that, 1 / (n + 1), is at most TIME_ALPHA: 19 baseline runs at least. Fewer than the
gate's minimum of runs judge nothing. A run timed on a contended machine (see
memtrack.judge.load) is no evidence either way: the gate abstains on such a candidate, in one
line saying why, and leaves such runs out of the baseline.

The figure is the one other processes move least: CUDA event time on a GPU, process CPU
time on the CPU, the wall clock only for records that hold neither.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from memtrack.config import Config
from memtrack.judge.evidence import Point
from memtrack.judge.load import Load
from memtrack.judge.memory import Candidate
from memtrack.judge.verdict import Abstained, Paired, Unpaired, Verdict
from memtrack.records import Measurement

TIME_MIN_EFFECT = 0.05
"""Time is noisy: a median slowdown under 5 % (or under the observed run-to-run spread times
the factor) is not a finding."""
TIME_ALPHA = 0.05
"""The largest one-sided p-value a time warning is given on: one false warning in 20 cases
at most were nothing changed and the effect floor absent, and the floor (and the spread
times the factor) must be passed too, which noise alone rarely does (scripts/bench_time.py
counts the false warnings over recorded reruns). Unpaired, the rank test reaches it from 19
baseline runs; paired, the sign test from 5 rounds, every one slower."""

_Of = tuple[str, Callable[[Measurement], Sequence[float]], Callable[[Point], Sequence[float]]]
_FIGURES: tuple[_Of, ...] = (
    ("device time", lambda m: m.iteration_device_times_s, lambda p: p.device_times),
    ("tree CPU time", lambda m: m.iteration_tree_cpu_times_s, lambda p: p.tree_cpu_times),
    ("CPU time", lambda m: m.iteration_cpu_times_s, lambda p: p.cpu_times),
    ("wall time", lambda m: m.iteration_times_s, lambda p: p.times),
)
"""The figures time is judged on, the one load moves least first."""


def _figure(m: Measurement, points: list[Point]) -> tuple[str, list[float], list[float]] | None:
    """The first figure that the candidate and a baseline run both hold (the tree's CPU
    time only where as many baseline runs hold it as hold the process's: after an upgrade
    the process's is judged until the tree's has a history as long): its name, the
    candidate's iterations and each baseline run's median."""
    held = {name: sum(1 for p in points if of_p(p)) for name, _, of_p in _FIGURES}
    for name, of_m, of_p in _FIGURES:
        cand = [t for t in of_m(m) if t is not None]
        medians = [float(statistics.median(of_p(p))) for p in points if of_p(p)]
        if name == "tree CPU time" and held[name] < held["CPU time"]:
            continue
        if cand and medians:
            return name, cand, medians
    return None


def sign_test(slower: int, rounds: int) -> float:
    """P(at least `slower` of `rounds` rounds slower) were each slower or faster with chance
    1/2: the one-sided sign test's p-value."""
    return sum(math.comb(rounds, j) for j in range(slower, rounds + 1)) / 2**rounds


def futile_after(rounds: int, factor: float) -> int:
    """How many rounds not slower, of `rounds`, leave a pair unable to warn however the
    others go: a paired timing stops there (worker.turns), and the verdict on the rounds it
    ran is the one all of them would have given. With a headroom `factor` of 2 or more, one:
    a ratio of 1 or less spreads the rounds (half their range) at least half as far as their
    median is above 1, so the line is at the median or beyond. Else where the sign test can
    no longer reach TIME_ALPHA (1 of 5, 6 of 20): a run of fewer rounds with as many not
    slower only gives it a larger p-value."""
    if factor >= 2:
        return 1
    need = next((k for k in range(rounds + 1) if sign_test(k, rounds) <= TIME_ALPHA), None)
    return 1 if need is None else rounds - need + 1


def rank_runs_needed() -> int:
    """Baseline runs the unpaired rank test needs to reach TIME_ALPHA (19)."""
    return math.ceil(1 / TIME_ALPHA - 1e-9) - 1


def _blocking(kind: str, config: Config, c: Candidate, provisional: bool = False) -> bool:
    return (
        kind == "time_regression"
        and config.time_regression == "block"
        and not provisional
        and c.context != "base"
    )


def _about(c: Candidate) -> dict[str, Any]:
    """What every time verdict of the candidate says of what it judged."""
    return dict(case_id=c.m.case_id, workload=c.m.workload, metric="time", context=c.context)


def paired(c: Candidate, config: Config) -> Verdict | None:
    """The verdict of a paired timing: the candidate's passes against REF's, round by round."""
    m = c.m
    if len(m.pair_times_s) != len(m.pair_ref_times_s):  # a record from elsewhere: no pair
        return None
    rounds = [(h, t) for h, t in zip(m.pair_times_s, m.pair_ref_times_s, strict=True) if t > 0]
    if not rounds:
        return None
    logs = [math.log(h / t) for h, t in rounds if h > 0]
    if len(logs) != len(rounds):
        return None
    k = len(logs)
    # in logs, as times multiply: a ratio's spread is the same at 1x as at 2x
    middle = statistics.median(logs)
    # half the range of the rounds: five rounds estimate a median deviation too low too
    # often (scripts/bench_time.py: 13 false warnings in 24,000 draws with it, none with this)
    spread_log = (max(logs) - min(logs)) / 2
    factor = config.headroom_factor
    line_log = max(factor * spread_log, math.log1p(TIME_MIN_EFFECT))
    # records are checked (1 ns to 1e6 s a pass): these logs are within +-35
    line = math.exp(line_log)
    slower = sum(x > 0 for x in logs)
    p_value = sign_test(slower, k)
    base = statistics.median(t for _, t in rounds)
    kind = "time_regression" if middle > line_log and p_value <= TIME_ALPHA else "ok"
    why = Paired(
        ref=m.pair_ref or "?",
        figure=m.pair_figure or "time",
        rounds=k,
        slower=slower,
        ratio=math.exp(middle),
        spread=math.exp(spread_log) - 1,
        line=line,
        factor=factor,
        min_effect=TIME_MIN_EFFECT,
        alpha=TIME_ALPHA,
    )
    return Verdict(
        kind=kind,
        blocking=_blocking(kind, config, c),
        why=why,
        baseline_value=base,
        threshold=line * base,
        candidate_value=statistics.median(h for h, _ in rounds),
        baseline_runs=k,
        p_value=p_value,
        **_about(c),
    )


def verdict(c: Candidate, config: Config) -> Verdict | None:
    """Paired where the run measured a pair, else against the history's uncontended runs;
    abstained where the candidate was timed on a contended machine."""
    m = c.m
    if m.pair_times_s and m.pair_ref_times_s:
        found_pair = paired(c, config)
        if found_pair is not None:
            return found_pair
    common = _about(c)
    busy = Load.of(m).oversubscribed()
    if busy:
        return Verdict(kind="abstained", blocking=False, why=Abstained(busy), **common)
    quiet = [p for p in c.points if p.status == "ok" and not p.load.oversubscribed()]
    found = _figure(m, quiet)
    if found is None:
        return None
    what, cand, medians = found
    value = statistics.median(cand)
    base = statistics.median(medians)
    n = len(medians)
    spread = 1.4826 * statistics.median(abs(x - base) for x in medians) if n >= 2 else 0.0
    factor = config.headroom_factor
    threshold = base + max(factor * spread, TIME_MIN_EFFECT * base)
    as_slow = sum(x >= value for x in medians)
    slowest = max(medians)
    p_value = (as_slow + 1) / (n + 1)
    provisional = n < config.min_baseline_runs
    slower = value > threshold and value > slowest * (1 + TIME_MIN_EFFECT)
    kind = "time_regression" if not provisional and slower and p_value <= TIME_ALPHA else "ok"
    why = Unpaired(
        figure=what,
        runs=n,
        iterations=len(cand),
        left_out=sum(p.status == "ok" and bool(p.load.oversubscribed()) for p in c.points),
        spread=spread,
        factor=factor,
        min_effect=TIME_MIN_EFFECT,
        as_slow=as_slow,
        slowest=slowest,
        alpha=TIME_ALPHA,
        needed=rank_runs_needed(),
        window=config.baseline_runs,
        minimum=config.min_baseline_runs,
    )
    return Verdict(
        kind=kind,
        blocking=_blocking(kind, config, c, provisional),
        why=why,
        baseline_value=base,
        threshold=threshold,
        candidate_value=value,
        baseline_runs=n,
        provisional=provisional,
        p_value=p_value,
        **common,
    )


__all__ = ["TIME_ALPHA", "TIME_MIN_EFFECT", "paired", "rank_runs_needed", "sign_test", "verdict"]
