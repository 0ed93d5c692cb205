"""Real subprocess workloads on the CPU: every failure kind is recorded, the run goes on."""

from __future__ import annotations

import json
import textwrap

import pytest

from memtrack.config import load_config
from memtrack.runner import run_suite
from memtrack.workload import discover, select_cases

WORKLOADS = textwrap.dedent(
    """
    import os, resource, signal, time
    import torch
    import memtrack

    @memtrack.workload
    def raises(ctx):
        def step():
            raise ValueError("bad input shape (3, 4)")
        return step

    @memtrack.workload
    def host_oom(ctx):
        def step():
            # an address-space limit just above what the process maps now
            with open("/proc/self/status") as f:
                vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 2**20, resource.RLIM_INFINITY))
            return bytearray(2**30)
        return step

    @memtrack.workload
    def segfaults(ctx):
        def step():
            os.kill(os.getpid(), signal.SIGSEGV)
        return step

    @memtrack.workload
    def hangs(ctx):
        def step():
            time.sleep(60)
        return step

    @memtrack.workload(params={"n": 256})
    def fine(ctx):
        w = torch.nn.Linear(ctx["n"], ctx["n"])
        ctx.mark(w)
        x = ctx.randn(64, ctx["n"])
        return lambda: w(x)
    """
)


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    (root / "wl.py").write_text(WORKLOADS)
    (root / "memtrack.toml").write_text(
        'modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n[workloads.hangs]\ntimeout = "4s"\n'
    )
    config = load_config(root / "memtrack.toml")
    cases = select_cases(discover(config))
    return run_suite(config, cases)


def _by_workload(run):
    return {m.workload: m for m in run.measurements}


def test_an_exception_is_recorded_with_its_message(failing_run):
    m = _by_workload(failing_run)["raises"]
    assert m.status == "error"
    assert m.message == "ValueError: bad input shape (3, 4)"
    assert "Traceback" in m.traceback


def test_a_host_memory_error_is_an_oom(failing_run):
    m = _by_workload(failing_run)["host_oom"]
    assert m.status == "oom"
    assert m.message.startswith("MemoryError")


def test_a_signal_is_a_crash_and_partial_figures_are_kept(failing_run):
    m = _by_workload(failing_run)["segfaults"]
    assert m.status == "crashed"
    assert "SIGSEGV" in m.message and "warmup" in m.message
    assert m.persistent_bytes == 0  # reached before the crash, kept


def test_a_timeout_is_recorded_and_the_process_killed(failing_run):
    m = _by_workload(failing_run)["hangs"]
    assert m.status == "timeout"
    assert "timed out after 4 s" in m.message
    assert m.duration_s < 30


def test_the_run_goes_on_after_failures(failing_run):
    assert [m.workload for m in failing_run.measurements] == [
        "raises",
        "host_oom",
        "segfaults",
        "hangs",
        "fine",
    ]
    m = _by_workload(failing_run)["fine"]
    assert m.status == "ok"
    weights = 256 * 256 * 4 + 256 * 4
    assert m.weights_bytes == weights
    # the peak holds the weights, the 64x256 input is not tracked, the output is
    assert m.peak_allocated_bytes >= weights + 64 * 256 * 4
    assert m.host_peak_rss_bytes > m.peak_allocated_bytes
    assert m.host_peak_source == "vmhwm"
    assert len(m.iteration_times_s) == 2 and m.time_median_s > 0
    assert m.device_view is None and m.device_view_note == "CPU case: no device view"


def test_failed_cases_serialise(failing_run):
    from memtrack.records import run_from_dict, to_dict

    data = json.loads(json.dumps(to_dict(failing_run)))
    assert run_from_dict(data) == failing_run
