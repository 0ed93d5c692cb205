from __future__ import annotations

import json
from pathlib import Path

import click

from memtrack.commands.options import config_option, db_option, resolve, rich_console
from memtrack.errors import ConfigError
from memtrack.records import Site


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
        from memtrack.store.database import Store

        _, db = resolve(config_path, db_path)
        with Store.open(db, readonly=True) as store:
            run_a, run_b = store.find_run(a), store.find_run(b)
        by_a = {m.case_id: m for m in run_a.measurements if m.kind == "measured"}
        by_b = {m.case_id: m for m in run_b.measurements if m.kind == "measured"}
        for case in cases:
            if case not in by_a or case not in by_b:
                raise ConfigError(f"case {case!r} is not measured in both runs")
        shared = [c for c in by_b if c in by_a and (not cases or c in cases)]
        if not shared:
            raise ConfigError(f"runs {run_a.run_id[:12]} and {run_b.run_id[:12]} share no case")
        pairs = [(c, by_a[c].sites, by_b[c].sites) for c in shared]
    changes = [(case, site_diff(x, y, grouping)) for case, x, y in pairs]
    if as_json:
        click.echo(json.dumps(diff_json(changes), indent=2))
    else:
        rich_console().print(*(diff_table(case, found) for case, found in changes))
