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
from memtrack.judge.gather import commit, git
from memtrack.judge.gather.baseline import BaselineFinder, open_regressions
from memtrack.judge.gather.commit import Evidence
from memtrack.machine.provenance import git_output, repository_identity
from memtrack.records import (
    Environment,
    Measurement,
    RunRecord,
    environment_diff,
    now,
    test_file,
)
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
            return _gather(store, config, run, base_branch or config.base_branch, root)
    finally:
        store.repository = scope


def context_of(run: RunRecord, base_branch: str) -> str:
    """'base' for a run of the base branch itself (a push), else 'pull_request'."""
    on_base = run.git.branch == base_branch and run.ci.pr_number is None
    return "base" if on_base and run.ci.event != "pull_request" else "pull_request"


def _gather(store: Store, config: Config, run: RunRecord, base: str, root: Path) -> CheckInput:
    if not run.measurements:
        raise StoreError(f"run {run.run_id} has no measurements to check")
    measured = tuple(m for m in run.measurements if m.kind == "measured")
    if not measured:
        return _estimate_run(config, run, base)
    evidence = commit.of_commit(store, replace(run, measurements=measured))
    run = evidence.run
    known = known_targets(store, run, {b.workload for b in config.budgets})
    notes = budgets.check_budget_targets(config, known, strict=False)
    context = context_of(run, base)
    runs = [r.run_id for r in evidence.runs]
    finder = BaselineFinder(store, run, base, root, config.baseline_runs, exclude=runs)
    notes = [*finder.notes, *notes, *_run_notes(run, base, context), *evidence.notes]
    changes, note = git.budget_changes(config, root, finder.merge_base or base)
    notes += [note] if note else []
    ids = recorded_ids(store, run)
    # the cases some other run measured (anywhere): the others have no baseline to look for
    elsewhere = finder.seen_anywhere(x for i in ids.values() for x in i)
    seen = {c for c, i in ids.items() if any(x in elsewhere for x in i)}
    base_evidence = finder.base_evidence()
    points, removed, not_measured, renamed = _baselines(
        store, finder, evidence, {c: ids[c] for c in seen}, ids, base_evidence.runs
    )
    since = base_evidence.commit if context == "base" else finder.merge_base
    acceptances, accept_notes = _acceptances(run, since, root)
    known |= known_targets(store, run, {a.target for a in acceptances})
    notes += accept_notes + accept.unknown_targets(acceptances, known)
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
        cases=tuple(_cases(store, config, finder, points, renamed, evidence, ids, seen)),
        checked_at=now(),
        notes=tuple(notes),
        removed=tuple(removed),
        not_measured=tuple(not_measured),
        budget_changes=tuple(changes),
        acceptances=tuple(acceptances),
        open_found=tuple((o, finder.in_history(o.commit, o.started_at)) for o in found),
        estimates=_estimates(store, run, finder.merge_base),
        case_runs=evidence.owners,
        runs=tuple(runs),
        environment=run.environment,
        changed_lines=git.changed_lines(root, finder.merge_base, run.git.commit)
        if context == "pull_request"
        else {},
    )


def recorded_ids(store: Store, run: RunRecord) -> dict[str, tuple[str, ...]]:
    """Each case of the run, and the ids it was recorded under before: a test recorded from
    another rootdir ('repo/tests/x.py::t' for 'tests/x.py::t', or 'x.py::t')."""
    out: dict[str, tuple[str, ...]] = {m.case_id: (m.case_id,) for m in run.measurements}
    tests = [c for c in out if test_file(c)]
    if not tests:
        return out
    by_name: dict[str, list[str]] = {}
    for stored in store.case_ids():
        if test_file(stored):
            by_name.setdefault(stored.partition("::")[2], []).append(stored)
    for c in tests:
        same = by_name.get(c.partition("::")[2], [])
        also = [s for s in same if s != c and (s.endswith("/" + c) or c.endswith("/" + s))]
        out[c] = (c, *also)
    return out


def known_targets(store: Store, run: RunRecord, names: set[str]) -> set[str]:
    """The run's workloads and cases, and those of `names` that the store has recorded (a
    case id, or a workload: the prefix 'name[' of its case ids), each by an index lookup."""
    known = {x for m in run.measurements for x in (m.workload, m.case_id)}
    return known | {name for name in names - known if reads.ever_measured(store, name)}


def _run_notes(run: RunRecord, base: str, context: str) -> list[str]:
    """What the report says of the candidate itself: a base-branch run, a dirty tree."""
    notes = []
    if context == "base":
        notes.append(
            f"a run of {base} itself, judged against the previous level: verdicts "
            "are reported and recorded, never blocking"
        )
    if run.git.dirty:
        notes.append("the candidate was measured with uncommitted changes (dirty tree)")
    return notes


def _baselines(
    store: Store,
    finder: BaselineFinder,
    evidence: Evidence,
    seen: dict[str, tuple[str, ...]],
    ids: dict[str, tuple[str, ...]],
    base_runs: tuple[RunRecord, ...],
) -> tuple[dict[str, list[Point]], list[str], list[str], dict[str, tuple[str, str]]]:
    """Each case's baseline points (of `seen`, the cases another run measured, by the ids
    they were recorded under); the cases the base branch's evidence held that the
    candidate's no longer does (removed), and those it did not measure (not measured here);
    and the cases renamed by a changed param (their points: the old case's)."""
    run = evidence.run
    points: dict[str, list[Point]] = {c: [] for c in ids}
    points.update(finder.points(seen))
    removed, not_measured = gone(base_runs, evidence, ids)
    renamed = _renamed(store, run, removed, points)
    if renamed:
        old = finder.points({new: (was,) for new, (was, _) in renamed.items()})
        points.update(old)
    replaced = {was for was, _ in renamed.values()}
    return points, [c for c in removed if c not in replaced], not_measured, renamed


def gone(
    base_runs: tuple[RunRecord, ...], evidence: Evidence, ids: dict[str, tuple[str, ...]]
) -> tuple[list[str], list[str]]:
    """The base branch's cases the candidate lacks: removed, where the same kind of run
    measured the whole of what held them (the suite, unselected, or all its shards; a test
    file, in a run of no selection); else not measured here."""
    alias = {x: c for c, xs in ids.items() for x in xs}
    held = set(ids)
    was = {alias.get(m.case_id, m.case_id) for r in base_runs for m in r.measurements}
    lacking = sorted(was - held)
    suites = [r for r in evidence.runs if any(not test_file(m.case_id) for m in r.measurements)]
    whole = any(not r.selection and not r.shard for r in suites) or _every_shard(suites)
    files = {
        test_file(m.case_id)
        for r in evidence.runs
        if not r.selection
        for m in r.measurements
        if test_file(m.case_id)
    }
    removed = [c for c in lacking if (test_file(c) in files if test_file(c) else whole and suites)]
    return removed, [c for c in lacking if c not in removed]


def _every_shard(runs: list[RunRecord]) -> bool:
    """Runs that are every shard i/n of one n, unselected."""
    shards = {r.shard for r in runs if r.shard and not r.selection}
    totals = {s.split("/")[1] for s in shards}
    return len(totals) == 1 and len(shards) == int(next(iter(totals)))


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
    evidence: Evidence,
    ids: dict[str, tuple[str, ...]],
    seen: set[str],
) -> list[CaseEvidence]:
    """Each case's evidence, with what differs around the code between its newest baseline
    run and the candidate (`seen`: the cases another run measured)."""
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
        if not case_points and m.case_id in seen:
            found = finder.points({m.case_id: ids[m.case_id]}, same_env=False, limit=1)
            other = next(iter(found[m.case_id]), None)
        other_env = env(other.env_id) if other else None
        around: tuple[str, ...] = ()
        sites: tuple = ()
        if case_points:
            newest = case_points[0]
            old = env(newest.env_id)
            around = tuple(environment_diff(old, run.environment)) if old else ()
            if m.sites:
                sites = store.sites(newest.run_id, old_case or newest.case_id or m.case_id)
        known = finder.points({m.case_id: ids[m.case_id]}, same_env=False) if short else {}
        out.append(
            CaseEvidence(
                m=m,
                points=tuple(case_points),
                known=tuple(known.get(m.case_id, ())),
                seen=m.case_id in seen,
                other_env=other,
                other_env_diff=tuple(environment_diff(other_env, run.environment))
                if other_env
                else (),
                around=around,
                base_sites=sites,
                renamed_from=old_case,
                param_change=change,
                values=evidence.values.get(m.case_id, {}),
            )
        )
    return out


def _estimates(store: Store, run: RunRecord, merge_base: str | None) -> tuple[Estimate, ...]:
    """The estimates of the run's ok cases: of its commit, else of its merge-base (what
    the change branched from); never another branch's."""
    cases = [m.case_id for m in run.measurements]
    found: dict[str, dict[str, Any]] = {}
    for sha in dict.fromkeys(c for c in (run.git.commit, merge_base) if c):
        for case, made in store.latest_estimates(cases, sha, exact=True).items():
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
    run: RunRecord, since: str | None, root: Path
) -> tuple[list[accept.Acceptance], list[str]]:
    """The acceptances in the commits this run adds to its baseline: a pull request's own
    commits (merge-base..head), or on the base branch those since its newest baseline
    commit (`since`)."""
    if since is None or since == run.git.commit:
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


__all__ = ["context_of", "find_candidate", "gather", "gone", "known_targets", "recorded_ids"]
