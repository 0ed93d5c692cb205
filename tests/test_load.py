"""The machine's load around the timing pass (probes/load.py): read by real workers on this
Linux machine, raised by real CPU hogs, and None, never 0, where the kernel does not say.

No test asserts a quiet machine's figures or a time: CI machines are shared and loaded."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import processes
import pytest

from memtrack.config import load_config
from memtrack.measure.suite import run_suite
from memtrack.probes import load
from memtrack.records import Measurement
from memtrack.workload.registry import discover, select_cases

WORKLOAD = textwrap.dedent(
    """
    import time
    import memtrack


    @memtrack.workload()
    def busy(ctx):
        def step():
            # busy for a fixed wall time, whatever the machine's speed: the pass spans
            # many clock ticks of /proc/stat
            end = time.perf_counter() + 0.03
            while time.perf_counter() < end:
                pass
        return step
    """
)


def _measure(root: Path) -> Measurement:
    (root / "wl.py").write_text(WORKLOAD)
    (root / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 5\n')
    config = load_config(root / "memtrack.toml")
    (m,) = run_suite(config, select_cases(discover(config))).measurements
    assert m.status == "ok", m.message
    return m


def _has_steal() -> bool:
    first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return len(first) >= 9  # 'cpu' and user .. steal


def test_the_timing_pass_records_the_machines_load(tmp_path):
    m = _measure(tmp_path)
    assert m.timing_cores == len(os.sched_getaffinity(0))
    assert m.timing_runnable is not None and m.timing_runnable >= 0
    assert (m.timing_cpu_pressure is None) == (load.cpu_pressure_us() is None)
    if m.timing_cpu_pressure is not None:
        assert 0 <= m.timing_cpu_pressure <= 1
    assert (m.timing_steal is None) == (not _has_steal())
    if m.timing_steal is not None:
        assert 0 <= m.timing_steal <= 1


def test_cpu_hogs_read_as_runnable_others_and_cpu_pressure(tmp_path):
    hogs = processes.hogs(2 * len(os.sched_getaffinity(0)))
    try:
        m = _measure(tmp_path)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    # Twice as many hogs as cores: whenever a sample is read at least one of them runs or
    # waits, and some task always waits for a CPU.
    assert m.timing_runnable is not None and m.timing_runnable >= 1, m.timing_runnable
    if load.cpu_pressure_us() is not None:
        assert m.timing_cpu_pressure is not None and m.timing_cpu_pressure > 0.25


def test_this_process_counts_its_own_running_thread():
    assert load.own_running() >= 1  # the thread reading is running
    others = load.runnable_others()
    assert others is None or others >= 0


def test_what_the_kernel_does_not_say_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "PRESSURE", str(tmp_path / "no-psi"))
    assert load.cpu_pressure_us() is None
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\nfull total=0\n")
    monkeypatch.setattr(load, "PRESSURE", str(psi))
    assert load.cpu_pressure_us() == 123456

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 0 0 0\ncpu0 100 0 50 800 0 0 0\n")  # no steal column
    monkeypatch.setattr(load, "STAT", str(stat))
    assert load.cpu_ticks() == (950, None)
    monkeypatch.setattr(load, "LOADAVG", str(tmp_path / "no-loadavg"))
    assert load.runnable_others() is None

    timing = load.TimingLoad()
    timing.start()
    figures = timing.figures()
    assert figures["timing_steal"] is None and figures["timing_runnable"] is None
    assert figures["timing_cpu_pressure"] == pytest.approx(0.0)
