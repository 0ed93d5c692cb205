"""The NVML device view. This machine has no GPU: NVML is the stand-in in fakenvml/pynvml.py,
loaded in-process or, for the sampler process, first on its PYTHONPATH."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import processes
import pytest

from memtrack.measure.launcher import CaseOutcome, launch
from memtrack.measure.outcome import to_measurement
from memtrack.measure.sampler import NvmlSampler, start_sampler
from memtrack.probes.nvml import SampledDevice, Sampler, SamplerResult
from memtrack.worker.protocol import ProtocolError, Result, Spec, read_typed
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
    (dev,) = s.result().devices
    assert (dev.index, dev.uuid) == (0, "GPU-b")  # torch's device 0
    assert dev.peak_process_bytes == 3 * GiB and dev.process_view == "pid"
    assert dev.peak_device_used_bytes == GiB  # GPU-a's other job is nowhere


def test_sampler_with_fake_nvml_falls_back_to_device_deltas_all_or_nothing(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a", used=GiB, procs=[[77, 2 * GiB]]), gpu("GPU-b", used=GiB))
    s = Sampler(nvml, ["GPU-a", "GPU-b"])
    show(gpu("GPU-a", used=3 * GiB, procs=[[77, 2 * GiB]]), gpu("GPU-b", used=5 * GiB))
    s.sample({77})
    a, b = s.result().devices
    # found by PID on GPU-a: GPU-b's growth is another process's, not this case's
    assert (a.peak_process_bytes, a.process_view) == (2 * GiB, "pid")
    assert (b.peak_process_bytes, b.process_view) == (0, "pid")

    # found nowhere (a container's PID namespace): device-wide deltas on every device
    show(gpu("GPU-a", used=GiB), gpu("GPU-b", used=GiB))
    s = Sampler(nvml, ["GPU-a", "GPU-b"])
    show(gpu("GPU-a", used=3 * GiB), gpu("GPU-b", used=GiB))
    s.sample({77})
    a, b = s.result().devices
    assert (a.peak_process_bytes, a.process_view) == (2 * GiB, "device-delta")
    assert (b.peak_process_bytes, b.process_view) == (0, "device-delta")


def test_under_mps_the_case_is_found_among_nvmls_mps_clients_with_fake_nvml(
    fake_nvml, tmp_path, monkeypatch
):
    # Under MPS the compute process list holds the MPS server (pid 999, every client's 6 GiB);
    # the case's worker (77) is an MPS client: it fell back to device-wide deltas before.
    nvml, show = fake_nvml
    pipes = tmp_path / "mps"
    pipes.mkdir()
    (pipes / "control").touch()  # the MPS control daemon's pipe
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipes))
    server = {"procs": [[999, 6 * GiB]], "mps_procs": [[77, 2 * GiB], [78, 3 * GiB]]}
    show(gpu("GPU-a", used=GiB, **server))
    s = Sampler(nvml, ["GPU-a"])
    show(gpu("GPU-a", used=7 * GiB, **server))
    s.sample({77})
    result = s.result()
    (dev,) = result.devices
    assert (dev.peak_process_bytes, dev.process_view) == (2 * GiB, "pid")
    assert "GPU 0: the case ran as an MPS client, read from NVML's MPS client list" in result.notes

    # NVML lists no MPS client: the device-wide delta, and a note that it counts the others
    show(gpu("GPU-a", used=GiB, procs=[[999, 6 * GiB]]))
    s = Sampler(nvml, ["GPU-a"])
    show(gpu("GPU-a", used=7 * GiB, procs=[[999, 6 * GiB]]))
    s.sample({77})
    result = s.result()
    assert result.devices[0].process_view == "device-delta"
    assert any("count every MPS client's memory" in n for n in result.notes)


def test_without_mps_the_mps_client_list_is_never_asked_with_fake_nvml(
    fake_nvml, tmp_path, monkeypatch
):
    nvml, show = fake_nvml
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-mps"))
    show(gpu("GPU-a", used=GiB, mps_procs=[[77, 2 * GiB]], fail=["mps_procs"]))
    s = Sampler(nvml, ["GPU-a"])
    s.sample({77})  # a container's PID namespace: not listed, and no MPS to ask
    result = s.result()
    assert result.devices[0].process_view == "device-delta"
    assert not any("MPS" in n for n in result.notes), result.notes


def test_sampler_with_fake_nvml_keeps_other_devices_when_one_query_fails(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a", used=2 * GiB), gpu("GPU-b", used=GiB, fail=["memory", "procs"]))
    s = Sampler(nvml, ["GPU-a", "GPU-b"])
    s.sample({77})
    result = s.result()
    a, b = result.devices
    assert a.peak_device_used_bytes == 2 * GiB and a.total_bytes == 141 * GiB
    assert b.total_bytes is None and b.peak_device_used_bytes is None
    assert b.peak_process_bytes is None  # not measured: None, never 0
    assert any(
        n.startswith("GPU 1 memory info unavailable (NVMLError_NoPermission") for n in result.notes
    )


def test_sampler_with_fake_nvml_samples_a_mig_instance_not_its_parent(fake_nvml):
    nvml, show = fake_nvml
    hex_x = "11111111-2222-3333-4444-555555555555"
    show(
        gpu("GPU-parent", used=9 * GiB, mig="enabled"),
        gpu(f"MIG-{hex_x}", used=3 * GiB, mig="instance", total=18 * GiB),
        gpu("MIG-other", used=6 * GiB, mig="instance", total=18 * GiB),
    )
    # torch spells the instance's UUID with a GPU- prefix; NVML's own UUID for the handle
    # is recorded, which names a device that exists (MIG-...)
    s = Sampler(nvml, [f"GPU-{hex_x}"])
    s.sample(set())
    (dev,) = s.result().devices
    assert dev.uuid == f"MIG-{hex_x}"
    assert dev.peak_device_used_bytes == 3 * GiB  # the instance's, not all instances'
    assert dev.total_bytes == 18 * GiB

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
    (dev,) = s.result(window=(1.5, 3.5)).devices
    assert dev.peak_process_bytes == 8 * GiB  # the whole case: what must fit the GPU
    assert dev.memory_pass_peak_bytes == 4 * GiB  # the pass alone: 5 GiB - 1 GiB before

    result = s.result(window=(4.2, 4.3))  # a pass that fell between two samples
    assert result.devices[0].memory_pass_peak_bytes is None
    assert any("no sample fell inside the memory pass" in n for n in result.notes)


def test_the_samplers_answer_crosses_the_pipe_as_its_typed_record_with_fake_nvml(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a", used=2 * GiB, procs=[[77, GiB]]), gpu("GPU-b", fail=["procs"]))
    s = Sampler(nvml, ["GPU-a", "GPU-b"])
    s.sample({77}, clock=lambda: 1.0)
    s.sample({77}, clock=lambda: 2.0)
    result = s.result(window=(0.5, 2.5))
    assert read_typed(SamplerResult, json.loads(result.to_json()), "sampler") == result
    # a figure of another type is refused where it is read, naming it
    data = json.loads(result.to_json())
    data["devices"][1]["peak_process_bytes"] = "1 GiB"
    with pytest.raises(ProtocolError, match=r"sampler.devices\[1\].peak_process_bytes"):
        read_typed(SamplerResult, data, "sampler")


def test_sampler_with_fake_nvml_counts_only_memory_a_process_can_use(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a", total=141 * GiB, reserved=GiB // 2))
    (dev,) = Sampler(nvml, ["GPU-a"]).result().devices
    assert dev.total_bytes == 141 * GiB - GiB // 2  # the driver keeps the rest


def test_a_hung_sampler_with_fake_nvml_is_ended_and_the_view_absent(
    fake_nvml, sampler_uses_fake_nvml
):
    _, show = fake_nvml
    show(gpu("GPU-a"), init="hang")
    sampler = NvmlSampler(0.01, ("GPU-a",), timeout_s=1)
    assert sampler.start() is False
    assert sampler.stop() == SamplerResult(reason="the NVML sampler did not start within 1 s")


def test_a_sampler_hung_in_fake_nvml_dies_with_its_runner_killed_by_sigkill(
    fake_nvml, sampler_uses_fake_nvml
):
    """A runner killed by SIGKILL stops nothing: its sampler, stuck in NVML's initialisation
    (it reads no command meanwhile), ends with it all the same (its parent-death signal)."""
    _, show = fake_nvml
    show(gpu("GPU-a"), init="hang")
    runner = "from memtrack.measure import sampler\nsampler.NvmlSampler(0.01, ('GPU-a',)).start()"
    assert processes.ends_with_its_killed_parent(runner, b"memtrack.probes.nvml")


def test_a_sampler_with_fake_nvml_refuses_a_mig_parent_and_says_why(
    fake_nvml, sampler_uses_fake_nvml
):
    _, show = fake_nvml
    show(gpu("GPU-parent", mig="enabled"))
    sampler = NvmlSampler(0.01, ("GPU-parent",))
    assert sampler.start() is False
    first = sampler.stop()
    assert first.ok is False
    assert "MIG mode" in first.reason


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
    (dev,) = outcome.sampler.devices  # GPU-a (another job's 20 GiB) is not watched
    assert (dev.index, dev.uuid, dev.process_view) == (0, "GPU-b", "device-delta")
    assert dev.peak_process_bytes == 8 * GiB  # the setup spike, over the used-before
    assert dev.memory_pass_peak_bytes == 3 * GiB  # the pass alone


def _sampled_h200(**fields) -> SamplerResult:
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
    return SamplerResult(devices=(SampledDevice(**{**device, **fields}),), notes=())


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


def _measure(data: dict, sampled: SamplerResult):
    case = Case("w", {}, 0, "wl.py")
    spec = Spec(
        module="wl.py",
        root=".",
        workload="w",
        params={},
        seed=0,
        device="cuda",
        warmup=1,
        repeats=2,
        data_dir="data",
        result_path="result.json",
    )
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


@pytest.mark.parametrize("in_pass", [3 * GiB, 0])
def test_a_missed_spike_leaves_no_workspace_and_says_why_from_fake_nvml_figures(in_pass):
    # 3 GiB sampled in the pass against 4 GiB reserved: -1 GiB was stored as the workspace,
    # and the database then read as damaged. A pass read as 0 (the device-wide view, another
    # process freeing memory) is a sample too: not replaced by the whole case's 8 GiB.
    m = _measure(_allocator_h200(), _sampled_h200(memory_pass_peak_bytes=in_pass))
    assert m.workspace_bytes is None
    assert any("missed a spike" in n for n in m.notes), m.notes


def test_the_samplers_notes_reach_the_measurement_from_fake_nvml_figures():
    note = "GPU 0 process list unavailable (NVMLError_NoPermission: ...)"
    sampled = dataclasses.replace(_sampled_h200(), notes=(note,))
    m = _measure(_allocator_h200(), sampled)
    assert sampled.notes[0] in m.notes


def test_the_device_view_is_joined_by_uuid_from_fake_nvml_figures():
    m = _measure(_allocator_h200(), _sampled_h200(index=1))
    (dev,) = m.devices
    assert dev.index == 0  # torch's numbering, matched through the UUID
    assert dev.peak_reserved_bytes == 4 * GiB and m.device_view == "nvml"
    assert m.sample_interval_s == 0.01


def test_without_nvml_the_device_view_is_absent_not_zero():
    data = {"status": "ok", "notes": [], "peak_allocated_bytes": 10, "peak_reserved_bytes": 20}
    m = _measure(data, SamplerResult(reason="NVML unavailable: NVMLError_LibraryNotFound"))
    assert m.device_view is None and "NVML unavailable" in m.device_view_note
    assert m.workspace_bytes is None


def test_the_sampler_process_says_why_when_nvml_is_unreachable(fake_nvml, sampler_uses_fake_nvml):
    _, show = fake_nvml
    show(gpu("GPU-a"), init="fail")
    sampler = NvmlSampler(0.01, ("GPU-a",))
    assert sampler.start() is False
    assert sampler.stop() == SamplerResult(reason="NVML unavailable: Driver Not Loaded")


def test_a_mig_instance_is_recorded_as_nvml_names_it_and_joined_with_torchs_from_fake_nvml():
    # the sampler says MIG-1 (NVML's UUID), the worker's allocator GPU-1 (torch's spelling)
    m = _measure(_allocator_h200(), _sampled_h200(uuid="MIG-1"))
    (dev,) = m.devices
    assert dev.uuid == "MIG-1" and dev.peak_reserved_bytes == 4 * GiB


def test_memory_info_v2_is_decided_once_per_sampler_with_fake_nvml(fake_nvml):
    nvml, show = fake_nvml
    # v1's used includes the 500 MB the driver reserves; v2's does not
    show(gpu("GPU-a", used=GiB, reserved=GiB // 2))
    s = Sampler(nvml, ["GPU-a"])
    show(gpu("GPU-a", used=2 * GiB, reserved=GiB // 2, fail=["memory_v2"]))  # transient
    s.sample(set(), clock=lambda: 1.0)
    show(gpu("GPU-a", used=2 * GiB, reserved=GiB // 2))
    s.sample(set(), clock=lambda: 2.0)
    result = s.result()
    (dev,) = result.devices
    # the failed reading is missing, not v1's 2.5 GiB mixed with v2's figures
    assert dev.peak_device_used_bytes == 2 * GiB
    assert any(
        n.startswith("GPU 0 memory info unavailable (NVMLError_Unknown") for n in result.notes
    )

    # a driver without v2 from the start: v1 for the whole case, and said
    show(gpu("GPU-a", used=GiB, reserved=GiB // 2, fail=["memory_v2"]))
    s = Sampler(nvml, ["GPU-a"])
    s.sample(set())
    result = s.result()
    assert result.devices[0].used_before_bytes == GiB + GiB // 2
    assert any("memory info v2 unavailable" in n and "v1 is read" in n for n in result.notes)


def test_the_achieved_sampling_period_is_recorded_not_the_nominal_one_with_fake_nvml(fake_nvml):
    nvml, show = fake_nvml
    show(gpu("GPU-a"), gpu("GPU-b"))
    s = Sampler(nvml, ["GPU-a", "GPU-b"])
    for t in (1.0, 1.1, 1.4):  # rounds over two GPUs, slower than asked
        s.sample(set(), clock=lambda t=t: t)
    assert s.result().achieved_interval_s == pytest.approx(0.2)
    m = _measure(_allocator_h200(), dataclasses.replace(_sampled_h200(), achieved_interval_s=0.2))
    assert m.sample_interval_s == 0.2  # the nominal 0.01 was asked for


def test_only_the_devices_the_case_used_are_charged_to_it_from_fake_nvml_figures():
    # device-delta view on a shared host: another job grew GPU 5 by 30 GiB meanwhile
    other = dataclasses.replace(
        _sampled_h200().devices[0],
        index=1,
        uuid="GPU-5",
        peak_process_bytes=30 * GiB,
        memory_pass_peak_bytes=30 * GiB,
        process_view="device-delta",
    )
    sampled = _sampled_h200(process_view="device-delta")
    sampled = dataclasses.replace(sampled, devices=(*sampled.devices, other))
    m = _measure(_allocator_h200(), sampled)  # the worker used GPU-1 only
    assert [d.uuid for d in m.devices] == ["GPU-1"]
    assert m.workspace_bytes == GiB
    assert "device view: 1 of the 2 visible GPUs, those the case used" in m.notes


def _with_quiet(reserved_after: int) -> dict:
    data = _allocator_h200()
    data["cuda_devices"][0]["reserved_after_bytes"] = reserved_after
    return data


def test_a_missed_spike_smaller_than_the_cuda_context_is_said_from_fake_nvml_figures():
    # 500 MiB outside the allocator (the context); 4 GiB reserved at a quiet moment; a
    # 200 MiB spike to 4.2 GiB reserved, given back (empty_cache) before any sample saw it
    MiB = 2**20
    data = _with_quiet(4 * GiB)
    data["peak_reserved_bytes"] = data["cuda_devices"][0]["peak_reserved_bytes"] = (
        4 * GiB + 200 * MiB
    )
    sampled = _sampled_h200(
        memory_pass_peak_bytes=4 * GiB + 500 * MiB, quiet_process_bytes=4 * GiB + 500 * MiB
    )
    m = _measure(data, sampled)
    (note,) = [n for n in m.notes if "missed a spike" in n]
    assert note.startswith(
        "GPU 0: sampled device peak less the 500.0 MiB outside the "
        "allocator (CUDA context, ...) is 4096.0 MiB, below"
    )

    # the same spike caught by a sample: no note
    caught = _sampled_h200(
        memory_pass_peak_bytes=4 * GiB + 700 * MiB, quiet_process_bytes=4 * GiB + 500 * MiB
    )
    assert not any("missed a spike" in n for n in _measure(data, caught).notes)


SHORT_PASS_WORKLOAD = textwrap.dedent(
    """
    import memtrack

    @memtrack.workload
    def quick(ctx):
        return lambda: None  # a memory pass of well under a sampling period
    """
)


def test_a_memory_pass_shorter_than_the_interval_still_gets_samples_with_fake_nvml(
    tmp_path, fake_nvml, sampler_uses_fake_nvml
):
    _, show = fake_nvml
    show(gpu("GPU-b", used=3 * GiB))
    (tmp_path / "wl.py").write_text(SHORT_PASS_WORKLOAD)
    spec = Spec(
        module="wl.py",
        root=str(tmp_path),
        workload="quick",
        params={},
        seed=0,
        device="cpu",
        warmup=1,
        repeats=2,
        data_dir=str(tmp_path / "data"),
        result_path=str(tmp_path / "result.json"),
    )
    # a period far longer than the pass: before the worker held its level for the sampler,
    # no sample fell inside it and the memory pass had no device figure
    (outcome,), _ = launch([spec], 120, sampler=start_sampler("cuda", 0.2, ("GPU-b",)))
    assert outcome.result.status == "ok", outcome.stderr_tail
    start, last, held = outcome.result.memory_window
    assert start <= last < held
    (dev,) = outcome.sampler.devices
    assert dev.memory_pass_peak_bytes == 0  # the level held: none grew (device delta)
    assert dev.quiet_process_bytes == 0
    assert not any("no sample fell inside" in n for n in outcome.sampler.notes)


class RecordingSampler(NvmlSampler):
    """The real sampler client, telling a file each process it is asked to watch."""

    def __init__(self, log: Path):
        super().__init__(0.01, ("GPU-a",))
        self.log = log

    def watch(self, pid: int) -> None:
        new = pid not in self.watched
        super().watch(pid)
        if new:
            with open(self.log, "a") as f:
                f.write(f"{pid}\n")


CHILD_WORKLOAD = textwrap.dedent(
    """
    import os, subprocess, sys, time
    import memtrack

    @memtrack.workload
    def compiles(ctx):
        # a helper process of the step (a compile worker), alive until the launcher has
        # told the sampler of it
        log = os.environ["WATCHED_LOG"]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.environ["CHILD_PID"], "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        while str(child.pid) not in open(log).read().split():
            time.sleep(0.01)
        child.kill()
        child.wait()
        return lambda: None
    """
)


def test_the_sampler_is_told_of_the_workers_descendants_with_fake_nvml(
    tmp_path, fake_nvml, sampler_uses_fake_nvml, monkeypatch
):
    _, show = fake_nvml
    show(gpu("GPU-a"))
    log, child = tmp_path / "watched.log", tmp_path / "child.pid"
    log.write_text("")
    monkeypatch.setenv("WATCHED_LOG", str(log))
    monkeypatch.setenv("CHILD_PID", str(child))
    (tmp_path / "wl.py").write_text(CHILD_WORKLOAD)
    spec = Spec(
        module="wl.py",
        root=str(tmp_path),
        workload="compiles",
        params={},
        seed=0,
        device="cpu",
        warmup=1,
        repeats=1,
        data_dir=str(tmp_path / "data"),
        result_path=str(tmp_path / "result.json"),
    )
    sampler = RecordingSampler(log)
    assert sampler.start()
    assert sampler.proc is not None
    sampler_pid = sampler.proc.pid
    (outcome,), _ = launch([spec], 120, sampler=sampler)
    assert outcome.result.status == "ok", outcome.stderr_tail
    watched = log.read_text().split()
    worker_pid, child_pid = child.read_text().split()
    assert watched[0] == worker_pid  # the worker, told before it runs
    assert child_pid in watched  # the worker's child, found by the process tree
    # none of the runner's own (torch's CUDA build also runs `ldconfig -p` as it is imported:
    # a short-lived child of the worker, watched too)
    assert str(sampler_pid) not in watched and str(os.getpid()) not in watched
