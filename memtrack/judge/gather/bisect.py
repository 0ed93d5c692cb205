"""`memtrack bisect`: the commits between GOOD and BAD from git, each commit's recorded runs
of the case from the store (measured where it has none, by the caller's `measure`), judged
by memtrack.judge.bisect against GOOD's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.errors import ConfigError
from memtrack.judge.bisect import BAD, GOOD, SKIP, Bisection, Judged, judge_commit, search
from memtrack.judge.evidence import Point
from memtrack.judge.gather import git
from memtrack.judge.gather.baseline import FIGURES, point_of
from memtrack.judge.verdict import Verdict
from memtrack.judge.where import Where, where
from memtrack.records import Measurement, metrics
from memtrack.store import judging as reads
from memtrack.store.database import Store


@dataclass
class _Commits:
    """Each commit's runs of the case on this environment, read (or measured) once."""

    store: Store
    case_id: str
    fingerprint: str
    measure: Callable[[str], str | None]
    measured: list[str] = field(default_factory=list)

    def rows(self, commit: str) -> Sequence[reads.Row]:
        return reads.commit_rows(self.store, self.case_id, commit, self.fingerprint, FIGURES)

    def recorded(self, commit: str) -> bool:
        return bool(self.rows(commit))

    def rows_or_measure(self, commit: str) -> tuple[Sequence[reads.Row], str | None]:
        rows = self.rows(commit)
        if rows:
            return rows, None
        why = self.measure(commit)
        self.measured.append(commit)
        return self.rows(commit), why

    def measurement(self, run_id: str) -> Measurement | None:
        run = self.store.get_run(run_id)
        return next((m for m in run.measurements if m.case_id == self.case_id), None)


class _Judge:
    """Each commit's runs of the case against GOOD's."""

    def __init__(self, commits: _Commits, config: Config, metric: str, base: list[Point]):
        self.commits, self.config, self.metric, self.base = commits, config, metric, base
        self.results: dict[str, Judged] = {}
        self.verdicts: dict[str, Verdict] = {}

    def __call__(self, commit: str) -> str:
        rows, why = self.commits.rows_or_measure(commit)
        measured = commit in self.commits.measured
        if not rows:
            state, said, v = SKIP, why or "no run of the case", None
        else:
            found = [self.commits.measurement(r["run_id"]) for r in rows]
            statuses = [r["status"] for r in rows]
            state, said, v = judge_commit(self.base, found, statuses, self.metric, self.config)
        if v is not None:
            self.verdicts[commit] = v
        self.results[commit] = Judged(commit, state, said, measured, v)
        return state


def bisect(
    store: Store,
    config: Config,
    root: Path,
    case_id: str,
    metric: str,
    good: str,
    bad: str,
    fingerprint: str,
    measure: Callable[[str], str | None],
) -> Bisection:
    """The first commit after GOOD up to BAD where the case's `metric` steps past the
    gate's headroom against GOOD."""
    if metric not in metrics.GATED:
        raise ConfigError(f"--metric: {metric!r} is not one of {', '.join(metrics.GATED)}")
    good_sha, bad_sha, after = git.commits_between(root, good, bad)
    commits = _Commits(store, case_id, fingerprint, measure)
    rows, why = commits.rows_or_measure(good_sha)
    base = [point_of(r) for r in rows if r["status"] == "ok"]
    if not base:
        said = why or ("its runs failed" if rows else "no run of it")
        raise ConfigError(f"GOOD {good_sha[:12]}: {case_id}: {said}: nothing to bisect from")
    judge = _Judge(commits, config, metric, base)
    order = [good_sha, *after]
    common: dict[str, Any] = dict(
        case_id=case_id, metric=metric, good=good_sha, bad=bad_sha, commits=len(after)
    )
    if judge(bad_sha) != BAD:
        seen = judge.results[bad_sha]
        return Bisection(
            **common,
            first_bad=None,
            judged=tuple(judge.results.values()),
            message=f"BAD {bad_sha[:12]} does not step past the headroom against GOOD "
            f"{good_sha[:12]} ({seen.state}: {seen.why}): nothing to find",
            measured=tuple(commits.measured),
        )
    hi, hidden = search(order, commits.recorded, judge)
    first = order[hi]
    judged = tuple(judge.results[c] for c in order if c in judge.results)
    if hidden:
        among = tuple(order[i] for i in [*hidden, hi])
        return Bisection(
            **common,
            first_bad=None,
            among=among,
            judged=judged,
            message="cannot decide: the first bad commit is one of "
            + ", ".join(c[:12] for c in among)
            + f" ({len(hidden)} skipped: "
            + "; ".join(f"{order[i][:12]} {judge.results[order[i]].why}" for i in hidden)
            + ")",
            measured=tuple(commits.measured),
        )
    subject = git.subject(root, first)
    return Bisection(
        **common,
        first_bad=first,
        judged=judged,
        step=judge.verdicts.get(first),
        where=_where(commits, order[hi - 1], first),
        subject=subject,
        message=f"first bad commit: {first[:12]} {subject or ''}".rstrip(),
        measured=tuple(commits.measured),
    )


def _where(commits: _Commits, last_good: str, first_bad: str) -> Where | None:
    """Where the first bad commit's peak grew against the last good one's."""
    good, bad = commits.rows(last_good), commits.rows(first_bad)
    if not good or not bad:
        return None
    m = commits.measurement(bad[0]["run_id"])
    base = commits.store.sites(good[0]["run_id"], commits.case_id)
    return where(base, m.sites) if m is not None and m.sites and base else None


__all__ = ["GOOD", "bisect"]
