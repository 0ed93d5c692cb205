"""A series split at its steps: the level a case is at now, and the noise within levels.

A merged regression is a new level, not noise; so is its revert, an accepted change and a
re-land. The spread that justifies a headroom is measured within levels, never across a
step, and a candidate is judged against the level its base branch is at now. Steps are
change points of a least-squares segmentation (the optimal partition, found with PELT's
pruning), kept only where the move exceeds the same headroom a verdict would use.

The noise that sets that headroom is itself read within levels, in two passes: the first
finds where the series clearly moved with a noise no step can inflate (the median of the
successive differences, and the spread of one run's own iterations); the second reads the
noise between those places only and splits the series with it. One run away and back in a
series that never varied is a change and its revert, not an outlier.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# Expected range of n normal samples in standard deviations (Tippett's d2, the constants of
# range control charts), n = 2..20.
_D2 = (
    1.128,
    1.693,
    2.059,
    2.326,
    2.534,
    2.704,
    2.847,
    2.970,
    3.078,
    3.173,
    3.258,
    3.336,
    3.407,
    3.472,
    3.532,
    3.588,
    3.640,
    3.689,
    3.735,
)


NEW_LEVEL_RUNS = 3
"""Runs a newest level of a noisy series needs before it is a level of its own (fewer do
where they are beyond twice the room)."""


def noise(values: Sequence[float]) -> float:
    """Robust noise of a series from its successive differences (a step moves one
    difference only): the larger of 1.4826 x MAD(diff) / sqrt(2) and the mean of the
    smallest four fifths of |diff| / 0.790 (the same sigma for normal noise).

    The second estimate is there for a figure that takes a few discrete values (a peak set
    by how concurrent sessions interleave, in steps of one allocation): most successive
    differences are then exactly 0 and the MAD is 0, yet the figure moves by whole steps.
    The largest fifth of the differences is left out, so a few steps do not count as noise;
    a deterministic figure keeps a noise of 0."""
    return _diff_noise([b - a for a, b in zip(values[:-1], values[1:], strict=True)])


def noise_within(values: Sequence[float], starts: Sequence[int]) -> float:
    """`noise` from the successive differences inside levels only (`starts`: where each
    level after the first begins): a step, or a run away and back, moves no difference.
    Where levels hold fewer than two differences, nothing is known of the noise within
    them: the whole series' `noise`, steps and all (the larger, the safer)."""
    cut = set(starts)
    inside = [values[i] - values[i - 1] for i in range(1, len(values)) if i not in cut]
    return _diff_noise(inside) if len(inside) >= 2 else noise(values)


def _diff_noise(diffs: Sequence[float]) -> float:
    if len(diffs) < 2:
        return 0.0
    med = statistics.median(diffs)
    mad = 1.4826 * statistics.median(abs(d - med) for d in diffs) / 2**0.5
    small = sorted(abs(d) for d in diffs)[: max(1, int(0.8 * len(diffs)))]
    # E[|d| | |d| below its 80th percentile] = 0.790 sigma for d ~ N(0, 2 sigma^2)
    return max(mad, statistics.fmean(small) / 0.790)


_PAIRS_UP_TO = 40
"""Windows up to this many runs also read their noise from every pair of runs."""


def _rough_noise(values: Sequence[float]) -> float:
    """A noise no step can inflate, for a first look: 1.4826 x MAD / sqrt(2) of the
    differences of successive runs (a step moves one of them), and in a short window of
    every pair of runs, the smaller (a run away and back moves two successive
    differences, half of them in a window of five, but only the pairs it is in)."""
    diffs = [b - a for a, b in zip(values[:-1], values[1:], strict=True)]
    if len(diffs) < 2:
        return 0.0
    found = _mad(diffs)
    if len(values) <= _PAIRS_UP_TO:
        found = min(found, _mad([b - a for i, a in enumerate(values) for b in values[i + 1 :]]))
    return 1.4826 * found / 2**0.5


def _mad(xs: Sequence[float]) -> float:
    med = statistics.median(xs)
    return statistics.median(abs(x - med) for x in xs)


def within_runs(samples: Sequence[Sequence[float]]) -> float:
    """The noise runs show in their own iterations: each run's range over the range
    expected of its count (d2), the median over runs of two or more iterations. A figure
    that takes a few discrete values (a peak set by how concurrent sessions interleave)
    moves within one run too; a deterministic one reads 0."""
    sigmas = [(max(s) - min(s)) / _D2[min(len(s), 20) - 2] for s in samples if len(s) >= 2]
    return float(statistics.median(sigmas)) if sigmas else 0.0


def _flat(values: Sequence[float]) -> bool:
    """Half the runs or more hold one value exactly."""
    return bool(values) and 2 * max(Counter(values).values()) >= len(values)


def spread(values: Sequence[float]) -> float:
    """Robust spread of one level: 1.4826 x MAD (a standard-deviation estimate that one
    outlier cannot move), but never less than half the observed range, so that a value the
    unchanged code already produced can never exceed its threshold (with factor >= 2). A
    short level sees a narrower range than 20 runs would: its range is scaled up to the
    range expected of 20 runs (d2(20) / d2(n))."""
    n = len(values)
    if n < 2:
        return 0.0
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    scale = _D2[-1] / _D2[min(n, 20) - 2]
    return max(1.4826 * mad, scale * (max(values) - min(values)) / 2)


def pooled_spread(segments: Sequence[Sequence[float]]) -> float:
    """The spread of unchanged code, from every level of a window: residuals from each
    level's median pooled (MAD), and the widest level's scaled half-range."""
    residuals = [v - statistics.median(s) for s in segments for v in s]
    if len(residuals) < 2:
        return 0.0
    mad = statistics.median(abs(r) for r in residuals)
    widest = max((spread(s) for s in segments if len(s) >= 2), default=0.0)
    return max(1.4826 * mad, widest)


def _pelt(signal: Sequence[float], penalty: float) -> list[int]:
    """Ends of the segments of the least-squares partition with `penalty` per segment."""
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


def apart(before: Sequence[float], after: Sequence[float]) -> bool:
    """Two neighbouring levels told apart by their values, not only by their medians: at
    most a tenth of either's values (none of a short one's) lie within the range the other
    produced. A level that repeats values its neighbour already produced (a figure that
    takes a few discrete values, split into short constant runs) is the same level."""
    lo, hi = min(before), max(before)
    inside_after = sum(lo <= v <= hi for v in after)
    lo, hi = min(after), max(after)
    inside_before = sum(lo <= v <= hi for v in before)
    return inside_after <= len(after) // 10 and inside_before <= len(before) // 10


def find_steps(
    values: Sequence[float],
    room: float,
    sigma: float,
    lows: Sequence[float] | None = None,
    *,
    settle: bool = True,
) -> list[int]:
    """Indexes where a new level starts: moved by more than `room` (bytes), and told apart
    from the values the level before it produced (see `apart`). `lows`: each run's lowest
    iteration, where the figure is the peak of several: a level below the one before must
    also be below every iteration of the runs before it (a run that peaks only where
    another run's iterations already went is no improvement). `settle`: in a noisy series,
    a level of fewer than NEW_LEVEL_RUNS runs joins its neighbour (off for a first look)."""
    if len(values) < 2 or room <= 0:
        return []
    center = statistics.median(values)
    signal = [(v - center) / room for v in values]
    # In units of the headroom the noise is at most 1/factor. The BIC-like penalty
    # 2 sigma^2 ln(n) keeps noise from splitting a series; the 0.25 minimum keeps an exactly
    # flat (deterministic) series from splitting on sub-headroom wiggles.
    sigma_n = sigma / room
    penalty = max(2 * sigma_n**2 * math.log(len(values)), 0.25)
    ends = _pelt(signal, penalty)
    # Levels as index ranges [start, end).
    segments = [(a, b) for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    def vals(seg: tuple[int, int]) -> list[float]:
        return list(values[seg[0] : seg[1]])

    def gap(a: tuple[int, int], b: tuple[int, int]) -> float:
        return abs(statistics.median(vals(b)) - statistics.median(vals(a)))

    def is_step(a: tuple[int, int], b: tuple[int, int]) -> bool:
        if gap(a, b) <= room or not apart(vals(a), vals(b)):
            return False
        if lows is not None and statistics.median(vals(b)) < statistics.median(vals(a)):
            return max(vals(b)) < min(lows[a[0] : a[1]])
        return True

    while True:
        # A step is kept only where the levels on either side differ by more than the
        # room and are told apart by their values: merge the closest neighbours that are
        # not such a step until every boundary left is one.
        while len(segments) > 1:
            pairs = list(zip(segments[:-1], segments[1:], strict=True))
            weak = [i for i, (a, b) in enumerate(pairs) if not is_step(a, b)]
            if not weak:
                break
            i = min(weak, key=lambda k: gap(*pairs[k]))
            segments[i : i + 2] = [(segments[i][0], segments[i + 1][1])]
        # A level stands on one run only in a series whose levels are flat (a deterministic
        # figure, where one run is proof: a change merged and reverted is two steps). In a
        # noisy one, a run or two apart cannot be told from outliers of a neighbouring
        # level, unless they are beyond twice the room: a level takes NEW_LEVEL_RUNS, the
        # newest as the oldest; a short one joins the nearer of its neighbours.
        noisy = settle and (sigma > 0 or pooled_spread([vals(x) for x in segments]) > 0)
        short = next(
            (
                i
                for i, seg in enumerate(segments)
                if noisy
                and len(segments) > 1
                and seg[1] - seg[0] < NEW_LEVEL_RUNS
                and min(gap(segments[j], seg) for j in (i - 1, i + 1) if 0 <= j < len(segments))
                <= 2 * room
            ),
            None,
        )
        if short is None:
            break
        near = [j for j in (short - 1, short + 1) if 0 <= j < len(segments)]
        j = min(near, key=lambda k: gap(segments[k], segments[short]))
        a, b = sorted((short, j))
        segments[a : b + 1] = [(segments[a][0], segments[b][1])]
    return [seg[0] for seg in segments[1:]]


@dataclass(frozen=True)
class Segmentation:
    """A series split at its steps, with the noise that set the room."""

    starts: tuple[int, ...]
    """Indexes where a new level starts (the steps)."""
    room: float
    """max(factor x noise, floor): the smallest move that is a step."""
    noise: float
    """The series' noise within levels (`noise_within`)."""
    also_noise: float = 0.0
    """The companion series' noise within the same levels (see `segment`)."""


def segment(
    values: Sequence[float],
    factor: float,
    floor: float,
    *,
    also: Sequence[float] | None = None,
    within: float = 0.0,
    lows: Sequence[float] | None = None,
) -> Segmentation:
    """The starts of a series' levels (its steps), and the room a step had to exceed:
    max(factor x noise, floor). One rule for the gate, `check --history` and the
    dashboard.

    The noise is read within levels: a first pass finds where the series clearly moved,
    with the MAD of its differences (which steps cannot move) and `within`, the noise one
    run shows in its own iterations (which no step between runs reaches), and keeps every
    such place; the noise of the differences between those places then sets the room of
    the second pass, which settles short levels of a noisy series. `also`: another view of
    the same runs (the median iteration of each), whose noise within the same levels
    counts too: a figure that takes a few discrete values shows its noise there where a
    short window of peaks happens to repeat one value. `lows`: each run's lowest
    iteration (see find_steps)."""
    # A figure whose runs mostly repeat one value exactly is flat between its moves: any
    # move is a level (a merge, a revert), whatever share of the differences the moves
    # are. Otherwise the MAD of the differences: robust while steps are fewer than half.
    first = within if _flat(values) else max(_rough_noise(values), within)
    rough = find_steps(values, max(factor * first, floor), first, lows, settle=False)
    own = noise_within(values, rough)
    other = noise_within(also, rough) if also is not None and len(also) == len(values) else 0.0
    sigma = max(own, other, within)
    room = max(factor * sigma, floor)
    starts = find_steps(values, room, sigma, lows)
    return Segmentation(tuple(starts), room, own, other)


@dataclass(frozen=True)
class Level:
    """Where a series (oldest first) stands now."""

    start: int
    """Index of the first value of the current level."""
    values: tuple[float, ...]
    """The current level's values, oldest first."""
    spread: float
    """The noise of unchanged code: within levels, pooled over the window."""
    steps: int
    """Steps found in the window (the newest one starts the current level)."""
    also_noise: float = 0.0
    """The companion series' noise within levels (see `segment`)."""
    segments: tuple[tuple[float, ...], ...] = ()
    """Every level of the window, oldest first (the last is `values`)."""

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))


def current_level(
    values: Sequence[float], factor: float, floor: float, seg: Segmentation | None = None
) -> Level:
    """Split a window at its steps (`seg`, where the caller segmented it with a companion
    series; else `segment` of the values alone); the current level is the newest segment.

    A newest segment of a single run is a level of its own only where it is beyond the
    headroom of the levels before it, that is, where it can be told apart from noise (for
    a deterministic figure any change past the floor). Otherwise it is noise of that level.
    """
    values = list(values)
    if not values:
        raise ValueError("an empty series has no level")
    seg = seg or segment(values, factor, floor)
    starts = [0, *seg.starts]
    segments = [values[a:b] for a, b in zip(starts, [*starts[1:], len(values)], strict=True)]
    if len(segments) > 1 and len(segments[-1]) == 1:
        before = segments[-2]
        margin = max(factor * max(spread(before), pooled_spread(segments[:-1])), floor)
        if abs(segments[-1][0] - statistics.median(before)) <= margin:
            segments[-2:] = [before + segments[-1]]
            starts.pop()
    return Level(
        start=starts[-1],
        values=tuple(segments[-1]),
        spread=pooled_spread(segments),
        steps=len(segments) - 1,
        also_noise=seg.also_noise,
        segments=tuple(tuple(x) for x in segments),
    )


__all__ = [
    "NEW_LEVEL_RUNS",
    "Level",
    "Segmentation",
    "apart",
    "current_level",
    "find_steps",
    "noise",
    "noise_within",
    "pooled_spread",
    "segment",
    "spread",
    "within_runs",
]
