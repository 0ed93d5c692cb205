"""The CUDA framework view (probes.framework) and how a failed case's status is read
(worker.measure). This machine has no GPU: the CUDA probe runs against fake torch.cuda entry
points (FakeCuda below), standing for the allocator's counters of several devices, which
record every call that reaches a device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from memtrack.probes.framework import CudaAllocatorProbe
from memtrack.worker.measure import failure, is_oom

MiB = 2**20


class FakeCuda:
    """Eight visible GPUs; the case's own (cuda:0) and cuda:3 have a primary context. Each
    device's counters are a dict; `touched` lists every device a call reached."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        backend: str = "native",
        contexts: tuple[int, ...] = (0, 3),
    ):
        self.backend = backend
        self.contexts = set(contexts)
        self.touched: set[int] = set()
        self.stats = {
            i: {
                "allocated_bytes.all.peak": 0,
                "reserved_bytes.all.peak": 0,
                "requested_bytes.all.peak": 0,
                "num_alloc_retries": 0,
                "num_ooms": 0,
            }
            for i in range(8)
        }
        cuda = torch.cuda
        patch = monkeypatch.setattr
        patch(cuda, "device_count", lambda: 8)
        patch(cuda, "current_device", lambda: 0)
        patch(cuda, "get_allocator_backend", lambda: self.backend)
        patch(torch._C, "_cuda_hasPrimaryContext", lambda i: i in self.contexts, raising=False)
        patch(cuda, "synchronize", lambda device=None: self._touch(device))
        patch(cuda, "reset_peak_memory_stats", lambda device=None: self._touch(device))
        patch(cuda, "memory_stats", lambda device=None: dict(self.stats[self._touch(device)]))
        patch(
            cuda,
            "max_memory_allocated",
            lambda device=None: self.stats[self._touch(device)]["allocated_bytes.all.peak"],
        )
        patch(
            cuda,
            "max_memory_reserved",
            lambda device=None: self.stats[self._touch(device)]["reserved_bytes.all.peak"],
        )
        patch(cuda, "memory_reserved", lambda device=None: self._touch(device) and 0)
        patch(cuda, "memory_allocated", lambda device=None: self._touch(device) and 0)
        patch(
            cuda,
            "get_device_properties",
            lambda i: SimpleNamespace(
                name="NVIDIA H200",
                uuid=f"0000000{i}-0000-0000-0000-000000000000",
                total_memory=140 * 2**30,
            ),
        )

    def _touch(self, device: object) -> int:
        index = device.index if isinstance(device, torch.device) else device
        index = 0 if index is None else int(index)
        self.touched.add(index)
        return index


def _one_iteration(cuda: FakeCuda) -> dict:
    probe = CudaAllocatorProbe(torch.device("cuda", 0))
    with probe.iteration():
        cuda.stats[0].update(
            {
                "allocated_bytes.all.peak": 300 * MiB,
                "reserved_bytes.all.peak": 400 * MiB,
                "requested_bytes.all.peak": 290 * MiB,
                "num_alloc_retries": 1,
            }
        )
        cuda.stats[3].update(
            {
                "allocated_bytes.all.peak": 100 * MiB,
                "reserved_bytes.all.peak": 120 * MiB,
                "num_alloc_retries": 2,
                "num_ooms": 1,
            }
        )
    return probe.summary()


def test_the_cuda_probe_asks_only_the_devices_the_case_used_with_fake_cuda(monkeypatch):
    # Under cudaMallocAsync a reset of another device's counters creates a context there
    # (0.3-0.5 GB on every visible GPU, in every worker): only the devices with a context,
    # and the case's own, are asked.
    cuda = FakeCuda(monkeypatch)
    summary = _one_iteration(cuda)
    assert cuda.touched == {0, 3}
    assert [d["index"] for d in summary["cuda_devices"]] == [0, 3]
    assert summary["allocator_backend"] == "native"
    # retries and OOMs on any device the case used are the case's
    assert (summary["num_alloc_retries"], summary["num_ooms"]) == (3, 1)
    assert summary["peak_requested_bytes"] == 290 * MiB


def test_under_cuda_malloc_async_counters_it_lacks_are_none_not_zero_with_fake_cuda(monkeypatch):
    cuda = FakeCuda(monkeypatch, backend="cudaMallocAsync")
    summary = _one_iteration(cuda)
    assert summary["allocator_backend"] == "cudaMallocAsync"
    assert summary["peak_allocated_bytes"] == 300 * MiB  # the driver's pool says these
    assert summary["peak_reserved_bytes"] == 400 * MiB
    assert summary["peak_requested_bytes"] is None
    assert summary["num_alloc_retries"] is None and summary["num_ooms"] is None
    assert cuda.touched == {0, 3}


def test_a_failed_case_counts_ooms_from_every_device_it_used_with_fake_cuda(monkeypatch):
    cuda = FakeCuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    cuda.stats[3].update({"allocated_bytes.all.peak": 9 * MiB, "num_ooms": 1})
    out = failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert out["status"] == "oom" and out["num_ooms"] == 1  # on cuda:3, not the current one
    assert out["peak_allocated_bytes"] == 9 * MiB
    assert [d["index"] for d in out["cuda_devices"]] == [0, 3]
    assert cuda.touched == {0, 3}


NCCL = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.5\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
)


@pytest.mark.parametrize(
    ("text", "oom"),
    [
        (NCCL + "Failed to CUDA calloc async 6291456 bytes", True),
        (NCCL + "Cuda failure 2 'out of memory'", True),
        (NCCL + "Cuda failure 700 'an illegal memory access was encountered'", False),
        ("CUDA error: cudaErrorMemoryAllocation", True),
        ("shape mismatch", False),
    ],
)
def test_an_nccl_out_of_memory_is_an_oom_and_other_cuda_errors_are_not(text, oom):
    class DistBackendError(RuntimeError):  # torch.distributed's, as NCCL's errors arrive
        pass

    assert is_oom(DistBackendError(text)) is oom


@pytest.mark.parametrize(
    ("text", "oom"),
    [
        # each session thread creates a cuBLAS handle at its first matmul, outside the
        # caching allocator: near full memory its allocation fails
        ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
        ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtCreate(&handle)`", True),
        ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),  # cuDNN 8
        ("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", True),  # cuDNN 9
        (
            "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...`",
            False,
        ),
        ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED", False),
    ],
)
def test_a_cuda_librarys_failed_allocation_is_an_oom_and_its_other_errors_are_not(text, oom):
    out = failure(RuntimeError(text))
    assert out["status"] == ("oom" if oom else "error")
    assert out["message"] == f"RuntimeError: {text}"


def test_an_oom_the_workload_wrapped_in_its_own_error_is_still_an_oom():
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        except torch.OutOfMemoryError as exc:
            raise RuntimeError("generation failed") from exc
    except RuntimeError as wrapped:
        assert failure(wrapped)["status"] == "oom"


def test_one_process_on_two_gpus_reports_the_largest_per_device_peak_with_fake_cuda(monkeypatch):
    # A model spread over two GPUs (device_map="auto" style): the case's own cuda:0 holds
    # 300 MiB at its peak, cuda:3 holds 500 MiB. The headline read cuda:0 alone.
    cuda = FakeCuda(monkeypatch)
    probe = CudaAllocatorProbe(torch.device("cuda", 0))
    cuda.stats[0]["allocated_bytes.all.peak"] = 40 * MiB  # what each holds at the mark
    monkeypatch.setattr(
        torch.cuda,
        "memory_allocated",
        lambda device=None: {0: 40 * MiB, 3: 200 * MiB}.get(cuda._touch(device), 0),
    )
    assert probe.mark(()) == 40 * MiB
    with probe.iteration():
        cuda.stats[0].update(
            {
                "allocated_bytes.all.peak": 300 * MiB,
                "reserved_bytes.all.peak": 640 * MiB,  # the larger reserved is cuda:0's
                "requested_bytes.all.peak": 290 * MiB,
            }
        )
        cuda.stats[3].update(
            {
                "allocated_bytes.all.peak": 500 * MiB,
                "reserved_bytes.all.peak": 520 * MiB,
                "requested_bytes.all.peak": 498 * MiB,
            }
        )
    summary = probe.summary()
    # each the largest per-device peak, as a multi-rank case's: devices do not pool
    assert summary["peak_allocated_bytes"] == 500 * MiB
    assert summary["peak_reserved_bytes"] == 640 * MiB
    assert summary["peak_requested_bytes"] == 498 * MiB
    assert probe.peak_device() == torch.device("cuda", 3)
    # the persistent set and the level are those of the device holding the peak
    assert summary["persistent_bytes"] == 200 * MiB and probe.levels == [200 * MiB]
    by_index = {d["index"]: d for d in summary["cuda_devices"]}
    assert (by_index[0]["peak_reserved_bytes"], by_index[3]["peak_reserved_bytes"]) == (
        640 * MiB,
        520 * MiB,
    )
