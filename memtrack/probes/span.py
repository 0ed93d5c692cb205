"""Memory of a span of code in a process that runs other code before and after it (a test in a
pytest session): each view's peak above its level at the span's start.

- allocated, CPU: the highest running sum of the CPU allocator's allocations and frees that
  torch's profiler reports within the span (`profile_memory`), as the worker's CPU view
  counts them: scratch a kernel allocates inside itself is counted, and a block freed in
  the span that was allocated before it does not lower the sum (the profiler never saw its
  size). Exact, whatever the process did before.
- allocated and reserved, CUDA: the caching allocator's peak, reset at the start on every
  device (`reset_peak_memory_stats`), less the level then; the largest rise over the devices.
  Reserved is process-wide: segments an earlier span left cached are reused, not counted.
- device, CUDA: NVML's figure for this process, sampled in a thread during the span; the
  whole process's device memory (its CUDA context and cache included), not a rise.
- host: the peak RSS (VmHWM, reset at the start through /proc/self/clear_refs) less the
  RSS at the start. Process-wide: pages an earlier span freed to the heap and kept are
  reused without a rise, up to the host floor: more free heap than that is given back to
  the kernel at the start (`HEAP_KEPT_BYTES`).

Nothing here prints or decides: `SpanProbe` measures, `SpanFigures` holds the figures.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from memtrack.probes.allocator import cpu_allocator_events, highest_running_sum
from memtrack.probes.host import HostPeak, free_heap_bytes, release_free_heap
from memtrack.records import metrics, to_dict

NVML_INTERVAL_S = 0.01
HEAP_KEPT_BYTES = metrics.FLOORS["host_step"]
"""Free C heap left in place at a span's start: the host floor, the
least host growth the gate judges. Releasing it (`malloc_trim`) makes the test fault those
pages in again, 0.3 ms for a small test, for a difference in its host figure the gate cannot
see; more free heap than this is released, so that what earlier tests freed does not hide
a test's growth."""


@dataclass(frozen=True)
class DeviceRise:
    """One CUDA device's allocator figures over the span."""

    index: int
    allocated_bytes: int
    """Peak allocated above the level at the span's start."""
    reserved_bytes: int
    """Peak reserved above the level at the span's start (process-wide: see the module)."""
    process_bytes: int | None = None
    """NVML's peak of this process's memory on the device during the span; None unsampled."""


@dataclass(frozen=True)
class SpanFigures:
    """What one span used, each view above its level at the start. JSON-able (`to_dict`)."""

    device: str
    """'cpu' or 'cuda': which allocator was read."""
    allocated_bytes: int | None = None
    """Framework peak above the start: the CPU allocator's, or the largest CUDA device's."""
    retained_bytes: int | None = None
    """Framework bytes the span left allocated at its end (its allocations less its frees)."""
    reserved_bytes: int | None = None
    """CUDA: the caching allocator's reserved peak above the start, largest device."""
    device_process_bytes: int | None = None
    """CUDA: NVML's peak of this process's memory, largest device (the whole process's)."""
    host_rise_bytes: int | None = None
    """Peak RSS during the span less the RSS at its start."""
    host_start_rss_bytes: int | None = None
    host_peak_rss_bytes: int | None = None
    """The process's peak RSS during the span (VmHWM reset at its start)."""
    host_file_rss_bytes: int | None = None
    """File-backed and shared resident pages at the span's end."""
    host_source: str | None = None
    """'vmhwm' where the peak was reset at the start; 'ru_maxrss' where it could not be (then
    the peak is the process's since it began, and the rise an upper bound)."""
    devices: tuple[DeviceRise, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpanFigures:
        devices = tuple(DeviceRise(**d) for d in data.get("devices", ()))
        return cls(**{**data, "devices": devices, "notes": tuple(data.get("notes", ()))})


_primed_in: int | None = None
"""The process (pid) whose profiler was started once already, outside any span."""


def prime_profiler() -> None:
    """Start and stop the profiler once in this process: its first start loads and sets up
    the profiling library (tens of MiB of RSS), which must not count as the first span's."""
    global _primed_in
    import os

    if _primed_in == os.getpid():
        return
    import torch

    for _ in range(2):  # the second run reuses what the first left: as every later span does
        with cpu_allocator_events():
            torch.ones(1).add_(1)
    _primed_in = os.getpid()


class _NvmlThread:
    """NVML's figure for this process on every visible device, sampled in a thread."""

    def __init__(self, torch: Any) -> None:
        self.notes: list[str] = []
        self.sampler: Any = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        try:
            import os

            import pynvml

            from memtrack.probes.framework import device_uuid
            from memtrack.probes.nvml import Sampler

            pynvml.nvmlInit()
            uuids = [
                device_uuid(torch.cuda.get_device_properties(i))
                for i in range(torch.cuda.device_count())
            ]
            self.sampler = Sampler(pynvml, [u for u in uuids if u])
            self.pids = {os.getpid()}
        except Exception as exc:  # NVML absent or refusing: the other views stand
            self.notes.append(f"no NVML figure: {exc}")

    def __enter__(self) -> _NvmlThread:
        if self.sampler is not None:
            self.sampler.sample(self.pids)
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(NVML_INTERVAL_S):
            self.sampler.sample(self.pids)

    def __exit__(self, *exc: object) -> None:
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            self.sampler.sample(self.pids)

    def peaks(self) -> dict[int, int | None]:
        if self.sampler is None:
            return {}
        result = self.sampler.result()
        self.notes.extend(result.notes)
        return {d.index: d.peak_process_bytes for d in result.devices}


class SpanProbe:
    """Measure one span: `with probe.span(): ...`, then `probe.figures`."""

    def __init__(self, device: str):
        if device != "cpu" and not device.startswith("cuda"):
            raise ValueError(f"device {device!r} is neither cpu nor cuda")
        self.device = device
        self.figures: SpanFigures | None = None

    @contextlib.contextmanager
    def span(self) -> Iterator[None]:
        if self.device == "cpu":
            prime_profiler()
        free = free_heap_bytes()
        if free is None or free >= HEAP_KEPT_BYTES:
            release_free_heap()  # the level is live memory, not what earlier code left free
        host = HostPeak()  # resets the high-water mark where the kernel lets it
        framework: dict[str, Any] = {}
        try:
            if self.device == "cpu":
                events: list[int] = []
                try:
                    with cpu_allocator_events() as events:
                        yield
                finally:
                    framework["allocated_bytes"] = highest_running_sum(events)
                    framework["retained_bytes"] = sum(events)
            else:
                import torch

                with self._cuda(torch, framework):
                    yield
        finally:
            self._done(host, framework)

    def _done(self, host: HostPeak, framework: dict[str, Any]) -> None:
        peak, file_backed = host.peak_and_file_backed()
        start_rss = host.start_rss
        self.figures = SpanFigures(
            device="cpu" if self.device == "cpu" else "cuda",
            host_rise_bytes=None if start_rss is None else max(0, peak - start_rss),
            host_start_rss_bytes=start_rss,
            host_peak_rss_bytes=peak,
            host_file_rss_bytes=file_backed,
            host_source=host.source,
            **framework,
        )

    @contextlib.contextmanager
    def _cuda(self, torch: Any, out: dict[str, Any]) -> Iterator[None]:
        """The allocator's rise on every device, and NVML's view, into `out` at the end."""
        count = torch.cuda.device_count()
        if count == 0:
            raise RuntimeError(f"device {self.device!r}: torch sees no CUDA device")
        start = []
        for i in range(count):
            torch.cuda.synchronize(i)
            torch.cuda.reset_peak_memory_stats(i)
            start.append((torch.cuda.memory_allocated(i), torch.cuda.memory_reserved(i)))
        nvml = _NvmlThread(torch)
        try:
            with nvml:
                try:
                    yield
                finally:
                    for i in range(count):
                        torch.cuda.synchronize(i)
        finally:
            self._cuda_figures(torch, count, start, nvml, out)

    def _cuda_figures(
        self, torch: Any, count: int, start: list[tuple[int, int]], nvml: Any, out: dict[str, Any]
    ) -> None:
        process = nvml.peaks()
        devices = tuple(
            DeviceRise(
                i,
                max(0, torch.cuda.max_memory_allocated(i) - start[i][0]),
                max(0, torch.cuda.max_memory_reserved(i) - start[i][1]),
                process.get(i),
            )
            for i in range(count)
        )
        known = [d.process_bytes for d in devices if d.process_bytes is not None]
        out.update(
            allocated_bytes=max(d.allocated_bytes for d in devices),
            reserved_bytes=max(d.reserved_bytes for d in devices),
            retained_bytes=sum(torch.cuda.memory_allocated(i) - start[i][0] for i in range(count)),
            device_process_bytes=max(known) if known else None,
            devices=devices,
            notes=tuple(nvml.notes),
        )


__all__ = [
    "DeviceRise",
    "SpanFigures",
    "SpanProbe",
    "prime_profiler",
]
