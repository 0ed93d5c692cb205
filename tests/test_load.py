"""The machine's load around the timing pass (probes/load.py): read by real workers on this
Linux machine, raised by real CPU hogs, and None, never 0, where the kernel does not say.

No test asserts a quiet machine's figures or a time: CI machines are shared and loaded."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import processes
import pytest

from memtrack.config import load_config
from memtrack.judge.load import Load
from memtrack.measure.suite import run_suite
from memtrack.probes import load, perf
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
    with processes.busy_loops(2 * len(os.sched_getaffinity(0))):
        m = _measure(tmp_path)
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


def test_hogs_make_the_whole_pass_read_as_contended(tmp_path):
    """Measured over the whole pass (its start and end), not at instants: the case's own
    wait, the others' CPU time on its CPUs and their wait (PSI) say the pass wanted more
    than the cores. With autogroups the case's session gets its share and barely waits;
    the busy loops queue instead, which the others' wait counts."""
    with processes.busy_loops(2 * len(os.sched_getaffinity(0)) + 2):
        m = _measure(tmp_path)
    assert m.timing_wait_cores is not None and m.timing_others_cores is not None
    busy = Load.of(m).oversubscribed()
    assert busy and busy.startswith("the pass wanted"), (busy, Load.of(m).describe())


def test_the_whole_pass_figures_are_none_where_the_kernel_keeps_none(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "TASKS", str(tmp_path / "no-tasks"))
    monkeypatch.setattr(load, "STAT", str(tmp_path / "no-stat"))
    timing = load.TimingLoad()
    timing.start()
    figures = timing.figures()
    assert figures["timing_wait_cores"] is None and figures["timing_others_cores"] is None
    # without them the instants decide, against the cores plus the slack
    old = Load(runnable=4.0, cores=2, own=1.0)
    assert old.demand is None and "4.0 runnable tasks of other processes" in str(
        old.oversubscribed()
    )


def test_a_case_whose_own_threads_outnumber_the_cores_is_not_contention():
    # four sessions on two cores, a quiet machine: the case waits for itself alone
    alone = Load(pressure=0.7, cores=2, own=2.0, wait=2.0, others=0.02, wall=1.0)
    assert alone.oversubscribed() is None
    # the same beside others that took a core and queued: contention
    shared = Load(pressure=0.9, cores=2, own=1.0, wait=0.3, others=1.0, wall=1.0)
    assert "the pass wanted 2.9 cores of 2" in str(shared.oversubscribed())
    # one busy loop beside a case of one thread on two cores: each has a core
    beside = Load(pressure=0.0, cores=2, own=1.0, wait=0.0, others=1.0, wall=1.0)
    assert beside.oversubscribed() is None


def test_instructions_are_counted_per_thread_or_said_why_not():
    """The counters' plumbing on the kernel's task clock (a software event every Linux has),
    then the hardware instruction counter: counted, or one line saying why not."""
    counters = perf.Counters.open(perf.PERF_TYPE_SOFTWARE, perf.PERF_COUNT_SW_TASK_CLOCK)
    if counters.why is not None:
        pytest.skip(f"no perf_event_open here: {counters.why}")
    before = counters.read()
    end = time.thread_time() + 0.05  # 50 ms of this thread's own CPU time, however busy
    while time.thread_time() < end:
        pass
    after = counters.read()
    counters.close()
    assert before is not None and after is not None and after - before >= 20_000_000  # ns
    hardware = perf.Counters.open()
    if hardware.why is None:
        first = hardware.read()
        sum(range(100_000))
        assert (hardware.read() or 0) > (first or 0)
    else:
        assert "\n" not in hardware.why and "perf_event" in hardware.why
    hardware.close()


def test_a_timing_pass_records_instruction_counts_or_why_none(tmp_path):
    m = _measure(tmp_path)
    if m.iteration_instructions:
        assert len(m.iteration_instructions) == m.repeats and m.instructions_note is None
    else:
        assert m.instructions_note and "\n" not in m.instructions_note
