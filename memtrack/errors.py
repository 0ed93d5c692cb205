"""The errors memtrack raises on purpose. Anything else is a bug."""

from __future__ import annotations


class MemtrackError(Exception):
    """Base of every error that the CLI turns into a message and exit status 2."""


class ConfigError(MemtrackError):
    """A configuration file, key or value is invalid."""


class WorkloadError(MemtrackError):
    """A workload cannot be found, imported or declared as written."""


class StoreError(MemtrackError):
    """The database cannot be opened, is of an unknown schema, or lacks a record."""


class TransientStoreError(StoreError):
    """A server's database could not be reached, or said to try again: a restart, a
    failover, its connection limit, a conflict with another transaction. Retried, it may
    answer."""


class RecordError(MemtrackError):
    """A JSON run record is malformed or of an unsupported schema version."""


class ProbeError(MemtrackError):
    """The machine's environment could not be probed: its probe hung or failed."""
