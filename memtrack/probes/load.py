"""The machine's load around the timing pass: what other processes and the hypervisor took
from the CPUs while the case was timed, so that a slow pass on a busy machine can be told
from a slow step. Linux /proc only; a figure the kernel does not give is None, never 0.

Over the whole pass (its start and end, nothing between): the time the case's threads
waited for a CPU (each thread's /proc/self/task/TID/schedstat, nanoseconds) and the CPU time
other processes used on the CPUs the case may run on (their /proc/stat lines, less the
case's own CPU time): together with the case's own CPU time, the cores the pass wanted.

The pass's start and end also read /proc/pressure/cpu and /proc/stat; a sample before and after
every iteration, outside its clocks, reads /proc/loadavg and, when more than one task runs,
the state of each of this process's threads (a small file each: ~50 us in all for a few
threads here). The timed region is as it was.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Iterable
from typing import Any

PRESSURE = "/proc/pressure/cpu"
STAT = "/proc/stat"
LOADAVG = "/proc/loadavg"
TASKS = "/proc/self/task"
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace")
    except OSError:  # absent, or PSI compiled in and turned off (EOPNOTSUPP)
        return None


def cpu_pressure_us() -> int | None:
    """Microseconds so far in which some task waited for a CPU (PSI `some` total); None where
    the kernel keeps no pressure figures."""
    text = _read(PRESSURE)
    for line in (text or "").splitlines():
        if line.startswith("some "):
            for word in line.split():
                if word.startswith("total=") and word[6:].isdigit():
                    return int(word[6:])
    return None


def cpu_ticks() -> tuple[int, int | None] | None:
    """The machine's CPU time so far in clock ticks (user to steal: guest time is already in
    user), and the part a hypervisor stole (None where the line has no steal column): the
    first line of /proc/stat."""
    text = _read(STAT)
    if not text or not text.startswith("cpu "):
        return None
    words = text.split("\n", 1)[0].split()[1:9]
    if len(words) < 4 or not all(w.isdigit() for w in words):
        return None
    values = [int(w) for w in words]
    return sum(values), values[7] if len(values) == 8 else None


def own_running() -> int:
    """This process's threads in state R now (running or waiting for a CPU), from each
    thread's /proc/self/task/TID/stat (the state follows the command's closing bracket)."""
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return 0
    n = 0
    for tid in tids:
        text = _read(f"{TASKS}/{tid}/stat")
        if text is None:  # the thread has ended
            continue
        at = text.rfind(")")
        if at >= 0 and text[at + 2 : at + 3] == "R":
            n += 1
    return n


def runnable_others() -> int | None:
    """Runnable tasks on the machine now that are not this process's threads, or None where
    the kernel does not say. The count is the kernel's nr_running(): /proc/stat's
    `procs_running`, read from /proc/loadavg ("0.17 0.40 0.22 1/89 9995": running/threads),
    which prints the same counter in 30 bytes, where /proc/stat first sums every interrupt's
    counts over every CPU (milliseconds on a large machine)."""
    text = _read(LOADAVG)
    words = (text or "").split()
    running = words[3].partition("/")[0] if len(words) > 3 else ""
    if not running.isdigit():
        return None
    if int(running) <= 1:  # the one running is the thread reading: no thread list to read
        return 0
    return max(0, int(running) - own_running())


def own_wait_ns() -> dict[str, int] | None:
    """Nanoseconds each of this process's threads has waited on a run queue so far (the
    second figure of its schedstat), by thread id; None where the kernel keeps no scheduler
    figures."""
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return None
    out = {}
    for tid in tids:
        words = (_read(f"{TASKS}/{tid}/schedstat") or "").split()
        if len(words) >= 2 and words[1].isdigit():
            out[tid] = int(words[1])
    return out or None


def waited_ns(before: dict[str, int], after: dict[str, int]) -> int:
    """What the threads alive at the end waited between the two readings (a thread started
    meanwhile from 0; one that ended meanwhile is not known, and counts nothing)."""
    return max(0, sum(ns - before.get(tid, 0) for tid, ns in after.items()))


def busy_ticks(cpus: set[int]) -> int | None:
    """CPU time used on `cpus` so far, in clock ticks (user, nice, system, irq, softirq of
    their /proc/stat lines: not idle, iowait or steal); None where a line is missing."""
    text = _read(STAT)
    if not text or not cpus:
        return None
    total, found = 0, 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        words = rest.split()
        if len(words) < 7 or not all(w.isdigit() for w in words[:7]):
            return None
        user, nice, system, _idle, _iowait, irq, softirq = (int(w) for w in words[:7])
        total += user + nice + system + irq + softirq
        found += 1
    return total if found == len(cpus) else None


def affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set()


def cores(cpus: set[int] | None = None) -> int | None:
    """CPUs this process may run on (its affinity, or `cpus` read from it already), or the
    machine's where the platform has no affinity; None where it cannot say."""
    cpus = affinity() if cpus is None else cpus
    return len(cpus) or os.cpu_count()


class TimingLoad:
    """The load over one timing pass: `start()` before its first iteration, `sample()` before
    and after each iteration (outside its clocks), `figures()` after the last."""

    def __init__(self) -> None:
        self.runnable: list[int] = []
        self._start = 0.0
        self._pressure: int | None = None
        self._ticks: tuple[int, int | None] | None = None
        self._cores: int | None = None
        self._cpus: set[int] = set()
        self._busy: int | None = None
        self._wait: dict[str, int] | None = None
        self._own = 0.0

    def start(self) -> None:
        self._cpus = affinity()
        self._cores = cores(self._cpus)
        self._ticks = cpu_ticks()
        self._pressure = cpu_pressure_us()
        self._wait = own_wait_ns()
        self._busy = busy_ticks(self._cpus)
        self._own = time.process_time() + descendants_cpu_s()
        self._start = time.perf_counter()

    def sample(self) -> None:
        others = runnable_others()
        if others is not None:
            self.runnable.append(others)

    def figures(self) -> dict[str, Any]:
        """The Measurement's `timing_*` figures."""
        wall = time.perf_counter() - self._start
        own = time.process_time() + descendants_cpu_s() - self._own  # its workers' too
        busy, wait = busy_ticks(self._cpus), own_wait_ns()
        pressure, ticks = cpu_pressure_us(), cpu_ticks()
        others = _others_cores(self._busy, busy, len(self._cpus), own, wall)
        return {
            "timing_wait_cores": waited_ns(self._wait, wait) / 1e9 / wall
            if wait is not None and self._wait is not None and wall > 0
            else None,
            "timing_others_cores": others,
            "timing_cpu_pressure": _pressure_share(self._pressure, pressure, wall),
            "timing_runnable": statistics.fmean(self.runnable) if self.runnable else None,
            "timing_steal": _steal_share(self._ticks, ticks),
            "timing_cores": self._cores,
        }


def descendants_cpu_s(root: int | None = None) -> float:
    """CPU seconds that the processes `root` (this one) started have used so far, at any
    depth: those it reaped (getrusage RUSAGE_CHILDREN, with theirs) and, of every one still
    running or not yet reaped, its own and its reaped children's (/proc/PID/stat utime,
    stime, cutime, cstime: clock ticks). A data-loader worker's CPU time is its case's; a
    difference of two readings is what they used between them (a process reaped meanwhile
    moves from the second term to the first). Only for this process's own tree: getrusage
    knows no other."""
    root = os.getpid() if root is None else root
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = []
    for entry in entries:
        read = _stat_ticks(int(entry)) if entry.isdigit() else None
        if read is not None:
            parents[int(entry)], ticks[int(entry)] = read
    found, grown = {root}, True
    while grown:
        more = {p for p, parent in parents.items() if parent in found} - found
        grown = bool(more)
        found |= more
    running = sum(ticks[p] for p in found if p != root and p in ticks)
    return reaped.ru_utime + reaped.ru_stime + running / TICKS_PER_S


def _stat_ticks(pid: int) -> tuple[int, int] | None:
    """A process's parent and its CPU clock ticks so far, its own and its reaped children's
    (/proc/PID/stat ppid; utime, stime, cutime, cstime); None once it is gone."""
    words = (_read(f"/proc/{pid}/stat") or "").rpartition(")")[2].split()
    if len(words) > 14 and words[1].isdigit() and all(w.isdigit() for w in words[11:15]):
        return int(words[1]), sum(int(w) for w in words[11:15])
    return None


def tree_usage(pids: Iterable[int]) -> tuple[float, float]:
    """CPU seconds and run-queue wait seconds of these processes so far: each one's own CPU
    time and its reaped children's (/proc/PID/stat utime, stime, cutime, cstime), and every
    thread's wait (/proc/PID/task/TID/schedstat). A process gone meanwhile counts nothing."""
    cpu_ticks, wait_ns = 0, 0
    for pid in pids:
        read = _stat_ticks(pid)
        cpu_ticks += read[1] if read is not None else 0
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            figures = (_read(f"/proc/{pid}/task/{tid}/schedstat") or "").split()
            if len(figures) >= 2 and figures[1].isdigit():
                wait_ns += int(figures[1])
    return cpu_ticks / TICKS_PER_S, wait_ns / 1e9


class CaseLoad:
    """The machine's load over a whole case, read by the runner: `CaseLoad()` as the case
    starts, `figures(pids)` while its processes `pids` still run (at a timeout). The same
    figures as a timing pass's (judge.load.Load), over the case instead of its pass."""

    def __init__(self) -> None:
        self._cpus = affinity()
        self._busy = busy_ticks(self._cpus)
        self._pressure = cpu_pressure_us()
        self._start = time.perf_counter()

    def figures(self, pids: Iterable[int]) -> dict[str, Any]:
        """pressure, cores, own, wait, others and wall: judge.load.Load's fields."""
        wall = time.perf_counter() - self._start
        own, wait = tree_usage(pids)
        others = _others_cores(self._busy, busy_ticks(self._cpus), len(self._cpus), own, wall)
        return {
            "pressure": _pressure_share(self._pressure, cpu_pressure_us(), wall),
            "cores": cores(self._cpus),
            "own": own / wall if wall > 0 else None,
            "wait": wait / wall if wall > 0 else None,
            "others": others,
            "wall": wall,
        }


def _others_cores(
    before: int | None, after: int | None, cpus: int, own_s: float, wall_s: float
) -> float | None:
    """Cores other processes used on `cpus` CPUs between two `busy_ticks` readings, beside
    `own_s` seconds of this case's CPU time over `wall_s`. Less one clock tick per CPU, the
    counters' resolution: a short pass on a quiet machine does not read as shared (a busy
    one still does, by a tick less)."""
    if before is None or after is None or wall_s <= 0:
        return None
    used = (after - before - cpus) / TICKS_PER_S
    return max(0.0, used - own_s) / wall_s


def _pressure_share(before: int | None, after: int | None, wall_s: float) -> float | None:
    if before is None or after is None or wall_s <= 0:
        return None
    return min(1.0, max(0.0, (after - before) / (wall_s * 1e6)))


def _steal_share(
    before: tuple[int, int | None] | None, after: tuple[int, int | None] | None
) -> float | None:
    """Stolen ticks over all ticks of the pass; None without a steal column, or for a pass
    within one clock tick (nothing was counted either way)."""
    if before is None or after is None or before[1] is None or after[1] is None:
        return None
    total = after[0] - before[0]
    if total <= 0:
        return None
    return min(1.0, max(0.0, (after[1] - before[1]) / total))


__all__ = [
    "CaseLoad",
    "TimingLoad",
    "affinity",
    "busy_ticks",
    "cores",
    "cpu_pressure_us",
    "cpu_ticks",
    "descendants_cpu_s",
    "own_running",
    "own_wait_ns",
    "waited_ns",
    "runnable_others",
    "tree_usage",
]
