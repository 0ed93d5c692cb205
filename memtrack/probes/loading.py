"""Loading view: host peak, disk I/O and disk space of the step a workload marks as loading.

`ctx.loading()` (memtrack.workload.context) hands its phase to a `LoadingProbe`, which the worker
creates. Around the phase it resets the host high-water mark (VmHWM, see probes.host), reads
`/proc/self/io` before and after, and at the end adds up the size of the files the loading
declared (by default the case's scratch directory). No torch here: it measures the process.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memtrack.probes.host import HostPeak, file_backed_rss

IO_FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")


def io_counters(path: str = "/proc/self/io") -> dict[str, int] | None:
    """The process's I/O counters (all its threads), or None where the file cannot be read
    (not Linux, or a kernel without task I/O accounting)."""
    try:
        with open(path) as f:
            pairs = (line.split(":", 1) for line in f if ":" in line)
            counters = {k.strip(): int(v) for k, v in pairs}
    except (OSError, ValueError):
        return None
    return counters if all(k in counters for k in IO_FIELDS) else None


def files_bytes(paths: Iterable[Path]) -> int:
    """Apparent size (st_size) of the files at `paths`, directories walked, each file counted
    once however many names reach it. Symbolic links to files are followed (a model cache's
    snapshot folders link to their blobs); links to directories are not (no cycles)."""
    seen: set[tuple[int, int]] = set()
    total = 0

    def add(p: str) -> None:
        nonlocal total
        try:
            st = os.stat(p)
        except OSError:
            return  # removed meanwhile, or a dangling link: takes no space
        key = (st.st_dev, st.st_ino)
        if key not in seen and not os.path.isdir(p):
            seen.add(key)
            total += st.st_size

    for path in paths:
        if Path(path).is_dir():
            for folder, _, names in os.walk(path):
                for name in names:
                    add(os.path.join(folder, name))
        else:
            add(str(path))
    return total


class LoadingProbe:
    """Measures each `ctx.loading()` phase; several phases add up (peaks: the largest)."""

    def __init__(self, host: HostPeak, io_path: str = "/proc/self/io"):
        self.host = host
        self.io_path = io_path
        self.before_peak = 0
        """The host peak before the first reset: the worker keeps it in the case's peak."""
        self.duration_s: float | None = None
        self.peak: int | None = None
        self.file_rss: int | None = None
        self.io: dict[str, int] | None = None
        self.disk: int | None = None
        self.notes: list[str] = []

    @contextlib.contextmanager
    def phase(self, paths: tuple[Path, ...]) -> Iterator[None]:
        resettable = self.host.source == "vmhwm"
        if resettable:
            self.before_peak = max(self.before_peak, self.host.peak())
            self.host.reset()
        io0 = io_counters(self.io_path)
        t0 = time.perf_counter()
        yield
        elapsed = time.perf_counter() - t0
        io1 = io_counters(self.io_path)
        self.duration_s = (self.duration_s or 0.0) + elapsed
        if resettable:
            self.peak = max(self.peak or 0, self.host.peak())
            self.file_rss = file_backed_rss()
        if io0 is not None and io1 is not None:
            io = self.io or dict.fromkeys(IO_FIELDS, 0)
            self.io = {k: io[k] + max(0, io1[k] - io0[k]) for k in IO_FIELDS}
        self.disk = files_bytes(paths)

    def fields(self) -> dict[str, Any]:
        """The Measurement's loading fields, and notes where one could not be measured;
        nothing when the workload marked no loading."""
        if self.duration_s is None:
            return {}
        if self.peak is None:
            self.notes.append(
                "loading host peak not measured: the high-water mark cannot be "
                "reset here (/proc/self/clear_refs refused)"
            )
        if self.io is None:
            self.notes.append("loading disk I/O not measured: /proc/self/io cannot be read")
        io = self.io or {}
        return {
            "load_duration_s": self.duration_s,
            "load_host_peak_rss_bytes": self.peak,
            "load_file_rss_bytes": self.file_rss,
            "load_rchar_bytes": io.get("rchar"),
            "load_wchar_bytes": io.get("wchar"),
            "load_read_bytes": io.get("read_bytes"),
            "load_write_bytes": io.get("write_bytes"),
            "disk_bytes": self.disk,
        }
