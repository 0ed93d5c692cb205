"""Deciding: a candidate run against its baseline, its budgets and what was accepted.

The baseline of a case is its last N runs on the base branch, at or before the candidate's
merge-base, on the same environment fingerprint, split at their steps: the candidate is
judged against the level the base branch is at now (memtrack.judge.memory has the
arithmetic). A run of the base branch itself is judged against its previous level too:
reported and recorded, never blocking, so that a regression that reached the base branch
shows as one. Nothing here prints; `memtrack.report.check` shows what this returns.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.errors import ConfigError, StoreError
from memtrack.judge import accept, leak, memory, quality, timing
from memtrack.judge.baseline import (
    BaselineFinder,
    OpenRegression,
    Point,
    git_output,
    open_regressions,
)
from memtrack.judge.budgets import (
    BudgetChange,
    budget_changes,
    budgets_for,
    rank_part,
    vram_verdict,
)
from memtrack.judge.memory import Candidate
from memtrack.judge.verdict import Verdict
from memtrack.judge.where import where
from memtrack.machine.provenance import repository_identity
from memtrack.records import (
    Environment,
    Measurement,
    RunRecord,
    distribution_key,
    metrics,
    now,
)
from memtrack.store import judging as reads
from memtrack.store.database import ALL_REPOSITORIES, Store
from memtrack.units import format_size


@dataclass(frozen=True)
class Estimate:
    """A case's estimate (`memtrack estimate`, fake tensors) beside what was measured:
    information, never judged."""

    case_id: str
    estimate_bytes: int
    """The predicted framework peak."""
    run_id: str
    """The estimate run."""
    commit: str | None
    measured_bytes: int | None = None
    """The candidate's measured framework peak (allocated); None for an estimate run."""
    budget_bytes: int | None = None
    """A budget of the case, where one applies (shown for an estimate run)."""
    budget_metric: str | None = None
    candidate_commit: str | None = None
    """The commit checked, where the estimate is of another one: its merge-base's."""
    scratch_bytes: int | None = None
    """The kernel scratch the estimate includes, from a measured run (`scratch_run_id`);
    None where it excludes scratch."""
    scratch_run_id: str | None = None
    candidate_run_id: str | None = None
    """The measured run checked: an estimate calibrated from it matches it by construction."""

    def describe(self) -> str:
        """'estimate 4.90 MiB (tensors only: excludes kernel scratch) (measured 4.90 MiB,
        +0.0%)', or with '(13.12 MiB of tensors + 3.08 MiB kernel scratch from run X)'
        where a measured run calibrated it; 'estimate of commit 1a2b3c4d5e6f 4.90 MiB ...'
        where it was made for another commit than the one checked (its merge-base)."""
        text = f"estimate {format_size(self.estimate_bytes)}"
        if self.candidate_commit is not None and self.commit != self.candidate_commit:
            text = (
                f"estimate of commit {(self.commit or 'unknown')[:12]} (not the one "
                f"checked) {format_size(self.estimate_bytes)}"
            )
        if self.scratch_bytes is None:
            text += " (tensors only: excludes kernel scratch)"
        else:
            text += (
                f" ({format_size(self.estimate_bytes - self.scratch_bytes)} of tensors + "
                f"{format_size(self.scratch_bytes)} kernel scratch from run "
                f"{(self.scratch_run_id or 'unknown')[:12]}"
                + (", this run" if self.scratch_run_id == self.candidate_run_id else "")
                + ")"
            )
        if self.measured_bytes:
            pct = 100.0 * (self.estimate_bytes / self.measured_bytes - 1)
            text += f" (measured {format_size(self.measured_bytes)}, {pct:+.2f}%)"
        if self.budget_bytes is not None:
            pct = 100.0 * self.estimate_bytes / self.budget_bytes if self.budget_bytes else 0.0
            text += (
                f"; {self.budget_metric} budget {format_size(self.budget_bytes)} "
                f"({pct:.0f}% of it, information only)"
            )
        return text


@dataclass(frozen=True)
class CheckResult:
    """Everything `memtrack check` decided about one candidate run."""

    run_id: str
    commit: str | None
    branch: str | None
    started_at: str
    fingerprint: str
    base_branch: str
    merge_base: str | None
    baseline_mode: str
    """'ancestry' (commits at or before the merge-base) or 'time' (the merge-base could not
    be used, e.g. a shallow clone: base-branch commits no newer than a reference time)."""
    verdicts: tuple[Verdict, ...]
    budget_changes: tuple[BudgetChange, ...] = ()
    notes: tuple[str, ...] = ()
    checked_at: str = ""
    case_runs: dict[str, str] = field(default_factory=dict)
    """Case id -> the run holding its figures, where shards of one commit were joined;
    verdicts are recorded against that run."""
    context: str = "pull_request"
    """'pull_request', or 'base' for a run of the base branch (never blocking)."""
    acceptances: tuple[accept.Acceptance, ...] = ()
    """The reviewed acceptances found in the commits this run adds."""
    estimates: tuple[Estimate, ...] = ()
    """Estimates of the candidate's cases (the same commit's, else the newest)."""
    estimate_only: bool = False
    """The candidate is an estimate run: nothing was measured, nothing is judged."""
    open_regressions: tuple[OpenRegression, ...] = ()
    """Regressions of the base branch still open (not fixed or accepted), whatever their
    age, on the candidate's cases and environment: reported by every check, never
    blocking."""

    @property
    def blocking(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.blocking)

    @property
    def exit_code(self) -> int:
        """0 when nothing blocks, 1 when something does."""
        return 1 if self.blocking else 0


def environment_diff(old: Environment, new: Environment) -> list[str]:
    """'what: old -> new' for each confounder that differs."""

    def gpus(e: Environment) -> str:
        return ", ".join(f"{g.name} ({format_size(g.total_bytes)})" for g in e.gpus) or "none"

    pairs = [
        ("GPUs", gpus(old), gpus(new)),
        ("driver", old.driver, new.driver),
        ("CUDA", old.cuda_runtime, new.cuda_runtime),
        ("cuDNN", old.cudnn, new.cudnn),
        ("NCCL", old.nccl, new.nccl),
        ("torch", old.torch, new.torch),
        ("Python", old.python, new.python),
        ("OS", old.os, new.os),
    ]
    out = [f"{what}: {a or '-'} -> {b or '-'}" for what, a, b in pairs if a != b]
    for name in sorted(set(old.env_vars) | set(new.env_vars)):
        if old.env_vars.get(name) != new.env_vars.get(name):
            out.append(
                f"{name}: {old.env_vars.get(name, '(unset)')} -> "
                f"{new.env_vars.get(name, '(unset)')}"
            )
    was, now = _packages(old), _packages(new)
    # A record made before every distribution was recorded holds the memory-relevant ones
    # alone: beside it, a package only one side names is no install or removal.
    whole = all(WHOLE_RECORD in p for p in (was, now))
    for name in sorted(set(was) | set(now)):
        if name == "torch" or was.get(name) == now.get(name):
            continue
        if whole or (name in was and name in now):
            out.append(f"{name}: {was.get(name, '-')} -> {now.get(name, '-')}")
    return out


WHOLE_RECORD = "click"
"""A distribution every install of memtrack has (a dependency of its own): a record whose
packages name it lists every distribution, an older one only memory-relevant ones."""


def _packages(e: Environment) -> dict[str, str]:
    """The environment's packages by normalised name (an older record's 'flash_attn')."""
    return {distribution_key(k): v for k, v in e.packages.items()}


def _unbased_verdict(
    c: Candidate, metric: str, base_branch: str, other_env: tuple[Point, list[str]] | None
) -> Verdict | None:
    """No baseline on this environment: 'new' or 'environment changed', budgets still hold."""
    m = c.m
    figure = c.figure(metric)
    if figure is None:
        return None
    value, budget, over, changes = figure
    if other_env is not None:
        point, diff = other_env
        kind = "environment_changed"
        text = (
            f"environment changed ({'; '.join(diff) or 'fingerprint differs'}): no baseline "
            f"on {base_branch} with this environment, not compared (newest other-environment "
            f"run {point.run_id[:12]} of {(point.commit or '?')[:12]})"
        )
        details = tuple(diff)
    elif c.points:
        failed = sorted({p.status for p in c.points if p.status != "ok"})
        kind, details = "new", ()
        text = (
            f"new: no ok run on {base_branch}: its {len(c.points)} run"
            f"{'s' if len(c.points) != 1 else ''} there failed ({', '.join(failed)})"
            if failed
            else f"new: no run on {base_branch} measured its {metric} figure"
        )
    else:
        kind, text, details = "new", f"new: no baseline on {base_branch}", ()
    details += changes
    return Verdict(
        case_id=m.case_id,
        workload=m.workload,
        metric=metric,
        kind="over_budget" if over else kind,
        blocking=over and c.context != "base",
        candidate_value=float(value),
        context=c.context,
        budget_bytes=budget.limit_bytes if budget else None,
        budget_reason=budget.reason if budget else None,
        details=details,
        message=f"{metric} {format_size(value)}: {text}{c.budget_part(metric, value, budget)}",
        words=text,
    )


def _failed_verdict(c: Candidate) -> Verdict:
    m = c.m
    same_env_status = [p.status for p in c.points]
    passed = sum(s == "ok" for s in same_env_status)
    if c.points and c.points[0].status != "ok":
        blocking, why = (
            False,
            (
                f"the newest baseline run failed too ({c.points[0].status}): "
                f"a known failure, not caused here"
            ),
        )
    elif c.points:
        blocking, why = True, f"the baseline passed ({passed} of {len(c.points)} runs ok)"
    else:
        blocking, why = True, "no baseline: a case that does not run cannot be gated"
    msg = (m.message or "").strip().splitlines()
    failure = m.status + (f" ({msg[-1][:160]})" if msg else "")
    return Verdict(
        case_id=m.case_id,
        workload=m.workload,
        metric="status",
        kind="failed",
        blocking=blocking and c.context != "base",
        baseline_runs=len(c.points),
        context=c.context,
        message=f"status: {failure}; {why}",
        words=why,
        failure=failure,
    )


def _judge_case(
    c: Candidate,
    config: Config,
    base_branch: str,
    other_env: tuple[Point, list[str]] | None,
    time_on: bool,
) -> list[Verdict]:
    m = c.m
    if m.status != "ok":
        return [_failed_verdict(c)]
    out: list[Verdict] = []
    for metric in metrics.GATED:
        if any(p.status == "ok" and metric in p.values for p in c.points):
            v = memory.verdict(c, metric, config)
        else:  # no run of the base branch measured it (none at all, or all failed): new
            v = _unbased_verdict(c, metric, base_branch, other_env)
        if v is None:
            continue
        if m.ranks:
            v = replace(v, message=v.message + rank_part(m, metric))
        if metric == "device" and m.devices:
            v = vram_verdict(v, m)
            if c.context == "base":
                v = replace(v, blocking=False)
        out.append(v)
    leaked = leak.verdict(m, c.points, c.context)
    if leaked is not None:
        out.append(leaked)
    if time_on and (c.points or m.pair_times_s):  # a pair needs no history
        t = timing.verdict(c, config)
        if t is not None:
            out.append(t)
    return out


def _renamed(
    store: Store, run: RunRecord, missing: list[str], points: dict[str, list[Point]]
) -> dict[str, tuple[str, str]]:
    """New case id -> (the vanished case it replaces, 'batch 16 -> 32'). A case with no
    baseline whose workload lost a case of the same param names in this run is that case
    with its params changed: the one differing in the fewest values, where one is nearest.
    A changed param renames a series; the growth it brings is still the change's."""
    new = [m for m in run.measurements if not points[m.case_id]]
    if not new or not missing:
        return {}
    gone = store.case_params(missing)
    out: dict[str, tuple[str, str]] = {}
    for m in new:
        differing = []
        taken = {old for old, _ in out.values()}
        for old, (workload, params) in gone.items():
            if workload != m.workload or set(params) != set(m.params) or old in taken:
                continue
            keys = [k for k in sorted(params) if params[k] != m.params[k]]
            differing.append((len(keys), old, keys))
        differing.sort()
        if not differing or (len(differing) > 1 and differing[0][0] == differing[1][0]):
            continue  # none, or no single nearest: said as new and removed
        _, old, keys = differing[0]
        params = gone[old][1]
        change = ", ".join(f"{k} {params[k]} -> {m.params[k]}" for k in keys)
        out[m.case_id] = (old, change)
    return out


def _removed_verdict(case_id: str, base_branch: str, context: str) -> Verdict:
    words = (
        f"a case of the newest baseline run on {base_branch} that this run does not hold "
        "(its series ends here; or it was left out with -k)"
    )
    return Verdict(
        case_id=case_id,
        workload=case_id.partition("[")[0],
        metric="status",
        kind="removed",
        blocking=False,
        context=context,
        message=f"removed: {words}",
        words=words,
    )


# -- the check -----------------------------------------------------------------------------


def find_candidate(
    store: Store, *, run_id: str | None = None, commit: str | None = None, root: Path
) -> RunRecord:
    """The run to check: by id, else the newest run of `commit`, else of HEAD at `root`."""
    if run_id:
        return store.get_run(run_id)
    if commit is None:
        commit = git_output(root, "rev-parse", "HEAD")
        if commit is None:
            raise ConfigError(
                f"{root} is not inside a git repository with a commit: "
                "pass --run ID or --commit SHA"
            )
        what = f"the current commit {commit[:12]}"
    else:
        what = f"commit {commit}"
    # A measured run is checked; an estimate run only where the commit has nothing else.
    ids = store.run_ids(commit=commit, limit=1, measured=True) or store.run_ids(
        commit=commit, limit=1
    )
    if not ids:
        raise StoreError(
            f"{store.path}: no run of {what}; record one with `memtrack run` "
            "first, or pass --run ID"
        )
    return store.get_run(ids[0])


def with_sibling_shards(store: Store, run: RunRecord) -> tuple[RunRecord, dict[str, str]]:
    """A run of one shard (i/n) joined by the newest run of each other shard of the same
    commit and environment, so that the whole suite is checked at once. Returns the joined
    run and, per case id, the run that holds its figures."""
    owners = {m.case_id: run.run_id for m in run.measurements}
    if not run.shard or "/" not in run.shard or not run.git.commit:
        return run, owners
    total = run.shard.split("/", 1)[1]
    rows = reads.shard_runs(store, run.git.commit, run.environment.fingerprint, total)
    seen, measurements = {run.shard}, list(run.measurements)
    for row in rows:
        if row["shard"] in seen:
            continue
        seen.add(row["shard"])
        for m in store.get_run(row["run_id"]).measurements:
            if m.case_id not in owners:
                owners[m.case_id] = row["run_id"]
                measurements.append(m)
    return replace(run, measurements=tuple(measurements)), owners


def context_of(run: RunRecord, base_branch: str) -> str:
    """'base' for a run of the base branch itself (a push), else 'pull_request'."""
    on_base = run.git.branch == base_branch and run.ci.pr_number is None
    return "base" if on_base and run.ci.event != "pull_request" else "pull_request"


def check_budget_targets(config: Config, known: set[str], *, strict: bool = True) -> list[str]:
    """A budget that names no known workload or case guards nothing: refuse it. Not
    `strict` (known: what the database recorded, where a partial run leaves workloads out):
    refuse only a name close to a known one (a typo), and note the others."""
    notes = []
    for i, b in enumerate(config.budgets):
        if b.workload in known:
            continue
        close = difflib.get_close_matches(b.workload, sorted(known), n=3)
        where = f"{config.path or 'config'}: budgets[{i}].workload: {b.workload!r}"
        if strict or close:
            hint = f"; nearest: {', '.join(close)}" if close else ""
            raise ConfigError(f"{where} names no known workload or case{hint}")
        notes.append(
            f"{where}: no measurement of it is recorded yet (a run that left it "
            "out with -k or --shard): its budget is not checked"
        )
    return notes


def _known_targets(store: Store, run: RunRecord, names: set[str]) -> set[str]:
    """The run's workloads and cases, and those of `names` that the store has recorded (a
    case id, or a workload: the prefix 'name[' of its case ids), each by an index lookup."""
    known = {x for m in run.measurements for x in (m.workload, m.case_id)}
    return known | {name for name in names - known if reads.ever_measured(store, name)}


@dataclass(frozen=True)
class _Setting:
    """What every case of one check is judged in."""

    config: Config
    run: RunRecord
    base: str
    context: str
    finder: BaselineFinder
    changes: list[BudgetChange]
    acceptances: list[accept.Acceptance]


def check(
    store: Store,
    config: Config,
    *,
    run_id: str | None = None,
    commit: str | None = None,
    base_branch: str | None = None,
    root: Path | None = None,
) -> CheckResult:
    """Judge a candidate run against its baseline and the config's budgets, in the history
    of the candidate's repository (found, by commit, in the working tree's)."""
    root = root or config.root
    scope = store.repository
    try:
        if scope == ALL_REPOSITORIES and not run_id:  # found by commit: in the working tree's
            store.repository = repository_identity(root, config.repository)
        with store.reading():  # one snapshot of the history
            run = find_candidate(store, run_id=run_id, commit=commit, root=root)
            store.repository = run.git.repository
            return _check(store, config, run, run_id, base_branch, root)
    finally:
        store.repository = scope


def _check(
    store: Store,
    config: Config,
    run: RunRecord,
    run_id: str | None,
    base_branch: str | None,
    root: Path,
) -> CheckResult:
    if not run.measurements:
        raise StoreError(f"run {run.run_id} has no measurements to check")
    base = base_branch or config.base_branch
    measured = tuple(m for m in run.measurements if m.kind == "measured")
    if not measured:
        return _estimate_run(store, config, run, base)
    run = replace(run, measurements=measured)
    owners = {m.case_id: run.run_id for m in run.measurements}
    if run_id is None:
        run, owners = with_sibling_shards(store, run)
    known = _known_targets(store, run, {b.workload for b in config.budgets})
    unchecked = check_budget_targets(config, known, strict=False)
    context = context_of(run, base)
    finder = BaselineFinder(store, run, base, root, config.baseline_runs, owners)
    notes = [*finder.notes, *unchecked, *_run_notes(run, base, context, owners)]
    changes, note = budget_changes(config, root, finder.merge_base or base)
    if note:
        notes.append(note)
    points, missing, renamed = _baselines(store, run, finder)
    acceptances, accept_notes = _acceptances(run, context, finder.merge_base, points, root)
    known = _known_targets(store, run, {a.target for a in acceptances}) | known
    notes += accept_notes + accept.unknown_targets(acceptances, known)
    setting = _Setting(config, run, base, context, finder, changes, acceptances)
    verdicts = _judge_cases(store, setting, points, renamed, notes)
    opened, open_notes = _still_open(store, finder, base, context, verdicts, acceptances)
    notes += open_notes
    verdicts.extend(quality.verdicts(run.measurements, context))
    verdicts += _gone(run, base, context, missing, renamed, notes)
    return CheckResult(
        case_runs=owners,
        **_about(run, base),
        merge_base=finder.merge_base,
        baseline_mode=finder.mode,
        verdicts=tuple(verdicts),
        budget_changes=tuple(changes),
        notes=tuple(notes),
        checked_at=now(),
        context=context,
        acceptances=tuple(acceptances),
        estimates=_estimates(store, run, finder.merge_base),
        open_regressions=tuple(opened),
    )


def _run_notes(run: RunRecord, base: str, context: str, owners: dict[str, str]) -> list[str]:
    """What the report says of the candidate itself: a base-branch run, joined shards, a
    dirty tree."""
    notes = []
    if context == "base":
        notes.append(
            f"a run of {base} itself, judged against the previous level: verdicts "
            "are reported and recorded, never blocking"
        )
    shard_runs = sorted(set(owners.values()) - {run.run_id})
    if shard_runs:
        notes.append(
            f"shard {run.shard} checked together with the newest run of each other "
            f"shard of this commit: {', '.join(r[:12] for r in shard_runs)}"
        )
    if run.git.dirty:
        notes.append("the candidate was measured with uncommitted changes (dirty tree)")
    return notes


def _baselines(
    store: Store, run: RunRecord, finder: BaselineFinder
) -> tuple[dict[str, list[Point]], list[str], dict[str, tuple[str, str]]]:
    """Each case's baseline points; the cases of the newest baseline run that this run
    lacks; and the cases renamed by a changed param (their points: the old case's)."""
    points = {
        m.case_id: finder.points(m.case_id) if finder.seen_anywhere(m.case_id) else []
        for m in run.measurements
    }
    newest = finder.newest_cases() or set()
    missing = sorted(newest - {m.case_id for m in run.measurements})
    renamed = _renamed(store, run, missing, points)
    for new_case, (old_case, _) in renamed.items():
        points[new_case] = finder.points(old_case)
    return points, missing, renamed


def _judge_cases(
    store: Store,
    s: _Setting,
    points: dict[str, list[Point]],
    renamed: dict[str, tuple[str, str]],
    notes: list[str],
) -> list[Verdict]:
    """Every case's verdicts, in the run's order; a budget on a figure not measured is a
    note."""
    env_cache: dict[str | None, Environment | None] = {}
    verdicts: list[Verdict] = []
    time_on = s.config.time_regression != "off"
    for m in s.run.measurements:
        c = _candidate(s, m, points[m.case_id])
        other = _other_env(store, s, m, c.points, env_cache)
        notes += _unmeasured_budgets(m, c)
        if m.case_id in renamed:
            old_case, change = renamed[m.case_id]
            judged = _judge_case(c, s.config, s.base, other, False)
            # where it grew, against the sites of the case it replaces
            judged = _around_the_code(store, s, m, c.points, judged, env_cache, notes, old_case)
            verdicts += [
                replace(
                    v,
                    compared_with=old_case,
                    param_change=change,
                    message=f"{change} (against {old_case}, the case it replaces): {v.message}",
                )
                for v in judged
            ]
            continue
        case_verdicts = _judge_case(c, s.config, s.base, other, time_on)
        verdicts.extend(_around_the_code(store, s, m, c.points, case_verdicts, env_cache, notes))
    return verdicts


GREW = ("regression", "over_budget", "time_regression", "leak")
"""The verdicts that say a figure grew: each names where it grew."""
EXPLAINED = (*GREW, "improvement", "noisy", "failed", "quality", "abstained")
"""The verdicts a change around the code (a package, the OS) could explain: each names it."""
TENSORS = ("allocated", "requested", "reserved", "device", "host", "host_step")
"""The metrics whose growth the sites at the peak (tensors) can place."""


def _around_the_code(
    store: Store,
    s: _Setting,
    m: Measurement,
    case_points: list[Point],
    verdicts: list[Verdict],
    env_cache: dict[str | None, Environment | None],
    notes: list[str],
    baseline_case: str | None = None,
) -> list[Verdict]:
    """Verdicts that say a figure grew, with where it grew at the peak against the newest
    baseline run ('where: +10.50 MiB in `lm_head` at serve.py:generate', for a figure of
    tensors); and every verdict such a change could explain (EXPLAINED) with what differs
    between that run's environment and the candidate's beyond the fingerprint (packages,
    Python's patch release, NCCL, the OS): 'numpy: 1.26.4 -> 2.1.0 between baseline and
    candidate', which a note of the run says too, whatever the verdicts."""
    if not case_points:
        return verdicts
    newest = case_points[0]
    if newest.env_id not in env_cache:
        env_cache[newest.env_id] = store.get_environment(newest.env_id) if newest.env_id else None
    old = env_cache[newest.env_id]
    diff = environment_diff(old, s.run.environment) if old else []
    said = f"{'; '.join(diff)} between baseline and candidate" if diff else None
    if said:
        # said once for the run, whatever its verdicts: a bump that changed nothing too
        note = f"{said} (the newest baseline run {newest.run_id[:12]})"
        if note not in notes:
            notes.append(note)
    if not any(v.kind in EXPLAINED for v in verdicts):
        return verdicts
    grew = any(v.kind in GREW for v in verdicts)
    base_sites = store.sites(newest.run_id, baseline_case or m.case_id) if m.sites and grew else ()
    place = where(base_sites, m.sites) if base_sites else None
    out = []
    for v in verdicts:
        if v.kind in GREW and place and v.metric in TENSORS:
            v = replace(
                v,
                message=f"{v.message}; where: {place.text()}",
                details=(*v.details, place.text()),
                where=place,
            )
        if v.kind in EXPLAINED and said:
            v = replace(v, message=f"{v.message} ({said})", details=(*v.details, said))
        out.append(v)
    return out


def _candidate(s: _Setting, m: Measurement, case_points: list[Point]) -> Candidate:
    config = s.config
    ok_runs = sum(p.status == "ok" for p in case_points)
    # A short window borrows what other environments' runs know of the case's noise.
    short = 0 < len(case_points) < 2 * config.min_baseline_runs
    return Candidate(
        m,
        case_points,
        budgets_for(config.budgets, m, s.run.environment),
        ok_runs < config.min_baseline_runs,
        [ch for ch in s.changes if ch.workload in (m.workload, m.case_id)],
        s.acceptances,
        s.context,
        known=s.finder.other_points(m.case_id) if short else [],
    )


def _other_env(
    store: Store,
    s: _Setting,
    m: Measurement,
    case_points: list[Point],
    env_cache: dict[str | None, Environment | None],
) -> tuple[Point, list[str]] | None:
    """A case without a baseline here: the newest run of it on another environment, and
    what differs between the two environments."""
    if case_points or not s.finder.seen_anywhere(m.case_id):
        return None
    p = s.finder.other_env(m.case_id)
    if p is None:
        return None
    if p.env_id not in env_cache:
        env_cache[p.env_id] = store.get_environment(p.env_id)
    old = env_cache[p.env_id]
    return p, environment_diff(old, s.run.environment) if old else []


def _unmeasured_budgets(m: Measurement, c: Candidate) -> list[str]:
    return [
        f"{m.case_id}: budget on {metric} ({format_size(b.limit_bytes)}) "
        f"not checked: {metric} was not measured on this run"
        for metric, b in c.budgets.items()
        if metrics.value(m, metric) is None and m.status == "ok"
    ]


def _gone(
    run: RunRecord,
    base: str,
    context: str,
    missing: list[str],
    renamed: dict[str, tuple[str, str]],
    notes: list[str],
) -> list[Verdict]:
    """The cases of the newest baseline run this run lacks (none renamed): `removed`, or
    in a shard's run, a note (another shard may hold them)."""
    replaced = {old for old, _ in renamed.values()}
    gone = [case for case in missing if case not in replaced]
    if run.shard and gone:
        shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
        notes.append(
            f"{len(gone)} case(s) of the newest baseline run are not in this shard's run "
            f"(another shard's, or removed), so not checked: {shown}"
        )
        return []
    return [_removed_verdict(case, base, context) for case in gone]


def _estimates(store: Store, run: RunRecord, merge_base: str | None) -> tuple[Estimate, ...]:
    """The estimates of the run's ok cases: of its commit, else of its merge-base (what
    the change branched from); never another branch's."""
    cases = [m.case_id for m in run.measurements]
    found: dict[str, dict[str, Any]] = {}
    for commit in dict.fromkeys(c for c in (run.git.commit, merge_base) if c):
        for case, made in store.latest_estimates(cases, commit).items():
            if made["git_commit"] == commit:  # else it is the newest one: of any commit
                found.setdefault(case, made)
    return tuple(
        Estimate(
            m.case_id,
            e["peak_allocated_bytes"],
            e["run_id"],
            e["git_commit"],
            measured_bytes=m.peak_allocated_bytes,
            candidate_commit=run.git.commit,
            scratch_bytes=e["scratch_bytes"],
            scratch_run_id=e["scratch_run_id"],
            candidate_run_id=run.run_id,
        )
        for m in run.measurements
        if (e := found.get(m.case_id)) and m.status == "ok"
    )


def _still_open(
    store: Store,
    finder: BaselineFinder,
    base: str,
    context: str,
    verdicts: list[Verdict],
    acceptances: list[accept.Acceptance],
) -> tuple[list[OpenRegression], list[str]]:
    """The base branch's open regressions on this run's cases, as this run leaves them
    (see `still_open`); each said to predate the branch where its commit is not in the
    candidate's history."""
    run = finder.run
    found = open_regressions(
        store,
        base,
        list(dict.fromkeys(m.case_id for m in run.measurements)),
        fingerprint=run.environment.fingerprint,
        until=run.started_at,
    )

    def in_history(o: OpenRegression) -> bool:
        return finder.in_history(o.commit, o.started_at)

    return still_open(found, run, base, context, verdicts, acceptances, in_history)


def still_open(
    found: list[OpenRegression],
    run: RunRecord,
    base: str,
    context: str,
    verdicts: list[Verdict],
    acceptances: list[accept.Acceptance],
    in_history: Callable[[OpenRegression], bool] | None = None,
) -> tuple[list[OpenRegression], list[str]]:
    """Of the base branch's regressions open on this run's cases (`found`), those this run
    leaves open, and notes. A run of the base branch back within a threshold fixes that
    regression (said in a note); an acceptance of this change that allows the regression's
    growth accepts it: the case's verdict on that metric (in `verdicts`, replaced there)
    becomes `accepted`, which closes it for later checks. Everything else stays open, in
    this check's report as in every later one. `in_history` says whether a regression's
    commit is in the candidate's history: a branch cut before it merged predates it, and
    being within its threshold fixes nothing there."""
    by_case = {m.case_id: m for m in run.measurements}
    index = {(v.case_id, v.metric): i for i, v in enumerate(verdicts)}
    still, notes = [], []
    for o in found:
        m = by_case[o.case_id]
        value = metrics.value(m, o.metric) if m.status == "ok" else None
        a = accept.find(
            acceptances, accept.Growth(m.workload, o.case_id, o.metric, o.delta or 0.0, o.delta_pct)
        )
        i = index.get((o.case_id, o.metric))
        if (
            a is not None
            and a.allows(o.delta or 0.0, o.delta_pct)
            and i is not None
            and verdicts[i].kind in ("ok", "noisy", "improvement")
        ):
            v = verdicts[i]
            verdicts[i] = replace(
                v,
                kind="accepted",
                blocking=False,
                accepted_reason=a.reason,
                accepted_commit=a.commit,
                message=f"{v.message}; accepted: the regression on {base} {o.describe()} is "
                f"within the {a.amount()} accepted in commit {a.commit[:12]}: "
                f"{a.reason}",
            )
            continue
        fixed = value is not None and value <= o.threshold
        if fixed and context == "base":
            notes.append(
                f"{o.case_id}: {o.metric} is back within the threshold of the "
                f"regression {o.describe()}: fixed by this run"
            )
            continue
        if in_history is not None and not in_history(o):
            still.append(replace(o, predates=True))
            continue
        still.append(replace(o, fixed_here=fixed))
    return still, notes


def _about(run: RunRecord, base: str) -> dict[str, Any]:
    """The fields of a check's result that name the run checked and its base branch."""
    return dict(
        run_id=run.run_id,
        commit=run.git.commit,
        branch=run.git.branch,
        started_at=run.started_at,
        fingerprint=run.environment.fingerprint,
        base_branch=base,
    )


def _estimate_run(store: Store, config: Config, run: RunRecord, base: str) -> CheckResult:
    """An estimate run judged: not at all. Its figures against the budgets, as information."""
    estimates = []
    failed = []
    for m in run.measurements:
        if m.status != "ok" or m.peak_allocated_bytes is None:
            failed.append(f"{m.case_id}: {m.status} ({m.message or 'no message'})")
            continue
        budgets = budgets_for(config.budgets, m, run.environment)
        metric = "allocated" if "allocated" in budgets else next(iter(sorted(budgets)), None)
        b = budgets.get(metric) if metric else None
        estimates.append(
            Estimate(
                m.case_id,
                m.peak_allocated_bytes,
                run.run_id,
                run.git.commit,
                budget_bytes=b.limit_bytes if b else None,
                scratch_bytes=m.scratch_bytes,
                scratch_run_id=m.scratch_run_id,
                budget_metric=metric if b else None,
            )
        )
    notes = [
        f"run {run.run_id[:12]} is an estimate run (`memtrack estimate`, fake tensors): "
        "nothing was measured, so nothing is judged and nothing blocks; its figures are "
        "shown against the budgets as information. Measure with `memtrack run`."
    ]
    notes += [f"estimate not made: {line}" for line in failed]
    return CheckResult(
        **_about(run, base),
        merge_base=run.git.merge_base,
        baseline_mode="none",
        verdicts=(),
        notes=tuple(notes),
        checked_at=now(),
        context=context_of(run, base),
        estimates=tuple(estimates),
        estimate_only=True,
        case_runs={m.case_id: run.run_id for m in run.measurements},
    )


def _acceptances(
    run: RunRecord, context: str, merge_base: str | None, points: dict[str, list[Point]], root: Path
) -> tuple[list[accept.Acceptance], list[str]]:
    """The acceptances in the commits this run adds to its baseline: a pull request's own
    commits (merge-base..head), or on the base branch those since its previous run."""
    if context == "base":
        newest = max(
            (p for ps in points.values() for p in ps[:1] if p.commit),
            key=lambda p: p.started_at,
            default=None,
        )
        since = newest.commit if newest else None
        if since == run.git.commit:
            return [], []
    else:
        since = merge_base
    if since is None:
        return [], []
    return accept.read(root, since, run.git.commit)


__all__ = [
    "CheckResult",
    "Estimate",
    "check",
    "check_budget_targets",
    "context_of",
    "environment_diff",
    "find_candidate",
    "still_open",
    "with_sibling_shards",
]
