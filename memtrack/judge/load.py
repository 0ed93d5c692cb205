"""How busy the machine was while a case was timed, and when that is too busy to judge time.

Time is judged on what load moves least (process CPU time on the CPU, CUDA event time on a
GPU), but no figure survives a machine where the case and the other processes together want
more cores than there are: threads wait for a CPU, caches are shared, and even CPU time
grows (a thread pool's threads spin while they wait for each other). There the gate
abstains. The case's own demand is its CPU time over its wall time; the others' is their
runnable tasks. CPU pressure (PSI) is shown and decides nothing: it counts the case's own
threads waiting for each other too (four sessions on two cores read 60-77 % on a quiet
machine), and a pass of a millisecond is too short for it (0 % beside six busy loops).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memtrack.records import Measurement

SLACK_CORES = 1.5
"""Demand up to the cores plus one and a half is not oversubscription: the runnable counts
are instants, and catch a sampler or a shell that runs for a moment (on the shipped suite's
256 recorded measurements of a quiet 2-core machine, demand reached cores + 1.1)."""


def own_demand(cpu_times: Sequence[float], wall_times: Sequence[float]) -> float | None:
    """Cores the case kept busy while timed: its CPU time over its wall time (a thread pool
    spinning counts, as it takes its cores from others)."""
    wall = sum(wall_times)
    if not cpu_times or len(cpu_times) != len(wall_times) or wall <= 0:
        return None
    return sum(cpu_times) / wall


@dataclass(frozen=True)
class Load:
    """The machine's load during one timing pass (see the Measurement's `timing_*`)."""

    pressure: float | None = None
    """Share of the pass's wall time some task waited for a CPU (PSI `some`)."""
    runnable: float | None = None
    """Runnable tasks of other processes, the mean of samples around every iteration."""
    cores: int | None = None
    """CPUs the case could run on."""
    steal: float | None = None
    """Share of CPU time a hypervisor gave others."""
    own: float | None = None
    """Cores the case itself kept busy (`own_demand`)."""

    @classmethod
    def of(cls, m: Measurement) -> Load:
        return cls(
            m.timing_cpu_pressure,
            m.timing_runnable,
            m.timing_cores,
            m.timing_steal,
            own_demand(m.iteration_cpu_times_s, m.iteration_times_s),
        )

    def oversubscribed(self) -> str | None:
        """Why the machine was too busy to judge time on; None where it was not (or where
        nothing was recorded: older records)."""
        if self.runnable is None or not self.cores:
            return None
        demand = self.runnable + (self.own or 0.0)
        if demand <= self.cores + SLACK_CORES:
            return None
        return (
            f"{self.runnable:.1f} runnable tasks of other processes beside the case's "
            f"{self.own or 0.0:.1f} busy cores, on {self.cores} core{'s' * (self.cores != 1)}"
        )

    def describe(self) -> str:
        """'CPU pressure 3%, 0.2 runnable others on 2 cores, steal 0%' (what was recorded)."""
        parts = []
        if self.pressure is not None:
            parts.append(f"CPU pressure {self.pressure:.0%}")
        if self.runnable is not None:
            parts.append(
                f"{self.runnable:.1f} runnable others"
                + (f" on {self.cores} core{'s' * (self.cores != 1)}" if self.cores else "")
            )
        if self.steal:
            parts.append(f"steal {self.steal:.0%}")
        return ", ".join(parts)


__all__ = ["SLACK_CORES", "Load", "own_demand"]
