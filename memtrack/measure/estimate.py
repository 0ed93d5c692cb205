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
import json
import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.errors import ConfigError
from memtrack.machine import environment, provenance
from memtrack.measure.runner import (
    PINNED_ENV,
    _execute,
    _now,
    case_spec,
    resolve_device,
    signal_name,
)
from memtrack.records.breakdown import with_breakdown
from memtrack.records.model import Environment, Measurement, RunRecord
from memtrack.records.redact import redact
from memtrack.workload.context import _DTYPES
from memtrack.workload.registry import Case, suite_hash

WORKER = "memtrack.worker.estimate"
FRAMEWORK = "fake-tensor-estimate"
DEVICES = ("cpu", "cuda")
MEASURED_STEPS = 1
"""Fake tensors are deterministic: one measured step after the warm-up is the peak."""
NOTE = ("estimate under fake tensors: live tensor bytes by the measured view's definition; "
        "no allocator rounding or segments, workspaces or CUDA context")

ProgressFn = Callable[[str, Case, "Measurement | None"], None]
"""Called with ('start', case, None) and ('done', case, measurement)."""


def check_device(device: str | None) -> str | None:
    """The target device, refused unless it is cpu or cuda."""
    if device is not None and device not in DEVICES:
        raise ConfigError(f"--device: {device!r} is not one of {', '.join(DEVICES)}")
    return device


def check_dtype(dtype: str | None) -> str | None:
    """The dtype's canonical name ('bf16' -> 'bfloat16'), refused unless memtrack knows it."""
    if dtype is None:
        return None
    if dtype not in _DTYPES:
        raise ConfigError(f"--dtype: {dtype!r} is not one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


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
    started = _now()
    for name, value in PINNED_ENV.items():
        os.environ.setdefault(name, value)
    env = env or environment.probe()
    target = device or resolve_device(config, env)
    git = provenance.git_info(config.root, config.base_branch)
    measurements = []
    for case in cases:
        if progress:
            progress("start", case, None)
        m = estimate_case(config, case, target)
        measurements.append(m)
        if progress:
            progress("done", case, m)
    return RunRecord(
        run_id=uuid.uuid4().hex,
        started_at=started,
        finished_at=_now(),
        git=git,
        ci=provenance.ci_info(),
        environment=env,
        suite_hash=suite_hash(cases, config),
        config_path=str(config.path) if config.path else None,
        measurements=tuple(measurements),
    )


def estimate_case(config: Config, case: Case, device: str) -> Measurement:
    """One case's estimate, in a fresh process with the case's timeout."""
    warmup, _, timeout_s = config.settings_for(case.workload)
    # At least one warm-up: lazily made state (an optimizer's) is part of the peak.
    warmup = max(1, warmup)
    with tempfile.TemporaryDirectory(prefix="memtrack-estimate-") as tmp:
        result_path = Path(tmp) / "result.json"
        spec = {**case_spec(config, case, device, warmup, MEASURED_STEPS),
                "result_path": str(result_path)}
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        outcome = _execute(spec_path, result_path, timeout_s, device, config.nvml_interval_s,
                           worker=WORKER, sample=False)
    d = outcome.data
    status, message = d.get("status", "running"), d.get("message")
    if outcome.timed_out:
        status, message = "timeout", f"timed out after {timeout_s:g} s in phase {d.get('phase')!r}"
    elif status == "running":
        rc = outcome.returncode or 0
        status = "crashed"
        message = (f"killed by {signal_name(-rc)}" if rc < 0 else f"exited with status {rc}")
        message += f" in phase {d.get('phase')!r}"
        if outcome.stderr_tail.strip():
            message += ": " + outcome.stderr_tail.strip().splitlines()[-1][:500]
    figures: dict[str, Any] = {k: d[k] for k in _FIGURES if d.get(k) is not None}
    if "allocated_samples" in figures:
        figures["allocated_samples"] = tuple(figures["allocated_samples"])
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
        traceback=redact(d.get("traceback")),
        duration_s=round(outcome.duration_s, 4),
        notes=tuple(redact(n) or "" for n in (*d.get("notes", []), NOTE)),
        kind="estimate",
        **figures,
    )
    return with_breakdown(m)


_FIGURES = ("framework", "peak_allocated_bytes", "persistent_bytes", "allocated_samples",
            "categories")


__all__ = ["check_device", "check_dtype", "estimate_case", "estimate_cases", "with_dtype"]
