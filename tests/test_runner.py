"""Real subprocess workloads on the CPU: every failure kind is recorded, the run goes on."""

from __future__ import annotations

import json
import os
import signal
import textwrap

import pytest
from factories import committed

from memtrack.config import load_config
from memtrack.measure.suite import run_suite
from memtrack.records import metrics
from memtrack.workload.registry import discover, select_cases

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

    @memtrack.workload
    def realtime_signal(ctx):
        def step():
            os.kill(os.getpid(), 40)
        return step

    @memtrack.workload
    def leaves_children(ctx):
        import multiprocessing, pathlib, subprocess, sys
        here = pathlib.Path(__file__).parent
        with open("/proc/self/status") as f:
            hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) * 1024
        size = hwm + 256 * 2**20  # more than the worker itself ever holds
        hold = (
            "import pathlib, sys, time; x = b'\\1' * int(sys.argv[1]); "
            "pathlib.Path(sys.argv[2]).write_text('ready'); time.sleep(600)"
        )
        ready = here / "child.ready"
        child = subprocess.Popen([sys.executable, "-c", hold, str(size), str(ready)])
        loader = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
        loader.start()
        while not ready.exists():
            time.sleep(0.05)
        (here / "children.json").write_text(
            f'{{"pids": [{child.pid}, {loader.pid}], "bytes": {size}}}'
        )
        return lambda: None

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
    return run_suite(config, cases), root


def _by_workload(run_and_root):
    return {m.workload: m for m in run_and_root[0].measurements}


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
    # every failure kind above is that of a worker forked by the run's fork server
    assert not [n for m in failing_run[0].measurements for n in m.notes if "fresh interp" in n]
    assert [m.workload for m in failing_run[0].measurements] == [
        "raises",
        "host_oom",
        "segfaults",
        "hangs",
        "realtime_signal",
        "leaves_children",
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

    data = json.loads(json.dumps(to_dict(failing_run[0])))
    assert run_from_dict(data) == failing_run[0]


def test_a_real_time_signal_is_a_crash_named_by_its_number(failing_run):
    m = _by_workload(failing_run)["realtime_signal"]
    assert m.status == "crashed"
    assert m.message.startswith(f"killed by SIGRTMIN+{40 - signal.SIGRTMIN} in phase")


def test_processes_a_case_starts_end_with_it_and_their_memory_counts(failing_run):
    m = _by_workload(failing_run)["leaves_children"]
    assert m.status == "ok", m.message
    children = json.loads((failing_run[1] / "children.json").read_text())
    for pid in children["pids"]:
        state = _state(pid)
        assert state in (None, "Z"), f"process {pid} of the case outlived it ({state})"
    # A child held more than the worker ever did: only the tree's figure can include it.
    assert m.host_tree_peak_rss_bytes >= children["bytes"] > m.host_peak_rss_bytes
    assert m.host_tree_source == "sampled"
    fine = _by_workload(failing_run)["fine"]
    assert metrics.value(fine, "host_tree") >= metrics.value(fine, "host")


def _state(pid):
    """A process's state letter; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return None


def test_a_process_that_ignores_sigterm_or_leaves_the_group_is_still_ended():
    import subprocess
    import sys

    from memtrack.probes.tree import ProcessTree

    script = textwrap.dedent(
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        escaped = subprocess.Popen(sleeper, start_new_session=True)  # a group of its own
        print(escaped.pid, flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    escaped = int(proc.stdout.readline())
    tree = ProcessTree(proc.pid)
    try:
        assert tree.wait(0.3) is False  # still running: a timeout
    finally:
        tree.end()
    assert proc.wait() == -signal.SIGKILL  # SIGTERM was ignored
    assert _state(escaped) in (None, "Z")
    assert tree.peak > 0


def test_without_a_usable_cgroup_the_tree_is_sampled_and_no_cgroup_is_left():
    from memtrack.probes import tree

    parent = tree._own_cgroup2_dir()
    cgroup = tree._Cgroup.create()
    if cgroup is not None:
        cgroup.remove()
        pytest.skip("a cgroup v2 with memory.peak can be made here")
    if parent is not None and parent.is_dir():
        assert not [p for p in parent.iterdir() if p.name.startswith("memtrack-")]
    assert tree.ProcessTree(os.getpid()).source == "sampled"


def test_the_tree_peak_is_stored_and_read_back(failing_run, tmp_path):
    from memtrack.store.database import Store

    with Store.open(tmp_path / "m.db") as store:
        store.write_run(failing_run[0])
        back = {m.workload: m for m in store.get_run(failing_run[0].run_id).measurements}
    for name, m in _by_workload(failing_run).items():
        assert (back[name].host_tree_peak_rss_bytes, back[name].host_tree_source) == (
            m.host_tree_peak_rss_bytes,
            m.host_tree_source,
        )
    assert back["leaves_children"].host_tree_peak_rss_bytes > 0


def test_auto_measures_on_the_cpu_when_torch_cannot_start_the_gpus_nvml_sees(tmp_path):
    """NVML lists a GPU (stand-in environment: this machine has none) while torch cannot
    use CUDA (a CPU-only build, a broken driver): `auto` must not pick a device whose every
    case would fail; it measures on the CPU and says why on each case."""
    from dataclasses import replace

    from factories import GPU_ENV

    env = replace(
        GPU_ENV, cuda_available=False, cuda_unavailable_reason="CUDA driver initialization failed"
    )
    (tmp_path / "wl.py").write_text(WORKLOADS)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 0\nrepeats = 1\n')
    config = load_config(tmp_path / "memtrack.toml")
    cases = select_cases(discover(config), patterns=("fine",))
    run = run_suite(config, cases, env=env)
    [m] = run.measurements
    assert (m.status, m.device) == ("ok", "cpu")
    assert m.notes[0] == (
        "device auto: NVML sees 1 GPU(s) but torch cannot use CUDA (CUDA "
        "driver initialization failed); measured on the CPU"
    )


ESCAPES = textwrap.dedent(
    """
    import os, pathlib, subprocess, sys
    import memtrack

    HERE = pathlib.Path(__file__).parent
    SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]

    def started(name, pid):
        (HERE / f"{name}.pid").write_text(str(pid))

    @memtrack.workload
    def new_session(ctx):
        started("new_session", subprocess.Popen(SLEEP, start_new_session=True).pid)
        return lambda: None

    @memtrack.workload
    def daemon(ctx):
        # the classic double fork: a grandchild in a session of its own, its parent gone
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(w, str(os.getpid()).encode())
                os.execv(sys.executable, SLEEP)
            os._exit(0)
        os.close(w)
        started("daemon", int(os.read(r, 32)))
        return lambda: None

    @memtrack.workload(params={"session": [False, True]})
    def exits_at_once(ctx):
        child = subprocess.Popen(SLEEP, start_new_session=ctx["session"])
        started(f"exits_at_once-{ctx['session']}", child.pid)
        os._exit(9)
    """
)


def test_no_process_a_case_started_outlives_memtrack_run(tmp_path):
    """A child in a session of its own, a double-fork daemon, a child started just before the
    worker's os._exit(9): each has left the case's tree (and its parent may be gone) before
    the case ends; the runner, their subreaper, still ends every one."""
    import subprocess
    import sys

    (tmp_path / "wl.py").write_text(ESCAPES)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 1\n')
    committed(tmp_path)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "memtrack.cli",
            "run",
            "--config",
            str(tmp_path / "memtrack.toml"),
            "--no-db",
            "--json",
            str(tmp_path / "run.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    statuses = {
        m["case_id"]: m["status"]
        for m in json.loads((tmp_path / "run.json").read_text())["measurements"]
    }
    assert statuses["new_session"] == statuses["daemon"] == "ok"
    assert statuses["exits_at_once[session=True]"] == "crashed"
    pids = {p.stem: int(p.read_text()) for p in tmp_path.glob("*.pid")}
    assert len(pids) == 4
    for name, pid in pids.items():
        assert _state(pid) in (None, "Z"), f"{name}: process {pid} outlived the run"
