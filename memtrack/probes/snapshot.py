"""Memory snapshot of one measured step, written to a private file: the CUDA allocator's
history (for pytorch.org/memory_viz), or MemTracker's peak per module and category on the CPU.

A snapshot shows the model's structure (module names, stack traces): the file is created
with mode 0600 in one call (O_CREAT | O_EXCL), never widened and then narrowed, and an
existing file is never overwritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import torch

from memtrack.probes.framework import category_tracker_class, pushed, trackable

MAX_ENTRIES = 100_000
"""Allocator events kept (the newest): several KB each with their stacks, so about 0.5 GB at
most, and enough for the allocations and frees of one step of a large model."""
FORMAT = "memtrack-module-peaks/1"
_SIZES = (
    ("parameter_mem", "parameters_bytes"),
    ("buffer_mem", "buffers_bytes"),
    ("input_mem", "inputs_bytes"),
    ("output_mem", "outputs_bytes"),
)


@contextlib.contextmanager
def private_file(path: Path) -> Iterator[IO[bytes]]:
    """A new file only its owner can read; removed again if writing it fails."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def capture(
    step: Callable[[], Any],
    device: torch.device,
    objects: tuple[Any, ...],
    path: Path,
    case_id: str,
) -> dict[str, Any]:
    """Run `step` once under the recorder and write the snapshot to `path`."""
    if device.type == "cuda":
        return _cuda(step, device, path)
    return _modules(step, device, objects, path, case_id)


ASYNC_REFUSED = (
    "memtrack snapshot needs PyTorch's caching allocator: this worker runs cudaMallocAsync "
    "(PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF has backend:cudaMallocAsync), which keeps "
    "no allocation history; take the snapshot without that backend"
)


def _cuda(step: Callable[[], Any], device: torch.device, path: Path) -> dict[str, Any]:
    """The allocator's history over one step. `torch.cuda.memory._dump_snapshot(path)` is
    `pickle.dump(_snapshot(), open(path, "wb"))`: the same pickle is written here, into a
    file created private.

    Stacks are Python's only: torch's default, "all", symbolises every C++ frame of every
    event, which took minutes per snapshot on large nodes (and its unwinder has failed
    outright); memory_viz needs the Python frames to say which code allocated."""
    if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
        raise RuntimeError(ASYNC_REFUSED)  # its recordHistory raises a C++ error otherwise
    memory = torch.cuda.memory
    torch.cuda.synchronize(device)
    memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    try:
        step()
        torch.cuda.synchronize(device)
        snapshot = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    with private_file(path) as f:
        pickle.dump(snapshot, f)
    events = sum(len(trace) for trace in snapshot.get("device_traces", []))
    return {"snapshot_kind": "cuda-memory-history", "snapshot_events": events}


def _category(key: Any) -> str:
    return str(getattr(key, "value", key))


def _by_category(snapshot: dict[Any, dict[Any, int]], device: torch.device) -> dict[str, int]:
    by_device = snapshot.get(device) or (next(iter(snapshot.values())) if snapshot else {})
    return {_category(k): int(v) for k, v in by_device.items()}


def _module_table_tracker(device: torch.device) -> Any:
    """memtrack's MemTracker, keeping every module's largest peak across the calls of the
    step: the tracker's own statistics are reset when a root module runs again (a decode
    loop calls the model once per token), so they are folded into the table first."""

    class ModuleTable(category_tracker_class()):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.table: dict[str, dict[str, Any]] = {}

        def reset_mod_stats(self) -> None:
            self.harvest()
            super().reset_mod_stats()

        def harvest(self) -> None:
            for stats in self.memory_tracking.values():
                row = self.table.setdefault(
                    stats.mod_fqn,
                    {
                        "module": stats.mod_fqn,
                        "calls": 0,
                        "peak_bytes": 0,
                        "forward_peak": {},
                        "backward_peak": {},
                    },
                )
                row["calls"] += sum(
                    1
                    for k in stats.snapshots
                    if _category(k) == "Pre-Forward"
                    for _ in stats.snapshots[k]
                )
                for name, key in _SIZES:
                    value = getattr(stats, name, None)
                    if isinstance(value, int):
                        row[key] = max(row.get(key, 0), value)
                peak = max((int(v) for v in stats.local_peak.values()), default=0)
                row["peak_bytes"] = max(row["peak_bytes"], peak)
                for state, field in (
                    ("Peak-Forward", "forward_peak"),
                    ("Peak-Backward", "backward_peak"),
                ):
                    snaps = [
                        s for k, v in stats.snapshots.items() if _category(k) == state for s in v
                    ]
                    for snap in snaps:
                        cats = _by_category(snap, device)
                        if cats.get("Total", 0) > row[field].get("Total", 0):
                            row[field] = cats

    return ModuleTable()


@contextlib.contextmanager
def _pushed_both(tracker: Any, mode: Any) -> Iterator[None]:
    """The tracker and the sites' mode, both on this thread's stack meanwhile."""
    with pushed(tracker), pushed(mode):
        yield


def _modules(
    step: Callable[[], Any], device: torch.device, objects: tuple[Any, ...], path: Path, case: str
) -> dict[str, Any]:
    """MemTracker's peak per module and category over one step, as JSON."""
    from memtrack.probes.sites import recording, sites

    tracker = _module_table_tracker(device)
    tracked = trackable(objects)
    if tracked:
        tracker.track_external(*tracked)
    # a step run in threads of its own (a trainer's loop, concurrent sessions): each
    # thread pushes the tracker and the mode around its part, as the sites pass does
    scope = getattr(step, "scope", None)
    with recording(device, objects, None) as mode, tracker, mode:
        if scope is not None:
            step.scope = lambda: _pushed_both(tracker, mode)  # type: ignore[attr-defined]
        try:
            step()
        finally:
            if scope is not None:
                step.scope = scope  # type: ignore[attr-defined]
    tracker.harvest()
    peak = _by_category(tracker.get_tracker_snapshot("peak"), device)
    modules = sorted(tracker.table.values(), key=lambda r: (-r["peak_bytes"], r["module"]))
    for row in modules:
        for field in ("forward_peak", "backward_peak"):
            if not row[field]:
                del row[field]
    data = {
        "format": FORMAT,
        "case": case,
        "device": str(device),
        "tracker": "torch.distributed._tools.mem_tracker.MemTracker",
        "about": (
            "Peak tensor memory of one step, in bytes: the step's peak by category, "
            "then each module (named by its path in the model) with the largest "
            "total seen while it ran (peak_bytes) and the categories at its forward "
            "and backward peaks; then the sites at the step's peak (by module, by "
            "file:function, by both). Private: it shows the model's structure."
        ),
        "peak_bytes": peak.get("Total", 0),
        "peak_by_category": {k: v for k, v in peak.items() if k != "Total"},
        "modules": modules,
        "sites": [dataclasses.asdict(s) for s in sites(mode, None)],
    }
    with private_file(path) as f:
        f.write((json.dumps(data, indent=2) + "\n").encode())
    return {"snapshot_kind": "memtracker-modules", "snapshot_modules": len(modules)}
