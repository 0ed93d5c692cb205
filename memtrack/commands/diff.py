from __future__ import annotations

import json
from pathlib import Path

import click

from memtrack.commands.options import (
    config_option,
    db_option,
    repository_of,
    resolve,
    rich_console,
)
from memtrack.errors import ConfigError
from memtrack.records import Measurement, Site
from memtrack.store.database import Store
from memtrack.store.opening import open_store


def _pair(
    store: Store, a: str, b: str, cases: tuple[str, ...]
) -> tuple[dict[str, Measurement], dict[str, Measurement], list[str]]:
    """The runs A and B name that hold the cases, and the cases compared. A ref (a branch, a
    commit) names its runs newest first: each side is its newest run that measured the
    cases (or, without CASE, the newest pair that shares one), so that a ref whose newest
    run is another kind of run (the tests', beside the workloads') still compares. A CASE
    is a case id or a workload's name (all its cases)."""
    runs_b, runs_a = store.find_runs(b), store.find_runs(a)
    read: dict[str, dict[str, Measurement]] = {}

    def measured(run_id: str) -> dict[str, Measurement]:
        if run_id not in read:
            run = store.get_run(run_id)
            read[run_id] = {m.case_id: m for m in run.measurements if m.kind == "measured"}
        return read[run_id]

    for rb in runs_b:
        for ra in runs_a:
            by_a, by_b = measured(ra), measured(rb)
            shared = [c for c in by_b if c in by_a and _named(by_b[c], cases)]
            if shared and all(any(_named(by_b[c], (n,)) for c in shared) for n in cases):
                return by_a, by_b, shared
    if cases:
        raise ConfigError(
            f"case {cases[0]!r} is not measured in both {a!r} and {b!r} (neither as a case "
            "id nor as a workload's name, in any of their newest runs)"
        )
    others = f" (nor do the other runs of {a!r} and {b!r})" if len(runs_a + runs_b) > 2 else ""
    raise ConfigError(f"runs {runs_a[0][:12]} and {runs_b[0][:12]} share no case{others}")


def _named(m: Measurement, cases: tuple[str, ...]) -> bool:
    """Whether CASE names `m` (no CASE names every case): its id, or its workload's name."""
    return not cases or m.case_id in cases or m.workload in cases


@click.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.argument("cases", nargs=-1, metavar="[CASE]...")
@config_option
@db_option
@click.option(
    "--by",
    "grouping",
    type=click.Choice(["pair", "module", "source"]),
    default="pair",
    show_default=True,
    help="Group the sites by module and file:function together, by module, or by source.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the diff as JSON.")
def diff(
    a: str,
    b: str,
    cases: tuple[str, ...],
    config_path: Path | None,
    db_path: Path | None,
    grouping: str,
    as_json: bool,
) -> None:
    """Where the peak's memory differs between two runs, or two snapshot files: the sites at
    each case's peak, matched by module path and file:function (not by line), largest
    change first.

    A and B are runs (a run id or its prefix, a commit, or a branch: its newest run), or two
    files written by `memtrack snapshot`. CASE narrows the cases compared (a run's cases
    present in both by default)."""
    from memtrack.judge.where import diff as site_diff
    from memtrack.report.diff import diff_json, diff_table

    pairs: list[tuple[str, tuple[Site, ...], tuple[Site, ...]]] = []
    if Path(a).is_file() and Path(b).is_file():
        from memtrack.measure.snapshot_sites import read_sites

        (case_a, sites_a), (case_b, sites_b) = read_sites(Path(a)), read_sites(Path(b))
        if not all(any(s.grouping == grouping for s in x) for x in (sites_a, sites_b)):
            grouping = "source"  # a CUDA snapshot knows no module paths
        pairs.append((case_b if case_a == case_b else f"{case_a} -> {case_b}", sites_a, sites_b))
    else:
        config, db = resolve(config_path, db_path)
        with open_store(db, readonly=True, repository=repository_of(config)) as store:
            by_a, by_b, shared = _pair(store, a, b, cases)
        pairs = [(c, by_a[c].sites, by_b[c].sites) for c in shared]
    changes = [(case, site_diff(x, y, grouping)) for case, x, y in pairs]
    if as_json:
        click.echo(json.dumps(diff_json(changes), indent=2))
    else:
        rich_console().print(*(diff_table(case, found) for case, found in changes))
