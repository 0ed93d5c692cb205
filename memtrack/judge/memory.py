"""Memory verdicts: a candidate's figure against the current level of its baseline.

    level     = the baseline runs since the newest step of the series (see levels)
    baseline  = median of the level
    spread    = max(max(noise within the window's levels, noise of the runs' median
                        iteration (allocated)) x t(0.99, n-1) / z(0.99) for n < 20 runs,
                    candidate's repeat spread)
    headroom  = max(factor x spread, floor)
    threshold = baseline + headroom

A candidate above the threshold is a regression, unless a reviewed acceptance covers the
growth. Where the headroom is too wide to judge (above `noisy_above` of the baseline), a
growth within it is `noisy`: a property of the case (how wide, and what would sharpen it)
that the report says once, not a warning about the change. Every verdict carries its
arithmetic in its message.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memtrack.config import Budget, Config
from memtrack.judge import accept, leak
from memtrack.judge.baseline import Point
from memtrack.judge.budgets import (
    BudgetChange,
    budget_part,
    default_budget_metric,
    device_memory,
)
from memtrack.judge.levels import Level, current_level, pooled_spread, segment, within_runs
from memtrack.judge.verdict import Headroom, Verdict
from memtrack.records import Measurement, metrics
from memtrack.units import format_size

MiB = 2**20

PROVISIONAL_BLOCK_FRACTION = 0.10
"""The provisional rule, one for every verdict: while a case's noise is known from too few
runs (fewer than `min_baseline_runs`, or fewer than twice that for a figure that has
varied; runs on other environments count, since noise is a property of the case), a
regression blocks only past a jump of this share of the baseline (10 %) and past factor x
the metric's floor (a small figure, such as a step's host growth, jumps by a tenth within
one huge page or two). Smaller ones are reported. Budgets always block. On the shipped
suite's real reruns no unchanged run jumps this far against 1 to 20 others (see
scripts/bench_check.py); a concurrent case's peak, which moves by up to 17 % with how its
sessions interleave, is judged against the sum of its sessions instead."""


@dataclass
class Candidate:
    """What is known about one candidate case while judging it."""

    m: Measurement
    points: list[Point]
    """Same-environment baseline runs, newest first."""
    budgets: dict[str, Budget]
    provisional: bool
    changes: list[BudgetChange] = field(default_factory=list)
    acceptances: list[accept.Acceptance] = field(default_factory=list)
    context: str = "pull_request"
    known: list[Point] = field(default_factory=list)
    """Eligible runs of the case on other environments, newest first: what the history
    knows of its noise where this environment's window is short."""

    def figure(self, metric: str) -> tuple[int, Budget | None, bool, tuple[str, ...]] | None:
        """The candidate's value of a metric, its budget, whether it is over it, and the
        budget changes of this revision that touch it; None where it was not measured."""
        value = metrics.value(self.m, metric)
        if value is None:
            return None
        budget = self.budgets.get(metric)
        changes = tuple(
            ch.describe()
            for ch in self.changes
            if (ch.metric or default_budget_metric(self.m)) == metric
        )
        over = budget is not None and value > budget.limit_bytes
        memory = device_memory(self.m, metric)
        if budget is not None and memory is not None:
            # a budget is a per-device limit: no device holds more than its own memory
            if value > memory[0]:
                over = True
            elif budget.limit_bytes > memory[0]:
                changes += (
                    f"budget {format_size(budget.limit_bytes)} is above the "
                    f"{format_size(memory[0])} of {memory[1]}: a peak that fits "
                    "the device is all it can hold",
                )
        return value, budget, over, changes

    def budget_part(self, metric: str, value: int, budget: Budget | None) -> str:
        return budget_part(value, budget, device_memory(self.m, metric))


def repeat_spread(m: Measurement, metric: str) -> int:
    """How far the candidate's own iteration peaks scatter: 1.4826 x MAD, so that one odd
    iteration (a first one before a lazy buffer exists, say) cannot widen the headroom.
    Two samples cannot tell an outlier from noise: below three repeats it is not estimated
    (the baseline's spread still is). Only the framework's allocated view is per iteration."""
    samples = leak.steady(m)
    if metric != "allocated" or len(samples) < 3:
        return 0
    return int(round(_mad_spread(samples)))


def iteration_series(points: Sequence[Point], values: Sequence[float]) -> list[float]:
    """Each run's median iteration (oldest first), for the allocated view: a second view of
    the same step, which one odd iteration (high or low) never moves; a run of fewer than
    three iterations gives its figure. It sees a figure that takes a few discrete values
    move where a short window of peaks happens to repeat one value; a peak that is
    deterministic has a deterministic median iteration too."""
    return [
        float(statistics.median(p.samples)) if len(p.samples) >= 3 else v
        for p, v in zip(points, values, strict=True)
    ]


def within_run(points: Sequence[Point]) -> float:
    """The noise one run shows in its own iterations, the median over runs: no step
    between runs reaches it (see levels.within_runs)."""
    return within_runs([p.samples for p in points])


def _mad_spread(samples: Sequence[int]) -> float:
    med = statistics.median(samples)
    return 1.4826 * statistics.median(abs(s - med) for s in samples)


# Student's t at 0.99 (one-sided) for 2..19 degrees of freedom, over the normal's 2.326.
_T99 = (
    6.965,
    4.541,
    3.747,
    3.365,
    3.143,
    2.998,
    2.896,
    2.821,
    2.764,
    2.718,
    2.681,
    2.650,
    2.624,
    2.602,
    2.583,
    2.567,
    2.552,
    2.539,
)


def small_sample(n: int) -> float:
    """How much wider a spread from n runs must be to bound the next run as the true one
    would: t(0.99, n - 1) / z(0.99); 1 from 20 runs on (below 3 runs nothing blocks)."""
    if n >= 20:
        return 1.0
    return _T99[max(n, 3) - 3] / 2.326


def iteration_range(samples: Sequence[int]) -> float:
    """Half the range of one run's iteration peaks: how far one run already moves."""
    return (max(samples) - min(samples)) / 2 if len(samples) >= 2 else 0.0


def headroom(spread: float, factor: float, floor: float) -> float:
    return max(factor * spread, float(floor))


def suggest_budget(value: int, room: float) -> int:
    """A budget that holds `value` with its headroom and 10 % to grow, rounded up to MiB."""
    need = value + max(room, value / 10)
    return int(math.ceil(need / MiB)) * MiB


def pct(delta: float, base: float) -> float | None:
    return None if not base else 100.0 * delta / base


def fmt_pct(p: float | None) -> str:
    return "n/a" if p is None else f"{p:+.2f}%"


def fmt_delta(d: float) -> str:
    n = int(round(d))
    if abs(n) < 1024:
        return f"{n:+,} B"
    return f"{'+' if n >= 0 else '-'}{format_size(abs(n))} ({n:+,} B)"


def what_grew(m: Measurement, level: Sequence[Point], metric: str) -> tuple[str, float] | None:
    """The breakdown part that grew the most against the level (median per part)."""
    if not metrics.METRICS[metric].breakdown:
        return None  # the breakdown is of tensor and device memory, not of the host
    grown = []
    for name, column in metrics.COMPONENTS.items():
        if name == "workspace" and metric not in ("reserved", "device"):
            continue
        now = getattr(m, column, None)
        before = [p.components[name] for p in level if name in p.components]
        if now is not None and before:
            grown.append((now - statistics.median(before), name))
    if not grown:
        return None
    delta, name = max(grown)
    return (name, float(delta)) if delta > 0 else None


def _sharpen(m: Measurement, metric: str, n_window: int, config: Config) -> str:
    """What would narrow a headroom too wide to judge. A steadier metric is suggested only
    where this run measured it (the CPU records no `requested`)."""
    tips = []
    if metric == "allocated" and m.repeats < 5:
        tips.append(f"more repeats (now {m.repeats})")
    if n_window < config.baseline_runs:
        tips.append(f"more baseline runs (now {n_window} of {config.baseline_runs})")
    steadier = next(
        (
            x
            for x in ({"allocated": ("requested",)}.get(metric, ("allocated",)))
            if x != metric and metrics.value(m, x) is not None
        ),
        None,
    )
    tips.append(
        "a budget on this metric"
        + (f", or gating on a steadier one ({steadier})" if steadier else "")
    )
    return ", ".join(tips)


@dataclass(frozen=True)
class KnownNoise:
    """A case's noise as its runs on other environments show it, level by level."""

    segments: tuple[tuple[float, ...], ...] = ()
    also_noise: float = 0.0
    runs: int = 0


def known_noise(points: Sequence[Point], metric: str, factor: float) -> KnownNoise:
    """Each other environment's runs (oldest first, by fingerprint) split at their steps:
    noise is a property of the case, and an upgrade is a step, not noise."""
    groups: dict[str | None, list[Point]] = {}
    for p in reversed(points):
        if p.status == "ok" and metric in p.values:
            groups.setdefault(p.fingerprint, []).append(p)
    segments: list[tuple[float, ...]] = []
    also, runs = 0.0, 0
    for group in groups.values():
        level = _level(group, [float(p.values[metric]) for p in group], metric, factor)
        segments += level.segments
        also = max(also, level.also_noise)
        runs += len(group)
    return KnownNoise(tuple(segments), also, runs)


def _level(window: Sequence[Point], values: list[float], metric: str, factor: float) -> Level:
    """The window (oldest first) split at its steps, the allocated view with its
    iterations (see levels.segment)."""
    allocated = metric == "allocated"
    floor = metrics.floor(metric, statistics.median(values))
    seg = segment(
        values,
        factor,
        floor,
        also=iteration_series(window, values) if allocated else None,
        within=within_run(window) if allocated else 0.0,
        lows=[
            float(min(p.samples)) if p.samples else v for p, v in zip(window, values, strict=True)
        ]
        if allocated
        else None,
    )
    return current_level(values, factor, floor, seg)


@dataclass(frozen=True)
class _Noise:
    """The level a candidate is judged against, and what is known of the case's noise."""

    level: Level
    level_spread: float
    """The spread within levels, other environments' included where the window is short."""
    s_iter: float
    """The median iteration's noise (allocated), or one run's iteration range (provisional)."""
    window_runs: int
    runs: int
    """Runs the noise is known from: the window's and other environments'."""
    known_runs: int
    provisional: bool


def _noise(
    c: Candidate, window: list[Point], values: list[float], metric: str, config: Config
) -> _Noise:
    """The window split at its steps and the noise within its levels (see the module)."""
    factor = config.headroom_factor
    level = _level(window, values, metric, factor)
    # Where this environment's window is short, what other environments' runs know of the
    # case's noise counts too (the level itself is this environment's).
    short = len(values) < 2 * config.min_baseline_runs
    known = known_noise(c.known, metric, factor) if c.known and short else KnownNoise()
    level_spread = pooled_spread([*level.segments, *known.segments])
    s_iter = max(level.also_noise, known.also_noise)
    runs = len(values) + known.runs
    # A noisy figure's spread is not known from a few runs (three can fall close by chance):
    # its verdicts stay provisional for twice as many runs as a deterministic one's. The
    # level is still the one the history moved to: a step, accepted or not, is no noise.
    provisional = runs < config.min_baseline_runs or (
        runs < 2 * config.min_baseline_runs and max(level_spread, s_iter) > 0
    )
    if provisional and metric == "allocated":
        # Too few runs to know the noise: the iterations of one run show how far the
        # allocated view moves.
        s_iter = max(
            [
                s_iter,
                *(iteration_range(p.samples) for p in window),
                iteration_range(leak.steady(c.m)),
            ]
        )
    return _Noise(level, level_spread, s_iter, len(values), runs, known.runs, provisional)


def verdict(c: Candidate, metric: str, config: Config) -> Verdict | None:
    """Headroom arithmetic against the baseline's current level, and the budget."""
    m = c.m
    figure = c.figure(metric)
    if figure is None:
        return None
    value, budget, over, details = figure
    common: dict[str, Any] = dict(
        case_id=m.case_id, workload=m.workload, metric=metric, candidate_value=float(value)
    )
    common.update(details=details, context=c.context, **_budget_fields(budget))
    window = [p for p in reversed(c.points) if p.status == "ok" and metric in p.values]
    if not window:  # the baseline never measured this view: the caller's 'new' judges it
        return None
    values = [float(p.values[metric]) for p in window]
    factor = config.headroom_factor
    noise = _noise(c, window, values, metric, config)
    level, provisional = noise.level, noise.provisional
    level_points = window[level.start :]
    base = level.median
    floor = metrics.floor(metric, base)
    s_rep, widen, spread = _spread(m, metric, noise)
    room = headroom(spread, factor, floor)
    # Concurrent sessions: the peak lies wherever their interleaving puts it, up to the sum
    # of the sessions (exact, whatever the interleaving); above it, the code changed.
    bound = sessions_bound(m, window, factor) if metric == "allocated" else None
    if bound is not None:
        room, provisional = max(bound + floor - base, float(floor)), False
    parts = Headroom(noise.s_iter, widen, noise.runs, noise.known_runs, bound)
    delta, delta_pct = value - base, pct(value - base, base)
    grew = what_grew(m, level_points, metric) if delta > 0 else None
    growth = accept.Growth(m.workload, m.case_id, metric, delta, delta_pct)
    acceptance = accept.find(c.acceptances, growth)
    # Too wide to judge: the observed noise, not the granularity floor, has pushed the
    # headroom past `noisy_above` of the baseline.
    too_wide = bound is None and room > floor and room > config.noisy_above * base
    kind, blocking, suggested = _decide(
        value, base, room, over, too_wide, provisional, acceptance, budget, factor * floor
    )
    blocking = blocking and c.context != "base"  # the base branch is never blocked
    sharpen = _sharpen(m, metric, noise.window_runs, config) if kind == "noisy" else None
    words = _words(
        kind, blocking, c.context, room, base, suggested, factor * floor, config, sharpen
    )
    words, would = _acceptance_words(words, c, metric, kind, acceptance, delta, delta_pct)
    if grew is not None:
        words += f"; {grew[0]} grew {fmt_delta(grew[1])}"
    at_level = _at_level(level, level_points, noise.window_runs, provisional)
    arithmetic = (
        _bound_words(m, bound, floor, room)
        if bound is not None
        else _headroom_words(spread, noise.level_spread, parts, s_rep, factor, floor, room)
    )
    return Verdict(
        kind=kind,
        blocking=blocking,
        message=f"{metric}: baseline {format_size(int(base))} ({at_level}), {arithmetic}, "
        f"{_against(base, room, value)}: {words}{c.budget_part(metric, value, budget)}",
        provisional=provisional,
        baseline_value=float(base),
        spread=spread,
        baseline_spread=noise.level_spread,
        repeat_spread=float(s_rep),
        factor=factor,
        floor=float(floor),
        threshold=base + room,
        delta=float(delta),
        delta_pct=delta_pct,
        baseline_runs=len(level.values),
        suggested_budget=suggested,
        **_accepted_fields(kind, acceptance),
        would_accept=would[1].value() if would else None,
        component=grew[0] if grew else None,
        component_delta=grew[1] if grew else None,
        level_commit=level_points[0].commit if level.steps else None,
        words=words,
        sharpen=sharpen,
        headroom=parts,
        **common,
    )


def _accepted_fields(kind: str, acceptance: accept.Acceptance | None) -> dict[str, Any]:
    """An accepted verdict's reason and the commit of its trailer."""
    if kind != "accepted" or acceptance is None:
        return {"accepted_reason": None, "accepted_commit": None}
    return {"accepted_reason": acceptance.reason, "accepted_commit": acceptance.commit}


def _acceptance_words(
    words: str,
    c: Candidate,
    metric: str,
    kind: str,
    acceptance: accept.Acceptance | None,
    delta: float,
    delta_pct: float | None,
) -> tuple[str, tuple[accept.Acceptance, accept.Acceptance] | None]:
    """The verdict's words with what the change's trailers say of it: within or beyond the
    one covering it, and, for a regression a trailer names but does not cover, the trailer
    that would accept it (and that trailer, given and wanted)."""
    if acceptance is not None and kind in ("accepted", "regression"):
        words += f" ({'within' if kind == 'accepted' else 'beyond'} {acceptance.describe()})"
    if kind != "regression":
        return words, None
    m = c.m
    would = accept.would_accept(
        c.acceptances, accept.Growth(m.workload, m.case_id, metric, delta, delta_pct)
    )
    if would is not None:
        words += f"; {accept.would_words(would, metric)}"
    return words, would


def _spread(m: Measurement, metric: str, noise: _Noise) -> tuple[int, float, float]:
    """The candidate's repeat spread, the small-sample widening and the spread. A spread
    estimated from n runs bounds the next run less tightly than the true one would: widened
    as Student's t widens a prediction from n samples."""
    s_rep = repeat_spread(m, metric)
    widen = small_sample(noise.runs)
    return s_rep, widen, max(max(noise.level_spread, noise.s_iter) * widen, float(s_rep))


def _against(base: float, room: float, value: int) -> str:
    """'threshold 11.67 MiB; candidate 13.67 MiB, delta +2.00 MiB (+2,097,152 B) +17.14% >
    headroom'."""
    delta = value - base
    cmp = "> headroom" if delta > room else "< -headroom" if delta < -room else "within ±headroom"
    return (
        f"threshold {format_size(int(base + room))}; candidate {format_size(value)}, delta "
        f"{fmt_delta(delta)} {fmt_pct(pct(delta, base))} {cmp}"
    )


def _at_level(level: Level, points: Sequence[Point], window_runs: int, provisional: bool) -> str:
    """'median of 1 run at the level since 3f2a9c1e0b7d, 6 in the window'."""
    n = len(level.values)
    return (
        f"median of {n} run{'s' * (n != 1)}"
        + (f" at the level since {(points[0].commit or '?')[:12]}" if level.steps else "")
        + (f", {window_runs} in the window" if window_runs != n else "")
        + (", provisional" if provisional else "")
    )


def _bound_words(m: Measurement, bound: float, floor: float, room: float) -> str:
    """'bounded by the sum of 4 sessions 11.90 MiB (...), floor 512 B -> headroom ...'."""
    return (
        f"bounded by the sum of {m.params.get('concurrency', 'its')} sessions "
        f"{format_size(int(bound))} (the peak if every session peaked at once; how they "
        f"interleave moves it below that), floor {format_size(int(floor))} -> headroom "
        f"{format_size(int(room))}"
    )


def _budget_fields(budget: Budget | None) -> dict[str, Any]:
    if budget is None:
        return {"budget_bytes": None, "budget_reason": None}
    return {"budget_bytes": budget.limit_bytes, "budget_reason": budget.reason}


def _decide(
    value: int,
    base: float,
    room: float,
    over: bool,
    too_wide: bool,
    provisional: bool,
    acceptance: accept.Acceptance | None,
    budget: Budget | None,
    past: float,
) -> tuple[str, bool, int | None]:
    """The verdict's kind, whether it blocks (a pull request), and a tighter budget for an
    improvement. A provisional regression blocks only past the provisional rule's jump and
    `past` (factor x floor)."""
    delta = value - base
    delta_pct = pct(delta, base)
    if over:
        return "over_budget", True, None
    if value > base + room:
        if acceptance is not None and acceptance.allows(delta, delta_pct):
            return "accepted", False, None
        jumped = delta_pct is not None and delta_pct >= 100 * PROVISIONAL_BLOCK_FRACTION
        return "regression", not provisional or (jumped and delta > past), None
    if too_wide:
        return "noisy", False, None
    if delta < -room:
        suggestion = suggest_budget(value, room)
        tighter = budget is None or suggestion < budget.limit_bytes
        return "improvement", False, suggestion if tighter else None
    return "ok", False, None


def _words(
    kind: str,
    blocking: bool,
    context: str,
    room: float,
    base: float,
    suggested: int | None,
    past: float,
    config: Config,
    sharpen: str | None,
) -> str:
    """The verdict in words, at the end of its line of arithmetic."""
    if kind == "regression" and not blocking and context != "base":
        return (
            f"regression (provisional: blocks only past a {PROVISIONAL_BLOCK_FRACTION:.0%} "
            f"jump and past {format_size(int(past))})"
        )
    if kind == "improvement" and suggested:
        return f"improvement; a budget of {format_size(suggested)} would hold it"
    if kind == "noisy":
        return (
            f"noisy: the headroom is {fmt_pct(pct(room, base))[1:]} of the baseline, "
            f"wider than {config.noisy_above:.0%}, so a growth up to "
            f"{format_size(int(room))} would pass unseen; to sharpen it: {sharpen}"
        )
    return kind.replace("_", " ")


def sessions_bound(m: Measurement, window: Sequence[Point], factor: float) -> float | None:
    """A concurrent case's bound: the sum of its sessions at the level that series is at now
    (its own steps: it is deterministic where the peak is not), the largest of the level;
    None for a case of one session, or a window that never measured it."""
    if m.sessions_sum_bytes is None:
        return None
    sums = [float(p.values["sessions"]) for p in window if "sessions" in p.values]
    if not sums:
        return None
    return max(current_level(sums, factor, metrics.floor("sessions", max(sums))).values)


def _headroom_words(
    spread: float,
    levels: float,
    parts: Headroom,
    s_rep: int,
    factor: float,
    floor: float,
    room: float,
) -> str:
    """'spread 0 B (levels 0 B, repeats 0 B) x factor 3, floor 512 B -> headroom 512 B'."""
    known = parts.known_runs
    return (
        f"spread {format_size(int(spread))} (levels {format_size(int(levels))}"
        + (f", iterations {format_size(int(parts.iterations))}" if parts.iterations else "")
        + (
            f", x {parts.widen:.2f} for {parts.runs} runs"
            if parts.widen > 1 and max(levels, parts.iterations)
            else ""
        )
        + (
            f", the noise known from {known} more run{'s' * (known != 1)} on other environments"
            if known
            else ""
        )
        + f", repeats {format_size(s_rep)}) x factor {factor:g}, floor "
        f"{format_size(int(floor))} -> headroom {format_size(int(room))}"
    )


__all__ = [
    "PROVISIONAL_BLOCK_FRACTION",
    "Candidate",
    "headroom",
    "iteration_range",
    "iteration_series",
    "repeat_spread",
    "sessions_bound",
    "small_sample",
    "suggest_budget",
    "verdict",
    "what_grew",
    "within_run",
]
