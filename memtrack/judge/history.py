"""The base branch's history: the commits where a series stepped, and slow creep.

A per-PR threshold sees one change at a time; it misses ten changes that each stay inside
the headroom. `analyze_history` finds the steps of every memory series along the base
branch (the levels of memtrack.judge.levels, as the gate finds them) and measures each
series' growth since an anchor (a tag, or the run N commits ago; a series that starts
after it, from its first run) against a tolerance. The growth is read off a fitted trend,
never two single runs:

    fitted(x) = level(x) + slope x x      levels: the series' steps; slope: the median of
                                          the slopes of every pair of runs in one level
    growth    = fitted(latest) - fitted(anchor)
    allowed   = max(creep_tolerance x fitted(anchor), factor x the growth's standard error)

so a noisy run at either end moves neither. Nothing here prints.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from memtrack.config import Config
from memtrack.judge import accept, bisect
from memtrack.judge.baseline import iso_epoch
from memtrack.judge.levels import noise, segment, within_runs
from memtrack.machine.provenance import git_output
from memtrack.records import metrics
from memtrack.store import judging as reads
from memtrack.store.database import Store
from memtrack.store.judging import Row
from memtrack.units import format_size


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
    """max(factor x noise, floor): the smallest move reported."""
    accepted: str | None = None
    """A step up that a reviewed `Memtrack-Accept` trailer allowed: its reason (the
    acceptance the base branch's check recorded, else a trailer of the commits the step
    brought that allows its growth)."""
    commits: int | None = None
    """The commits the step brought (after `previous_commit`, up to `commit`), where git
    knows both: more than one, and `memtrack bisect` finds which (`bisect_command`)."""

    @property
    def bisect_command(self) -> str | None:
        """The command that finds the commit of a step that spans several, else None."""
        if not self.commits or self.commits < 2:
            return None
        return bisect.command(self.case_id, self.previous_commit, self.commit, self.metric)


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
    message: str
    trend: float = 0.0
    """The part of the growth the slope within levels makes (the rest is steps)."""
    runs: int = 0
    """Runs from the anchor to the latest, the fit's points."""
    accepted: float = 0.0
    """The growth of the steps between that were accepted: reviewed, never flagged. The
    series is flagged only where the rest of its growth is past what is allowed."""


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


def _samples(raw: str | None) -> list[int]:
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [int(x) for x in found] if isinstance(found, list) else []


def _order(root: Path, base_branch: str, notes: list[str]) -> dict[str, int] | None:
    for ref in (base_branch, f"origin/{base_branch}"):
        out = git_output(root, "log", "--first-parent", "--format=%H", "-n", "100000", revs=(ref,))
        if out:
            commits = out.split()
            return {c: len(commits) - i for i, c in enumerate(commits)}
    notes.append(
        f"branch {base_branch!r} not found in the repository at {root}: commits "
        "ordered by commit time"
    )
    return None


def _series(
    store: Store,
    base_branch: str,
    limit: int,
    patterns: tuple[str, ...],
    order: dict[str, int] | None,
    notes: list[str],
) -> tuple[str, dict[str, list[SeriesPoint]]]:
    """The environment of the base branch's newest run, and its series on it."""
    fp = reads.newest_fingerprint(store, base_branch)
    if fp is None:
        return "", {}
    other = reads.other_env_runs(store, base_branch, fp)
    if other:
        notes.append(
            f"{other} run(s) on {base_branch} of other environments are left out (a change "
            f"around the code is not a step in it): {_env_differences(store, base_branch, fp)}"
        )
    rows = reads.series_rows(store, base_branch, fp, limit)
    return fp, series_points(rows, base_branch, patterns, order, notes)


def _env_differences(store: Store, branch: str, fingerprint: str) -> str:
    """What each other environment of the branch differs from this one by, as the
    environment's diff says it ('MALLOC_MMAP_THRESHOLD_: (unset) -> 131072')."""
    from memtrack.judge.check import environment_diff

    envs = reads.newest_env_ids(store, branch)
    here = store.get_environment(envs[fingerprint]) if fingerprint in envs else None
    said = []
    for fp, env_id in envs.items():
        if fp == fingerprint:
            continue
        other = store.get_environment(env_id)
        diff = environment_diff(other, here) if other and here else []
        said.append(f"{fp[:12]}: {'; '.join(diff) or 'its fingerprint differs'}")
    return ", ".join(said) or "their fingerprints differ"


def series_points(
    rows: Iterable[Row],
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
    per: dict[tuple[str, str], list[Row]] = defaultdict(list)
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
        t = iso_epoch(r["git_committed_at"]) or iso_epoch(r["started_at"]) or 0.0
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


def _anchor_position(
    root: Path,
    anchor: str | int,
    base_branch: str,
    order: dict[str, int] | None,
    newest: int,
    notes: list[str],
) -> tuple[int | None, str]:
    if isinstance(anchor, int):
        return newest - anchor, f"the run {anchor} commits before the newest"
    sha = git_output(root, "rev-parse", "--verify", "--quiet", revs=(f"{anchor}^{{commit}}",))
    if sha is None:
        notes.append(f"creep anchor {anchor!r} is not a revision in {root}: creep not measured")
        return None, f"{anchor} (unknown)"
    if order is not None and sha not in order:
        mb = git_output(root, "merge-base", revs=(sha, base_branch))
        sha = mb if mb else sha
    if order is None or sha not in order:
        notes.append(
            f"creep anchor {anchor!r} is not on the history of {base_branch}: creep not measured"
        )
        return None, f"{anchor} ({sha[:12]})"
    return order[sha], f"{anchor} ({sha[:12]})"


@dataclass(frozen=True)
class Trend:
    """A series' growth from its anchor to its latest run, on the fitted trend."""

    anchor_value: float
    """The fitted value at the anchor."""
    latest_value: float
    growth: float
    trend: float
    """The slope's part of the growth (the rest is steps)."""
    error: float
    """The growth's standard error."""
    allowed: float
    flagged: bool
    steps_between: int
    runs: int
    """Runs from the anchor on."""


@dataclass(frozen=True)
class SeriesFit:
    """One series judged: its steps, and its growth since an anchor on a fitted trend."""

    starts: tuple[int, ...]
    """Indexes where a new level starts (the steps)."""
    room: float
    """max(factor x noise, floor): the smallest step reported."""
    anchor_index: int | None = None
    creep: Trend | None = None
    """None without an anchor, or with no run after it."""


_MAX_LAGS = 24
"""A long window's slope is the median over pairs at this many lags, not over all pairs."""


def _slope(xs: list[float], ys: list[float], levels: list[int]) -> float:
    """Theil-Sen within levels: the median slope of pairs of runs in one level."""
    n = len(xs)
    if n > 2 * _MAX_LAGS:
        lags = sorted(
            {max(1, round(n * k / (_MAX_LAGS + 1))) for k in range(1, _MAX_LAGS + 1)} | {1, 2, 3}
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
    within: float = 0.0,
) -> SeriesFit:
    """Steps of one series (oldest first) and, from `anchor_index`, its growth on a fitted
    trend: levels at the steps plus one slope within them (see the module). `within`: the
    noise one run shows in its own iterations (levels.within_runs)."""
    factor = config.headroom_factor
    floor = metrics.floor(metric, statistics.median(values))
    seg = segment(values, factor, floor, within=within)
    found, room = list(seg.starts), seg.room
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
            y - slope * x for x, y, lv in zip(xs, ys, level, strict=True) if lv == k
        )
    first, last = intercept[level[0]] + slope * xs[0], intercept[level[-1]] + slope * xs[-1]
    growth, trend = last - first, slope * (xs[-1] - xs[0])
    # The growth's standard error: the slope's over the spread of positions within levels,
    # and the two levels' medians where the anchor and the latest are in different ones.
    sigma = noise(ys)
    centred = 0.0
    for k in set(level):
        mine = [x for x, lv in zip(xs, level, strict=True) if lv == k]
        mean = statistics.fmean(mine)
        centred += sum((x - mean) ** 2 for x in mine)
    err2 = (sigma * (xs[-1] - xs[0])) ** 2 / centred if centred else sigma**2
    if level[0] != level[-1]:
        for k in (level[0], level[-1]):
            err2 += 1.57 * sigma**2 / level.count(k)
    error = err2**0.5
    allowed = max(config.creep_tolerance * abs(first), factor * error)
    creep = Trend(
        first, last, growth, trend, error, allowed, growth > allowed, level[-1] - level[0], len(ys)
    )
    return SeriesFit(tuple(found), room, anchor_index, creep)


def analyze_history(
    store: Store,
    config: Config,
    *,
    root: Path | None = None,
    base_branch: str | None = None,
    patterns: tuple[str, ...] = (),
    anchor: str | int | None = None,
    limit: int = 2000,
) -> HistoryResult:
    """Steps and creep of every memory series on the base branch (newest `limit` runs)."""
    root = root or config.root
    base = base_branch or config.base_branch
    anchor = config.creep_anchor if anchor is None else anchor
    notes: list[str] = []
    order = _order(root, base, notes)
    fp, series = _series(store, base, limit, patterns, order, notes)
    if not series:
        notes.append(f"no runs recorded on {base}: nothing to analyse")
        return HistoryResult(base, fp, str(anchor), 0, 0, (), (), tuple(notes))
    newest = max(p.position for points in series.values() for p in points)
    anchor_pos, anchor_label = _anchor_position(root, anchor, base, order, newest, notes)
    steps: list[Step] = []
    creeps: list[Creep] = []
    count = 0
    accepted = _Acceptances(store, root, base, fp)
    for case_id in sorted(series):
        points = series[case_id]
        for metric in metrics.GATED:
            pts = [p for p in points if metric in p.values]
            if len(pts) < 2:
                continue
            count += 1
            found, creep = analyze_series(case_id, metric, pts, config, anchor_pos, accepted)
            steps.extend(found)
            if creep is not None:
                creeps.append(creep)
    commits = len({p.commit for points in series.values() for p in points})
    steps = [replace(s, commits=_spanned(root, s)) for s in steps]
    steps.sort(key=lambda s: (s.case_id, s.metric))
    creeps.sort(key=lambda c: (not c.flagged, c.case_id, c.metric))
    return HistoryResult(
        base, fp, anchor_label, count, commits, tuple(steps), tuple(creeps), tuple(notes)
    )


class _Acceptances:
    """Which steps up of the base branch a reviewed trailer allowed: the acceptance the
    base branch's check recorded on the step's commit, else a `Memtrack-Accept` trailer
    of the commits the step brought (after the last commit at the old level) that allows
    its growth, read from git."""

    def __init__(self, store: Store, root: Path, base: str, fingerprint: str):
        self.store, self.root, self.base, self.fingerprint = store, root, base, fingerprint
        self.trailers: dict[tuple[str, str], list[accept.Acceptance]] = {}

    def __call__(self, s: Step) -> str | None:
        """The reason a step up was accepted, or None."""
        if s.delta <= 0:
            return None
        row = reads.accepted_at(
            self.store,
            s.case_id,
            s.metric,
            commit=s.commit,
            branch=self.base,
            fingerprint=self.fingerprint,
        )
        if row is not None:
            return str(row["accepted_reason"] or "accepted")
        span = (s.previous_commit, s.commit)
        if span not in self.trailers:
            self.trailers[span] = accept.read(self.root, *span)[0]
        workload = s.case_id.partition("[")[0]
        pct = 100 * s.delta / s.before if s.before else None
        a = accept.find(
            self.trailers[span], accept.Growth(workload, s.case_id, s.metric, s.delta, pct)
        )
        return a.reason if a is not None and a.allows(s.delta, pct) else None


def _spanned(root: Path, s: Step) -> int | None:
    """How many commits a step brought, by git (a merged branch's commits too)."""
    out = git_output(root, "rev-list", "--count", revs=(f"{s.previous_commit}..{s.commit}",))
    return int(out) if out and out.isdigit() else None


def analyze_series(
    case_id: str,
    metric: str,
    pts: list[SeriesPoint],
    config: Config,
    anchor_pos: int | None,
    accepted: Callable[[Step], str | None] | None = None,
) -> tuple[list[Step], Creep | None]:
    """One series (two points or more of `metric`, oldest first) judged: its steps, and
    its creep since the point at or before `anchor_pos` (a series younger than the anchor
    from its first point; None without an anchor, or with nothing after it). `accepted`
    says the reason a step up was accepted (a reviewed trailer), or None: an accepted
    step's growth is never flagged."""
    values = [p.values[metric] for p in pts]
    anchor_i = None
    if anchor_pos is not None:
        at = [i for i, p in enumerate(pts) if p.position <= anchor_pos]
        # A series younger than the anchor is measured from its first run.
        anchor_i = at[-1] if at else 0
    fit = judge_series(
        values,
        metric,
        config,
        anchor_index=anchor_i,
        positions=[float(p.position) for p in pts],
        within=within_runs([s for p in pts for s in p.samples]) if metric == "allocated" else 0.0,
    )
    bounds = [0, *fit.starts, len(values)]
    steps = []
    for k, i in enumerate(fit.starts, start=1):
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
                fit.room,
            )
        )
    if accepted is not None:
        steps = [replace(st, accepted=accepted(st)) for st in steps]
    if fit.creep is None or fit.anchor_index is None:
        return steps, None
    young = not any(p.position <= (anchor_pos or 0) for p in pts)
    return steps, _creep(case_id, metric, pts, fit.anchor_index, fit, steps, config, young)


def _creep(
    case_id: str,
    metric: str,
    pts: list[SeriesPoint],
    at: int,
    fit: SeriesFit,
    steps: list[Step],
    config: Config,
    young: bool,
) -> Creep:
    """A series' growth from its anchor point (index `at`) to its latest, in words;
    `young`: the series starts after the anchor."""
    a, latest, trend = pts[at], pts[-1], fit.creep
    assert trend is not None  # `fit` is of a series with runs after its anchor
    pct = 100 * trend.growth / trend.anchor_value if trend.anchor_value else 0.0
    between = [st for i, st in zip(fit.starts, steps, strict=True) if i > at]
    taken = [st for st in between if st.accepted]
    accepted = sum((st.delta for st in taken), 0.0)
    flagged = trend.flagged and trend.growth - accepted > trend.allowed
    if between:
        biggest = max(between, key=lambda st: abs(st.delta))
        how = (
            f"{len(between)} step(s) between, the largest "
            f"{_signed(biggest.delta)} at {biggest.commit[:12]}"
        )
    else:
        how = "no single step: slow creep" if trend.flagged else "no step between"
    if taken:
        how += (
            f"; {_signed(accepted)} of it accepted ("
            + "; ".join(f"{st.commit[:12]}: {st.accepted}" for st in taken)
            + "), which is never flagged"
        )
    since = (
        f"its first run {a.commit[:12]} (the series starts after the anchor)"
        if young
        else f"anchor {a.commit[:12]}"
    )
    message = (
        f"{metric}: fitted {format_size(int(trend.latest_value))} at "
        f"{latest.commit[:12]} vs {format_size(int(trend.anchor_value))} at {since}, "
        f"{trend.runs} runs: {_signed(trend.growth)} ({pct:+.2f}%; trend "
        f"{_signed(trend.trend)}) {'>' if trend.flagged else '<='} allowed "
        f"{format_size(int(trend.allowed))} = max(tolerance "
        f"{config.creep_tolerance:.1%}, factor x standard error "
        f"{format_size(int(trend.error))}); {how}"
    )
    return Creep(
        case_id,
        metric,
        a.commit,
        trend.anchor_value,
        latest.commit,
        trend.latest_value,
        trend.growth,
        pct,
        trend.allowed,
        flagged,
        len(between),
        message,
        trend.trend,
        trend.runs,
        accepted,
    )


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + format_size(abs(int(round(x))))


__all__ = [
    "Creep",
    "HistoryResult",
    "SeriesFit",
    "Trend",
    "SeriesPoint",
    "Step",
    "analyze_history",
    "analyze_series",
    "judge_series",
    "series_points",
]
