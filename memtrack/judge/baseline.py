"""The baseline of a case: its last runs on the base branch, at or before the merge-base.

Ancestry comes from git (listed lazily); where the merge-base is unknown (a shallow clone)
the baseline is chosen by commit time, and the finder says so in its notes.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memtrack import metrics
from memtrack.records import COMMIT_PATTERN, RunRecord
from memtrack.store import Store
from memtrack.units import parse_time

_ANCESTRY_FIRST = 512
"""Ancestors listed at first; the list doubles while an older baseline commit is asked for."""


# -- git -----------------------------------------------------------------------------------


def git_output(root: Path, *args: str, revs: tuple[str, ...] = ()) -> str | None:
    """git's output, or None when git fails (no repository, unknown object).

    `args` are the subcommand and its options, written in the code; revisions, which come
    from records, configs and the command line, go in `revs`: after `--end-of-options`, so
    a value such as '--output=FILE' is never read as an option.
    """
    cmd = ["git", "-C", str(root), *args]
    if revs:
        cmd += ["--end-of-options", *revs]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def iso_epoch(iso: str | None) -> float | None:
    t = parse_time(iso)
    return None if t is None else t.timestamp()


class _Ancestry:
    """Commits reachable from a revision, listed lazily (newest first, doubling)."""

    def __init__(self, root: Path, rev: str):
        self.root, self.rev = root, rev
        self.commits: set[str] = set()
        self.oldest: float | None = None
        self.count = 0
        self.complete = False

    def _load(self) -> None:
        self.count = max(_ANCESTRY_FIRST, self.count * 2)
        out = git_output(self.root, "log", "--format=%H %ct", "-n", str(self.count),
                         revs=(self.rev,)) or ""
        lines = out.splitlines()
        self.commits = {line.split()[0] for line in lines}
        times = [float(line.split()[1]) for line in lines]
        self.oldest = min(times) if times else None
        self.complete = len(lines) < self.count

    def contains(self, sha: str, committed_at: float | None) -> bool:
        if not self.count:
            self._load()
        while True:
            if sha in self.commits:
                return True
            if self.complete:
                return False
            # A commit newer than everything listed would have been listed: not an ancestor.
            if committed_at is not None and self.oldest is not None and committed_at >= self.oldest:
                return False
            self._load()


# -- baseline ------------------------------------------------------------------------------


COMPONENTS = {
    "weights": "weights_bytes",
    "caches": "caches_bytes",
    "gradients": "gradients_bytes",
    "optimizer state": "optimizer_state_bytes",
    "intermediates": "intermediates_bytes",
    "unattributed": "unattributed_bytes",
    "workspace": "workspace_bytes",
}
"""The breakdown's parts and their columns: what grew, when a metric grew."""


@dataclass(frozen=True)
class Point:
    """One baseline run's measurement of a case."""

    run_id: str
    commit: str | None
    started_at: str
    env_id: str | None
    status: str
    values: dict[str, int]
    times: tuple[float, ...]
    components: dict[str, int] = field(default_factory=dict)
    samples: tuple[int, ...] = ()
    """The framework's allocated peak of each measured iteration."""


_POINT_SQL = f"""
select r.run_id, r.git_commit, r.started_at, r.git_committed_at, r.env_id, r.fingerprint,
       m.status, m.iteration_times_s, m.allocated_samples,
       {", ".join("m." + c for c in (*metrics.COLUMNS.values(), *COMPONENTS.values()))}
from runs r cross join measurements m
where r.git_branch = :branch and r.run_id != :candidate {{fingerprint}}
  and m.case_id = :case and m.run_id = r.run_id and m.kind = 'measured'
order by r.started_at desc
"""
# CROSS JOIN keeps `runs` as the outer loop: newest first through the (git_branch,
# started_at) index, each probing measurements(case_id, run_id); the scan stops after N.


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
        # case id -> the run holding the candidate's figures (shards of one commit differ)
        self.owners = owners or {}
        self.notes: list[str] = []
        # Only a commit id goes on to git (a database written before records were checked
        # may hold anything here).
        mb = run.git.merge_base
        self.merge_base = mb if mb and re.fullmatch(COMMIT_PATTERN[1:-1], mb) else None
        self.ancestry: _Ancestry | None = None
        self.cutoff: float | None = None
        self.mode = self._choose_mode()

    def _choose_mode(self) -> str:
        git = self.run.git
        commit = git.commit
        flags = (
            git_output(self.root, "rev-parse", "--is-inside-work-tree", "--is-shallow-repository")
            or ""
        ).split()
        inside = flags[:1] == ["true"]
        shallow = flags[1:2] == ["true"]
        known = (
            inside
            and commit is not None
            and git_output(self.root, "cat-file", "-e", revs=(f"{commit}^{{commit}}",)) is not None
        )
        if known and not shallow and self.merge_base is None:
            for ref in (self.base_branch, f"origin/{self.base_branch}"):
                mb = git_output(self.root, "merge-base", revs=(commit or "", ref))
                if mb:
                    self.merge_base = mb
                    break
        mb_known = (
            self.merge_base is not None
            and inside
            and git_output(self.root, "cat-file", "-e", revs=(f"{self.merge_base}^{{commit}}",))
            is not None
        )
        if mb_known and not shallow:
            self.ancestry = _Ancestry(self.root, self.merge_base or "")
            return "ancestry"
        # Degrade to time: base-branch commits no newer than the merge-base (or candidate).
        why = (
            "shallow clone"
            if shallow or git.shallow
            else "no git repository here"
            if not inside
            else "merge-base unknown"
            if self.merge_base is None
            else f"merge-base {self.merge_base[:12]} not in this repository"
        )
        ref_time, ref_what = None, ""
        if self.merge_base:
            ref_time = iso_epoch(
                git_output(self.root, "show", "-s", "--format=%cI", revs=(self.merge_base,))
            )
            if ref_time is None:
                row = self.store.conn.execute(
                    "select max(git_committed_at) from runs where git_commit = ?", [self.merge_base]
                ).fetchone()
                ref_time = iso_epoch(row[0]) if row else None
            ref_what = f"merge-base {self.merge_base[:12]}"
        if ref_time is None and git.committed_at:
            ref_time = iso_epoch(git.committed_at)
            ref_what = f"candidate commit {(commit or '')[:12]}"
        if ref_time is None:
            ref_time, ref_what = iso_epoch(self.run.started_at), "candidate run"
        self.cutoff = ref_time
        stamp = datetime.fromtimestamp(ref_time or 0, timezone.utc).isoformat(timespec="seconds")
        self.notes.append(
            f"{why}: baseline chosen by time, not ancestry: runs on {self.base_branch} of "
            f"commits made at or before {stamp} ({ref_what}); fetch the full history "
            f"(actions/checkout fetch-depth: 0) for an exact baseline"
        )
        return "time"

    def _eligible(self, row: Any) -> bool:
        committed = iso_epoch(row["git_committed_at"])
        if self.ancestry is not None:
            return bool(row["git_commit"]) and self.ancestry.contains(row["git_commit"], committed)
        when = committed if committed is not None else iso_epoch(row["started_at"])
        return when is not None and self.cutoff is not None and when <= self.cutoff

    def _rows(self, case_id: str, same_env: bool) -> Iterator[Any]:
        sql = _POINT_SQL.format(fingerprint="and r.fingerprint = :fp" if same_env else "")
        params = {
            "branch": self.base_branch,
            "candidate": self.owners.get(case_id, self.run.run_id),
            "case": case_id,
            "fp": self.run.environment.fingerprint,
        }
        for row in self.store.conn.execute(sql, params):
            if self._eligible(row):
                yield row

    def points(self, case_id: str) -> list[Point]:
        """The newest `limit` eligible same-environment points, newest first."""
        out = []
        for row in self._rows(case_id, same_env=True):
            out.append(_point(row))
            if len(out) >= self.limit:
                break
        return out

    def other_env(self, case_id: str) -> Point | None:
        """The newest eligible point of this case on another environment."""
        for row in self._rows(case_id, same_env=False):
            if row["fingerprint"] != self.run.environment.fingerprint:
                return _point(row)
        return None

    def newest_cases(self) -> set[str] | None:
        """The cases of the newest eligible same-environment base run, if there is one."""
        candidates = sorted({self.run.run_id, *self.owners.values()})
        rows = self.store.conn.execute(
            "select run_id, git_commit, git_committed_at, started_at from runs "
            "where git_branch = ? and fingerprint = ? "
            f"and run_id not in ({', '.join('?' for _ in candidates)}) "
            "order by started_at desc",
            [self.base_branch, self.run.environment.fingerprint, *candidates],
        )
        for row in rows:
            if self._eligible(row):
                cases = {
                    r[0]
                    for r in self.store.conn.execute(
                        "select case_id from measurements where run_id = ? "
                        "and kind = 'measured'", [row["run_id"]]
                    )
                }
                if cases:  # an estimate run is no baseline run
                    return cases
        return None

    def seen_anywhere(self, case_id: str) -> bool:
        row = self.store.conn.execute(
            "select 1 from measurements where case_id = ? and run_id != ? "
            "and kind = 'measured' limit 1",
            [case_id, self.run.run_id],
        ).fetchone()
        return row is not None


def _point(row: Any) -> Point:
    def figures(columns: dict[str, str]) -> dict[str, int]:
        return {name: int(row[col]) for name, col in columns.items() if row[col] is not None}

    times = tuple(json.loads(row["iteration_times_s"]) or ()) if row["iteration_times_s"] else ()
    raw = row["allocated_samples"]
    samples = tuple(int(x) for x in json.loads(raw) or ()) if raw else ()
    return Point(row["run_id"], row["git_commit"], row["started_at"], row["env_id"],
                 row["status"], figures(metrics.COLUMNS), times, figures(COMPONENTS), samples)
