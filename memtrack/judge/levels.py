"""A series split at its steps: the level a case is at now, and the noise within levels.

A merged regression is a new level, not noise. The spread that justifies a headroom is
measured within levels, never across a step, and a candidate is judged against the level
its base branch is at now. Steps are change points of a least-squares segmentation (the
optimal partition, found with PELT's pruning), kept only where the move exceeds the same
headroom a verdict would use.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Expected range of n normal samples in standard deviations (Tippett's d2, the constants of
# range control charts), n = 2..20.
_D2 = (1.128, 1.693, 2.059, 2.326, 2.534, 2.704, 2.847, 2.970, 3.078, 3.173, 3.258, 3.336,
       3.407, 3.472, 3.532, 3.588, 3.640, 3.689, 3.735)


def noise(values: Sequence[float]) -> float:
    """Robust noise of a series from its successive differences (a step moves one
    difference only): 1.4826 x MAD(diff) / sqrt(2)."""
    if len(values) < 3:
        return 0.0
    diffs = [b - a for a, b in zip(values[:-1], values[1:], strict=True)]
    med = statistics.median(diffs)
    return 1.4826 * statistics.median(abs(d - med) for d in diffs) / 2**0.5


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


def find_steps(values: Sequence[float], room: float, sigma: float) -> list[int]:
    """Indexes where a new level starts, moved by more than `room` (bytes)."""
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
    segments = [list(values[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    # A step is kept only where the levels on either side differ by more than the room:
    # merge the closest neighbours until every boundary left is such a step.
    while len(segments) > 1:
        gaps = [abs(statistics.median(b) - statistics.median(a))
                for a, b in zip(segments[:-1], segments[1:], strict=True)]
        i = min(range(len(gaps)), key=gaps.__getitem__)
        if gaps[i] > room:
            break
        segments[i:i + 2] = [segments[i] + segments[i + 1]]
    starts, at = [], 0
    for seg in segments[:-1]:
        at += len(seg)
        starts.append(at)
    return starts


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

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))


def current_level(values: Sequence[float], factor: float, floor: float) -> Level:
    """Split a window at its steps; the current level is the newest segment.

    A newest segment of a single run is a level of its own only where it is beyond the
    headroom of the level before it, that is, where it can be told apart from noise (for a
    deterministic figure any change past the floor). Otherwise it is noise of that level.
    """
    values = list(values)
    if not values:
        raise ValueError("an empty series has no level")
    sigma = noise(values)
    room = max(factor * sigma, floor)
    starts = [0, *find_steps(values, room, sigma)]
    segments = [values[a:b] for a, b in zip(starts, [*starts[1:], len(values)], strict=True)]
    if len(segments) > 1 and len(segments[-1]) == 1:
        before = segments[-2]
        margin = max(factor * spread(before), floor)
        if abs(segments[-1][0] - statistics.median(before)) <= margin:
            segments[-2:] = [before + segments[-1]]
            starts.pop()
    return Level(start=starts[-1], values=tuple(segments[-1]),
                 spread=pooled_spread(segments), steps=len(segments) - 1)


__all__ = ["Level", "current_level", "find_steps", "noise", "pooled_spread", "spread"]
