from __future__ import annotations

import json
from pathlib import Path

import click

from memtrack.commands.options import config_option, db_option, resolve, rich_console
from memtrack.commands.run import save_run
from memtrack.errors import StoreError


@click.command()
@click.argument("case")
@config_option
@db_option
@click.option(
    "--sweep",
    "sweep_text",
    required=True,
    help="The param and its values to measure, e.g. concurrency=1,2,4,8 "
    "(a numeric param of the case: concurrency, batch, max_len, ...).",
)
@click.option(
    "--catalog",
    "catalog_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="GPU catalog (TOML; default: data/gpus.toml next to the config, else the "
    "one shipped with memtrack).",
)
@click.option(
    "--gpu",
    "gpu_names",
    multiple=True,
    help="Only GPUs whose catalog name contains this (repeatable).",
)
@click.option("--markdown", "as_markdown", is_flag=True, help="Print Markdown instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
@click.option("--no-record", is_flag=True, help="Do not record the sweep's runs in the database.")
@click.option(
    "--estimate",
    "estimated",
    is_flag=True,
    help="Estimate each point under fake tensors (`memtrack estimate`) instead of "
    "measuring it: no GPU needed; tensor memory only.",
)
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    help="With --estimate: the device to estimate for (default: the config's).",
)
def plan(
    case,
    config_path,
    db_path,
    sweep_text,
    catalog_path,
    gpu_names,
    as_markdown,
    as_json,
    no_record,
    estimated,
    device,
) -> None:
    """Will it fit? Measure CASE at each value of a param, fit how its peak grows, and say
    the largest value each GPU of the catalog holds (and the levers where nothing fits).
    With --estimate the points are estimated under fake tensors instead of measured."""
    from memtrack.measure.suite import run_suite
    from memtrack.plan import fit as planning
    from memtrack.plan import sweep
    from memtrack.records.redact import redact_run
    from memtrack.report import plan as report_plan
    from memtrack.store.database import Store
    from memtrack.workload.registry import discover

    if as_markdown and as_json:
        raise click.UsageError("--markdown and --json: choose one")
    if device and not estimated:
        raise click.UsageError(
            "--device goes with --estimate (a measured sweep runs on the config's device)"
        )
    config, db = resolve(config_path, db_path)
    workloads = discover(config)
    param_name = sweep_text.partition("=")[0].strip()
    wl, params = sweep.find_case(workloads, case, param_name)
    param, values = planning.parse_sweep(sweep_text, wl.params, wl.name)
    catalog_file = catalog_path or sweep.default_catalog(config)
    catalog, _ = planning.load_catalog(catalog_file)
    gpus = planning.select_gpus(catalog, gpu_names, catalog_file)
    cases = sweep.sweep_cases(wl, params, param, values)
    store = None
    if no_record:
        store = Store.open(db, readonly=True, create=False) if db.is_file() else None
    else:
        store = Store.open(db)
        store.check_writable()  # before the first case, not after the sweep
    try:
        if estimated:
            from memtrack.measure.estimate import estimate_cases

            record = estimate_cases(config, cases, device=device, dtype=None, progress=_progress)
        else:
            record = run_suite(config, cases, progress=_progress)
        record = redact_run(record)
        failures: list[str] = []
        if not no_record and store is not None:
            _, failures = save_run(record, store, None)
        result = sweep.make_plan(
            record,
            config,
            store,
            case=case,
            param=param,
            params=params,
            integer=all(isinstance(v, int) for v in values),
            catalog=catalog,
            gpus=gpus,
        )
    finally:
        if store is not None:
            store.close()
    if as_json:
        click.echo(json.dumps(report_plan.to_json(result), indent=2))
    elif as_markdown:
        click.echo(report_plan.markdown(result), nl=False)
    else:
        from rich.text import Text

        console = rich_console()
        for r in report_plan.terminal(result):
            console.print(r, soft_wrap=isinstance(r, Text))
    where = "not recorded (--no-record)" if no_record else f"recorded in {db}"
    click.echo(f"run {record.run_id} ({len(cases)} cases) {where}", err=True)
    if failures:
        raise StoreError("; ".join(failures))


def _progress(event, case, m) -> None:
    if event == "done":
        click.echo(f"  {m.status:8} {case.case_id} ({m.duration_s:.1f} s)", err=True)
