from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from memtrack.commands.options import (
    config_option,
    db_option,
    fail_on,
    progress_echo,
    repository_of,
    resolve,
    rich_console,
)

if TYPE_CHECKING:
    from memtrack.records import RunRecord


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
    case: str,
    config_path: Path | None,
    db_path: Path | None,
    sweep_text: str,
    catalog_path: Path | None,
    gpu_names: tuple[str, ...],
    as_markdown: bool,
    as_json: bool,
    no_record: bool,
    estimated: bool,
    device: str | None,
) -> None:
    """Will it fit? Measure CASE at each value of a param, fit how its peak grows, and say
    the largest value each GPU of the catalog holds (and the levers where nothing fits).
    With --estimate the points are estimated under fake tensors instead of measured."""
    from memtrack.measure.suite import run_suite
    from memtrack.plan import fit as planning
    from memtrack.plan import sweep
    from memtrack.store.opening import open_store
    from memtrack.store.save import record_run
    from memtrack.store.url import present
    from memtrack.workload.registry import discover

    if as_markdown and as_json:
        raise click.UsageError("--markdown and --json: choose one")
    if device and not estimated:
        raise click.UsageError(
            "--device goes with --estimate (a measured sweep runs on the config's device)"
        )
    config, db = resolve(config_path, db_path, writes=not no_record)
    param_name = sweep_text.partition("=")[0].strip()
    wl, params = sweep.find_case(discover(config), case, param_name)
    param, values = planning.parse_sweep(sweep_text, wl.params, wl.name)
    catalog_file = catalog_path or sweep.default_catalog(config)
    catalog, _ = planning.load_catalog(catalog_file)
    gpus = planning.select_gpus(catalog, gpu_names, catalog_file)
    cases = sweep.sweep_cases(wl, params, param, values)
    progress = progress_echo("measuring", plain=False)

    def measure() -> RunRecord:
        if estimated:
            from memtrack.measure.estimate import estimate_cases

            return estimate_cases(config, cases, device=device, dtype=None, progress=progress)
        return run_suite(config, cases, progress=progress)

    # Without recording, the database (if any) is only read, for the baselines' headroom.
    if not no_record:
        opened: Any = open_store(db, repository=repository_of(config))
    elif present(db):
        opened = open_store(db, readonly=True, create=False, repository=repository_of(config))
    else:
        opened = nullcontext()
    with opened as store:
        done = record_run(measure, None if no_record else store, None)
        result = sweep.make_plan(
            done.record,
            config,
            store,
            case=case,
            param=param,
            params=params,
            integer=all(isinstance(v, int) for v in values),
            catalog=catalog,
            gpus=gpus,
        )
    _show(result, as_markdown, as_json)
    where = "not recorded (--no-record)" if no_record else f"recorded in {db}"
    click.echo(f"run {done.record.run_id} ({len(cases)} cases) {where}", err=True)
    fail_on(done.failures)


def _show(result: Any, as_markdown: bool, as_json: bool) -> None:
    from memtrack.report import plan as report_plan

    if as_json:
        click.echo(json.dumps(report_plan.to_json(result), indent=2))
    elif as_markdown:
        click.echo(report_plan.markdown(result), nl=False)
    else:
        from rich.text import Text

        console = rich_console()
        for r in report_plan.terminal(result):
            console.print(r, soft_wrap=isinstance(r, Text))
