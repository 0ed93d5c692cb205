"""A paired timing (`memtrack run --against REF`): REF and the candidate timed in the same
job, their timing passes alternating, so that both sides see the same machine.

After the run's own cases, each case is timed again in rounds: one pass of REF (its workload
code, in a worktree of REF beside the user's tree, forked from a fork server of its own) and
one of the candidate (forked from the run's server), in the order A B, then B A, so that a
load that grows or fades over the rounds weighs on both sides alike. A pass is a fresh
process: setup, warm-up and the timing pass, with the candidate's warm-up and repeats on
both sides, and no memory pass (memory is judged against the history, as without a pair).

The candidate's measurement keeps both sides' pass medians (`pair_*`), which the time
verdict compares (judge.timing). REF's passes are recorded as a run of REF: timing-only
measurements (kind 'timing'), never a baseline. The cost is about two timing passes (with
their setup and warm-up) per round per case, printed after the run.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memtrack.config import MERGE_BASE, Config, load_config
from memtrack.errors import ConfigError, MemtrackError
from memtrack.machine import provenance
from memtrack.machine.provenance import git_output
from memtrack.measure.case import run_case
from memtrack.measure.forkserver import ForkServer
from memtrack.measure.launcher import worker_env
from memtrack.measure.worktree import without_branch_names, worktree
from memtrack.records import PAIR_FIGURES, GitInfo, Measurement, RunRecord, now
from memtrack.records.redact import redact
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


def pass_median(m: Measurement, figure: str) -> float:
    return float(statistics.median(_times(m, figure)))


def _times(m: Measurement, figure: str) -> Sequence[float]:
    return {
        "device time": m.iteration_device_times_s,
        "tree CPU time": m.iteration_tree_cpu_times_s,
        "CPU time": m.iteration_cpu_times_s,
        "wall time": m.iteration_times_s,
    }[figure]


def _figure(passes: Sequence[Measurement]) -> str:
    """The first figure (the one load moves least) every pass holds."""
    for figure in PAIR_FIGURES:
        if all(_times(m, figure) for m in passes):
            return figure
    return "wall time"


def _reference_measurement(
    passes: list[Measurement], figure: str, here: list[float], there: list[float], commit: str
) -> Measurement:
    """REF's passes as one timing-only measurement: every pass's iterations in order."""
    first = passes[0]
    walls = tuple(t for m in passes for t in m.iteration_times_s)
    counted = all(m.iteration_instructions for m in passes)
    return dataclasses.replace(
        first,
        kind="timing",
        repeats=sum(m.repeats for m in passes),
        **time_summary(walls),
        iteration_cpu_times_s=tuple(t for m in passes for t in m.iteration_cpu_times_s),
        iteration_tree_cpu_times_s=tuple(t for m in passes for t in m.iteration_tree_cpu_times_s),
        iteration_device_times_s=tuple(t for m in passes for t in m.iteration_device_times_s),
        iteration_instructions=tuple(i for m in passes for i in m.iteration_instructions)
        if counted
        else (),
        duration_s=round(sum(m.duration_s or 0.0 for m in passes), 4),
        pair_ref=commit,
        pair_figure=figure,
        pair_times_s=tuple(there),
        pair_ref_times_s=tuple(here),
        notes=(
            f"timing passes only: the reference side of a paired timing of {commit[:12]} "
            f"({len(passes)} rounds)",
        ),
    )


class _NoPair(Exception):
    """Why no case is paired (one line): REF's tree, config or suite cannot be had."""


def pair_cases(
    config: Config,
    cases: list[Case],
    record: RunRecord,
    server: ForkServer,
    device: str,
    ref: str,
    how: str,
    say: Callable[[str], None] = lambda line: None,
) -> Pairing:
    """Time every case of `record` that measured ok against REF, in `config.pair_rounds`
    rounds; `server`: the run's fork server (the candidate's side). Whatever goes wrong
    here (an interrupt too), the run itself is kept, unpaired, with a line saying why."""
    started, t0 = now(), time.perf_counter()
    try:
        with worktree(config, ref) as (config_file, why):
            if config_file is None:
                raise _NoPair(f"no paired timing against {ref[:12]}: {why}")
            try:
                ref_config = load_config(config_file)
            except MemtrackError as exc:
                raise _NoPair(f"no paired timing: {ref[:12]}'s config: {exc}") from exc
            # REF's tree first on the import path (registry.repository_first): what the
            # workloads import from the repository is REF's, though an editable install
            # points at the user's tree; a package installed otherwise is the same on both
            with ForkServer.start(worker_env(), cwd=ref_config.root) as ref_server:
                try:
                    theirs = {
                        c.case_id: c for w in ref_server.discover(ref_config) for c in w.cases()
                    }
                except MemtrackError as exc:
                    raise _NoPair(f"no paired timing: {ref[:12]}'s suite: {exc}") from exc
                # REF's workload code, the candidate's settings (warm-up, repeats, timeout)
                # and data/ (data is not code, and often not in git)
                ref_view = dataclasses.replace(config, root=ref_config.root)

                def timed(cfg: Config, case: Case, srv: ForkServer) -> Measurement:
                    return run_case(
                        cfg,
                        case,
                        device,
                        record.environment.visible_uuids,
                        server=srv,
                        timing_only=True,
                        data_dir=config.root / "data",
                    )

                paired, refs, lines = _time_pairs(
                    record, cases, theirs, (ref_view, ref_server), (config, server), timed, ref, say
                )
            ref_git = provenance.git_info(
                config_file.parent,
                config.base_branch,
                env=without_branch_names(),
                repository=record.git.repository,
            )
    except _NoPair as exc:
        return Pairing(record, None, (str(exc),))
    except (Exception, KeyboardInterrupt) as exc:
        why = redact(f"{type(exc).__name__}: {exc}".strip().splitlines()[0]) or ""
        return Pairing(record, None, (f"no paired timing against {ref[:12]}: {why}",))
    if paired:
        passes = 2 * config.pair_rounds * len(paired)
        lines.insert(
            0,
            f"paired timing against {ref[:12]} ({how}): {len(paired)} case"
            f"{'s' * (len(paired) != 1)} x {config.pair_rounds} rounds, {passes} timing passes "
            f"more, {time.perf_counter() - t0:.1f} s",
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
    ref_side: tuple[Config, ForkServer],
    own_side: tuple[Config, ForkServer],
    timed: Callable[[Config, Case, ForkServer], Measurement],
    ref: str,
    say: Callable[[str], None],
) -> tuple[dict[str, Measurement], list[Measurement], list[str]]:
    """Each case of the run that measured ok, timed in rounds against REF's case of the same
    id: the candidate's paired measurements, REF's, and a line for each case left unpaired."""
    (ref_config, ref_server), (config, server) = ref_side, own_side
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
        say(f"paired timing · {m.case_id} · {config.pair_rounds} rounds against {ref[:12]}")
        here, there, failed = _rounds(
            config.pair_rounds, (ref_config, other, ref_server), (config, case, server), timed, ref
        )
        if failed is not None:
            lines.append(f"{m.case_id}: not paired: {failed}")
            continue
        paired[m.case_id], ref_m = _pair(m, here, there, ref, record.git.commit or "")
        refs.append(ref_m)
    return paired, refs, lines


Side = tuple[Config, Case, ForkServer]


def _rounds(
    rounds: int,
    ref_side: Side,
    own_side: Side,
    timed: Callable[[Config, Case, ForkServer], Measurement],
    ref: str,
) -> tuple[list[Measurement], list[Measurement], str | None]:
    """`rounds` rounds of one timing pass of each side, REF first in the even ones (A B,
    B A): the candidate's passes, REF's, and where a pass failed, why they stopped."""
    here: list[Measurement] = []
    there: list[Measurement] = []
    for i in range(rounds):
        sides = [(ref_side, there), (own_side, here)]
        for (cfg, case, srv), into in sides if i % 2 == 0 else sides[::-1]:
            p = timed(cfg, case, srv)
            into.append(p)
            if p.status != "ok":
                side = ref[:12] if into is there else "the candidate"
                said = (p.message or "").strip().splitlines()
                return here, there, f"{side}'s pass {p.status}: {redact(said[-1]) if said else ''}"
    return here, there, None


def _pair(
    m: Measurement, here: list[Measurement], there: list[Measurement], ref: str, commit: str
) -> tuple[Measurement, Measurement]:
    """The candidate's measurement with both sides' pass medians, and REF's passes as one
    timing-only measurement."""
    figure = _figure([*here, *there])
    mine = [pass_median(p, figure) for p in here]
    others = [pass_median(p, figure) for p in there]
    paired = dataclasses.replace(
        m,
        pair_ref=ref,
        pair_figure=figure,
        pair_times_s=tuple(mine),
        pair_ref_times_s=tuple(others),
    )
    return paired, _reference_measurement(there, figure, mine, others, commit)


__all__ = ["Pairing", "pair_cases", "pass_median", "resolve_ref"]
