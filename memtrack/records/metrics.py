"""The memory metrics a verdict, a budget or a chart can name: what each one measures, over
which pass, where it is stored, and the smallest change that can be a change in code.

    allocated  framework peak of live tensors          memory pass (after warm-up)
    reserved   CUDA caching allocator's segments       memory pass
    requested  what callers asked the allocator for    memory pass
    device     NVML per-process peak, largest device   the whole case
    host       peak RSS less file-backed pages         setup, warm-up and timing pass
    host_step  timing pass's RSS peak above its start  timing pass
    load_host  peak RSS less file-backed pages         the workload's ctx.loading()
    disk       size of the case's files                at the end of loading
    sessions   sum of concurrent sessions' own peaks    one session alone, after the memory pass
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrack.records.model import Measurement, device_peak, host_peak, host_step, load_host

MiB = 2**20


@dataclass(frozen=True)
class Metric:
    """One memory metric."""

    name: str
    column: str
    """Its column in the measurements table."""
    label: str
    """Short words for people."""
    covers: str
    """The pass it covers."""
    floor: int
    """The smallest change that can be a change in code rather than granularity (bytes)."""
    floor_fraction: float = 0.0
    """A floor relative to the baseline too, where the figure's granularity grows with it."""


_METRICS = (
    # The caching allocator rounds every request up to a multiple of 512 B: a smaller
    # change in allocated memory cannot be told from rounding. `requested` is before
    # rounding, but the same quantum makes anything below it meaningless as a regression.
    Metric("allocated", "peak_allocated_bytes", "framework allocated", "memory pass", 512),
    Metric("reserved", "peak_reserved_bytes", "framework reserved", "memory pass", 2 * MiB),
    Metric("requested", "peak_requested_bytes", "framework requested", "memory pass", 512),
    # NVML's per-process figure moves with the driver's 2 MiB pages and the allocator's
    # 2 MiB segments; the CUDA context adds its own page-sized steps.
    Metric("device", "device_peak_bytes", "device (NVML)", "whole case", 2 * MiB),
    # A whole case's RSS moves with glibc arenas being trimmed or not and with 2 MiB
    # transparent huge pages, a little more the larger the process: 4 MiB or 1 %.
    Metric(
        "host",
        "host_bytes",
        "host peak RSS (less file-backed)",
        "setup, warm-up and timing pass",
        4 * MiB,
        0.01,
    ),
    # The step's growth above its starting level: file pages loaded at setup cancel out;
    # one transparent huge page is what is left.
    Metric("host_step", "host_step_bytes", "host step growth", "timing pass", 2 * MiB),
    # The whole process's RSS again (libraries, torch, the model being built), over the
    # loading only: the same arenas and huge pages move it, so the same 4 MiB or 1 %.
    Metric(
        "load_host",
        "load_host_bytes",
        "loading host peak RSS (less file-backed)",
        "loading",
        4 * MiB,
        0.01,
    ),
    # File sizes are exact and repeat exactly; a change under one 4 KiB file-system block
    # (an archive's names, a header's padding) takes no more space on disk.
    Metric("disk", "disk_bytes", "disk space of the case's files", "end of loading", 4096),
    # Concurrent cases: the level plus `concurrency` times one session's own need, measured
    # alone. How the sessions interleave does not move it; the allocator's granularity does.
    Metric(
        "sessions",
        "sessions_sum_bytes",
        "sum of concurrent sessions",
        "one session alone, after the memory pass",
        512,
    ),
)

METRICS: dict[str, Metric] = {m.name: m for m in _METRICS}
NAMES = tuple(METRICS)
COLUMNS = {m.name: m.column for m in _METRICS}
"""Where each metric lives in the measurements table."""
FLOORS = {m.name: m.floor for m in _METRICS}


def floor(metric: str, baseline: float) -> float:
    """The headroom floor of a metric at a baseline value."""
    m = METRICS[metric]
    return max(float(m.floor), m.floor_fraction * baseline)


def value(m: Measurement, metric: str) -> int | None:
    """A measurement's figure for a metric; None where it was not measured."""
    if metric == "device":
        return device_peak(m)
    if metric == "host":
        return host_peak(m)
    if metric == "host_step":
        return host_step(m)
    if metric == "load_host":
        return load_host(m)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    figure = getattr(m, METRICS[metric].column)
    return None if figure is None else int(figure)


__all__ = ["COLUMNS", "FLOORS", "METRICS", "NAMES", "Metric", "floor", "value"]
