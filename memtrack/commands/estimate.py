from __future__ import annotations

import contextlib
from contextlib import nullcontext
from pathlib import Path

import click

from memtrack.commands import options
from memtrack.store.database import Store
from memtrack.store.opening import open_store
from memtrack.store.url import Database, present
from memtrack.workload.registry import no_match, select_cases


@click.command()
@options.config_option
@options.db_option
@options.patterns_option("Estimate")
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
@options.json_path_option("the estimate run as a JSON record")
@options.no_db_option
def estimate(
    config_path: Path | None,
    db_path: Path | None,
    patterns: tuple[str, ...],
    device: str | None,
    dtype: str | None,
    json_path: Path | None,
    no_db: bool,
) -> None:
    """Predict each case's tensor-memory peak under fake tensors: no GPU, no real memory.

    Each case runs setup, warm-up and one step in a fresh process under FakeTensorMode.
    Where the database holds a measured run of the same case on the same kind of device,
    the kernel scratch it saw beyond the tensors is added, and the note names the run
    (with --no-db the database is read, if there is one, never written).
    The estimate is recorded beside measured runs, labelled as such: it is never a baseline.
    Exit 0 when the estimates ran (a case that cannot be faked is recorded with the reason).
    """
    from rich.text import Text

    from memtrack.measure.estimate import calibrate, check_device, check_dtype, estimate_cases
    from memtrack.measure.suite import start_run
    from memtrack.report.run import estimate_view
    from memtrack.store.save import record_run

    config, db = options.resolve(config_path, db_path, writes=not no_db)
    check_device(device)
    check_dtype(dtype)
    if json_path:
        options.check_json_folder(json_path)
    # The cases are forked by a fork server that imported torch and the suite once (as
    # `memtrack run`'s are); the suite is discovered there, not in this process.
    with start_run(config) as start:
        workloads = start.workloads()
        cases = select_cases(workloads, patterns)
        if not cases:
            raise no_match(workloads, patterns)
        progress = options.progress_echo("estimating", options.plain_output())
        here = options.repository_of(config)
        with open_store(db, repository=here) if not no_db else nullcontext() as store:
            with _reading(db, here) if no_db else nullcontext(store) as measured:
                done = record_run(
                    lambda: calibrate(
                        estimate_cases(
                            config,
                            cases,
                            device=device,
                            dtype=dtype,
                            progress=progress,
                            start=start,
                        ),
                        measured,
                    ),
                    store,
                    json_path,
                )
    for r in estimate_view(done.record):
        options.rich_console().print(r, soft_wrap=isinstance(r, Text))
    commit = (done.record.git.commit or "no commit")[:12]
    where = ", ".join(done.saved) or "nothing"
    click.echo(f"estimate run {done.record.run_id} of {commit} recorded in {where}")
    options.fail_on(done.failures)


def _reading(db: Database, here: str | None) -> contextlib.AbstractContextManager[Store | None]:
    """The database to calibrate from, read-only, where it exists (--no-db writes nothing)."""
    if not present(db):
        return nullcontext(None)
    return open_store(db, readonly=True, repository=here)
