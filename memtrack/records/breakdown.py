"""A case's peak broken down: weights, inputs, caches, gradients, optimizer state,
intermediates, and what no category explains, so that the parts add up to the framework peak.

With a tensor tracker's snapshot at the peak (MemTracker: on the CPU in the memory pass,
on CUDA in one extra iteration) each part is what was alive at that moment: weights are
parameters, buffers and quantized modules' packed weights, inputs the other tensors held
from setup (an input batch), caches the storages the workload tagged (each once), gradients
and optimizer state apart, intermediates the activations and temporaries. Without one, weights
are the persistent set at the mark and intermediates the rest. Workspace is beyond the
framework: on a GPU, each device's sampled peak within the memory pass minus that device's
reserved peak (the largest over the devices), host RSS beyond live tensors on the CPU.

Workspace is never below 0: a sampled figure below an exact one is a missed spike (a step
that gives its cache back with `empty_cache()`, the allocator's flush-and-retry, another
process freeing memory in the device-wide view) or, on the CPU, pages allocated but never
touched. There is no workspace figure then (None), and a note says why.
"""

from __future__ import annotations

import dataclasses

from memtrack.records.model import Measurement


def with_breakdown(m: Measurement) -> Measurement:
    """The measurement with its breakdown fields filled from its figures."""
    peak = m.peak_allocated_bytes
    if peak is None:
        return m
    cats = m.categories or {}
    gradients = optimizer = unattributed = inputs = None
    if cats:
        # packed: the quantized modules' packed weights (probes.packed), no tensor at all
        weights = cats.get("Parameter", 0) + cats.get("Buffer", 0) + cats.get("Packed", 0)
        inputs = cats.get("Input", 0)  # held from setup, no other category's
        caches = cats.get("Other", 0)  # only tagged caches are registered as 'Other'
        gradients, optimizer = cats.get("Gradient", 0), cats.get("Optstate", 0)
        intermediates = cats.get("Activation", 0) + cats.get("Temp", 0)
        unattributed = peak - (weights + inputs + caches + gradients + optimizer + intermediates)
        if unattributed < 0:  # the tracker's extra iteration saw more than the allocator
            intermediates, unattributed = max(0, intermediates + unattributed), 0
    else:
        weights = m.persistent_bytes or 0
        # no snapshot at the peak: the largest tagged cache (a record before it: caches)
        caches = m.largest_cache_bytes or m.caches_bytes or 0
        intermediates = max(0, peak - weights - caches)
    notes = tuple(n for n in m.notes if not n.endswith(NO_WORKSPACE))  # made again below
    if m.device == "cuda":
        workspace = device_workspace(m)
    else:
        # On the CPU the gap is the host's: RSS beyond live tensors (interpreter, libraries).
        host = m.host_step_peak_rss_bytes
        workspace = host - peak if host is not None and host >= peak else None
        if host is not None and host < peak:
            notes = (*notes, untouched_note(host, peak))
    return dataclasses.replace(
        m,
        notes=notes,
        weights_bytes=weights,
        inputs_bytes=inputs,
        caches_bytes=caches,
        gradients_bytes=gradients,
        optimizer_state_bytes=optimizer,
        training_state_bytes=None if gradients is None else gradients + (optimizer or 0),
        intermediates_bytes=intermediates,
        unattributed_bytes=unattributed,
        workspace_bytes=workspace,
    )


def device_workspace(m: Measurement) -> int | None:
    """The largest per-device workspace: each device's sampled peak within the memory pass
    less its own reserved peak (devices do not pool: one GPU's process peak less another's
    reserved is nothing). The same window on both sides: a setup spike released before the
    memory pass is not workspace. A device whose samples stayed below its reserved peak
    missed a spike (`measure.outcome.missed_spike` notes it) and has no figure."""
    figures = []
    for d in m.devices:
        sampled, reserved = d.memory_pass_peak_bytes, d.peak_reserved_bytes
        if reserved is None and len(m.devices) == 1:  # a record without per-device figures
            reserved = m.peak_reserved_bytes
        if sampled is not None and reserved is not None and sampled >= reserved:
            figures.append(sampled - reserved)
    return max(figures) if figures else None


NO_WORKSPACE = "never written take no resident pages: no workspace figure"


def untouched_note(host: int, peak: int) -> str:
    """Why a CPU case has no workspace figure: its tensors hold pages never made resident."""
    return (
        f"host step peak RSS ({host / 2**20:.1f} MiB) is below the framework peak "
        f"({peak / 2**20:.1f} MiB): tensors allocated but {NO_WORKSPACE}"
    )


__all__ = ["device_workspace", "untouched_note", "with_breakdown"]
