"""Host view of a case's whole process tree: the memory its processes held, and their end.

The worker starts in its own session, so it and what it starts (data-loader workers,
helpers) share one process group. Where a cgroup v2 with the memory controller can be
created, the case also runs in a cgroup of its own, which holds its processes and ends them
all (`cgroup.kill`). Its memory is sampled either way, so that a case forked by the fork
server (whose inherited pages stay charged to the server's cgroup) and a spawned one read
the same figure (a cgroup's `memory.peak` counts page cache and kernel memory too): the
runner samples the group and the worker's descendants, and the largest sum seen of the
worker's own memory (anonymous and shmem RSS: the `host` metric's anonymous memory and the
shared memory it maps, such as data-loader batches) and each descendant's private memory
(`Private_Dirty` of /proc/PID/smaps_rollup: a forked data-loader worker's pages that it
still shares with its parent are counted once, in the parent, where summed RSS would count
them in each) is the tree's peak. Proportional set sizes would split the pages the worker
shares with the fork server it was forked from, and undercount the case. A spike between two
samples is missed, and a page that two descendants share and the worker does not map is in
neither's figure. Each process's part at that sample is kept too
(`at_peak`): what a growth of the tree names.

A process that leaves the tree (a new session, a double fork) and whose parent then exits
would be adopted by init and lost to the case: while a case runs, the runner is the
subreaper of its descendants (`subreaper()`), so such an orphan becomes the runner's child,
in a process group not the runner's, and is still one of the case's processes.

The worker may be the runner's child (spawned) or not (forked by the fork server): either
way it is waited on through its pidfd, and it is never reaped here before its tree ends.

Where the runner itself is killed (SIGKILL), every process memtrack started dies with its
parent (`die_with_parent`); what the case started, the runner's guard ends (measure.guard).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from memtrack.records.model import MAIN_PROCESS

SAMPLE_INTERVAL_S = 0.2
TERM_GRACE_S = 2.0
"""How long the case's processes get to exit after SIGTERM before SIGKILL."""
KILL_WAIT_S = 10.0
CGROUP = "cgroup"
"""What runs recorded as their tree's source where a cgroup's `memory.peak` was the figure
(page cache and kernel memory included: another figure than `SAMPLED`'s)."""
SAMPLED = "sampled"
"""The tree's peak from samples: memtrack's processes' own memory, the others' private."""
RSS_SUMMED = "process-group samples (lower bound)"
"""What runs recorded before `SAMPLED`: the sum of the processes' RSS, a page shared by a
forked child counted once per process (not the `host_tree` metric's figure)."""


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start time) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow the last ')'.
    fields = text.rpartition(")")[2].split()
    try:
        return fields[0], int(fields[1]), int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


def living() -> dict[int, tuple[str, int, int, int]] | None:
    """Every process running (zombies not counted): pid -> its proc_stat; None without /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    procs = {}
    for entry in entries:
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[0] not in ("Z", "X"):
                procs[int(entry)] = st
    return procs


def with_descendants(found: set[int], procs: dict[int, tuple[str, int, int, int]]) -> set[int]:
    """`found` and, of `procs` (living()), every process they started, at any depth."""
    found = set(found)
    grown = True
    while grown:
        more = {p for p, st in procs.items() if st[1] in found}
        grown = not more <= found
        found |= more
    return found


def _kib_fields(path: str, wanted: tuple[str, ...]) -> dict[str, int] | None:
    """The `wanted` fields ('Name: 123 kB') of a /proc file, in bytes; None once the
    process is gone (a zombie's files hold none of them)."""
    found: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in wanted:
                    found[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return found or None


def own_memory(pid: int) -> int | None:
    """The anonymous and shared (shmem) memory a process of memtrack's maps (`RssAnon +
    RssShmem`), whoever else maps it too, at this moment."""
    found = _kib_fields(f"/proc/{pid}/status", ("RssAnon", "RssShmem"))
    return None if found is None else sum(found.values())


def private_memory(pid: int) -> int | None:
    """The memory a process of the case's maps alone and has written (`Private_Dirty` of
    /proc/PID/smaps_rollup): what a forked data-loader worker added to its parent's pages,
    which it still shares and which its parent's figure counts already."""
    found = _kib_fields(f"/proc/{pid}/smaps_rollup", ("Private_Dirty",))
    return None if found is None else found["Private_Dirty"]


def _comm(pid: int) -> str | None:
    """A process's command name (what a data-loader worker calls itself: `pt_data_worker`);
    None once it is gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip() or "process"
    except OSError:
        return None


class _Cgroup:
    """A cgroup v2 of the case's own, with the memory controller, or nothing at all."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls) -> _Cgroup | None:
        """A new child of this process's cgroup v2, where one can be made and has
        `memory.peak` (a v1 memory hierarchy, no delegation or an old kernel: None)."""
        parent = _own_cgroup2_dir()
        if parent is None:
            return None
        path = parent / f"memtrack-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except OSError:
            return None
        if not (path / "memory.peak").is_file():
            cls(path).remove()
            return None
        return cls(path)

    def add(self, pid: int) -> bool:
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
            return True
        except OSError:
            return False

    def pids(self) -> set[int]:
        try:
            return {int(x) for x in (self.path / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            return set()

    def kill(self) -> None:
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:  # before Linux 5.14: signal each process
            for pid in self.pids():
                _signal(pid, signal.SIGKILL)

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def _own_cgroup2_dir() -> Path | None:
    """Where this process's cgroup v2 is mounted, from /proc/self/{cgroup,mountinfo}."""
    try:
        own = next(
            line[3:].strip()
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, StopIteration):
        return None
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and len(fields) > 4:
            root, point = fields[3], fields[4]
            if own == root or own.startswith(root.rstrip("/") + "/"):
                return Path(point) / own[len(root) :].lstrip("/")
    return None


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def die_with_parent(parent_pid: int) -> None:
    """This process gets SIGKILL when its parent dies (Linux's parent-death signal): a killed
    `memtrack run` must not leave a process of memtrack's holding the GPU or host memory.
    Called in the child itself, first thing; `parent_pid` is the pid the parent gave it.

    If the parent died before the signal was armed, this process was re-parented already and
    nothing would ever send it: it exits now. Compared with the parent's pid, not with 1: as
    a container's entrypoint the runner is PID 1 itself, and a subreaper may adopt an orphan.

    The signal comes when the *thread* that forked this process ends, not its process: each
    parent forks from its main thread (the runner's `launch` and the fork server's loop run
    there; the server refuses to fork while any other thread runs), which ends only with it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """This process is the subreaper of its descendants meanwhile (Linux; yields whether it
    is): an orphan of a case is re-parented here, not to init, and stays findable."""
    if not sys.platform.startswith("linux"):
        yield False
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    before = ctypes.c_int(0)
    libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0)
    ok = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield ok
    finally:
        if ok and not before.value:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _signal(pid: int, sig: int, *, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ProcessTree:
    """The processes of one case, whose first is the worker `pid` (a session leader).
    `on_member(pid)` is told of each process of the case when it is first seen (the NVML
    sampler watches them: a compile worker's device memory is the case's too)."""

    def __init__(
        self,
        pid: int,
        on_member: Callable[[int], None] | None = None,
        *,
        spared: Collection[int] = (),
    ):
        self.pid = pid
        self.spared = frozenset(spared)
        """The runner's own children that are no part of any case (its guard)."""
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        """Each process's share at the sample where the sum peaked, by name ('main', a rank
        `rank N`, the others their command name and their order of start: `pt_data_worker
        1`): they add up to the sampled peak."""
        self.comms: dict[tuple[int, int], str] = {}
        """Each process's command name, read when it is first sampled: (pid, start) -> name."""
        self.ranks = [pid]
        """The processes memtrack started, in the order of their ranks."""
        self.on_member = on_member
        self.known: dict[int, int] = {}
        """Every process of the case seen so far: pid -> start time (a reused pid differs)."""
        self.workers = {pid}
        """The processes memtrack started (reaped by their owner, never here)."""
        self.runner = os.getpid()
        self.runner_group = os.getpgid(0)
        st = proc_stat(pid)
        self.started = st[3] if st is not None else 0
        """The first worker's start time: an adopted orphan of the case started after it."""
        self.cgroup = _Cgroup.create()
        if self.cgroup is not None and not self.cgroup.add(pid):
            self.cgroup.remove()
            self.cgroup = None

    def add(self, pid: int) -> None:
        """Another process of the case started beside the first (a rank of a multi-rank
        case, in the first one's process group): into the cgroup with it, where there is one."""
        if self.cgroup is not None:
            self.cgroup.add(pid)
        self.workers.add(pid)
        self.ranks.append(pid)
        st = proc_stat(pid)
        if st is not None:
            self.known[pid] = st[3]

    def _adopted(self, pid: int, st: tuple[str, int, int, int]) -> bool:
        """An orphan of the case, re-parented to the runner as its subreaper: the runner's
        child, outside the runner's own process group, started since the case did, and none
        of the runner's own helpers."""
        return (
            st[1] == self.runner
            and st[2] != self.runner_group
            and st[3] >= self.started
            and pid not in self.spared
        )

    @property
    def cgroup_path(self) -> Path | None:
        """The case's own cgroup, where it has one."""
        return self.cgroup.path if self.cgroup is not None else None

    @property
    def source(self) -> str:
        return SAMPLED

    def members(self) -> set[int]:
        """Living processes of the case: its group, the worker's descendants, the cgroup."""
        procs = living()
        if procs is None:  # no procfs: the process group alone is ended
            return set()
        found = {p for p, st in procs.items() if st[2] == self.pid or self._adopted(p, st)}
        if self.pid in procs:  # before it leads its own session, too (never reaped before)
            found.add(self.pid)
        found |= {p for p, start in self.known.items() if procs.get(p, ("", 0, 0, -1))[3] == start}
        if self.cgroup is not None:
            found |= self.cgroup.pids() & set(procs)
        # children that left the group in a new session are still the case's
        found = with_descendants(found, procs)
        for p in found:
            if self.on_member is not None and self.known.get(p) != procs[p][3]:
                self.on_member(p)
            self.known[p] = procs[p][3]
        return found

    def sample(self) -> None:
        """One look at the tree's processes' shares; the peak of their sum is the tree's
        peak (the worker's own exact peak is a bound too: the caller takes it)."""
        shares: dict[int, int] = {}
        for pid in self.members():
            key = (pid, self.known.get(pid, 0))
            if pid not in self.workers and key not in self.comms:
                comm = _comm(pid)  # named before its memory is read: gone, it counts nothing
                if comm is None:
                    continue
                self.comms[key] = comm
            share = own_memory(pid) if pid in self.workers else private_memory(pid)
            if share:
                shares[pid] = share
        total = sum(shares.values())
        if total > self.peak:
            self.peak = total
            self.at_peak = self._named(shares)

    def _named(self, shares: dict[int, int]) -> dict[str, int]:
        """`shares` by process name: the case's own process(es) by rank, the others by
        command name and order of start (stable from run to run, where pids are not)."""
        named: dict[str, int] = {}
        ranks = {
            pid: (MAIN_PROCESS if len(self.ranks) == 1 else f"rank {r}")
            for r, pid in enumerate(self.ranks)
        }
        seen: dict[str, int] = {}
        for pid in sorted(shares, key=lambda p: (self.known.get(p, 0), p)):
            if pid in ranks:
                name = ranks[pid]
            else:
                comm = self.comms[(pid, self.known.get(pid, 0))]
                seen[comm] = seen.get(comm, 0) + 1
                name = f"{comm} {seen[comm]}"
            named[name] = named.get(name, 0) + shares[pid]
        return named

    def wait(self, timeout_s: float) -> bool:
        """Sample until the worker exits (False: the timeout came first). The worker is not
        reaped: while it is a zombie its pid, the group's id, cannot be reused."""
        deadline = time.monotonic() + timeout_s
        try:
            pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # before Linux 5.3
            pidfd = None
        try:
            while True:
                self.sample()
                if _exited(self.pid, pidfd):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if pidfd is not None:
                    select.select([pidfd], [], [], min(SAMPLE_INTERVAL_S, left))
                else:
                    time.sleep(min(0.05, left))
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def wait_all(
        self, pids: list[int], timeout_s: float, failed: Callable[[int], bool]
    ) -> tuple[bool, dict[int, float]]:
        """Sample until every process of `pids` exits, or one exits that `failed(pid)` says
        failed (the others would wait for it forever in a collective), or the timeout comes
        (False). Returns whether it ended in time and, for each process seen to exit, when
        (time.monotonic()). None is reaped, so no pid in the group can be reused meanwhile."""
        deadline = time.monotonic() + timeout_s
        exited: dict[int, float] = {}
        fds: dict[int, int] = {}
        try:
            for pid in pids:
                try:
                    fds[pid] = os.pidfd_open(pid)
                except (AttributeError, OSError):  # before Linux 5.3: poll
                    pass
            while True:
                self.sample()
                for pid in pids:
                    if pid in exited:
                        continue
                    if _exited(pid, fds.get(pid)):
                        exited[pid] = time.monotonic()
                        if failed(pid):
                            return True, exited
                if len(exited) == len(pids):
                    return True, exited
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, exited
                waiting = [fd for pid, fd in fds.items() if pid not in exited]
                if waiting and len(fds) == len(pids):
                    select.select(waiting, [], [], min(SAMPLE_INTERVAL_S, left))
                else:
                    time.sleep(min(0.05, left))
        finally:
            for fd in fds.values():
                os.close(fd)

    def end(self) -> None:
        """End every process of the case: SIGTERM, a short grace, then SIGKILL."""
        self.sample()  # the processes still alive, once more
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
            _signal(self.pid, sig, group=True)
            for pid in self.members():
                _signal(pid, sig)
            if sig == signal.SIGKILL and self.cgroup is not None:
                self.cgroup.kill()
            deadline = time.monotonic() + grace
            while self.members() and time.monotonic() < deadline:
                time.sleep(0.02)
            if not self.members():
                break
        if self.cgroup is not None:
            self.cgroup.remove()
        self.reap_orphans()

    def reap_orphans(self) -> None:
        """Reap the case's orphans that the runner adopted and that have exited: its own
        workers are left to whoever started them."""
        try:
            entries = os.listdir("/proc")
        except OSError:
            return
        for entry in entries:
            if not entry.isdigit() or int(entry) in self.workers:
                continue
            st = proc_stat(int(entry))
            if st is not None and st[0] in ("Z", "X") and self._adopted(int(entry), st):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(entry), os.WNOHANG)


def _exited(pid: int, pidfd: int | None) -> bool:
    """Whether a process has exited (a zombie counts), without reaping it: its pidfd is
    readable then, whoever its parent is; without one, only a child of this process can tell."""
    if pidfd is not None:
        return bool(select.select([pidfd], [], [], 0)[0])
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already (SIGCHLD ignored), or not a child
        return True
