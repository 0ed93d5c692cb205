"""A paired timing (`memtrack run --against REF`): REF and the candidate timed in the same
job, their timing passes alternating, so that both sides see the same machine.

REF is made ready before the run's own cases (`reference`): a worktree of REF beside the
user's tree and a fork server for the pair, which imports what the cases need beside the run's
own server, forks a twin of itself in REF's tree (worker.server.start_twin: one server's
imports for both sides) and then waits. After the run's own cases, each case is timed again at
the price of its iterations: two live workers, REF's (its workload code, forked from REF's
server, the twin) and the candidate's (forked from the pair's server), each set up and
warmed up once, one after the other, then rounds of one timing pass each (the candidate's
`repeats` iterations), A B, A B, ...: each pass follows the other side's, as a pass after its
own side's ran up to 1.8x slower (worker.turns). One side runs at a time: each waits for a
token. Both sides run in `pair_env()` (OpenMP's idle threads asleep): beside a busy process,
that is what kept a multi-threaded case's 2x slowdown in sight (scripts/bench_pairs.py). The
rounds stop once enough of them found the candidate not slower that the time verdict can no
longer warn (one of the default five: judge.timing.futile_after), so a cosmetic change costs
about two rounds, and a slowdown all of them. The candidate's warm-up and repeats on both
sides, and no memory pass (memory is judged against the history, as without a pair).

A fresh process a pass cost two setups a round; live processes cost two a case, and told
cosmetic pairs from 2x slowdowns as well, quiet and beside a busy process
(scripts/bench_pairs.py, both measured side by side).

The candidate's measurement keeps both sides' pass medians (`pair_*`), which the time
verdict compares (judge.timing). REF's passes are recorded as a run of REF: timing-only
measurements (kind 'timing'), never a baseline. The cost, two setups and two timing passes a
round per case, is printed after the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from memtrack.config import MERGE_BASE, Config, load_config
from memtrack.errors import ConfigError, MemtrackError
from memtrack.judge.timing import futile_after
from memtrack.machine import provenance
from memtrack.machine.provenance import git_output
from memtrack.measure.forkserver import ForkServer
from memtrack.measure.launcher import launch, new_spec, worker_env
from memtrack.measure.outcome import to_measurement
from memtrack.measure.worktree import without_branch_names, worktree
from memtrack.records import PAIR_FIGURES, GitInfo, Measurement, RunRecord, now
from memtrack.records.model import FIGURE_FIELDS
from memtrack.records.redact import redact
from memtrack.worker import turns
from memtrack.worker.measure import time_summary
from memtrack.workload.registry import Case, ranks_of, suite_hash


@dataclass(frozen=True)
class Pairing:
    """What a paired timing did: the run with its pairs, REF's run, and what it says."""

    record: RunRecord
    """The candidate's run, each paired case's measurement holding both sides' passes."""
    ref_record: RunRecord | None
    """REF's passes as a run of REF (None where no case was paired)."""
    lines: tuple[str, ...]
    """Its cost, and each case left unpaired with why, one line each."""


PAIR_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""What both sides of a pair run with, where the user set nothing else: OpenMP's idle threads
asleep, not spinning. Beside a busy process, a spinning thread's wait is CPU time and holds
the core the other threads wait for: a multi-threaded matmul made 2x slower warned in 3-14 %
of draws spinning, 100 % asleep (scripts/bench_pairs.py, two recordings)."""


def pair_env() -> dict[str, str]:
    """The environment of a pair's workers: a worker's, with PAIR_ENV's defaults."""
    return {**PAIR_ENV, **worker_env()}


@dataclass(frozen=True)
class Reference:
    """REF made ready (`reference`): its commit, how it was chosen, its worktree's config
    file, config and fork server, and the candidate's side's fork server; or why none could
    be had (one line)."""

    ref: str
    how: str
    config_file: Path | None = None
    config: Config | None = None
    server: ForkServer | None = None
    """REF's side's server: the twin of the candidate's, in REF's tree."""
    own_server: ForkServer | None = None
    """The candidate's side's server: the run's own server's imports, in `pair_env()`."""
    why: str | None = None


def resolve_ref(config: Config, against: str, git: GitInfo) -> tuple[str, str]:
    """REF's commit and how it was chosen ('the merge-base with main', ...). 'merge-base':
    the candidate's merge-base with the base branch, or on the base branch itself (the
    merge-base is the commit) its first parent. A ConfigError where there is no such
    commit, or where it is the checked-out commit itself."""
    if against == MERGE_BASE:
        how = f"the merge-base with {config.base_branch}"
        ref = git.merge_base
        if ref is not None and ref == git.commit:
            ref, how = git.parent, "the parent commit, on the base branch"
        if ref is None:
            raise ConfigError(
                f"--against merge-base: no merge-base with {config.base_branch!r} is known "
                "here (a shallow clone? fetch the history: fetch-depth: 0)"
            )
    else:
        how = f"{against} as given"
        ref = git_output(
            config.root, "rev-parse", "--verify", "--quiet", revs=(f"{against}^{{commit}}",)
        )
        if not ref:
            raise ConfigError(f"--against: {against!r} names no commit in this repository")
    if ref == git.commit and not git.dirty:
        raise ConfigError(f"--against {against}: that is the checked-out commit itself")
    if not git_output(config.root, "rev-parse", "--verify", "--quiet", revs=(f"{ref}^{{commit}}",)):
        # a shallow clone names its boundary's parents without holding them
        raise ConfigError(
            f"--against {against}: {ref[:12]} ({how}) is not in this clone (a shallow clone? "
            "fetch the history: fetch-depth: 0)"
        )
    return ref, how


def _times(m: Measurement, figure: str) -> Sequence[float]:
    times: Sequence[float] = getattr(m, FIGURE_FIELDS[figure])
    return times


def pass_medians(m: Measurement, figure: str) -> tuple[float, ...]:
    """A side's pass medians: its iterations in passes of its `repeats`, in order (what
    worker.turns compares too; a pass's fastest iteration told apart no better:
    scripts/bench_pairs.py)."""
    times, n = _times(m, figure), m.repeats
    return tuple(float(statistics.median(times[i : i + n])) for i in range(0, len(times), n))


def _figure(sides: Sequence[Measurement]) -> str:
    """The first figure (the one load moves least) both sides hold for every iteration."""
    for figure in PAIR_FIGURES:
        if all(len(_times(m, figure)) == len(m.iteration_times_s) > 0 for m in sides):
            return figure
    return "wall time"


class _NoPair(Exception):
    """Why no case is paired (one line): REF's tree, config or suite cannot be had."""


def _unpaired(ref: str, exc: BaseException) -> str:
    """Why no case is paired, where something unforeseen went wrong: its first line."""
    why = redact(f"{type(exc).__name__}: {exc}".strip().splitlines()[0]) or ""
    return f"no paired timing against {ref[:12]}: {why}"


@contextlib.contextmanager
def reference(config: Config, ref: str, how: str) -> Iterator[Reference]:
    """REF's worktree, config and fork servers for the block (the pair's server imports what
    the cases need at once, beside the run's own server, forks REF's server as its twin, then
    waits), or why they cannot be had.
    Nothing here ends the run: a REF that cannot be had leaves it unpaired, with the
    reason."""
    with contextlib.ExitStack() as stack:
        try:
            config_file, why = stack.enter_context(worktree(config, ref))
            if config_file is None:
                raise _NoPair(f"no paired timing against {ref[:12]}: {why}")
            try:
                ref_config = load_config(config_file)
            except MemtrackError as exc:
                raise _NoPair(f"no paired timing: {ref[:12]}'s config: {exc}") from exc
            # Both sides in the pair's environment (the run's own cases in theirs, as every
            # run's), from one server's imports: REF's side is the candidate's twin, in REF's
            # tree, where REF's tree is first on the import path (registry.repository_first):
            # what the workloads import from the repository is REF's, though an editable
            # install points at the user's tree; a package installed otherwise is the same on
            # both
            own = stack.enter_context(
                ForkServer.start(pair_env(), cwd=config.root, pairs=True, twin=ref_config.root)
            )
            found = Reference(ref, how, config_file, ref_config, own.twin, own)
        except _NoPair as exc:
            found = Reference(ref, how, why=str(exc))
        except Exception as exc:
            found = Reference(ref, how, why=_unpaired(ref, exc))
        yield found


def pair_cases(
    config: Config,
    cases: list[Case],
    record: RunRecord,
    device: str,
    against: Reference,
    say: Callable[[str], None] = lambda line: None,
) -> Pairing:
    """Time every case of `record` that measured ok against REF (`against`, made ready by
    `reference`), in `config.pair_rounds` rounds. Whatever goes wrong here (an interrupt
    too), the run itself is kept, unpaired, with a line saying why."""
    ref, how = against.ref, against.how
    ref_config, ref_server, ref_file = against.config, against.server, against.config_file
    server = against.own_server
    if ref_config is None or ref_server is None or ref_file is None or server is None:
        return Pairing(record, None, (against.why or f"no paired timing against {ref[:12]}",))
    started, t0 = now(), time.perf_counter()
    try:
        try:
            theirs = {c.case_id: c for w in ref_server.discover(ref_config) for c in w.cases()}
        except MemtrackError as exc:
            raise _NoPair(f"no paired timing: {ref[:12]}'s suite: {exc}") from exc
        server.discover(config)  # the candidate's modules imported once, in its server
        # REF's workload code, the candidate's settings (warm-up, timeout) and data/ (data
        # is not code, and often not in git)
        ref_view = dataclasses.replace(config, root=ref_config.root)

        def timed(ref_case: Case, case: Case) -> tuple[Measurement, Measurement]:
            return time_pair(
                config, (ref_view, ref_case, ref_server), (config, case, server), device
            )

        paired, refs, lines = _time_pairs(record, cases, theirs, timed, ref, say)
        ref_git = provenance.git_info(
            ref_file.parent,
            config.base_branch,
            env=without_branch_names(),
            repository=record.git.repository,
        )
    except _NoPair as exc:
        return Pairing(record, None, (str(exc),))
    except (Exception, KeyboardInterrupt) as exc:
        return Pairing(record, None, (_unpaired(ref, exc),))
    if paired:
        rounds = [len(m.pair_times_s) for m in paired.values()]
        stopped = sum(n < config.pair_rounds for n in rounds)
        lines.insert(
            0,
            f"paired timing against {ref[:12]} ({how}): {len(paired)} case"
            f"{'s' * (len(paired) != 1)} x up to {config.pair_rounds} rounds, "
            f"{2 * sum(rounds)} timing passes more (each side set up once; {stopped} "
            f"stopped early, once they could no longer warn), "
            f"{time.perf_counter() - t0:.1f} s",
        )
    record = dataclasses.replace(
        record, measurements=tuple(paired.get(m.case_id, m) for m in record.measurements)
    )
    if not refs:
        return Pairing(record, None, tuple(lines))
    ref_hash = suite_hash([theirs[m.case_id] for m in refs], ref_config)
    return Pairing(record, _ref_run(record, refs, ref_git, ref_hash, started), tuple(lines))


def _ref_run(
    record: RunRecord, refs: list[Measurement], git: GitInfo, suite: str, started: str
) -> RunRecord:
    """REF's timing passes as a run of REF (of no branch), on the candidate's machine."""
    return RunRecord(
        run_id=uuid.uuid4().hex,
        started_at=started,
        finished_at=now(),
        git=dataclasses.replace(git, branch=None),
        ci=record.ci,
        environment=record.environment,
        suite_hash=suite,
        config_path=record.config_path,
        measurements=tuple(refs),
    )


def _time_pairs(
    record: RunRecord,
    cases: list[Case],
    theirs: dict[str, Case],
    timed: Callable[[Case, Case], tuple[Measurement, Measurement]],
    ref: str,
    say: Callable[[str], None],
) -> tuple[dict[str, Measurement], list[Measurement], list[str]]:
    """Each case of the run that measured ok, timed against REF's case of the same id: the
    candidate's paired measurements, REF's, and a line for each case left unpaired."""
    paired: dict[str, Measurement] = {}
    refs: list[Measurement] = []
    lines: list[str] = []
    by_id = {c.case_id: c for c in cases}
    for m in record.measurements:
        case, other = by_id.get(m.case_id), theirs.get(m.case_id)
        if case is None or m.status != "ok" or m.kind != "measured":
            continue
        if ranks_of(case.params) is not None:
            lines.append(f"{m.case_id}: not paired: a case of several processes")
            continue
        if other is None:
            lines.append(f"{m.case_id}: not paired: {ref[:12]} has no such case")
            continue
        say(f"paired timing · {m.case_id} against {ref[:12]}")
        there, here = timed(other, case)
        sides = ((ref[:12], there), ("the candidate", here))
        failed = [(side, p) for side, p in sides if p.status != "ok"]
        if failed:
            side, p = failed[0]
            said = (p.message or "").strip().splitlines()
            why = f"{side}'s side {p.status}: {redact(said[-1]) if said else ''}"
            lines.append(f"{m.case_id}: not paired: {why}")
            continue
        paired[m.case_id], ref_m = _pair(m, here, there, ref, record.git.commit or "")
        refs.append(ref_m)
    return paired, refs, lines


Side = tuple[Config, Case, ForkServer]


def time_pair(
    config: Config, ref_side: Side, own_side: Side, device: str, early_stop: bool = True
) -> tuple[Measurement, Measurement]:
    """One case timed on both sides at once: two live workers (each forked by its side's
    server), each set up and warmed up once, then taking turns
    (worker.turns) through `config.pair_rounds` rounds of one timing pass each, or fewer: the
    rounds stop once the time verdict can no longer find the candidate slower (`early_stop`;
    judge.timing.futile_after). Each side's measurement holds its passes' iterations in
    order, `repeats` a pass. Both sides together are given the time of two setups and of the
    rounds, each as long as the case's limit (measure.timeout)."""
    warmup, repeats, timeout_s = config.settings_for(own_side[1].workload)
    limit_s = timeout_s * (2 + config.pair_rounds)
    order = turns.schedule(config.pair_rounds)
    stop_after = futile_after(config.pair_rounds, config.headroom_factor) if early_stop else 0
    with tempfile.TemporaryDirectory(prefix="memtrack-pair-") as tmp:
        folder = Path(tmp)
        fds = turns.make(folder)
        try:
            specs = []
            for side, (cfg, case, _) in enumerate((ref_side, own_side)):
                scratch = folder / f"scratch-{side}"  # the case's ctx.scratch_dir
                scratch.mkdir(mode=0o700)
                spec = new_spec(
                    cfg,
                    case,
                    device,
                    warmup,
                    repeats,
                    folder / f"result-{side}.json",
                    scratch_dir=scratch,
                    timing_only=True,
                    data_dir=config.root / "data",
                )
                specs.append(
                    dataclasses.replace(
                        spec, turns=tmp, side=side, schedule=order, stop_after=stop_after
                    )
                )
            turns.start(fds, order)  # the first turn: REF's setup
            outcomes, _ = launch(specs, limit_s, servers=[ref_side[2], own_side[2]])
        finally:
            for fd in fds:
                os.close(fd)
    ref_m, own_m = (
        to_measurement(case, spec, outcome, config.nvml_interval_s, limit_s)
        for (_, case, _), spec, outcome in zip((ref_side, own_side), specs, outcomes, strict=True)
    )
    return ref_m, own_m


def _pair(
    m: Measurement, here: Measurement, there: Measurement, ref: str, commit: str
) -> tuple[Measurement, Measurement]:
    """The candidate's measurement with both sides' pass medians, and REF's side as one
    timing-only measurement."""
    figure = _figure([here, there])
    mine, others = pass_medians(here, figure), pass_medians(there, figure)
    said = (
        f"paired timing: {len(mine)} round{'s' * (len(mine) != 1)} of two passes, "
        f"OMP_WAIT_POLICY={pair_env()['OMP_WAIT_POLICY']}"
    )
    paired = dataclasses.replace(
        m,
        pair_ref=ref,
        pair_figure=figure,
        pair_times_s=mine,
        pair_ref_times_s=others,
        notes=(*m.notes, said),
    )
    reference = dataclasses.replace(
        there,
        kind="timing",
        repeats=len(there.iteration_times_s),
        **time_summary(there.iteration_times_s),
        pair_ref=commit,
        pair_figure=figure,
        pair_times_s=others,
        pair_ref_times_s=mine,
        notes=(
            *there.notes,
            f"timing passes only: the reference side of a paired timing of {commit[:12]}",
            said,
        ),
    )
    return paired, reference


__all__ = [
    "Pairing",
    "Reference",
    "pair_cases",
    "reference",
    "resolve_ref",
    "time_pair",
]
