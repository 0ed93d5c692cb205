"""Budgets: absolute ceilings from the config, each with its reason; the VRAM each device
holds; and the budget changes a revision makes (raising one is a reviewed change)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from memtrack.config import Budget, Config, config_from_text
from memtrack.errors import ConfigError
from memtrack.judge.verdict import Verdict
from memtrack.machine.provenance import git_output
from memtrack.records import Environment, Measurement, metrics, peak_rank
from memtrack.units import format_size


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
        where = (
            self.workload
            + (f" ({self.metric})" if self.metric else "")
            + (f" on {self.gpu}" if self.gpu else "")
        )
        return (
            f"budget {self.change}: {where} {format_size(self.old_bytes)} -> "
            f"{format_size(self.new_bytes)} ({self.reason})"
        )


def default_budget_metric(m: Measurement) -> str:
    """The device view where measured, else reserved, else allocated."""
    return metrics.default_budget_metric(lambda name: metrics.value(m, name))


def choose_budgets(
    budgets: Iterable[Budget],
    workload: str,
    case_id: str,
    on_cpu: bool,
    gpu_names: Iterable[str],
    default_metric: str,
) -> dict[str, Budget]:
    """The rule: the budget that applies to each metric of a case is the most specific one (a
    case id over a workload name, a GPU model, or 'cpu' for a CPU case, over any), the
    tighter on a tie. The gate and the dashboard both call this."""
    names = {g.lower() for g in gpu_names}
    chosen: dict[str, tuple[tuple[int, int, int], Budget]] = {}
    for b in budgets:
        if b.workload not in (workload, case_id):
            continue
        if b.gpu is not None and not (
            b.gpu.lower() in names and not on_cpu or b.gpu.lower() == "cpu" and on_cpu
        ):
            continue
        metric = b.metric or default_metric
        rank = (int(b.workload == case_id), int(b.gpu is not None), -b.limit_bytes)
        if metric not in chosen or rank > chosen[metric][0]:
            chosen[metric] = (rank, b)
    return {metric: b for metric, (_, b) in chosen.items()}


def budgets_for(budgets: Sequence[Budget], m: Measurement, env: Environment) -> dict[str, Budget]:
    """The budget that applies to each metric of a case (see choose_budgets)."""
    gpu_names = [g.name for g in env.gpus if g.name]  # None: NVML would not say
    chosen = choose_budgets(
        budgets, m.workload, m.case_id, m.device == "cpu", gpu_names, default_budget_metric(m)
    )
    if m.budget_bytes is not None and m.budget_metric is not None:
        # a test's own mark: the budget nearest to it, which pytest held it to too
        chosen[m.budget_metric] = Budget(
            m.case_id, m.budget_bytes, TEST_BUDGET_REASON, metric=m.budget_metric
        )
    return chosen


TEST_BUDGET_REASON = "the test's memory_budget mark"


def budget_changes(
    config: Config, root: Path, rev: str | None
) -> tuple[list[BudgetChange], str | None]:
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
    if git_output(root, "rev-parse", "--verify", "--quiet", revs=(f"{rev}^{{commit}}",)) is None:
        note = (
            f"budget changes not checked: {rev} is not in this clone (shallow?), so the "
            "config cannot be compared with the base's"
        )
        return [], None if quiet else note
    text = git_output(root, "show", revs=(f"{rev}:{rel}",))
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
        change = (
            "added"
            if a is None
            else "removed"
            if b is None
            else "raised"
            if b.limit_bytes > a.limit_bytes
            else "lowered"
        )
        ref = b or a
        assert ref is not None
        out.append(
            BudgetChange(
                ref.workload,
                ref.metric,
                ref.gpu,
                change,
                a.limit_bytes if a else None,
                b.limit_bytes if b else None,
                ref.reason,
            )
        )
    return out, None


def budget_part(value: int, budget: Budget | None, memory: tuple[int, str] | None = None) -> str:
    """The budget's words in a verdict; `memory` is the VRAM of the device holding the peak
    (device_memory): a peak above it cannot be within any budget."""
    if budget is None:
        return ""
    margin = budget.limit_bytes - value
    state = f"margin {format_size(margin)}" if margin >= 0 else f"OVER by {format_size(-margin)}"
    if memory is not None and margin >= 0 and value > memory[0]:
        state += (
            f", but above the {format_size(memory[0])} of {memory[1]}: it cannot be within budget"
        )
    return f"; budget {format_size(budget.limit_bytes)} ({budget.reason}): {state}"


PER_DEVICE = tuple(x.name for x in metrics.METRICS.values() if x.per_device)
"""Metrics whose figure is one device's: budgets on them are per-device limits."""


def device_memory(m: Measurement, metric: str) -> tuple[int, str] | None:
    """The memory of the GPU that holds a case's per-device figure, and its name in words
    ('device 1 (NVIDIA H200)'); None where that device or its memory is not known."""
    if m.device != "cuda" or metric not in PER_DEVICE:
        return None
    if m.ranks:
        rank = peak_rank(m, metric)
        if rank is None or not rank.device.startswith("cuda:"):
            return None
        index = int(rank.device.split(":")[1])
        held = [d for d in m.devices if d.index == index]
    elif metric == "device":
        held = [max(m.devices, key=lambda d: d.peak_process_bytes or 0)] if m.devices else []
    else:  # one process: its framework figures are of its one device
        held = list(m.devices) if len(m.devices) == 1 else []
    total = held[0].total_bytes if held else None
    if not total:
        return None
    return total, f"device {held[0].index} ({held[0].name or '?'})"


def rank_part(m: Measurement, metric: str) -> str:
    """Which rank a multi-rank case's figure is of, in a verdict: devices do not pool."""
    if not m.ranks:
        return ""
    if metrics.METRICS[metric].ranks_summed:
        return f"; summed over {len(m.ranks)} ranks (they share the host)"
    rank = peak_rank(m, metric)
    if rank is None:
        return ""
    return f"; largest per-device peak, rank {rank.rank} (device {rank.device})"


def vram_verdict(v: Verdict, m: Measurement) -> Verdict:
    """Does peak plus the observed variation fit each device's VRAM? Devices do not pool."""
    if v.threshold is not None and v.baseline_value is not None:
        room = v.threshold - v.baseline_value
    else:
        room = float(metrics.FLOORS["device"])
    lines, worst = [], None
    for d in m.devices:
        if d.peak_process_bytes is None or not d.total_bytes:
            continue
        need = d.peak_process_bytes + room
        margin = d.total_bytes - need
        fit = f"fits, margin {format_size(int(margin))}" if margin >= 0 else "does NOT fit"
        lines.append(
            f"device {d.index} ({d.name or '?'}): peak "
            f"{format_size(d.peak_process_bytes)} + headroom {format_size(int(room))} "
            f"of {format_size(d.total_bytes)} VRAM: {fit}"
        )
        if worst is None or margin < worst[0]:
            worst = (margin, d)
    if worst is None:
        return v
    margin, d = worst
    details = v.details + tuple(lines)
    if margin >= 0:
        return replace(
            v,
            details=details,
            message=v.message + f"; fits VRAM of device {d.index} "
            f"with {format_size(int(margin))} to spare",
        )
    if v.kind == "over_budget":
        return replace(v, details=details)
    return replace(
        v,
        kind="over_budget",
        blocking=True,
        details=details,
        budget_bytes=d.total_bytes,
        budget_reason=f"VRAM of device {d.index} ({d.name})",
        message=v.message + f"; peak + headroom does NOT fit the "
        f"{format_size(d.total_bytes)} VRAM of device {d.index} ({d.name})",
    )


__all__ = [
    "PER_DEVICE",
    "BudgetChange",
    "budget_changes",
    "budget_part",
    "budgets_for",
    "default_budget_metric",
    "device_memory",
    "rank_part",
    "vram_verdict",
]
