"""One case, in its own process: setup, warm-up, timing pass, memory pass, breakdown.

Started by the parent as `python -m memtrack.worker SPEC.json RUNNER_PID`. It writes its
figures to the spec's result path after every phase (atomically), so a crash or a kill
still leaves the partial figures for the parent to record.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrack.worker.process import serve
from memtrack.worker.protocol import ResultFile, Spec
from memtrack.worker.turns import Turns


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timing_pass(step: Any, device: Any, repeats: int) -> dict[str, Any]:
    """Uninstrumented: only clocks (and a device sync on CUDA) around each iteration: the
    wall clock, the process's CPU time (and, read outside the clocks, the CPU time of the
    processes it started: its data-loader workers') and, on CUDA, two events on the current
    stream (the sessions' streams join it). The machine's load is read around each
    iteration, outside its clocks."""
    from memtrack.probes.load import TimingLoad, descendants_cpu_s
    from memtrack.probes.perf import Counters

    load = TimingLoad()
    events = _device_events(device)
    times, cpu_times, tree_cpu_times, device_times, instructions = [], [], [], [], []
    counters = Counters.open()  # after the warm-up: every thread of the step's pools exists
    load.start()
    for _ in range(repeats):
        _sync(device)
        load.sample()
        d0 = descendants_cpu_s()
        i0 = counters.read()
        c0, t0 = time.process_time(), time.perf_counter()
        if events:
            events[0].record(events[2])
        step()
        if events:
            events[1].record(events[2])
        _sync(device)
        t1, c1 = time.perf_counter(), time.process_time()
        i1 = counters.read()
        d1 = descendants_cpu_s()
        load.sample()
        times.append(t1 - t0)
        cpu_times.append(c1 - c0)
        tree_cpu_times.append(c1 - c0 + max(0.0, d1 - d0))
        if i0 is not None and i1 is not None:
            instructions.append(max(0, i1 - i0))
        if events:
            device_times.append(events[0].elapsed_time(events[1]) / 1000)  # ms to s
    figures = load.figures()
    counters.close()
    return {
        **time_summary(times),
        "iteration_cpu_times_s": cpu_times,
        "iteration_tree_cpu_times_s": tree_cpu_times,
        "iteration_device_times_s": device_times,
        "iteration_instructions": instructions,
        "instructions_note": counters.why,
        **figures,
    }


def _pass_medians(timing: dict[str, Any]) -> dict[str, float]:
    """A timing pass's median iteration by each figure it holds for every iteration: what
    the turns of a pair compare (measure.pairs.pass_medians reads the same from the
    record)."""
    from memtrack.records.model import FIGURE_FIELDS

    n = len(timing["iteration_times_s"])
    return {
        figure: float(statistics.median(timing[key]))
        for figure, key in FIGURE_FIELDS.items()
        if n and len(timing[key]) == n
    }


ITERATION_LISTS = (
    "iteration_times_s",
    "iteration_cpu_times_s",
    "iteration_tree_cpu_times_s",
    "iteration_device_times_s",
    "iteration_instructions",
)


def _joined(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """A paired side's timing passes as one: their iterations in order (`repeats` each, so
    that measure.pairs splits them again), the load figures of the last."""
    joined = dict(passes[-1])
    for key in ITERATION_LISTS:
        joined[key] = [x for p in passes for x in p[key]]
    if any(len(p["iteration_instructions"]) != len(p["iteration_times_s"]) for p in passes):
        joined["iteration_instructions"] = []  # a pass without the counter: none counted
    return {**joined, **time_summary(joined["iteration_times_s"])}


def _device_events(device: Any) -> tuple[Any, Any, Any] | None:
    """A CUDA case's two timing events and the stream they are recorded on (this thread's
    current one); None on the CPU."""
    if device.type != "cuda":
        return None
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    return start, end, torch.cuda.current_stream(device)


def time_summary(times: Sequence[float]) -> dict[str, Any]:
    """A timing pass's iteration times and their median, p95 and minimum (the Measurement's
    `iteration_times_s` and `time_*` figures)."""
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]
    return {
        "iteration_times_s": times,
        "time_median_s": statistics.median(times),
        "time_p95_s": p95,
        "time_min_s": ordered[0],
    }


@dataclass
class _Case:
    """One case once set up: what its phases share."""

    wl: Any
    """The workload (registry.Workload)."""
    ctx: Any
    """Its Context."""
    step: Any
    """The step to measure (sessions of it, for a concurrent case)."""
    probe: Any
    """The framework probe (probes.framework)."""
    objects: tuple[Any, ...]
    """What `ctx.mark()` named: the persistent set."""
    rank: Any
    """This worker's distributed.Rank, or None."""
    loading: Any
    """The LoadingProbe `ctx.loading()` reports to."""
    made: Any = None
    """Where its modules and tensors were made while it set up (probes.made.Made)."""


def run_case(spec: Spec, result: ResultFile) -> None:
    from memtrack.probes.host import HostPeak, current_rss, file_backed_rss, release_free_heap

    host = HostPeak()  # first, so the whole case (imports aside) is under one high-water mark
    import torch

    # what the timing pass uses, imported before the step's high-water mark is reset
    import memtrack.probes.load
    import memtrack.probes.perf  # noqa: F401
    from memtrack.worker import distributed

    # What the process holds now (the interpreter, torch, memtrack: some 290,000 objects)
    # is not the case's and never garbage. A full collection walked all of it, 0.11 s each
    # on this project's machine, and the CPU probe collects before every measured
    # iteration; frozen, a collection walks only what the case made.
    gc.freeze()
    turns = (
        Turns(Path(spec.turns), spec.side, spec.schedule, spec.stop_after) if spec.turns else None
    )
    with turns.setup() if turns else contextlib.nullcontext():  # a pair's first pass waits
        result.update(phase="setup", host_peak_source=host.source)
        torch.manual_seed(spec.seed)
        torch.backends.cudnn.benchmark = False  # its workspace depends on what is cached
        case = _set_up(spec, result, host)
        ctx, step, loading = case.ctx, case.step, case.loading
        persistent = case.probe.mark(case.objects)
        result.notes.extend(_dtype_note(spec.params, case.objects))
        result.update(
            phase="warmup",
            persistent_bytes=persistent,
            tensor_dtype=tensor_dtype(case.objects),
            **loading.fields(),
        )
        result.notes.extend(loading.notes)
        distributed.barrier(case.rank)

        for _ in range(spec.warmup):
            ctx.new_iteration()
            step()
        _sync(ctx.device)
    if turns is not None:  # one side of a paired timing: its passes, in its turns
        result.update(phase="timing")
        passes = []
        while turns.wait():
            passes.append(_timing_pass(step, ctx.device, spec.repeats))
            turns.done(_pass_medians(passes[-1]))
        result.update(phase="done", **_joined(passes))
        _close(step)
        return
    if spec.snapshot_path:  # `memtrack snapshot`: one more step under the recorder
        from memtrack.probes.snapshot import capture

        snap = capture(
            step, ctx.device, case.objects, Path(spec.snapshot_path), spec.case_id or spec.workload
        )
        result.update(phase="done", **snap)
        _close(step)
        distributed.teardown(case.rank)  # every rank's file is written: the final barrier
        return
    setup_peak = max(host.peak(), loading.before_peak)  # a loading phase reset the mark
    release_free_heap()
    host.reset()
    setup_level = current_rss()

    result.update(phase="timing")
    distributed.barrier(case.rank)
    timing = _timing_pass(step, ctx.device, spec.repeats)
    if spec.timing_only:  # one side of a paired timing: its time alone
        result.update(phase="done", **timing)
        _close(step)
        distributed.teardown(case.rank)
        return
    step_peak = host.peak()
    result.update(
        phase="memory",
        host_peak_rss_bytes=max(setup_peak, step_peak),
        host_step_peak_rss_bytes=step_peak,
        host_setup_rss_bytes=setup_level,
        host_file_rss_bytes=file_backed_rss(),
        **timing,
    )

    summary = _memory_pass(spec, ctx, case.probe, step, result, case.rank)
    summary = _after_memory_pass(spec, case, result, summary, max(timing["iteration_times_s"]))
    result.update(phase="done", largest_cache_bytes=ctx.cache_peak_bytes or None, **summary)
    _close(step)  # after the figures are written (each path): a trainer's teardown takes time
    distributed.teardown(case.rank)


class _TimingOnly:
    """The probe of a case whose time alone is measured (one side of a paired timing):
    nothing is tracked (no MemTracker hooks on its modules), and no persistent set is
    measured."""

    def mark(self, objects: tuple[Any, ...]) -> None:
        gc.collect()  # what setup left in reference cycles, as the real probes collect it
        return None

    def session_scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _set_up(spec: Spec, result: ResultFile, host: Any) -> _Case:
    """The case's process group (a multi-rank case), its workload imported, its Context, its
    framework probe, and the step its setup returns."""
    from memtrack.probes.framework import CudaAllocatorProbe, MemTrackerProbe
    from memtrack.probes.loading import LoadingProbe
    from memtrack.probes.made import making
    from memtrack.worker import distributed
    from memtrack.workload.context import Context
    from memtrack.workload.driven import Driven
    from memtrack.workload.registry import find, import_workload_module, repository_first

    rank = distributed.setup(spec)  # None unless the case has the `ranks` param
    repository_first(Path(spec.root))  # a forked worker has it so from its server already
    # where the persistent set is made (its sites name the line), at import and in setup
    with making(Path(spec.root)) as made:
        import_workload_module(spec.module, Path(spec.root))
        wl = find(spec.workload)
        ctx = Context(
            spec.params,
            spec.seed,
            spec.device,
            Path(spec.data_dir),
            Path(spec.scratch_dir) if spec.scratch_dir else None,
        )
        ctx.loading_probe = loading = LoadingProbe(host)
        if rank is not None:
            ctx.rank, ctx.world_size = rank.rank, rank.world_size
        is_cuda = ctx.device.type == "cuda"
        sessions = ctx.concurrency
        probe: Any = (
            _TimingOnly()  # nothing but time measured: no tracker
            if spec.timing_only
            else CudaAllocatorProbe(ctx.device)
            if is_cuda
            else MemTrackerProbe(ctx.device, sessions, allocator=True)
        )

        step = wl.fn(ctx)
    if not callable(step):
        raise TypeError(f"workload {wl.name!r} must return the step to measure, got {step!r}")
    if isinstance(step, Driven):  # a trainer's loop, in its thread: it enters the scope
        _check_driven(step, wl, sessions)
        step.scope = probe.session_scope
    if sessions > 1:
        # One iteration is every session done: timed, measured and warmed up alike, by the
        # same N threads (workload.sessions says why).
        from memtrack.workload.sessions import Sessions

        step = Sessions(step, sessions, ctx.device, probe.session_scope)
        result.notes.append(
            f"{sessions} concurrent sessions per iteration (threads"
            + (", one CUDA stream each)" if is_cuda else ")")
        )
    result.notes.extend(ctx.notes)
    objects = ctx.marked_objects if ctx.marked_objects is not None else ()
    if ctx.marked_objects is None:
        result.notes.append("no ctx.mark(): the persistent set is what setup left")
    return _Case(wl, ctx, step, probe, objects, rank, loading, made)


def _check_driven(step: Any, wl: Any, sessions: int) -> None:
    """A trainer's loop is one process's one loop: it is refused (and ended) where the case
    would call it from several sessions at once, or compare an output it does not return."""
    from memtrack.errors import WorkloadError

    why = None
    if sessions > 1:
        why = "runs one loop, which concurrent sessions cannot share: drop the concurrency param"
    elif wl.tolerance:
        why = "returns no output to compare with a reference: drop the workload's tolerance"
    if why is not None:
        step.close()
        raise WorkloadError(f"workload {wl.name!r}: {step.what} {why}")


def tensor_dtype(objects: tuple[Any, ...]) -> str | None:
    """The floating or quantized dtype that holds most of the persistent set's bytes
    ('bfloat16', 'qint8'): the parameters and buffers of its modules, its tensors, and the
    packed weights of quantized modules; None where it holds none (an optimizer's state is
    made by the first step, after this is read)."""
    import torch

    from memtrack.probes.packed import packed_dtypes

    held = packed_dtypes(objects)
    seen: set[int] = set()
    tensors: list[Any] = []
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            tensors += [*obj.parameters(), *obj.buffers()]
        elif isinstance(obj, torch.Tensor):
            tensors.append(obj)
    for t in tensors:
        if t.is_floating_point() and id(t) not in seen:
            seen.add(id(t))
            name = str(t.dtype).removeprefix("torch.")
            held[name] = held.get(name, 0) + t.numel() * t.element_size()
    return max(held, key=held.__getitem__) if held else None


def _dtype_note(params: dict[str, Any], objects: tuple[Any, ...]) -> list[str]:
    """What the case's tensors really are, where its record would say otherwise (it takes
    the `dtype` param, float32 without one): said in the case's notes, which its record
    keeps. (The record's own `dtype` field is the parent's to set, from this.)"""
    found = tensor_dtype(objects)
    named = params.get("dtype")
    if named is None and found != "float32":
        really = found or "not known (ctx.mark() named no module or tensor)"
        return [f"dtype: the case has no dtype param; its tensors are {really}"]
    if named is not None and found is not None and found != str(named):
        return [f"dtype: the case's dtype param is {named}; its tensors are {found}"]
    return []


def _after_memory_pass(
    spec: Spec, case: _Case, result: ResultFile, summary: dict[str, Any], slowest_s: float
) -> dict[str, Any]:
    """What follows the memory pass, each step apart from it: the category breakdown (CUDA),
    the output against its reference, and one session alone (a concurrent case). Returns
    `summary` (the memory pass's figures) with theirs, written with each phase."""
    from memtrack.probes.framework import category_breakdown

    ctx, step, figures = case.ctx, case.step, dict(summary)
    if ctx.device.type == "cuda":
        result.update(phase="breakdown", **figures)
        # by category on the device that holds the headline peak, which they must add up to
        device = case.probe.peak_device()
        try:
            figures["categories"], notes = category_breakdown(
                step, device, case.objects, lambda p: _tags_to(ctx, p), ctx.concurrency
            )
            result.notes.extend(notes)
        except Exception as exc:  # the allocator figures stand without it
            result.notes.append(f"category breakdown unavailable: {exc}")
    # where the peak's memory was allocated: a pass of its own, after the figures are written
    # (a pass that runs past the case's timeout leaves them recorded)
    result.update(phase="sites", **figures)
    try:
        figures["sites"] = _sites(spec, case, figures.get("peak_allocated_bytes"))
    except Exception as exc:  # the figures stand without it
        result.notes.append(f"sites unavailable: {type(exc).__name__}: {exc}")
    quality = spec.quality
    if quality:  # one extra call, after every measured iteration (probes.quality)
        from memtrack.probes import quality as q

        result.update(phase="quality")
        if quality.mode == "record":
            q.record(step, ctx, Path(str(quality.path)))
        else:
            figures.update(q.compare(step, ctx, case.wl, quality))
    if ctx.concurrency > 1:  # last: a session that never ends alone leaves the sessions closed
        result.update(phase="sessions", **figures)
        limit = SOLO_LIMIT_S + 20 * slowest_s
        try:
            figures.update(_one_session(step, ctx, case.objects, limit, result.notes))
        except Exception as exc:  # the concurrent figures stand without it
            result.notes.append(f"one session alone could not be measured: {exc}")
    return figures


def _sites(spec: Spec, case: _Case, measured_peak: int | None) -> list[dict[str, Any]]:
    """One more iteration under the sites' dispatch mode (probes.sites): the top sites at
    its peak, as records of the result. A concurrent case's threads each enter the mode."""
    import dataclasses
    import gc

    from memtrack.probes.framework import pushed
    from memtrack.probes.sites import recording, sites

    ctx, step = case.ctx, case.step
    largest, scope = ctx.cache_peak_bytes, getattr(step, "scope", None)
    with recording(ctx.device, case.objects, Path(spec.root), made=case.made) as mode:
        if scope is not None:
            step.scope = lambda: pushed(mode)
        try:
            ctx.new_iteration()
            with pushed(mode):
                step()
            _sync(ctx.device)
            gc.collect()
            kept = mode.retained()  # what the call left allocated: where a leak is made
        finally:
            ctx.cache_peak_bytes = largest
            if scope is not None:
                step.scope = scope
    return [dataclasses.asdict(s) for s in (*sites(mode, measured_peak), *kept)]


def _memory_pass(
    spec: Spec, ctx: Any, probe: Any, step: Any, result: ResultFile, rank: Any
) -> dict[str, Any]:
    """`repeats` iterations, each under the framework probe; the probe's summary. The
    window the NVML sampler's samples count in is written to the result."""
    from memtrack.worker import distributed

    if ctx.device.type != "cuda":
        ctx.new_iteration()
        probe.prime(step)  # one more step, unmeasured, for the CPU allocator's view
    ctx.cache_peak_bytes = 0
    distributed.barrier(rank)
    start = time.monotonic()  # system-wide: the NVML sampler's clock too
    with _tags_to(ctx, probe):
        for _ in range(spec.repeats):
            ctx.new_iteration()
            with probe.iteration():
                step()
    _sync(ctx.device)
    end = time.monotonic()
    result.update(memory_window=_hold_for_sampler(spec, start, end, result.notes))
    summary: dict[str, Any] = probe.summary()
    result.notes.extend(getattr(probe, "notes", ()))
    return summary


SOLO_LIMIT_S = 5.0
"""The least time one session of a concurrent case is given to end alone (twenty timed
iterations of all the sessions are added to it)."""


def _one_session(
    step: Any, ctx: Any, objects: tuple[Any, ...], limit_s: float, notes: list[str]
) -> dict[str, int]:
    """A concurrent case's first session run alone after the memory pass, in its own thread
    and on its own stream (`Sessions.solo`), under a fresh probe of the case's kind, primed
    by one unmeasured run: its framework peak, and the peak that `concurrency` sessions
    would reach if each peaked at once (the level it started from plus N times its rise
    above it). The concurrent peak lies between the two; the second does not depend on how
    the sessions' threads interleave. Nothing where it does not end within `limit_s`."""
    from memtrack.probes.framework import CudaAllocatorProbe, MemTrackerProbe

    cuda = ctx.device.type == "cuda"
    probe: Any = (
        CudaAllocatorProbe(ctx.device) if cuda else MemTrackerProbe(ctx.device, 1, allocator=True)
    )
    probe.mark(objects)
    # Its tags reach its own tracker while it measures and are dropped otherwise: the
    # case's cache figure stays that of the sessions together.
    tag = getattr(probe, "tag", None)
    scope, hook, largest = step.scope, ctx.tag_hook, ctx.cache_peak_bytes
    ctx.tag_hook = tag
    try:
        for enter in (probe.priming, probe.iteration):
            step.scope = enter  # entered by the session's thread, around its step
            ctx.new_iteration()
            if not step.solo(limit_s):
                notes.append(
                    f"one session alone did not end within {limit_s:.0f} s (do the sessions "
                    "wait for one another?): no one-session figures"
                )
                return {}
    finally:
        step.scope, ctx.tag_hook, ctx.cache_peak_bytes = scope, hook, largest
    _sync(ctx.device)
    peak, level = probe.samples[-1], probe.levels[-1]
    return {
        "session_peak_bytes": peak,
        "sessions_sum_bytes": level + ctx.concurrency * max(0, peak - level),
    }


def _close(step: Any) -> None:
    """End the session threads of a concurrent case, or a trainer's loop (a plain step has
    neither)."""
    from memtrack.workload.driven import Driven
    from memtrack.workload.sessions import Sessions

    if isinstance(step, (Sessions, Driven)):
        step.close()


HOLD_LIMIT_S = 10.0
"""How long a worker waits after its memory pass for the NVML sampler's next two rounds."""


def _hold_for_sampler(spec: Spec, start: float, end: float, notes: list[str]) -> list[float]:
    """The memory pass's window. Samples count only inside it, and a pass of a few ms fell
    between two samples: where the sampler runs, the window stays open until two of its
    rounds began after the last synchronised iteration. The level holds meanwhile (the
    caching allocator keeps its segments), and those samples are the quiet level the
    outcome reads the non-allocator memory from."""
    if not spec.sampler_clock:
        return [start, end]
    from memtrack.probes.nvml import wait_for_rounds

    held = wait_for_rounds(spec.sampler_clock, end, HOLD_LIMIT_S)
    if held is None:
        notes.append(
            f"the NVML sampler took fewer than two samples in the {HOLD_LIMIT_S:g} s "
            "after the memory pass"
        )
        return [start, end]
    return [start, end, held]


@contextlib.contextmanager
def _tags_to(ctx: Any, probe: Any) -> Iterator[None]:
    """While measuring, the workload's cache tags go to the probe's tracker (if it has one)."""
    ctx.tag_hook = getattr(probe, "tag", None)
    try:
        yield
    finally:
        ctx.tag_hook = None


def _cuda_partial() -> dict[str, Any]:
    """The allocator's counters at the failure, over every device the case used."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    from memtrack.probes.framework import failure_figures

    try:
        return failure_figures()
    except Exception:  # a CUDA error that sticks: the status and the message still stand
        return {}


OOM_WORDS = (
    "out of memory",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
    "can't allocate memory",
    "cannot allocate memory",
)
"""How torch, the CUDA runtime and the driver say that an allocation failed; torch's
DefaultCPUAllocator says "can't allocate memory" (under RLIMIT_AS or a full host)."""
LIBRARY_ALLOC_WORDS = (
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudnn_status_internal_error_device_allocation_failed",
    "cudnn_status_internal_error_host_allocation_failed",
    "cusolver_status_alloc_failed",
    "cusparse_status_alloc_failed",
)
"""A CUDA library's status for an allocation of its own that failed, outside the caching
allocator: a handle (`cublasCreate`, made by each thread at its first matmul, so concurrent
sessions near full memory meet it), cuDNN's workspace or plans (cuDNN 8 says ALLOC_FAILED,
cuDNN 9 INTERNAL_ERROR_DEVICE/HOST_ALLOCATION_FAILED). torch raises them as RuntimeError."""
NCCL_CUDA_ERROR = "unhandled cuda error"
NCCL_ALLOC_WORDS = ("failed to cuda calloc", "failed to cuda malloc", "cumemcreate")
"""NCCL's own words for a device allocation of its buffers that failed. Its 'unhandled
cuda error' alone can be any CUDA failure: with one of these (or an OOM word above, from
NCCL's last error) it is an out-of-memory."""


def is_oom(exc: BaseException) -> bool:
    """Whether `exc`, or what it was raised from, says the device or host ran out of memory:
    torch's OutOfMemoryError, a CUDA or driver OOM in any wording, a CUDA library's own
    allocation that failed (cuBLAS, cuDNN, ...), or NCCL's 'unhandled cuda error' whose
    detail is an allocation that failed."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = str(cause).lower()
        if type(cause).__name__ == "OutOfMemoryError" or any(w in text for w in OOM_WORDS):
            return True
        if any(w in text for w in LIBRARY_ALLOC_WORDS):
            return True
        if isinstance(cause, MemoryError) or (
            isinstance(cause, OSError) and cause.errno == errno.ENOMEM
        ):
            return True
        if NCCL_CUDA_ERROR in text and any(w in text for w in NCCL_ALLOC_WORDS):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def failure(exc: Exception, spec: Spec | None = None) -> dict[str, Any]:
    """A case that raised: out of memory where torch (CUDA or CPU) or NCCL says so, else an
    error."""
    kind = type(exc).__name__
    return {
        **_cuda_partial(),
        "status": "oom" if is_oom(exc) else "error",
        "message": f"{kind}: {exc}".strip().splitlines()[0][:2000],
    }


def main(argv: list[str]) -> int:
    return serve(argv, run_case, failure)
