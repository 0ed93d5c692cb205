"""The records memtrack writes: frozen dataclasses, serialised to versioned JSON.

A `RunRecord` is one `memtrack run`: where it ran (git, CI, environment) and one
`Measurement` per workload case. Bytes are ints, times are seconds; a figure that was
not measured is None, never 0.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrack.errors import RecordError

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "error", "timeout", "crashed")


@dataclass(frozen=True)
class GitInfo:
    """The commit a run measured."""

    commit: str | None = None
    """Full SHA of HEAD, or None outside a git repository."""
    branch: str | None = None
    """Branch name; None on a detached HEAD (CI fills it from GITHUB_HEAD_REF/REF_NAME)."""
    parent: str | None = None
    """First parent's SHA; None for a root commit or a shallow clone's boundary."""
    subject: str | None = None
    """First line of the commit message."""
    committed_at: str | None = None
    """Commit time, ISO 8601 UTC."""
    dirty: bool | None = None
    """True when tracked files differ from HEAD: the figures are not of that commit alone."""
    base_branch: str | None = None
    """The configured base branch."""
    merge_base: str | None = None
    """Merge-base of HEAD with the base branch; None when it cannot be found."""
    shallow: bool = False
    """The clone is shallow: history and merge-base may be incomplete."""
    notes: tuple[str, ...] = ()
    """Why a field is missing, in plain words."""


@dataclass(frozen=True)
class CIInfo:
    """The CI job that made the run, from GitHub Actions variables when present."""

    provider: str | None = None
    """'github-actions', or None outside CI."""
    event: str | None = None
    """GITHUB_EVENT_NAME: push, pull_request, workflow_dispatch, ..."""
    ref: str | None = None
    """GITHUB_REF."""
    sha: str | None = None
    """GITHUB_SHA (for pull_request events, the merge commit GitHub made)."""
    pr_number: int | None = None
    """Pull request number, from GITHUB_REF refs/pull/N/merge."""
    base_ref: str | None = None
    """GITHUB_BASE_REF: the PR's target branch."""
    head_ref: str | None = None
    """GITHUB_HEAD_REF: the PR's source branch."""
    run_url: str | None = None
    """Link to the workflow run."""
    runner_name: str | None = None
    """RUNNER_NAME."""


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU."""

    index: int
    """CUDA device index as torch numbers it (NVML's when torch cannot start CUDA)."""
    name: str | None
    """Marketing name, e.g. 'NVIDIA H200'; None when the query failed (see the notes)."""
    uuid: str | None
    """GPU UUID: devices are matched by it between torch and NVML."""
    total_bytes: int | None
    """Device memory torch can use: its `total_memory` (NVML's total less driver-reserved
    memory when torch cannot start CUDA)."""
    compute_capability: str | None
    """e.g. '9.0'."""
    mig_mode: str | None = None
    """'enabled', 'disabled', 'instance' (a MIG instance) or None when NVML cannot say."""


@dataclass(frozen=True)
class Environment:
    """What the run ran on. `fingerprint` hashes only what changes memory figures."""

    fingerprint: str
    """Hash of the confounders: GPU models and count, driver, CUDA, cuDNN, torch, Python,
    device kind and the memory-relevant variables (CUDA_VISIBLE_DEVICES aside: the visible
    GPUs' models stand for it). Baselines compare equal fingerprints."""
    gpus: tuple[GpuInfo, ...] = ()
    driver: str | None = None
    cuda_runtime: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    torch: str | None = None
    torch_cuda_arch_list: tuple[str, ...] = ()
    python: str | None = None
    os: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    host_ram_bytes: int | None = None
    packages: dict[str, str] = field(default_factory=dict)
    """Versions of the memory-relevant packages that are installed."""
    env_vars: dict[str, str] = field(default_factory=dict)
    """Allowlisted memory-relevant variables only (PYTORCH_CUDA_ALLOC_CONF, ...)."""
    cuda_available: bool | None = None
    """Whether torch could start CUDA; None in records made before it was asked."""
    cuda_device_count: int | None = None
    """How many CUDA devices torch sees (after CUDA_VISIBLE_DEVICES)."""
    visible_uuids: tuple[str, ...] = ()
    """UUIDs of the devices torch sees, in torch's order: the devices the sampler watches."""
    cuda_unavailable_reason: str | None = None
    """torch's own words when it cannot start CUDA (driver too old, no device, CPU build)."""
    notes: tuple[str, ...] = ()
    """Queries that failed (e.g. NVML memory info without privileges), in plain words."""


@dataclass(frozen=True)
class DeviceMeasurement:
    """One GPU's figures for one case."""

    index: int
    uuid: str | None
    name: str | None
    total_bytes: int | None
    """VRAM of this device that the process can use (torch's total_memory; else NVML's total
    less driver-reserved memory)."""
    used_before_bytes: int | None = None
    """Device-wide used memory before the case started (other processes, leftovers)."""
    peak_device_used_bytes: int | None = None
    """NVML device-wide used memory, sampled peak during the case."""
    peak_process_bytes: int | None = None
    """NVML per-process used memory of the case's process, sampled peak."""
    process_view: str | None = None
    """'pid' when the process was matched by PID; 'device-delta' when PIDs did not match
    (containers) and the process figure is device peak minus used-before."""
    peak_allocated_bytes: int | None = None
    """torch allocator, this device."""
    peak_reserved_bytes: int | None = None
    """torch allocator, this device."""
    samples: int | None = None
    """How many NVML samples were taken."""
    memory_pass_peak_bytes: int | None = None
    """The process view's peak within the memory pass only, the window the allocator's
    peaks cover; None when no sample fell inside it. Workspace is this minus reserved."""


@dataclass(frozen=True)
class Measurement:
    """One workload case, measured in its own process."""

    workload: str
    case_id: str
    """'workload[k=v,...]' with params sorted: the identity of a series."""
    params: dict[str, Any]
    seed: int
    device: str
    """'cpu' or 'cuda', as the case ran."""
    dtype: str | None
    warmup: int
    repeats: int
    status: str
    """ok | oom | error | timeout | crashed"""
    message: str | None = None
    """The error's message (last traceback line, signal name, or timeout)."""
    traceback: str | None = None
    framework: str | None = None
    """Which framework view: 'cuda-caching-allocator' or 'memtracker' (CPU)."""
    peak_allocated_bytes: int | None = None
    """Framework peak of live tensor memory during the measured iterations."""
    peak_reserved_bytes: int | None = None
    """CUDA only: peak held by the caching allocator (segments)."""
    peak_requested_bytes: int | None = None
    """CUDA only: peak that callers asked for, before the allocator's rounding."""
    persistent_bytes: int | None = None
    """Framework memory at the mark (end of setup): weights and other persistent state."""
    allocated_samples: tuple[int, ...] = ()
    """Framework peak of each measured iteration: the within-run repeat spread."""
    num_alloc_retries: int | None = None
    """CUDA: cache flush-and-retry events; non-zero means the run was at the edge."""
    num_ooms: int | None = None
    host_peak_rss_bytes: int | None = None
    """Exact peak RSS of the case's process over the whole case (setup included)."""
    host_step_peak_rss_bytes: int | None = None
    """Exact peak RSS over the measured iterations only."""
    host_peak_source: str | None = None
    """'vmhwm' (reset via /proc/self/clear_refs) or 'ru_maxrss' (not resettable)."""
    device_view: str | None = None
    """'nvml' when NVML sampled the case; else None and `device_view_note` says why."""
    device_view_note: str | None = None
    sample_interval_s: float | None = None
    """NVML sampling interval."""
    devices: tuple[DeviceMeasurement, ...] = ()
    weights_bytes: int | None = None
    intermediates_bytes: int | None = None
    """Activations and temporaries: framework peak minus the other categories."""
    caches_bytes: int | None = None
    """Request-sized state the workload tagged (KV cache, ...)."""
    training_state_bytes: int | None = None
    """Gradients and optimizer state."""
    workspace_bytes: int | None = None
    """Device view minus framework reserved (context, cuBLAS/cuDNN, non-torch)."""
    categories: dict[str, int] = field(default_factory=dict)
    """MemTracker's peak snapshot by category (Parameter, Gradient, Optstate, ...)."""
    iteration_times_s: tuple[float, ...] = ()
    """Per-iteration wall times of the uninstrumented timing pass (synchronised on CUDA)."""
    time_median_s: float | None = None
    time_p95_s: float | None = None
    time_min_s: float | None = None
    duration_s: float | None = None
    """Wall time of the whole case, process start to end."""
    notes: tuple[str, ...] = ()
    gradients_bytes: int | None = None
    """Gradients alive at the framework peak (part of `training_state_bytes`)."""
    optimizer_state_bytes: int | None = None
    """Optimizer state (e.g. AdamW's two moments) at the framework peak."""
    unattributed_bytes: int | None = None
    """Framework peak that no category explains (weights + caches + gradients + optimizer
    state + intermediates + this = peak); None where no category breakdown was taken."""
    host_setup_rss_bytes: int | None = None
    """RSS when the timing pass starts (after setup and warm-up): the level the step starts
    from. `host_step_peak_rss_bytes` minus this is the step's own host growth."""
    host_file_rss_bytes: int | None = None
    """File-backed and shared resident pages (RssFile + RssShmem: libraries, mapped files)
    at the end of the timing pass. They are reclaimable and follow the page cache, not the
    code, so the `host` metric leaves them out."""
    host_tree_peak_rss_bytes: int | None = None
    """Host peak of the case's whole process tree (the worker and every process it started):
    exact from a cgroup v2 `memory.peak` (page cache charged to it included), else a lower
    bound from samples of the processes' RSS and their own high-water marks."""
    host_tree_source: str | None = None
    """'cgroup' or 'process-group samples (lower bound)'; None when not measured."""


def device_peak(m: Measurement) -> int | None:
    """Largest per-device process peak (devices do not pool)."""
    peaks = [d.peak_process_bytes for d in m.devices if d.peak_process_bytes is not None]
    return max(peaks) if peaks else None


def host_peak(m: Measurement) -> int | None:
    """The `host` metric: peak RSS over setup, warm-up and the timing pass, less the
    file-backed pages (a lower bound of the anonymous peak: file pages only grow)."""
    if m.host_peak_rss_bytes is None or m.host_file_rss_bytes is None:
        return None
    return max(0, m.host_peak_rss_bytes - m.host_file_rss_bytes)


def host_step(m: Measurement) -> int | None:
    """The `host_step` metric: the timing pass's peak RSS above the level it started from."""
    if m.host_step_peak_rss_bytes is None or m.host_setup_rss_bytes is None:
        return None
    return max(0, m.host_step_peak_rss_bytes - m.host_setup_rss_bytes)


def memory_pass_peak(m: Measurement) -> int | None:
    """Largest per-device process peak within the memory pass (the allocator's window)."""
    peaks = [d.memory_pass_peak_bytes for d in m.devices if d.memory_pass_peak_bytes is not None]
    return max(peaks) if peaks else None


@dataclass(frozen=True)
class RunRecord:
    """One `memtrack run`: its context and its measurements."""

    run_id: str
    started_at: str
    """ISO 8601 UTC."""
    finished_at: str | None
    git: GitInfo
    ci: CIInfo
    environment: Environment
    suite_hash: str
    """Hash of the suite's definition (workloads, params, counts)."""
    config_path: str | None
    measurements: tuple[Measurement, ...]
    shard: str | None = None
    """'i/n' when this run holds one shard of the suite."""
    schema_version: int = SCHEMA_VERSION


def to_dict(obj: Any) -> Any:
    """A record as plain JSON-able data (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object, got {type(data).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(names)
    if unknown:
        raise RecordError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        nested = _NESTED.get((cls, name))
        if nested is not None and value is not None:
            if isinstance(value, list):
                value = tuple(
                    _build(nested, v, f"{where}.{name}[{i}]") for i, v in enumerate(value)
                )
            else:
                value = _build(nested, value, f"{where}.{name}")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise RecordError(f"{where}: {exc}") from None


_NESTED: dict[tuple[type, str], type] = {
    (RunRecord, "git"): GitInfo,
    (RunRecord, "ci"): CIInfo,
    (RunRecord, "environment"): Environment,
    (RunRecord, "measurements"): Measurement,
    (Environment, "gpus"): GpuInfo,
    (Measurement, "devices"): DeviceMeasurement,
}


def run_from_dict(data: Any, *, where: str = "record") -> RunRecord:
    """Rebuild a RunRecord from `to_dict` output, checking the schema version."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(
            f"{where}: schema_version {version!r} is not supported (expected {SCHEMA_VERSION})"
        )
    run = _build(RunRecord, data, where)
    for m in run.measurements:
        if m.status not in STATUSES:
            raise RecordError(f"{where}: measurement {m.case_id!r} has unknown status {m.status!r}")
    return run


def write_json(run: RunRecord, path: Path) -> None:
    """Write atomically: a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_dict(run), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def read_json(path: Path) -> RunRecord:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: not valid JSON ({exc})") from None
    return run_from_dict(data, where=str(path))
