"""The suite loop that `memtrack run` and `memtrack estimate` share: every case measured in
turn (each in a fresh process), then one `RunRecord` of them with the git facts and the
environment fingerprint. The caller stores it.

A measured run starts its fork server first (`start_run`): while the server imports torch and
the suite, and probes the environment from a fork of itself, the runner takes the git facts;
each case is then a fork of the server rather than a new interpreter (measure.forkserver).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence

from memtrack.config import Config
from memtrack.machine import environment, provenance
from memtrack.measure import references
from memtrack.measure.case import run_case
from memtrack.measure.forkserver import ForkServer
from memtrack.measure.launcher import worker_env
from memtrack.measure.timeout import timeout_for
from memtrack.records import Environment, GitInfo, Measurement, RunRecord, now
from memtrack.workload.registry import Case, Workload, suite_hash

ProgressFn = Callable[[str, Case, "Measurement | None"], None]
"""Called with ('start', case, None) and ('done', case, measurement)."""


def probe_environment() -> Environment:
    """The environment fingerprint, as the workers see it (PINNED_ENV included)."""
    return environment.probe(env=worker_env())


class RunStart:
    """A measured run before its first case: its fork server, already importing, and the
    git facts, taken meanwhile."""

    def __init__(self, config: Config, server: ForkServer):
        self.config = config
        self.server = server
        self.started_at = now()
        self.git = provenance.git_info(
            config.root, config.base_branch, repository=config.repository
        )
        self._environment: Environment | None = None

    def workloads(self) -> list[Workload]:
        """The suite, discovered in the fork server: this process imports no workload module."""
        return self.server.discover(self.config)

    def environment(self) -> Environment:
        """The fingerprint from the server's forked probe, else from a fresh interpreter
        (probed once)."""
        if self._environment is None:
            self._environment = self.server.environment() or probe_environment()
        return self._environment


@contextlib.contextmanager
def start_run(config: Config) -> Iterator[RunStart]:
    """Start a run's fork server (in the workers' environment) and gather the run's facts;
    the server ends with the block."""
    server = ForkServer.start(worker_env())
    try:
        yield RunStart(config, server)
    finally:
        server.close()


def resolve_device(config: Config, env: Environment) -> str:
    if config.device != "auto":
        return config.device
    usable = env.cuda_available if env.cuda_available is not None else bool(env.cuda_runtime)
    return "cuda" if env.gpus and usable else "cpu"


def device_note(config: Config, env: Environment, device: str) -> str | None:
    """Why `auto` measured on the CPU of a machine whose GPUs NVML sees."""
    if config.device != "auto" or device != "cpu" or not env.gpus:
        return None
    why = env.cuda_unavailable_reason or "this torch build has no CUDA support"
    return (
        f"device auto: NVML sees {len(env.gpus)} GPU(s) but torch cannot use CUDA "
        f"({why}); measured on the CPU"
    )


def each_case(
    config: Config,
    cases: list[Case],
    measure: Callable[[Case], Measurement],
    *,
    env: Environment,
    shard: str | None = None,
    progress: ProgressFn | None = None,
    note: str | None = None,
    git: GitInfo | None = None,
    started: str | None = None,
) -> RunRecord:
    """Measure every case with `measure` and return the run. `note` goes on every case;
    `git` and `started`, where the caller took them already."""
    started = started or now()
    git = git or provenance.git_info(config.root, config.base_branch, repository=config.repository)
    measurements = []
    for case in cases:
        if progress:
            progress("start", case, None)
        m = measure(case)
        if note:
            m = dataclasses.replace(m, notes=(note, *m.notes))
        measurements.append(m)
        if progress:
            progress("done", case, m)
    return RunRecord(
        run_id=uuid.uuid4().hex,
        started_at=started,
        finished_at=now(),
        git=git,
        ci=provenance.ci_info(),
        environment=env,
        suite_hash=suite_hash(cases, config),
        config_path=str(config.path) if config.path else None,
        measurements=tuple(measurements),
        shard=shard,
    )


def run_suite(
    config: Config,
    cases: list[Case],
    *,
    shard: str | None = None,
    progress: ProgressFn | None = None,
    env: Environment | None = None,
    start: RunStart | None = None,
    durations: Mapping[str, Sequence[float]] | None = None,
) -> RunRecord:
    """Measure every case and return the run (the caller stores it). `start`: the run's
    start (`start_run`); without one, the run starts its own. `durations`: each case's
    recorded durations on this environment, which set its timeout (measure.timeout)."""
    if start is None:
        with start_run(config) as own:
            return run_suite(
                config,
                cases,
                shard=shard,
                progress=progress,
                env=env,
                start=own,
                durations=durations,
            )
    server = start.server
    server.ready(config)  # the suite imported there, where the caller discovered it itself
    env = env or start.environment()
    device = resolve_device(config, env)
    # a malformed manifest is refused before measuring
    manifest = references.load_manifest(config) if any(c.tolerance for c in cases) else {}

    def measure(case: Case) -> Measurement:
        quality = references.quality_spec(config, case, manifest)
        configured = config.settings_for(case.workload)[2]
        timeout_s = timeout_for(configured, (durations or {}).get(case.case_id, ()))
        return run_case(
            config,
            case,
            device,
            env.visible_uuids,
            quality=quality,
            server=server,
            timeout_s=timeout_s,
        )

    return each_case(
        config,
        cases,
        measure,
        env=env,
        shard=shard,
        progress=progress,
        note=device_note(config, env, device),
        git=start.git,
        started=start.started_at,
    )


__all__ = [
    "ProgressFn",
    "RunStart",
    "each_case",
    "probe_environment",
    "resolve_device",
    "run_suite",
    "start_run",
]
