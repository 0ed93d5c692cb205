"""One case, in its own process: setup, warm-up, timing pass, memory pass, breakdown.

Started by the runner as `python -m memtrack.worker SPEC.json RUNNER_PID`. It writes its
figures to the spec's result path after every phase (atomically), so a crash or a kill
still leaves the partial figures for the runner to record.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULT_ENV = "MEMTRACK_RESULT"


class _Result:
    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = {"status": "running", "phase": "start", "notes": []}

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        # system-wide clock: tells which rank of a multi-rank case failed first
        self.data["written_at"] = time.monotonic()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timing_pass(step: Any, device: Any, repeats: int) -> list[float]:
    """Uninstrumented: only a clock (and a device sync on CUDA) around each iteration."""
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def _time_summary(times: list[float]) -> dict[str, Any]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]
    return {
        "iteration_times_s": times,
        "time_median_s": statistics.median(times),
        "time_p95_s": p95,
        "time_min_s": ordered[0],
    }


def run_case(spec: dict[str, Any], result: _Result) -> None:
    from memtrack.probes.host import HostPeak, current_rss, file_backed_rss, release_free_heap

    host = HostPeak()  # first, so the whole case (imports aside) is under one high-water mark
    import torch

    from memtrack import distributed
    from memtrack.context import Context
    from memtrack.probes.framework import CudaAllocatorProbe, MemTrackerProbe, category_breakdown
    from memtrack.probes.loading import LoadingProbe
    from memtrack.workload import find, import_workload_module

    result.update(phase="setup", host_peak_source=host.source)
    torch.manual_seed(spec["seed"])
    torch.backends.cudnn.benchmark = False  # its workspace depends on what is cached
    rank = distributed.setup(spec)  # None unless the case has the `ranks` param
    import_workload_module(spec["module"], Path(spec["root"]))
    wl = find(spec["workload"])
    scratch = spec.get("scratch_dir")
    ctx = Context(spec["params"], spec["seed"], spec["device"], Path(spec["data_dir"]),
                  Path(scratch) if scratch else None)
    ctx.loading_probe = loading = LoadingProbe(host)
    if rank is not None:
        ctx.rank, ctx.world_size = rank.rank, rank.world_size
    is_cuda = ctx.device.type == "cuda"
    sessions = ctx.concurrency
    probe = (CudaAllocatorProbe(ctx.device) if is_cuda
             else MemTrackerProbe(ctx.device, sessions, allocator=True))

    step = wl.fn(ctx)
    if not callable(step):
        raise TypeError(f"workload {wl.name!r} must return the step to measure, got {step!r}")
    if sessions > 1:
        # One iteration is every session done: timed, measured and warmed up alike.
        from memtrack.sessions import Sessions

        step = Sessions(step, sessions, ctx.device, probe.session_scope)
        result.data["notes"].append(f"{sessions} concurrent sessions per iteration (threads"
                                    + (", one CUDA stream each)" if is_cuda else ")"))
    objects = ctx.marked_objects if ctx.marked_objects is not None else ()
    if ctx.marked_objects is None:
        result.data["notes"].append("no ctx.mark(): the persistent set is what setup left")
    persistent = probe.mark(objects)
    result.update(phase="warmup", persistent_bytes=persistent, **loading.fields())
    result.data["notes"].extend(loading.notes)
    distributed.barrier(rank)

    for _ in range(spec["warmup"]):
        ctx.new_iteration()
        step()
    _sync(ctx.device)
    if spec.get("snapshot_path"):  # `memtrack snapshot`: one more step under the recorder
        from memtrack.probes.snapshot import capture

        snap = capture(step, ctx.device, objects, Path(spec["snapshot_path"]),
                       spec.get("case_id", spec["workload"]))
        result.update(phase="done", **snap)
        return
    setup_peak = max(host.peak(), loading.before_peak)  # a loading phase reset the mark
    release_free_heap()
    host.reset()
    setup_level = current_rss()

    result.update(phase="timing")
    distributed.barrier(rank)
    times = _timing_pass(step, ctx.device, spec["repeats"])
    step_peak = host.peak()
    result.update(
        phase="memory",
        host_peak_rss_bytes=max(setup_peak, step_peak),
        host_step_peak_rss_bytes=step_peak,
        host_setup_rss_bytes=setup_level,
        host_file_rss_bytes=file_backed_rss(),
        **_time_summary(times),
    )

    if not is_cuda:
        ctx.new_iteration()
        probe.prime(step)  # one more step, unmeasured, for the CPU allocator's view
    ctx.cache_peak_bytes = 0
    distributed.barrier(rank)
    start = time.monotonic()  # system-wide: the NVML sampler's clock too
    with _tags_to(ctx, probe):
        for _ in range(spec["repeats"]):
            ctx.new_iteration()
            with probe.iteration():
                step()
    result.update(memory_window=[start, time.monotonic()])
    summary = probe.summary()
    if is_cuda:
        result.update(phase="breakdown", **summary)
        try:
            summary["categories"] = category_breakdown(
                step, ctx.device, objects, lambda p: _tags_to(ctx, p), sessions)
        except Exception as exc:  # the allocator figures stand without it
            result.data["notes"].append(f"category breakdown unavailable: {exc}")
    quality = spec.get("quality")
    if quality:  # one extra call, after every measured iteration (probes.quality)
        from memtrack.probes import quality as q

        result.update(phase="quality")
        if quality["mode"] == "record":
            q.record(step, ctx, Path(quality["path"]))
        else:
            summary.update(q.compare(step, ctx, wl, quality))
    result.update(phase="done", caches_bytes=ctx.cache_peak_bytes or None, **summary)
    distributed.teardown(rank)


@contextlib.contextmanager
def _tags_to(ctx: Any, probe: Any) -> Iterator[None]:
    """While measuring, the workload's cache tags go to the probe's tracker (if it has one)."""
    ctx.tag_hook = getattr(probe, "tag", None)
    try:
        yield
    finally:
        ctx.tag_hook = None


def _die_with_parent(runner_pid: int) -> None:
    """A killed `memtrack run` must not leave a workload holding the GPU (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        # The runner died before prctl took effect. Compared with its PID, not with 1: as
        # a container's entrypoint the runner is PID 1 itself.
        if os.getppid() != runner_pid:
            os._exit(1)


def _cuda_partial() -> dict[str, Any]:
    """The allocator's counters at the failure (an OOM's peak and num_ooms matter most)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    stats = torch.cuda.memory_stats()
    return {
        "framework": "cuda-caching-allocator",
        "peak_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
        "peak_reserved_bytes": int(stats.get("reserved_bytes.all.peak", 0)),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
    }


def main(argv: list[str]) -> int:
    _die_with_parent(int(argv[1]))
    spec = json.loads(Path(argv[0]).read_text())
    result = _Result(Path(spec["result_path"]))
    try:
        run_case(spec, result)
    except MemoryError as exc:
        result.update(status="oom", message=f"MemoryError: {exc}", traceback=traceback.format_exc())
        return 0
    except Exception as exc:
        kind = type(exc).__name__
        oom = kind == "OutOfMemoryError" or "out of memory" in str(exc).lower()
        result.update(
            **_cuda_partial(),
            status="oom" if oom else "error",
            message=f"{kind}: {exc}".strip().splitlines()[0][:2000],
            traceback=traceback.format_exc()[-20000:],
        )
        return 0
    result.update(status="ok")
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # skip interpreter teardown: figures are written, nothing is left to do
