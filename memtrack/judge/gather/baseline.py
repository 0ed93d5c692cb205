"""A case's baseline: its last runs on the base branch, at or before the merge-base, found by
git's ancestry (or, in a shallow clone, by commit time, said in a note); and the regressions
of the base branch still open."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

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


def iso_epoch(iso: str | None) -> float | None:
    t = parse_time(iso)
    return None if t is None else t.timestamp()


def point_of(row: Row) -> Point:
    """A baseline point from a row of the store's point query (store.judging)."""

    def figures(columns: dict[str, str]) -> dict[str, int]:
        return {name: int(row[col]) for name, col in columns.items() if row[col] is not None}

    def numbers(column: str) -> tuple[Any, ...]:
        raw = row[column]
        return tuple(json.loads(raw) or ()) if raw else ()

    cpu = tuple(float(x) for x in numbers("iteration_cpu_times_s"))
    wall = tuple(float(x) for x in numbers("iteration_times_s"))
    return Point(
        row["run_id"],
        row["git_commit"],
        row["started_at"],
        row["env_id"],
        row["status"],
        figures(metrics.COLUMNS),
        wall,
        figures(metrics.COMPONENTS),
        tuple(int(x) for x in numbers("allocated_samples")),
        row["fingerprint"],
        tuple(int(x) for x in numbers("retained_samples")),
        cpu,
        tuple(float(x) for x in numbers("iteration_device_times_s")),
        Load(
            row["timing_cpu_pressure"],
            row["timing_runnable"],
            row["timing_cores"],
            row["timing_steal"],
            own_demand(cpu, wall),
            row["timing_wait_cores"],
            row["timing_others_cores"],
            sum(wall),
        ),
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


class BaselineFinder:
    """Finds the baseline points of a case: base branch, at or before the merge-base."""

    def __init__(
        self,
        store: Store,
        run: RunRecord,
        base_branch: str,
        root: Path,
        limit: int,
        owners: dict[str, str] | None = None,
    ):
        self.store, self.run, self.base_branch, self.root = store, run, base_branch, root
        self.limit = limit
        # case id -> the run holding the candidate's figures (runs of one commit differ)
        self.owners = owners or {}
        self.notes: list[str] = []
        # Only a commit id goes on to git (a database written before records were checked
        # may hold anything here).
        mb = run.git.merge_base
        self.merge_base = mb if mb and re.fullmatch(COMMIT_PATTERN[1:-1], mb) else None
        self.ancestry: git.Ancestry | None = None
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
            return "ancestry"
        self._by_time(inside, shallow)
        return "time"

    def _by_time(self, inside: bool, shallow: bool) -> None:
        """Degrade to time: base-branch commits no newer than the merge-base (or the
        candidate), said in a note."""
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
            f"{why}: baseline chosen by time, not ancestry: runs on {self.base_branch} of "
            f"commits made at or before {stamp} ({ref_what}); fetch the full history "
            f"(actions/checkout fetch-depth: 0) for an exact baseline"
        )

    def _eligible(self, row: Row) -> bool:
        return eligible(row, cutoff=self.cutoff, ancestor=self._ancestor)

    def _rows(self, case_id: str, same_env: bool) -> Iterator[Row]:
        rows = reads.baseline_rows(
            self.store,
            case_id,
            branch=self.base_branch,
            candidate=self.owners.get(case_id, self.run.run_id),
            fingerprint=self.run.environment.fingerprint if same_env else None,
            figures=FIGURES,
        )
        for row in rows:
            if self._eligible(row):
                yield row

    def points(self, case_id: str) -> list[Point]:
        """The newest `limit` eligible same-environment points, newest first."""
        out = []
        for row in self._rows(case_id, same_env=True):
            out.append(point_of(row))
            if len(out) >= self.limit:
                break
        return out

    def other_points(self, case_id: str) -> list[Point]:
        """The newest `limit` eligible points of this case on other environments, newest
        first: what the history knows of the case's noise."""
        out = []
        for row in self._rows(case_id, same_env=False):
            if row["fingerprint"] != self.run.environment.fingerprint:
                out.append(point_of(row))
                if len(out) >= self.limit:
                    break
        return out

    def other_env(self, case_id: str) -> Point | None:
        """The newest eligible point of this case on another environment."""
        for row in self._rows(case_id, same_env=False):
            if row["fingerprint"] != self.run.environment.fingerprint:
                return point_of(row)
        return None

    def newest_cases(self) -> set[str] | None:
        """The cases of the newest eligible same-environment base run, if there is one."""
        candidates = {self.run.run_id, *self.owners.values()}
        fingerprint = self.run.environment.fingerprint
        for row in reads.base_runs(self.store, self.base_branch, fingerprint, candidates):
            if self._eligible(row):
                cases = reads.measured_cases(self.store, row["run_id"])
                if cases:  # an estimate run is no baseline run
                    return cases
        return None

    def in_history(self, commit: str | None, started_at: str) -> bool:
        """Whether a base-branch commit (its run started at `started_at`) is in the
        candidate's history: an ancestor of its merge-base, else (by time) no newer."""
        row = {
            "git_commit": commit,
            "git_committed_at": reads.commit_time(self.store, commit) if commit else None,
            "started_at": started_at,
        }
        return self._eligible(row)

    def seen_anywhere(self, case_id: str) -> bool:
        return reads.measured_elsewhere(self.store, case_id, self.run.run_id)


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
    for case in case_ids:
        found = reads.base_regressions(
            store, case, branch=base_branch, fingerprint=fingerprint, until=until, limit=limit
        )
        for row in found:
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
    "BaselineFinder",
    "eligible",
    "iso_epoch",
    "open_regressions",
    "point_of",
]
