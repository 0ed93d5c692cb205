"""The environment: collected in a real child process; NVML is the stand-in in fakenvml/ where
a test needs GPUs (this machine has none), and torch is this machine's build (CPU or CUDA)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import processes
import pytest
import torch
from factories import GPU_ENV, GiB, MiB, make_measurement, make_run

from memtrack.machine import environment
from memtrack.records import DeviceMeasurement, run_from_dict, to_dict
from memtrack.store.database import Store


def _torch_says() -> str | None:
    """torch's own first line on why it cannot start CUDA here, None where it can (asked in
    a child process: a failed CUDA start is not undone in this one)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import torch\n"
                "try:\n    torch.cuda.init(); print('ok')\n"
                "except Exception as e:\n    print(str(e).strip().splitlines()[0])\n"
            ),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    line = out.stdout.strip()
    return None if line == "ok" else line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA cannot start")
def test_the_environment_records_whether_torch_can_start_cuda_and_why_not():
    env = environment.probe()
    assert env.cuda_available is False and env.cuda_device_count == 0
    assert env.visible_uuids == ()
    if torch.version.cuda is None:
        # a CPU build: the reason is torch's situation, said plainly
        assert env.cuda_unavailable_reason == "torch is a CPU build"
    else:  # a CUDA build without a GPU or driver: torch's own words
        assert env.cuda_unavailable_reason == _torch_says()
        assert env.cuda_unavailable_reason


def test_one_failing_nvml_query_leaves_none_and_a_note_with_fake_nvml(nvml_with_a_failing_query):
    env = environment.probe()  # torch cannot start CUDA here: the GPUs NVML sees are listed
    a, b = env.gpus
    assert (a.uuid, a.total_bytes, a.compute_capability) == ("GPU-a", 141 * GiB, "9.0")
    assert (b.uuid, b.total_bytes, b.mig_mode) == ("GPU-b", None, "enabled")
    assert env.driver == "580.65"
    assert env.notes == (
        "GPU 1 memory info unavailable (NVMLError_NoPermission: Insufficient Permissions)",
    )


def test_which_physical_card_is_visible_does_not_split_the_fingerprint():
    data = to_dict(GPU_ENV)
    on_card_3 = {**data, "env_vars": {"CUDA_VISIBLE_DEVICES": "3"}}
    on_card_5 = {**data, "env_vars": {"CUDA_VISIBLE_DEVICES": "5"}}
    assert environment.fingerprint_of(on_card_3) == environment.fingerprint_of(on_card_5)
    # the visible devices' models and count do change the figures, and the fingerprint
    two = {**on_card_3, "gpus": data["gpus"] * 2}
    assert environment.fingerprint_of(two) != environment.fingerprint_of(on_card_3)
    # a GPU whose name NVML would not give still has a fingerprint
    unnamed = {**data, "gpus": [{**data["gpus"][0], "name": None, "total_bytes": None}]}
    assert environment.fingerprint_of(unnamed)


def test_cuda_facts_and_the_memory_pass_peak_read_back_from_sqlite(tmp_path):
    env = dataclasses.replace(
        GPU_ENV,
        cuda_available=True,
        cuda_device_count=1,
        visible_uuids=("GPU-0000",),
        notes=("GPU 0 process list unavailable (NVMLError_NoPermission: ...)",),
    )
    m = make_measurement(device="cuda", reserved=4 * MiB, device_peak=8 * MiB)
    m = dataclasses.replace(
        m, devices=(dataclasses.replace(m.devices[0], memory_pass_peak_bytes=6 * MiB),)
    )
    run = make_run([m], env=env)
    with Store.open(tmp_path / "m.db") as store:
        store.write_run(run)
        assert store.get_run(run.run_id) == run


def test_rows_and_records_made_before_the_cuda_facts_still_read(tmp_path):
    run = make_run([make_measurement()], env=GPU_ENV)
    with Store.open(tmp_path / "m.db") as store:
        store.write_run(run)
    conn = sqlite3.connect(tmp_path / "m.db")  # as a row recorded before the columns existed
    conn.execute("update environments set visible_uuids = null, notes = null")
    conn.commit()
    conn.close()
    with Store.open(tmp_path / "m.db", readonly=True) as store:
        env = store.get_run(run.run_id).environment
    assert env.cuda_available is None and env.visible_uuids == () and env.notes == ()

    old = to_dict(run)
    for key in (
        "cuda_available",
        "cuda_device_count",
        "visible_uuids",
        "cuda_unavailable_reason",
        "notes",
    ):
        del old["environment"][key]
    assert run_from_dict(old).environment == GPU_ENV
    assert DeviceMeasurement(0, "GPU-0", "H200", GiB).memory_pass_peak_bytes is None


def test_a_gpu_nvml_would_not_name_takes_no_gpu_budget_and_breaks_nothing():
    from memtrack.config import Budget
    from memtrack.judge.budgets import budgets_for

    unnamed = dataclasses.replace(GPU_ENV.gpus[0], name=None)
    env = dataclasses.replace(GPU_ENV, gpus=(unnamed, GPU_ENV.gpus[0]))
    m = make_measurement(device="cuda", reserved=4 * MiB, device_peak=8 * MiB)
    h200 = Budget("decoder", 10 * MiB, "fits the H200 fleet", "device", "NVIDIA H200")
    assert budgets_for([h200], m, env) == {"device": h200}
    assert budgets_for([h200], m, dataclasses.replace(env, gpus=(unnamed,))) == {}


def test_the_cublas_workspace_variables_are_recorded(monkeypatch):
    # They decide whether cuBLAS and cuBLASLt share a workspace and whether it is cached per
    # stream: the workspace is allocated through the caching allocator, so the figures move.
    monkeypatch.setenv("TORCH_CUBLAS_WORKSPACE_CACHE", "1")
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "0")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    env = environment.probe()
    assert env.env_vars["TORCH_CUBLAS_WORKSPACE_CACHE"] == "1"
    assert env.env_vars["TORCH_CUBLASLT_UNIFIED_WORKSPACE"] == "0"
    assert "UNRELATED_SECRET" not in env.env_vars


def test_a_mig_instance_is_named_by_nvmls_uuid_from_fake_torch_properties(tmp_path, monkeypatch):
    # torch's properties of a MIG instance carry its UUID's hex, which memtrack spelt GPU-...:
    # NVML's MIG-... is the name nvidia-smi and CUDA_VISIBLE_DEVICES know
    import importlib.util
    import json
    from pathlib import Path
    from types import SimpleNamespace

    hex_x = "11111111-2222-3333-4444-555555555555"
    scenario = {
        "devices": [
            {
                "uuid": "GPU-parent",
                "name": "NVIDIA H200",
                "total": 141 * GiB,
                "used": GiB,
                "mig": "enabled",
            },
            {
                "uuid": f"MIG-{hex_x}",
                "name": "NVIDIA H200 MIG 1g.18gb",
                "total": 18 * GiB,
                "used": GiB,
                "mig": "instance",
            },
        ]
    }
    (tmp_path / "nvml.json").write_text(json.dumps(scenario))
    monkeypatch.setenv("FAKE_NVML", str(tmp_path / "nvml.json"))
    fake = Path(__file__).parent / "fakenvml" / "pynvml.py"
    spec = importlib.util.spec_from_file_location("fake_pynvml", fake)
    nvml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nvml)
    props = SimpleNamespace(
        name="NVIDIA H200 MIG 1g.18gb", uuid=hex_x, total_memory=18 * GiB, major=9, minor=0
    )
    notes: list[str] = []
    (g,) = environment.gpus_from_torch(nvml, [props], notes)
    assert (g["uuid"], g["mig_mode"]) == (f"MIG-{hex_x}", "instance") and notes == []


def test_the_allocator_backend_reads_back_from_sqlite_and_old_rows_read_none(tmp_path):
    env = dataclasses.replace(GPU_ENV, cuda_available=True, allocator_backend="cudaMallocAsync")
    m = dataclasses.replace(
        make_measurement(device="cuda", reserved=4 * MiB),
        allocator_backend="cudaMallocAsync",
        num_alloc_retries=None,
        num_ooms=None,
        peak_requested_bytes=None,
    )
    run = make_run([m], env=env)
    with Store.open(tmp_path / "m.db") as store:
        store.write_run(run)
        assert store.get_run(run.run_id) == run
    conn = sqlite3.connect(tmp_path / "m.db")  # as rows recorded before the column existed
    conn.execute("update environments set allocator_backend = null")
    conn.execute("update measurements set allocator_backend = null")
    conn.commit()
    conn.close()
    with Store.open(tmp_path / "m.db", readonly=True) as store:
        old = store.get_run(run.run_id)
    assert old.environment.allocator_backend is None
    assert old.measurements[0].allocator_backend is None


def test_the_environment_records_the_allocator_backend_torch_starts_with_fake_cuda(monkeypatch):
    # No GPU here: torch's CUDA answers are fakes; collect() itself runs as in its child.
    from types import SimpleNamespace

    import torch

    props = SimpleNamespace(
        name="NVIDIA H200",
        uuid="00000000-0000-0000-0000-000000000000",
        total_memory=140 * GiB,
        major=9,
        minor=0,
    )
    monkeypatch.setattr(
        environment,
        "torch_cuda",
        lambda _torch: {"available": True, "reason": None, "devices": [props]},
    )
    monkeypatch.setattr(environment, "_nvml", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "cudaMallocAsync")
    env = environment.from_dict(environment.collect())
    assert env.allocator_backend == "cudaMallocAsync"
    assert env.visible_uuids == ("GPU-00000000-0000-0000-0000-000000000000",)
    assert environment.probe().allocator_backend is None  # this machine: torch has no CUDA


def test_the_environment_probe_hung_in_fake_nvml_dies_with_its_parent_killed_by_sigkill(
    tmp_path, monkeypatch
):
    """A runner killed by SIGKILL stops nothing: the probe it started in a fresh interpreter,
    stuck in NVML's initialisation, ends with it all the same (its parent-death signal)."""
    (tmp_path / "nvml.json").write_text(json.dumps({"devices": [], "init": "hang"}))
    monkeypatch.setenv("FAKE_NVML", str(tmp_path / "nvml.json"))
    fake = Path(__file__).parent / "fakenvml"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), *sys.path]))
    runner = "from memtrack.machine.environment import probe\nprobe()"
    assert processes.ends_with_its_killed_parent(runner, b"memtrack.machine.environment")


def _dist(site: Path, folder: str, name: str, version: str) -> None:
    (site / folder).mkdir(parents=True)
    (site / folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )


def test_every_distribution_is_recorded_as_import_finds_it_by_its_normalised_name(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    _dist(first, "torch-2.9.1.dist-info", "torch", "2.9.1")
    _dist(first, "nvidia_cublas_cu12-12.8.4.1.dist-info", "nvidia-cublas-cu12", "12.8.4.1")
    _dist(first, "Flash_Attn-2.8.3.dist-info", "flash_attn", "2.8.3")
    _dist(first, "peft-0.21.2.dist-info", "peft", "0.21.2")  # any package, not a list's
    _dist(first, "numpy-broken.dist-info", "numpy", "")  # no version: not a package
    _dist(second, "torch-2.5.0.dist-info", "torch", "2.5.0")  # shadowed by the first
    _dist(second, "My.Team_Pkg.egg-info", "My.Team_Pkg", "0.3")  # read from its metadata
    (second / "vllm-0.9.dist-info").write_text("a file, not a distribution's folder")
    path = [str(first), str(tmp_path / "gone"), str(second)]

    assert environment.installed_packages(path) == {
        "torch": "2.9.1",
        "nvidia-cublas-cu12": "12.8.4.1",
        "flash-attn": "2.8.3",
        "peft": "0.21.2",
        "my-team-pkg": "0.3",
    }
    # this interpreter's: what importlib.metadata names, each first on sys.path
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if name not in found:
            found[name] = dist.version
    assert environment.installed_packages() == found
    assert environment.collect()["packages"] == found
