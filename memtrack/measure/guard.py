"""The run's guard: what a killed `memtrack run` leaves running, ended.

Nothing runs in a process killed by SIGKILL (`kill -9`, the OOM killer, a CI job's hard
cancel). Every process memtrack starts dies with it (its parent-death signal, armed in the
child: probes.tree.die_with_parent), but what a case's workload starts does not: a child in
the case's process group, or in a session of its own, would be left running, holding host or
GPU memory. So each runner process starts one guard (`python -m memtrack.measure.guard
MARK`), in a session of its own (a kill of the runner's process group does not reach it),
whose stdin only the runner holds. When the runner exits, however it ends, the guard reads
the end of its input and ends with SIGKILL every process still running that is the run's:

- every process in a running case's cgroup (`cgroup.kill`), where the machine gives one: all
  of them, whatever they did;
- every process whose environment carries the run's mark (MARK_VARIABLE): the fork server and
  the workers start with it, and what they start inherits it unless it is given an
  environment of its own;
- every process of a running case's process group, and every process of a case that the
  runner saw (it looks every 0.2 s), each known by its start time (a reused pid is another
  process);
- and what any of those started, while its parent still runs.

The guard alone has no parent-death signal: it is there to outlive the runner. After a run
that ended as it should, no process of the run is left, and the guard just exits.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from memtrack.probes.tree import living, proc_stat, with_descendants

MARK_VARIABLE = "MEMTRACK_RUN_MARK"
"""The marks of the runs a process belongs to, comma-separated (a run inside a case of
another carries both): set in the environment of the fork server and of every worker."""
ROUNDS = 200
PAUSE_S = 0.05
"""The guard looks again until it finds none of the run's processes running, at most ROUNDS
times PAUSE_S apart: a process that forked while it was being ended is followed."""

_mark: tuple[int, str] | None = None
"""(the process that made it, the mark): a process forked from the runner makes its own."""
_guard: tuple[int, Guard | None] | None = None
"""(the runner process, its guard or None where it could not start)."""


def mark() -> str:
    """This runner process's mark, made once."""
    global _mark
    if _mark is None or _mark[0] != os.getpid():
        _mark = (os.getpid(), f"{os.getpid()}-{secrets.token_hex(8)}")
    return _mark[1]


def marked(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with this runner's mark added to the marks it carries already."""
    out = dict(env)
    marks = [m for m in out.get(MARK_VARIABLE, "").split(",") if m]
    if mark() not in marks:
        marks.append(mark())
    out[MARK_VARIABLE] = ",".join(marks)
    return out


class Guard:
    """The runner's side: what it tells its guard of each case. The guard's end of the pipe
    going away (it was killed) only means that nothing is guarded any more."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.pid = proc.pid

    def case(self, pgid: int, start: int, cgroup: Path | None) -> None:
        """A case whose first worker `pgid` (started at `start`, in clock ticks since boot)
        leads its process group; `cgroup`: the case's own, where it has one."""
        self._say(f"case {pgid} {start} {cgroup or ''}")

    def member(self, pid: int) -> None:
        """A process of a running case, as the runner found it."""
        st = proc_stat(pid)
        if st is not None:
            self._say(f"pid {pid} {st[3]}")

    def done(self, pgid: int) -> None:
        """The case led by `pgid` has ended: its group id may be reused from now on."""
        self._say(f"done {pgid}")

    def _say(self, line: str) -> None:
        stdin = self.proc.stdin
        if stdin is None:
            return
        try:
            stdin.write(f"{line}\n".encode(errors="surrogateescape"))
            stdin.flush()
        except (OSError, ValueError):  # the guard has gone
            pass


def runner_guard() -> Guard | None:
    """This runner process's guard, started at the first call; None where there is none
    (not Linux, or it could not start)."""
    global _guard
    if _guard is not None and _guard[0] == os.getpid():
        return _guard[1]
    started: Guard | None = None
    if sys.platform.startswith("linux"):
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "memtrack.measure.guard", mark()],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            started = Guard(proc)
        except OSError:
            started = None
    _guard = (os.getpid(), started)
    return started


# -- the guard's side ------------------------------------------------------------------------


@dataclass
class Watched:
    """What the runner told its guard: the running cases and every process of theirs seen."""

    groups: dict[int, int] = field(default_factory=dict)
    """A running case's process group -> its leader's start time."""
    cgroups: dict[int, Path] = field(default_factory=dict)
    """A running case's process group -> its cgroup."""
    pids: dict[int, int] = field(default_factory=dict)
    """A process of a case -> its start time."""

    def read(self, line: str) -> None:
        """One line of the runner's; one it does not know is skipped."""
        words = line.rstrip("\n").split(" ", 3)
        try:
            if words[0] == "case" and len(words) == 4:
                pgid = int(words[1])
                self.groups[pgid] = int(words[2])
                if words[3]:
                    self.cgroups[pgid] = Path(words[3])
            elif words[0] == "pid" and len(words) == 3:
                self.pids[int(words[1])] = int(words[2])
            elif words[0] == "done" and len(words) == 2:
                self.groups.pop(int(words[1]), None)
                self.cgroups.pop(int(words[1]), None)
        except ValueError:
            pass


def run_processes(watched: Watched, run_mark: str) -> set[int]:
    """The run's processes still running (see the module's docstring), the guard itself not
    among them."""
    procs = living() or {}
    procs.pop(os.getpid(), None)
    found = {
        pid
        for pid, st in procs.items()
        if watched.pids.get(pid) == st[3]
        or (st[2] in watched.groups and st[3] >= watched.groups[st[2]])
        or _carries(pid, run_mark)
    }
    for cgroup in watched.cgroups.values():
        with contextlib.suppress(OSError, ValueError):
            found |= {int(p) for p in (cgroup / "cgroup.procs").read_text().split()} & set(procs)
    return with_descendants(found, procs)


def _carries(pid: int, run_mark: str) -> bool:
    """Whether the process's environment (as it was started) carries the run's mark."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:  # gone, or another user's
        return False
    prefix = f"{MARK_VARIABLE}=".encode()
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return run_mark.encode() in entry[len(prefix) :].split(b",")
    return False


def end_all(watched: Watched, run_mark: str) -> None:
    """End every process of the run that still runs, the cgroups' first."""
    for _ in range(ROUNDS):
        for cgroup in watched.cgroups.values():
            with contextlib.suppress(OSError):  # gone, or before Linux 5.14: signalled below
                (cgroup / "cgroup.kill").write_text("1")
        found = run_processes(watched, run_mark)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(PAUSE_S)


def main(argv: list[str]) -> int:
    """Wait for the runner's end (the end of stdin), then end what is left of its run."""
    run_mark = argv[0]
    watched = Watched()
    for line in sys.stdin.buffer:
        watched.read(line.decode(errors="surrogateescape"))
    end_all(watched, run_mark)
    return 0


__all__ = [
    "MARK_VARIABLE",
    "Guard",
    "Watched",
    "end_all",
    "main",
    "mark",
    "marked",
    "run_processes",
    "runner_guard",
]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
