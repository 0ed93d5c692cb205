"""What a check is judged on, gathered once (memtrack.judge.gather) and frozen: the
candidate's evidence, each case's baseline points, and what else the rules read. Nothing
here reads a store, runs git or looks at the clock; `memtrack.judge.decide` turns this into
verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memtrack.judge.load import Load
from memtrack.judge.verdict import BudgetChange, OpenRegression
from memtrack.records import Environment, Measurement, RunRecord, Site


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
    case_id: str | None = None
    """The case id it was recorded under (a test's, from another rootdir), where read."""
    tree_cpu_times: tuple[float, ...] = ()
    """CPU time of the case's whole process tree in each timed iteration."""


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


@dataclass(frozen=True)
class CaseEvidence:
    """One case of the candidate and what it is judged against."""

    m: Measurement
    """The candidate's measurement: of the one run of the commit that measured the case, or
    of several (see gather: each figure judged is then the lower median, `values`)."""
    points: tuple[Point, ...] = ()
    """Same-environment baseline runs, newest first, in commit order."""
    known: tuple[Point, ...] = ()
    """Runs of the case on other environments, newest first, where this environment's window
    is short: what the history knows of its noise."""
    seen: bool = False
    """A run other than the candidate's measured the case (anywhere)."""
    other_env: Point | None = None
    """The newest run of the case on another environment, where it has no baseline here."""
    other_env_diff: tuple[str, ...] = ()
    """What differs between that run's environment and the candidate's."""
    around: tuple[str, ...] = ()
    """What differs between the newest baseline run's environment and the candidate's."""
    base_sites: tuple[Site, ...] = ()
    """The sites at the peak of the newest baseline run (to say where a figure grew)."""
    renamed_from: str | None = None
    """A new case replacing one of its workload whose params changed: the old case id."""
    param_change: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    """The figures judged where the commit measured the case in several runs: each the
    lower median over them (judge.gather.commit); else the measurement's own."""


@dataclass(frozen=True)
class CheckInput:
    """Everything one check decides on."""

    run: RunRecord
    """The candidate: the commit's evidence joined into one record (its measured cases)."""
    base_branch: str
    context: str
    """'base' for a run of the base branch itself, else 'pull_request'."""
    merge_base: str | None
    baseline_mode: str
    """'ancestry', 'time' or 'none' (an estimate run)."""
    cases: tuple[CaseEvidence, ...]
    checked_at: str
    notes: tuple[str, ...] = ()
    """What the gather step found to say (a shallow clone, joined runs, a dirty tree ...)."""
    removed: tuple[str, ...] = ()
    """Cases of the base branch's evidence that the candidate's, of the same kind of run,
    lacks."""
    not_measured: tuple[str, ...] = ()
    """Cases of the base branch's evidence that the candidate's runs left out by choice (a
    -k selection, a shard): said once, not judged."""
    budget_changes: tuple[BudgetChange, ...] = ()
    acceptances: tuple = ()
    """The reviewed acceptances in the commits the candidate adds (judge.accept)."""
    open_found: tuple[tuple[OpenRegression, bool], ...] = ()
    """The base branch's regressions open on the candidate's cases, each with whether its
    commit is in the candidate's history."""
    estimates: tuple[Estimate, ...] = ()
    estimate_only: bool = False
    case_runs: dict[str, str] = field(default_factory=dict)
    """Case id -> the run holding its figures (verdicts are recorded against it)."""
    runs: tuple[str, ...] = ()
    """Every run of the commit the evidence was read from."""
    environment: Environment | None = None
    changed_lines: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The lines the candidate changes against its merge-base, by file (a pull request's
    diff): where an annotation points among a growth's frames."""


__all__ = [
    "CaseEvidence",
    "CheckInput",
    "Estimate",
    "OpenRegression",
    "Point",
]
