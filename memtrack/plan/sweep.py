"""A measured sweep of one param of one case, turned into a plan: which case, which points,
which figure must fit, and which headroom is justified (see memtrack.plan.fit for the fit)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.errors import ConfigError
from memtrack.plan.fit import Gpu, Headroom, Number, Plan, plan
from memtrack.records import Measurement, RunRecord, metrics
from memtrack.store.database import Store
from memtrack.units import format_size
from memtrack.workload.registry import Case, Workload, case_id, split_case_id

PACKAGED_CATALOG = Path(__file__).parent / "gpus.toml"
"""The GPU catalog shipped with memtrack (the repository's data/gpus.toml is the same file)."""


def default_catalog(config: Config) -> Path:
    """data/gpus.toml next to the config where there is one (a team's own list), else the
    catalog shipped in the package."""
    local = config.root / "data" / "gpus.toml"
    return local if local.is_file() else PACKAGED_CATALOG


def find_case(
    workloads: Sequence[Workload], name: str, param: str | None = None
) -> tuple[Workload, dict[str, Any]]:
    """The workload and params a plan starts from: a case id, or a workload name whose grid
    has one case once the swept `param` and the params pinned in brackets are set aside
    (`unet[dtype=float32]`: every other param has one value)."""
    for wl in workloads:
        for c in wl.cases():
            if c.case_id == name:
                return wl, dict(c.params)
    base, pins = split_case_id(name) or (name, {})
    for wl in workloads:
        if wl.name != base:
            continue
        pinned = _pinned(wl, name, pins)
        others = {k: v for k, v in wl.params.items() if k != param and k not in pinned}
        grid = [k for k, v in others.items() if len(v) > 1]
        if grid:
            ids = sorted(
                {
                    case_id(wl.name, {**c.params, **({param: "..."} if param else {})})
                    for c in wl.cases()
                }
            )
            raise ConfigError(
                f"{name}: has several cases ({', '.join(grid)} vary); name one "
                f"of: {', '.join(ids[:6])}{' ...' if len(ids) > 6 else ''}"
            )
        return wl, {k: pinned.get(k, v[0]) for k, v in wl.params.items()}
    known = sorted({w.name for w in workloads})
    raise ConfigError(f"{name}: no such workload or case (workloads: {', '.join(known)})")


def _pinned(wl: Workload, name: str, pins: dict[str, str]) -> dict[str, Any]:
    """The declared values that `name`'s bracketed params pin, by their spelling in a case
    id; ConfigError for a param the workload lacks or a value it does not declare."""
    out: dict[str, Any] = {}
    for key, text in pins.items():
        if key not in wl.params:
            raise ConfigError(
                f"{name}: {wl.name} has no param {key!r} (params: {', '.join(sorted(wl.params))})"
            )
        match = [v for v in wl.params[key] if str(v) == text]
        if not match:
            raise ConfigError(
                f"{name}: {key}={text} is not one of the declared values "
                f"({', '.join(str(v) for v in wl.params[key])})"
            )
        out[key] = match[0]
    return out


def sweep_cases(
    wl: Workload, params: dict[str, Any], param: str, values: Sequence[Number]
) -> list[Case]:
    """One case per swept value, every other param as in `params`."""
    return [Case(wl.name, {**params, param: v}, wl.seed, wl.module) for v in values]


_METRIC_NOTES = {
    "device": "device view: NVML's per-process peak on the largest device (what the GPU "
    "held, the CUDA context included)",
    "reserved": "framework reserved (the CUDA caching allocator's segments; the device view "
    "was not measured): the CUDA context comes on top",
    "allocated_cuda": "framework allocated (the device view and reserved were not measured): "
    "the allocator's rounding and the CUDA context come on top",
    "allocated_cpu": "framework peak of live tensors, measured on the CPU (MemTracker): on a "
    "GPU the CUDA context (about 300-550 MiB on current GPUs), the "
    "allocator's rounding and workspaces come on top; run the plan on the "
    "GPU for the device view",
}


def choose_metric(ms: Sequence[Measurement]) -> tuple[str, str]:
    """The figure that must fit, as the gate's default budget metric: the device view where
    every point measured it, else reserved, else allocated; and what it means."""
    for metric in metrics.DEFAULT_BUDGET:
        if all(metrics.value(m, metric) is not None for m in ms):
            key = metric
            if metric == "allocated":
                key = "allocated_cpu" if all(m.device == "cpu" for m in ms) else "allocated_cuda"
            return metric, _METRIC_NOTES[key]
    raise ConfigError("no memory figure was measured at every swept value")


def judge_headroom(
    store: Store, run: RunRecord, config: Config, metric: str, ms: Sequence[Measurement]
) -> Headroom | None:
    """The gate's own headroom (memtrack.judge.memory's verdict against the baseline's
    current level), as a share of that baseline, for the swept cases that have one; the
    largest share. None where no swept case has a baseline on the base branch."""
    from memtrack.judge.gather.baseline import BaselineFinder
    from memtrack.judge.memory import Candidate, verdict
    from memtrack.judge.verdict import Headroom as Room

    finder = BaselineFinder(store, run, config.base_branch, config.root, config.baseline_runs)
    best: tuple[float, str] | None = None
    with_baseline = 0
    for m in ms:
        points = finder.points({m.case_id: (m.case_id,)})[m.case_id]
        v = verdict(Candidate(m, points), metric, config)
        if v is None or v.baseline_value is None or not isinstance(v.why, Room):
            continue
        with_baseline += 1
        base, room = v.baseline_value, v.room or 0.0
        share = room / base if base > 0 else 0.0
        if best is None or share > best[0]:
            detail = (
                f"the gate's headroom over the baseline of {m.case_id} "
                f"(median of {v.baseline_runs} run(s) on {config.base_branch}, "
                f"{format_size(int(base))}): max({v.why.factor:g} x spread "
                f"{format_size(int(v.why.spread))}, floor {format_size(int(v.why.floor))}) = "
                f"{format_size(int(room))}, {share:.2%} of it"
            )
            best = (share, detail)
    if best is None:
        return None
    detail = best[1]
    if with_baseline > 1:
        detail += f" (the largest share among the {with_baseline} swept values with a baseline)"
    return Headroom(best[0], "judge", detail)


def _set_in(config: Config, key: str) -> bool:
    """Whether the config file itself sets `key` (else the value is the default)."""
    if config.path is None:
        return False
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(config.path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    table = (
        data.get("tool", {}).get("memtrack", {}) if config.path.name == "pyproject.toml" else data
    )
    return isinstance(table, dict) and key in table


def config_headroom(config: Config, why: str) -> Headroom:
    """plan_headroom, named where it comes from: the config file only where it sets it."""
    where = (
        f"{config.path}: plan_headroom"
        if _set_in(config, "plan_headroom")
        else "plan_headroom (the default"
        + (f", not set in {config.path.name})" if config.path else ")")
    )
    return Headroom(config.plan_headroom, "config", f"{where} = {config.plan_headroom:.0%} ({why})")


def make_plan(
    run: RunRecord,
    config: Config,
    store: Store | None,
    *,
    case: str,
    param: str,
    params: dict[str, Any],
    integer: bool,
    catalog: Sequence[Gpu],
    gpus: Sequence[Gpu],
) -> Plan:
    """The plan of a measured sweep: the points that were measured, the figure that must
    fit, the justified headroom; failed points are named, not fitted."""
    ok = [m for m in run.measurements if m.status == "ok"]
    notes = [
        f"{param}={m.params[param]}: {m.status}: {m.message or ''}".rstrip(": ")
        for m in run.measurements
        if m.status != "ok"
    ]
    if len({m.params[param] for m in ok}) < 2:
        raise ConfigError(
            f"{case}: fewer than 2 swept values measured ok "
            f"({'; '.join(notes) or 'none'}): nothing to fit"
        )
    metric, metric_note = choose_metric(ok)
    if ok and all(m.kind == "estimate" for m in ok):
        metric_note = (
            f"the estimated tensor peak (fake tensors, for {ok[0].device}): no kernel "
            "scratch (never calibrated here: a measured run calibrates only its own "
            "params), allocator rounding or cache, workspace or CUDA context, so a GPU "
            "needs more than this"
        )
    points = sorted((m.params[param], int(metrics.value(m, metric) or 0)) for m in ok)
    room = judge_headroom(store, run, config, metric, ok) if store is not None else None
    if room is None:
        why = (
            "no baseline of these cases on " + config.base_branch
            if store is not None
            else "no database to take a baseline from"
        )
        room = config_headroom(config, why)
    return plan(
        points,
        catalog,
        room,
        case=case,
        param=param,
        metric=metric,
        metric_note=metric_note,
        integer=integer,
        params=params,
        gpus=(*runner_gpus(run, ok), *gpus),
        notes=notes,
    )


def runner_gpus(run: RunRecord, ms: Sequence[Measurement]) -> tuple[Gpu, ...]:
    """Where the sweep ran on a GPU: that GPU with the memory torch can use there (its
    `total_memory`, measured), beside the catalog's nominal figures."""
    if not ms or any(m.device != "cuda" for m in ms):
        return ()
    out: dict[tuple[str, int], Gpu] = {}
    for g in run.environment.gpus:
        if g.name and g.total_bytes:
            out[(g.name, g.total_bytes)] = Gpu(
                f"{g.name} (this runner)", g.total_bytes, f"{format_size(g.total_bytes)} usable"
            )
    return tuple(out.values())


__all__ = [
    "PACKAGED_CATALOG",
    "choose_metric",
    "config_headroom",
    "default_catalog",
    "find_case",
    "judge_headroom",
    "make_plan",
    "runner_gpus",
    "sweep_cases",
]
