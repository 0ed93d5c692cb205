"""Deciding a check: the gathered evidence (memtrack.judge.evidence.CheckInput) and the config
in, the verdicts out. Pure: no store, no git, no clock.

Each case of the candidate: a case that did not finish is `failed`; else each gated memory
figure against its level (judge.memory) or, with no baseline on this environment, `new` or
`environment_changed`, budgets holding either way; a leak (judge.leak); its time
(judge.timing). A verdict that says a figure grew names where it grew at the peak, and one
that a change around the code could explain names what changed. Then the base branch's
open regressions on these cases, the quality of each output, and the cases the candidate no
longer holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from memtrack.config import Config
from memtrack.judge import accept, leak, memory, quality, timing
from memtrack.judge.budgets import budget_use, budgets_for, rank_peak, vram_verdict
from memtrack.judge.evidence import CaseEvidence, CheckInput, Estimate
from memtrack.judge.memory import Candidate
from memtrack.judge.verdict import (
    Accepted,
    BudgetChange,
    Failure,
    OpenRegression,
    Removed,
    Rename,
    Unbased,
    Verdict,
)
from memtrack.judge.where import Where, kept, where
from memtrack.records import Measurement, metrics, own_process
from memtrack.units import format_size

GREW = ("regression", "over_budget", "time_regression", "leak")
"""The verdicts that say a figure grew: each names where it grew."""
EXPLAINED = (*GREW, "improvement", "noisy", "failed", "quality", "abstained")
"""The verdicts a change around the code (a package, the OS) could explain: each names it."""
TENSORS = ("allocated", "requested", "reserved", "device", "host", "host_step")
"""The metrics whose growth the sites at the peak (tensors) can place."""


@dataclass(frozen=True)
class CheckResult:
    """Everything `memtrack check` decided about one candidate."""

    run_id: str
    commit: str | None
    branch: str | None
    started_at: str
    fingerprint: str
    base_branch: str
    merge_base: str | None
    baseline_mode: str
    """'ancestry' (commits at or before the merge-base), 'time' (the merge-base could not
    be used, e.g. a shallow clone: base-branch commits no newer than a reference time), or
    'none' (an estimate run)."""
    verdicts: tuple[Verdict, ...]
    budget_changes: tuple[BudgetChange, ...] = ()
    notes: tuple[str, ...] = ()
    checked_at: str = ""
    case_runs: dict[str, str] = field(default_factory=dict)
    """Case id -> the run holding its figures, where runs of one commit were joined;
    verdicts are recorded against that run."""
    context: str = "pull_request"
    """'pull_request', or 'base' for a run of the base branch (never blocking)."""
    acceptances: tuple[accept.Acceptance, ...] = ()
    """The reviewed acceptances found in the commits this run adds."""
    estimates: tuple[Estimate, ...] = ()
    """Estimates of the candidate's cases (the same commit's, else the merge-base's)."""
    estimate_only: bool = False
    """The candidate is an estimate run: nothing was measured, nothing is judged."""
    open_regressions: tuple[OpenRegression, ...] = ()
    """Regressions of the base branch still open (not fixed or accepted), whatever their
    age, on the candidate's cases and environment: reported by every check, never
    blocking."""
    changed_lines: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The lines the candidate changes against its merge-base, by file: where an
    annotation points among a growth's frames."""

    @property
    def blocking(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.blocking)

    @property
    def exit_code(self) -> int:
        """0 when nothing blocks, 1 when something does."""
        return 1 if self.blocking else 0


def decide(inp: CheckInput, config: Config) -> CheckResult:
    """The verdicts of a check, from what was gathered."""
    run = inp.run
    about: dict[str, Any] = dict(
        run_id=run.run_id,
        commit=run.git.commit,
        branch=run.git.branch,
        started_at=run.started_at,
        fingerprint=run.environment.fingerprint,
        base_branch=inp.base_branch,
        merge_base=inp.merge_base,
        baseline_mode=inp.baseline_mode,
        checked_at=inp.checked_at,
        case_runs=dict(inp.case_runs),
        context=inp.context,
        estimates=inp.estimates,
        changed_lines=inp.changed_lines,
    )
    if inp.estimate_only:
        return CheckResult(verdicts=(), notes=inp.notes, estimate_only=True, **about)
    notes = list(inp.notes)
    opens = [o for o, _ in inp.open_found]
    verdicts: list[Verdict] = []
    for case in inp.cases:
        notes += _case_notes(case, inp, config)
        verdicts += judge_case(case, inp, config, opens)
    still, more = still_open(inp, verdicts)
    notes += more
    verdicts += quality.verdicts(run.measurements, inp.context)
    verdicts += [_removed(case, inp) for case in inp.removed]
    if inp.not_measured:
        notes.append(_not_measured(inp.not_measured, inp.base_branch))
    return CheckResult(
        verdicts=tuple(verdicts),
        budget_changes=inp.budget_changes,
        notes=tuple(notes),
        acceptances=tuple(inp.acceptances),
        open_regressions=tuple(still),
        **about,
    )


def _case_notes(case: CaseEvidence, inp: CheckInput, config: Config) -> list[str]:
    """A budget on a figure this run did not measure; what differs around the code between
    the newest baseline run and the candidate (said whatever the verdicts)."""
    m = case.m
    chosen = budgets_for(config.budgets, m, inp.run.environment)
    notes = [
        f"{m.case_id}: budget on {metric} ({format_size(b.limit_bytes)}) "
        f"not checked: {metric} was not measured on this run"
        for metric, b in chosen.items()
        if metrics.value(m, metric) is None and m.status == "ok"
    ]
    if case.around and case.points:
        notes.append(
            f"{'; '.join(case.around)} between baseline and candidate (the newest baseline "
            f"run {case.points[0].run_id[:12]})"
        )
    return notes


def judge_case(
    case: CaseEvidence, inp: CheckInput, config: Config, opens: Sequence[OpenRegression] = ()
) -> list[Verdict]:
    """One case's verdicts, in order: its status or each figure, a leak, its time."""
    m = case.m
    c = Candidate(
        m,
        case.points,
        budgets_for(config.budgets, m, inp.run.environment),
        [ch for ch in inp.budget_changes if ch.workload in (m.workload, m.case_id)],
        inp.acceptances,
        inp.context,
        known=case.known,
        values=case.values,
    )
    if m.status != "ok":
        out = [failed(c)]
    else:
        out = [
            v
            for metric in metrics.GATED
            if (v := _figure(c, case, metric, inp, config, opens)) is not None
        ]
        leaked = leak.verdict(m, c.points, c.context)
        out += [leaked] if leaked is not None else []
        time_on = config.time_regression != "off" and case.renamed_from is None
        if time_on and (c.points or m.pair_times_s):  # a pair needs no history
            t = timing.verdict(c, config)
            out += [t] if t is not None else []
    return around_the_code(case, out)


def _figure(
    c: Candidate,
    case: CaseEvidence,
    metric: str,
    inp: CheckInput,
    config: Config,
    opens: Sequence[OpenRegression],
) -> Verdict | None:
    """One gated figure: against its level, else unbased; its rank, its VRAM fit, and an
    open regression of the base branch it accepts."""
    m = c.m
    if any(p.status == "ok" and metric in p.values for p in c.points):
        v = memory.verdict(c, metric, config)
    else:  # no run of the base branch measured it (none at all, or all failed): new
        v = unbased(c, case, metric, inp.base_branch)
    if v is None:
        return None
    if m.ranks:
        v = replace(v, rank=rank_peak(m, metric))
    if metric == "device" and m.devices:
        v = vram_verdict(v, m)
    return accepts_open(v, m, [o for o in opens if o.case_id == m.case_id], c.acceptances)


def unbased(c: Candidate, case: CaseEvidence, metric: str, base_branch: str) -> Verdict | None:
    """No baseline on this environment: 'new' or 'environment changed'; budgets still hold."""
    m = c.m
    value = c.value(metric)
    if value is None:
        return None
    budget = budget_use(m, metric, c.budgets.get(metric))
    over = budget is not None and budget.over(value)
    failed_runs = sorted({p.status for p in c.points if p.status != "ok"})
    other = case.other_env
    why = Unbased(
        base_branch,
        failed=tuple(failed_runs),
        runs=len(c.points),
        other_run=other.run_id if other else None,
        other_commit=other.commit if other else None,
        environment=case.other_env_diff,
    )
    kind = "environment_changed" if other is not None else "new"
    return Verdict(
        case_id=m.case_id,
        workload=m.workload,
        metric=metric,
        kind="over_budget" if over else kind,
        blocking=over and c.context != "base",
        context=c.context,
        why=why,
        candidate_value=float(value),
        budget=budget,
        changes=memory.changes_for(c, metric),
    )


def failed(c: Candidate) -> Verdict:
    """A case that did not finish: it blocks, but where the newest baseline run failed too."""
    m = c.m
    passed = sum(p.status == "ok" for p in c.points)
    newest = c.points[0].status if c.points else None
    lines = (m.message or "").strip().splitlines()
    why = Failure(m.status, lines[-1][:160] if lines else None, len(c.points), passed, newest)
    return Verdict(
        case_id=m.case_id,
        workload=m.workload,
        metric="status",
        kind="failed",
        blocking=not why.known and c.context != "base",
        context=c.context,
        why=why,
        baseline_runs=len(c.points),
    )


def around_the_code(case: CaseEvidence, verdicts: list[Verdict]) -> list[Verdict]:
    """Verdicts that say a tensor figure grew, with where it grew at the peak against the
    newest baseline run; every verdict a change around the code could explain, with what
    changed; a renamed case's, with the case it replaces."""
    place = processes = None
    leaked = kept(case.m.sites) if any(v.kind == "leak" for v in verdicts) else None
    if case.base_sites and any(v.kind in GREW for v in verdicts):
        place = where(case.base_sites, case.m.sites)
        processes = where(case.base_sites, case.m.sites, "process")
    around = "; ".join(case.around) or None
    rename = Rename(case.renamed_from, case.param_change or "") if case.renamed_from else None
    out = []
    for v in verdicts:
        out.append(
            replace(
                v,
                where=_where(v, place, processes, leaked),
                around=around if v.kind in EXPLAINED else None,
                rename=rename,
            )
        )
    return out


def _where(
    v: Verdict, place: Where | None, processes: Where | None, leaked: Where | None
) -> Where | None:
    """Where a figure that grew grew: a tensor or host figure at its peak's sites, the
    process tree's by its processes, where another than the case's own grew (else as the
    case's own host figure)."""
    if v.kind not in GREW:
        return None
    if v.kind == "leak":
        return leaked
    if v.metric == "host_tree" and processes is not None:
        if any(not own_process(c.key) for c in processes.named):
            return processes
        return place
    return place if v.metric in TENSORS else None


def accepts_open(
    v: Verdict,
    m: Measurement,
    opens: Sequence[OpenRegression],
    acceptances: Sequence[accept.Acceptance],
) -> Verdict:
    """A figure at a regression of the base branch still open that an acceptance of this
    change allows: `accepted`, which closes it for later checks."""
    if v.kind not in ("ok", "noisy", "improvement"):
        return v
    for o in opens:
        if o.metric != v.metric:
            continue
        growth = accept.Growth(m.workload, o.case_id, o.metric, o.delta or 0.0, o.delta_pct)
        a = accept.find(acceptances, growth)
        if a is not None and a.allows(o.delta or 0.0, o.delta_pct):
            return replace(
                v,
                kind="accepted",
                blocking=False,
                acceptance=Accepted(a.reason, a.commit, a.amount(), True),
                closes=o,
            )
    return v


def still_open(
    inp: CheckInput, verdicts: Sequence[Verdict]
) -> tuple[list[OpenRegression], list[str]]:
    """Of the base branch's regressions open on this run's cases, those this run leaves
    open, and notes. A run of the base branch back within a threshold fixes that regression
    (said in a note); one a verdict of this check accepted is closed; everything else stays
    open, in this check's report as in every later one. A regression whose commit is not in
    the candidate's history predates the branch: being within it fixes nothing there."""
    by_case = {m.case_id: m for m in inp.run.measurements}
    values = {case.m.case_id: case.values for case in inp.cases}
    closed = {v.closes.key for v in verdicts if v.closes is not None}
    still, notes = [], []
    for o, in_history in inp.open_found:
        if o.key in closed:
            continue
        m = by_case[o.case_id]
        value = values.get(o.case_id, {}).get(o.metric, metrics.value(m, o.metric))
        value = value if m.status == "ok" else None
        fixed = value is not None and value <= o.threshold
        if fixed and inp.context == "base":
            notes.append(
                f"{o.case_id}: {o.metric} is back within the threshold of the "
                f"regression {o.describe()}: fixed by this run"
            )
            continue
        still.append(replace(o, predates=True) if not in_history else replace(o, fixed_here=fixed))
    return still, notes


def _removed(case_id: str, inp: CheckInput) -> Verdict:
    return Verdict(
        case_id=case_id,
        workload=case_id.partition("[")[0],
        metric="status",
        kind="removed",
        blocking=False,
        context=inp.context,
        why=Removed(inp.base_branch),
    )


def _not_measured(cases: Iterable[str], base_branch: str) -> str:
    gone = list(cases)
    shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
    return (
        f"{len(gone)} case(s) of {base_branch}'s runs are not in this commit's runs (left out "
        "by a selection or a shard, or the other kind of run's): not measured here, so not "
        f"checked: {shown}"
    )


__all__ = [
    "EXPLAINED",
    "GREW",
    "TENSORS",
    "CheckResult",
    "accepts_open",
    "around_the_code",
    "decide",
    "failed",
    "judge_case",
    "still_open",
    "unbased",
]
