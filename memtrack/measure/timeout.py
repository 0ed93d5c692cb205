"""How long a case may run before it is a timeout, and when a timeout is measured again.

A fixed limit fits no machine: a generation case that takes 2-3 s on a quiet runner took 135 s
an iteration on a loaded one. So a case's limit is the larger of its configured `timeout`
(600 s by default: the floor) and TIMEOUT_MULTIPLE times its longest whole-case wall time
among its RECENT_RUNS newest ok runs on this environment (`timeout_for`), at most CEILING_S.
A case that times out while the machine was contended (judge.load's rule, over the whole case
instead of its timing pass) is measured once more; the second try is what is recorded, with a
note of the first. A timeout on a machine the case had to itself is recorded at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memtrack.judge.load import Load
from memtrack.measure.launcher import CaseOutcome

TIMEOUT_MULTIPLE = 5.0
"""A case's limit is at least this many times its longest recent duration on this
environment: room for a slower step, a cold cache and a busier machine, yet a hung case
still ends within a few of its own runs' time."""
RECENT_RUNS = 5
"""The recorded durations a limit reads: the newest ok runs of the case on this
environment, so that a case that became faster tightens its limit within a few runs."""
CEILING_S = 24 * 3600.0
"""No recorded duration raises a limit past a day (a damaged record cannot make a hung case
run forever)."""


def timeout_for(configured_s: float, recorded_s: Sequence[float]) -> float:
    """The case's limit: the configured timeout, or TIMEOUT_MULTIPLE times the longest of its
    recorded durations (finite, positive ones), whichever is larger, at most CEILING_S."""
    longest = max((d for d in recorded_s if math.isfinite(d) and d > 0), default=0.0)
    return max(configured_s, min(TIMEOUT_MULTIPLE * longest, CEILING_S))


def contended(outcome: CaseOutcome) -> str | None:
    """Why the machine was too busy while the case ran to its timeout (judge.load's words);
    None where the case did not time out, or had the machine to itself."""
    if not outcome.timed_out or outcome.load is None:
        return None
    return Load(**outcome.load).oversubscribed()


def measured_again(timeout_s: float, why: str) -> str:
    """The note of a case measured once more after a contended timeout."""
    return (
        f"the first try timed out after {timeout_s:g} s while the machine was contended "
        f"({why}): measured once more, this is the second try"
    )


__all__ = [
    "CEILING_S",
    "RECENT_RUNS",
    "TIMEOUT_MULTIPLE",
    "contended",
    "measured_again",
    "timeout_for",
]
