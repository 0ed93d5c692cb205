"""The baseline of a case: its last runs on the base branch, at or before the merge-base.

Ancestry comes from git (listed lazily); where the merge-base is unknown (a shallow clone)
the baseline is chosen by commit time, and the finder says so in its notes.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memtrack.judge.load import Load, own_demand
from memtrack.records import COMMIT_PATTERN, RunRecord, metrics
from memtrack.store.database import Store
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
        out = (
            git_output(self.root, "log", "--format=%H %ct", "-n", str(self.count), revs=(self.rev,))
            or ""
        )
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
    fingerprint: str | None = None
    """Its run's environment fingerprint."""
    retained: tuple[int, ...] = ()
    """What each measured iteration left allocated (a leak leaves the same every time)."""
    cpu_times: tuple[float, ...] = ()
    """Process CPU time of each timed iteration."""
    device_times: tuple[float, ...] = ()
    """CUDA event time of each timed iteration."""
    load: Load = field(default_factory=lambda: Load())
    """How busy the machine was while the run was timed."""


_POINT_SQL = f"""
select r.run_id, r.git_commit, r.started_at, r.git_committed_at, r.env_id, r.fingerprint,
       m.status, m.iteration_times_s, m.allocated_samples, m.retained_samples,
       m.iteration_cpu_times_s, m.iteration_device_times_s, m.timing_cpu_pressure,
       m.timing_runnable, m.timing_cores, m.timing_steal,
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

    def other_points(self, case_id: str) -> list[Point]:
        """The newest `limit` eligible points of this case on other environments, newest
        first: what the history knows of the case's noise, which a change of driver or
        torch moves no more than it moves the code."""
        out = []
        for row in self._rows(case_id, same_env=False):
            if row["fingerprint"] != self.run.environment.fingerprint:
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
                        "select case_id from measurements where run_id = ? and kind = 'measured'",
                        [row["run_id"]],
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
        figures(COMPONENTS),
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
        ),
    )


# -- regressions of the base branch still open ----------------------------------------------


@dataclass(frozen=True)
class OpenRegression:
    """A regression the gate found on the base branch (a base-context verdict) that no later
    run of the base branch, on the same environment, brought back within its threshold, and
    that no later check of the base branch accepted."""

    case_id: str
    metric: str
    run_id: str
    """The base-branch run the regression was found on."""
    commit: str | None
    """Its commit: the first at the regressed level."""
    subject: str | None
    started_at: str
    fingerprint: str | None
    baseline_value: float | None
    threshold: float
    candidate_value: float | None
    delta: float | None
    delta_pct: float | None
    component: str | None = None
    component_delta: float | None = None
    fixed_here: bool = False
    """The run being checked is back within the threshold (a fix, on a pull request)."""

    def describe(self) -> str:
        """'allocated +4.55 MiB (+12.00%) since 1a2b3c4d5e6f (subject)'."""
        from memtrack.units import format_size

        size = ""
        if self.delta is not None:
            size = f" {'+' if self.delta >= 0 else '-'}{format_size(abs(int(self.delta)))}"
            if self.delta_pct is not None:
                size += f" ({self.delta_pct:+.2f}%)"
        grew = f", {self.component} grew" if self.component else ""
        subject = f" ({' '.join(self.subject.split())[:60]})" if self.subject else ""
        return (
            f"{self.metric}{size} since {(self.commit or '?')[:12]}{subject}{grew}; "
            f"fixed when back within {format_size(int(self.threshold))}"
        )


_OPEN_SQL = """
select v.run_id, v.case_id, v.metric, v.baseline_value, v.threshold, v.candidate_value,
       v.delta, v.delta_pct, v.component, v.component_delta,
       r.git_commit, r.git_subject, r.started_at, r.fingerprint
from verdicts v cross join runs r on r.run_id = v.run_id
where v.context = 'base' and v.kind = 'regression' and v.case_id = :case
  and r.git_branch = :branch and v.threshold is not null {more}
order by r.started_at desc
"""


def open_regressions(
    conn: Any,
    base_branch: str,
    case_ids: Iterable[str],
    *,
    fingerprint: str | None = None,
    until: str | None = None,
    limit: int = 50,
) -> list[OpenRegression]:
    """The base branch's regressions still open, whatever their age, newest first: each
    case's base-context `regression` verdicts (their own index), each closed by a later
    base run of its environment within its threshold, or by a later `accepted` verdict of
    the same case and metric on the base branch. With `until`, as they stood before that
    time (runs started before it). Read-only; [] without a verdicts table."""
    if not conn.execute(
        "select 1 from sqlite_master where type = 'table' and name = 'verdicts'"
    ).fetchone():
        return []
    out: list[OpenRegression] = []
    more = " and r.fingerprint = :fp" if fingerprint else ""
    later = " and r.started_at < :until" if until else ""
    for case in case_ids:
        rows = conn.execute(
            _OPEN_SQL.format(more=more + later),
            {
                "case": case,
                "branch": base_branch,
                "fp": fingerprint,
                "until": until,
            },
        ).fetchmany(limit)
        for row in rows:
            column = metrics.COLUMNS.get(row["metric"])
            if column is None:
                continue
            fixed = conn.execute(
                f"select 1 from runs r cross join measurements m on m.run_id = r.run_id "
                f"and m.case_id = :case where r.git_branch = :branch and r.started_at > :t "
                f"and r.fingerprint is :fp and m.kind = 'measured' and m.status = 'ok' "
                f"and m.{column} <= :threshold{later} limit 1",
                {
                    "case": case,
                    "branch": base_branch,
                    "t": row["started_at"],
                    "fp": row["fingerprint"],
                    "threshold": row["threshold"],
                    "until": until,
                },
            ).fetchone()
            if fixed:
                continue
            accepted = conn.execute(
                "select 1 from verdicts v cross join runs r on r.run_id = v.run_id "
                "where v.context = 'base' and v.case_id = :case and v.metric = :metric "
                f"and v.kind = 'accepted' and r.git_branch = :branch and r.started_at > :t"
                f"{later} limit 1",
                {
                    "case": case,
                    "metric": row["metric"],
                    "branch": base_branch,
                    "t": row["started_at"],
                    "until": until,
                },
            ).fetchone()
            if accepted:
                continue
            out.append(
                OpenRegression(
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
            )
    out.sort(key=lambda o: o.started_at, reverse=True)
    return out
