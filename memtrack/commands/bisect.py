from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from memtrack.commands.options import (
    config_option,
    db_option,
    json_path_option,
    one_case_of,
    repository_of,
    resolve,
)
from memtrack.config import is_revision
from memtrack.errors import ConfigError, StoreError
from memtrack.escape import terminal_text
from memtrack.files import output_problem
from memtrack.store.url import present

if TYPE_CHECKING:
    from memtrack.judge.bisect import Bisection


@click.command()
@click.argument("case")
@click.argument("good")
@click.argument("bad")
@click.option(
    "--metric",
    default="allocated",
    show_default=True,
    help="The gated figure whose step is looked for.",
)
@config_option
@db_option
@json_path_option("the bisection as JSON")
def bisect(
    case: str,
    good: str,
    bad: str,
    metric: str,
    config_path: Path | None,
    db_path: Path | None,
    json_path: Path | None,
) -> None:
    """The first commit after GOOD up to BAD where CASE's figure steps past the gate's
    headroom (the noise model of `check`, against GOOD's runs).

    CASE is what `history` takes: a case id, a workload name with one case, or a prefix of
    one case's id. Every recorded run of a commit in the range on this machine's environment
    is reused; a commit the bisection needs and that has none is measured in a worktree of
    its own (the working tree and branch untouched) and recorded into the database as a run
    of that commit. A commit that cannot decide (a noisy figure, a failed run) is skipped
    and said. Exit 0 with the answer, 2 on bad input."""
    from memtrack.judge.gather.bisect import bisect as run_bisect
    from memtrack.judge.gather.git import commits_between
    from memtrack.measure.suite import probe_environment
    from memtrack.measure.worktree import measure_at
    from memtrack.store.opening import open_store

    config, db = resolve(config_path, db_path)
    # the measuring runs start in a worktree: a relative path would name a file there
    db = db.absolute() if isinstance(db, Path) else db
    for name, ref in (("GOOD", good), ("BAD", bad)):
        if not is_revision(ref):
            raise ConfigError(f"{name}: {ref!r} is not a revision")
    if json_path is not None and (problem := output_problem(json_path)):
        raise ConfigError(f"--json {json_path}: {problem}")
    commits_between(config.root, good, bad)  # GOOD and BAD before the probe (seconds)
    if not present(db):
        raise StoreError(f"{db}: no such database (record a run with `memtrack run`)")
    with open_store(db, repository=repository_of(config)) as store:
        case_id = one_case_of(store, db, case)
        fingerprint = probe_environment().fingerprint
        recorded: list[str] = []

        def measure(commit: str) -> str | None:
            before = set(store.run_ids(commit=commit, limit=10_000, measured=True))
            why = measure_at(config, db, commit, case_id)
            if why is None:
                if set(store.run_ids(commit=commit, limit=10_000, measured=True)) <= before:
                    return f"measured, but no run of it was recorded in {db}"
                recorded.append(commit)
            return why

        found = run_bisect(
            store, config, config.root, case_id, metric, good, bad, fingerprint, measure
        )
    for line in report(found, recorded):
        click.echo(terminal_text(line))
    if json_path is not None:
        data = {**dataclasses.asdict(found), "recorded": recorded}
        json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    sys.exit(0)


def report(b: Bisection, recorded: list[str]) -> list[str]:
    """The bisection's lines: each commit judged, then the answer, its step and where, and
    which commits it measured (`recorded`: those whose run is now in the database)."""
    out = [
        f"bisect {b.case_id} {b.metric}: {b.commits} commits after GOOD {b.good[:12]} up to "
        f"BAD {b.bad[:12]}, judged against GOOD's runs as `check` judges a change"
    ]
    from memtrack.report.words import message, words

    for j in b.judged:
        source = "measured" if j.measured else "recorded"
        why = words(j.verdict) if j.state == "bad" and j.verdict is not None else j.why
        out.append(f"  {j.commit[:12]}  {j.state:<4}  ({source}) {why}")
    out.append(b.message)
    if b.step is not None:
        out.append(f"  step: {message(b.step)}")
    if b.where is not None:
        out.append(f"  where: {b.where.text()}")
    if recorded:
        out.append(
            f"measured {len(recorded)} commit{'s' * (len(recorded) != 1)} (recorded as "
            f"runs of those commits): {', '.join(c[:12] for c in recorded)}"
        )
    unrecorded = [c for c in b.measured if c not in recorded]
    if unrecorded:
        out.append(
            f"could not measure {len(unrecorded)} commit{'s' * (len(unrecorded) != 1)} "
            f"(nothing recorded): {', '.join(c[:12] for c in unrecorded)}"
        )
    return out
