"""The run's guard (memtrack.measure.guard) ends, after a killed runner, the processes of that
run and no other: those carrying its mark, what they started, a running case's process
group, the processes of a case the runner saw (each by its start time). Real processes; the
runner's death itself is in test_faults (a SIGKILL of a real `memtrack run`)."""

from __future__ import annotations

import os
import subprocess
import sys

import processes
import pytest

from memtrack.measure.guard import MARK_VARIABLE, Watched, mark, run_processes
from memtrack.measure.launcher import worker_env

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
STARTS_A_CHILD = [
    sys.executable,
    "-c",
    # a child of its own, with an environment without any mark, in a session of its own
    "import subprocess, sys, time\n"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], env={},"
    " start_new_session=True)\n"
    "print(c.pid, flush=True)\n"
    "time.sleep(600)\n",
]


class Started:
    """Processes a test starts (and `extra`: pid -> start time of others): all are killed at
    its end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.extra: dict[int, int] = {}

    def __call__(self, argv: list[str], env: dict[str, str], **kw: object) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, **kw)
        self.procs.append(proc)
        return proc


@pytest.fixture
def started():
    out = Started()
    yield out
    for proc in out.procs:
        proc.kill()
        proc.wait()
    processes.kill(out.extra)


def _start_time(pid: int) -> int:
    st = processes.stat(pid)
    assert st is not None
    return st[2]


def test_the_guard_finds_the_runs_processes_and_no_other(started):
    plain = {k: v for k, v in os.environ.items() if k != MARK_VARIABLE}
    ours = started(STARTS_A_CHILD, {**plain, MARK_VARIABLE: f"an-outer-run,{mark()}"})
    its_child = int(ours.stdout.readline())
    started.extra[its_child] = _start_time(its_child)
    another_run = started(SLEEP, {**plain, MARK_VARIABLE: "another-run"})
    group = started(SLEEP, plain, start_new_session=True)
    seen = started(SLEEP, plain, start_new_session=True)
    reused = started(SLEEP, plain, start_new_session=True)
    watched = Watched()
    watched.read(f"case {group.pid} {_start_time(group.pid)} \n")
    watched.read(f"pid {seen.pid} {_start_time(seen.pid)}\n")
    watched.read(f"pid {reused.pid} {_start_time(reused.pid) - 1}\n")  # another process's
    watched.read("a line it does not know\n")

    found = run_processes(watched, mark())

    assert {ours.pid, its_child, group.pid, seen.pid} <= found
    assert not {another_run.pid, reused.pid, os.getpid()} & found
    watched.read(f"done {group.pid}\n")  # the case ended: its group id may be reused
    assert group.pid not in run_processes(watched, mark())


def test_what_a_worker_starts_carries_the_runs_mark_and_an_outer_runs_too():
    assert worker_env({})[MARK_VARIABLE] == mark()
    assert worker_env({MARK_VARIABLE: "outer"})[MARK_VARIABLE] == f"outer,{mark()}"


def test_the_guard_is_no_orphan_of_a_case_though_the_runners_child_in_a_session_of_its_own(
    started,
):
    # The runner is its cases' subreaper: a child of its, outside its process group, started
    # since the case did, is taken for a case's orphan and ended with the case, unless it is
    # one of the runner's own helpers, as the guard is.
    from memtrack.probes.tree import ProcessTree, subreaper

    def worker_then_helper() -> tuple[int, subprocess.Popen[str]]:
        worker = started(SLEEP, dict(os.environ), start_new_session=True)
        return worker.pid, started(SLEEP, dict(os.environ), start_new_session=True)

    with subreaper():
        worker, helper = worker_then_helper()
        tree = ProcessTree(worker, spared=[helper.pid])
        assert helper.pid not in tree.members()
        tree.end()
        assert helper.poll() is None  # still running
        worker, other = worker_then_helper()
        tree = ProcessTree(worker)
        assert other.pid in tree.members()  # not spared: taken for the case's orphan
        tree.end()  # ended, and reaped as the case's orphan
        assert processes.stat(other.pid) is None
