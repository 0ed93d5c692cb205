"""Instructions retired by the case's threads, counted by the CPU's own counter through
Linux `perf_event_open`: a figure other processes do not move (a thread waiting for a core
retires nothing), shown beside CPU time. Counted in user space only, one counter per thread
of the process (each inherited by the threads it starts), read before and after every
iteration outside its clocks (one 8-byte read per thread).

Where the kernel or the machine gives no hardware counter (a virtual machine without a
virtual PMU, `perf_event_paranoid` above 2, seccomp), nothing is counted and `Counters.why`
says why in one line.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_HW_INSTRUCTIONS = 1
PERF_COUNT_SW_TASK_CLOCK = 1
_FLAG_FD_CLOEXEC = 8
_INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 1, 1 << 5, 1 << 6
_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7; the kernel accepts any size it knows
_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319}
_PARANOID = "/proc/sys/kernel/perf_event_paranoid"
_TASKS = "/proc/self/task"


def _paranoid() -> str:
    try:
        with open(_PARANOID) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _reason(code: int) -> str:
    name = errno.errorcode.get(code, str(code))
    if code in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV):
        return f"this machine's CPU exposes no instruction counter to it (perf_event_open: {name})"
    if code in (errno.EACCES, errno.EPERM):
        return (
            f"perf_event_open refused ({name}): kernel.perf_event_paranoid is {_paranoid()} "
            "(2 or less lets a process count its own threads in user space)"
        )
    if code == errno.ENOSYS:
        return "this kernel has no perf_event_open (ENOSYS)"
    return f"perf_event_open failed: {name}"


class Counters:
    """One counter per thread of this process, summed: `read()` the count so far, None
    where nothing is counted (`why` says why)."""

    def __init__(self, fds: list[int], why: str | None):
        self.fds = fds
        self.why = why

    @classmethod
    def open(
        cls, kind: int = PERF_TYPE_HARDWARE, config: int = PERF_COUNT_HW_INSTRUCTIONS
    ) -> Counters:
        """Counters of the process's threads now; `kind`/`config` another event (the tests
        count task-clock where the machine has no hardware counter)."""
        nr = _SYSCALL.get(platform.machine())
        if nr is None or not os.path.isdir(_TASKS):
            return cls([], f"no perf_event_open on {platform.system()} {platform.machine()}")
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError as exc:
            return cls([], f"no C library to call perf_event_open through ({exc})")
        attr = ctypes.create_string_buffer(_ATTR_SIZE)
        flags = _INHERIT | _EXCLUDE_KERNEL | _EXCLUDE_HV
        struct.pack_into("=IIQQQQQ", attr, 0, kind, _ATTR_SIZE, config, 0, 0, 0, flags)
        fds: list[int] = []
        for tid in sorted(int(t) for t in os.listdir(_TASKS) if t.isdigit()):
            fd = libc.syscall(nr, attr, tid, -1, -1, _FLAG_FD_CLOEXEC)
            if fd >= 0:
                fds.append(fd)
                continue
            code = ctypes.get_errno()
            if code == errno.ESRCH:  # the thread ended meanwhile
                continue
            for opened in fds:
                os.close(opened)
            return cls([], _reason(code))
        return cls(fds, None if fds else "no thread to count")

    def read(self) -> int | None:
        if not self.fds:
            return None
        return sum(struct.unpack("=q", os.read(fd, 8))[0] for fd in self.fds)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


__all__ = [
    "PERF_COUNT_HW_INSTRUCTIONS",
    "PERF_COUNT_SW_TASK_CLOCK",
    "PERF_TYPE_HARDWARE",
    "PERF_TYPE_SOFTWARE",
    "Counters",
]
