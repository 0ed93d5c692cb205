from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import config_option, patterns_option
from memtrack.config import load_config
from memtrack.errors import ConfigError


@click.command()
@click.argument("cases", nargs=-1)
@config_option
@patterns_option()
def reference(cases: tuple[str, ...], config_path: Path | None, patterns: tuple[str, ...]) -> None:
    """Record the reference output of the selected cases (default: every case that declares
    a tolerance).

    Each case's reference is its full-precision sibling (dtype float32, each format param at
    its reference value): it runs in a worker as `memtrack run` runs it, and the output of
    the call after the memory pass is saved under the references folder and pinned by its
    sha256 in manifest.json. Commit both. Exit status 2 when a case fails or returns no
    tensor; then nothing is written.
    """
    from memtrack.measure.references import manifest_path, record_references
    from memtrack.measure.suite import resolve_device, start_run
    from memtrack.workload.registry import select_cases

    config = load_config(config_path)

    def progress(case_id: str) -> None:
        click.echo(f"running {case_id} ...", err=True)

    # As `memtrack run` does: a fork server imports torch and the suite once, and forks
    # each case's worker.
    with start_run(config) as start:
        selected = select_cases(start.workloads(), (*cases, *patterns))
        if not selected:
            raise ConfigError(f"no case matches {' or '.join((*cases, *patterns))}")
        device = resolve_device(config, start.environment())
        recorded = record_references(
            config, selected, device, start.git.commit, progress, server=start.server
        )
    for r in recorded:
        served = ", ".join(c for c in r.for_cases if c != r.case_id)
        click.echo(
            f"{r.case_id} -> {r.path} (sha256 {r.sha256[:12]})"
            + (f", the reference of {served}" if served else "")
        )
    click.echo(f"pinned in {manifest_path(config)}")
