"""Reviewed acceptances: a commit trailer that lets a known growth through the gate.

    Memtrack-Accept: decoder_generate +2 MiB a longer context is the feature
    Memtrack-Accept: decoder_generate allocated +2 MiB a longer context is the feature

names a workload (all its cases) or one case id, optionally a metric, the most it may grow
(a size, or a percentage of the baseline: `+50 %`) and why. Without a metric it accepts
every memory metric of the cases it names up to that amount: one intentional growth moves
several views (the allocator's, the host's, the step's) and several cases, and one trailer
says it once. With a metric it accepts that metric only. It travels in the pull request's
own commits, so it is reviewed with the code. A regression within it becomes `accepted`;
beyond it, it still blocks, and says which trailer would accept it. Budgets are not
affected: raising one stays a config change.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from memtrack.errors import ConfigError
from memtrack.records import metrics
from memtrack.units import format_size, parse_size

TRAILER = "Memtrack-Accept"
_SHA = re.compile(r"^[0-9a-fA-F]{4,64}$")
_VALUE = re.compile(
    r"^(?P<target>\S+)\s+(?:(?P<metric>[^\s+]\S*)\s+)?\+(?P<amount>[0-9]+(?:\.[0-9]+)?)\s*"
    r"(?P<unit>%|[A-Za-z]+)?\s+(?P<reason>\S.*)$"
)


@dataclass(frozen=True)
class Acceptance:
    """One `Memtrack-Accept` trailer."""

    commit: str
    target: str
    """A workload name or a case id."""
    metric: str | None
    """The one metric it accepts; None: every memory metric (metrics.GATED)."""
    bytes: int | None
    """The most the metric may grow, in bytes; or None when given as a percentage."""
    percent: float | None
    reason: str

    def names(self, workload: str, case_id: str) -> bool:
        """Whether it names this case: its id, or its workload."""
        return self.target in (workload, case_id)

    def covers(self, workload: str, case_id: str, metric: str) -> bool:
        accepted = metrics.GATED if self.metric is None else (self.metric,)
        return self.names(workload, case_id) and metric in accepted

    def allows(self, delta: float, delta_pct: float | None) -> bool:
        if self.bytes is not None:
            return delta <= self.bytes
        return delta_pct is not None and self.percent is not None and delta_pct <= self.percent

    def amount(self) -> str:
        return f"+{format_size(self.bytes)}" if self.bytes is not None else f"+{self.percent:g}%"

    def value(self) -> str:
        """The trailer's value as it is written: 'decoder allocated +2 MiB the reason'."""
        what = self.target if self.metric is None else f"{self.target} {self.metric}"
        if self.bytes is not None:
            return f"{what} +{_written(self.bytes)} {self.reason}"
        return f"{what} +{self.percent:g}% {self.reason}"


def parse(commit: str, value: str) -> Acceptance:
    """One trailer's value; raises ConfigError naming the commit and what is wrong."""
    where = f"{TRAILER} in commit {commit[:12]}"
    match = _VALUE.match(value.strip())
    if match is None:
        raise ConfigError(
            f"{where}: {value.strip()!r} is not '<workload or case> [<metric>] "
            "<+size or +N%> <reason>'"
        )
    metric = match["metric"]
    if metric is not None and metric not in metrics.GATED:
        raise ConfigError(f"{where}: unknown metric {metric!r} (one of {', '.join(metrics.GATED)})")
    number, unit = match["amount"], match["unit"] or ""
    if unit == "%":
        return Acceptance(
            commit, match["target"], metric, None, float(number), match["reason"].strip()
        )
    size = parse_size(f"{number} {unit}".strip(), what=where)
    return Acceptance(commit, match["target"], metric, size, None, match["reason"].strip())


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


class Growth(NamedTuple):
    """A case's metric that grew: what a trailer must name and allow."""

    workload: str
    case_id: str
    metric: str
    delta: float
    delta_pct: float | None


def find(acceptances: Iterable[Acceptance], g: Growth) -> Acceptance | None:
    """The acceptance that allows this growth of a case's metric; else one that covers the
    metric without allowing this much (to say so); else None."""
    workload, case_id, metric, delta, delta_pct = g
    covering = [a for a in acceptances if a.covers(workload, case_id, metric)]
    allowing = [a for a in covering if a.allows(delta, delta_pct)]
    found = allowing or covering
    return found[0] if found else None


def _written(n: int) -> str:
    """A size as a trailer would say it: '12 MiB', '3.5 GiB', '640 KiB', '100 B'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{math.ceil(10 * n / size) / 10:g} {unit}"  # up: it still accepts n
    return f"{n} B"


def _enough(delta: float) -> int:
    """The least round size at or above a growth: whole MiB from 1 MiB, whole KiB below."""
    for size in (2**20, 2**10):
        if delta >= size:
            return math.ceil(delta / size) * size
    return max(1, math.ceil(delta))


def would_accept(
    acceptances: Iterable[Acceptance], g: Growth
) -> tuple[Acceptance, Acceptance] | None:
    """A growth that blocks although a trailer of the change names its case: that trailer,
    and the one that would accept the growth (its own, without its metric where it names
    another, with the amount it needs). None where no trailer names the case."""
    workload, case_id, metric, delta, delta_pct = g
    for a in acceptances:
        if not a.names(workload, case_id) or (
            a.covers(workload, case_id, metric) and a.allows(delta, delta_pct)
        ):
            continue
        needed_metric = a.metric if a.metric == metric else None
        if a.percent is not None and delta_pct is not None:
            percent = max(a.percent, float(math.ceil(delta_pct)))
            return a, Acceptance(a.commit, a.target, needed_metric, None, percent, a.reason)
        size = max(a.bytes or 0, _enough(delta))
        return a, Acceptance(a.commit, a.target, needed_metric, size, None, a.reason)
    return None


__all__ = [
    "TRAILER",
    "Growth",
    "Acceptance",
    "find",
    "parse",
    "unknown_targets",
    "would_accept",
]
