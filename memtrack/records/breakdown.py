"""A case's peak broken down: weights, caches, gradients, optimizer state, intermediates,
and what no category explains, so that the parts add up to the framework peak.

With a tensor tracker's snapshot at the peak (MemTracker: on the CPU in the memory pass,
on CUDA in one extra iteration) each part is what was alive at that moment: weights are
parameters and buffers, caches the storages the workload tagged (each once), gradients and
optimizer state apart, intermediates the activations and temporaries. Without one, weights
are the persistent set at the mark and intermediates the rest. Workspace is beyond the
framework: the device view's peak within the memory pass minus reserved on a GPU, host RSS
beyond live tensors on the CPU.
"""

from __future__ import annotations

import dataclasses

from memtrack.records.model import Measurement, memory_pass_peak


def with_breakdown(m: Measurement) -> Measurement:
    """The measurement with its breakdown fields filled from its figures."""
    peak = m.peak_allocated_bytes
    if peak is None:
        return m
    cats = m.categories or {}
    gradients = optimizer = unattributed = None
    if cats:
        weights = cats.get("Parameter", 0) + cats.get("Buffer", 0)
        caches = cats.get("Other", 0)  # only tagged caches are registered as 'Other'
        gradients, optimizer = cats.get("Gradient", 0), cats.get("Optstate", 0)
        intermediates = cats.get("Activation", 0) + cats.get("Temp", 0)
        unattributed = peak - (weights + caches + gradients + optimizer + intermediates)
        if unattributed < 0:  # the tracker's extra iteration saw more than the allocator
            intermediates, unattributed = max(0, intermediates + unattributed), 0
    else:
        weights = m.persistent_bytes or 0
        caches = m.caches_bytes or 0
        intermediates = max(0, peak - weights - caches)
    if m.device == "cuda":
        # The same window on both sides: a setup spike released before the memory pass
        # is not workspace.
        device = memory_pass_peak(m)
        reserved = m.peak_reserved_bytes
        workspace = device - reserved if device is not None and reserved is not None else None
    else:
        # On the CPU the gap is the host's: RSS beyond live tensors (interpreter, libraries).
        host = m.host_step_peak_rss_bytes
        workspace = host - peak if host is not None else None
    return dataclasses.replace(
        m,
        weights_bytes=weights,
        caches_bytes=caches,
        gradients_bytes=gradients,
        optimizer_state_bytes=optimizer,
        training_state_bytes=None if gradients is None else gradients + (optimizer or 0),
        intermediates_bytes=intermediates,
        unattributed_bytes=unattributed,
        workspace_bytes=workspace,
    )


__all__ = ["with_breakdown"]
