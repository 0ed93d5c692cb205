"""The noise model: one page, every memory verdict, `check --history`, the dashboard's steps.

Model. The runs of one case and metric on one environment, in commit order, are

    x_i = L(i) + e_i

L piecewise constant: its levels are the steps the history took (a merged regression, its
revert, an accepted change, a re-land), never noise. e_i is noise of scale sigma, a
property of the case and metric: how it varies run to run on unchanged code.

    sigma     = the mean of the smallest 80 % of |x_i - x_(i-1)| within levels / 0.790
    n         = the runs sigma is read from (the differences, plus one)
    c(n)      = t(0.99, n - 1) / z(0.99)                        the small-sample factor
    headroom  = max(factor x sigma x c(n), floor)               factor: `headroom_factor`, 3
    steps     = least-squares change points of the window, each kept where the medians on
                either side differ by more than the headroom (a level of fewer than
                NEW_LEVEL_RUNS runs in a varying series: by more than twice the headroom)
    baseline  = the median of the newest level
    regression where x > baseline + headroom; improvement where x < baseline - headroom

- sigma. Successive differences: a step moves one of them, so up to a fifth of them may be
  steps the segmentation missed or outliers (TRIMMED) without moving the estimate. A mean,
  not a median: a figure that takes a few discrete values (a peak set by how concurrent
  sessions interleave) has most differences exactly 0, yet moves. 0.790 is E[|d| given |d|
  below its 80th percentile] in sigmas for d ~ N(0, 2 sigma^2) (TRIMMED_MEAN), so sigma is
  the standard deviation for normal noise. A deterministic figure reads 0.
- Other environments add their differences within their own levels where this one's window
  is short (fewer than twice `min_baseline_runs` runs): noise survives a torch upgrade; an
  upgrade's step is never noise.
- c(n) is computed (Student's t, below): the spread read from n runs bounds the next run less
  tightly than the true one would; x 1.61 at 5 runs, x 1.09 at 20, 1 in the limit. At
  factor 3 the headroom is a one-sided bound near 3 sigma whatever n: a run of unchanged code
  passes it with probability 1 - 0.00135 where the noise is normal.
- floor: the granularity of the metric (records.metrics.FLOORS): 512 B of allocator rounding,
  a 2 MiB segment or huge page, the larger of 4 MiB and 1 % for a process's whole RSS. A
  deterministic figure is judged at its floor.
- One segmentation for the gate, the history and the dashboard, with the verdict's own
  headroom as its room: a growth that passes as within the headroom never becomes a level,
  and one beyond it is one. Two passes: sigma from every difference (robust to a few steps),
  split, then sigma from the differences within the levels found, split again.
- A short level in a varying series. One or two runs apart cannot be told from outliers of
  the level beside them: they join it unless they lie beyond twice the headroom. In a flat
  series one run is proof (a merge reverted after one run is two steps).

Fewer than `min_baseline_runs` runs (3), and the verdict is provisional: memory.PROVISIONAL
says what blocks then. A concurrent case bounds its peak by the sum of its sessions
(memory.sessions_bound). scripts/bench_check.py measures the model on real reruns of every
shipped case: false blocks, the smallest growth that blocks, re-landed growths in messy
histories, and steps found in 150-commit histories of unchanged code.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

TRIMMED = 0.8
"""The share of the smallest successive differences sigma is read from."""
TRIMMED_MEAN = 0.790
"""E[|d| | |d| below its 80th percentile] / sigma for d ~ N(0, 2 sigma^2):
2 (phi(0) - phi(1.2816)) / 0.8 x sqrt(2) = 0.790."""
FIRST_PASS = 0.5
"""The share of the smallest differences the first pass reads sigma from: a short window
whose run went away and back has two of its four differences at the step."""
PAIRS_UP_TO = 40
"""A window up to this many runs reads its first-pass sigma from every pair of runs: a run
away and back moves two of its four successive differences, but four of its ten pairs."""
CONFIDENCE = 0.99
"""The one-sided confidence of the small-sample factor."""
NEW_LEVEL_RUNS = 2
"""Runs a level of a varying series needs to stand beside its neighbour within twice the
headroom: one or two runs apart are outliers until more say otherwise."""
PENALTY_FLOOR = 0.25
"""The least-squares change points' penalty, at least this many squared headrooms: a flat
(deterministic) series never splits on moves within its floor."""


# -- sigma ----------------------------------------------------------------------------------


def differences(values: Sequence[float], starts: Sequence[int] = ()) -> list[float]:
    """The successive differences of a series, but across the starts of its levels."""
    cut = set(starts)
    return [values[i] - values[i - 1] for i in range(1, len(values)) if i not in cut]


def sigma(diffs: Sequence[float], kept: float = TRIMMED) -> float:
    """The noise's standard deviation from successive differences (see the module), from the
    smallest share `kept` of them: 0 from fewer than two."""
    if len(diffs) < 2:
        return 0.0
    small = sorted(abs(d) for d in diffs)[: max(1, int(kept * len(diffs)))]
    return statistics.fmean(small) / _trimmed_mean(kept)


@functools.cache
def _trimmed_mean(kept: float) -> float:
    """E[|d| | |d| below its `kept` quantile] / sigma for d ~ N(0, 2 sigma^2)."""
    q = _normal_quantile((1 + kept) / 2)
    phi = math.exp(-q * q / 2) / math.sqrt(2 * math.pi)
    return 2 * (1 / math.sqrt(2 * math.pi) - phi) / kept * math.sqrt(2)


def _normal_quantile(p: float) -> float:
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * math.erfc(-mid / math.sqrt(2)) < p else (lo, mid)
    return (lo + hi) / 2


# -- the small-sample factor ------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            out *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return out


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


@functools.cache
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile, by bisection of its distribution function (p > 0.5)."""
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


Z = 2.3263478740408408
"""z(0.99): the normal distribution's one-sided 99 % quantile."""


def small_sample(runs: int) -> float:
    """c(n) = t(0.99, n - 1) / z(0.99): 1 in the limit; below 2 runs nothing is known of
    the noise, and its sigma is 0."""
    return t_quantile(CONFIDENCE, max(runs, 2) - 1) / Z


def headroom(noise: float, runs: int, factor: float, floor: float) -> float:
    """max(factor x sigma x c(n), floor): the room a run of unchanged code stays within."""
    return max(factor * noise * small_sample(runs), float(floor))


# -- the levels ---------------------------------------------------------------------------


def _pelt(signal: Sequence[float], penalty: float) -> list[int]:
    """Ends of the segments of the least-squares partition with `penalty` per segment
    (the optimal partition, with PELT's pruning)."""
    n = len(signal)
    s1, s2 = [0.0], [0.0]
    for x in signal:
        s1.append(s1[-1] + x)
        s2.append(s2[-1] + x * x)

    def cost(a: int, b: int) -> float:
        total = s1[b] - s1[a]
        return s2[b] - s2[a] - total * total / (b - a)

    best = [-penalty] + [math.inf] * n
    last = [0] * (n + 1)
    candidates = [0]
    for t in range(1, n + 1):
        scores = [(best[s] + cost(s, t) + penalty, s) for s in candidates]
        best[t], last[t] = min(scores)
        # PELT: a start that cannot beat the best now never will.
        candidates = [s for (score, s) in scores if score - penalty <= best[t]] + [t]
    ends, t = [], n
    while t > 0:
        ends.append(t)
        t = last[t]
    return sorted(ends)


def split(values: Sequence[float], room: float, noise: float) -> list[int]:
    """The starts of a series' levels: least-squares change points (a BIC-like penalty of
    2 sigma^2 ln n), merged, closest first, where two neighbours' medians differ by no more
    than `room` (twice that for a level of fewer than NEW_LEVEL_RUNS runs of a varying
    series)."""
    if len(values) < 2 or room <= 0 or max(values) - min(values) <= room:
        return []  # (no two medians can differ by more than the room: every split merges)
    center = statistics.median(values)
    signal = [(v - center) / room for v in values]
    penalty = max(2 * (noise / room) ** 2 * math.log(len(values)), PENALTY_FLOOR)
    ends = _pelt(signal, penalty)
    segments = [(a, b) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    varying = noise > 0

    def gap(a: tuple[int, int], b: tuple[int, int]) -> float:
        return abs(statistics.median(values[b[0] : b[1]]) - statistics.median(values[a[0] : a[1]]))

    def needed(a: tuple[int, int], b: tuple[int, int]) -> float:
        short = varying and min(a[1] - a[0], b[1] - b[0]) < NEW_LEVEL_RUNS
        return 2 * room if short else room

    while len(segments) > 1:
        pairs = list(zip(segments[:-1], segments[1:], strict=True))
        weak = [i for i, (a, b) in enumerate(pairs) if gap(a, b) <= needed(a, b)]
        if not weak:
            break
        i = min(weak, key=lambda k: gap(*pairs[k]))
        segments[i : i + 2] = [(segments[i][0], segments[i + 1][1])]
    return [a for a, _ in segments[1:]]


@dataclass(frozen=True)
class Levels:
    """A window (oldest first) split at its steps, with the noise within its levels."""

    starts: tuple[int, ...]
    """Indexes where a new level starts (the steps)."""
    values: tuple[float, ...]
    noise: float
    """sigma within the levels (other environments' differences included where given)."""
    runs: int
    """The runs sigma is read from: its differences, plus one."""
    room: float
    """The headroom: the smallest move that is a step, and what a verdict allows."""

    @property
    def start(self) -> int:
        """Index of the first run of the newest level's newest stretch."""
        return self.starts[-1] if self.starts else 0

    @property
    def members(self) -> tuple[int, ...]:
        """The runs of the level the series is at now: its newest stretch, and every earlier
        stretch within the headroom of it (a revert returns to the level before it)."""
        bounds = [0, *self.starts, len(self.values)]
        stretches = [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        newest = statistics.median(self.values[self.start :])
        return tuple(
            i
            for r in stretches
            if abs(statistics.median(self.values[r.start : r.stop]) - newest) <= self.room
            for i in r
        )

    @property
    def current(self) -> tuple[float, ...]:
        """The current level's values, oldest first."""
        return tuple(self.values[i] for i in self.members)

    @property
    def median(self) -> float:
        return float(statistics.median(self.current))


def flat(values: Sequence[float]) -> bool:
    """Half the runs or more hold one value exactly: a deterministic figure, whose every
    move is a step."""
    return bool(values) and 2 * max(Counter(values).values()) >= len(values)


def levels(
    values: Sequence[float],
    factor: float,
    floor: float,
    known: Sequence[float] = (),
    within: float = 0.0,
) -> Levels:
    """The window split at its steps, in two passes (see the module). `known`: other
    environments' differences within their own levels, noise this one's window lacks;
    `within`: the noise runs show in their own iterations."""
    values = tuple(values)
    if not values:
        raise ValueError("an empty series has no levels")
    starts: list[int] = []
    for first in (True, False):
        diffs = [*differences(values, starts), *known]
        if first:  # where the series clearly moved: robust to steps in half the differences
            rough = sigma(diffs, FIRST_PASS)
            if len(values) <= PAIRS_UP_TO:
                pairs = [b - a for i, a in enumerate(values) for b in values[i + 1 :]]
                rough = min(rough, sigma(pairs, FIRST_PASS))
            noise = within if flat(values) else max(rough, within)
        else:
            noise = max(sigma(diffs), within)
        runs = len(diffs) + 1
        room = headroom(noise, runs, factor, floor)
        starts = split(values, room, noise)
    return Levels(tuple(starts), values, noise, runs, room)


def within_runs(samples: Sequence[Sequence[float]]) -> float:
    """The noise runs show in their own iterations: sigma of the successive differences of
    each run's iterations, pooled."""
    return sigma([b - a for s in samples for a, b in zip(s[:-1], s[1:], strict=True)])


__all__ = [
    "CONFIDENCE",
    "NEW_LEVEL_RUNS",
    "PENALTY_FLOOR",
    "TRIMMED",
    "TRIMMED_MEAN",
    "Z",
    "Levels",
    "differences",
    "headroom",
    "levels",
    "sigma",
    "small_sample",
    "split",
    "t_cdf",
    "t_quantile",
]
