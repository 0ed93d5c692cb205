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
    repository_of,
    resolve,
)
from memtrack.config import is_revision
from memtrack.errors import ConfigError, StoreError
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

    Every recorded run of a commit in the range on this machine's environment is reused;
    a commit the bisection needs and that has none is measured in a worktree of its own
    (the working tree and branch untouched) and recorded as a run of that commit. A commit
    that cannot decide (a noisy figure, a failed run) is skipped and said. Exit 0 with the
    answer, 2 on bad input."""
    from memtrack.judge.bisect import bisect as run_bisect
    from memtrack.measure.suite import probe_environment
    from memtrack.measure.worktree import measure_at
    from memtrack.store.opening import open_store

    config, db = resolve(config_path, db_path)
    for name, ref in (("GOOD", good), ("BAD", bad)):
        if not is_revision(ref):
            raise ConfigError(f"{name}: {ref!r} is not a revision")
    if json_path is not None and (problem := output_problem(json_path)):
        raise ConfigError(f"--json {json_path}: {problem}")
    if not present(db):
        raise StoreError(f"{db}: no such database (record a run with `memtrack run`)")
    fingerprint = probe_environment().fingerprint

    def measure(commit: str) -> str | None:
        return measure_at(config, db, commit, case)

    with open_store(db, repository=repository_of(config)) as store:
        found = run_bisect(
            store, config, config.root, case, metric, good, bad, fingerprint, measure
        )
    for line in report(found):
        click.echo(line)
    if json_path is not None:
        data = dataclasses.asdict(found)
        json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    sys.exit(0)


def report(b: Bisection) -> list[str]:
    """The bisection's lines: each commit judged, then the answer, its step and where."""
    out = [
        f"bisect {b.case_id} {b.metric}: {b.commits} commits after GOOD {b.good[:12]} up to "
        f"BAD {b.bad[:12]}, judged against GOOD's runs as `check` judges a change"
    ]
    for j in b.judged:
        source = "measured" if j.measured else "recorded"
        out.append(f"  {j.commit[:12]}  {j.state:<4}  ({source}) {j.why}")
    out.append(b.message)
    if b.step is not None:
        out.append(f"  step: {b.step.message}")
    if b.where is not None:
        out.append(f"  where: {b.where.text()}")
    if b.measured:
        out.append(
            f"measured {len(b.measured)} commit{'s' * (len(b.measured) != 1)} (recorded as "
            f"runs of those commits): {', '.join(c[:12] for c in b.measured)}"
        )
    return out
