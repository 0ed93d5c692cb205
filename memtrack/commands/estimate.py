from __future__ import annotations

import os
from pathlib import Path

import click

from memtrack.commands.options import (
    check_json_folder,
    config_option,
    db_option,
    resolve,
    rich_console,
    save_run,
)
from memtrack.errors import ConfigError, StoreError
from memtrack.records.redact import redact_run
from memtrack.store.database import Store
from memtrack.workload.registry import discover, select_cases


@click.command()
@config_option
@db_option
@click.option(
    "-k",
    "--workload",
    "patterns",
    multiple=True,
    help="Estimate only cases whose id contains this text (repeatable).",
)
@click.option(
    "--device",
    help="Target device: cpu or cuda (default: the config's device; "
    "auto is cuda where a GPU is seen, else cpu).",
)
@click.option(
    "--dtype",
    help="Estimate at this precision instead of each case's dtype param "
    "(float32, bf16, fp16, ...): the case id says so.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the estimate run as a JSON record here.",
)
@click.option("--no-db", is_flag=True, help="Do not write the database (use with --json).")
def estimate(config_path, db_path, patterns, device, dtype, json_path, no_db) -> None:
    """Predict each case's tensor-memory peak under fake tensors: no GPU, no real memory.

    Each case runs setup, warm-up and one step in a fresh process under FakeTensorMode.
    The estimate is recorded beside measured runs, labelled as such: it is never a baseline.
    Exit 0 when the estimates ran (a case that cannot be faked is recorded with the reason).
    """
    from memtrack.measure.estimate import check_device, check_dtype, estimate_cases
    from memtrack.report.run import estimate_view

    config, db = resolve(config_path, db_path)
    check_device(device)
    check_dtype(dtype)
    cases = select_cases(discover(config), patterns)
    if not cases:
        raise ConfigError(f"no case matches {' or '.join(patterns) or 'the suite'}")
    if json_path:
        check_json_folder(json_path)
    store = None if no_db else Store.open(db)
    try:
        if store:
            store.check_writable()
        plain = os.environ.get("CI") == "true" or not rich_console(stderr=True).is_terminal

        def progress(event, case, m):
            if event == "start" and plain:
                click.echo(f"estimating {case.case_id} ...", err=True)
            elif event == "done":
                click.echo(f"  {m.status:8} {case.case_id} ({m.duration_s:.1f} s)", err=True)

        record = redact_run(
            estimate_cases(config, cases, device=device, dtype=dtype, progress=progress)
        )
        saved, failures = save_run(record, store, json_path)
    finally:
        if store:
            store.close()
    from rich.text import Text

    for r in estimate_view(record):
        rich_console().print(r, soft_wrap=isinstance(r, Text))
    commit = (record.git.commit or "no commit")[:12]
    click.echo(
        f"estimate run {record.run_id} of {commit} recorded in {', '.join(saved) or 'nothing'}"
    )
    if failures:
        raise StoreError("; ".join(failures))
