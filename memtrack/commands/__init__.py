"""One module per command. COMMANDS names each command's module; the CLI imports a module
only when its command runs (or help lists them all), so `memtrack check` and `memtrack
ingest` start without importing what `run`, `plan` or `dashboard` need."""

COMMANDS = {
    "backup": "backup",
    "bisect": "bisect",
    "check": "check",
    "dashboard": "dashboard",
    "db": "db",
    "diff": "diff",
    "doctor": "doctor",
    "estimate": "estimate",
    "export": "backup",
    "history": "history",
    "ingest": "ingest",
    "init": "init",
    "plan": "plan",
    "reference": "reference",
    "run": "run",
    "show": "show",
    "snapshot": "snapshot",
}
"""Command name -> the module of memtrack/commands/ that defines it, under that name."""
