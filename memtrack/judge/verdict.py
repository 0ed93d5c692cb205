"""A verdict: one case and metric of a candidate, judged, with its arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

from memtrack.judge.where import Where

KINDS = (
    "regression",
    "over_budget",
    "improvement",
    "new",
    "failed",
    "environment_changed",
    "time_regression",
    "accepted",
    "noisy",
    "ok",
    "quality",
    "removed",
    "leak",
    "abstained",
)
"""Memory regressions, budgets and failures block; `accepted` and `noisy` never do (a
noisy metric still blocks on its budget, as an `over_budget` verdict). `quality` (an output
beyond its tolerance, or a refused reference) blocks; without a reference it warns.
`removed` (a case of the newest baseline run that this run does not hold) warns. `leak`
(every measured iteration left memory behind) blocks where a baseline run recorded what it
retained and did not leak as much; without one it is reported.
`abstained`: time not judged, the machine oversubscribed while the case was timed."""


@dataclass(frozen=True)
class Headroom:
    """How a memory verdict's headroom was reached, beyond the verdict's own fields (its
    spread, baseline_spread, repeat_spread, factor and floor): the parts its message says
    in words. Bytes."""

    iterations: float = 0.0
    """The noise of the runs' median iteration (allocated), or, while provisional, how far
    one run's iterations range."""
    widen: float = 1.0
    """How much wider the spread is taken for the few runs it is known from (t / z)."""
    runs: int = 0
    """Runs the noise is known from: the window's and other environments'."""
    known_runs: int = 0
    """Of those, the runs on other environments."""
    bound: float | None = None
    """A concurrent case: the sum of its sessions, which bounds the peak in place of the
    spread; None for a case of one session."""


@dataclass(frozen=True)
class Verdict:
    """One case and metric of the candidate, judged. Figures are bytes (seconds for time)."""

    case_id: str
    workload: str
    metric: str
    """allocated | reserved | requested | device | host | host_step | time | status | quality"""
    kind: str
    """One of KINDS."""
    blocking: bool
    message: str
    """One line with the arithmetic: baseline, spread, factor, floor, threshold, candidate,
    delta (bytes and %), and the budget where one applies."""
    provisional: bool = False
    """Fewer baseline runs in the window than `min_baseline_runs`: the spread is not
    established yet."""
    baseline_value: float | None = None
    """Median of the baseline runs."""
    spread: float | None = None
    """max(baseline spread, candidate repeat spread)."""
    baseline_spread: float | None = None
    repeat_spread: float | None = None
    """Within-run spread of the candidate's iteration peaks (1.4826 x MAD, 3+ repeats)."""
    factor: float | None = None
    floor: float | None = None
    threshold: float | None = None
    candidate_value: float | None = None
    delta: float | None = None
    delta_pct: float | None = None
    budget_bytes: int | None = None
    budget_reason: str | None = None
    baseline_runs: int = 0
    """Runs the baseline value is the median of: those at the current level."""
    suggested_budget: int | None = None
    """For an improvement: a tighter budget that still holds the candidate with headroom."""
    p_value: float | None = None
    """Time only: the rank p-value over runs, (baseline runs at least as slow + 1) / (n + 1)."""
    details: tuple[str, ...] = ()
    """Further lines: differing versions, per-device VRAM fit, budget changes."""
    context: str = "pull_request"
    """'pull_request' (gating a change) or 'base' (a run of the base branch against its
    previous level: reported and recorded, never blocking)."""
    accepted_reason: str | None = None
    """For `accepted`: the reason of the reviewed acceptance (a commit trailer) it is within."""
    component: str | None = None
    """The breakdown component that grew the most (weights, caches, gradients, ...)."""
    component_delta: float | None = None
    """That component's growth against the baseline level, bytes."""
    level_commit: str | None = None
    """The first commit of the baseline's current level (the newest step), if known."""
    quality: str | None = None
    """Quality verdicts: the output's figures against their tolerance, or what went wrong.
    Their baseline_value and candidate_value are the framework peaks of the full-precision
    sibling in the same run and of the case, delta what the change saved (negative)."""
    reference: str | None = None
    """Quality verdicts: the reference case id."""
    compared_with: str | None = None
    """A new case that replaces one of the same workload whose params changed: the case its
    figures were judged against (its series ends where this one starts)."""
    param_change: str | None = None
    """That change in words: 'batch 16 -> 32'."""
    words: str | None = None
    """The conclusion in words, as the message says it after its arithmetic and before the
    budget's part: 'regression', 'the baseline passed (20 of 20 runs ok)'. A later step
    that adds to the message (a rank, the VRAM fit, an accepted open regression) does not
    add to it."""
    sharpen: str | None = None
    """A `noisy` verdict: what would narrow its headroom ('more repeats (now 3), a budget
    on this metric')."""
    failure: str | None = None
    """A `failed` verdict: the case's status and, in brackets, the last line of its message
    ('oom (CUDA out of memory. Tried to allocate 64.00 MiB)')."""
    where: Where | None = None
    """A verdict that says a tensor figure grew: where it grew at the peak, against the
    newest baseline run (judge.where)."""
    headroom: Headroom | None = None
    """A memory verdict against a baseline: the parts of its headroom."""
    accepted_commit: str | None = None
    """For `accepted`: the commit whose `Memtrack-Accept` trailer accepts it."""
    would_accept: str | None = None
    """A regression that a trailer of the change names but does not cover (another metric,
    or less growth): the trailer's value that would accept it ('decoder +3 MiB reason')."""

    @property
    def room(self) -> float | None:
        """The headroom allowed: threshold less baseline; None where either is unknown."""
        if self.threshold is None or self.baseline_value is None:
            return None
        return self.threshold - self.baseline_value


RESTATED = ("words", "sharpen", "failure", "headroom", "accepted_commit", "would_accept")
"""The fields that restate a verdict's message as data, for the renderers, so that none
parses the message. The message says them already: the JSON report (report_version 1) and
the database's verdicts table leave them out."""


__all__ = ["KINDS", "RESTATED", "Headroom", "Verdict"]
