"""Real processes seen through /proc, for the tests of what outlives a killed parent: a
process known by its pid and its start time (a pid reused meanwhile is another process)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

GONE_WITHIN_S = 30.0
"""How long a process may take to end after its parent was killed: a bound for a slow,
shared machine, not a claim about speed."""


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def running(pid: int, start: int) -> bool:
    """Whether that process still runs (a zombie has ended)."""
    st = stat(pid)
    return st is not None and st[2] == start and st[0] not in ("Z", "X")


def child_running(parent: int, word: bytes, timeout_s: float = 300.0) -> tuple[int, int]:
    """(pid, start time) of the child of `parent` whose command line has `word`, once it runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = stat(int(entry))
                if st is not None and st[1] == parent and word in cmdline(int(entry)):
                    return int(entry), st[2]
        time.sleep(0.05)
    raise AssertionError(f"no child of {parent} runs {word!r}")


def wait_until(done: Callable[[], bool], timeout_s: float = GONE_WITHIN_S) -> bool:
    """Whether `done()` came true within the bound."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


HOG = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass\n"
"""A busy loop at idle priority (SCHED_IDLE): always runnable, so every reading of the load
counts it, yet it runs only on a core nothing else wants. The other tests running beside it
keep their cores, and it burns no CPU time they would have used."""


def hogs(n: int) -> list[subprocess.Popen[bytes]]:
    """`n` busy processes (HOG); the caller kills and waits for them."""
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


@contextlib.contextmanager
def busy_loops(n: int, settle_s: float = 0.0) -> Iterator[None]:
    """`n` busy processes (HOG) for the block, `settle_s` given them first to take the
    cores; killed and waited for however the block ends."""
    started = hogs(n)
    try:
        time.sleep(settle_s)
        yield
    finally:
        for hog in started:
            hog.kill()
        for hog in started:
            hog.wait()


def kill(processes: dict[int, int]) -> None:
    """SIGKILL whichever of these (pid -> start time) still run: a failing test leaves none."""
    for pid, start in processes.items():
        if running(pid, start):
            os.kill(pid, signal.SIGKILL)


def ends_with_its_killed_parent(code: str, word: bytes) -> bool:
    """Run `code` in a real Python process; once its child whose command line has `word` runs,
    SIGKILL it (nothing runs in it after that). Whether that child then ends too, within the
    bound. The child is killed afterwards either way."""
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    child: dict[int, int] = {}
    try:
        pid, start = child_running(parent.pid, word)
        child[pid] = start
        parent.kill()
        parent.wait()
        return wait_until(lambda: not running(pid, start))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        kill(child)
