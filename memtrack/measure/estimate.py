"""Estimates: a case's tensor-memory peak predicted under fake tensors, without a GPU.

Each case runs in a fresh process (`memtrack.worker.estimate`, with the case's timeout):
setup, the warm-up and one measured step under `FakeTensorMode`, counted by the same tensor
tracker as the measured CPU view. The result is a `RunRecord` like a measured run's (git,
environment), whose measurements have `kind = "estimate"` and framework
`fake-tensor-estimate`: the predicted peak is `peak_allocated_bytes`, broken down into the
same categories. Estimates are never baselines, budget figures or history points. This
module does not import torch.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from memtrack.config import Config
from memtrack.errors import ConfigError
from memtrack.measure.launcher import launch, new_spec
from memtrack.measure.outcome import case_status, figures
from memtrack.measure.suite import ProgressFn, each_case, probe_environment, resolve_device
from memtrack.records import Environment, Measurement, RunRecord
from memtrack.records.breakdown import with_breakdown
from memtrack.records.redact import redact
from memtrack.workload.context import DTYPES
from memtrack.workload.registry import Case

WORKER = "memtrack.worker.estimate"
FRAMEWORK = "fake-tensor-estimate"
DEVICES = ("cpu", "cuda")
MEASURED_STEPS = 1
"""Fake tensors are deterministic: one measured step after the warm-up is the peak."""
NOTE = (
    "estimate under fake tensors: live tensor bytes by the measured view's definition; "
    "no allocator rounding or segments, workspaces or CUDA context"
)


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
    env: Environment | None = None,
) -> RunRecord:
    """Estimate every case for `device` ('cpu' or 'cuda'; None: the config's device, 'auto'
    resolved as `memtrack run` does) and `dtype` (overrides each case's dtype param; None
    keeps them). Returns the run (the caller stores it): one Measurement per case, of kind
    'estimate'; a case that cannot be faked has status 'error' and says what could not be."""
    device = check_device(device)
    dtype = check_dtype(dtype)
    cases = with_dtype(cases, dtype)
    env = env or probe_environment()
    target = device or resolve_device(config, env)
    return each_case(
        config, cases, lambda case: estimate_case(config, case, target), env=env, progress=progress
    )


def estimate_case(config: Config, case: Case, device: str) -> Measurement:
    """One case's estimate, in a fresh process with the case's timeout."""
    warmup, _, timeout_s = config.settings_for(case.workload)
    # At least one warm-up: lazily made state (an optimizer's) is part of the peak.
    warmup = max(1, warmup)
    with tempfile.TemporaryDirectory(prefix="memtrack-estimate-") as tmp:
        spec = new_spec(config, case, device, warmup, MEASURED_STEPS, Path(tmp) / "result.json")
        (outcome,), _ = launch([spec], timeout_s, worker=WORKER)
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
        notes=tuple(redact(n) or "" for n in (*r.notes, NOTE)),
        kind="estimate",
        **figures(r),
    )
    return with_breakdown(m)


__all__ = ["check_device", "check_dtype", "estimate_case", "estimate_cases", "with_dtype"]
