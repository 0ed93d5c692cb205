"""One case measured in a fresh worker process (forked by the run's fork server where there is
one, or one per rank, see measure.ranks), with the NVML sampler beside it on CUDA. A failing
case (exception, out of memory, signal, timeout) becomes a Measurement with that status and
whatever figures it reached; a timeout on a contended machine is measured once more."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from memtrack.config import Config
from memtrack.measure.forkserver import ForkServer
from memtrack.measure.launcher import launch, new_spec
from memtrack.measure.outcome import to_measurement
from memtrack.measure.ranks import run_ranks
from memtrack.measure.sampler import start_sampler
from memtrack.measure.timeout import contended, measured_again
from memtrack.probes.quality import QualitySpec
from memtrack.records import Measurement
from memtrack.workload.registry import Case, ranks_of


def run_case(
    config: Config,
    case: Case,
    device: str,
    visible_uuids: tuple[str, ...] = (),
    *,
    quality: QualitySpec | None = None,
    snapshot_path: Path | None = None,
    server: ForkServer | None = None,
    timing_only: bool = False,
    data_dir: Path | None = None,
    timeout_s: float | None = None,
) -> Measurement:
    """One case in a fresh worker. `quality`: what the worker does with the step's output
    (measure.references); `snapshot_path`: `memtrack snapshot` writes there instead;
    `server`: the run's fork server, which forks the worker (ranks are spawned);
    `timing_only`: setup, warm-up and the timing pass alone (one side of a paired timing);
    `data_dir`: the case's `ctx.data_file` folder, where not the config root's data/;
    `timeout_s`: its limit (measure.timeout), where not the configured one. A timeout while
    the machine was contended is measured once more (measure.timeout)."""
    warmup, repeats, configured_s = config.settings_for(case.workload)
    timeout_s = timeout_s or configured_s
    world = ranks_of(case.params)

    def once() -> tuple[Measurement, str | None]:
        if world is not None:  # one process per rank, all at once
            return run_ranks(
                config, case, device, visible_uuids, world, timeout_s, snapshot_path=snapshot_path
            )
        with tempfile.TemporaryDirectory(prefix="memtrack-") as tmp:
            scratch = Path(tmp) / "scratch"  # the case's ctx.scratch_dir, removed with tmp
            scratch.mkdir(mode=0o700)
            spec = new_spec(
                config,
                case,
                device,
                warmup,
                repeats,
                Path(tmp) / "result.json",
                scratch_dir=scratch,
                quality=quality,
                snapshot_path=snapshot_path,
                timing_only=timing_only,
                data_dir=data_dir,
            )
            sampler = (
                None
                if timing_only
                else start_sampler(device, config.nvml_interval_s, visible_uuids)
            )
            (outcome,), _ = launch([spec], timeout_s, sampler=sampler, server=server)
        m = to_measurement(case, spec, outcome, config.nvml_interval_s, timeout_s)
        return m, contended(outcome)

    m, why = once()
    if why is None:
        return m
    m, _ = once()
    return dataclasses.replace(m, notes=(measured_again(timeout_s, why), *m.notes))


__all__ = ["run_case"]
