from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from memtrack.commands.options import config_option, db_option, resolve
from memtrack.machine import doctor as doctor_lib
from memtrack.machine import environment

_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "    "}


@click.command()
@config_option
@db_option
def doctor(config_path: Path | None, db_path: Path | None) -> None:
    """Check this machine: torch build vs GPU, driver, CUDA, NVML, VRAM, host RAM, disk, the
    allocator, and what the suite's cases need (native bf16, /dev/shm for NCCL)."""
    from memtrack.errors import MemtrackError
    from memtrack.probes.load import CaseLoad
    from memtrack.workload.registry import discover, select_cases

    load = CaseLoad()  # the machine's load over the doctor's own run, as a timing pass reads it
    config, db = resolve(config_path, db_path)
    probing = environment.Probing()  # it imports torch while the suite's discovery does too
    try:
        cases = select_cases(discover(config))
        suite = None
    except MemtrackError as exc:  # the machine's checks stand without the suite's
        cases, suite = [], doctor_lib.Check("suite", "warn", f"not read: {exc}")
    results = doctor_lib.checks(
        probing.result(),
        db,
        doctor_lib.nvml_status(),
        cases,
        doctor_lib.shm_bytes(),
        doctor_lib.in_container(),
    )
    if suite:
        results.append(suite)
    results.append(_load_check(load.figures([os.getpid()])))
    for c in results:
        click.echo(f"{_MARK[c.status]} {c.name:24} {c.detail}")
    if any(c.status == "fail" for c in results):
        raise SystemExit(1)


def _load_check(figures: dict[str, Any]) -> doctor_lib.Check:
    """Whether other processes contend for the CPUs, read as a timing pass reads it
    (probes.load.CaseLoad's figures over the doctor's own run, memtrack.judge.load's line):
    time is not judged beside them, unpaired."""
    from memtrack.judge.load import Load

    load = Load(
        figures["pressure"],
        None,
        figures["cores"],
        None,
        figures["own"],
        figures["wait"],
        figures["others"],
        figures["wall"],
    )
    busy = load.oversubscribed()
    if busy is not None:
        return doctor_lib.Check(
            "load",
            "warn",
            f"contended over {figures['wall']:.1f} s: {busy}; time measured now is not judged "
            "unpaired (memtrack run --against pairs it)",
        )
    return doctor_lib.Check(
        "load", "ok", f"over {figures['wall']:.1f} s: {load.describe() or 'quiet'}"
    )
