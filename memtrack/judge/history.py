"""The base branch's history: the commits where a series stepped, and slow creep.

A per-PR threshold sees one change at a time; it misses ten changes that each stay inside
the headroom. The steps of every memory series along the base branch are its levels, found
by the gate's own model (memtrack.judge.noise), and each series' growth since an anchor (a
tag, or the run N commits ago; a series that starts after it, from its first run) is
measured against a tolerance. The growth is read off a fitted trend, never two single runs:

    fitted(x) = level(x) + slope x x      levels: the series' steps; slope: the median of
                                          the slopes of every pair of runs in one level
    growth    = fitted(latest) - fitted(anchor)
    allowed   = max(creep_tolerance x fitted(anchor), factor x the growth's standard error)

so a noisy run at either end moves neither. An accepted step's growth (a reviewed trailer)
is never flagged. Pure: memtrack.judge.gather.history reads the series and what accepted a
step, and calls these.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memtrack.config import Config
from memtrack.judge import noise
from memtrack.records import metrics
from memtrack.units import parse_time

MAX_LAGS = 24
"""A long window's slope is the median over pairs at this many lags, not over all pairs."""
MEDIAN_VARIANCE = math.pi / 2
"""The variance of a median of k normal runs, in sigma^2 / k (large k): a level's error."""


@dataclass(frozen=True)
class Step:
    """A commit where a series moved by more than its headroom."""

    case_id: str
    metric: str
    commit: str
    """The first commit at the new level: the one that introduced the change."""
    previous_commit: str
    """The last commit at the old level (recorded runs only; commits between had none)."""
    subject: str | None
    before: float
    """Median of the segment before the step."""
    after: float
    delta: float
    delta_pct: float
    headroom: float
    """The headroom of the series: the smallest move that is a step."""
    accepted: str | None = None
    """A step up that a reviewed `Memtrack-Accept` trailer allowed: its reason (the
    acceptance the base branch's check recorded, else a trailer of the commits the step
    brought that allows its growth)."""
    commits: int | None = None
    """The commits the step brought (after `previous_commit`, up to `commit`), where git
    knows both: more than one, and `memtrack bisect` finds which."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.case_id, self.metric, self.commit)


@dataclass(frozen=True)
class Creep:
    """A series' growth since the anchor."""

    case_id: str
    metric: str
    anchor_commit: str
    anchor_value: float
    latest_commit: str
    latest_value: float
    delta: float
    delta_pct: float
    allowed: float
    """max(tolerance x anchor value, factor x the growth's standard error)."""
    flagged: bool
    steps_between: int
    """Steps found between the anchor and the latest point; 0 with a flag: slow creep."""
    trend: float = 0.0
    """The part of the growth the slope within levels makes (the rest is steps)."""
    runs: int = 0
    """Runs from the anchor to the latest, the fit's points."""
    accepted: float = 0.0
    """The growth of the steps between that were accepted: reviewed, never flagged. The
    series is flagged only where the rest of its growth is past what is allowed."""
    error: float = 0.0
    """The growth's standard error."""
    tolerance: float = 0.0
    young: bool = False
    """The series starts after the anchor: measured from its first run."""
    trend_flagged: bool = False
    """The growth, accepted steps included, is past what is allowed."""
    largest: tuple[float, str] | None = None
    """The largest step between: its delta and commit."""
    taken: tuple[tuple[str, str], ...] = ()
    """The accepted steps between: their commit and reason."""


@dataclass(frozen=True)
class HistoryResult:
    base_branch: str
    fingerprint: str
    anchor_label: str
    series: int
    commits: int
    steps: tuple[Step, ...]
    creeps: tuple[Creep, ...]
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        """1 when a series crept past the tolerance, else 0 (steps are already merged, and
        an accepted step is never counted)."""
        return 1 if any(c.flagged for c in self.creeps) else 0


@dataclass(frozen=True)
class SeriesPoint:
    """One commit of a series: its runs' figures, the median of each metric."""

    position: int
    """Order along the base branch (first-parent position, or time order)."""
    commit: str
    subject: str | None
    values: dict[str, float]
    samples: list[list[int]] = field(default_factory=list)
    """Each run's allocated peak of every measured iteration."""


@dataclass(frozen=True)
class Trend:
    """A series' growth from its anchor to its latest run, on the fitted trend."""

    anchor_value: float
    latest_value: float
    growth: float
    trend: float
    error: float
    allowed: float
    flagged: bool
    steps_between: int
    runs: int


@dataclass(frozen=True)
class SeriesFit:
    """One series judged: its steps, and its growth since an anchor on a fitted trend."""

    starts: tuple[int, ...]
    """Indexes where a new level starts (the steps)."""
    room: float
    """The headroom: the smallest step reported."""
    anchor_index: int | None = None
    creep: Trend | None = None
    """None without an anchor, or with no run after it."""


def _samples(raw: str | None) -> list[int]:
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [int(x) for x in found] if isinstance(found, list) else []


def _epoch(iso: str | None) -> float | None:
    t = parse_time(iso)
    return None if t is None else t.timestamp()


def series_points(
    rows: Iterable[Any],
    base_branch: str,
    patterns: tuple[str, ...],
    order: dict[str, int] | None,
    notes: list[str],
) -> dict[str, list[SeriesPoint]]:
    """Case id -> its points, oldest first: the rows of the base branch's runs (a run's
    commit, subject, times, case, samples and metric columns) grouped by case and commit,
    only cases whose id holds one of `patterns` (when given). `order`: commit -> position
    on the first-parent history (a commit not on it is left out, in a note); without, the
    commits are ordered by time."""
    per: dict[tuple[str, str], list[Any]] = defaultdict(list)
    times: dict[str, float] = {}
    subjects: dict[str, str | None] = {}
    dropped: set[str] = set()
    for r in rows:
        commit = r["git_commit"]
        if not commit or (patterns and not any(p in r["case_id"] for p in patterns)):
            continue
        if order is not None and commit not in order:
            dropped.add(commit)
            continue
        per[(r["case_id"], commit)].append(r)
        t = _epoch(r["git_committed_at"]) or _epoch(r["started_at"]) or 0.0
        times[commit] = min(times.get(commit, t), t)
        subjects[commit] = r["git_subject"]
    if dropped:
        notes.append(
            f"{len(dropped)} recorded commit(s) are not on the first-parent history "
            f"of {base_branch} (rewritten?): left out"
        )
    if order is None:
        ranked = sorted(times, key=lambda c: times[c])
        order = {c: i for i, c in enumerate(ranked)}
    series: dict[str, list[SeriesPoint]] = defaultdict(list)
    for (case, commit), runs in per.items():
        values = {}
        for metric, col in metrics.COLUMNS.items():
            xs = [r[col] for r in runs if r[col] is not None]
            if xs:
                values[metric] = float(statistics.median(xs))
        samples = [_samples(r["allocated_samples"]) for r in runs]
        series[case].append(SeriesPoint(order[commit], commit, subjects[commit], values, samples))
    for points in series.values():
        points.sort(key=lambda p: p.position)
    return dict(series)


def _slope(xs: list[float], ys: list[float], levels: list[int]) -> float:
    """Theil-Sen within levels: the median slope of pairs of runs in one level."""
    n = len(xs)
    if n > 2 * MAX_LAGS:
        lags = sorted(
            {max(1, round(n * k / (MAX_LAGS + 1))) for k in range(1, MAX_LAGS + 1)} | {1, 2, 3}
        )
        pairs = ((i, i + g) for g in lags for i in range(n - g))
    else:
        pairs = ((i, j) for i in range(n) for j in range(i + 1, n))
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i, j in pairs
        if levels[i] == levels[j] and xs[j] != xs[i]
    ]
    return statistics.median(slopes) if slopes else 0.0


def judge_series(
    values: list[float],
    metric: str,
    config: Config,
    *,
    anchor_index: int | None = None,
    positions: list[float] | None = None,
    samples: Sequence[Sequence[float]] = (),
) -> SeriesFit:
    """Steps of one series (oldest first) and, from `anchor_index`, its growth on a fitted
    trend: levels at the steps plus one slope within them (see the module). `samples`: each
    run's iterations (the allocated view), noise one run shows in its own."""
    factor = config.headroom_factor
    floor = metrics.floor(metric, statistics.median(values))
    within = noise.within_runs(samples) if metric == "allocated" else 0.0
    lv = noise.levels(values, factor, floor, within=within)
    found, room = list(lv.starts), lv.room
    if anchor_index is None or anchor_index >= len(values) - 1:
        return SeriesFit(tuple(found), room, anchor_index)
    xs = positions or [float(i) for i in range(len(values))]
    xs, ys = xs[anchor_index:], values[anchor_index:]
    level = [sum(i >= s for s in found) for i in range(anchor_index, len(values))]
    slope = _slope(xs, ys, level)
    # each level's intercept: the median of its runs less the trend
    intercept: dict[int, float] = {}
    for k in set(level):
        intercept[k] = statistics.median(
            y - slope * x for x, y, lv_ in zip(xs, ys, level, strict=True) if lv_ == k
        )
    first, last = intercept[level[0]] + slope * xs[0], intercept[level[-1]] + slope * xs[-1]
    growth, trend = last - first, slope * (xs[-1] - xs[0])
    # The growth's standard error: the slope's over the spread of positions within levels,
    # and the two levels' medians where the anchor and the latest are in different ones.
    sigma = lv.noise
    centred = 0.0
    for k in set(level):
        mine = [x for x, lv_ in zip(xs, level, strict=True) if lv_ == k]
        mean = statistics.fmean(mine)
        centred += sum((x - mean) ** 2 for x in mine)
    err2 = (sigma * (xs[-1] - xs[0])) ** 2 / centred if centred else sigma**2
    if level[0] != level[-1]:
        for k in (level[0], level[-1]):
            err2 += MEDIAN_VARIANCE * sigma**2 / level.count(k)
    error = err2**0.5
    allowed = max(config.creep_tolerance * abs(first), factor * error)
    creep = Trend(
        first, last, growth, trend, error, allowed, growth > allowed, level[-1] - level[0], len(ys)
    )
    return SeriesFit(tuple(found), room, anchor_index, creep)


def fit(
    case_id: str,
    metric: str,
    pts: list[SeriesPoint],
    config: Config,
    anchor_pos: int | None,
) -> tuple[SeriesFit, list[Step]]:
    """One series (two points or more of `metric`, oldest first): its fit from the point at
    or before `anchor_pos` (a series younger than the anchor: from its first point), and its
    steps, not yet said accepted or not."""
    values = [p.values[metric] for p in pts]
    anchor_i = None
    if anchor_pos is not None:
        at = [i for i, p in enumerate(pts) if p.position <= anchor_pos]
        anchor_i = at[-1] if at else 0
    found = judge_series(
        values,
        metric,
        config,
        anchor_index=anchor_i,
        positions=[float(p.position) for p in pts],
        samples=[s for p in pts for s in p.samples],
    )
    bounds = [0, *found.starts, len(values)]
    steps = []
    for k, i in enumerate(found.starts, start=1):
        before = statistics.median(values[bounds[k - 1] : i][-20:])
        after = statistics.median(values[i : bounds[k + 1]][:20])
        delta = after - before
        steps.append(
            Step(
                case_id,
                metric,
                pts[i].commit,
                pts[i - 1].commit,
                pts[i].subject,
                before,
                after,
                delta,
                100 * delta / before if before else 0.0,
                found.room,
            )
        )
    return found, steps


def creep(
    case_id: str,
    metric: str,
    pts: list[SeriesPoint],
    found: SeriesFit,
    steps: list[Step],
    config: Config,
    anchor_pos: int | None,
) -> Creep | None:
    """A series' growth from its anchor point to its latest (None without an anchor, or with
    nothing after it); `steps` say which were accepted: their growth is never flagged."""
    t, at = found.creep, found.anchor_index
    if t is None or at is None:
        return None
    young = not any(p.position <= (anchor_pos or 0) for p in pts)
    pct = 100 * t.growth / t.anchor_value if t.anchor_value else 0.0
    between = [st for i, st in zip(found.starts, steps, strict=True) if i > at]
    taken = [st for st in between if st.accepted]
    accepted = sum((st.delta for st in taken), 0.0)
    largest = max(between, key=lambda st: abs(st.delta)) if between else None
    return Creep(
        case_id,
        metric,
        pts[at].commit,
        t.anchor_value,
        pts[-1].commit,
        t.latest_value,
        t.growth,
        pct,
        t.allowed,
        t.flagged and t.growth - accepted > t.allowed,
        len(between),
        t.trend,
        t.runs,
        accepted,
        error=t.error,
        tolerance=config.creep_tolerance,
        young=young,
        trend_flagged=t.flagged,
        largest=(largest.delta, largest.commit) if largest else None,
        taken=tuple((st.commit, st.accepted or "") for st in taken),
    )


def analyze_series(
    case_id: str,
    metric: str,
    pts: list[SeriesPoint],
    config: Config,
    anchor_pos: int | None,
    accepted: Mapping[tuple[str, str, str], str] | None = None,
) -> tuple[list[Step], Creep | None]:
    """One series judged: its steps (each said accepted where `accepted`, by step key, gives
    its reason), and its creep since the anchor."""
    from dataclasses import replace

    found, steps = fit(case_id, metric, pts, config, anchor_pos)
    steps = [replace(s, accepted=(accepted or {}).get(s.key)) for s in steps]
    return steps, creep(case_id, metric, pts, found, steps, config, anchor_pos)


__all__ = [
    "MAX_LAGS",
    "MEDIAN_VARIANCE",
    "Creep",
    "HistoryResult",
    "SeriesFit",
    "SeriesPoint",
    "Step",
    "Trend",
    "analyze_series",
    "creep",
    "fit",
    "judge_series",
    "series_points",
]
