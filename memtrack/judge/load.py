"""How busy the machine was while a case was timed, and when that is too busy to judge time.

Time is judged on what load moves least (process CPU time on the CPU, CUDA event time on a
GPU), but no figure survives a machine where the case and the other processes together want
more cores than there are: threads wait for a CPU, caches are shared, and even CPU time
grows (a thread pool's threads spin while they wait for each other). There, without a paired
timing, the gate abstains.

The line is the cores themselves, the demand measured over the whole timing pass: the case's
own CPU time, the time its threads waited for a CPU, the CPU time other processes used on its
CPUs, and a lower bound of the others' wait (the share of the pass in which some task waited,
PSI `some`, less the case's own wait), each over the pass's wall time. Demand above the cores
by more than the time floor (5 %), with others wanting more than that share of the cores, is
contention. The others' wait counts: where the scheduler gives the case's session its fair
share, as Linux's autogroups do, the case barely waits while four busy loops queue. A case
whose own threads outnumber the cores waits for itself alone, on a quiet machine as on every
run of its history: not contention. Below the line, others took at most the floor's share of
the case's CPUs, which the floor absorbs.

A pass shorter than WHOLE_PASS_S is too short for the CPU lines' clock ticks (read less one
tick per CPU, they can only read the others low), and records from before these figures hold
none: there the instants count too, a sample of the other processes' runnable tasks before
and after each iteration (dense in so short a pass), against the cores plus SLACK_CORES.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memtrack.records import Measurement

CONTENTION = 0.05
"""Demand above the cores by more than this share of them, with other processes taking more
than this share, is contention: the time floor (judge.timing.TIME_MIN_EFFECT) is 5 % too."""
SLACK_CORES = 1.5
"""Instants around iterations only (older records, passes too short for the counters):
demand up to the cores plus one and a half is not oversubscription, as a sampler or a shell
runs for a moment (on the shipped suite's 256 recorded measurements of a quiet 2-core
machine, the instants read up to cores + 1.1)."""
WHOLE_PASS_S = 0.1
"""A timing pass shorter than this is too short for the counters over the whole pass (the
CPU lines count in clock ticks of 10 ms): its instants, a sample before and after each of its
iterations, cover it instead."""


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
    wait: float | None = None
    """Cores' worth of time the case's threads waited for a CPU over the pass."""
    others: float | None = None
    """Cores other processes used on the case's CPUs over the pass."""
    wall: float | None = None
    """The pass's timed wall time (its iterations'), seconds."""

    @classmethod
    def of(cls, m: Measurement) -> Load:
        return cls(
            m.timing_cpu_pressure,
            m.timing_runnable,
            m.timing_cores,
            m.timing_steal,
            own_demand(
                m.iteration_tree_cpu_times_s or m.iteration_cpu_times_s, m.iteration_times_s
            ),
            m.timing_wait_cores,
            m.timing_others_cores,
            sum(m.iteration_times_s),
        )

    @property
    def others_waiting(self) -> float:
        """A lower bound of the other processes' wait for a CPU, in cores: the share of the
        pass in which some task waited (PSI `some`) less the case's own wait."""
        return max(0.0, (self.pressure or 0.0) - (self.wait or 0.0))

    @property
    def demand(self) -> float | None:
        """Cores the pass wanted: the case's CPU time and its wait, the others' CPU time and
        (a lower bound of) their wait."""
        if self.wait is None or self.others is None:
            return None
        return (self.own or 0.0) + self.wait + self.others + self.others_waiting

    def oversubscribed(self) -> str | None:
        """Why the machine was too busy to judge time on; None where it was not (or where
        nothing was recorded: older records)."""
        if not self.cores:
            return None
        demand = self.demand
        if demand is not None and self.others is not None:
            others = self.others + self.others_waiting
            if demand > self.cores * (1 + CONTENTION) and others > CONTENTION * self.cores:
                return (
                    f"the pass wanted {demand:.1f} cores of {self.cores}: the case "
                    f"{self.own or 0.0:.1f} busy and {self.wait or 0.0:.1f} waiting, other "
                    f"processes {self.others:.1f} busy and {self.others_waiting:.1f} waiting"
                )
            if (self.wall is None or self.wall >= WHOLE_PASS_S) and self.pressure is not None:
                return None
        # too short a pass for the CPU lines' ticks (they read others low, never high), a
        # kernel without PSI (the others' wait unseen), or an older record: the instants
        # around its iterations too
        if self.runnable is None:
            return None
        demand = self.runnable + (self.own or 0.0)
        if demand <= self.cores + SLACK_CORES:
            return None
        return (
            f"{self.runnable:.1f} runnable tasks of other processes beside the case's "
            f"{self.own or 0.0:.1f} busy cores, on {self.cores} core{'s' * (self.cores != 1)}"
        )

    def describe(self) -> str:
        """'CPU pressure 3%, demand 2.1 cores (others 0.1 busy, 0.0 waiting), steal 0%,
        2 cores' (what was recorded)."""
        parts = []
        if self.pressure is not None:
            parts.append(f"CPU pressure {self.pressure:.0%}")
        if self.demand is not None:
            parts.append(
                f"demand {self.demand:.1f} cores (others {self.others or 0.0:.1f} busy, "
                f"{self.others_waiting:.1f} waiting)"
            )
        if self.runnable is not None:
            parts.append(f"{self.runnable:.1f} runnable others")
        if self.steal is not None:
            parts.append(f"steal {self.steal:.0%}")
        if self.cores:
            parts.append(f"{self.cores} cores")
        return ", ".join(parts)


__all__ = ["CONTENTION", "SLACK_CORES", "WHOLE_PASS_S", "Load", "own_demand"]
