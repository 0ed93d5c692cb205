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

from memtrack.config import Config
from memtrack.judge import memory
from memtrack.judge.evidence import Point
from memtrack.judge.verdict import Verdict
from memtrack.judge.where import Where
from memtrack.records import Measurement

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
    verdict: Verdict | None = None
    """Its first run's verdict against GOOD."""


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


def judge_commit(
    base: list[Point],
    candidates: list[Measurement | None],
    statuses: list[str],
    metric: str,
    config: Config,
) -> tuple[str, str, Verdict | None]:
    """A commit's runs of the case against GOOD's (`base`): bad where every run says
    `regression`, good where none does and none is `noisy`, else skip; with why, and the
    first run's verdict."""
    failed = sorted({s for s in statuses if s != "ok"})
    if failed:
        return SKIP, f"a run failed ({', '.join(failed)})", None
    judged = [
        v
        for m in candidates
        if m is not None
        and (v := memory.verdict(memory.Candidate(m, base), metric, config)) is not None
    ]
    if not judged:
        return SKIP, f"no {metric} figure", None
    kinds = {v.kind for v in judged}
    if kinds == {"regression"}:
        return BAD, "regression", judged[0]
    if "regression" in kinds or "noisy" in kinds:
        said = "too noisy to judge" if kinds == {"noisy"} else f"its runs disagree ({kinds})"
        return SKIP, said, judged[0]
    return GOOD, judged[0].kind, judged[0]


__all__ = ["BAD", "GOOD", "SKIP", "Bisection", "Judged", "command", "judge_commit", "search"]
