"""Host view: the exact peak RSS of this process.

`/proc/self/status` VmHWM is the kernel's exact high-water mark; writing "5" to
`/proc/self/clear_refs` resets it to the current RSS. Where that write is refused, fall
back to getrusage's ru_maxrss, which cannot be reset, and say so.
"""

from __future__ import annotations

import resource
import sys


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss() -> int | None:
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def file_backed_rss() -> int | None:
    """Resident file-backed and shared pages (RssFile + RssShmem): libraries and mapped
    files. Reclaimable, and they follow the page cache rather than the code."""
    parts = [_status_kib("RssFile"), _status_kib("RssShmem")]
    if parts[0] is None:
        return None
    return sum(p or 0 for p in parts) * 1024


class HostPeak:
    """Reset, then read, the process's peak RSS. `source` says which mechanism is used."""

    def __init__(self) -> None:
        self.source = "vmhwm" if self.reset() else "ru_maxrss"

    def reset(self) -> bool:
        """Reset the high-water mark to the current RSS; False where the kernel refuses."""
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return _status_kib("VmHWM") is not None
        except OSError:
            return False

    def peak(self) -> int:
        if self.source == "vmhwm":
            kib = _status_kib("VmHWM")
            if kib is not None:
                return kib * 1024
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return maxrss if sys.platform == "darwin" else maxrss * 1024


def release_free_heap() -> bool:
    """Give the heap's free pages back to the kernel (glibc `malloc_trim(0)`), so that the
    level a step starts from is its live memory, not whatever the warm-up's frees left
    resident: otherwise the step's growth above it varies run to run with no change in code.
    False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True
