"""The records memtrack writes: frozen dataclasses, serialised to versioned JSON.

A `RunRecord` is one `memtrack run`: where it ran (git, CI, environment) and one
`Measurement` per workload case. Bytes are ints, times are seconds; a figure that was
not measured is None, never 0.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "error", "timeout", "crashed")
QUALITY_STATUSES = ("ok", "fail", "error", "none")
KINDS = ("measured", "estimate", "timing")
PAIR_FIGURES = ("device time", "tree CPU time", "CPU time", "wall time")
"""The figures time is judged on, the one other processes move least first."""
FIGURE_FIELDS = {
    "device time": "iteration_device_times_s",
    "tree CPU time": "iteration_tree_cpu_times_s",
    "CPU time": "iteration_cpu_times_s",
    "wall time": "iteration_times_s",
}
"""Each of PAIR_FIGURES by the field that holds it, iteration by iteration."""


def now() -> str:
    """The time of day as a record holds it: UTC, ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
    repository: str | None = None
    """The repository's identity, 'host/owner/name' (the config's `repository`, else the CI's
    GITHUB_SERVER_URL and GITHUB_REPOSITORY, else the origin remote without credentials);
    None where none is known. Baselines, budgets and acceptances never cross it."""


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
    """Versions of every installed distribution, by `distribution_key` (records made before
    every one was recorded hold the memory-relevant ones alone)."""
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
    allocator_backend: str | None = None
    """The CUDA allocator's backend torch starts with here ('native' or 'cudaMallocAsync',
    from PYTORCH_ALLOC_CONF); None where torch cannot start CUDA."""


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
class Site:
    """One group of the memory alive at a case's peak."""

    grouping: str
    """'module' (the nn.Module path that allocated it), 'source' (file:function), 'pair'
    (both: 'module at file:function', what a growth is named by), 'process' (the process
    of the case's tree that held it at the tree's host peak: 'main', 'pt_data_worker 1'), or
    'retained' (a pair, of what one call of the step allocated and still held after it
    returned: where a leak is made)."""
    key: str
    """The module path ('blocks.3.attn'), or the source site ('serve.py:generate'), or the
    pair ('lm_head at serve.py:generate'), or a group in parentheses ('(setup)', '(inside
    kernels: no tensor holds it)')."""
    size_bytes: int
    line: int | None = None
    """A source site's line that allocated the most of it, for display (sites are matched
    by file and function, so a moved line still matches)."""
    frames: tuple[str, ...] = ()
    """A 'pair' or 'retained' site's frames in the workload's own files ('file:line'),
    innermost first: the line that allocated it and the calls that led there, then where
    its module was made. A weight's or buffer's pair ('(setup)'): where the largest of them
    was made (its registration's frames), then its module's. For display and annotation
    only, never matched: a pull request's changed line among them is where it points."""


def site_of(data: dict[str, Any]) -> Site:
    """A site from the store's JSON (its frames a list there; none before they were
    recorded)."""
    return Site(**{**data, "frames": tuple(data.get("frames") or ())})


BACKWARD = "(backward)"
"""A 'module' or 'pair' site's module for memory made in backward, outside any module."""
SETUP = "(setup)"
"""A 'source' or 'pair' site's source for what was alive when the iteration started
(weights, buffers, optimizer state, tensors held from setup)."""
MAIN_PROCESS = "main"
"""A 'process' site's name for the case's own process (of a multi-rank case: 'rank N')."""


def own_process(key: str) -> bool:
    """Whether a 'process' site is one of memtrack's own processes of the case (its process,
    or a rank's), not one the case started."""
    return key == MAIN_PROCESS or (key.startswith("rank ") and key[5:].isdigit())


def pair_key(module: str, source: str) -> str:
    """A 'pair' site's key: 'lm_head at serve.py:generate'."""
    return f"{module} at {source}"


def distribution_key(name: str) -> str:
    """A distribution's name as PEP 503 normalises it: runs of -, _ and . are one -,
    lowercase ('Flash_Attn' is 'flash-attn')."""
    return _DISTRIBUTION_RUNS.sub("-", name).lower()


_DISTRIBUTION_RUNS = re.compile(r"[-_.]+")


def pair_parts(key: str) -> tuple[str, str]:
    """A 'pair' key's module path and source site ('' and the key, for a group)."""
    module, _, source = key.rpartition(" at ")
    return module, source


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
    tracker alone, as concurrent sessions were measured before their threads were followed,
    and before this figure was the allocator's)."""
    allocator_backend: str | None = None
    """The CUDA allocator's backend, as torch reports it: 'native' (PyTorch's caching
    allocator) or 'cudaMallocAsync' (then the requested bytes, the retries and the OOM count
    are not kept, and reserved is an upper bound). None on the CPU."""
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
    """NVML sampling period the sampler achieved (first to last round over the devices; it
    grows with the number of GPUs and under gVisor), else the interval asked for."""
    devices: tuple[DeviceMeasurement, ...] = ()
    weights_bytes: int | None = None
    intermediates_bytes: int | None = None
    """Activations and temporaries: framework peak minus the other categories."""
    caches_bytes: int | None = None
    """Request-sized state the workload tagged (KV cache, ...), alive at the peak."""
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
    """Framework peak that no category explains (weights + inputs + caches + gradients +
    optimizer state + intermediates + this = peak); None where no category breakdown was
    taken."""
    host_setup_rss_bytes: int | None = None
    """RSS when the timing pass starts (after setup and warm-up): the level the step starts
    from. `host_step_peak_rss_bytes` minus this is the step's own host growth."""
    host_file_rss_bytes: int | None = None
    """File-backed and shared resident pages (RssFile + RssShmem: libraries, mapped files)
    at the end of the timing pass. They are reclaimable and follow the page cache, not the
    code, so the `host` metric leaves them out."""
    host_tree_peak_rss_bytes: int | None = None
    """Host peak of the case's whole process tree (the worker and every process it started,
    data-loader workers included): the peak of the sampled sum of the worker's own anonymous
    and shmem RSS and each descendant's private memory (a page a forked worker shares with it
    counts once), never below the worker's own exact peak less file-backed pages."""
    host_tree_source: str | None = None
    """'sampled'; None when not measured. Runs recorded before read 'process-group samples
    (lower bound)' (a sum of RSS) or 'cgroup' (`memory.peak`): other figures than the
    `host_tree` metric's."""
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
    """'measured'; 'estimate': predicted under fake tensors (`memtrack estimate`); or
    'timing': timing passes only, the reference side of a paired timing (`memtrack run
    --against`). The last two are never a baseline, budget figure or history point."""
    retained_samples: tuple[int, ...] = ()
    """Framework bytes each measured iteration left allocated when it ended, after a garbage
    collection (its allocations less its frees): 0 for a step that frees what it makes, the
    same positive figure in every iteration for a leak. CPU: the allocator's events (the
    tensor tracker's totals with concurrent sessions); CUDA: `memory_allocated` after less
    before, over the devices the case used."""
    iteration_cpu_times_s: tuple[float, ...] = ()
    """Process CPU time (user + system, every thread) of each timing-pass iteration. Other
    processes' load moves it less than the wall time where the step runs in one thread;
    intra-op threads that spin while they wait for one another (OpenMP) burn CPU time as
    they wait, so on a loaded machine it grows with the wall time."""
    iteration_tree_cpu_times_s: tuple[float, ...] = ()
    """The CPU time of each timing-pass iteration of the case's whole process tree: the
    process's own (`iteration_cpu_times_s`) and that of every process it started (data-loader
    workers, helpers: their /proc figures and, once reaped, getrusage's), so work moved into
    or added to the workers is seen. Equal to the process's own where it starts none; the
    workers' part counts in clock ticks (10 ms)."""
    iteration_device_times_s: tuple[float, ...] = ()
    """CUDA only: each timing-pass iteration's time on the device, between two CUDA events
    on the case's stream (every session's stream joins it); empty on the CPU."""
    timing_cpu_pressure: float | None = None
    """Share of the timing pass's wall time in which some task on the machine waited for a
    CPU (Linux PSI, /proc/pressure/cpu `some`); None where the kernel has no PSI."""
    timing_runnable: float | None = None
    """Runnable tasks of other processes during the timing pass (the kernel's procs_running,
    read from /proc/loadavg, less this process's threads in state R), the mean of samples
    taken before and after every iteration."""
    timing_steal: float | None = None
    """Share of the machine's CPU time a hypervisor took for others during the timing pass
    (/proc/stat steal); None where the kernel does not count it, or for a pass within one
    clock tick."""
    timing_cores: int | None = None
    """CPUs this process may run on (its affinity) during the timing pass."""
    timing_wait_cores: float | None = None
    """Time the case's threads waited for a CPU over the whole timing pass (their run-queue
    wait, /proc/self/task/*/schedstat), over the pass's wall time: in cores."""
    timing_others_cores: float | None = None
    """CPU time other processes used on the case's CPUs over the whole timing pass (their
    /proc/stat lines less the case's own CPU time), over the pass's wall time: in cores.
    With the case's own CPU time and `timing_wait_cores`, the cores the pass wanted
    (judge.load)."""
    iteration_instructions: tuple[int, ...] = ()
    """Instructions the case's threads retired in user space in each timing-pass iteration
    (the CPU's counter, perf_event_open): a figure other processes do not move. Empty where
    not counted, and `instructions_note` says why."""
    instructions_note: str | None = None
    """Why no instruction count was taken (one line), where none was."""
    pair_ref: str | None = None
    """A paired timing (`memtrack run --against REF`): the commit the other side measured,
    its timing passes alternating with this one's under the same load."""
    pair_figure: str | None = None
    """The figure of the pair's passes: 'device time', 'CPU time' or 'wall time'."""
    pair_times_s: tuple[float, ...] = ()
    """This side's timing passes of the pair (each a turn of the side's live process): their
    median iteration times (of `pair_figure`), round by round."""
    pair_ref_times_s: tuple[float, ...] = ()
    """The other side's passes (at `pair_ref`), in the same rounds as `pair_times_s`."""
    session_peak_bytes: int | None = None
    """Concurrent cases: one session's step run alone, after the memory pass, in the same
    process (in the first session's thread, on its stream): its framework peak, the level
    shared by every session included. None where it did not end alone (sessions that wait
    for one another), which a note says."""
    sessions_sum_bytes: int | None = None
    """Concurrent cases: the level at the solo session's start plus `concurrency` times what
    that session added to it: the peak if every session peaked at once. The measured peak lies
    between `session_peak_bytes` and this, by how the sessions interleave; this figure does
    not depend on the interleaving."""
    sites: tuple[Site, ...] = ()
    """Where the memory alive at the peak was allocated: the top sites by module and by
    source site, each grouping with one row for the rest and one for what no tensor holds
    (kernel scratch), summing to the peak (probes.sites). Measured in a pass of its own.
    Beside them, one 'process' site per process of the case's tree, each its share at the
    tree's sampled host peak (probes.tree): what a `host_tree` growth names; and the
    'retained' sites of that pass's call: what a leak verdict names."""
    inputs_bytes: int | None = None
    """Tensors alive at the peak that the workload holds from setup and that are neither
    weights, caches, gradients nor optimizer state: its input batch, a plain attribute
    (counted as CUDA's allocator counts every live tensor)."""
    largest_cache_bytes: int | None = None
    """The largest total of tagged cache storages alive at once during a measured
    iteration, read at every tag (the request's largest cache, what planning at the
    longest request needs); `caches_bytes` is the part alive at the peak."""
    scratch_bytes: int | None = None
    """Estimates only: the kernel scratch added to the fake tensors' peak (oneDNN's buffers
    on the CPU, cuBLAS/cuDNN workspaces on a GPU), which no fake tensor holds, taken from the
    latest measured run of the same case on the same kind of device (`scratch_run_id`).
    `peak_allocated_bytes` includes it: less it, the estimate is the tensors' alone. None
    where no measured run calibrated the estimate (it excludes scratch; a note says so)."""
    scratch_run_id: str | None = None
    """Estimates only: the measured run `scratch_bytes` was taken from."""
    budget_bytes: int | None = None
    """A test's own memory budget (its `memory_budget` mark, pytest plugin), held by
    `memtrack check` to `budget_metric` as a config budget is: over it, the test is
    `over_budget`. None for a workload's case: its budgets are the config's."""
    budget_metric: str | None = None
    """The gated metric `budget_bytes` limits; set with it."""


def case_id(workload: str, params: dict[str, Any]) -> str:
    """'name[k=v,...]' with keys sorted: the stable identity of a series."""
    if not params:
        return workload
    inner = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return f"{workload}[{inner}]"


def device_peak(m: Measurement) -> int | None:
    """Largest per-device process peak (devices do not pool)."""
    peaks = [d.peak_process_bytes for d in m.devices if d.peak_process_bytes is not None]
    return max(peaks) if peaks else None


_RANK_FIGURES = {
    "allocated": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "requested": "peak_requested_bytes",
}


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


def host_tree(m: Measurement) -> int | None:
    """The `host_tree` metric: the host peak of the case's whole process tree, where sampled
    as memtrack samples it now (not an older record's summed RSS, nor a cgroup's
    `memory.peak`, which counts page cache and kernel memory too)."""
    if m.host_tree_source != "sampled":
        return None
    return m.host_tree_peak_rss_bytes


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


def test_file(case_id: str) -> str | None:
    """A test's file (its case id's path before '::'); None for a workload's case."""
    path, sep, _ = case_id.partition("::")
    return path if sep else None


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
    selection: tuple[str, ...] = ()
    """What this run was limited to (`memtrack run -k PATTERN`, pytest's `-k` or `-m`
    expression, or test node ids), each as given; () for the whole suite, or every test of
    the files it ran. A case such a run leaves out is not measured here, never removed."""
    schema_version: int = SCHEMA_VERSION


_PLAIN = frozenset({int, float, str, bool, type(None)})


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def to_dict(obj: Any) -> Any:
    """A record as plain JSON-able data (tuples become lists)."""
    if type(obj) in _PLAIN:  # most values: answered before any other test
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {name: to_dict(getattr(obj, name)) for name in _field_names(type(obj))}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj
