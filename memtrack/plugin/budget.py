"""A test's memory budget: the `memory_budget` mark read and checked once at collection, and
the verdict over budget, with every view and the sites of the peak in its message."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memtrack.errors import ConfigError
from memtrack.probes.span import SpanFigures
from memtrack.records import Site
from memtrack.units import format_size, parse_size

MARK = "memory_budget"
MARK_HELP = (
    'memory_budget(limit, metric="allocated", device=None): fail the test when its peak '
    "memory above the level at its start exceeds limit ('2 GiB', '512 MB' or bytes). "
    "metric: allocated, reserved, device or host; device: cpu, cuda or cuda:N."
)
VIEWS = {
    "allocated": ("allocated_bytes", "framework allocated, peak above the test's start"),
    "reserved": ("reserved_bytes", "CUDA reserved, peak above the test's start (process-wide)"),
    "device": ("device_process_bytes", "NVML process peak (the whole process's)"),
    "host": ("host_rise_bytes", "host peak RSS above the test's start (process-wide)"),
}
"""The metrics a budget names: the figure of a span it reads, and how the message says it."""
CUDA_ONLY = ("reserved", "device")
_DEVICE = re.compile(r"cpu|cuda(?::[0-9]{1,3})?")


@dataclass(frozen=True)
class MemoryBudget:
    """A `memory_budget` mark, validated."""

    limit_bytes: int
    metric: str = "allocated"
    device: str | None = None
    """'cpu', 'cuda' or 'cuda:N'; None: the run's device (`--memtrack-device`)."""

    def figure(self, figures: SpanFigures) -> int | None:
        """The figure held to the limit: of device N where the budget names `cuda:N`, else
        the largest over the devices (host: the process's)."""
        value = getattr(figures, VIEWS[self.metric][0])
        index = self.device.partition(":")[2] if self.device else ""
        if index and self.metric != "host":
            per_device = {"allocated": "allocated_bytes", "reserved": "reserved_bytes"}
            attr = per_device.get(self.metric, "process_bytes")
            found = [getattr(d, attr) for d in figures.devices if d.index == int(index)]
            value = found[0] if found else None
        return None if value is None else int(value)


def read_mark(args: tuple[Any, ...], kwargs: dict[str, Any]) -> MemoryBudget:
    """The mark's arguments as a budget; ConfigError naming the value that is refused."""
    unknown = sorted(set(kwargs) - {"limit", "metric", "device"})
    if unknown:
        raise ConfigError(f"unknown argument {unknown[0]!r} (limit, metric, device)")
    if len(args) > 1 or (args and "limit" in kwargs):
        raise ConfigError("takes one limit, e.g. memory_budget('2 GiB', metric='allocated')")
    if not args and "limit" not in kwargs:
        raise ConfigError("no limit, e.g. memory_budget('2 GiB')")
    limit = parse_size(args[0] if args else kwargs["limit"], what="limit")
    if limit <= 0:
        raise ConfigError(f"limit: {limit} bytes is no budget (at least 1 byte)")
    metric = kwargs.get("metric", "allocated")
    if not isinstance(metric, str) or metric not in VIEWS:
        raise ConfigError(f"metric: {metric!r} is not one of {', '.join(VIEWS)}")
    device = kwargs.get("device")
    if device is not None and (not isinstance(device, str) or not _DEVICE.fullmatch(device)):
        raise ConfigError(f"device: {device!r} is not cpu, cuda or cuda:N")
    if device == "cpu" and metric in CUDA_ONLY:
        raise ConfigError(f"metric: {metric!r} is measured on CUDA only, and device is 'cpu'")
    return MemoryBudget(limit, metric, device)


@dataclass(frozen=True)
class BudgetVerdict:
    """A budget against what a test used: `over` it, or not measurable where it ran."""

    budget: MemoryBudget
    figures: SpanFigures
    value: int | None

    @property
    def over(self) -> bool:
        return self.value is None or self.value > self.budget.limit_bytes

    def headline(self) -> str:
        b = self.budget
        if self.value is None:
            return (
                f"memory budget on {b.metric} ({format_size(b.limit_bytes)}) not checked: "
                f"{b.metric} is not measured on {self.figures.device}"
            )
        over = self.value - b.limit_bytes
        return (
            f"memory budget exceeded: {b.metric} {format_size(self.value)} > "
            f"{format_size(b.limit_bytes)} (+{format_size(over)}, "
            f"{100 * self.value / b.limit_bytes:.0f}% of the budget)"
        )


def judge(budget: MemoryBudget, figures: SpanFigures) -> BudgetVerdict:
    return BudgetVerdict(budget, figures, budget.figure(figures))


def views_lines(figures: SpanFigures) -> list[str]:
    """Every view of a span, one line each, for a person: what was measured and what not."""
    lines = []
    for metric, (attr, words) in VIEWS.items():
        value = getattr(figures, attr)
        shown = format_size(value) if value is not None else "not measured"
        if value is None and metric in CUDA_ONLY and figures.device == "cpu":
            shown = "- (CUDA only)"
        lines.append(f"  {metric:<10} {shown:>14}  {words}")
    if figures.host_peak_rss_bytes is not None:
        lines.append(
            f"  {'':<10} {'':>14}  (process peak RSS {format_size(figures.host_peak_rss_bytes)}"
            f" from {format_size(figures.host_start_rss_bytes)} at the start, "
            f"{figures.host_source})"
        )
    return lines


def sites_lines(sites: tuple[Site, ...], peak_bytes: int) -> list[str]:
    """The sites of a peak, by module and by source (file:function:line), each biggest
    first."""
    lines = [
        f"top sites at the peak ({format_size(peak_bytes)} above the start, in a second run "
        "of the test's body with sites on):"
    ]
    for title, grouping in (("by module", "module"), ("by source", "source")):
        lines.append(f"  {title}:")
        lines += [
            f"    {format_size(s.size_bytes):>12}  {s.key}" + (f":{s.line}" if s.line else "")
            for s in sites
            if s.grouping == grouping
        ]
    return lines


__all__ = [
    "CUDA_ONLY",
    "MARK",
    "MARK_HELP",
    "VIEWS",
    "BudgetVerdict",
    "MemoryBudget",
    "judge",
    "read_mark",
    "sites_lines",
    "views_lines",
]
