"""A worker's outcome turned into a `Measurement`: its status and message (its own words,
else its signal or exit status), its figures, the device view beside the allocator's, and
the breakdown. A workload's own text is redacted before it is kept."""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

from memtrack.measure.launcher import CaseOutcome
from memtrack.probes.nvml import SamplerResult, bare_uuid
from memtrack.records import DeviceMeasurement, Measurement, Site
from memtrack.records.breakdown import with_breakdown
from memtrack.records.redact import redact
from memtrack.worker.protocol import FIGURES, Result, Spec
from memtrack.workload.registry import Case


def spawn_notes(outcome: CaseOutcome) -> list[str]:
    """Why the case's worker was a fresh interpreter, not forked by the fork server (none
    where it was forked)."""
    if not outcome.spawned:
        return []
    return [f"started as a fresh interpreter, not forked: {outcome.spawned}"]


def to_measurement(
    case: Case, spec: Spec, outcome: CaseOutcome, interval_s: float, timeout_s: float
) -> Measurement:
    r = outcome.result
    notes = [*r.notes, *spawn_notes(outcome)]
    status, message = case_status(outcome, timeout_s)
    devices, view, view_note = _device_view(r, outcome.sampler, spec.device, notes)
    fields = figures(r)
    if fields.get("quality_message"):  # may quote the workload's own quality function
        fields["quality_message"] = redact(fields["quality_message"])
    tree_peak = outcome.tree_peak_bytes
    own = fields.get("host_peak_rss_bytes")
    if own and fields.get("host_file_rss_bytes") is not None:
        # Samples can miss the worker's own peak; its exact high-water mark (less its
        # file-backed pages, as the samples leave them out) is a bound too.
        tree_peak = max(tree_peak or 0, own - fields["host_file_rss_bytes"])
    worker_sites = tuple(s if isinstance(s, Site) else Site(**s) for s in fields.get("sites", ()))
    fields["sites"] = (*worker_sites, *process_sites(outcome.tree_processes))
    m = Measurement(
        workload=case.workload,
        case_id=case.case_id,
        params=case.params,
        seed=case.seed,
        device=spec.device,
        # the case's dtype param where it names one (its notes say where the tensors
        # differ), else what the tensors really held, or None where nothing said
        dtype=str(case.params["dtype"]) if "dtype" in case.params else r.tensor_dtype,
        warmup=spec.warmup,
        repeats=spec.repeats,
        status=status,
        # A workload's own text (its error, its stderr) is redacted before it is kept.
        message=redact(message),
        traceback=redact(r.traceback),
        devices=tuple(devices),
        device_view=view,
        device_view_note=redact(view_note),
        sample_interval_s=sample_interval(outcome.sampler, interval_s) if view == "nvml" else None,
        duration_s=round(outcome.duration_s, 4),
        notes=tuple(redact(n) or "" for n in notes),
        host_tree_peak_rss_bytes=tree_peak,
        host_tree_source=outcome.tree_source if tree_peak else None,
        **fields,
    )
    return with_breakdown(m)


def process_sites(at_peak: dict[str, int] | None) -> tuple[Site, ...]:
    """The tree's processes at its sampled host peak, largest first, as 'process' sites."""
    ordered = sorted((at_peak or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    return tuple(Site("process", name, size) for name, size in ordered)


def case_status(outcome: CaseOutcome, timeout_s: float) -> tuple[str, str | None]:
    """How a worker ended, and its message: its own words, else its signal or exit status."""
    r = outcome.result
    status, message = r.status, r.message
    if outcome.timed_out:
        status, message = "timeout", f"timed out after {timeout_s:g} s in phase {r.phase!r}"
    elif status == "running":
        rc = outcome.returncode or 0
        status = "crashed"
        if rc < 0:
            message = f"killed by {signal_name(-rc)} in phase {r.phase!r}"
        else:
            message = f"exited with status {rc} in phase {r.phase!r}"
        if outcome.stderr_tail.strip():
            message += ": " + outcome.stderr_tail.strip().splitlines()[-1][:500]
    return status, message


def figures(r: Result) -> dict[str, Any]:
    """The result's figures that were measured, as Measurement fields."""
    out = {}
    for name in FIGURES:
        value = getattr(r, name)
        if value is not None and value != () and value != {}:
            out[name] = value
    return out


def sample_interval(sampled: SamplerResult | None, nominal_s: float) -> float:
    """The sampling period the sampler achieved (first to last round), else the one asked."""
    achieved = sampled.achieved_interval_s if sampled is not None else None
    return achieved if achieved is not None and achieved > 0 else nominal_s


_DEVICE_FIELDS = {f.name for f in dataclasses.fields(DeviceMeasurement)}


def _device_view(
    r: Result, sampled: SamplerResult | None, device: str, notes: list[str]
) -> tuple[list[DeviceMeasurement], str | None, str | None]:
    # Joined by the bare UUID: NVML names a MIG instance MIG-..., torch GPU-...
    cuda_devices = {bare_uuid(x.get("uuid")): x for x in r.cuda_devices}
    if device != "cuda":
        return [], None, "CPU case: no device view"
    if sampled is None or not sampled.ok:
        reason = sampled.reason if sampled is not None else "NVML sampler gave no result"
        devs = [
            DeviceMeasurement(**{k: v for k, v in x.items() if k in _DEVICE_FIELDS})
            for x in cuda_devices.values()
        ]
        return devs, None, reason
    out = []
    notes.extend(sampled.notes)
    watched = sampled.devices
    if cuda_devices:
        # Only the devices the worker used (a primary context): on a shared host another
        # job's growth on a GPU the case never touched is not the case's device figure.
        used = tuple(s for s in watched if bare_uuid(s.uuid) in cuda_devices)
        if len(used) < len(watched):
            notes.append(
                f"device view: {len(used)} of the {len(watched)} visible GPUs, those the case used"
            )
        watched = used
    for s in watched:
        a = cuda_devices.get(bare_uuid(s.uuid), {})
        dm = DeviceMeasurement(
            index=a.get("index", s.index),
            uuid=s.uuid,
            name=s.name,
            total_bytes=a.get("total_bytes") or s.total_bytes,  # torch's: what it can use
            used_before_bytes=s.used_before_bytes,
            peak_device_used_bytes=s.peak_device_used_bytes,
            peak_process_bytes=s.peak_process_bytes,
            process_view=s.process_view,
            peak_allocated_bytes=a.get("peak_allocated_bytes"),
            peak_reserved_bytes=a.get("peak_reserved_bytes"),
            samples=s.samples,
            memory_pass_peak_bytes=s.memory_pass_peak_bytes,
        )
        missed = missed_spike(dm, s.quiet_process_bytes, a.get("reserved_after_bytes"))
        if missed:
            notes.append(missed)
        out.append(dm)
    return out, "nvml", None


def missed_spike(
    dm: DeviceMeasurement, quiet: int | None, reserved_after: int | None
) -> str | None:
    """The note for a memory pass whose samples all missed the allocator's reserved peak.

    The device view holds memory the allocator does not see (the CUDA context, 0.3-0.5 GB,
    NCCL's buffers): a spike smaller than that could never show below the reserved peak.
    It is subtracted where a quiet moment measured it: the samples of the hold after the
    pass, against what the allocator reserved then."""
    sampled = dm.memory_pass_peak_bytes
    if sampled is None:  # no sample in the pass (said apart): the whole case's samples
        sampled = dm.peak_process_bytes
    reserved = dm.peak_reserved_bytes
    if not reserved or sampled is None:
        return None
    outside = None
    if quiet is not None and reserved_after is not None:
        outside = max(0, quiet - reserved_after)
    if sampled - (outside or 0) >= reserved:
        return None
    if outside is None:
        return (
            f"GPU {dm.index}: sampled device peak is below the allocator's exact reserved "
            "peak: the sampler missed a spike"
        )
    return (
        f"GPU {dm.index}: sampled device peak less the {outside / 2**20:.1f} MiB outside "
        f"the allocator (CUDA context, ...) is {(sampled - outside) / 2**20:.1f} MiB, below "
        f"the allocator's exact reserved peak of {reserved / 2**20:.1f} MiB: the sampler "
        "missed a spike"
    )


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


__all__ = [
    "case_status",
    "figures",
    "missed_spike",
    "sample_interval",
    "spawn_notes",
    "signal_name",
    "to_measurement",
]
