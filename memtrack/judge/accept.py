"""Reviewed acceptances: a commit trailer that lets a known growth through the gate.

    Memtrack-Accept: decoder_generate allocated +2 MiB a longer context is the feature

names a workload (or one case id), a metric, the most it may grow (a size, or a percentage
of the baseline) and why. It travels in the pull request's own commits, so it is reviewed
with the code. A regression within it becomes `accepted`; beyond it, it still blocks.
Budgets are not affected: raising one stays a config change.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from memtrack.errors import ConfigError
from memtrack.judge.baseline import git_output
from memtrack.records import metrics
from memtrack.units import format_size, parse_size

TRAILER = "Memtrack-Accept"
_SHA = re.compile(r"^[0-9a-fA-F]{4,64}$")
_VALUE = re.compile(
    r"^(?P<target>\S+)\s+(?P<metric>\S+)\s+\+(?P<amount>[0-9]+(?:\.[0-9]+)?)\s*"
    r"(?P<unit>%|[A-Za-z]+)?\s+(?P<reason>\S.*)$"
)


@dataclass(frozen=True)
class Acceptance:
    """One `Memtrack-Accept` trailer."""

    commit: str
    target: str
    """A workload name or a case id."""
    metric: str
    bytes: int | None
    """The most the metric may grow, in bytes; or None when given as a percentage."""
    percent: float | None
    reason: str

    def covers(self, workload: str, case_id: str, metric: str) -> bool:
        return self.target in (workload, case_id) and self.metric == metric

    def allows(self, delta: float, delta_pct: float | None) -> bool:
        if self.bytes is not None:
            return delta <= self.bytes
        return delta_pct is not None and self.percent is not None and delta_pct <= self.percent

    def amount(self) -> str:
        return f"+{format_size(self.bytes)}" if self.bytes is not None else f"+{self.percent:g}%"

    def describe(self) -> str:
        """'the +2.00 MiB accepted in commit 1a2b3c4d5e6f: a longer context is the feature'."""
        return f"the {self.amount()} accepted in commit {self.commit[:12]}: {self.reason}"


def parse(commit: str, value: str) -> Acceptance:
    """One trailer's value; raises ConfigError naming the commit and what is wrong."""
    where = f"{TRAILER} in commit {commit[:12]}"
    match = _VALUE.match(value.strip())
    if match is None:
        raise ConfigError(
            f"{where}: {value.strip()!r} is not '<workload or case> <metric> "
            "<+size or +N%> <reason>'"
        )
    metric = match["metric"]
    if metric not in metrics.GATED:
        raise ConfigError(f"{where}: unknown metric {metric!r} (one of {', '.join(metrics.GATED)})")
    number, unit = match["amount"], match["unit"] or ""
    if unit == "%":
        return Acceptance(
            commit, match["target"], metric, None, float(number), match["reason"].strip()
        )
    size = parse_size(f"{number} {unit}".strip(), what=where)
    return Acceptance(commit, match["target"], metric, size, None, match["reason"].strip())


def read(root: Path, since: str | None, until: str | None) -> tuple[list[Acceptance], list[str]]:
    """The acceptances in the commits after `since` up to `until` (git's since..until), and
    notes on what could not be read. Never raises: a bad trailer is a note, not an error."""
    if not until or not _SHA.match(until) or (since is not None and not _SHA.match(since)):
        return [], []
    span = f"{since}..{until}" if since else until
    out = git_output(
        root,
        "log",
        "--format=%H%x00%(trailers:key=" + TRAILER + ",valueonly,separator=%x01)%x00",
        revs=(span,),
    )
    if out is None:
        return [], [
            f"acceptances not read: the commits {span[:40]} are not in the repository at {root}"
        ]
    found, notes = [], []
    for record in out.split("\x00\n"):
        sha, _, values = record.strip("\n").partition("\x00")
        for value in filter(None, (v.strip() for v in values.strip("\x00").split("\x01"))):
            try:
                found.append(parse(sha, value))
            except ConfigError as exc:
                notes.append(f"ignored: {exc}")
    return found, notes


def unknown_targets(acceptances: Iterable[Acceptance], known: set[str]) -> list[str]:
    """A note for each acceptance that names no known workload or case: it guards nothing."""
    notes = []
    for a in acceptances:
        if a.target not in known:
            close = difflib.get_close_matches(a.target, sorted(known), n=3)
            hint = f" (nearest: {', '.join(close)})" if close else ""
            notes.append(
                f"ignored: {TRAILER} in commit {a.commit[:12]} names "
                f"{a.target!r}, which is no workload or case of this run{hint}"
            )
    return notes


def find(
    acceptances: Iterable[Acceptance],
    workload: str,
    case_id: str,
    metric: str,
    delta: float,
    delta_pct: float | None,
) -> Acceptance | None:
    """The acceptance that allows this growth of a case's metric; else one that covers the
    metric without allowing this much (to say so); else None."""
    covering = [a for a in acceptances if a.covers(workload, case_id, metric)]
    allowing = [a for a in covering if a.allows(delta, delta_pct)]
    found = allowing or covering
    return found[0] if found else None


__all__ = ["TRAILER", "Acceptance", "find", "parse", "read", "unknown_targets"]
