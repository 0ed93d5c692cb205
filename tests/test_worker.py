"""The worker process: real subprocesses on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from factories import committed

WORKLOAD = textwrap.dedent(
    """
    import torch
    import memtrack

    @memtrack.workload
    def small(ctx):
        w = torch.nn.Linear(64, 64)
        ctx.mark(w)
        x = ctx.randn(8, 64)
        return lambda: w(x)
    """
)

# A whole case through the runner, printed as JSON: run as a container's entrypoint would be.
RUN_ONE_CASE = textwrap.dedent(
    """
    import dataclasses, json, os, sys
    from pathlib import Path
    from memtrack.config import load_config
    from memtrack.measure.case import run_case
    from memtrack.workload.registry import discover, select_cases

    config = load_config(Path(sys.argv[1]))
    (case,) = select_cases(discover(config))
    m = run_case(config, case, "cpu")
    print(json.dumps({"pid": os.getpid(), "status": m.status, "message": m.message}))
    """
)


@pytest.fixture
def suite(tmp_path):
    (tmp_path / "wl.py").write_text(WORKLOAD)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n')
    return tmp_path / "memtrack.toml"


def _pid_namespace_works() -> bool:
    probe = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "true"]
    try:
        return subprocess.run(probe, capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _pid_namespace_works(), reason="needs unshare and user namespaces")
def test_cases_run_when_the_runner_is_pid_1(suite):
    # a container's entrypoint: the runner is PID 1 of its PID namespace
    out = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            RUN_ONE_CASE,
            str(suite),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["pid"] == 1
    assert (result["status"], result["message"]) == ("ok", None)


def test_a_worker_whose_runner_is_gone_exits_at_once(tmp_path, suite):
    spec = {
        "module": "wl.py",
        "root": str(suite.parent),
        "workload": "small",
        "params": {},
        "seed": 0,
        "device": "cpu",
        "warmup": 1,
        "repeats": 2,
        "data_dir": str(tmp_path / "data"),
        "result_path": str(tmp_path / "result.json"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    # its parent is this test, not the runner it names (which died before prctl took hold)
    not_the_parent = os.getpid() + 1_000_000
    worker = [sys.executable, "-m", "memtrack.worker", str(tmp_path / "spec.json")]
    gone = subprocess.run([*worker, str(not_the_parent)], capture_output=True)
    assert gone.returncode == 1 and not (tmp_path / "result.json").exists()
    alive = subprocess.run([*worker, str(os.getpid())], capture_output=True)
    assert alive.returncode == 0
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "ok"


# A torch without MemTracker (before 2.5): the module is made unimportable in the process.
NO_MEM_TRACKER = "import sys; sys.modules['torch.distributed._tools.mem_tracker'] = None\n"


def test_without_mem_tracker_only_what_needs_it_fails_and_says_why(tmp_path, suite, monkeypatch):
    check = NO_MEM_TRACKER + textwrap.dedent(
        """
        import torch
        from memtrack.probes.framework import CudaAllocatorProbe, MemTrackerProbe
        try:
            MemTrackerProbe(torch.device("cpu"))
        except RuntimeError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # the CUDA probe still imports
    assert "torch.distributed._tools.mem_tracker" in out.stdout
    assert "torch >= 2.5" in out.stdout

    # a CPU case through the runner: an error with that message, not an ImportError
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_MEM_TRACKER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "site"), *sys.path]))
    out = subprocess.run(
        [sys.executable, "-c", RUN_ONE_CASE, str(suite)], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout)
    assert result["status"] == "error"
    assert result["message"].startswith("RuntimeError: torch ")
    assert "has no torch.distributed._tools.mem_tracker (torch >= 2.5 has it)" in result["message"]


TORCH_HOST_OOM = textwrap.dedent(
    """
    import resource
    import torch
    import memtrack

    @memtrack.workload
    def torch_host_oom(ctx):
        def step():
            # an address-space limit just above what the process maps now: torch's CPU
            # allocator then fails with "DefaultCPUAllocator: can't allocate memory"
            with open("/proc/self/status") as f:
                vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 2**20, resource.RLIM_INFINITY))
            return torch.empty(2**31, dtype=torch.uint8)
        return step
    """
)


def _measured(folder: Path, workloads: str, settings: str) -> list[dict]:
    """The measurements of a real `memtrack run` of `workloads` in a committed `folder`, as
    its JSON record holds them."""
    (folder / "wl.py").write_text(workloads)
    (folder / "memtrack.toml").write_text(f'modules = ["wl.py"]\n{settings}')
    committed(folder)
    res = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "run", "--no-db", "--json", "run.json"],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    return json.loads((folder / "run.json").read_text())["measurements"]


def test_torchs_cpu_allocator_failing_is_an_oom_not_an_error(tmp_path):
    """Under RLIMIT_AS (or on a full host) torch raises RuntimeError "DefaultCPUAllocator:
    can't allocate memory", not MemoryError: the case ran out of memory all the same."""
    (m,) = _measured(tmp_path, TORCH_HOST_OOM, "warmup = 0\nrepeats = 1\n")
    assert m["status"] == "oom", m["message"]
    assert "DefaultCPUAllocator: can't allocate memory" in m["message"]


PRECISIONS = textwrap.dedent(
    """
    import torch
    import memtrack

    def _linear(ctx, dtype, mark=True):
        torch.set_num_threads(1)
        w = torch.nn.Linear(64, 64, dtype=dtype)
        if mark:
            ctx.mark(w)
        x = torch.randn(8, 64, dtype=dtype)
        return lambda: w(x)

    @memtrack.workload
    def half(ctx):  # a bf16 model, in a case without a dtype param
        return _linear(ctx, torch.bfloat16)

    @memtrack.workload
    def full(ctx):
        return _linear(ctx, torch.float32)

    @memtrack.workload
    def unmarked(ctx):
        return _linear(ctx, torch.bfloat16, mark=False)

    @memtrack.workload(params={"dtype": ["float16"]})
    def named(ctx):  # its param says float16, its model is bf16
        return _linear(ctx, torch.bfloat16)
    """
)


def test_the_dtype_a_case_really_used_is_recorded_where_its_params_do_not_say_it(tmp_path):
    """A real run of a bf16 model in a case without a `dtype` param: its record says which
    dtype its tensors had (the param's float32 default would say otherwise); a float32 one
    says nothing more; one that marks nothing says the dtype is not known; one whose param
    names another dtype says both."""
    measured = _measured(tmp_path, PRECISIONS, "warmup = 1\nrepeats = 2\n")
    notes = {m["workload"]: [n for n in m["notes"] if n.startswith("dtype: ")] for m in measured}
    assert notes == {
        "half": ["dtype: the case has no dtype param; its tensors are bfloat16"],
        "full": [],
        "unmarked": [
            "dtype: the case has no dtype param; its tensors are not known (ctx.mark() "
            "named no module or tensor)"
        ],
        "named": ["dtype: the case's dtype param is float16; its tensors are bfloat16"],
    }
    # the record's dtype: the param where the case names one, else what the tensors held
    dtypes = {m["workload"]: m["dtype"] for m in measured}
    assert dtypes == {"half": "bfloat16", "full": "float32", "unmarked": None, "named": "float16"}
