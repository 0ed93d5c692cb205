"""Runs a suite: each case in a fresh process, with the NVML sampler beside it on CUDA.

A failing case (exception, out of memory, signal, timeout) becomes a Measurement with that
status and whatever figures it reached; the run goes on with the next case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.machine import environment, provenance
from memtrack.measure import references
from memtrack.probes.tree import CGROUP, ProcessTree
from memtrack.records.breakdown import with_breakdown
from memtrack.records.model import (
    DeviceMeasurement,
    Environment,
    Measurement,
    RunRecord,
)
from memtrack.records.redact import redact
from memtrack.workload.registry import Case, ranks_of, suite_hash

ProgressFn = Callable[[str, Case, "Measurement | None"], None]
"""Called with ('start', case, None) and ('done', case, measurement)."""


@dataclass(frozen=True)
class CaseOutcome:
    """What the worker process left: its result file's data and how it ended."""

    data: dict[str, Any]
    returncode: int | None
    timed_out: bool
    stderr_tail: str
    duration_s: float
    sampler: dict[str, Any] | None
    tree_peak_bytes: int | None = None
    """Host peak of the case's whole process tree (see probes.tree), where measured."""
    tree_source: str | None = None


def resolve_device(config: Config, env: Environment) -> str:
    if config.device != "auto":
        return config.device
    usable = env.cuda_available if env.cuda_available is not None else bool(env.cuda_runtime)
    return "cuda" if env.gpus and usable else "cpu"


def _device_note(config: Config, env: Environment, device: str) -> str | None:
    """Why `auto` measured on the CPU of a machine whose GPUs NVML sees."""
    if config.device != "auto" or device != "cpu" or not env.gpus:
        return None
    why = env.cuda_unavailable_reason or "this torch build has no CUDA support"
    return (f"device auto: NVML sees {len(env.gpus)} GPU(s) but torch cannot use CUDA "
            f"({why}); measured on the CPU")


PINNED_ENV = {
    # glibc raises its mmap threshold as large blocks are freed, so whether a step's
    # buffers come from the heap (and stay resident) or from mmap (and are returned) depends
    # on what ran before: the host peak of unchanged code then moved by ~10 MiB run to run.
    # A fixed threshold (glibc's default, 128 KiB) makes it follow live memory within
    # 1 MiB. A value the user set is kept; either way it is recorded in the environment.
    "MALLOC_MMAP_THRESHOLD_": "131072",
}
"""Allocator settings every worker runs with, unless the user set them."""


def run_suite(
    config: Config,
    cases: list[Case],
    *,
    shard: str | None = None,
    progress: ProgressFn | None = None,
    env: Environment | None = None,
) -> RunRecord:
    """Measure every case and return the run (the caller stores it)."""
    started = _now()
    for name, value in PINNED_ENV.items():
        os.environ.setdefault(name, value)  # before the probe, which records it
    env = env or environment.probe()
    device = resolve_device(config, env)
    note = _device_note(config, env, device)
    git = provenance.git_info(config.root, config.base_branch)
    if any(c.tolerance for c in cases):
        references.load_manifest(config)  # a malformed manifest is refused before measuring
    measurements = []
    for case in cases:
        if progress:
            progress("start", case, None)
        m = run_case(config, case, device, env.visible_uuids)
        if note:
            m = dataclasses.replace(m, notes=(note, *m.notes))
        measurements.append(m)
        if progress:
            progress("done", case, m)
    return RunRecord(
        run_id=uuid.uuid4().hex,
        started_at=started,
        finished_at=_now(),
        git=git,
        ci=provenance.ci_info(),
        environment=env,
        suite_hash=suite_hash(cases, config),
        config_path=str(config.path) if config.path else None,
        measurements=tuple(measurements),
        shard=shard,
    )


def case_spec(config: Config, case: Case, device: str, warmup: int, repeats: int
              ) -> dict[str, Any]:
    """What a worker process needs to find and run one case (the caller adds where its
    result goes): the same for a measured case, each rank of one, and an estimate."""
    return {
        "module": case.module,
        "root": str(config.root),
        "workload": case.workload,
        "params": case.params,
        "seed": case.seed,
        "device": device,
        "warmup": warmup,
        "repeats": repeats,
        "data_dir": str(config.root / "data"),
    }


def run_case(
    config: Config, case: Case, device: str, visible_uuids: tuple[str, ...] = (),
    extra: dict[str, Any] | None = None, quality: dict[str, Any] | None = None,
) -> Measurement:
    """One case in a fresh worker; `extra` adds keys to its spec (e.g. `snapshot_path`).
    `quality`: what the worker does with the step's output (memtrack.measure.references); by
    default, compare it with the case's reference where the workload declares a tolerance."""
    world = ranks_of(case.params)
    if world is not None:  # one process per rank, all at once
        from memtrack.measure.ranks import run_ranks

        return run_ranks(config, case, device, visible_uuids, world, extra)
    warmup, repeats, timeout_s = config.settings_for(case.workload)
    with tempfile.TemporaryDirectory(prefix="memtrack-") as tmp:
        result_path = Path(tmp) / "result.json"
        scratch = Path(tmp) / "scratch"  # the case's ctx.scratch_dir, removed with tmp
        scratch.mkdir(mode=0o700)
        spec = {
            **case_spec(config, case, device, warmup, repeats),
            "result_path": str(result_path),
            "scratch_dir": str(scratch),
            **(extra or {}),
            "quality": quality or references.quality_spec(config, case),
        }
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        outcome = _execute(
            spec_path, result_path, timeout_s, device, config.nvml_interval_s, visible_uuids
        )
    return to_measurement(case, spec, outcome, config.nvml_interval_s, timeout_s)


def _execute(
    spec_path: Path,
    result_path: Path,
    timeout_s: float,
    device: str,
    interval_s: float,
    visible_uuids: tuple[str, ...] = (),
    *,
    worker: str = "memtrack.worker.measure",
    sample: bool = True,
) -> CaseOutcome:
    """Run `worker` (a module run with SPEC and this PID) until it ends or times out; with
    `sample`, the NVML sampler watches it on CUDA."""
    sampler = _start_sampler(interval_s, visible_uuids) if sample and device == "cuda" else None
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", worker, str(spec_path), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # one process group: the case's processes end with it
        )
        tree = ProcessTree(proc.pid)
        try:
            if sampler and sampler[0] is not None:
                _tell(sampler[0], f"{proc.pid}\n")
            timed_out = not tree.wait(timeout_s)
            duration = time.perf_counter() - t0
        finally:
            # Whatever happened, nothing the case started outlives it.
            tree.end()
            proc.wait()
        err.seek(0)
        stderr_tail = err.read()[-4000:].decode(errors="replace")
    try:
        data = json.loads(result_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        data = {"status": "running", "phase": "start", "notes": []}
    sampled = _stop_sampler(sampler, data.get("memory_window")) if sampler else None
    return CaseOutcome(
        data,
        proc.returncode,
        timed_out,
        stderr_tail,
        duration,
        sampled,
        tree.peak or None,
        tree.source,
    )


SAMPLER_START_TIMEOUT_S = 60.0
"""NVML's first initialisation can take seconds per GPU when persistence mode is off."""


def _start_sampler(
    interval_s: float, uuids: tuple[str, ...], timeout_s: float = SAMPLER_START_TIMEOUT_S
) -> tuple[subprocess.Popen[str] | None, dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "memtrack.probes.nvml", "--interval", str(interval_s), *uuids],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    if not select.select([proc.stdout], [], [], timeout_s)[0]:  # a hung nvmlInit
        proc.kill()
        proc.wait()
        reason = f"the NVML sampler did not start within {timeout_s:g} s"
        return None, {"ok": False, "reason": reason}
    line = proc.stdout.readline()
    try:
        first = json.loads(line or '{"ok": false, "reason": "the NVML sampler died at start"}')
    except json.JSONDecodeError:
        first = {"ok": False, "reason": f"the NVML sampler said {line.strip()[:200]!r}"}
    if not first.get("ok"):
        proc.kill()
        proc.wait()
        return None, first
    return proc, first


def _tell(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line)
    proc.stdin.flush()


def _stop_sampler(
    sampler: tuple[subprocess.Popen[str] | None, dict[str, Any]], window: Any = None
) -> dict[str, Any]:
    """Stop the sampler; `window` is the worker's memory pass [start, end] (monotonic)."""
    proc, first = sampler
    if proc is None:
        return first
    commands = "stop\n"
    if (
        isinstance(window, list)
        and len(window) == 2
        and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in window)
    ):
        commands = f"window {float(window[0])!r} {float(window[1])!r}\n" + commands
    try:
        out, _ = proc.communicate(commands, timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"ok": False, "reason": "the NVML sampler did not stop within 60 s"}
    try:
        return {**first, **json.loads(out.strip().splitlines()[-1])}
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "reason": f"the NVML sampler exited with {proc.returncode}"}


def to_measurement(
    case: Case, spec: dict[str, Any], outcome: CaseOutcome, interval_s: float, timeout_s: float
) -> Measurement:
    d = outcome.data
    notes = list(d.get("notes", []))
    status, message = case_status(outcome, timeout_s)
    devices, view, view_note = _device_view(d, outcome.sampler, spec["device"], notes)
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in d.items()
        if k in _MEASURED or k.startswith("quality_")
    }
    if fields.get("quality_message"):  # may quote the workload's own quality function
        fields["quality_message"] = redact(fields["quality_message"])
    tree_peak = outcome.tree_peak_bytes
    if outcome.tree_source != CGROUP and fields.get("host_peak_rss_bytes"):
        # Samples can miss the worker's own peak; its exact high-water mark is a bound too.
        tree_peak = max(tree_peak or 0, fields["host_peak_rss_bytes"])
    m = Measurement(
        workload=case.workload,
        case_id=case.case_id,
        params=case.params,
        seed=case.seed,
        device=spec["device"],
        dtype=str(case.params.get("dtype", "float32")),
        warmup=spec["warmup"],
        repeats=spec["repeats"],
        status=status,
        # A workload's own text (its error, its stderr) is redacted before it is kept.
        message=redact(message),
        traceback=redact(d.get("traceback")),
        devices=tuple(devices),
        device_view=view,
        device_view_note=redact(view_note),
        sample_interval_s=interval_s if view == "nvml" else None,
        duration_s=round(outcome.duration_s, 4),
        notes=tuple(redact(n) or "" for n in notes),
        host_tree_peak_rss_bytes=tree_peak,
        host_tree_source=outcome.tree_source if tree_peak else None,
        **fields,
    )
    return with_breakdown(m)


def case_status(outcome: CaseOutcome, timeout_s: float) -> tuple[str, str | None]:
    """How a worker ended, and its message: its own words, else its signal or exit status."""
    d = outcome.data
    status, message = d.get("status", "running"), d.get("message")
    if outcome.timed_out:
        status, message = "timeout", f"timed out after {timeout_s:g} s in phase {d.get('phase')!r}"
    elif status == "running":
        rc = outcome.returncode or 0
        status = "crashed"
        if rc < 0:
            message = f"killed by {signal_name(-rc)} in phase {d.get('phase')!r}"
        else:
            message = f"exited with status {rc} in phase {d.get('phase')!r}"
        if outcome.stderr_tail.strip():
            message += ": " + outcome.stderr_tail.strip().splitlines()[-1][:500]
    return status, message


_MEASURED = (
    "framework",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_requested_bytes",
    "persistent_bytes",
    "allocated_samples",
    "num_alloc_retries",
    "num_ooms",
    "host_peak_rss_bytes",
    "host_step_peak_rss_bytes",
    "host_peak_source",
    "host_setup_rss_bytes",
    "host_file_rss_bytes",
    "caches_bytes",
    "categories",
    "iteration_times_s",
    "time_median_s",
    "time_p95_s",
    "time_min_s",
    "load_duration_s",
    "load_host_peak_rss_bytes",
    "load_file_rss_bytes",
    "load_rchar_bytes",
    "load_wchar_bytes",
    "load_read_bytes",
    "load_write_bytes",
    "disk_bytes",
)


def _device_view(
    d: dict[str, Any], sampled: dict[str, Any] | None, device: str, notes: list[str]
) -> tuple[list[DeviceMeasurement], str | None, str | None]:
    cuda_devices = {x.get("uuid"): x for x in d.get("cuda_devices", [])}
    if device != "cuda":
        return [], None, "CPU case: no device view"
    if not sampled or not sampled.get("ok", True) or "devices" not in sampled:
        reason = (sampled or {}).get("reason", "NVML sampler gave no result")
        devs = [DeviceMeasurement(**{k: v for k, v in x.items()}) for x in cuda_devices.values()]
        return devs, None, reason
    out = []
    notes.extend(sampled.get("notes", []))
    for s in sampled["devices"]:
        a = cuda_devices.get(s["uuid"], {})
        dm = DeviceMeasurement(
            index=a.get("index", s["index"]),
            uuid=s["uuid"],
            name=s["name"],
            total_bytes=a.get("total_bytes") or s["total_bytes"],  # torch's: what it can use
            used_before_bytes=s["used_before_bytes"],
            peak_device_used_bytes=s["peak_device_used_bytes"],
            peak_process_bytes=s["peak_process_bytes"],
            process_view=s["process_view"],
            peak_allocated_bytes=a.get("peak_allocated_bytes"),
            peak_reserved_bytes=a.get("peak_reserved_bytes"),
            samples=s["samples"],
            memory_pass_peak_bytes=s.get("memory_pass_peak_bytes"),
        )
        # Compared within the memory pass, where the reserved peak was taken.
        sampled_peak = dm.memory_pass_peak_bytes or dm.peak_process_bytes
        if dm.peak_reserved_bytes and (sampled_peak or 0) < dm.peak_reserved_bytes:
            notes.append(
                f"GPU {dm.index}: sampled device peak is below the allocator's exact reserved "
                "peak: the sampler missed a spike"
            )
        out.append(dm)
    return out, "nvml", None


def signal_name(number: int) -> str:
    """'SIGSEGV'; 'SIGRTMIN+6' for a real-time signal, which `signal.Signals` does not know."""
    try:
        return signal.Signals(number).name
    except ValueError:
        pass
    rtmin, rtmax = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if rtmin is not None and rtmax is not None and rtmin <= number <= rtmax:
        return f"SIGRTMIN+{number - rtmin}"
    return f"signal {number}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
