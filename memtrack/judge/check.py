"""Deciding: a candidate run against its baseline and its budgets, as verdicts.

The baseline of a case is the last N runs of that case on the base branch, at or before the
candidate's merge-base, on the same environment fingerprint. The headroom is justified by
what was observed, never a fixed percentage:

    spread    = max(baseline spread, candidate repeat spread)
    headroom  = max(factor x spread, floor)
    threshold = baseline + headroom            (baseline: median of the baseline runs)

and a candidate above the threshold is a regression. Every verdict carries that arithmetic
in its message. Nothing here prints; `memtrack.report` shows what this returns.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memtrack.baseline import COLUMNS, BaselineFinder, Point, git_output
from memtrack.config import Budget, Config, config_from_text
from memtrack.errors import ConfigError, StoreError
from memtrack.records import Environment, Measurement, RunRecord, device_peak
from memtrack.store import Store
from memtrack.units import format_seconds, format_size

MiB = 2**20

MEMORY_METRICS = ("allocated", "reserved", "requested", "device", "host")
KINDS = ("regression", "over_budget", "improvement", "new", "failed", "environment_changed",
         "time_regression", "ok")


FLOORS = {
    # The caching allocator rounds every request up to a multiple of 512 B: a smaller
    # change in allocated memory cannot be told from rounding.
    "allocated": 512,
    # `requested` is before rounding, but the same request size quantum makes anything below
    # it meaningless as a regression.
    "requested": 512,
    # Reserved memory grows by whole segments, the smallest being 2 MiB.
    "reserved": 2 * MiB,
    # NVML's per-process figure moves with the driver's 2 MiB pages and the allocator's
    # 2 MiB segments; the CUDA context adds its own page-sized steps.
    "device": 2 * MiB,
    # Resident set size moves by 2 MiB transparent huge pages (x86-64) and by glibc arenas
    # being trimmed or not, with no change in code.
    "host": 2 * MiB,
}
"""The smallest change per metric that can be a change in code rather than granularity."""

PROVISIONAL_BLOCK_FRACTION = 0.10
"""With fewer baseline runs than `min_baseline_runs` the spread is not known yet: a
regression then blocks only past this jump (10 %); smaller ones warn. Budgets always block."""

TIME_MIN_EFFECT = 0.05
"""Time is noisy: a median slowdown under 5 % (or under the observed run-to-run spread times
the factor) is not tested at all, and scipy is not even loaded."""
TIME_ALPHA = 0.01
"""One-sided Mann-Whitney U significance level for a time regression."""



# -- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One case and metric of the candidate, judged. Figures are bytes (seconds for time)."""

    case_id: str
    workload: str
    metric: str
    """allocated | reserved | requested | device | host | time | status"""
    kind: str
    """One of KINDS."""
    blocking: bool
    message: str
    """One line with the arithmetic: baseline, spread, factor, floor, threshold, candidate,
    delta (bytes and %), and the budget where one applies."""
    provisional: bool = False
    """Fewer baseline runs than `min_baseline_runs`: the spread is not established yet."""
    baseline_value: float | None = None
    """Median of the baseline runs."""
    spread: float | None = None
    """max(baseline spread, candidate repeat spread)."""
    baseline_spread: float | None = None
    repeat_spread: float | None = None
    factor: float | None = None
    floor: float | None = None
    threshold: float | None = None
    candidate_value: float | None = None
    delta: float | None = None
    delta_pct: float | None = None
    budget_bytes: int | None = None
    budget_reason: str | None = None
    baseline_runs: int = 0
    suggested_budget: int | None = None
    """For an improvement: a tighter budget that still holds the candidate with headroom."""
    p_value: float | None = None
    """Time only: Mann-Whitney U, one-sided (candidate slower)."""
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

    def describe(self) -> str:
        where = self.workload + (f" ({self.metric})" if self.metric else "") + (
            f" on {self.gpu}" if self.gpu else "")
        return (f"budget {self.change}: {where} {format_size(self.old_bytes)} -> "
                f"{format_size(self.new_bytes)} ({self.reason})")


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

    @property
    def blocking(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.blocking)

    @property
    def exit_code(self) -> int:
        """0 when nothing blocks, 1 when something does."""
        return 1 if self.blocking else 0


# -- small arithmetic -----------------------------------------------------------------------


def metric_value(m: Measurement, metric: str) -> int | None:
    """A measurement's figure for a memory metric (device: the largest per-device peak)."""
    if metric == "device":
        return device_peak(m)
    if metric not in COLUMNS:
        raise ValueError(f"unknown metric {metric!r}")
    value = getattr(m, COLUMNS[metric])
    return None if value is None else int(value)


def repeat_spread(m: Measurement, metric: str) -> int:
    """How far the candidate's own peak moved between its repeats.

    The compared figure is the highest of the per-iteration peaks, so the noise that matters
    is how reproducible that highest one is: the gap between the highest and the second
    highest iteration. An iteration that stays lower every time (e.g. the first one, before
    a lazy buffer exists) is structure, not noise, and must not widen the headroom.
    Only the framework's allocated view is sampled per iteration.
    """
    if metric != "allocated" or len(m.allocated_samples) < 2:
        return 0
    top = sorted(m.allocated_samples)[-2:]
    return int(top[1] - top[0])


# Expected range of n normal samples in standard deviations (Tippett's d2, the constants of
# range control charts), n = 2..20.
_D2 = (1.128, 1.693, 2.059, 2.326, 2.534, 2.704, 2.847, 2.970, 3.078, 3.173, 3.258, 3.336,
       3.407, 3.472, 3.532, 3.588, 3.640, 3.689, 3.735)


def baseline_spread(values: Sequence[float]) -> float:
    """Robust spread of the baseline: 1.4826 x MAD (a standard-deviation estimate that one
    outlier cannot move), but never less than half the observed range, so that a value the
    unchanged code already produced inside the window can never exceed its threshold
    (with factor >= 2). A short baseline sees a narrower range than 20 runs would: its
    range is scaled up to the range expected of 20 runs (d2(20) / d2(n))."""
    n = len(values)
    if n < 2:
        return 0.0
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    scale = _D2[-1] / _D2[min(n, 20) - 2]
    return max(1.4826 * mad, scale * (max(values) - min(values)) / 2)


def headroom(spread: float, factor: float, floor: int) -> float:
    return max(factor * spread, float(floor))


def suggest_budget(value: int, room: float) -> int:
    """A budget that holds `value` with its headroom and 10 % to grow, rounded up to MiB."""
    need = value + max(room, value / 10)
    return int(math.ceil(need / MiB)) * MiB


def _pct(delta: float, base: float) -> float | None:
    return None if not base else 100.0 * delta / base


def _fmt_pct(p: float | None) -> str:
    return "n/a" if p is None else f"{p:+.2f}%"


def _fmt_delta(d: float) -> str:
    n = int(round(d))
    if abs(n) < 1024:
        return f"{n:+,} B"
    return f"{'+' if n >= 0 else '-'}{format_size(abs(n))} ({n:+,} B)"


# -- environment --------------------------------------------------------------------------


def environment_diff(old: Environment, new: Environment) -> list[str]:
    """'what: old -> new' for each confounder that differs."""
    def gpus(e: Environment) -> str:
        return ", ".join(f"{g.name} ({format_size(g.total_bytes)})" for g in e.gpus) or "none"

    pairs = [
        ("GPUs", gpus(old), gpus(new)), ("driver", old.driver, new.driver),
        ("CUDA", old.cuda_runtime, new.cuda_runtime), ("cuDNN", old.cudnn, new.cudnn),
        ("NCCL", old.nccl, new.nccl), ("torch", old.torch, new.torch),
        ("Python", old.python, new.python), ("OS", old.os, new.os),
    ]
    out = [f"{what}: {a or '-'} -> {b or '-'}" for what, a, b in pairs if a != b]
    for name in sorted(set(old.env_vars) | set(new.env_vars)):
        if old.env_vars.get(name) != new.env_vars.get(name):
            out.append(f"{name}: {old.env_vars.get(name, '(unset)')} -> "
                       f"{new.env_vars.get(name, '(unset)')}")
    for name in sorted(set(old.packages) | set(new.packages)):
        if name != "torch" and old.packages.get(name) != new.packages.get(name):
            out.append(f"{name}: {old.packages.get(name, '-')} -> {new.packages.get(name, '-')}")
    return out


# -- budgets -------------------------------------------------------------------------------


def default_budget_metric(m: Measurement) -> str:
    """The device view where measured, else reserved, else allocated."""
    for metric in ("device", "reserved"):
        if metric_value(m, metric) is not None:
            return metric
    return "allocated"


def budgets_for(budgets: Sequence[Budget], m: Measurement, env: Environment) -> dict[str, Budget]:
    """The budget that applies to each metric of a case: the most specific one (a case id
    over a workload name, a GPU model over any GPU), the tighter on a tie."""
    gpu_names = {g.name.lower() for g in env.gpus}
    chosen: dict[str, tuple[tuple[int, int, int], Budget]] = {}
    for b in budgets:
        if b.workload not in (m.workload, m.case_id):
            continue
        if b.gpu is not None and not (
                b.gpu.lower() in gpu_names and m.device != "cpu"
                or b.gpu.lower() == "cpu" and m.device == "cpu"):
            continue
        metric = b.metric or default_budget_metric(m)
        rank = (int(b.workload == m.case_id), int(b.gpu is not None), -b.limit_bytes)
        if metric not in chosen or rank > chosen[metric][0]:
            chosen[metric] = (rank, b)
    return {metric: b for metric, (_, b) in chosen.items()}


def budget_changes(config: Config, root: Path, rev: str | None) -> tuple[list[BudgetChange],
                                                                           str | None]:
    """Budgets the current config changes relative to the same file at `rev`."""
    if config.path is None:
        return [], None
    quiet = not config.budgets  # nothing to raise: a missing base is not worth a note
    if rev is None:
        return [], None if quiet else "budget changes not checked: no base revision to compare with"
    top = git_output(root, "rev-parse", "--show-toplevel")
    if top is None:
        return [], "budget changes not checked: the config is not in a git repository"
    try:
        rel = config.path.resolve().relative_to(Path(top).resolve()).as_posix()
    except ValueError:
        return [], "budget changes not checked: the config is outside the repository"
    if git_output(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}") is None:
        note = (f"budget changes not checked: {rev} is not in this clone (shallow?), so the "
                "config cannot be compared with the base's")
        return [], None if quiet else note
    text = git_output(root, "show", f"{rev}:{rel}")
    if text is None:
        return [], None  # the file is new here: its budgets are all new
    try:
        old = config_from_text(text, config.path)
    except ConfigError as exc:
        return [], f"budget changes not checked: the base config does not load ({exc})"

    def key(b: Budget) -> tuple[str, str, str]:
        return (b.workload, b.metric or "", b.gpu or "")

    before = {key(b): b for b in old.budgets}
    after = {key(b): b for b in config.budgets}
    out = []
    for k in sorted(set(before) | set(after)):
        a, b = before.get(k), after.get(k)
        if a and b and a.limit_bytes == b.limit_bytes:
            continue
        change = ("added" if a is None else "removed" if b is None else
                  "raised" if b.limit_bytes > a.limit_bytes else "lowered")
        ref = b or a
        assert ref is not None
        out.append(BudgetChange(ref.workload, ref.metric, ref.gpu, change,
                                a.limit_bytes if a else None, b.limit_bytes if b else None,
                                ref.reason))
    return out, None


# -- verdicts ------------------------------------------------------------------------------


@dataclass
class _Case:
    """What is known about one candidate case while judging it."""

    m: Measurement
    points: list[Point]
    budgets: dict[str, Budget]
    provisional: bool
    changes: list[BudgetChange] = field(default_factory=list)


def _budget_part(value: int, budget: Budget | None) -> str:
    if budget is None:
        return ""
    margin = budget.limit_bytes - value
    state = (f"margin {format_size(margin)}" if margin >= 0 else
             f"OVER by {format_size(-margin)}")
    return f"; budget {format_size(budget.limit_bytes)} ({budget.reason}): {state}"


def _memory_verdict(c: _Case, metric: str, config: Config) -> Verdict | None:
    """Headroom arithmetic against the baseline points, and the budget, for one metric."""
    m = c.m
    value = metric_value(m, metric)
    if value is None:
        return None
    budget = c.budgets.get(metric)
    over = budget is not None and value > budget.limit_bytes
    details = tuple(ch.describe() for ch in c.changes
                    if (ch.metric or default_budget_metric(m)) == metric)
    common: dict[str, Any] = dict(
        case_id=m.case_id, workload=m.workload, metric=metric, candidate_value=float(value),
        budget_bytes=budget.limit_bytes if budget else None,
        budget_reason=budget.reason if budget else None, details=details)
    values = [p.values[metric] for p in c.points if p.status == "ok" and metric in p.values]
    if not values:
        if budget is None:
            return None  # the baseline never measured this view: nothing to compare
        return Verdict(kind="over_budget" if over else "ok", blocking=over,
                       message=f"{metric}: {format_size(value)}, the baseline has no {metric} "
                               f"figure to compare{_budget_part(value, budget)}", **common)
    n = len(values)
    base = statistics.median(values)
    s_base = baseline_spread(values)
    s_rep = repeat_spread(m, metric)
    spread = max(s_base, float(s_rep))
    floor = FLOORS[metric]
    factor = config.headroom_factor
    room = headroom(spread, factor, floor)
    threshold = base + room
    delta = value - base
    pct = _pct(delta, base)
    provisional = n < config.min_baseline_runs
    suggested = None
    if over:
        kind, blocking = "over_budget", True
    elif value > threshold:
        kind = "regression"
        blocking = not provisional or (pct is not None and pct >= 100 * PROVISIONAL_BLOCK_FRACTION)
    elif delta < -room:
        kind, blocking = "improvement", False
        suggestion = suggest_budget(value, room)
        if budget is None or suggestion < budget.limit_bytes:
            suggested = suggestion
    else:
        kind, blocking = "ok", False
    words = {
        "regression": "regression" + ("" if blocking else
                                      f" (provisional: blocks only past a "
                                      f"{PROVISIONAL_BLOCK_FRACTION:.0%} jump)"),
        "over_budget": "over budget",
        "improvement": "improvement" + (f"; a budget of {format_size(suggested)} would hold it"
                                        if suggested else ""),
        "ok": "ok",
    }[kind]
    cmp = "> headroom" if delta > room else "< -headroom" if delta < -room else "within ±headroom"
    message = (
        f"{metric}: baseline {format_size(int(base))} (median of {n} run{'s' * (n != 1)}"
        f"{', provisional' if provisional else ''}), spread {format_size(int(spread))} "
        f"(baseline {format_size(int(s_base))}, repeats {format_size(s_rep)}) x factor "
        f"{factor:g}, floor {format_size(floor)} -> headroom {format_size(int(room))}, "
        f"threshold {format_size(int(threshold))}; candidate {format_size(value)}, delta "
        f"{_fmt_delta(delta)} {_fmt_pct(pct)} {cmp}: {words}{_budget_part(value, budget)}"
    )
    return Verdict(kind=kind, blocking=blocking, message=message, provisional=provisional,
                   baseline_value=float(base), spread=spread, baseline_spread=s_base,
                   repeat_spread=float(s_rep), factor=factor, floor=float(floor),
                   threshold=threshold, delta=float(delta), delta_pct=pct, baseline_runs=n,
                   suggested_budget=suggested, **common)


def _unbased_verdict(c: _Case, metric: str, base_branch: str,
                     other_env: tuple[Point, list[str]] | None) -> Verdict | None:
    """No baseline on this environment: 'new' or 'environment changed', budgets still hold."""
    m = c.m
    value = metric_value(m, metric)
    if value is None:
        return None
    budget = c.budgets.get(metric)
    over = budget is not None and value > budget.limit_bytes
    if other_env is not None:
        point, diff = other_env
        kind = "environment_changed"
        text = (f"environment changed ({'; '.join(diff) or 'fingerprint differs'}): no baseline "
                f"on {base_branch} with this environment, not compared (newest other-environment "
                f"run {point.run_id[:12]} of {(point.commit or '?')[:12]})")
        details = tuple(diff)
    else:
        kind, text, details = "new", f"new: no baseline on {base_branch}", ()
    details += tuple(ch.describe() for ch in c.changes
                     if (ch.metric or default_budget_metric(m)) == metric)
    return Verdict(
        case_id=m.case_id, workload=m.workload, metric=metric,
        kind="over_budget" if over else kind, blocking=over, candidate_value=float(value),
        budget_bytes=budget.limit_bytes if budget else None,
        budget_reason=budget.reason if budget else None, details=details,
        message=f"{metric} {format_size(value)}: {text}{_budget_part(value, budget)}")


def _vram_verdict(v: Verdict, m: Measurement) -> Verdict:
    """Does peak plus the observed variation fit each device's VRAM? Devices do not pool."""
    if v.threshold is not None and v.baseline_value is not None:
        room = v.threshold - v.baseline_value
    else:
        room = float(FLOORS["device"])
    lines, worst = [], None
    for d in m.devices:
        if d.peak_process_bytes is None or not d.total_bytes:
            continue
        need = d.peak_process_bytes + room
        margin = d.total_bytes - need
        fit = f"fits, margin {format_size(int(margin))}" if margin >= 0 else "does NOT fit"
        lines.append(f"device {d.index} ({d.name or '?'}): peak "
                     f"{format_size(d.peak_process_bytes)} + headroom {format_size(int(room))} "
                     f"of {format_size(d.total_bytes)} VRAM: {fit}")
        if worst is None or margin < worst[0]:
            worst = (margin, d)
    if worst is None:
        return v
    margin, d = worst
    details = v.details + tuple(lines)
    if margin >= 0:
        return _replace(v, details=details, message=v.message + f"; fits VRAM of device {d.index} "
                        f"with {format_size(int(margin))} to spare")
    if v.kind == "over_budget":
        return _replace(v, details=details)
    return _replace(v, kind="over_budget", blocking=True, details=details,
                    budget_bytes=d.total_bytes,
                    budget_reason=f"VRAM of device {d.index} ({d.name})",
                    message=v.message + f"; peak + headroom does NOT fit the "
                    f"{format_size(d.total_bytes)} VRAM of device {d.index} ({d.name})")


def _replace(v: Verdict, **changes: Any) -> Verdict:
    return replace(v, **changes)


def _time_verdict(c: _Case, config: Config) -> Verdict | None:
    """A time regression needs both an effect beyond what runs of the same code show and
    a significant test. Iterations of one run share its machine's mood, so the pooled test
    alone would call every slow runner a regression: the effect must first exceed the
    run-to-run spread (of run medians) times the factor, and at least TIME_MIN_EFFECT."""
    m = c.m
    cand = [t for t in m.iteration_times_s if t is not None]
    ok_points = [p for p in c.points if p.status == "ok" and p.times]
    pooled = [t for p in ok_points for t in p.times]
    if not cand or len(pooled) < 2:
        return None
    base = statistics.median(pooled)
    value = statistics.median(cand)
    delta = value - base
    pct = _pct(delta, base)
    medians = [statistics.median(p.times) for p in ok_points]
    spread = 0.0
    if len(medians) >= 2:
        center = statistics.median(medians)
        spread = 1.4826 * statistics.median(abs(x - center) for x in medians)
    floor = TIME_MIN_EFFECT * base
    factor = config.headroom_factor
    threshold = base + max(factor * spread, floor)
    provisional = len(ok_points) < config.min_baseline_runs
    p_value = None
    if value <= threshold:
        kind, verdict_words = "ok", "within the threshold, not tested"
    else:
        from scipy.stats import mannwhitneyu  # only when there is an effect to test

        # Exact distribution for the usual few candidate repeats: the normal approximation
        # is poor with 3 samples. Iteration times (floats) practically never tie.
        method = "exact" if len(cand) + len(pooled) <= 400 else "asymptotic"
        p_value = float(mannwhitneyu(cand, pooled, alternative="greater", method=method).pvalue)
        if p_value < TIME_ALPHA:
            kind = "time_regression"
            verdict_words = f"Mann-Whitney U p={p_value:.2g} < {TIME_ALPHA}: slower"
        else:
            kind = "ok"
            verdict_words = f"Mann-Whitney U p={p_value:.2g} >= {TIME_ALPHA}: not significant"
    blocking = kind == "time_regression" and config.time_regression == "block" and not provisional
    if kind == "time_regression" and not blocking:
        verdict_words += " (warning)"
    runs = len(ok_points)
    message = (
        f"time: baseline median {format_seconds(base)} ({len(pooled)} iterations of {runs} "
        f"run{'s' * (runs != 1)}{', provisional' if provisional else ''}), run-to-run spread "
        f"{format_seconds(spread)} x factor {factor:g}, floor {TIME_MIN_EFFECT:.0%} = "
        f"{format_seconds(floor)} -> threshold {format_seconds(threshold)}; candidate median "
        f"{format_seconds(value)} of {len(cand)}, delta {_fmt_pct(pct)}: {verdict_words}"
    )
    return Verdict(case_id=m.case_id, workload=m.workload, metric="time", kind=kind,
                   blocking=blocking, message=message, provisional=provisional,
                   baseline_value=base, spread=spread, factor=factor, floor=floor,
                   threshold=threshold, candidate_value=value, delta=delta, delta_pct=pct,
                   baseline_runs=runs, p_value=p_value)


def _failed_verdict(c: _Case) -> Verdict:
    m = c.m
    same_env_status = [p.status for p in c.points]
    passed = sum(s == "ok" for s in same_env_status)
    if c.points and c.points[0].status != "ok":
        blocking, why = False, (f"the newest baseline run failed too ({c.points[0].status}): "
                                f"a known failure, not caused here")
    elif c.points:
        blocking, why = True, f"the baseline passed ({passed} of {len(c.points)} runs ok)"
    else:
        blocking, why = True, "no baseline: a case that does not run cannot be gated"
    msg = (m.message or "").strip().splitlines()
    text = f" ({msg[-1][:160]})" if msg else ""
    return Verdict(case_id=m.case_id, workload=m.workload, metric="status", kind="failed",
                   blocking=blocking, baseline_runs=len(c.points),
                   message=f"status: {m.status}{text}; {why}")


def _judge_case(c: _Case, config: Config, base_branch: str,
                other_env: tuple[Point, list[str]] | None, time_on: bool) -> list[Verdict]:
    m = c.m
    if m.status != "ok":
        return [_failed_verdict(c)]
    out: list[Verdict] = []
    for metric in MEMORY_METRICS:
        if c.points:
            v = _memory_verdict(c, metric, config)
        else:
            v = _unbased_verdict(c, metric, base_branch, other_env)
        if v is None:
            continue
        if metric == "device" and m.devices:
            v = _vram_verdict(v, m)
        out.append(v)
    if time_on and c.points:
        t = _time_verdict(c, config)
        if t is not None:
            out.append(t)
    return out


# -- the check -----------------------------------------------------------------------------


def find_candidate(store: Store, *, run_id: str | None = None, commit: str | None = None,
                   root: Path) -> RunRecord:
    """The run to check: by id, else the newest run of `commit`, else of HEAD at `root`."""
    if run_id:
        return store.get_run(run_id)
    if commit is None:
        commit = git_output(root, "rev-parse", "HEAD")
        if commit is None:
            raise ConfigError(f"{root} is not inside a git repository with a commit: "
                              "pass --run ID or --commit SHA")
        what = f"the current commit {commit[:12]}"
    else:
        what = f"commit {commit}"
    ids = store.run_ids(commit=commit, limit=1)
    if not ids:
        raise StoreError(f"{store.path}: no run of {what}; record one with `memtrack run` "
                         "first, or pass --run ID")
    return store.get_run(ids[0])


def with_sibling_shards(store: Store, run: RunRecord) -> tuple[RunRecord, dict[str, str]]:
    """A run of one shard (i/n) joined by the newest run of each other shard of the same
    commit and environment, so that the whole suite is checked at once. Returns the joined
    run and, per case id, the run that holds its figures."""
    owners = {m.case_id: run.run_id for m in run.measurements}
    if not run.shard or "/" not in run.shard or not run.git.commit:
        return run, owners
    total = run.shard.split("/", 1)[1]
    rows = store.conn.execute(
        "select run_id, shard from runs where git_commit = ? and fingerprint = ? "
        "and shard like ? order by started_at desc",
        [run.git.commit, run.environment.fingerprint, f"%/{total}"],
    ).fetchall()
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


def check(store: Store, config: Config, *, run_id: str | None = None,
          commit: str | None = None, base_branch: str | None = None,
          root: Path | None = None) -> CheckResult:
    """Judge a candidate run against its baseline and the config's budgets."""
    root = root or config.root
    run = find_candidate(store, run_id=run_id, commit=commit, root=root)
    owners = {m.case_id: run.run_id for m in run.measurements}
    if run_id is None:
        run, owners = with_sibling_shards(store, run)
    base = base_branch or config.base_branch
    finder = BaselineFinder(store, run, base, root, config.baseline_runs, owners)
    notes = list(finder.notes)
    shard_runs = sorted(set(owners.values()) - {run.run_id})
    if shard_runs:
        notes.append(f"shard {run.shard} checked together with the newest run of each other "
                     f"shard of this commit: {', '.join(r[:12] for r in shard_runs)}")
    if run.git.dirty:
        notes.append("the candidate was measured with uncommitted changes (dirty tree)")
    changes, note = budget_changes(config, root, finder.merge_base or base)
    if note:
        notes.append(note)
    env_cache: dict[str | None, Environment | None] = {}
    verdicts: list[Verdict] = []
    time_on = config.time_regression != "off"
    for m in run.measurements:
        points = finder.points(m.case_id) if finder.seen_anywhere(m.case_id) else []
        budgets = budgets_for(config.budgets, m, run.environment)
        touched = [ch for ch in changes if ch.workload in (m.workload, m.case_id)]
        ok_runs = sum(p.status == "ok" for p in points)
        c = _Case(m, points, budgets, ok_runs < config.min_baseline_runs, touched)
        other = None
        if not points and finder.seen_anywhere(m.case_id):
            p = finder.other_env(m.case_id)
            if p is not None:
                if p.env_id not in env_cache:
                    env_cache[p.env_id] = store.get_environment(p.env_id)
                old = env_cache[p.env_id]
                other = (p, environment_diff(old, run.environment) if old else [])
        for metric, b in budgets.items():
            if metric_value(m, metric) is None and m.status == "ok":
                notes.append(f"{m.case_id}: budget on {metric} ({format_size(b.limit_bytes)}) "
                             f"not checked: {metric} was not measured on this run")
        verdicts.extend(_judge_case(c, config, base, other, time_on))
    if not run.measurements:
        raise StoreError(f"run {run.run_id} has no measurements to check")
    missing = sorted((finder.newest_cases() or set()) - {m.case_id for m in run.measurements})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        notes.append(f"{len(missing)} case(s) of the newest baseline run are not in this run "
                     f"(removed, or left out with -k/--shard), so not checked: {shown}")
    return CheckResult(
        case_runs=owners,
        run_id=run.run_id, commit=run.git.commit, branch=run.git.branch,
        started_at=run.started_at, fingerprint=run.environment.fingerprint, base_branch=base,
        merge_base=finder.merge_base, baseline_mode=finder.mode, verdicts=tuple(verdicts),
        budget_changes=tuple(changes), notes=tuple(notes),
        checked_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


_VERDICT_COLUMNS = ("run_id", "case_id", "workload", "metric", "kind", "blocking", "provisional",
                    "baseline_value", "spread", "factor", "floor", "threshold",
                    "candidate_value", "delta", "delta_pct", "budget_bytes", "budget_reason",
                    "baseline_runs", "message", "checked_at", "context", "accepted_reason",
                    "component", "component_delta", "level_commit")


def save_verdicts(store: Store, result: CheckResult) -> int:
    """Record the verdicts (replacing earlier ones of the same run) in one transaction."""
    if store.readonly:
        raise StoreError(f"{store.path}: opened read-only, cannot record verdicts")
    rows = [
        (result.case_runs.get(v.case_id, result.run_id), v.case_id, v.workload, v.metric,
         v.kind, int(v.blocking), int(v.provisional), v.baseline_value, v.spread, v.factor,
         v.floor, v.threshold,
         v.candidate_value, v.delta, v.delta_pct, v.budget_bytes, v.budget_reason,
         v.baseline_runs, v.message, result.checked_at, v.context, v.accepted_reason,
         v.component, v.component_delta, v.level_commit)
        for v in result.verdicts
    ]
    conn = store.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        for run_id in sorted({result.run_id, *result.case_runs.values()}):
            conn.execute("delete from verdicts where run_id = ?", [run_id])
        conn.executemany(
            f"insert into verdicts ({', '.join(_VERDICT_COLUMNS)}) "
            f"values ({', '.join('?' for _ in _VERDICT_COLUMNS)})", rows)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(rows)


__all__ = [
    "FLOORS",
    "KINDS",
    "MEMORY_METRICS",
    "BudgetChange",
    "CheckResult",
    "Verdict",
    "baseline_spread",
    "budget_changes",
    "budgets_for",
    "check",
    "default_budget_metric",
    "environment_diff",
    "find_candidate",
    "headroom",
    "metric_value",
    "repeat_spread",
    "save_verdicts",
    "suggest_budget",
]
