"""The memory metrics: the one registry that verdicts, budgets, the store, the reports and the
dashboard read. Each says what it measures, over which pass, where it is stored, how it is
made from a measurement where it is not one of its fields, the smallest change that can be a
change in code, and where it is shown.

    allocated      framework peak of live tensors           memory pass (after warm-up)
    reserved       CUDA caching allocator's segments        memory pass
    requested      what callers asked the allocator for     memory pass
    device         NVML per-process peak, largest device    the whole case
    host           peak RSS less file-backed pages          setup, warm-up and timing pass
    host_step      timing pass's RSS peak above its start   timing pass
    host_tree      peak of the case's whole process tree    the whole case (data-loader workers too)
    load_host      peak RSS less file-backed pages          the workload's ctx.loading()
    disk           size of the case's files                 at the end of loading
    sessions       sum of concurrent sessions' own peaks    one session alone, after the memory pass
    outside        device memory outside the allocator      the whole case (CUDA)
    fragmentation  reserved less allocated                  memory pass (CUDA)

A new figure is one entry here: a derived one (made from a measurement's fields) adds its
`derive` and a migration that adds its column; the store writes it, and `memtrack show`,
the reports and the dashboard show it, from this entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memtrack.records.model import (
    Measurement,
    device_peak,
    host_peak,
    host_step,
    host_tree,
    load_host,
)

MiB = 2**20


def outside_allocator(m: Measurement) -> int | None:
    """Device memory of the case's process beyond what its allocator reserved: the CUDA
    context, cuBLAS/cuDNN handles, NCCL buffers, other libraries' own allocations."""
    peak, reserved = device_peak(m), m.peak_reserved_bytes
    return None if peak is None or reserved is None else max(0, peak - reserved)


def fragmentation(m: Measurement) -> int | None:
    """Memory the caching allocator held beyond its live tensors at their peaks: segments'
    free parts, rounding, blocks cached for reuse."""
    reserved, allocated = m.peak_reserved_bytes, m.peak_allocated_bytes
    return None if reserved is None or allocated is None else max(0, reserved - allocated)


@dataclass(frozen=True)
class Metric:
    """One memory metric."""

    name: str
    column: str
    """Its column in the measurements table."""
    label: str
    """Short words for people."""
    short: str
    """A narrow table column's name."""
    covers: str
    """The pass it covers."""
    floor: int
    """The smallest change that can be a change in code rather than granularity (bytes)."""
    floor_fraction: float = 0.0
    """A floor relative to the baseline too, where the figure's granularity grows with it."""
    derive: Callable[[Measurement], int | None] | None = None
    """How the figure is made from a measurement, where it is not one of its fields: it is
    stored beside them, in its own column, so that baselines read it with plain SQL."""
    gated: bool = True
    """Judged by the gate, and a budget can name it."""
    step: bool = True
    """A figure of the measured step, which `memtrack snapshot` captures."""
    breakdown: bool = True
    """Of tensor or device memory: a growth names the part of the breakdown that grew."""
    per_device: bool = False
    """Held by one device (devices do not pool): checked against its VRAM."""
    ranks_summed: bool = False
    """Summed over a multi-rank case's ranks (they share the host), not per device."""
    charted: bool = False
    """A view of History's panels and of the steps the dashboard finds."""
    compared: bool = False
    """A row of the dashboard's Compare."""


_METRICS = (
    # The caching allocator rounds every request up to a multiple of 512 B: a smaller
    # change in allocated memory cannot be told from rounding. `requested` is before
    # rounding, but the same quantum makes anything below it meaningless as a regression.
    Metric(
        "allocated",
        "peak_allocated_bytes",
        "framework allocated",
        "allocated",
        "memory pass",
        512,
        per_device=True,
        charted=True,
        compared=True,
    ),
    Metric(
        "reserved",
        "peak_reserved_bytes",
        "framework reserved",
        "reserved",
        "memory pass",
        2 * MiB,
        per_device=True,
        charted=True,
        compared=True,
    ),
    Metric(
        "requested",
        "peak_requested_bytes",
        "framework requested",
        "requested",
        "memory pass",
        512,
        per_device=True,
        compared=True,
    ),
    # NVML's per-process figure moves with the driver's 2 MiB pages and the allocator's
    # 2 MiB segments; the CUDA context adds its own page-sized steps.
    Metric(
        "device",
        "device_peak_bytes",
        "device (NVML)",
        "device (NVML)",
        "whole case",
        2 * MiB,
        derive=device_peak,
        per_device=True,
        charted=True,
        compared=True,
    ),
    # A whole case's RSS moves with glibc arenas being trimmed or not and with 2 MiB
    # transparent huge pages, a little more the larger the process: 4 MiB or 1 %.
    Metric(
        "host",
        "host_bytes",
        "host peak RSS (less file-backed)",
        "host RSS",
        "setup, warm-up and timing pass",
        4 * MiB,
        0.01,
        derive=host_peak,
        breakdown=False,
        ranks_summed=True,
        charted=True,
        compared=True,
    ),
    # The step's growth above its starting level: file pages loaded at setup cancel out;
    # one transparent huge page is what is left.
    Metric(
        "host_step",
        "host_step_bytes",
        "host step growth",
        "host step",
        "timing pass",
        2 * MiB,
        derive=host_step,
        breakdown=False,
        ranks_summed=True,
        charted=True,
        compared=True,
    ),
    # The tree's processes (the case's and every one it started: data-loader workers,
    # helpers), each page counted once: sampled, so it moves with what a sample catches of
    # a short spike, beside what moves `host`: the same 4 MiB or 1 % as its floor.
    Metric(
        "host_tree",
        "host_tree_bytes",
        "host peak of the whole process tree (less file-backed)",
        "host tree",
        "whole case, every process of it",
        4 * MiB,
        0.01,
        derive=host_tree,
        step=False,
        breakdown=False,
        charted=True,
        compared=True,
    ),
    # The whole process's RSS again (libraries, torch, the model being built), over the
    # loading only: the same arenas and huge pages move it, so the same 4 MiB or 1 %.
    Metric(
        "load_host",
        "load_host_bytes",
        "loading host peak RSS (less file-backed)",
        "loading host RSS",
        "loading",
        4 * MiB,
        0.01,
        derive=load_host,
        step=False,
        breakdown=False,
    ),
    # File sizes are exact and repeat exactly; a change under one 4 KiB file-system block
    # (an archive's names, a header's padding) takes no more space on disk.
    Metric(
        "disk",
        "disk_bytes",
        "disk space of the case's files",
        "disk",
        "end of loading",
        4096,
        step=False,
        breakdown=False,
    ),
    # Concurrent cases: the level plus `concurrency` times one session's own need, measured
    # alone. How the sessions interleave does not move it; the allocator's granularity does.
    Metric(
        "sessions",
        "sessions_sum_bytes",
        "sum of concurrent sessions",
        "sum of sessions",
        "one session alone, after the memory pass",
        512,
    ),
    # Gated as the others are (the same headroom rules): a growth of the device view that
    # reserved does not explain (a library's workspace, NCCL's buffers, the context) is
    # named as the figure that grew, as is reserved growth that allocated does not explain.
    Metric(
        "outside",
        "outside_allocator_bytes",
        "device memory outside the allocator",
        "outside allocator",
        "whole case",
        2 * MiB,
        derive=outside_allocator,
        breakdown=False,
        per_device=True,
        charted=True,
        compared=True,
    ),
    Metric(
        "fragmentation",
        "fragmentation_bytes",
        "allocator reserved less allocated",
        "fragmentation",
        "memory pass",
        2 * MiB,
        derive=fragmentation,
        breakdown=False,
        per_device=True,
        charted=True,
        compared=True,
    ),
)

METRICS: dict[str, Metric] = {m.name: m for m in _METRICS}
NAMES = tuple(METRICS)
GATED = tuple(m.name for m in _METRICS if m.gated)
"""The metrics the gate judges and a budget can name."""
ALLOCATOR_VIEWS = ("outside", "fragmentation")
"""The allocator's two figures beside the device view (CUDA only): shown where a case has
them, as rows of its detail rather than columns of every table."""
COLUMNS = {m.name: m.column for m in _METRICS}
"""Where each metric lives in the measurements table."""
DERIVED = tuple(m for m in _METRICS if m.derive is not None)
"""The metrics stored in columns of their own, beside the measurement's fields."""
FLOORS = {m.name: m.floor for m in _METRICS}
SHORT = {m.name: m.short for m in _METRICS}
CHARTED = tuple(m.name for m in _METRICS if m.charted)
COMPARED = tuple(m.name for m in _METRICS if m.compared)
STEP = tuple(m.name for m in _METRICS if m.step)
COMPONENTS = {
    "weights": "weights_bytes",
    "inputs": "inputs_bytes",
    "intermediates": "intermediates_bytes",
    "caches": "caches_bytes",
    "gradients": "gradients_bytes",
    "optimizer state": "optimizer_state_bytes",
    "unattributed": "unattributed_bytes",
    "workspace": "workspace_bytes",
}
"""The breakdown's parts and their columns, in the order a run's detail shows them: what
grew, when a metric grew."""
DEFAULT_BUDGET = ("device", "reserved", "allocated")
"""What a budget without a metric holds: the first of these a case measured."""


def floor(metric: str, baseline: float) -> float:
    """The headroom floor of a metric at a baseline value."""
    m = METRICS[metric]
    return max(float(m.floor), m.floor_fraction * baseline)


def value(m: Measurement, metric: str) -> int | None:
    """A measurement's figure for a metric; None where it was not measured."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    found = METRICS[metric]
    if found.derive is not None:
        return found.derive(m)
    figure = getattr(m, found.column)
    return None if figure is None else int(figure)


def default_budget_metric(measured: Callable[[str], object]) -> str:
    """The metric a budget without one holds for a case: the first of DEFAULT_BUDGET that
    `measured(name)` says the case has (not None)."""
    return next((x for x in DEFAULT_BUDGET[:-1] if measured(x) is not None), DEFAULT_BUDGET[-1])


__all__ = [
    "CHARTED",
    "COLUMNS",
    "COMPARED",
    "DEFAULT_BUDGET",
    "DERIVED",
    "FLOORS",
    "GATED",
    "METRICS",
    "NAMES",
    "SHORT",
    "STEP",
    "Metric",
    "default_budget_metric",
    "floor",
    "fragmentation",
    "outside_allocator",
    "value",
]
