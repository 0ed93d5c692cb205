"""A pytest plugin of the suite (loaded by conftest.py): a test that fails on pytest-timeout's
limit says what the machine's load was, so that a hang is told apart from a machine too busy
to finish in time. A test waits on a condition, never on the machine being fast; the timeout
only guards against a hang."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


def machine_load() -> str:
    """'load average 3.10 2.50 1.20 on 2 cores, CPU pressure: some avg10=12.00 ...'."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    one, five, fifteen = os.getloadavg()
    text = f"load average {one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min) on {cores} cores"
    try:
        with open("/proc/pressure/cpu") as f:
            text += f"; CPU pressure: {f.readline().strip()}"
    except OSError:
        pass
    return text


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[Any]:
    report = yield
    if report.failed and "Timeout" in str(report.longrepr):
        report.sections.append(
            (
                "machine load at the timeout",
                f"{machine_load()}: a test waits on a condition, not on the machine's speed; "
                "a load above the cores can delay it past the limit",
            )
        )
    return report
