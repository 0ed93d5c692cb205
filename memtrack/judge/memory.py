"""Memory verdicts: a candidate's figure against the current level of its baseline, by the
model of memtrack.judge.noise:

    threshold = baseline + headroom          headroom = max(factor x sigma x c(n), floor)

A candidate above the threshold is a regression, unless a reviewed acceptance covers the
growth; below the baseline less the headroom, an improvement. Where the observed noise has
pushed the headroom past `noisy_above` of the baseline, a growth within it is `noisy`: a
property of the case, said once. Two rules beside the model:

- PROVISIONAL. While the noise is known from fewer than `min_baseline_runs` runs (runs on
  other environments count), a regression blocks only past a jump of this share of the
  baseline and past factor x the floor. On the shipped suite's real reruns no unchanged run
  jumps this far against 1 to 20 others (scripts/bench_check.py). Budgets always block.
- A concurrent case peaks where its sessions happen to overlap, below the sum of its
  sessions (measured in the same run, whatever the interleaving). Above the baseline, its
  headroom is that bound's: no interleaving of unchanged code passes it. Below, it is the
  model's, and never narrower than the bound's: no improvement inside the noise seen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from memtrack.config import Budget, Config
from memtrack.judge import accept, noise
from memtrack.judge.budgets import budget_use, default_budget_metric
from memtrack.judge.evidence import Point
from memtrack.judge.verdict import Accepted, BudgetChange, Headroom, Verdict, Would
from memtrack.records import Measurement, metrics

MiB = 2**20

PROVISIONAL = 0.10
"""A provisional regression blocks only past a jump of this share of its baseline."""


@dataclass(frozen=True)
class Candidate:
    """What one case of the candidate is judged with."""

    m: Measurement
    points: Sequence[Point]
    """Same-environment baseline runs, newest first."""
    budgets: dict[str, Budget] = field(default_factory=dict)
    changes: Sequence[BudgetChange] = ()
    acceptances: Sequence[accept.Acceptance] = ()
    context: str = "pull_request"
    known: Sequence[Point] = ()
    """Runs of the case on other environments, newest first: noise this window lacks."""
    values: Mapping[str, float] = field(default_factory=dict)
    """The figures judged, where the commit measured the case in several runs (the lower
    median over them); else the measurement's own."""

    def value(self, metric: str) -> float | None:
        """The candidate's figure of `metric`."""
        if metric in self.values:
            return self.values[metric]
        found = metrics.value(self.m, metric)
        return None if found is None else float(found)


def changes_for(c: Candidate, metric: str) -> tuple[BudgetChange, ...]:
    """The budget changes of this revision that touch this figure."""
    default = default_budget_metric(c.m)
    return tuple(ch for ch in c.changes if (ch.metric or default) == metric)


def window(c: Candidate, metric: str) -> list[Point]:
    """The baseline runs that measured `metric` ok, oldest first."""
    return [p for p in reversed(c.points) if p.status == "ok" and metric in p.values]


def known_differences(points: Sequence[Point], metric: str, factor: float) -> tuple[list, int]:
    """Other environments' runs (each environment split at its own steps): their successive
    differences within levels, and how many runs they are. Noise is the case's; an upgrade's
    step is not noise."""
    groups: dict[str | None, list[float]] = {}
    for p in reversed(points):
        if p.status == "ok" and metric in p.values:
            groups.setdefault(p.fingerprint, []).append(float(p.values[metric]))
    diffs: list[float] = []
    runs = 0
    for values in groups.values():
        floor = metrics.floor(metric, statistics.median(values))
        lv = noise.levels(values, factor, floor)
        diffs += noise.differences(values, lv.starts)
        runs += len(values)
    return diffs, runs


def levels_of(
    c: Candidate, metric: str, config: Config, points: Sequence[Point]
) -> tuple[noise.Levels, int]:
    """The window split at its steps, with the noise known (and how many runs of other
    environments it counts)."""
    values = [float(p.values[metric]) for p in points]
    factor = config.headroom_factor
    short = len(values) < 2 * config.min_baseline_runs
    known, known_runs = known_differences(c.known, metric, factor) if short else ([], 0)
    within = noise.within_runs([p.samples for p in points]) if metric == "allocated" else 0.0
    floor = metrics.floor(metric, statistics.median(values))
    return noise.levels(values, factor, floor, known, within), known_runs


def sessions_bound(m: Measurement, points: Sequence[Point], factor: float) -> float | None:
    """A concurrent case's bound: the sum of its sessions at the level that series is at now
    (the largest of the level); None for a case of one session, or a window that never
    measured it."""
    if m.sessions_sum_bytes is None:
        return None
    sums = [float(p.values["sessions"]) for p in points if "sessions" in p.values]
    if not sums:
        return None
    lv = noise.levels(sums, factor, metrics.floor("sessions", max(sums)))
    return max(lv.current)


def verdict(c: Candidate, metric: str, config: Config) -> Verdict | None:
    """The figure against its level and budget; None where the candidate or every baseline
    run lacks it (the caller's `new` judges a figure without a baseline)."""
    m = c.m
    value = c.value(metric)
    points = window(c, metric)
    if value is None or not points:
        return None
    lv, known_runs = levels_of(c, metric, config, points)
    base = lv.median
    floor = metrics.floor(metric, base)
    factor = config.headroom_factor
    room = down = max(lv.room, float(floor))
    provisional = len(points) + known_runs < config.min_baseline_runs
    bound = sessions_bound(m, points, factor) if metric == "allocated" else None
    if bound is not None:  # above, no interleaving passes the bound; below, the noise seen
        room, provisional = max(bound + floor - base, float(floor)), False
        down = max(room, down)
    budget = budget_use(m, metric, c.budgets.get(metric))
    over = budget is not None and budget.over(value)
    delta = value - base
    delta_pct = 100.0 * delta / base if base else None
    found = accept.find(
        c.acceptances, accept.Growth(m.workload, m.case_id, metric, delta, delta_pct)
    )
    too_wide = bound is None and room > floor and room > config.noisy_above * base
    kind, blocking = decide(
        value, base, room, down, over, too_wide, found, provisional, factor * floor
    )
    level_points = [points[i] for i in lv.members]
    grew = what_grew(m, level_points, metric) if delta > 0 else None
    why = Headroom(
        noise=lv.noise,
        widen=noise.small_sample(lv.runs),
        runs=lv.runs,
        known_runs=known_runs,
        window_runs=len(points),
        level_runs=len(lv.members),
        factor=factor,
        floor=float(floor),
        steps=len(lv.starts),
        level_since=points[lv.start].commit if lv.starts else None,
        bound=bound,
        sessions=str(m.params.get("concurrency", "its")) if bound is not None else None,
        suggested_budget=suggest(value, room, budget) if kind == "improvement" else None,
        sharpen=sharpen(m, metric, len(points), config) if kind == "noisy" else None,
        noisy_above=config.noisy_above,
        component=grew[0] if grew else None,
        component_delta=grew[1] if grew else None,
    )
    return Verdict(
        case_id=m.case_id,
        workload=m.workload,
        metric=metric,
        kind=kind,
        blocking=blocking and c.context != "base",  # the base branch is never blocked
        context=c.context,
        why=why,
        baseline_value=base,
        threshold=base + room,
        candidate_value=float(value),
        baseline_runs=len(lv.members),
        provisional=provisional,
        budget=budget,
        changes=changes_for(c, metric),
        acceptance=acceptance(c, metric, kind, found),
        would=would(c, metric, kind, delta, delta_pct),
    )


def decide(
    value: float,
    base: float,
    room: float,
    down: float,
    over: bool,
    too_wide: bool,
    found: accept.Acceptance | None,
    provisional: bool,
    past: float,
) -> tuple[str, bool]:
    """The kind, and whether it blocks a pull request."""
    delta = value - base
    delta_pct = 100.0 * delta / base if base else None
    if over:
        return "over_budget", True
    if delta > room:
        if found is not None and found.allows(delta, delta_pct):
            return "accepted", False
        jumped = delta_pct is not None and delta_pct >= 100 * PROVISIONAL and delta > past
        return "regression", not provisional or jumped
    if too_wide:
        return "noisy", False
    if delta < -down:
        return "improvement", False
    return "ok", False


def acceptance(
    c: Candidate, metric: str, kind: str, found: accept.Acceptance | None
) -> Accepted | None:
    """The trailer that covers a grown figure: within it (`accepted`) or beyond it."""
    if found is None or kind not in ("accepted", "regression"):
        return None
    return Accepted(found.reason, found.commit, found.amount(), kind == "accepted")


def would(c: Candidate, metric: str, kind: str, delta: float, pct: float | None) -> Would | None:
    """A regression that a trailer of the change names but does not cover: that trailer, and
    the value that would accept it."""
    if kind != "regression":
        return None
    m = c.m
    found = accept.would_accept(
        c.acceptances, accept.Growth(m.workload, m.case_id, metric, delta, pct)
    )
    if found is None:
        return None
    given, wanted = found
    named = given.metric is not None and given.metric != metric
    return Would(given.commit, given.metric if named else None, given.amount(), wanted.value())


def suggest(value: float, room: float, budget: object) -> int | None:
    """A budget that holds `value` with its headroom and 10 % to grow, rounded up to MiB;
    None where the budget in force is already as tight."""
    need = value + max(room, value / 10)
    suggestion = int(math.ceil(need / MiB)) * MiB
    limit = getattr(budget, "limit_bytes", None)
    return suggestion if limit is None or suggestion < limit else None


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


def sharpen(m: Measurement, metric: str, window_runs: int, config: Config) -> str:
    """What would narrow a headroom too wide to judge. A steadier metric is suggested only
    where this run measured it (the CPU records no `requested`)."""
    tips = []
    if metric == "allocated" and m.repeats < 5:
        tips.append(f"more repeats (now {m.repeats})")
    if window_runs < config.baseline_runs:
        tips.append(f"more baseline runs (now {window_runs} of {config.baseline_runs})")
    steadier = "requested" if metric == "allocated" else "allocated"
    if metrics.value(m, steadier) is None or steadier == metric:
        steadier = ""
    tips.append(
        "a budget on this metric"
        + (f", or gating on a steadier one ({steadier})" if steadier else "")
    )
    return ", ".join(tips)


__all__ = [
    "PROVISIONAL",
    "Candidate",
    "decide",
    "known_differences",
    "levels_of",
    "sessions_bound",
    "suggest",
    "verdict",
    "what_grew",
    "window",
]
