"""Gather one check: the candidate's evidence and everything its verdicts are decided on,
read from the store and git once, into a frozen memtrack.judge.evidence.CheckInput."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.errors import ConfigError, StoreError
from memtrack.judge import accept, budgets
from memtrack.judge.evidence import CaseEvidence, CheckInput, Estimate, Point
from memtrack.judge.gather import git
from memtrack.judge.gather.baseline import BaselineFinder, open_regressions
from memtrack.machine.provenance import git_output, repository_identity
from memtrack.records import Environment, Measurement, RunRecord, environment_diff, now
from memtrack.store import judging as reads
from memtrack.store.database import ALL_REPOSITORIES, Store


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


def gather(
    store: Store,
    config: Config,
    *,
    run_id: str | None = None,
    commit: str | None = None,
    base_branch: str | None = None,
    root: Path | None = None,
) -> CheckInput:
    """Everything a check of the candidate decides on, in the history of the candidate's
    repository (found, by commit, in the working tree's), read in one snapshot."""
    root = root or config.root
    scope = store.repository
    try:
        if scope == ALL_REPOSITORIES and not run_id:  # found by commit: in the working tree's
            store.repository = repository_identity(root, config.repository)
        with store.reading():  # one snapshot of the history
            run = find_candidate(store, run_id=run_id, commit=commit, root=root)
            store.repository = run.git.repository
            return _gather(store, config, run, run_id, base_branch or config.base_branch, root)
    finally:
        store.repository = scope


def context_of(run: RunRecord, base_branch: str) -> str:
    """'base' for a run of the base branch itself (a push), else 'pull_request'."""
    on_base = run.git.branch == base_branch and run.ci.pr_number is None
    return "base" if on_base and run.ci.event != "pull_request" else "pull_request"


def _gather(
    store: Store, config: Config, run: RunRecord, run_id: str | None, base: str, root: Path
) -> CheckInput:
    if not run.measurements:
        raise StoreError(f"run {run.run_id} has no measurements to check")
    measured = tuple(m for m in run.measurements if m.kind == "measured")
    if not measured:
        return _estimate_run(config, run, base)
    run = replace(run, measurements=measured)
    owners = {m.case_id: run.run_id for m in run.measurements}
    if run_id is None:
        run, owners = with_sibling_shards(store, run)
    known = known_targets(store, run, {b.workload for b in config.budgets})
    notes = budgets.check_budget_targets(config, known, strict=False)
    context = context_of(run, base)
    finder = BaselineFinder(store, run, base, root, config.baseline_runs, owners)
    notes = [*finder.notes, *notes, *_run_notes(run, base, context, owners)]
    changes, note = git.budget_changes(config, root, finder.merge_base or base)
    notes += [note] if note else []
    points, missing, renamed = _baselines(store, run, finder)
    acceptances, accept_notes = _acceptances(run, context, finder.merge_base, points, root)
    known |= known_targets(store, run, {a.target for a in acceptances})
    notes += accept_notes + accept.unknown_targets(acceptances, known)
    cases = _cases(store, config, finder, points, renamed)
    found = open_regressions(
        store,
        base,
        list(dict.fromkeys(m.case_id for m in run.measurements)),
        fingerprint=run.environment.fingerprint,
        until=run.started_at,
    )
    return CheckInput(
        run=run,
        base_branch=base,
        context=context,
        merge_base=finder.merge_base,
        baseline_mode=finder.mode,
        cases=tuple(cases),
        checked_at=now(),
        notes=tuple(notes),
        removed=() if run.shard else tuple(missing),
        not_measured=tuple(missing) if run.shard else (),
        budget_changes=tuple(changes),
        acceptances=tuple(acceptances),
        open_found=tuple((o, finder.in_history(o.commit, o.started_at)) for o in found),
        estimates=_estimates(store, run, finder.merge_base),
        case_runs=owners,
        environment=run.environment,
    )


def known_targets(store: Store, run: RunRecord, names: set[str]) -> set[str]:
    """The run's workloads and cases, and those of `names` that the store has recorded (a
    case id, or a workload: the prefix 'name[' of its case ids), each by an index lookup."""
    known = {x for m in run.measurements for x in (m.workload, m.case_id)}
    return known | {name for name in names - known if reads.ever_measured(store, name)}


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
    replaced = {old for old, _ in renamed.values()}
    return points, [c for c in missing if c not in replaced], renamed


def _renamed(
    store: Store, run: RunRecord, missing: list[str], points: dict[str, list[Point]]
) -> dict[str, tuple[str, str]]:
    """New case id -> (the vanished case it replaces, 'batch 16 -> 32'). A case with no
    baseline whose workload lost a case of the same param names in this run is that case
    with its params changed: the one differing in the fewest values, where one is nearest."""
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
        out[m.case_id] = (old, ", ".join(f"{k} {params[k]} -> {m.params[k]}" for k in keys))
    return out


def _cases(
    store: Store,
    config: Config,
    finder: BaselineFinder,
    points: dict[str, list[Point]],
    renamed: dict[str, tuple[str, str]],
) -> list[CaseEvidence]:
    """Each case's evidence, with what differs around the code between its newest baseline
    run and the candidate."""
    run = finder.run
    envs: dict[str | None, Environment | None] = {}

    def env(env_id: str | None) -> Environment | None:
        if env_id not in envs:
            envs[env_id] = store.get_environment(env_id) if env_id else None
        return envs[env_id]

    out = []
    for m in run.measurements:
        case_points = points[m.case_id]
        old_case, change = renamed.get(m.case_id, (None, None))
        short = 0 < len(case_points) < 2 * config.min_baseline_runs
        other = None
        if not case_points and finder.seen_anywhere(m.case_id):
            other = finder.other_env(m.case_id)
        other_env = env(other.env_id) if other else None
        around: tuple[str, ...] = ()
        sites: tuple = ()
        if case_points:
            newest = case_points[0]
            old = env(newest.env_id)
            around = tuple(environment_diff(old, run.environment)) if old else ()
            if m.sites:
                sites = store.sites(newest.run_id, old_case or m.case_id)
        out.append(
            CaseEvidence(
                m=m,
                points=tuple(case_points),
                known=tuple(finder.other_points(m.case_id)) if short else (),
                seen=finder.seen_anywhere(m.case_id),
                other_env=other,
                other_env_diff=tuple(environment_diff(other_env, run.environment))
                if other_env
                else (),
                around=around,
                base_sites=sites,
                renamed_from=old_case,
                param_change=change,
            )
        )
    return out


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
    return git.acceptances(root, since, run.git.commit)


def _estimate_run(config: Config, run: RunRecord, base: str) -> CheckInput:
    """An estimate run: nothing is judged. Its figures against the budgets, as information."""
    estimates, failed = [], []
    for m in run.measurements:
        if m.status != "ok" or m.peak_allocated_bytes is None:
            failed.append(f"{m.case_id}: {m.status} ({m.message or 'no message'})")
            continue
        chosen = budgets.budgets_for(config.budgets, m, run.environment)
        metric = "allocated" if "allocated" in chosen else next(iter(sorted(chosen)), None)
        b = chosen.get(metric) if metric else None
        estimates.append(_estimate_of(run, m, b.limit_bytes if b else None, metric if b else None))
    notes = [
        f"run {run.run_id[:12]} is an estimate run (`memtrack estimate`, fake tensors): "
        "nothing was measured, so nothing is judged and nothing blocks; its figures are "
        "shown against the budgets as information. Measure with `memtrack run`."
    ]
    notes += [f"estimate not made: {line}" for line in failed]
    return CheckInput(
        run=run,
        base_branch=base,
        context=context_of(run, base),
        merge_base=run.git.merge_base,
        baseline_mode="none",
        cases=(),
        checked_at=now(),
        notes=tuple(notes),
        estimates=tuple(estimates),
        estimate_only=True,
        case_runs={m.case_id: run.run_id for m in run.measurements},
    )


def _estimate_of(run: RunRecord, m: Measurement, limit: int | None, metric: str | None) -> Estimate:
    assert m.peak_allocated_bytes is not None
    return Estimate(
        m.case_id,
        m.peak_allocated_bytes,
        run.run_id,
        run.git.commit,
        budget_bytes=limit,
        scratch_bytes=m.scratch_bytes,
        scratch_run_id=m.scratch_run_id,
        budget_metric=metric,
    )


__all__ = [
    "context_of",
    "find_candidate",
    "gather",
    "known_targets",
    "with_sibling_shards",
]
