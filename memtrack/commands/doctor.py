from __future__ import annotations

import click

from memtrack.commands.options import config_option, db_option, resolve
from memtrack.machine import doctor as doctor_lib
from memtrack.machine import environment

_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "    "}


@click.command()
@config_option
@db_option
def doctor(config_path, db_path) -> None:
    """Check this machine: torch build vs GPU, driver, CUDA, NVML, VRAM, host RAM, disk."""
    _, db = resolve(config_path, db_path)
    results = doctor_lib.checks(environment.probe(), db, doctor_lib.nvml_status())
    for c in results:
        click.echo(f"{_MARK[c.status]} {c.name:24} {c.detail}")
    if any(c.status == "fail" for c in results):
        raise SystemExit(1)
