"""`memtrack check --history`: the base branch's series read once, in git's first-parent
order, judged by memtrack.judge.history; then, for the steps found, what accepted each (the
base branch's recorded acceptance, else a trailer of the commits it brought) and how many
commits it spans."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from memtrack.config import Config
from memtrack.judge import accept
from memtrack.judge import history as rules
from memtrack.judge.gather import git
from memtrack.judge.history import HistoryResult, SeriesPoint, Step
from memtrack.records import environment_diff, metrics
from memtrack.store import judging as reads
from memtrack.store.database import Store


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
    order = git.first_parent_order(root, base)
    if order is None:
        notes.append(
            f"branch {base!r} not found in the repository at {root}: commits ordered by commit time"
        )
    fp, series = _series(store, base, limit, patterns, order, notes)
    if not series:
        notes.append(f"no runs recorded on {base}: nothing to analyse")
        return HistoryResult(base, fp, str(anchor), 0, 0, (), (), tuple(notes))
    newest = max(p.position for points in series.values() for p in points)
    anchor_pos, anchor_label = _anchor_position(root, anchor, base, order, newest, notes)
    fits = {
        (case_id, metric): (pts, *rules.fit(case_id, metric, pts, config, anchor_pos))
        for case_id in sorted(series)
        for metric in metrics.GATED
        if len(pts := [p for p in series[case_id] if metric in p.values]) >= 2
    }
    found = [s for _, _, steps in fits.values() for s in steps]
    accepted = _accepted(store, root, base, fp, found)
    steps, creeps = [], []
    for (case_id, metric), (pts, fit, mine) in fits.items():
        mine = [replace(s, accepted=accepted.get(s.key)) for s in mine]
        steps += mine
        c = rules.creep(case_id, metric, pts, fit, mine, config, anchor_pos)
        creeps += [c] if c is not None else []
    commits = len({p.commit for points in series.values() for p in points})
    steps = [replace(s, commits=git.spanned(root, s.previous_commit, s.commit)) for s in steps]
    steps.sort(key=lambda s: (s.case_id, s.metric))
    creeps.sort(key=lambda c: (not c.flagged, c.case_id, c.metric))
    return HistoryResult(
        base, fp, anchor_label, len(fits), commits, tuple(steps), tuple(creeps), tuple(notes)
    )


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
    return fp, rules.series_points(rows, base_branch, patterns, order, notes)


def _env_differences(store: Store, branch: str, fingerprint: str) -> str:
    """What each other environment of the branch differs from this one by."""
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
    sha = git.resolve(root, anchor)
    if sha is None:
        notes.append(f"creep anchor {anchor!r} is not a revision in {root}: creep not measured")
        return None, f"{anchor} (unknown)"
    if order is not None and sha not in order:
        sha = git.merge_base(root, sha, base_branch) or sha
    if order is None or sha not in order:
        notes.append(
            f"creep anchor {anchor!r} is not on the history of {base_branch}: creep not measured"
        )
        return None, f"{anchor} ({sha[:12]})"
    return order[sha], f"{anchor} ({sha[:12]})"


def _accepted(
    store: Store, root: Path, base: str, fingerprint: str, steps: list[Step]
) -> dict[tuple[str, str, str], str]:
    """Which steps up a reviewed trailer allowed (by step key): the acceptance the base
    branch's check recorded on the step's commit, else a `Memtrack-Accept` trailer of the
    commits the step brought that allows its growth."""
    out: dict[tuple[str, str, str], str] = {}
    trailers: dict[tuple[str, str], list[accept.Acceptance]] = {}
    for s in steps:
        if s.delta <= 0:
            continue
        row = reads.accepted_at(
            store, s.case_id, s.metric, commit=s.commit, branch=base, fingerprint=fingerprint
        )
        if row is not None:
            out[s.key] = str(row["accepted_reason"] or "accepted")
            continue
        span = (s.previous_commit, s.commit)
        if span not in trailers:
            trailers[span] = git.acceptances(root, *span)[0]
        workload = s.case_id.partition("[")[0]
        pct = 100 * s.delta / s.before if s.before else None
        growth = accept.Growth(workload, s.case_id, s.metric, s.delta, pct)
        a = accept.find(trailers[span], growth)
        if a is not None and a.allows(s.delta, pct):
            out[s.key] = a.reason
    return out


__all__ = ["analyze_history"]
