"""Budgets: absolute ceilings from the config, each with its reason, and the VRAM each device
holds. (The budget changes a revision makes are read from git by memtrack.judge.gather.)"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import replace

from memtrack.config import Budget, Config
from memtrack.errors import ConfigError
from memtrack.judge.verdict import BudgetUse, DeviceFit, RankPeak, Verdict
from memtrack.records import Environment, Measurement, metrics, peak_rank


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


def budget_use(m: Measurement, metric: str, budget: Budget | None) -> BudgetUse | None:
    """The budget that applies to a figure, with the memory of the device that holds it."""
    if budget is None:
        return None
    memory = device_memory(m, metric)
    return BudgetUse(
        budget.limit_bytes,
        budget.reason,
        memory[0] if memory else None,
        memory[1] if memory else None,
    )


def rank_peak(m: Measurement, metric: str) -> RankPeak | None:
    """Which rank a multi-rank case's figure is of: devices do not pool."""
    if not m.ranks:
        return None
    if metrics.METRICS[metric].ranks_summed:
        return RankPeak(len(m.ranks), summed=True)
    rank = peak_rank(m, metric)
    if rank is None:
        return RankPeak(len(m.ranks))
    return RankPeak(len(m.ranks), rank.rank, rank.device)


def fits(m: Measurement, room: float) -> tuple[DeviceFit, ...]:
    """Each device's peak plus the headroom against its VRAM: devices do not pool."""
    return tuple(
        DeviceFit(d.index, d.name, d.peak_process_bytes, room, d.total_bytes)
        for d in m.devices
        if d.peak_process_bytes is not None and d.total_bytes
    )


def vram_verdict(v: Verdict, m: Measurement) -> Verdict:
    """The device view: does its peak plus the observed variation fit each device's VRAM?
    Over a device's VRAM, it is over budget (that device's memory is the limit)."""
    room = v.room if v.room is not None else float(metrics.FLOORS["device"])
    found = fits(m, room)
    if not found:
        return v
    worst = min(found, key=lambda f: f.margin)
    if worst.margin >= 0 or v.kind == "over_budget":
        return replace(v, fits=found)
    vram = BudgetUse(worst.total_bytes, f"VRAM of device {worst.index} ({worst.name})", vram=True)
    return replace(v, fits=found, kind="over_budget", blocking=v.context != "base", budget=vram)


__all__ = [
    "PER_DEVICE",
    "budget_use",
    "budgets_for",
    "check_budget_targets",
    "choose_budgets",
    "default_budget_metric",
    "device_memory",
    "fits",
    "rank_peak",
    "vram_verdict",
]
