from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import config_option, db_option, resolve


@click.command()
@click.argument("case")
@config_option
@db_option
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the snapshot here (a new file outside data/, the database's folder "
    "and the repository; default: ~/.cache/memtrack/snapshots/).",
)
def snapshot(case: str, config_path: Path | None, db_path: Path | None, out: Path | None) -> None:
    """Capture which allocations make one case's step peak, into a private file.

    CASE is a case id (as `memtrack check` names it) or a workload with one case. The case
    runs in a fresh process: setup, warm-up, then one step under the recorder. On CUDA the
    file is the allocator's history for https://pytorch.org/memory_viz; on the CPU, the
    peak per module and category (JSON). It shows the model's structure: it is written with
    mode 0600, never into the database, and never uploaded.
    """
    from memtrack.measure.snapshots import take

    config, db = resolve(config_path, db_path)
    snap = take(config, case, db, out)
    click.echo(
        f"snapshot of {snap.case_id} ({snap.device}, {snap.size_bytes:,} bytes, "
        f"mode 0600): {snap.path}"
    )
    click.echo(f"open it: {snap.how_to_open()}")
    click.echo("it shows the model's structure: keep it private (do not commit, upload or post it)")
