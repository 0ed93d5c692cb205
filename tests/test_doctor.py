"""`memtrack doctor`: the checks on recorded environments, and the command on this machine
with NVML's stand-in (fakenvml/) where it needs GPUs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from factories import CPU_ENV, GPU_ENV

from memtrack.machine.doctor import checks, runs_on

TOO_OLD = (
    "The NVIDIA driver on your system is too old (found version 12040). Please update your "
    "GPU driver by downloading and installing a new version from the URL: "
    "http://www.nvidia.com/Download/index.aspx"
)


def _by_name(env, tmp_path):
    return {c.name: c for c in checks(env, tmp_path / "m.db", None)}


@pytest.mark.parametrize(
    "reason",
    [TOO_OLD, "No CUDA GPUs are available"],  # a CUDA 13 wheel on a 550 driver; CVD=""
)
def test_doctor_fails_with_torchs_reason_when_it_cannot_start_cuda_on_a_gpu(tmp_path, reason):
    env = dataclasses.replace(
        GPU_ENV, cuda_available=False, cuda_device_count=0, cuda_unavailable_reason=reason
    )
    cuda = _by_name(env, tmp_path)["cuda"]
    assert (cuda.status, cuda.detail) == ("fail", f"torch cannot start CUDA: {reason}")


def test_doctor_passes_cuda_that_starts_and_a_machine_without_a_gpu(tmp_path):
    ok = dataclasses.replace(GPU_ENV, cuda_available=True, cuda_device_count=1)
    assert _by_name(ok, tmp_path)["cuda"].status == "ok"
    no_gpu = dataclasses.replace(
        CPU_ENV, cuda_runtime="13.0", cuda_available=False, cuda_unavailable_reason=TOO_OLD
    )
    assert _by_name(no_gpu, tmp_path)["cuda"].status == "info"  # cases run on the CPU
    assert "torch build" not in _by_name(ok, tmp_path)
    assert "torch build" not in _by_name(CPU_ENV, tmp_path)


def test_doctor_warns_of_a_cuda_build_of_torch_on_a_machine_without_a_gpu(tmp_path):
    # The quick start's `pip install -e .` brings the CUDA build: the host figures of every
    # case then hold the CUDA libraries (measured: peak RSS 682-762 MiB against 314-393 MiB
    # with the CPU build, on the shipped suite)
    env = dataclasses.replace(
        CPU_ENV,
        torch="2.14.1+cu130",
        cuda_runtime="13.0",
        cuda_available=False,
        cuda_unavailable_reason="Found no NVIDIA driver on your system.",
    )
    build = _by_name(env, tmp_path)["torch build"]
    assert build.status == "warn"
    assert build.detail.startswith("a CUDA build (CUDA 13.0) on a machine without a GPU: ")
    assert "about doubles each case's host peak RSS" in build.detail
    assert build.detail.endswith(
        "pip install 'torch==2.14.1' --index-url https://download.pytorch.org/whl/cpu"
    )


@pytest.mark.parametrize(
    ("capability", "arch_list", "runs"),
    [
        ("8.9", ("sm_80", "sm_86", "sm_90"), True),  # sm_86 code runs on an sm_89 GPU
        ("9.0", ("sm_80", "sm_86"), False),  # never across majors
        ("9.0", ("sm_80", "compute_80"), True),  # PTX is compiled for newer GPUs at load
        ("8.6", ("sm_89",), False),  # not down within a major
        ("9.0", ("sm_90a",), True),
        ("10.0", ("sm_90a", "sm_90"), False),  # an 'a' build runs on its exact GPU only
        ("10.3", ("sm_100f",), True),  # a family build runs across its family
        ("12.0", ("sm_100", "sm_120"), True),
    ],
)
def test_arch_check_follows_cuda_binary_compatibility(capability, arch_list, runs):
    assert runs_on(capability, arch_list) is runs


def test_doctor_fails_a_gpu_only_when_no_code_runs_on_it(tmp_path):
    ada = dataclasses.replace(GPU_ENV.gpus[0], name="NVIDIA L40S", compute_capability="8.9")
    env = dataclasses.replace(
        GPU_ENV, gpus=(ada,), torch_cuda_arch_list=("sm_80", "sm_86", "sm_90")
    )
    assert _by_name(env, tmp_path)["gpu 0"].status == "ok"
    env = dataclasses.replace(env, torch_cuda_arch_list=("sm_90",))
    gpu0 = _by_name(env, tmp_path)["gpu 0"]
    assert gpu0.status == "fail" and "torch has no code for it (sm_90)" in gpu0.detail


def test_doctor_with_fake_nvml_reports_a_failing_query_instead_of_crashing(
    tmp_path, nvml_with_a_failing_query
):
    out = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "doctor", "--db", str(tmp_path / "m.db")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "Traceback" not in out.stderr
    lines = out.stdout.splitlines()
    assert any(
        line.startswith("WARN query") and "GPU 1 memory info unavailable" in line for line in lines
    )
    # the GPUs are there, and this machine's torch cannot use them: that fails, as it should
    assert out.returncode == 1
    import torch

    if torch.version.cuda is None:
        assert any(line.startswith("FAIL gpu 1") and "CPU build" in line for line in lines)
    else:  # a CUDA build on this machine without a driver: torch says why
        assert any(
            line.startswith("FAIL cuda") and "torch cannot start CUDA: " in line for line in lines
        )


def _case(**params):
    from memtrack.workload.registry import Case

    return Case("w", params, 0, "wl.py")


def test_doctor_warns_of_bf16_cases_on_a_gpu_without_native_bf16(tmp_path):
    t4 = dataclasses.replace(GPU_ENV.gpus[0], name="Tesla T4", compute_capability="7.5")
    env = dataclasses.replace(GPU_ENV, gpus=(t4,))
    cases = [_case(dtype="bfloat16", batch=1), _case(dtype="float32", batch=1)]
    check = {c.name: c for c in checks(env, tmp_path / "m.db", None, cases)}["gpu 0 bf16"]
    assert check.status == "warn"
    assert check.detail.startswith("Tesla T4 (cc 7.5) has no native bfloat16 (cc 8.0 and newer")
    assert "1 bf16 case(s)" in check.detail and "w[batch=1,dtype=bfloat16]" in check.detail
    # an H200 has it; a T4 without bf16 cases needs nothing
    assert "gpu 0 bf16" not in {c.name for c in checks(GPU_ENV, tmp_path / "m.db", None, cases)}
    assert "gpu 0 bf16" not in {c.name for c in checks(env, tmp_path / "m.db", None, cases[1:])}


def test_doctor_warns_of_a_small_dev_shm_for_cases_of_two_or_more_ranks(tmp_path):
    ranks = [_case(ranks=2)]
    small = {
        c.name: c
        for c in checks(GPU_ENV, tmp_path / "m.db", None, ranks, 64 * 2**20, container=True)
    }
    assert small["shm"].status == "warn"
    assert small["shm"].detail.startswith("/dev/shm is 64.00 MiB (this container's): NCCL")
    for cases, shm in ((ranks, 8 * 2**30), ([_case()], 64 * 2**20)):
        assert "shm" not in {c.name for c in checks(GPU_ENV, tmp_path / "m.db", None, cases, shm)}


def test_doctor_shows_the_allocator_backend(tmp_path):
    async_env = dataclasses.replace(GPU_ENV, allocator_backend="cudaMallocAsync")
    allocator = _by_name(async_env, tmp_path)["allocator"]
    assert allocator.status == "warn" and allocator.detail.startswith("cudaMallocAsync: peak ")
    native = _by_name(dataclasses.replace(GPU_ENV, allocator_backend="native"), tmp_path)
    assert native["allocator"].status == "info"
    assert "allocator" not in _by_name(CPU_ENV, tmp_path)  # torch cannot start CUDA: unknown


def test_doctor_with_fake_nvml_reads_the_suite_for_bf16_cases_on_a_t4(tmp_path, monkeypatch):
    import json
    import os
    from pathlib import Path

    scenario = {
        "devices": [
            {
                "uuid": "GPU-t4",
                "name": "Tesla T4",
                "total": 15 * 2**30,
                "used": 2**28,
                "capability": [7, 5],
            }
        ]
    }
    (tmp_path / "nvml.json").write_text(json.dumps(scenario))
    monkeypatch.setenv("FAKE_NVML", str(tmp_path / "nvml.json"))
    fake = str(Path(__file__).parent / "fakenvml")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([fake, *sys.path]))
    (tmp_path / "wl.py").write_text(
        "import memtrack\n\n@memtrack.workload(params={'dtype': 'bfloat16'})\n"
        "def half(ctx):\n    return lambda: None\n"
    )
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    out = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "doctor", "--db", str(tmp_path / "m.db")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "Traceback" not in out.stderr, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("WARN gpu 0 bf16")]
    assert "Tesla T4 (cc 7.5)" in line and "half[dtype=bfloat16]" in line


@pytest.mark.parametrize(
    ("cuda_available", "says"),
    [
        (True, "cases run on CUDA without the device view"),
        (False, "no device view; cases run on the CPU"),
        (None, "no device view"),  # an environment recorded before it was
    ],
)
def test_doctor_says_where_cases_run_when_only_nvml_is_unreachable(tmp_path, cuda_available, says):
    # A container without the driver's `utility` capability, or nvidia-ml-py missing: NVML
    # fails, yet torch starts CUDA and the cases run on the GPU, only without the device view.
    env = dataclasses.replace(GPU_ENV, cuda_available=cuda_available, cuda_device_count=1)
    error = "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    nvml = {c.name: c for c in checks(env, tmp_path / "m.db", error)}["nvml"]
    assert nvml.status == "warn"
    assert nvml.detail.startswith(f"not reachable ({error}): {says}")
    if cuda_available:
        assert "CPU" not in nvml.detail


def test_doctor_says_the_machine_is_contended_beside_busy_processes(tmp_path):
    """More busy processes than cores beside it: `memtrack doctor` reads the load as a timing
    pass does and warns that time measured now is not judged unpaired."""
    from processes import busy_loops

    from memtrack.probes.load import affinity

    with busy_loops(len(affinity()) + 1, settle_s=0.5):
        done = subprocess.run(
            [sys.executable, "-m", "memtrack.cli", "doctor", "--db", str(tmp_path / "m.db")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x[5:].startswith("load ")]
    assert line.startswith("WARN load") and "contended over" in line, line
    assert "other processes" in line or "runnable tasks of other processes" in line, line
