"""The CPU allocator's allocations and frees, as torch's profiler reports them (its memory
events, `profile_memory`): what the CPU framework view and a test's span read their peak
from, as the highest running sum over a block.

The per-thread profiler (torch's legacy one, `_enable_profiler_legacy`) is used: it reports
the allocations of the thread that enables it, so each session thread of a concurrent case
records its own and they are merged by time; and it starts and stops in microseconds, where
the process-wide one (kineto) takes milliseconds, which a suite of small tests pays for
every test. A free is reported with its size only where the profiler saw the allocation:
a block made before the block started and freed in it does not lower the sum.

Only the allocator's events are wanted: the thread's op callbacks (RecordFunction) are
switched off for the block, so that the profiler records no event per op (the allocator
reports to it all the same); a small test's span costs a third as much. They are switched
on again at its end, as torch starts them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any


def highest_running_sum(deltas: list[int]) -> int:
    """The most the allocations and frees, in order, ever added to the starting level."""
    running = highest = 0
    for d in deltas:
        running += d
        highest = max(highest, running)
    return highest


@functools.cache
def _legacy_profiler() -> tuple[Any, Any, Any, Any]:
    """torch's per-thread profiler: its configuration (CPU memory events, nothing else), its
    enable and disable, and the switch of this thread's op callbacks (RecordFunction), looked
    up once."""
    import torch
    from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig
    from torch.autograd import _disable_profiler_legacy, _enable_profiler_legacy

    # record_shapes, profile_memory, with_stack, with_flops, with_modules
    config = ProfilerConfig(
        ProfilerState.CPU, False, True, False, False, False, _ExperimentalConfig()
    )
    ops = getattr(torch.autograd, "_enable_record_function", None)
    return config, _enable_profiler_legacy, _disable_profiler_legacy, ops


class ThreadEvents:
    """Allocations (+bytes) and frees (-bytes) in one or several threads, each recording
    its own (`record`); `in_order()` merges them by time, each thread's in its own order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: list[list[tuple[float, int]]] = []

    @contextlib.contextmanager
    def record(self) -> Iterator[None]:
        """This thread's events within the block."""
        config, enable, disable, ops = _legacy_profiler()
        enable(config)
        if ops is not None:
            ops(False)  # no event per op: the allocator reports its own, op or not
        try:
            yield
        finally:
            if ops is not None:
                ops(True)
            results = disable()
            own = [
                (float(e.start_us()), int(e.cpu_memory_usage()))  # type: ignore[attr-defined]
                for events in results
                for e in events
                if e.cpu_memory_usage() and e.kind() == "memory_alloc"  # an op's reads 0
            ]
            with self.lock:
                self.threads.append(own)

    def in_order(self) -> list[int]:
        merged = sorted(
            (t, i, k, nbytes)
            for i, own in enumerate(self.threads)
            for k, (t, nbytes) in enumerate(own)
        )
        return [nbytes for *_, nbytes in merged]


@contextlib.contextmanager
def cpu_allocator_events(events: ThreadEvents | None = None) -> Iterator[list[int]]:
    """The allocations and frees this thread makes within the block, in order, and those of
    the other threads that record into `events` meanwhile: the list is filled when the
    block ends."""
    recorded: list[int] = []
    events = events or ThreadEvents()
    try:
        with events.record():
            yield recorded
    finally:
        recorded.extend(events.in_order())


__all__ = ["ThreadEvents", "cpu_allocator_events", "highest_running_sum"]
