"""A commit's evidence: every run recorded for it, judged together.

The gate judges commits, not runs. A commit is measured by several runs: the workload suite
(or its shards), the team's tests under `pytest --memtrack`, re-runs of a job. Its evidence is
every measured run of the commit in its repository, on the candidate's environment
fingerprint and of its tree (a run with uncommitted changes is of no commit but itself):

- its cases are the union of its runs' cases;
- a case measured by several runs is judged on the lower median of each figure over its
  runs that finished (a growth blocks where at least half of them show it; a run that
  failed while another finished is said in a note); its other parts (sites, iterations,
  time) are those of the checked run where it finished, else of the newest run that did;
- a case that failed in every run is that failure.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from memtrack.records import Measurement, RunRecord, metrics
from memtrack.store import judging as reads
from memtrack.store.database import Store

MAX_RUNS = 20
"""Runs of one commit read as its evidence, the newest."""


@dataclass(frozen=True)
class Evidence:
    """A commit's runs joined into one candidate."""

    run: RunRecord
    """The checked run, its measurements each case's from the checked run where it finished,
    else from the newest run that did (or failed)."""
    values: dict[str, dict[str, float]]
    """Case id -> metric -> the figure judged: the lower median over its runs."""
    owners: dict[str, str]
    """Case id -> the run holding its measurement (verdicts are recorded against it)."""
    runs: tuple[RunRecord, ...]
    """Every run of the evidence, the checked one first."""
    notes: tuple[str, ...] = ()


def of_commit(store: Store, run: RunRecord) -> Evidence:
    """The evidence of `run`'s commit: `run` and every other measured run of its commit on
    its environment, of a clean tree where it is one."""
    runs = [run]
    if run.git.commit and not run.git.dirty:
        rows = reads.commit_runs(
            store, run.git.commit, run.environment.fingerprint, exclude=run.run_id
        )
        for row in rows[: MAX_RUNS - 1]:
            other = store.get_run(row["run_id"])
            measured = tuple(m for m in other.measurements if m.kind == "measured")
            if measured and not other.git.dirty:
                runs.append(replace(other, measurements=measured))
    return join(runs)


def join(runs: list[RunRecord]) -> Evidence:
    """Runs of one commit (the checked one first, the others newest first) as one
    candidate."""
    by_case: dict[str, list[tuple[RunRecord, Measurement]]] = {}
    for r in runs:
        for m in r.measurements:
            by_case.setdefault(m.case_id, []).append((r, m))
    chosen, owners, values, notes = [], {}, {}, []
    for case, found in by_case.items():
        ok = [(r, m) for r, m in found if m.status == "ok"]
        r, m = ok[0] if ok else found[0]
        chosen.append(m)
        owners[case] = r.run_id
        values[case] = _lower_medians([m for _, m in ok]) if len(ok) > 1 else {}
        failed = sorted({m.status for _, m in found if m.status != "ok"})
        if ok and failed:
            n = len(found) - len(ok)
            notes.append(
                f"{case}: {n} of {len(found)} runs of this commit failed ({', '.join(failed)}): "
                "judged on the runs that finished"
            )
    joined = sorted({r.run_id for r in runs} - {runs[0].run_id})
    if joined:
        notes.insert(
            0,
            f"the commit's evidence: this run and {len(joined)} more of the same commit "
            f"({', '.join(x[:12] for x in joined)}), each case on all of its runs",
        )
    return Evidence(
        replace(runs[0], measurements=tuple(chosen)), values, owners, tuple(runs), tuple(notes)
    )


def _lower_medians(ms: list[Measurement]) -> dict[str, float]:
    """Each figure's lower median over the runs that measured it."""
    out = {}
    for name in metrics.NAMES:
        found = [v for m in ms if (v := metrics.value(m, name)) is not None]
        if found:
            out[name] = float(statistics.median_low(found))
    return out


__all__ = ["MAX_RUNS", "Evidence", "join", "of_commit"]
