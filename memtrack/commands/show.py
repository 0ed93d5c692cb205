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
from memtrack.records import to_dict
from memtrack.report.run import run_detail
from memtrack.store.opening import open_store


@click.command()
@click.argument("run_id", metavar="RUN")
@config_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the whole record as JSON.")
def show(run_id: str, config_path: Path | None, db_path: Path | None, as_json: bool) -> None:
    """Show one run: where it ran, and every case's figures (an estimate run's labelled as
    estimates, each beside the latest measured figure of its case on its device kind; a
    measured case beside its latest estimate).

    RUN is a run id or a unique prefix of one (`memtrack history` lists them), or a commit
    (a SHA prefix): its newest run."""
    config, db = resolve(config_path, db_path)
    with open_store(db, readonly=True, repository=repository_of(config)) as store:
        record = store.find_run(run_id)
        measured = [m.case_id for m in record.measurements if m.kind == "measured"]
        estimates = store.latest_estimates(measured, record.git.commit) if measured else {}
        gpu = next((g.name for g in record.environment.gpus if g.name), None)
        figures = {
            m.case_id: found
            for m in record.measurements
            if m.kind == "estimate"
            and (found := store.latest_measured(m.case_id, m.device, gpu)) is not None
        }
    if as_json:
        click.echo(json.dumps(to_dict(record), indent=2, sort_keys=True))
    else:
        rich_console().print(*run_detail(record, estimates, figures))
