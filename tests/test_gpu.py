"""CUDA paths, on a real GPU. Skipped where torch sees none (see conftest.py)."""

from __future__ import annotations

import textwrap

import pytest

from memtrack.config import load_config
from memtrack.machine import environment
from memtrack.measure.suite import run_suite
from memtrack.workload.registry import discover, select_cases

pytestmark = pytest.mark.gpu

WORKLOADS = textwrap.dedent(
    """
    import torch, memtrack

    @memtrack.workload(params={"n": 4096})
    def matmul(ctx):
        a = ctx.randn(ctx["n"], ctx["n"])
        b = torch.nn.Linear(ctx["n"], ctx["n"], bias=False).to(ctx.device, ctx.dtype)
        ctx.mark(b)
        return lambda: b(a)

    @memtrack.workload
    def too_big(ctx):
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        def step():
            return torch.empty(2 * total, dtype=torch.uint8, device=ctx.device)
        return step
    """
)


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    (root / "wl.py").write_text(WORKLOADS)
    (root / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 3\n')
    config = load_config(root / "memtrack.toml")
    return run_suite(config, select_cases(discover(config)))


def test_allocator_and_device_views_are_recorded(gpu_run):
    m = next(m for m in gpu_run.measurements if m.workload == "matmul")
    n2 = 4096 * 4096 * 4
    assert m.status == "ok" and m.device == "cuda" and m.framework == "cuda-caching-allocator"
    assert m.persistent_bytes >= n2  # the weight (the input was made before the mark too)
    assert m.peak_allocated_bytes >= 2 * n2  # weight + input + output at the step's peak
    assert m.peak_reserved_bytes >= m.peak_allocated_bytes
    assert m.peak_requested_bytes <= m.peak_allocated_bytes
    assert m.num_alloc_retries == 0 and m.num_ooms == 0
    assert m.device_view == "nvml", m.device_view_note
    (dev,) = m.devices  # only the device torch sees, numbered as torch numbers it
    assert dev.index == 0 and dev.uuid == gpu_run.environment.visible_uuids[0]
    assert dev.total_bytes == gpu_run.environment.gpus[0].total_bytes  # torch's total_memory
    # the device view holds the CUDA context on top of what the allocator reserved
    assert dev.peak_process_bytes > m.peak_reserved_bytes
    assert dev.memory_pass_peak_bytes is not None, m.notes
    assert dev.memory_pass_peak_bytes <= dev.peak_process_bytes
    assert m.workspace_bytes == dev.memory_pass_peak_bytes - m.peak_reserved_bytes
    assert m.workspace_bytes > 0


def test_a_cuda_oom_is_recorded_as_oom(gpu_run):
    m = next(m for m in gpu_run.measurements if m.workload == "too_big")
    assert m.status == "oom"
    assert "OutOfMemoryError" in m.message
    assert m.num_ooms >= 1  # the allocator's counters at the failure are kept


def test_the_environment_names_the_gpu_driver_and_cuda(gpu_run):
    env = gpu_run.environment
    assert env.gpus and env.gpus[0].total_bytes > 0 and env.gpus[0].compute_capability
    assert env.driver and env.cuda_runtime and env.torch_cuda_arch_list
    assert env.cuda_available is True and env.cuda_unavailable_reason is None
    assert env.cuda_device_count == len(env.visible_uuids) == len(env.gpus)


def test_cuda_visible_devices_narrow_what_is_recorded(gpu_run, monkeypatch):
    first = gpu_run.environment.visible_uuids[0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", first)
    assert environment.probe().visible_uuids == (first,)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    env = environment.probe()
    assert env.cuda_available is False and env.cuda_unavailable_reason


RETAINING = textwrap.dedent(
    """
    import torch, memtrack

    KEPT = []

    @memtrack.workload
    def leaks(ctx):
        def step():
            KEPT.append(torch.ones(1600, device=ctx.device))  # 6,400 B kept by every call
        return step

    @memtrack.workload
    def autograd_graph(ctx):
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                    torch.nn.Linear(1024, 256)).to(ctx.device)
        ctx.mark(model)
        x = ctx.randn(64, 256)
        return lambda: model(x).sum()
    """
)


@pytest.fixture(scope="module")
def retaining(tmp_path_factory):
    root = tmp_path_factory.mktemp("retaining")
    (root / "wl.py").write_text(RETAINING)
    (root / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 4\n')
    config = load_config(root / "memtrack.toml")
    return {m.workload: m for m in run_suite(config, select_cases(discover(config))).measurements}


def test_each_iteration_retains_what_it_leaves_allocated_on_the_gpu(retaining):
    leaks, graph = retaining["leaks"], retaining["autograd_graph"]
    assert leaks.status == graph.status == "ok", (leaks.message, graph.message)
    assert leaks.device == "cuda"
    # the caching allocator rounds every block up to a multiple of 512 B
    assert leaks.retained_samples == (6656,) * 4
    assert graph.retained_samples == (0,) * 4


def test_every_timed_iteration_has_its_device_time(retaining):
    for m in retaining.values():
        assert len(m.iteration_device_times_s) == len(m.iteration_cpu_times_s) == m.repeats
        assert all(t > 0 for t in m.iteration_device_times_s), m.iteration_device_times_s


TWO_GPUS = textwrap.dedent(
    """
    import torch, memtrack

    @memtrack.workload
    def spread(ctx):
        # a model spread over two GPUs: 64 MiB on the case's own, 256 MiB on the other
        small = torch.ones(16 * 2**20, device="cuda:0")
        large = torch.ones(64 * 2**20, device="cuda:1")
        ctx.mark(small, large)
        return lambda: (small * 2, large * 2)
    """
)


def test_one_process_on_two_gpus_reports_its_largest_device(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    (tmp_path / "wl.py").write_text(TWO_GPUS)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n')
    config = load_config(tmp_path / "memtrack.toml")
    (m,) = run_suite(config, select_cases(discover(config))).measurements
    assert m.status == "ok", m.message
    assert {d.index for d in m.devices} == {0, 1}
    one = next(d for d in m.devices if d.index == 1)
    # cuda:1 holds 256 MiB and its copy at the peak: the headline is its, not cuda:0's
    assert m.peak_allocated_bytes == one.peak_allocated_bytes >= 512 * 2**20
    assert m.persistent_bytes == 256 * 2**20
    assert m.workspace_bytes is None or m.workspace_bytes >= 0


BNB_WORKLOADS = textwrap.dedent(
    """
    import torch, memtrack
    from torch import nn


    @memtrack.workload(params={"bits": [4, 8]})
    def bnb(ctx):
        import bitsandbytes as bnb

        torch.manual_seed(0)
        layer = (bnb.nn.Linear4bit if ctx["bits"] == 4 else bnb.nn.Linear8bitLt)
        model = nn.Sequential(
            layer(1024, 4096, bias=False), nn.ReLU(), layer(4096, 1024, bias=False)
        ).to(ctx.device)  # quantized as it moves to the GPU
        ctx.mark(model)
        x = ctx.randn(8, 1024, dtype=torch.float16)

        @torch.no_grad()
        def step():
            return model(x)

        return step
    """
)


def _quantized_bytes(model) -> int:
    """The bytes of a bitsandbytes model's weights, counted here: each weight's packed data
    and what its quantization keeps beside it (4-bit: `quant_state.absmax`, its code and
    nested state; 8-bit: the scales `SCB`), each storage once."""
    import torch

    seen: dict[int, int] = {}

    def add(value, depth):
        if isinstance(value, torch.Tensor):
            seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        elif depth and hasattr(value, "__dict__"):
            for inner in vars(value).values():
                add(inner, depth - 1)

    for p in model.parameters():
        add(p, 0)
        for inner in vars(p).values():
            add(inner, 2)
    return sum(seen.values())


def test_bitsandbytes_weights_read_as_their_quantized_bytes(tmp_path):
    pytest.importorskip("bitsandbytes")
    import importlib.util
    import sys

    (tmp_path / "wl.py").write_text(BNB_WORKLOADS)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n')
    config = load_config(tmp_path / "memtrack.toml")
    run = run_suite(config, select_cases(discover(config)))
    spec = importlib.util.spec_from_file_location("bnb_wl", tmp_path / "wl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bnb_wl"] = module
    spec.loader.exec_module(module)
    from memtrack.workload.context import Context

    for m in run.measurements:
        assert m.status == "ok", m.message
        ctx = Context(m.params, 0, "cuda", tmp_path)
        module.bnb(ctx)  # the same model, built here
        (model,) = ctx.marked_objects
        expected = _quantized_bytes(model)
        fp16 = 2 * 1024 * 4096 * 2
        assert expected < fp16 / (3 if m.params["bits"] == 4 else 1.5)
        assert m.weights_bytes == expected, (m.case_id, m.categories)
