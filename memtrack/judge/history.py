"""The base branch's history: the commits where a series stepped, and slow creep.

A per-PR threshold sees one change at a time; it misses ten changes that each stay inside
the headroom. `analyze_history` finds the steps of every memory series along the base
branch (change points of a least-squares segmentation, kept only where the move exceeds
the same justified headroom as a verdict) and measures each series' growth since an
anchor (a tag, or the run N commits ago) against a tolerance. Nothing here prints.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.judge.baseline import git_output, iso_epoch
from memtrack.judge.levels import find_steps, noise
from memtrack.records import metrics
from memtrack.store.database import MEASURED_RUN, Store
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
    """max(headroom, tolerance x anchor value)."""
    flagged: bool
    steps_between: int
    """Steps found between the anchor and the latest point; 0 with a flag: slow creep."""
    message: str


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
        """1 when a series crept past the tolerance, else 0 (steps are already merged)."""
        return 1 if any(c.flagged for c in self.creeps) else 0


@dataclass(frozen=True)
class _Point:
    position: int
    """Order along the base branch (first-parent position, or time order)."""
    commit: str
    subject: str | None
    values: dict[str, float]


def _order(root: Path, base_branch: str, notes: list[str]) -> dict[str, int] | None:
    for ref in (base_branch, f"origin/{base_branch}"):
        out = git_output(root, "log", "--first-parent", "--format=%H", "-n", "100000", revs=(ref,))
        if out:
            commits = out.split()
            return {c: len(commits) - i for i, c in enumerate(commits)}
    notes.append(f"branch {base_branch!r} not found in the repository at {root}: commits "
                 "ordered by commit time")
    return None


def _series(store: Store, base_branch: str, limit: int, patterns: tuple[str, ...],
            order: dict[str, int] | None, notes: list[str]) -> tuple[str, dict[str, list[_Point]]]:
    newest = store.conn.execute(
        f"select fingerprint from runs where git_branch = ? {MEASURED_RUN} "
        "order by started_at desc limit 1",
        [base_branch]).fetchone()
    if newest is None:
        return "", {}
    fp = newest[0]
    other = store.conn.execute(
        "select count(*) from runs where git_branch = ? and fingerprint != ?",
        [base_branch, fp]).fetchone()[0]
    if other:
        notes.append(f"{other} run(s) on {base_branch} of other environments are left out: "
                     "a change of driver, torch or GPU is not a step in the code")
    rows = store.conn.execute(
        "select r.git_commit, r.git_subject, r.started_at, r.git_committed_at, m.case_id, "
        f"{', '.join('m.' + c for c in metrics.COLUMNS.values())} "
        f"from (select * from runs where git_branch = ? and fingerprint = ? {MEASURED_RUN} "
        "      order by started_at desc limit ?) r "
        "join measurements m on m.run_id = r.run_id where m.status = 'ok' "
        "and m.kind = 'measured'",
        [base_branch, fp, limit]).fetchall()
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
        t = iso_epoch(r["git_committed_at"]) or iso_epoch(r["started_at"]) or 0.0
        times[commit] = min(times.get(commit, t), t)
        subjects[commit] = r["git_subject"]
    if dropped:
        notes.append(f"{len(dropped)} recorded commit(s) are not on the first-parent history "
                     f"of {base_branch} (rewritten?): left out")
    if order is None:
        ranked = sorted(times, key=lambda c: times[c])
        order = {c: i for i, c in enumerate(ranked)}
    series: dict[str, list[_Point]] = defaultdict(list)
    for (case, commit), runs in per.items():
        values = {}
        for metric, col in metrics.COLUMNS.items():
            xs = [r[col] for r in runs if r[col] is not None]
            if xs:
                values[metric] = float(statistics.median(xs))
        series[case].append(_Point(order[commit], commit, subjects[commit], values))
    for points in series.values():
        points.sort(key=lambda p: p.position)
    return fp, dict(series)


def _anchor_position(root: Path, anchor: str | int, base_branch: str,
                     order: dict[str, int] | None, newest: int,
                     notes: list[str]) -> tuple[int | None, str]:
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
        notes.append(f"creep anchor {anchor!r} is not on the history of {base_branch}: "
                     "creep not measured")
        return None, f"{anchor} ({sha[:12]})"
    return order[sha], f"{anchor} ({sha[:12]})"


def analyze_history(store: Store, config: Config, *, root: Path | None = None,
                    base_branch: str | None = None, patterns: tuple[str, ...] = (),
                    anchor: str | int | None = None, limit: int = 2000) -> HistoryResult:
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
    for case_id in sorted(series):
        points = series[case_id]
        for metric in metrics.NAMES:
            pts = [p for p in points if metric in p.values]
            if len(pts) < 2:
                continue
            count += 1
            values = [p.values[metric] for p in pts]
            sigma = noise(values)
            floor = metrics.floor(metric, statistics.median(values))
            room = max(config.headroom_factor * sigma, floor)
            case_steps = []
            for i in find_steps(values, room, sigma):
                before = statistics.median(values[:i][-20:])
                after = statistics.median(values[i:][:20])
                delta = after - before
                case_steps.append(Step(case_id, metric, pts[i].commit, pts[i - 1].commit,
                                       pts[i].subject, before, after, delta,
                                       100 * delta / before if before else 0.0, room))
            steps.extend(case_steps)
            if anchor_pos is None:
                continue
            at = [p for p in pts if p.position <= anchor_pos]
            if not at or at[-1] is pts[-1]:
                continue
            a, latest = at[-1], pts[-1]
            a_value, l_value = a.values[metric], latest.values[metric]
            delta = l_value - a_value
            allowed = max(room, config.creep_tolerance * a_value)
            between = [s for s in case_steps
                       if a.position < next(p.position for p in pts if p.commit == s.commit)
                       <= latest.position]
            pct = 100 * delta / a_value if a_value else 0.0
            flagged = delta > allowed
            if between:
                biggest = max(between, key=lambda s: s.delta)
                how = (f"{len(between)} step(s) between, the largest "
                       f"{_signed(biggest.delta)} at {biggest.commit[:12]}")
            else:
                how = "no single step: slow creep" if flagged else "no step between"
            message = (
                f"{metric}: {format_size(int(l_value))} at {latest.commit[:12]} vs "
                f"{format_size(int(a_value))} at anchor {a.commit[:12]}: "
                f"{_signed(delta)} ({pct:+.2f}%) "
                f"{'>' if flagged else '<='} allowed {format_size(int(allowed))} = max(headroom "
                f"{format_size(int(room))}, tolerance {config.creep_tolerance:.1%}); {how}")
            creeps.append(Creep(case_id, metric, a.commit, a_value, latest.commit, l_value,
                                delta, pct, allowed, flagged, len(between), message))
    commits = len({p.commit for points in series.values() for p in points})
    steps.sort(key=lambda s: (s.case_id, s.metric))
    creeps.sort(key=lambda c: (not c.flagged, c.case_id, c.metric))
    return HistoryResult(base, fp, anchor_label, count, commits, tuple(steps), tuple(creeps),
                         tuple(notes))


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + format_size(abs(int(round(x))))


__all__ = ["Creep", "HistoryResult", "Step", "analyze_history"]
