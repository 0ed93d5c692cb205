"""Host view: the exact peak RSS of this process.

`/proc/self/status` VmHWM is the kernel's exact high-water mark; writing "5" to
`/proc/self/clear_refs` resets it to the current RSS. Where that write is refused, fall
back to getrusage's ru_maxrss, which cannot be reset, and say so.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import sys
from typing import Any


def status_kib(*fields: str) -> dict[str, int | None]:
    """Fields of /proc/self/status in KiB, read at one instant (one read of the file);
    None for a field the kernel does not give, or for every field without /proc."""
    found: dict[str, int | None] = dict.fromkeys(fields)
    try:  # os.read: no Python file object, a test's span reads this twice
        fd = os.open("/proc/self/status", os.O_RDONLY)
        try:
            text = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
    except OSError:
        return found
    for field in fields:
        at = text.find(b"\n" + field.encode() + b":")
        if at >= 0:
            found[field] = int(text[at + len(field) + 2 : text.index(b"\n", at + 1)].split()[0])
    return found


def current_rss() -> int | None:
    kib = status_kib("VmRSS")["VmRSS"]
    return None if kib is None else kib * 1024


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """The RSS from /proc/self/statm, VmRSS's own counters in pages: a tenth of the cost of
    reading /proc/self/status, which a test's span would pay at its start."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            fields = os.read(fd, 256).split()
        finally:
            os.close(fd)
        return int(fields[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return current_rss()


@functools.cache
def _has_vmhwm() -> bool:
    """Whether the kernel gives VmHWM (asked once)."""
    return status_kib("VmHWM")["VmHWM"] is not None


def _file_backed(kib: dict[str, int | None]) -> int | None:
    if kib.get("RssFile") is None:
        return None
    return ((kib["RssFile"] or 0) + (kib.get("RssShmem") or 0)) * 1024


def file_backed_rss() -> int | None:
    """Resident file-backed and shared pages (RssFile + RssShmem): libraries and mapped
    files. Reclaimable, and they follow the page cache rather than the code."""
    return _file_backed(status_kib("RssFile", "RssShmem"))


class HostPeak:
    """Reset, then read, the process's peak RSS. `source` says which mechanism is used;
    `start_rss` is the RSS right after the reset (read with the high-water mark)."""

    def __init__(self) -> None:
        self.start_rss: int | None = None
        self.source = "vmhwm" if self.reset() else "ru_maxrss"

    def reset(self) -> bool:
        """Reset the high-water mark to the current RSS; False where the kernel refuses."""
        try:
            fd = os.open("/proc/self/clear_refs", os.O_WRONLY)
            try:
                os.write(fd, b"5")
            finally:
                os.close(fd)
        except OSError:
            self.start_rss = current_rss()
            return False
        self.start_rss = resident_bytes()
        return _has_vmhwm()

    def peak(self) -> int:
        return self.peak_and_file_backed()[0]

    def peak_and_file_backed(self) -> tuple[int, int | None]:
        """The peak RSS since the reset, and the file-backed resident bytes now, read at
        one instant."""
        kib = status_kib("VmHWM", "RssFile", "RssShmem")
        if self.source == "vmhwm" and kib["VmHWM"] is not None:
            return kib["VmHWM"] * 1024, _file_backed(kib)
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return (maxrss if sys.platform == "darwin" else maxrss * 1024), _file_backed(kib)


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL("libc.so.6")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Any:
    """glibc's `mallinfo2`, returning `_MallInfo2`; None without glibc 2.33 or later."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallinfo2 = _libc().mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    return mallinfo2


def free_heap_bytes() -> int | None:
    """Bytes the C heap holds free (glibc's `mallinfo2`, every arena): what a later
    allocation may reuse, resident or not. None where there is no glibc 2.33 or later."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.fordblks + info.fsmblks)


def release_free_heap() -> bool:
    """Give the heap's free pages back to the kernel (glibc `malloc_trim(0)`), so that the
    level a step starts from is its live memory, not whatever the warm-up's frees left
    resident: otherwise the step's growth above it varies run to run with no change in code.
    False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True
