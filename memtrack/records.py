"""The records memtrack writes: frozen dataclasses, serialised to versioned JSON.

A `RunRecord` is one `memtrack run`: where it ran (git, CI, environment) and one
`Measurement` per workload case. Bytes are ints, times are seconds; a figure that was
not measured is None, never 0.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrack.errors import RecordError
from memtrack.units import parse_time

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "error", "timeout", "crashed")
QUALITY_STATUSES = ("ok", "fail", "error", "none")
KINDS = ("measured", "estimate")


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
class RankMeasurement:
    """One rank of a multi-rank case: its own process, measured on its own device."""

    rank: int
    """The rank in the case's process group (RANK)."""
    device: str
    """Where it ran: 'cpu', or 'cuda:N' with N its LOCAL_RANK, as torch numbers the visible
    devices."""
    status: str
    """ok | oom | error | timeout | crashed: how this rank ended."""
    message: str | None = None
    """Its error, or why memtrack ended it (another rank failed first)."""
    peak_allocated_bytes: int | None = None
    """Framework peak of live tensor memory on this rank's device, memory pass."""
    peak_reserved_bytes: int | None = None
    """CUDA: peak held by the caching allocator on this rank's device."""
    peak_requested_bytes: int | None = None
    """CUDA: peak that callers asked for on this rank's device, before rounding."""
    persistent_bytes: int | None = None
    """Framework memory of this rank at the mark (end of setup)."""
    host_peak_rss_bytes: int | None = None
    """Exact peak RSS of this rank's process over setup, warm-up and the timing pass."""
    host_step_peak_rss_bytes: int | None = None
    """Exact peak RSS of this rank's process over the timing pass."""
    host_setup_rss_bytes: int | None = None
    """This rank's RSS when its timing pass starts."""
    host_file_rss_bytes: int | None = None
    """This rank's file-backed and shared resident pages at the end of its timing pass."""
    time_median_s: float | None = None
    """Median iteration time of this rank's timing pass."""


@dataclass(frozen=True)
class Measurement:
    """One workload case, measured in its own process (or, for a multi-rank case, in one
    process per rank: see `ranks`)."""

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
    """Which framework view: 'cuda-caching-allocator', 'cpu-allocator' (the CPU allocator's
    peak from torch's profiler, MemTracker's categories), or 'memtracker' (CPU: the tensor
    tracker alone, as with concurrent sessions and before this figure was the allocator's)."""
    peak_allocated_bytes: int | None = None
    """Framework peak of live tensor memory during the measured iterations. Of a multi-rank
    case: the largest per-device peak over its ranks (devices do not pool)."""
    peak_reserved_bytes: int | None = None
    """CUDA only: peak held by the caching allocator (segments); of a multi-rank case, the
    largest per-device peak over its ranks."""
    peak_requested_bytes: int | None = None
    """CUDA only: peak that callers asked for, before the allocator's rounding; of a
    multi-rank case, the largest per-device peak over its ranks."""
    persistent_bytes: int | None = None
    """Framework memory at the mark (end of setup): weights and other persistent state. Of
    a multi-rank case, that of the rank with the largest allocated peak (as are the
    breakdown, `categories` and `allocated_samples`)."""
    allocated_samples: tuple[int, ...] = ()
    """Framework peak of each measured iteration: the within-run repeat spread."""
    num_alloc_retries: int | None = None
    """CUDA: cache flush-and-retry events; non-zero means the run was at the edge."""
    num_ooms: int | None = None
    host_peak_rss_bytes: int | None = None
    """Exact peak RSS of the case's process over the whole case (setup included). The host
    figures of a multi-rank case are summed over its ranks: they share the host's memory
    (each rank's exact peak, so the sum bounds their joint peak from above)."""
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
    load_duration_s: float | None = None
    """Wall time inside the workload's `ctx.loading()` (its phases added up); None when the
    workload marks no loading step, as for every loading figure below."""
    load_host_peak_rss_bytes: int | None = None
    """Exact peak RSS of the case's process during loading (VmHWM reset at its start): the
    host memory that reading the checkpoint and building the model take, before the step.
    None where the high-water mark cannot be reset (a note says so)."""
    load_file_rss_bytes: int | None = None
    """File-backed and shared resident pages (RssFile + RssShmem) at the end of loading: the
    `load_host` metric leaves them out, as `host` does."""
    load_rchar_bytes: int | None = None
    """Bytes read by the process during loading (/proc/self/io `rchar`: every read call,
    served from the page cache or from storage; mapped files are not counted). The figure
    that says how much the loading reads, warm cache or cold."""
    load_wchar_bytes: int | None = None
    """Bytes written by the process during loading (/proc/self/io `wchar`: every write call,
    whether or not it reached storage)."""
    load_read_bytes: int | None = None
    """Bytes the loading made the kernel fetch from storage (/proc/self/io `read_bytes`):
    0 when the files were in the page cache, the common case in CI; a cold-cache read shows
    here. None where /proc/self/io cannot be read."""
    load_write_bytes: int | None = None
    """Bytes the loading caused to be sent to storage (/proc/self/io `write_bytes`, counted
    when pages are dirtied); 0 on a memory-backed file system."""
    disk_bytes: int | None = None
    """Disk space of the case's files at the end of loading: the apparent size of the files
    under the paths given to `ctx.loading(...)`, by default under `ctx.scratch_dir`."""
    ranks: tuple[RankMeasurement, ...] = ()
    """A multi-rank case (the `ranks` param): each rank's own figures, by rank; empty for a
    case of one process. The headline figures above are the largest per-device peak over
    these, and `devices` holds each GPU once."""
    quality_status: str | None = None
    """The output against its reference: ok (within tolerance), fail (beyond it), error (the
    reference was refused or unreadable, or the output cannot be compared), none (no
    reference recorded yet); None where the workload declares no tolerance."""
    quality_message: str | None = None
    """One line: each bounded figure against its tolerance, or what went wrong."""
    quality_reference: str | None = None
    """Case id of the reference: this case at full precision (its dtype float32 sibling, each
    format param at its reference value), or the case itself."""
    quality_reference_sha256: str | None = None
    """sha256 of the reference file compared with, as the reference manifest pins it."""
    quality_max_abs: float | None = None
    """Largest absolute difference between output and reference (float64, CPU)."""
    quality_max_rel: float | None = None
    """`quality_max_abs` divided by the reference's largest magnitude (a norm-wise relative
    error; element-wise ratios explode where the reference is zero)."""
    quality_cosine: float | None = None
    """Cosine similarity of the flattened output and reference (the lowest, over several
    outputs)."""
    quality_value: float | None = None
    """The workload's own quality function's value, fn(output, reference)."""
    quality_tolerance: dict[str, float] = field(default_factory=dict)
    """The declared tolerance: max_abs, max_rel, metric (at most); cosine, metric_min (at
    least)."""
    kind: str = "measured"
    """'measured', or 'estimate': predicted under fake tensors (`memtrack estimate`), never
    a baseline, budget figure or history point."""


def device_peak(m: Measurement) -> int | None:
    """Largest per-device process peak (devices do not pool)."""
    peaks = [d.peak_process_bytes for d in m.devices if d.peak_process_bytes is not None]
    return max(peaks) if peaks else None


_RANK_FIGURES = {"allocated": "peak_allocated_bytes", "reserved": "peak_reserved_bytes",
                 "requested": "peak_requested_bytes"}


def peak_rank(m: Measurement, metric: str) -> RankMeasurement | None:
    """The rank of a multi-rank case whose device holds the case's figure of a per-device
    metric (allocated, reserved, requested, device); None for any other case or metric."""
    if not m.ranks:
        return None
    if metric == "device":
        peaks = [d for d in m.devices if d.peak_process_bytes is not None]
        if not peaks:
            return None
        top = max(peaks, key=lambda d: d.peak_process_bytes or 0)
        return next((r for r in m.ranks if r.device == f"cuda:{top.index}"), None)
    column = _RANK_FIGURES.get(metric)
    if column is None:
        return None
    held = [r for r in m.ranks if getattr(r, column) is not None]
    return max(held, key=lambda r: getattr(r, column)) if held else None  # first on a tie


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


def load_host(m: Measurement) -> int | None:
    """The `load_host` metric: peak RSS during loading, less the file-backed pages at its
    end (libraries, mapped files), as for `host`."""
    if m.load_host_peak_rss_bytes is None or m.load_file_rss_bytes is None:
        return None
    return max(0, m.load_host_peak_rss_bytes - m.load_file_rss_bytes)


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


# -- validation and JSON Schema -------------------------------------------------------------
#
# Records come from other machines: every value is checked before it is stored. The rules are
# derived from the dataclass fields and their type hints (plus a few naming conventions:
# `*_bytes` are byte counts, `*_s` seconds, `*_at` ISO times), so a new field is validated and
# described in the schema without further code. `json_schema()` writes the same rules as a JSON
# Schema; memtrack/schema/run-record.schema.json is its output, regenerated with
# `python -m memtrack.records > memtrack/schema/run-record.schema.json`.

MAX_BYTES = 2**62
"""Upper bound of a byte figure: far above any machine, far below SQLite's 64-bit limit."""
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
RUN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
COMMIT_PATTERN = r"^[0-9a-fA-F]{4,64}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
_COMMIT_FIELDS = {"commit", "parent", "merge_base", "sha"}
_BYTE_LISTS = {"allocated_samples", "categories"}
_COUNTS = {"warmup", "repeats", "samples", "num_alloc_retries", "num_ooms", "index",
           "cpu_count", "pr_number", "rank"}


def _rules(name: str) -> dict[str, Any]:
    """JSON Schema keywords a field's values (or items) obey beyond their type."""
    if name.endswith("_bytes") or name in _BYTE_LISTS:
        return {"minimum": 0, "maximum": MAX_BYTES - 1}
    if name.endswith("_s") or name in _COUNTS:
        return {"minimum": 0}
    if name.endswith("_at"):
        return {"format": "date-time"}
    if name in _COMMIT_FIELDS:
        return {"pattern": COMMIT_PATTERN}
    if name == "run_id":
        return {"pattern": RUN_ID_PATTERN}
    if name == "status":
        return {"enum": list(STATUSES)}
    if name == "quality_status":
        return {"enum": list(QUALITY_STATUSES)}
    if name in ("quality_max_abs", "quality_max_rel"):
        return {"minimum": 0}
    if name == "quality_cosine":
        return {"minimum": -1, "maximum": 1}
    if name == "quality_reference_sha256":
        return {"pattern": SHA256_PATTERN}
    if name == "kind":
        return {"enum": list(KINDS)}
    if name == "shard":
        return {"pattern": r"^[1-9][0-9]*/[1-9][0-9]*$"}
    if name in ("workload", "case_id"):
        return {"minLength": 1}
    if name == "schema_version":
        return {"const": SCHEMA_VERSION}
    return {}


_SCALAR = {"type": ["string", "integer", "number", "boolean", "null"]}


def _hint_schema(hint: Any, rules: dict[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in args if a is not type(None)]
        inner = _hint_schema(options[0], rules)
        if "$ref" in inner:
            return {"anyOf": [inner, {"type": "null"}]}
        if "enum" in inner:  # an enum lists every value the field takes, null too
            inner = {**inner, "enum": [*inner["enum"], None]}
        return {**inner, "type": [inner["type"], "null"]}
    if origin is tuple:
        return {"type": "array", "items": _hint_schema(args[0], rules)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _hint_schema(args[1], rules)}
    if dataclasses.is_dataclass(hint):
        return {"$ref": f"#/$defs/{typing.cast(type, hint).__name__}"}
    if hint is Any:
        return dict(_SCALAR)
    kind = {str: "string", bool: "boolean", int: "integer", float: "number"}[hint]
    out: dict[str, Any] = {"type": kind, **rules}
    if kind == "integer" and "const" not in out:
        out.setdefault("minimum", _INT_MIN)
        out.setdefault("maximum", _INT_MAX)
    return out


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field, read from the source (Python keeps none at runtime)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for prev, node in zip(body, body[1:], strict=False):
        if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def _hints(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _dataclasses() -> list[type]:
    """RunRecord and every dataclass nested in it, in order of first use."""
    out: list[type] = []

    def visit(cls: type) -> None:
        if cls in out:
            return
        out.append(cls)
        for _, hint in _hints(cls):
            for t in (hint, *typing.get_args(hint)):
                if dataclasses.is_dataclass(t):
                    visit(t)  # type: ignore[arg-type]

    visit(RunRecord)
    return out


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a run record, derived from the dataclasses above."""
    defs = {}
    for cls in _dataclasses():
        docs = _field_docs(cls)
        props = {}
        for f, hint in _hints(cls):
            prop = _hint_schema(hint, _rules(f.name))
            if f.name in docs:
                prop = {"description": docs[f.name], **prop}
            props[f.name] = prop
        defs[cls.__name__] = {
            "type": "object",
            "description": " ".join((cls.__doc__ or "").split()),
            "properties": props,
            "required": [f.name for f, _ in _hints(cls) if _required(f)],
            "additionalProperties": False,
        }
    root = defs.pop("RunRecord")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://memtrack.invalid/schema/run-record-v{SCHEMA_VERSION}.json",
        "title": "memtrack run record",
        **root,
        "$defs": defs,
    }


# The validator interprets the same hints and rules: one closure per field, built once. Each
# takes the value and its path, a linked tuple (parent, key) turned into text only for an
# error message; the common case (a valid value) costs one type test and a comparison.
Path_ = Any
Check = typing.Callable[[Any, Path_], Any]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _where(path: Path_) -> str:
    """The text of a path: (((((), 'measurements'), 0), 'params'), ('batch',)) is
    "measurements[0].params['batch']"."""
    parts = []
    while path:
        path, key = path
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif isinstance(key, tuple):  # a key of a mapping
            parts.append(f"[{_short(key[0])}]")
        else:
            parts.append(f".{key}")
    return "".join(reversed(parts)).lstrip(".") or "record"


def _fail(path: Path_, message: str) -> typing.NoReturn:
    raise RecordError(f"{_where(path)}: {message}")


def _check_rules(value: Any, rules: dict[str, Any], path: Path_) -> None:
    if "minimum" in rules and value < rules["minimum"]:
        _fail(path, f"{_short(value)} is below {rules['minimum']}")
    if "maximum" in rules and value > rules["maximum"]:
        _fail(path, f"{_short(value)} is above {rules['maximum']}")
    if "pattern" in rules and not re.match(rules["pattern"], value):
        _fail(path, f"{_short(value)} does not match {rules['pattern']}")
    if "enum" in rules and value not in rules["enum"]:
        _fail(path, f"{_short(value)} is not one of {', '.join(rules['enum'])}")
    if "const" in rules and value != rules["const"]:
        _fail(path, f"{_short(value)} is not supported (expected {rules['const']})")
    if "minLength" in rules and len(value) < rules["minLength"]:
        _fail(path, "must not be empty")
    if rules.get("format") == "date-time" and parse_time(value) is None:
        _fail(path, f"{_short(value)} is not an ISO 8601 time")


def _scalar(value: Any, path: Path_) -> Any:
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            _fail(path, f"{_short(value)} is out of range")
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    _fail(path, f"{_short(value)} is not a string, number, boolean or null")


def _compile(hint: Any, rules: dict[str, Any], nullable: bool = False) -> Check:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = next(a for a in args if a is not type(None))
        if inner in (int, float, str, bool):  # scalars take None themselves: one call less
            return _compile(inner, rules, nullable=True)
        check = _compile(inner, rules)
        return lambda v, w: None if v is None else check(v, w)
    if origin is tuple:
        item, valid = _compile(args[0], rules), _all_valid(args[0], rules)

        def check_list(v: Any, w: Path_) -> Any:
            if type(v) is not list:
                _fail(w, f"expected a list, got {_short(v)}")
            if valid(v):
                return tuple(v)
            return tuple([item(x, (w, i)) for i, x in enumerate(v)])  # finds the bad one

        return check_list
    if origin is dict:
        value, valid = _compile(args[1], rules), _all_valid(args[1], rules)

        def check_dict(v: Any, w: Path_) -> Any:
            if type(v) is not dict:
                _fail(w, f"expected an object, got {_short(v)}")
            if valid(v.values()):
                return v
            return {k: value(x, (w, (k,))) for k, x in v.items()}

        return check_dict
    if dataclasses.is_dataclass(hint):
        return lambda v, w: _builder(hint)(v, w)  # type: ignore[arg-type]
    if hint is Any:
        return _scalar
    if hint is float:
        low, high = rules.get("minimum", -math.inf), rules.get("maximum", math.inf)

        def check_float(v: Any, w: Path_) -> Any:
            if type(v) is float and low <= v < math.inf and v <= high:  # also False for NaN
                return v
            if v is None and nullable:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                _fail(w, f"expected a number, got {_short(v)}")
            if not math.isfinite(v):
                _fail(w, f"{v} is not a finite number")
            _check_rules(float(v), rules, w)
            return float(v)

        return check_float
    if hint is int:
        bounds = {"minimum": _INT_MIN, "maximum": _INT_MAX, **rules}
        low, high = bounds["minimum"], bounds["maximum"]

        def check_int(v: Any, w: Path_) -> Any:
            if type(v) is int and low <= v <= high:
                return v
            if v is None and nullable:
                return None
            if type(v) is not int:
                _fail(w, f"expected an integer, got {_short(v)}")
            _check_rules(v, bounds, w)
            return v

        return check_int
    if hint is str:
        pattern = re.compile(rules["pattern"]) if "pattern" in rules else None
        lower = rules.get("pattern") == COMMIT_PATTERN
        enum = set(rules.get("enum", ()))
        nonempty = "minLength" in rules
        slow = {k: v for k, v in rules.items() if k in ("format", "const")}

        def check_str(v: Any, w: Path_) -> Any:
            if type(v) is not str:
                if v is None and nullable:
                    return None
                _fail(w, f"expected a string, got {_short(v)}")
            if pattern is not None and not pattern.match(v):
                _fail(w, f"{_short(v)} does not match {pattern.pattern}")
            if enum and v not in enum:
                _fail(w, f"{_short(v)} is not one of {', '.join(rules['enum'])}")
            if nonempty and not v:
                _fail(w, "must not be empty")
            if slow:
                _check_rules(v, slow, w)
            return v.lower() if lower else v

        return check_str
    if hint is bool:

        def check_bool(v: Any, w: Path_) -> Any:
            if type(v) is not bool:
                if v is None and nullable:
                    return None
                _fail(w, f"expected true or false, got {_short(v)}")
            return v

        return check_bool
    raise TypeError(f"no validator for {hint!r}")  # a new field of a new type: extend this


def _maker(cls: type) -> typing.Callable[[dict[str, Any]], Any]:
    """Builds an instance from checked values. A frozen dataclass's __init__ sets each field
    through object.__setattr__, a large share of loading 10,000 records; filling the
    instance's __dict__ at once gives the same object."""
    fields = dataclasses.fields(cls)
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    factories = [(f.name, f.default_factory) for f in fields
                 if f.default_factory is not dataclasses.MISSING]
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__"):
        return lambda values: cls(**values)

    def make(values: dict[str, Any]) -> Any:
        obj: Any = object.__new__(cls)
        d = obj.__dict__
        d.update(defaults)
        for name, factory in factories:
            if name not in values:
                d[name] = factory()  # type: ignore[misc]
        d.update(values)
        return obj

    return make


def _all_valid(hint: Any, rules: dict[str, Any]) -> typing.Callable[[Any], bool]:
    """A quick test that every item of a list or mapping of scalars is valid (loops in C);
    when it says no, the items are checked one by one to name the bad one."""
    if hint is int:
        low, high = rules.get("minimum", _INT_MIN), rules.get("maximum", _INT_MAX)
        return lambda v: not v or (set(map(type, v)) == {int} and low <= min(v)
                                   and max(v) <= high)
    if hint is float:
        low = rules.get("minimum", -math.inf)
        return lambda v: not v or (set(map(type, v)) == {float} and all(map(math.isfinite, v))
                                   and min(v) >= low)
    if hint is str and not rules:
        return lambda v: set(map(type, v)) <= {str}
    if hint is Any:
        plain = {str, bool, type(None), int, float}

        def scalars(v: Any) -> bool:
            if not set(map(type, v)) <= plain:
                return False
            ints = [x for x in v if type(x) is int]
            floats = [x for x in v if type(x) is float]
            return ((not ints or (_INT_MIN <= min(ints) and max(ints) <= _INT_MAX))
                    and all(map(math.isfinite, floats)))

        return scalars
    return lambda v: False


@functools.cache
def _builder(cls: type) -> Check:
    checks = {f.name: _compile(hint, _rules(f.name)) for f, hint in _hints(cls)}
    names = set(checks)
    required = [f.name for f, _ in _hints(cls) if _required(f)]
    make = _maker(cls)

    def build(data: Any, path: Path_) -> Any:
        if type(data) is not dict:
            _fail(path, f"expected an object, got {_short(data)}")
        if not names.issuperset(data):
            unknown = sorted(_short(k) for k in set(data) - names)
            _fail(path, f"unknown key(s) {', '.join(unknown)}")
        for name in required:
            if name not in data:
                _fail(path, f"missing key {name}")
        return make({k: checks[k](v, (path, k)) for k, v in data.items()})

    return build


def run_from_dict(data: Any, *, where: str = "record") -> RunRecord:
    """Rebuild a RunRecord from `to_dict` output, checking every value. Raises RecordError."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(
            f"{where}: schema_version {_short(version)} is not supported "
            f"(expected {SCHEMA_VERSION})"
        )
    try:
        run: RunRecord = _builder(RunRecord)(data, ())
    except RecordError as exc:
        raise RecordError(f"{where}: {exc}") from None
    seen: set[str] = set()
    for i, m in enumerate(run.measurements):
        if m.case_id in seen:
            raise RecordError(f"{where}: case {m.case_id!r} is measured twice in one run")
        seen.add(m.case_id)
        numbers = [r.rank for r in m.ranks]
        if numbers != list(range(len(numbers))):
            raise RecordError(f"{where}: measurements[{i}].ranks: ranks {numbers} are not "
                              f"0..{len(numbers) - 1} in order, each once")
    return run


def write_json(run: RunRecord, path: Path) -> None:
    """Write atomically: a reader never sees half a record, and a failed write leaves nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(to_dict(run), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write names no file
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: Path) -> RunRecord:
    """A record from a JSON file, every value checked. Raises RecordError (one line)."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise RecordError(f"{path}: not a run record (JSON nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise RecordError(f"{path}: not valid JSON ({exc})") from None
    return run_from_dict(data, where=str(path))


def read_all(paths: Iterable[Path]) -> Iterator[RunRecord]:
    """Each file's record, reading every file even after a bad one; then, if any was bad,
    RecordError naming the first. A consumer writing in one transaction rolls back."""
    errors: list[RecordError] = []
    for path in paths:
        try:
            record = read_json(path)
        except RecordError as exc:
            errors.append(exc)
            continue
        if not errors:
            yield record
    if errors:
        more = f" (and {len(errors) - 1} more bad file(s))" if len(errors) > 1 else ""
        raise RecordError(f"{errors[0]}{more}; nothing ingested")


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2))
