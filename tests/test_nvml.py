"""The NVML device view. This machine has no GPU: NVML is the stand-in in fakenvml/pynvml.py,
loaded in-process or, for the sampler process, first on its PYTHONPATH."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from memtrack.measure.launcher import CaseOutcome, launch
from memtrack.measure.outcome import to_measurement
from memtrack.measure.sampler import NvmlSampler, start_sampler
from memtrack.probes.nvml import Sampler
from memtrack.worker.protocol import Result, Spec
from memtrack.workload.registry import Case

GiB = 2**30
FAKE_DIR = Path(__file__).parent / "fakenvml"


def write_scenario(path: Path, scenario: dict) -> None:
    """Atomically: the sampler may be reading it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(scenario))
    os.replace(tmp, path)


def gpu(uuid: str, used: int = GiB, **extra) -> dict:
    return {"uuid": uuid, "name": "NVIDIA H200", "total": 141 * GiB, "used": used, **extra}


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """The stand-in module and a function that sets what its GPUs show."""
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML", str(path))
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def show(*devices: dict, **top) -> None:
        write_scenario(path, {"devices": list(devices), **top})

    return module, show


@pytest.fixture
def sampler_uses_fake_nvml(monkeypatch):
    """Sampler processes started from now on import the stand-in as `pynvml`."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_DIR), *sys.path]))


def test_sampler_with_fake_nvml_watches_only_the_visible_devices_numbered_as_torch_does(
    fake_nvml,
):
    nvml, show = fake_nvml
    # NVML lists GPU-a then GPU-b; CUDA_VISIBLE_DEVICES made torch see GPU-b only.
    show(gpu("GPU-a", used=10 * GiB), gpu("GPU-b", used=GiB, procs=[[77, 3 * GiB]]))
    s = Sampler(nvml, ["GPU-b"])
    s.sample({77})
    show(gpu("GPU-a", used=60 * GiB), gpu("GPU-b", used=GiB, procs=[[77, 3 * GiB]]))  # not ours
    s.sample({77})
    (dev,) = s.result()["devices"]
    assert (dev["index"], dev["uuid"]) == (0, "GPU-b")  # torch's device 0
    assert dev["peak_process_bytes"] == 3 * GiB and dev["process_view"] == "pid"
    assert dev["peak_device_used_bytes"] == GiB  # GPU-a's other job is nowhere


def test_sampler_with_fake_nvml_falls_back_to_device_deltas_all_or_nothing(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a", used=GiB, procs=[[77, 2 * GiB]]), gpu("GPU-b", used=GiB))
    s = Sampler(nvml, ["GPU-a", "GPU-b"])
    show(gpu("GPU-a", used=3 * GiB, procs=[[77, 2 * GiB]]), gpu("GPU-b", used=5 * GiB))
    s.sample({77})
    a, b = s.result()["devices"]
    # found by PID on GPU-a: GPU-b's growth is another process's, not this case's
    assert (a["peak_process_bytes"], a["process_view"]) == (2 * GiB, "pid")
    assert (b["peak_process_bytes"], b["process_view"]) == (0, "pid")

    # found nowhere (a container's PID namespace): device-wide deltas on every device
    show(gpu("GPU-a", used=GiB), gpu("GPU-b", used=GiB))
    s = Sampler(nvml, ["GPU-a", "GPU-b"])
    show(gpu("GPU-a", used=3 * GiB), gpu("GPU-b", used=GiB))
    s.sample({77})
    a, b = s.result()["devices"]
    assert (a["peak_process_bytes"], a["process_view"]) == (2 * GiB, "device-delta")
    assert (b["peak_process_bytes"], b["process_view"]) == (0, "device-delta")


def test_sampler_with_fake_nvml_keeps_other_devices_when_one_query_fails(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a", used=2 * GiB), gpu("GPU-b", used=GiB, fail=["memory", "procs"]))
    s = Sampler(nvml, ["GPU-a", "GPU-b"])
    s.sample({77})
    result = s.result()
    a, b = result["devices"]
    assert a["peak_device_used_bytes"] == 2 * GiB and a["total_bytes"] == 141 * GiB
    assert b["total_bytes"] is None and b["peak_device_used_bytes"] is None
    assert b["peak_process_bytes"] is None  # not measured: None, never 0
    assert any(
        n.startswith("GPU 1 memory info unavailable (NVMLError_NoPermission")
        for n in result["notes"]
    )


def test_sampler_with_fake_nvml_samples_a_mig_instance_not_its_parent(fake_nvml):
    nvml, show = fake_nvml
    hex_x = "11111111-2222-3333-4444-555555555555"
    show(
        gpu("GPU-parent", used=9 * GiB, mig="enabled"),
        gpu(f"MIG-{hex_x}", used=3 * GiB, mig="instance", total=18 * GiB),
        gpu("MIG-other", used=6 * GiB, mig="instance", total=18 * GiB),
    )
    # torch spells the instance's UUID with a GPU- prefix
    s = Sampler(nvml, [f"GPU-{hex_x}"])
    s.sample(set())
    (dev,) = s.result()["devices"]
    assert dev["uuid"] == f"GPU-{hex_x}"
    assert dev["peak_device_used_bytes"] == 3 * GiB  # the instance's, not all instances'
    assert dev["total_bytes"] == 18 * GiB

    # a parent in MIG mode cannot be attributed: the device view is refused, with the reason
    with pytest.raises(RuntimeError, match="MIG mode"):
        Sampler(nvml, ["GPU-parent"])


def test_sampler_with_fake_nvml_takes_the_memory_pass_peak_within_its_window(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a", used=GiB))
    s = Sampler(nvml, ["GPU-a"])
    for t, used in ((1.0, 9 * GiB), (2.0, 4 * GiB), (3.0, 5 * GiB), (4.0, 2 * GiB)):
        show(gpu("GPU-a", used=used))  # a setup spike at t=1, released before the pass
        s.sample(set(), clock=lambda t=t: t)
    (dev,) = s.result(window=(1.5, 3.5))["devices"]
    assert dev["peak_process_bytes"] == 8 * GiB  # the whole case: what must fit the GPU
    assert dev["memory_pass_peak_bytes"] == 4 * GiB  # the pass alone: 5 GiB - 1 GiB before

    result = s.result(window=(4.2, 4.3))  # a pass that fell between two samples
    assert result["devices"][0]["memory_pass_peak_bytes"] is None
    assert any("no sample fell inside the memory pass" in n for n in result["notes"])


def test_sampler_with_fake_nvml_counts_only_memory_a_process_can_use(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a", total=141 * GiB, reserved=GiB // 2))
    (dev,) = Sampler(nvml, ["GPU-a"]).result()["devices"]
    assert dev["total_bytes"] == 141 * GiB - GiB // 2  # the driver keeps the rest


def test_a_hung_sampler_with_fake_nvml_is_ended_and_the_view_absent(
    fake_nvml, sampler_uses_fake_nvml
):
    _, show = fake_nvml
    show(gpu("GPU-a"), init="hang")
    sampler = NvmlSampler(0.01, ("GPU-a",), timeout_s=1)
    assert sampler.start() is False
    assert sampler.stop() == {"ok": False, "reason": "the NVML sampler did not start within 1 s"}


def test_a_sampler_with_fake_nvml_refuses_a_mig_parent_and_says_why(
    fake_nvml, sampler_uses_fake_nvml
):
    _, show = fake_nvml
    show(gpu("GPU-parent", mig="enabled"))
    sampler = NvmlSampler(0.01, ("GPU-parent",))
    assert sampler.start() is False
    first = sampler.stop()
    assert first["ok"] is False
    assert "MIG mode" in first["reason"]


# A CPU case that drives the stand-in's GPU-b: a spike in setup, released, then 4 GiB in each
# step. It waits until the sampler has read each figure twice (the second read proves the
# first was stamped), so nothing depends on timing.
SPIKE_WORKLOAD = textwrap.dedent(
    """
    import json, os, time
    import memtrack

    GiB = 2**30

    def show(used):
        path = os.environ["FAKE_NVML"]
        seen = path + ".seen"
        before = open(seen).read().count("GPU-b ") if os.path.exists(seen) else 0
        scenario = json.load(open(path))
        scenario["devices"][1]["used"] = used
        with open(path + ".w", "w") as f:
            json.dump(scenario, f)
        os.replace(path + ".w", path)
        while open(seen).read().count("GPU-b ") < before + 2:
            time.sleep(0.001)

    @memtrack.workload
    def spiky(ctx):
        show(9 * GiB)   # e.g. loading weights through a temporary, then empty_cache()
        show(1 * GiB)
        return lambda: show(4 * GiB)
    """
)


def test_the_device_peak_of_the_memory_pass_excludes_a_setup_spike_with_fake_nvml(
    tmp_path, fake_nvml, sampler_uses_fake_nvml
):
    _, show = fake_nvml
    show(gpu("GPU-a", used=20 * GiB), gpu("GPU-b", used=GiB))
    (tmp_path / "wl.py").write_text(SPIKE_WORKLOAD)
    result_path = tmp_path / "result.json"
    spec = Spec(
        module="wl.py",
        root=str(tmp_path),
        workload="spiky",
        params={},
        seed=0,
        device="cpu",  # the worker runs on the CPU; the sampler beside it on the stand-in
        warmup=1,
        repeats=2,
        data_dir=str(tmp_path / "data"),
        result_path=str(result_path),
    )

    (outcome,), _ = launch([spec], 120, sampler=start_sampler("cuda", 0.005, ("GPU-b",)))

    assert outcome.result.status == "ok", outcome.stderr_tail
    (dev,) = outcome.sampler["devices"]  # GPU-a (another job's 20 GiB) is not watched
    assert (dev["index"], dev["uuid"], dev["process_view"]) == (0, "GPU-b", "device-delta")
    assert dev["peak_process_bytes"] == 8 * GiB  # the setup spike, over the used-before
    assert dev["memory_pass_peak_bytes"] == 3 * GiB  # the pass alone


def _sampled_h200(**fields) -> dict:
    device = {
        "index": 0,
        "uuid": "GPU-1",
        "name": "NVIDIA H200",
        "total_bytes": 141 * GiB - GiB // 2,
        "used_before_bytes": GiB // 2,
        "peak_device_used_bytes": 9 * GiB,
        "peak_process_bytes": 8 * GiB,
        "memory_pass_peak_bytes": 5 * GiB,
        "process_view": "pid",
        "samples": 50,
    }
    return {"ok": True, "devices": [{**device, **fields}], "notes": []}


def _allocator_h200() -> dict:
    return {
        "status": "ok",
        "notes": [],
        "framework": "cuda-caching-allocator",
        "peak_allocated_bytes": 3 * GiB,
        "peak_reserved_bytes": 4 * GiB,
        "persistent_bytes": GiB,
        "cuda_devices": [
            {
                "index": 0,
                "uuid": "GPU-1",
                "name": "NVIDIA H200",
                "total_bytes": 140 * GiB,  # torch's total_memory
                "peak_allocated_bytes": 3 * GiB,
                "peak_reserved_bytes": 4 * GiB,
            }
        ],
    }


def _measure(data: dict, sampled: dict):
    case = Case("w", {}, 0, "wl.py")
    spec = Spec(module="wl.py", root=".", workload="w", params={}, seed=0, device="cuda",
                warmup=1, repeats=2, data_dir="data", result_path="result.json")
    outcome = CaseOutcome(Result.from_dict(data), 0, False, "", 1.0, sampled)
    return to_measurement(case, spec, outcome, 0.01, 60)


def test_workspace_compares_the_memory_pass_on_both_sides_from_fake_nvml_figures():
    m = _measure(_allocator_h200(), _sampled_h200())
    (dev,) = m.devices
    assert dev.peak_process_bytes == 8 * GiB and dev.memory_pass_peak_bytes == 5 * GiB
    assert m.workspace_bytes == GiB  # 5 GiB in the pass - 4 GiB reserved, not 8 - 4
    assert dev.total_bytes == 140 * GiB  # the VRAM fit uses what torch can allocate
    assert not any("missed a spike" in n for n in m.notes)


def test_a_spike_missed_within_the_memory_pass_is_said_from_fake_nvml_figures():
    # the whole case's peak is above reserved, but the pass's samples all fell below it
    m = _measure(_allocator_h200(), _sampled_h200(memory_pass_peak_bytes=3 * GiB))
    assert any("missed a spike" in n for n in m.notes)


def test_the_samplers_notes_reach_the_measurement_from_fake_nvml_figures():
    sampled = _sampled_h200()
    sampled["notes"] = ["GPU 0 process list unavailable (NVMLError_NoPermission: ...)"]
    m = _measure(_allocator_h200(), sampled)
    assert sampled["notes"][0] in m.notes


def test_the_device_view_is_joined_by_uuid_from_fake_nvml_figures():
    m = _measure(_allocator_h200(), _sampled_h200(index=1))
    (dev,) = m.devices
    assert dev.index == 0  # torch's numbering, matched through the UUID
    assert dev.peak_reserved_bytes == 4 * GiB and m.device_view == "nvml"
    assert m.sample_interval_s == 0.01


def test_without_nvml_the_device_view_is_absent_not_zero():
    data = {"status": "ok", "notes": [], "peak_allocated_bytes": 10, "peak_reserved_bytes": 20}
    m = _measure(data, {"ok": False, "reason": "NVML unavailable: NVMLError_LibraryNotFound"})
    assert m.device_view is None and "NVML unavailable" in m.device_view_note
    assert m.workspace_bytes is None


def test_the_sampler_process_says_why_when_nvml_is_unreachable(fake_nvml, sampler_uses_fake_nvml):
    _, show = fake_nvml
    show(gpu("GPU-a"), init="fail")
    sampler = NvmlSampler(0.01, ("GPU-a",))
    assert sampler.start() is False
    assert sampler.stop() == {"ok": False, "reason": "NVML unavailable: Driver Not Loaded"}
