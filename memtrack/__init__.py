"""memtrack: peak memory of pinned workloads, from every view, per commit, gated in CI.

Declare workloads with `@memtrack.workload`; each receives a `memtrack.Context`.
"""

from __future__ import annotations

from memtrack.errors import ConfigError, MemtrackError, RecordError, StoreError, WorkloadError
from memtrack.workload.context import Context
from memtrack.workload.registry import workload

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Context",
    "MemtrackError",
    "RecordError",
    "StoreError",
    "WorkloadError",
    "__version__",
    "workload",
]
