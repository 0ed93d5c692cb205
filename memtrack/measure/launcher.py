"""One launcher for a case's worker processes, one or several (the ranks of a multi-rank case):
their spec, their environment, their process group, the wait with its timeout, and their end.

A single measuring worker is forked by the run's fork server where there is one
(measure.forkserver): the same worker, without its imports. The ranks of a multi-rank case,
estimates, and any case the server cannot fork start as fresh interpreters
(`python -m memtrack.worker SPEC RUNNER_PID`); the case then says why in its notes.

Whatever happens (an exception, a timeout, a failing rank), nothing the case started outlives
it: every process of the case's tree is ended before `launch` returns (probes.tree), orphans
that left it included, the runner being their subreaper meanwhile. Where nothing can run in
the runner any more (a SIGKILL), its guard (measure.guard), told of each case and each of its
processes as they are found, ends them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from memtrack.config import Config
from memtrack.measure.forkserver import ForkedWorker, ForkServer
from memtrack.measure.guard import Guard, marked, runner_guard
from memtrack.measure.sampler import NvmlSampler
from memtrack.probes.load import CaseLoad
from memtrack.probes.nvml import SamplerResult
from memtrack.probes.quality import QualitySpec
from memtrack.probes.tree import ProcessTree, subreaper
from memtrack.worker.protocol import MEASURE_WORKER, Result, Spec, read_result
from memtrack.workload.registry import Case

PINNED_ENV = {
    # glibc raises its mmap threshold as large blocks are freed, so whether a step's
    # buffers come from the heap (and stay resident) or from mmap (and are returned) depends
    # on what ran before: the host peak of unchanged code then moved by ~10 MiB run to run.
    # A fixed threshold (glibc's default, 128 KiB) makes it follow live memory within
    # 1 MiB. A value the user set is kept; either way it is recorded in the environment.
    "MALLOC_MMAP_THRESHOLD_": "131072",
    # torch.cuda.is_available() otherwise asks the CUDA runtime (cudaGetDeviceCount), which
    # initialises the driver: a workload module that asks at import (`DEVICE = "cuda" if
    # torch.cuda.is_available() else "cpu"`) made the fork server refuse to fork, and every
    # case was spawned. Asked of NVML, as torch.cuda.device_count() already is, the driver
    # stays uninitialised (torch falls back to the runtime where NVML fails). Not recorded:
    # it changes no figure.
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
}
"""Settings every worker and the fork server run with, unless the user set them."""


M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter for MALLOC_MMAP_THRESHOLD_."""


def pin_this_process() -> bool:
    """PINNED_ENV's allocator threshold in this running process, where the user set none:
    pytest's, whose tests are measured in it beside the runner's workers. glibc reads the
    variable only as a process starts, so the threshold is set with `mallopt`, and the
    variable with it: the environment recorded (its fingerprint) is then the workers', and
    the processes started from here (xdist's workers, a forked test) start with it. False
    where it could not be set (no glibc): nothing changed."""
    name = "MALLOC_MMAP_THRESHOLD_"
    if name in os.environ:
        return True  # the user's, kept and recorded as it is
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    if mallopt(M_MMAP_THRESHOLD, int(PINNED_ENV[name])) != 1:
        return False
    os.environ[name] = PINNED_ENV[name]
    return True


def worker_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a worker runs in: the parent's (or `base`) with PINNED_ENV's defaults
    and the run's mark (measure.guard), which what the workers start inherits. The parent's
    own environment is left as it is."""
    env = marked(os.environ if base is None else base)
    for name, value in PINNED_ENV.items():
        env.setdefault(name, value)
    return env


def new_spec(
    config: Config,
    case: Case,
    device: str,
    warmup: int,
    repeats: int,
    result_path: Path,
    *,
    scratch_dir: Path | None = None,
    quality: QualitySpec | None = None,
    ranks: int | None = None,
    snapshot_path: Path | None = None,
    timing_only: bool = False,
    data_dir: Path | None = None,
) -> Spec:
    """What a worker needs to find and run one case: the same for a measured case, each rank
    of one, and an estimate."""
    return Spec(
        module=case.module,
        root=str(config.root),
        workload=case.workload,
        params=case.params,
        seed=case.seed,
        device=device,
        warmup=warmup,
        repeats=repeats,
        data_dir=str(data_dir or config.root / "data"),
        result_path=str(result_path),
        scratch_dir=str(scratch_dir) if scratch_dir else None,
        case_id=case.case_id,
        quality=quality,
        ranks=ranks,
        snapshot_path=str(snapshot_path) if snapshot_path else None,
        timing_only=timing_only,
    )


@dataclass(frozen=True)
class CaseOutcome:
    """What one worker process left: its result and how it ended."""

    result: Result
    returncode: int | None
    timed_out: bool
    stderr_tail: str
    duration_s: float
    sampler: SamplerResult | None
    """The NVML sampler's result for the whole case (CUDA), or why there is none."""
    tree_peak_bytes: int | None = None
    """Host peak of the case's whole process tree (see probes.tree), where measured."""
    tree_source: str | None = None
    spawned: str | None = None
    """Why a case that had a fork server was started as a fresh interpreter instead."""
    load: dict[str, Any] | None = None
    """At a timeout: the machine's load over the case, read while its processes still ran
    (probes.load.CaseLoad: judge.load.Load's fields); None otherwise."""
    tree_processes: dict[str, int] | None = None
    """Each process of the tree's share at its sampled peak, by name (probes.tree)."""


def _group(n: int, first_pid: int | None) -> dict[str, Any]:
    """Popen arguments for the case's process group. A single worker leads a session of its
    own; the ranks of a multi-rank case share the first rank's group in this session (a
    process can only join a group of its own session), so that the case's processes end
    together."""
    if n == 1:
        return {"start_new_session": True}
    pgid = first_pid or 0  # 0: a new group, led by the first rank
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}  # pragma: no cover (Python 3.10)


@dataclass
class _Started:
    """The processes a launch has started so far: all of them are ended, whatever happens."""

    procs: list[subprocess.Popen[bytes] | ForkedWorker] = field(default_factory=list)
    tree: ProcessTree | None = None
    spawned: str | None = None
    """Why a case that had a fork server was started as a fresh interpreter instead."""
    guard: Guard | None = None
    """The runner's guard, told of the case and of each of its processes."""


def launch(
    specs: list[Spec],
    timeout_s: float,
    *,
    worker: str = MEASURE_WORKER,
    envs: list[dict[str, str]] | None = None,
    sampler: NvmlSampler | None = None,
    server: ForkServer | None = None,
    servers: Sequence[ForkServer] | None = None,
) -> tuple[list[CaseOutcome], dict[int, float]]:
    """Run one worker per spec, all at once, until every one has exited, one has failed (the
    others would wait for it in a collective), or the timeout. Returns each one's outcome and,
    by index, when each exited by itself (time.monotonic()); the rest were ended by memtrack
    or timed out. With `sampler` (CUDA), NVML watches every worker and their descendants (as
    the process tree finds them), and the workers read its clock. With `server`, a single
    worker (measuring or estimating) is forked by it; with `servers`, each spec's worker by
    its own, in that server's environment (the two sides of a paired timing)."""
    n = len(specs)
    forking = server is not None and n == 1 and envs is None
    fork_by: Sequence[ForkServer | None] = (
        servers if servers is not None else [server if forking else None] * n
    )
    if envs is None:
        envs = [s.env for s in servers] if servers is not None else [worker_env() for _ in specs]
    clock = sampler.clock_path if sampler is not None else None
    if clock is not None:
        specs = [dataclasses.replace(s, sampler_clock=str(clock)) for s in specs]
    t0 = time.perf_counter()
    case_load = CaseLoad()
    started = _Started(guard=runner_guard())
    in_time = False
    load = None
    exited_pids: dict[int, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="memtrack-spec-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        errs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(n)]
        stack.enter_context(subreaper())
        try:
            _start(started, specs, Path(tmp), errs, envs, worker, fork_by, sampler)
            by_pid = {p.pid: i for i, p in enumerate(started.procs)}
            assert started.tree is not None
            in_time, exited_pids = started.tree.wait_all(
                list(by_pid),
                timeout_s,
                lambda pid: read_result(Path(specs[by_pid[pid]].result_path)).status != "ok",
            )
            if not in_time:  # what the machine did meanwhile, while the case still runs
                load = case_load.figures(started.tree.members())
        finally:
            # Whatever happened, nothing the case started outlives it.
            if started.tree is not None:
                started.tree.end()
                if started.guard is not None:
                    started.guard.done(started.tree.pid)
            for p in started.procs:
                p.wait()
        duration = time.perf_counter() - t0
        tails = []
        for err in errs:
            err.seek(0)
            tails.append(err.read()[-4000:].decode(errors="replace"))
    results = [read_result(Path(s.result_path)) for s in specs]
    exited = {by_pid[pid]: t for pid, t in exited_pids.items()}
    sampled = sampler.stop(memory_window(results)) if sampler is not None else None
    tree, procs = started.tree, started.procs
    outcomes = [
        CaseOutcome(
            results[i],
            procs[i].returncode if i < len(procs) else None,
            not in_time and i not in exited,
            tails[i],
            duration,
            sampled,
            (tree.peak or None) if tree else None,
            tree.source if tree else None,
            started.spawned,
            load,
            tree.at_peak if tree else None,
        )
        for i in range(n)
    ]
    return outcomes, exited


def _start(
    started: _Started,
    specs: list[Spec],
    folder: Path,
    errs: Sequence[IO[bytes]],
    envs: list[dict[str, str]],
    worker: str,
    servers: Sequence[ForkServer | None],
    sampler: NvmlSampler | None,
) -> None:
    """Start one worker per spec (forked by its server where it forks it), each in the case's
    process tree and watched by the sampler before it runs; each goes into `started` at
    once, so that the caller ends it whatever happens next."""
    told: list[Callable[[int], None]] = []
    if sampler is not None:
        told.append(sampler.watch)
    if started.guard is not None:
        told.append(started.guard.member)

    def watch(pid: int) -> None:
        for tell in told:
            tell(pid)

    for i, spec in enumerate(specs):
        spec_path = folder / f"spec-{i}.json"
        spec.write(spec_path)
        proc: subprocess.Popen[bytes] | ForkedWorker | None = None
        server = servers[i]
        if server is not None:
            forked = server.fork([str(spec_path)], errs[i].fileno(), envs[i], worker)
            if isinstance(forked, str):
                started.spawned = forked
            else:
                proc = forked
        if proc is None:
            first = started.procs[0] if started.procs else None
            # beside a forked worker (a pair's other side, a session of its own): its own too
            group = (
                {"start_new_session": True}
                if isinstance(first, ForkedWorker)
                else _group(len(specs), first.pid if first else None)
            )
            proc = subprocess.Popen(
                [sys.executable, "-m", worker, str(spec_path), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errs[i],
                env=envs[i],
                **group,
            )
        started.procs.append(proc)
        watch(proc.pid)
        if started.tree is None:
            tree = ProcessTree(
                proc.pid,
                on_member=watch,
                spared=[started.guard.pid] if started.guard is not None else [],
            )
            started.tree = tree
            if started.guard is not None:
                started.guard.case(tree.pid, tree.started, tree.cgroup_path)
        else:
            started.tree.add(proc.pid)
        if isinstance(proc, ForkedWorker):
            proc.start()  # in the cgroup and watched: it may run now


def memory_window(results: list[Result]) -> tuple[float, ...] | None:
    """The workers' memory passes as one window: [first start, last end], with the latest
    last iteration between them where every worker held its level for the sampler."""
    windows = [
        r.memory_window for r in results if r.memory_window and len(r.memory_window) in (2, 3)
    ]
    if not windows:
        return None
    start, end = min(w[0] for w in windows), max(w[-1] for w in windows)
    if all(len(w) == 3 for w in windows):
        return (start, max(w[1] for w in windows), end)
    return (start, end)


__all__ = [
    "PINNED_ENV",
    "pin_this_process",
    "CaseOutcome",
    "launch",
    "memory_window",
    "new_spec",
    "worker_env",
]
