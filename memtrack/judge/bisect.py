"""`memtrack bisect`: the first commit between GOOD and BAD where a case's figure steps past
the gate's own headroom.

Each commit is judged as `memtrack check` would judge a pull request against GOOD: its
recorded runs of the case on this environment (each one) against GOOD's, by the same noise
model (`memory.verdict`). Every run of the commit says `regression`: the commit is bad;
none does, and none is `noisy`: good; otherwise (a noisy figure, runs that disagree, a run
that failed, a commit that cannot be measured) the commit cannot decide and is skipped, as
`git bisect skip` does. Where a commit has no recorded run, it is measured (by the caller's
`measure`, which records the run); a recorded commit nearest the middle of the range is
judged before any that must be measured.

The commits are `git rev-list --ancestry-path --topo-order GOOD..BAD`: a merged branch's
commits come before its merge.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.errors import ConfigError
from memtrack.judge import memory
from memtrack.judge.baseline import FIGURES, Point, point_of
from memtrack.judge.verdict import Verdict
from memtrack.judge.where import Where, where
from memtrack.machine.provenance import git_output
from memtrack.records import Measurement, metrics
from memtrack.store import judging as reads
from memtrack.store.database import Store

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class Judged:
    """One commit of the range, judged against GOOD."""

    commit: str
    state: str
    """good | bad | skip"""
    why: str
    """The verdict's words, or why the commit cannot decide."""
    measured: bool
    """Measured by this bisection (else its recorded runs were reused)."""


@dataclass(frozen=True)
class Bisection:
    case_id: str
    metric: str
    good: str
    bad: str
    commits: int
    """Commits after GOOD up to BAD."""
    first_bad: str | None
    """The first bad commit; None where the range could not decide it (`among`) or BAD does
    not step past the headroom against GOOD."""
    among: tuple[str, ...] = ()
    """Where skipped commits hide it: the first bad commit is one of these."""
    judged: tuple[Judged, ...] = ()
    step: Verdict | None = None
    """The first bad commit's verdict against GOOD (its arithmetic, the step)."""
    where: Where | None = None
    """Where its peak grew against the last good commit."""
    subject: str | None = None
    message: str = ""
    measured: tuple[str, ...] = field(default_factory=tuple)


def command(case_id: str, good: str, bad: str, metric: str) -> str:
    """The `memtrack bisect` that finds which commit after `good` up to `bad` made a step."""
    return f"memtrack bisect {shlex.quote(case_id)} {good[:12]} {bad[:12]} --metric {metric}"


def search(
    commits: Sequence[str], recorded: Callable[[str], bool], judge: Callable[[str], str]
) -> tuple[int, list[int]]:
    """Bisect `commits` (the first good, the last bad): the index of the first bad commit,
    and the skipped commits before it that could hide it (empty where it is certain)."""
    lo, hi, skipped = 0, len(commits) - 1, set()
    while True:
        inside = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inside:
            break
        middle = (lo + hi) / 2
        pool = [i for i in inside if recorded(commits[i])] or inside
        mid = min(pool, key=lambda i: (abs(i - middle), i))
        state = judge(commits[mid])
        if state == GOOD:
            lo = mid
        elif state == BAD:
            hi = mid
        else:
            skipped.add(mid)
    return hi, [i for i in range(lo + 1, hi) if i in skipped]


class Judge:
    """Each commit's runs of the case on this environment against GOOD's."""

    def __init__(
        self,
        store: Store,
        config: Config,
        case_id: str,
        metric: str,
        fingerprint: str,
        measure: Callable[[str], str | None],
    ):
        self.store, self.config = store, config
        self.case_id, self.metric, self.fingerprint = case_id, metric, fingerprint
        self.measure = measure
        """Measure the case at a commit and record the run: None, or why it could not."""
        self.measured: list[str] = []
        self.base: list[Point] = []
        self.results: dict[str, Judged] = {}
        self.verdicts: dict[str, Verdict] = {}

    def rows(self, commit: str) -> Sequence[reads.Row]:
        return reads.commit_rows(self.store, self.case_id, commit, self.fingerprint, FIGURES)

    def recorded(self, commit: str) -> bool:
        return bool(self.rows(commit))

    def _rows_or_measure(self, commit: str) -> tuple[Sequence[reads.Row], str | None]:
        rows = self.rows(commit)
        if rows:
            return rows, None
        why = self.measure(commit)
        self.measured.append(commit)
        return self.rows(commit), why

    def set_good(self, commit: str) -> None:
        """GOOD's runs, the baseline every commit is judged against: ConfigError where it
        has no run of the case that passed."""
        rows, why = self._rows_or_measure(commit)
        self.base = [point_of(r) for r in rows if r["status"] == "ok"]
        if not self.base:
            said = why or ("its runs failed" if rows else "no run of it")
            raise ConfigError(f"GOOD {commit[:12]}: {self.case_id}: {said}: nothing to bisect from")

    def __call__(self, commit: str) -> str:
        rows, why = self._rows_or_measure(commit)
        measured = commit in self.measured
        if not rows:
            return self._note(commit, SKIP, why or "no run of the case", measured)
        failed = sorted({r["status"] for r in rows if r["status"] != "ok"})
        if failed:
            return self._note(commit, SKIP, f"a run failed ({', '.join(failed)})", measured)
        verdicts = [self._verdict(r["run_id"]) for r in rows]
        judged = [v for v in verdicts if v is not None]
        if not judged:
            return self._note(commit, SKIP, f"no {self.metric} figure", measured)
        kinds = {v.kind for v in judged}
        self.verdicts[commit] = judged[0]
        if kinds == {"regression"}:
            return self._note(commit, BAD, judged[0].words or "regression", measured)
        if "regression" in kinds or "noisy" in kinds:
            said = "too noisy to judge" if kinds == {"noisy"} else f"its runs disagree ({kinds})"
            return self._note(commit, SKIP, said, measured)
        return self._note(commit, GOOD, judged[0].kind, measured)

    def _note(self, commit: str, state: str, why: str, measured: bool) -> str:
        self.results[commit] = Judged(commit, state, why, measured)
        return state

    def measurement(self, run_id: str) -> Measurement | None:
        run = self.store.get_run(run_id)
        return next((m for m in run.measurements if m.case_id == self.case_id), None)

    def _verdict(self, run_id: str) -> Verdict | None:
        m = self.measurement(run_id)
        if m is None:
            return None
        ok = sum(p.status == "ok" for p in self.base)
        c = memory.Candidate(m, self.base, {}, ok < self.config.min_baseline_runs)
        return memory.verdict(c, self.metric, self.config)

    def where(self, last_good: str, first_bad: str) -> Where | None:
        """Where the first bad commit's peak grew against the last good one's."""
        good, bad = self.rows(last_good), self.rows(first_bad)
        if not good or not bad:
            return None
        m = self.measurement(bad[0]["run_id"])
        base = self.store.sites(good[0]["run_id"], self.case_id)
        return where(base, m.sites) if m is not None and m.sites and base else None


def commits_between(root: Path, good: str, bad: str) -> tuple[str, str, list[str]]:
    """GOOD's and BAD's commits and the commits after GOOD up to BAD, oldest first;
    ConfigError naming what is wrong (an unknown ref, GOOD not an ancestor of BAD)."""
    shas = []
    for name, ref in (("GOOD", good), ("BAD", bad)):
        sha = git_output(root, "rev-parse", "--verify", "--quiet", revs=(f"{ref}^{{commit}}",))
        if not sha:
            raise ConfigError(f"{name}: {ref!r} is no commit of the repository at {root}")
        shas.append(sha)
    good_sha, bad_sha = shas
    if good_sha == bad_sha:
        raise ConfigError(f"GOOD and BAD are the same commit ({good_sha[:12]})")
    if git_output(root, "merge-base", "--is-ancestor", revs=(good_sha, bad_sha)) is None:
        raise ConfigError(f"GOOD {good!r} is not an ancestor of BAD {bad!r}")
    listed = git_output(
        root,
        "rev-list",
        "--ancestry-path",
        "--topo-order",
        "--reverse",
        revs=(f"{good_sha}..{bad_sha}",),
    )
    return good_sha, bad_sha, (listed or "").split()


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
    good_sha, bad_sha, after = commits_between(root, good, bad)
    judge = Judge(store, config, case_id, metric, fingerprint, measure)
    judge.set_good(good_sha)
    commits = [good_sha, *after]
    common: dict[str, Any] = dict(
        case_id=case_id, metric=metric, good=good_sha, bad=bad_sha, commits=len(after)
    )
    if judge(bad_sha) != BAD:
        said = judge.results[bad_sha]
        return Bisection(
            **common,
            first_bad=None,
            judged=tuple(judge.results.values()),
            message=f"BAD {bad_sha[:12]} does not step past the headroom against GOOD "
            f"{good_sha[:12]} ({said.state}: {said.why}): nothing to find",
            measured=tuple(judge.measured),
        )
    hi, hidden = search(commits, judge.recorded, judge)
    first = commits[hi]
    judged = tuple(judge.results[c] for c in commits if c in judge.results)
    if hidden:
        among = tuple(commits[i] for i in [*hidden, hi])
        return Bisection(
            **common,
            first_bad=None,
            among=among,
            judged=judged,
            message="cannot decide: the first bad commit is one of "
            + ", ".join(c[:12] for c in among)
            + f" ({len(hidden)} skipped: "
            + "; ".join(f"{commits[i][:12]} {judge.results[commits[i]].why}" for i in hidden)
            + ")",
            measured=tuple(judge.measured),
        )
    subject = git_output(root, "show", "-s", "--format=%s", revs=(first,))
    return Bisection(
        **common,
        first_bad=first,
        judged=judged,
        step=judge.verdicts.get(first),
        where=judge.where(commits[hi - 1], first),
        subject=subject,
        message=f"first bad commit: {first[:12]} {subject or ''}".rstrip(),
        measured=tuple(judge.measured),
    )


__all__ = ["BAD", "GOOD", "SKIP", "Bisection", "Judge", "Judged", "bisect", "command", "search"]
