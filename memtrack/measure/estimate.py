"""Estimates: a case's tensor-memory peak predicted under fake tensors, without a GPU.

Each case runs in a fresh process (`memtrack.worker.estimate`, with the case's timeout),
forked by the run's fork server as a measured case is (measure.forkserver): setup, the
warm-up and one measured step under `FakeTensorMode`, counted by the same tensor
tracker as the measured CPU view. The result is a `RunRecord` like a measured run's (git,
environment), whose measurements have `kind = "estimate"` and framework
`fake-tensor-estimate`: the predicted peak is `peak_allocated_bytes`, broken down into the
same categories. `calibrate` then adds the kernel scratch that no fake tensor holds, from the
latest measured run of the same case on the same kind of device, where the store has one.
Estimates are never baselines, budget figures or history points. This module does not
import torch.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtrack.config import Config
from memtrack.errors import ConfigError
from memtrack.measure.launcher import launch, new_spec
from memtrack.measure.outcome import case_status, figures, spawn_notes
from memtrack.measure.suite import ProgressFn, RunStart, each_case, resolve_device, start_run
from memtrack.records import Measurement, RunRecord
from memtrack.records.breakdown import with_breakdown
from memtrack.records.redact import redact
from memtrack.units import format_size
from memtrack.worker.protocol import ESTIMATE_WORKER
from memtrack.workload.context import DTYPES
from memtrack.workload.registry import Case

if TYPE_CHECKING:
    from memtrack.measure.forkserver import ForkServer
    from memtrack.store.database import Store

FRAMEWORK = "fake-tensor-estimate"
DEVICES = ("cpu", "cuda")
MEASURED_STEPS = 1
"""Fake tensors are deterministic: one measured step after the warm-up is the peak."""
NOTE = (
    "estimate under fake tensors: live tensor bytes by the measured view's definition; "
    "no allocator rounding or segments or CUDA context, and kernel scratch only as "
    "calibrated from a measured run"
)
EXCLUDED = "excludes kernel scratch"
"""How an estimate's note begins where no measured run calibrated it."""


def check_device(device: str | None) -> str | None:
    """The target device, refused unless it is cpu or cuda."""
    if device is not None and device not in DEVICES:
        raise ConfigError(f"--device: {device!r} is not one of {', '.join(DEVICES)}")
    return device


def check_dtype(dtype: str | None) -> str | None:
    """The dtype's canonical name ('bf16' -> 'bfloat16'), refused unless memtrack knows it."""
    if dtype is None:
        return None
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def with_dtype(cases: list[Case], dtype: str | None) -> list[Case]:
    """The cases with their `dtype` param set to `dtype` (a new case id: the series of that
    precision), each distinct case once."""
    if dtype is None:
        return cases
    out: dict[str, Case] = {}
    for c in cases:
        changed = dataclasses.replace(c, params={**c.params, "dtype": dtype})
        out.setdefault(changed.case_id, changed)
    return list(out.values())


def estimate_cases(
    config: Config,
    cases: list[Case],
    *,
    device: str | None,
    dtype: str | None,
    progress: ProgressFn | None = None,
    start: RunStart | None = None,
) -> RunRecord:
    """Estimate every case for `device` ('cpu' or 'cuda'; None: the config's device, 'auto'
    resolved as `memtrack run` does) and `dtype` (overrides each case's dtype param; None
    keeps them). Returns the run (the caller stores it): one Measurement per case, of kind
    'estimate'; a case that cannot be faked has status 'error' and says what could not be.
    `start`: the run's start (`start_run`), its fork server forking each case; without one,
    the estimate starts its own."""
    device = check_device(device)
    cases = with_dtype(cases, check_dtype(dtype))
    if start is None:
        with start_run(config) as own:
            return _estimate_all(config, cases, device, progress, own)
    return _estimate_all(config, cases, device, progress, start)


def _estimate_all(
    config: Config,
    cases: list[Case],
    device: str | None,
    progress: ProgressFn | None,
    start: RunStart,
) -> RunRecord:
    server = start.server
    server.ready(config)  # the suite imported there, where the caller discovered it itself
    env = start.environment()
    target = device or resolve_device(config, env)
    return each_case(
        config,
        cases,
        lambda case: estimate_case(config, case, target, server),
        env=env,
        progress=progress,
        git=start.git,
        started=start.started_at,
    )


def estimate_case(
    config: Config, case: Case, device: str, server: ForkServer | None = None
) -> Measurement:
    """One case's estimate, in a fresh process with the case's timeout: forked by `server`
    where it forks it, else a new interpreter."""
    warmup, _, timeout_s = config.settings_for(case.workload)
    # At least one warm-up: lazily made state (an optimizer's) is part of the peak.
    warmup = max(1, warmup)
    with tempfile.TemporaryDirectory(prefix="memtrack-estimate-") as tmp:
        spec = new_spec(config, case, device, warmup, MEASURED_STEPS, Path(tmp) / "result.json")
        (outcome,), _ = launch([spec], timeout_s, worker=ESTIMATE_WORKER, server=server)
    r = outcome.result
    status, message = case_status(outcome, timeout_s)
    m = Measurement(
        workload=case.workload,
        case_id=case.case_id,
        params=case.params,
        seed=case.seed,
        device=device,
        dtype=str(case.params.get("dtype", "float32")),
        warmup=warmup,
        repeats=MEASURED_STEPS,
        status=status,
        message=redact(message),
        traceback=redact(r.traceback),
        duration_s=round(outcome.duration_s, 4),
        notes=tuple(redact(n) or "" for n in (*r.notes, *spawn_notes(outcome), NOTE)),
        kind="estimate",
        **figures(r),
    )
    return with_breakdown(m)


def calibrate(run: RunRecord, store: Store | None) -> RunRecord:
    """The estimate run with each estimated case's kernel scratch added, where `store` holds
    a measured run of the same case (its id: the same params, dtype and concurrency) on the
    same kind of device: the CPU, or a GPU of the name this machine's first GPU has. Fake
    tensors count tensors; a kernel's own buffers (oneDNN's convolution scratch on the CPU,
    cuBLAS and cuDNN workspaces on a GPU) are allocated where no fake tensor is, and differ
    by device, so a run of another device kind or of other params never calibrates.

    The scratch is what the latest such run measured beyond the tensors. Of the same code
    (its commit is this estimate's, neither with uncommitted changes) that is its peak less
    this estimate's tensors; of other code, the peak less the tensors its own tracker saw
    at their peak (its unattributed part), so that a change in the tensors since then shows
    in the estimate instead of being calibrated away. A run that saw less than the fake
    tensors adds nothing. Each case's note says which run and how much, or that the
    estimate excludes scratch; `scratch_bytes` and `scratch_run_id` hold it, and the
    estimate without it is `peak_allocated_bytes - scratch_bytes`."""
    gpu = next((g.name for g in run.environment.gpus if g.name), None)
    out = []
    for m in run.measurements:
        if m.kind != "estimate" or m.status != "ok" or m.peak_allocated_bytes is None:
            out.append(m)
            continue
        if m.device == "cuda" and gpu is None:
            source = None
            why = "no GPU on this machine to say whose workspaces to add"
        else:
            source = store.latest_measured(m.case_id, m.device, gpu) if store else None
            where = "the CPU" if m.device == "cpu" else str(gpu)
            why = f"no measured run of this case on {where} to calibrate it from"
        scratch, how = (None, why) if source is None else _scratch(m, source, run)
        if scratch is None or source is None:
            out.append(dataclasses.replace(m, notes=(*m.notes, f"{EXCLUDED}: {how}")))
            continue
        note = (
            f"+{format_size(scratch)} kernel scratch, from run {source['run_id'][:12]} "
            f"({(source['git_commit'] or 'no commit')[:7]}): {how}"
        )
        calibrated = dataclasses.replace(
            m,
            peak_allocated_bytes=m.peak_allocated_bytes + scratch,
            allocated_samples=tuple(x + scratch for x in m.allocated_samples),
            scratch_bytes=scratch,
            scratch_run_id=source["run_id"],
            notes=(*m.notes, note),
        )
        out.append(with_breakdown(calibrated))
    return dataclasses.replace(run, measurements=tuple(out))


def _scratch(m: Measurement, source: dict[str, Any], run: RunRecord) -> tuple[int | None, str]:
    """The scratch to add to estimate `m` from measured figure `source`, and how it was
    found (or why there is none)."""
    peak, tensors = source["peak_allocated_bytes"], m.peak_allocated_bytes or 0
    same_code = (
        source["git_commit"] is not None
        and source["git_commit"] == run.git.commit
        and not source["git_dirty"]
        and not run.git.dirty
    )
    if same_code:
        seen, how = (
            peak - tensors,
            (
                f"its measured peak {format_size(peak)} less these fake tensors' "
                f"{format_size(tensors)}, of the same commit"
            ),
        )
    elif source["unattributed_bytes"] is not None:
        seen = source["unattributed_bytes"]
        how = (
            f"what its measured peak {format_size(peak)} held beyond the tensors it tracked, "
            "of other code"
        )
    else:
        return None, (
            f"the latest measured run {source['run_id'][:12]} is of other code and has no "
            "breakdown to tell its scratch from its tensors"
        )
    if seen < 0:
        return 0, f"{how}: it measured {format_size(-seen)} less, so nothing is added"
    return seen, how


__all__ = [
    "EXCLUDED",
    "calibrate",
    "check_device",
    "check_dtype",
    "estimate_case",
    "estimate_cases",
    "with_dtype",
]
