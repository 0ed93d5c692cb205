"""A case's baseline: the newest runs of the base branch at or before the candidate's
merge-base, in commit order, each commit's runs together: git's first-parent order of the
merge-base, else (a shallow clone, no repository) the recorded commit times, said in a note.
A re-run of an old commit joins that commit; it never becomes the newest level. Also the
base branch's evidence at its newest commit (which cases it held, by kind of run), and its
regressions still open."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from memtrack.judge.evidence import OpenRegression, Point
from memtrack.judge.gather import git
from memtrack.judge.load import Load, own_demand
from memtrack.records import COMMIT_PATTERN, RunRecord, metrics
from memtrack.store import judging as reads
from memtrack.store.database import Store
from memtrack.store.judging import Row
from memtrack.units import parse_time

FIGURES = (*metrics.COLUMNS.values(), *metrics.COMPONENTS.values())
"""The measurement columns a baseline point reads besides its timing and samples."""
FIRST_BATCH = 32
"""Commits of the first-parent history read at first; each later batch is twice as many. The
default window (`baseline_runs`, 20) with room for commits nobody measured: a first batch
of 64 read twice the rows for nothing (`scripts/bench_check_speed.py`: 14 ms of a 78 ms
gather over 20,000 commits x 50 cases)."""
MAX_COMMITS = 20_000
"""Commits walked back at the most for a case's baseline."""
TIME_WALK = 5
"""In time order, a case's runs read (newest started first) per baseline run wanted: a
re-run of an old commit started late is read, and put back at its commit's time."""


def iso_epoch(iso: str | None) -> float | None:
    t = parse_time(iso)
    return None if t is None else t.timestamp()


def point_of(row: Row) -> Point:
    """A baseline point from a row of the store's point query (store.judging), or a dict."""
    # a dict reads a column by name in a third of the time; as in the store's rows, the
    # first of two columns of one name answers it
    raw = cast(Any, row)
    col: dict[str, Any] = raw
    if not isinstance(raw, dict):
        col = dict(zip(reversed(raw.keys()), reversed(tuple(raw)), strict=True))

    def figures(columns: dict[str, str]) -> dict[str, int]:
        return {name: int(col[c]) for name, c in columns.items() if col[c] is not None}

    def numbers(column: str) -> tuple[Any, ...]:
        text = col.get(column)
        return tuple(json.loads(text) or ()) if text else ()

    cpu = tuple(float(x) for x in numbers("iteration_cpu_times_s"))
    tree = tuple(float(x) for x in numbers("iteration_tree_cpu_times_s"))
    wall = tuple(float(x) for x in numbers("iteration_times_s"))
    return Point(
        col["run_id"],
        col["git_commit"],
        col["started_at"],
        col["env_id"],
        col["status"],
        figures(metrics.COLUMNS),
        wall,
        figures(metrics.COMPONENTS),
        tuple(int(x) for x in numbers("allocated_samples")),
        col["fingerprint"],
        tuple(int(x) for x in numbers("retained_samples")),
        cpu,
        tuple(float(x) for x in numbers("iteration_device_times_s")),
        Load(
            col["timing_cpu_pressure"],
            col["timing_runnable"],
            col["timing_cores"],
            col["timing_steal"],
            own_demand(tree or cpu, wall),
            col["timing_wait_cores"],
            col["timing_others_cores"],
            sum(wall),
        ),
        case_id=col.get("case_id"),
        tree_cpu_times=tree,
    )


def eligible(row: Row, *, cutoff: float | None, ancestor: Any) -> bool:
    """Whether a base-branch run (git_commit, git_committed_at, started_at) may be a
    baseline: with `ancestor` (git ancestry of the merge-base, given a commit and its
    time), its commit is one of the merge-base's ancestors; without, its commit (or, not
    known, the run) is no newer than `cutoff`."""
    committed = iso_epoch(row["git_committed_at"])
    if ancestor is not None:
        return bool(row["git_commit"]) and ancestor(row["git_commit"], committed)
    when = committed if committed is not None else iso_epoch(row["started_at"])
    return when is not None and cutoff is not None and when <= cutoff


class FirstParent:
    """The first-parent history of a revision, newest first, listed lazily in batches."""

    def __init__(self, root: Path, rev: str):
        self.root, self.rev = root, rev
        self.commits: list[str] = []
        self.complete = False

    def batches(self) -> Iterator[list[str]]:
        """The commits, newest first, in batches that double."""
        size, done = FIRST_BATCH, 0
        while done < MAX_COMMITS:
            want = done + size
            if len(self.commits) < want and not self.complete:
                self.commits = git.first_parent(self.root, self.rev, want)
                self.complete = len(self.commits) < want
            batch = self.commits[done:want]
            if not batch:
                return
            yield batch
            done, size = want, size * 2


@dataclass(frozen=True)
class BaseEvidence:
    """The base branch's runs at its newest commit in the candidate's history (the cases
    a baseline of each kind of run held)."""

    commit: str | None
    runs: tuple[RunRecord, ...] = ()


class BaselineFinder:
    """Finds the baseline of the candidate's cases: the base branch at or before its
    merge-base, in commit order."""

    def __init__(
        self,
        store: Store,
        run: RunRecord,
        base_branch: str,
        root: Path,
        limit: int,
        exclude: Iterable[str] = (),
    ):
        self.store, self.run, self.base_branch, self.root = store, run, base_branch, root
        self.limit = limit
        self.exclude = {run.run_id, *exclude}
        """The candidate's own runs: never its baseline."""
        self.notes: list[str] = []
        # Only a commit id goes on to git (a database written before records were checked
        # may hold anything here).
        mb = run.git.merge_base
        self.merge_base = mb if mb and re.fullmatch(COMMIT_PATTERN[1:-1], mb) else None
        self.ancestry: git.Ancestry | None = None
        self.order: FirstParent | None = None
        self.cutoff: float | None = None
        self.mode = self._choose_mode()
        self._ancestor = self.ancestry.contains if self.ancestry is not None else None

    def _choose_mode(self) -> str:
        commit = self.run.git.commit
        inside, shallow, known = git.repository_state(self.root, commit)
        if known and not shallow and self.merge_base is None and commit:
            self.merge_base = git.merge_base(self.root, commit, self.base_branch)
        mb_known = (
            self.merge_base is not None and inside and git.has_commit(self.root, self.merge_base)
        )
        if mb_known and not shallow:
            self.ancestry = git.Ancestry(self.root, self.merge_base or "")
            self.order = FirstParent(self.root, self.merge_base or "")
            return "ancestry"
        self._by_time(inside, shallow)
        return "time"

    def _by_time(self, inside: bool, shallow: bool) -> None:
        """Degrade to time: base-branch commits no newer than the merge-base (or the
        candidate), by their recorded commit times, said in a note."""
        g = self.run.git
        why = (
            "shallow clone"
            if shallow or g.shallow
            else "no git repository here"
            if not inside
            else "merge-base unknown"
            if self.merge_base is None
            else f"merge-base {self.merge_base[:12]} not in this repository"
        )
        ref_time, ref_what = None, ""
        if self.merge_base:
            ref_time = iso_epoch(git.commit_time(self.root, self.merge_base))
            if ref_time is None:
                ref_time = iso_epoch(reads.commit_time(self.store, self.merge_base))
            ref_what = f"merge-base {self.merge_base[:12]}"
        if ref_time is None and g.committed_at:
            ref_time = iso_epoch(g.committed_at)
            ref_what = f"candidate commit {(g.commit or '')[:12]}"
        if ref_time is None:
            ref_time, ref_what = iso_epoch(self.run.started_at), "candidate run"
        self.cutoff = ref_time
        stamp = datetime.fromtimestamp(ref_time or 0, timezone.utc).isoformat(timespec="seconds")
        self.notes.append(
            f"{why}: baseline chosen by commit time, not ancestry: runs on {self.base_branch} "
            f"of commits made at or before {stamp} ({ref_what}); fetch the full history "
            f"(actions/checkout fetch-depth: 0) for an exact baseline"
        )

    def _eligible(self, row: Row) -> bool:
        return eligible(row, cutoff=self.cutoff, ancestor=self._ancestor)

    # -- points -------------------------------------------------------------------------

    def points(
        self,
        cases: dict[str, tuple[str, ...]],
        *,
        same_env: bool = True,
        limit: int | None = None,
    ) -> dict[str, list[Point]]:
        """Each case's newest `limit` baseline points in commit order, newest first (each
        commit's runs newest first): `cases` maps a case to the ids it was recorded under
        (itself, and the ids of a test recorded from another rootdir). `same_env`: on the
        candidate's environment, else on every other one."""
        limit = limit or self.limit
        if self.order is not None:
            return self._by_commits(cases, same_env, limit)
        return {c: self._by_clock(ids, same_env, limit) for c, ids in cases.items()}

    def _by_commits(
        self, cases: dict[str, tuple[str, ...]], same_env: bool, limit: int
    ) -> dict[str, list[Point]]:
        assert self.order is not None
        fingerprint = self.run.environment.fingerprint
        out: dict[str, list[Point]] = {c: [] for c in cases}
        alias = {i: c for c, ids in cases.items() for i in ids}
        need = set(cases)
        for batch in self.order.batches():
            rows = reads.commits_rows(
                self.store,
                [i for c in need for i in cases[c]],
                batch,
                branch=self.base_branch,
                exclude=self.exclude,
                fingerprint=fingerprint if same_env else None,
                figures=FIGURES,
            )
            found: dict[tuple[str, str], list[Row]] = defaultdict(list)
            for r in rows:
                if same_env or r["fingerprint"] != fingerprint:
                    found[(alias[r["case_id"]], r["git_commit"])].append(r)
            for commit in batch:
                for case in sorted(need):
                    runs = sorted(found.get((case, commit), ()), key=lambda r: r["started_at"])
                    out[case] += [point_of(r) for r in reversed(runs)]
                    if len(out[case]) >= limit:
                        need.discard(case)
            if not need:
                break
        return {c: ps[:limit] for c, ps in out.items()}

    def _by_clock(self, ids: tuple[str, ...], same_env: bool, limit: int) -> list[Point]:
        """Without git's order: the newest eligible runs, read as they started, put in the
        order of their commits' recorded times."""
        fingerprint = self.run.environment.fingerprint
        rows: list[Row] = []
        for case_id in ids:
            walk = reads.baseline_rows(
                self.store,
                case_id,
                branch=self.base_branch,
                candidate=self.run.run_id,
                fingerprint=fingerprint if same_env else None,
                figures=FIGURES,
            )
            mine = 0
            for row in walk:
                ok = row["run_id"] not in self.exclude and self._eligible(row)
                if ok and (same_env or row["fingerprint"] != fingerprint):
                    rows.append(row)
                    mine += 1
                    if mine >= limit * TIME_WALK:
                        break

        def when(r: Row) -> tuple[float, str]:
            return (
                iso_epoch(r["git_committed_at"]) or iso_epoch(r["started_at"]) or 0.0,
                r["started_at"],
            )

        rows.sort(key=when, reverse=True)
        return [point_of(r) for r in rows[:limit]]

    # -- the base branch's evidence, its history -----------------------------------------

    def base_evidence(self) -> BaseEvidence:
        """The base branch's runs (on this environment) at its newest commit in the
        candidate's history that has any."""
        fingerprint = self.run.environment.fingerprint
        if self.order is not None:
            for batch in self.order.batches():
                found = reads.commits_runs(
                    self.store, batch, branch=self.base_branch, fingerprint=fingerprint
                )
                by_commit = defaultdict(list)
                for r in found:
                    if r["run_id"] not in self.exclude:
                        by_commit[r["git_commit"]].append(r["run_id"])
                for commit in batch:
                    if by_commit.get(commit):
                        return BaseEvidence(commit, self._measured(by_commit[commit]))
            return BaseEvidence(None)
        for row in reads.base_runs(self.store, self.base_branch, fingerprint, self.exclude):
            if self._eligible(row) and row["git_commit"]:
                ids = [
                    r["run_id"]
                    for r in reads.commit_runs(self.store, row["git_commit"], fingerprint)
                    if r["run_id"] not in self.exclude
                ]
                runs = self._measured(ids)
                if runs:
                    return BaseEvidence(row["git_commit"], runs)
        return BaseEvidence(None)

    def _measured(self, run_ids: list[str]) -> tuple[RunRecord, ...]:
        out = []
        for run_id in run_ids:
            run = self.store.get_run(run_id)
            measured = tuple(m for m in run.measurements if m.kind == "measured")
            if measured:
                out.append(replace(run, measurements=measured))
        return tuple(out)

    def in_history(self, commit: str | None, started_at: str) -> bool:
        """Whether a base-branch commit (its run started at `started_at`) is in the
        candidate's history: an ancestor of its merge-base, else (by time) no newer."""
        row = {
            "git_commit": commit,
            "git_committed_at": reads.commit_time(self.store, commit) if commit else None,
            "started_at": started_at,
        }
        return self._eligible(row)

    def seen_anywhere(self, case_ids: Iterable[str]) -> set[str]:
        """Of `case_ids`, those some other run measured (anywhere)."""
        return reads.measured_elsewhere(self.store, case_ids, self.run.run_id)


def open_regressions(
    store: Store,
    base_branch: str,
    case_ids: Iterable[str],
    *,
    fingerprint: str | None = None,
    until: str | None = None,
    limit: int = 50,
) -> list[OpenRegression]:
    """The base branch's regressions still open, whatever their age, newest first: each
    case's base-context `regression` verdicts, each closed by a later base run of its
    environment within its threshold, or by a later `accepted` verdict of the same case and
    metric on the base branch. With `until`, as they stood before that time. Read-only; []
    without a verdicts table."""
    if not reads.has_verdicts(store):
        return []
    out: list[OpenRegression] = []
    cases = list(case_ids)
    found = reads.base_regressions(
        store, cases, branch=base_branch, fingerprint=fingerprint, until=until, limit=limit
    )
    for case in cases:
        for row in found.get(case, []):
            if row["metric"] in metrics.COLUMNS and not _closed(store, row, base_branch, until):
                out.append(replace(_open_regression(case, row), branch=base_branch))
    out.sort(key=lambda o: o.started_at, reverse=True)
    return out


def _closed(store: Store, row: Row, base_branch: str, until: str | None) -> bool:
    case, metric, t = row["case_id"], row["metric"], row["started_at"]
    return reads.back_within(
        store,
        case,
        metric,
        row["threshold"],
        branch=base_branch,
        after=t,
        fingerprint=row["fingerprint"],
        until=until,
    ) or reads.accepted_after(store, case, metric, branch=base_branch, after=t, until=until)


def _open_regression(case: str, row: Row) -> OpenRegression:
    return OpenRegression(
        case,
        row["metric"],
        row["run_id"],
        row["git_commit"],
        row["git_subject"],
        row["started_at"],
        row["fingerprint"],
        row["baseline_value"],
        float(row["threshold"]),
        row["candidate_value"],
        row["delta"],
        row["delta_pct"],
        row["component"],
        row["component_delta"],
    )


__all__ = [
    "FIGURES",
    "BaseEvidence",
    "BaselineFinder",
    "FirstParent",
    "eligible",
    "iso_epoch",
    "open_regressions",
    "point_of",
]
