"""Verdicts as data: what the judge decided about one case and metric, with the figures that
decided it. The words are the report's (memtrack.report.words writes every message once);
nothing here is prose.

A verdict holds what every kind has (its case, metric, kind, whether it blocks, its figures)
and one record of its own kind's reasons (`why`): the headroom's arithmetic of a memory
figure, the failure of a case, a leak's rate, a timing's rounds. A kind is declared once, in
KINDS: its order, whether it can block, its mark and word.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memtrack.judge.where import Where
from memtrack.units import format_size


@dataclass(frozen=True)
class Kind:
    """One kind of verdict, declared once."""

    name: str
    order: int
    """Where it is shown, after what blocks: lower first."""
    blocks: bool
    """It can block a pull request (memory regressions, budgets, failures, leaks, quality);
    the others warn or are counted."""
    quiet: bool
    """Counted, not listed: neither blocking nor a warning."""
    symbol: str
    """Its mark in the Markdown table."""
    word: str
    """Its name in a word or two, beside the mark."""
    style: str
    """Its terminal style."""
    warn_symbol: str | None = None
    """A kind that can block, where a pull request's verdict of it only warns (a provisional
    regression, a known failure or leak, a quality check with no reference yet): its mark."""
    warn_word: str | None = None


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("failed", 0, True, False, "💥", "failed", "bold red", "🔁", "known failure"),
        Kind("over_budget", 1, True, False, "⛔", "over budget", "bold red"),
        Kind(
            "regression",
            2,
            True,
            False,
            "🔺",
            "regression",
            "bold red",
            "🔸",
            "provisional regression",
        ),  # noqa: E501
        Kind("leak", 2, True, False, "🚰", "leak", "bold red", "💧", "known leak"),
        Kind("quality", 2, True, False, "🎯", "quality", "bold red", "❔", "no reference yet"),
        Kind("noisy", 3, False, True, "〰️", "noisy", "yellow"),
        Kind("time_regression", 4, False, False, "🐢", "slower", "yellow"),
        Kind("environment_changed", 5, False, False, "🔀", "env. changed", "yellow"),
        Kind("removed", 5, False, False, "➖", "removed", "yellow"),
        Kind("accepted", 6, False, True, "☑️", "accepted", "magenta"),
        Kind("abstained", 7, False, True, "⏸️", "time not judged", "dim"),
        Kind("new", 7, False, True, "🆕", "new", "cyan"),
        Kind("improvement", 8, False, True, "🔻", "improvement", "green"),
        Kind("ok", 9, False, True, "✅", "ok", "dim"),
    )
}
"""Every kind, in the order they are shown. `time_regression` blocks only where the config
says `time_regression = "block"`; `noisy` is a property of the case, said once."""


# -- what each kind's verdict rests on ------------------------------------------------------


@dataclass(frozen=True)
class Headroom:
    """A memory figure against the current level of its baseline (judge.memory, the model in
    judge.noise)."""

    noise: float
    """sigma: the noise within the window's levels (bytes)."""
    widen: float
    """c(n), the small-sample factor."""
    runs: int
    """The runs sigma is read from: this environment's window and, where it is short, other
    environments' runs."""
    known_runs: int
    """Of those, the runs on other environments."""
    window_runs: int
    level_runs: int
    factor: float
    floor: float
    steps: int = 0
    """Steps found in the window."""
    level_since: str | None = None
    """The first commit of the current level, where the window has steps."""
    bound: float | None = None
    """A concurrent case: the sum of its sessions, which bounds its peak (the headroom
    above the baseline is that bound's); None for one session."""
    sessions: str | None = None
    """The case's `concurrency`, as its params say it."""
    suggested_budget: int | None = None
    """An improvement: a tighter budget that still holds the candidate with headroom."""
    sharpen: str | None = None
    """A `noisy` verdict: what would narrow its headroom."""
    noisy_above: float = 0.05
    component: str | None = None
    """The breakdown part that grew the most (weights, caches, gradients, ...)."""
    component_delta: float | None = None

    @property
    def spread(self) -> float:
        """sigma x c(n): the noise as wide as the runs known allow."""
        return self.noise * self.widen


@dataclass(frozen=True)
class Unbased:
    """No baseline on this environment: `new`, `environment_changed`, or `over_budget`."""

    base_branch: str
    failed: tuple[str, ...] = ()
    """The statuses of the base branch's runs of the case, where none passed."""
    runs: int = 0
    """Base-branch runs of the case on this environment (all failed, or none measured the
    figure)."""
    other_run: str | None = None
    """The newest run on another environment, where the case changed environment."""
    other_commit: str | None = None
    environment: tuple[str, ...] = ()
    """What differs between that environment and the candidate's ('torch: a -> b')."""


@dataclass(frozen=True)
class Failure:
    """A case that did not finish."""

    status: str
    """oom | error | timeout | crashed."""
    text: str | None
    """The last line of its message."""
    baseline_runs: int
    passed: int
    """Of the baseline runs, those ok."""
    newest: str | None
    """The newest baseline run's status, None without a baseline."""

    @property
    def failure(self) -> str:
        """'oom (CUDA out of memory. Tried to allocate 64.00 MiB)'."""
        return self.status + (f" ({self.text})" if self.text else "")

    @property
    def known(self) -> bool:
        """The newest baseline run failed too: a known failure, not caused here."""
        return self.newest is not None and self.newest != "ok"


@dataclass(frozen=True)
class Leak:
    """Every measured iteration left memory allocated (judge.leak)."""

    per: int
    """Bytes per iteration."""
    retained: tuple[int, ...]
    before: int | None
    """What the newest baseline run that recorded it retained per iteration."""
    measured: bool
    """A baseline run recorded what it retained."""
    calls: int


@dataclass(frozen=True)
class Paired:
    """A timing paired with REF in the same job (judge.timing)."""

    ref: str
    figure: str
    rounds: int
    slower: int
    ratio: float
    spread: float
    line: float
    factor: float
    min_effect: float
    alpha: float


@dataclass(frozen=True)
class Unpaired:
    """A timing against the history's runs (judge.timing)."""

    figure: str
    runs: int
    iterations: int
    left_out: int
    """Baseline runs timed on a contended machine."""
    spread: float
    factor: float
    min_effect: float
    as_slow: int
    slowest: float
    alpha: float
    needed: int
    window: int
    minimum: int


@dataclass(frozen=True)
class Abstained:
    """Time not judged: the machine was contended while the case was timed."""

    busy: str


@dataclass(frozen=True)
class Quality:
    """A case's output against its reference (judge.quality)."""

    status: str
    """ok | none (no reference yet) | beyond (tolerance) | error."""
    reference: str
    changed: str | None
    """How its params differ from its reference's ('dtype bfloat16 (reference float32)');
    None at the reference's own precision."""
    sha256: str | None
    outcome: str
    """The output's figures against their tolerance, or what went wrong."""
    sibling_measured: bool = True


@dataclass(frozen=True)
class Removed:
    """A case of the base branch's evidence that the candidate's does not hold."""

    base_branch: str


Why = Headroom | Unbased | Failure | Leak | Paired | Unpaired | Abstained | Quality | Removed


# -- what every kind may carry beside ------------------------------------------------------


@dataclass(frozen=True)
class BudgetChange:
    """A budget that the candidate's config changes relative to the base config."""

    workload: str
    metric: str | None
    gpu: str | None
    change: str
    """raised | lowered | added | removed"""
    old_bytes: int | None
    new_bytes: int | None
    reason: str


@dataclass(frozen=True)
class BudgetUse:
    """The budget that applies to a figure, and the device memory that caps it."""

    limit_bytes: int
    reason: str
    device_bytes: int | None = None
    """The memory of the device holding the peak (per-device figures on CUDA)."""
    device_name: str | None = None
    vram: bool = False
    """The limit is that device's VRAM (peak + headroom does not fit), not a config's."""

    def over(self, value: float) -> bool:
        """Above the limit, or above the device's memory (no budget holds more)."""
        device = self.device_bytes
        return value > self.limit_bytes or (device is not None and value > device)


@dataclass(frozen=True)
class Accepted:
    """The `Memtrack-Accept` trailer of the change that covers a growth."""

    reason: str
    commit: str
    amount: str
    """'+2.00 MiB', '+10%'."""
    within: bool
    """The growth is within it (the verdict is `accepted`); else beyond it."""


@dataclass(frozen=True)
class Would:
    """A regression that a trailer of the change names but does not cover."""

    commit: str
    """The trailer's commit."""
    other_metric: str | None
    """The one metric it names, where that is another; else None (it allows too little)."""
    amount: str
    value: str
    """The trailer's value that would accept it: 'decoder +3 MiB the reason'."""


@dataclass(frozen=True)
class Rename:
    """A new case that replaces one of its workload whose params changed."""

    compared_with: str
    change: str
    """'batch 16 -> 32'."""


@dataclass(frozen=True)
class RankPeak:
    """Which rank a multi-rank case's figure is of."""

    ranks: int
    rank: int | None = None
    device: str | None = None
    summed: bool = False


@dataclass(frozen=True)
class DeviceFit:
    """A device's peak plus the headroom against its VRAM."""

    index: int
    name: str | None
    peak_bytes: int
    room: float
    total_bytes: int

    @property
    def margin(self) -> float:
        return self.total_bytes - self.peak_bytes - self.room


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
    predates: bool = False
    """The run being checked is of a branch cut before the regression merged: its commit
    is not in the candidate's history, so being back within it fixes nothing."""
    branch: str = ""
    """The base branch it was found on."""

    def describe(self) -> str:
        """'allocated +4.55 MiB (+12.00%) since 1a2b3c4d5e6f (subject); fixed when back
        within 104.00 MiB'."""
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

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.run_id, self.case_id, self.metric)


@dataclass(frozen=True)
class Verdict:
    """One case and metric of the candidate, judged. Figures are bytes (seconds for time)."""

    case_id: str
    workload: str
    metric: str
    """allocated | reserved | requested | device | host | host_step | ... | time | status |
    retained | quality"""
    kind: str
    """One of KINDS."""
    blocking: bool
    context: str = "pull_request"
    """'pull_request' (gating a change) or 'base' (a run of the base branch against its
    previous level: reported and recorded, never blocking)."""
    why: Why | None = None
    """What the kind rests on."""
    baseline_value: float | None = None
    """The median of the baseline's current level (quality: the full-precision sibling's
    framework peak)."""
    threshold: float | None = None
    candidate_value: float | None = None
    baseline_runs: int = 0
    provisional: bool = False
    """Fewer baseline runs than `min_baseline_runs`: the noise is not established yet."""
    p_value: float | None = None
    """Time: the sign test's (paired) or the rank test's (unpaired)."""
    budget: BudgetUse | None = None
    changes: tuple[BudgetChange, ...] = ()
    """The budget changes of this revision that touch this figure."""
    acceptance: Accepted | None = None
    would: Would | None = None
    rename: Rename | None = None
    where: Where | None = None
    """A tensor figure that grew: where it grew at the peak, against the newest baseline run."""
    around: str | None = None
    """What differs around the code between the newest baseline run and the candidate
    ('numpy: 1.26.4 -> 2.1.0'), for a verdict such a change could explain."""
    rank: RankPeak | None = None
    fits: tuple[DeviceFit, ...] = field(default=())
    """Each device's peak plus the headroom against its VRAM (the device view on CUDA)."""
    closes: OpenRegression | None = None
    """A regression of the base branch still open that this verdict accepts."""

    @property
    def delta(self) -> float | None:
        if self.candidate_value is None or self.baseline_value is None:
            return None
        return self.candidate_value - self.baseline_value

    @property
    def delta_pct(self) -> float | None:
        delta = self.delta
        if delta is None or not self.baseline_value:
            return None
        return 100.0 * delta / self.baseline_value

    @property
    def room(self) -> float | None:
        """The headroom allowed: threshold less baseline; None where either is unknown."""
        if self.threshold is None or self.baseline_value is None:
            return None
        return self.threshold - self.baseline_value

    @property
    def budget_bytes(self) -> int | None:
        return self.budget.limit_bytes if self.budget else None


__all__ = [
    "KINDS",
    "Abstained",
    "Accepted",
    "BudgetChange",
    "BudgetUse",
    "DeviceFit",
    "Failure",
    "Headroom",
    "Kind",
    "Leak",
    "OpenRegression",
    "Paired",
    "Quality",
    "RankPeak",
    "Removed",
    "Rename",
    "Unbased",
    "Unpaired",
    "Verdict",
    "Why",
    "Would",
]
