"""Host and device probes. The NVML tests use a stand-in (FakeNVML): this machine has no GPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

from memtrack.probes.nvml import Sampler
from memtrack.runner import CaseOutcome, to_measurement
from memtrack.workload import Case

SPIKE = textwrap.dedent(
    """
    import json
    from memtrack.probes.host import HostPeak, current_rss

    host = HostPeak()
    host.reset()
    base = current_rss()
    # A sampler reads the RSS at its ticks; however long the spike lives on a loaded
    # machine, these two readings fall outside it, as a poller's do for a short spike.
    samples = [current_rss()]
    spike = bytearray(256 * 2**20)     # touched: zero-filled by the allocator
    spike[::4096] = b"x" * len(spike[::4096])
    del spike
    samples.append(current_rss())
    print(json.dumps({"source": host.source, "base": base, "exact": host.peak(),
                      "sampled": max(samples)}))
    """
)


def test_the_exact_host_peak_sees_a_short_spike_that_sampling_misses():
    out = subprocess.run([sys.executable, "-c", SPIKE], capture_output=True, text=True, check=True)
    r = __import__("json").loads(out.stdout)
    assert r["source"] == "vmhwm"
    assert r["exact"] - r["base"] >= 250 * 2**20  # the exact high-water mark saw it all
    assert r["sampled"] - r["base"] < 100 * 2**20  # readings outside the spike missed it


class FakeNVML:
    """A stand-in for pynvml with scripted readings (no GPU on this machine)."""

    nvmlMemory_v2 = 2

    def __init__(self, used_series, procs_series, total=80 * 2**30):
        self.used_series, self.procs_series, self.total, self.t = (
            used_series,
            procs_series,
            total,
            0,
        )

    def nvmlDeviceGetCount(self):
        return len(self.used_series[0])

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        used = self.used_series[min(self.t, len(self.used_series) - 1)][h]
        if h == self.nvmlDeviceGetCount() - 1:
            self.t += 1
        return SimpleNamespace(total=self.total, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        procs = self.procs_series[min(self.t, len(self.procs_series) - 1)]
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in procs.get(h, [])]


def test_sampler_with_fake_nvml_keeps_per_device_and_per_process_peaks():
    GiB = 2**30
    nvml = FakeNVML(
        used_series=[
            [1 * GiB, 1 * GiB],
            [5 * GiB, 2 * GiB],
            [9 * GiB, 3 * GiB],
            [4 * GiB, 1 * GiB],
        ],
        procs_series=[{}, {0: [(77, 4 * GiB), (99, 1 * GiB)]}, {0: [(77, 8 * GiB)]}, {}],
    )
    s = Sampler(nvml)
    for _ in range(3):
        s.sample({77})
    d0, d1 = s.result()
    assert (d0["uuid"], d0["used_before_bytes"], d0["peak_device_used_bytes"]) == (
        "GPU-0",
        GiB,
        9 * GiB,
    )
    assert (d0["peak_process_bytes"], d0["process_view"]) == (8 * GiB, "pid")
    # the other GPU never listed our PID (a container's PID namespace): device delta instead
    assert (d1["peak_process_bytes"], d1["process_view"]) == (2 * GiB, "device-delta")


def test_device_view_is_joined_by_uuid_and_a_missed_spike_is_said():
    GiB = 2**30
    case = Case("w", {}, 0, "wl.py")
    spec = {"device": "cuda", "warmup": 1, "repeats": 2}
    data = {
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
                "name": "H200",
                "total_bytes": 80 * GiB,
                "peak_allocated_bytes": 3 * GiB,
                "peak_reserved_bytes": 4 * GiB,
            }
        ],
    }
    sampled = {
        "ok": True,
        "devices": [
            {
                "index": 1,
                "uuid": "GPU-1",
                "name": "H200",
                "total_bytes": 80 * GiB,
                "used_before_bytes": GiB // 2,
                "peak_device_used_bytes": 4 * GiB,
                "peak_process_bytes": 3 * GiB + GiB // 2,
                "process_view": "pid",
                "samples": 50,
            }
        ],
    }
    m = to_measurement(case, spec, CaseOutcome(data, 0, False, "", 1.0, sampled), 0.01, 60)
    (dev,) = m.devices
    assert dev.index == 0  # torch's numbering, matched through the UUID
    assert dev.peak_reserved_bytes == 4 * GiB and dev.peak_process_bytes == 3 * GiB + GiB // 2
    assert m.device_view == "nvml" and m.sample_interval_s == 0.01
    assert any("missed a spike" in n for n in m.notes)


def test_without_nvml_the_device_view_is_absent_not_zero():
    case = Case("w", {}, 0, "wl.py")
    spec = {"device": "cuda", "warmup": 1, "repeats": 2}
    data = {"status": "ok", "notes": [], "peak_allocated_bytes": 10, "peak_reserved_bytes": 20}
    sampled = {"ok": False, "reason": "NVML unavailable: NVMLError_LibraryNotFound"}
    m = to_measurement(case, spec, CaseOutcome(data, 0, False, "", 1.0, sampled), 0.01, 60)
    assert m.device_view is None and "NVML unavailable" in m.device_view_note
    assert m.workspace_bytes is None


def test_the_sampler_process_says_why_when_nvml_is_unreachable():
    from memtrack.doctor import nvml_status
    from memtrack.runner import _start_sampler

    if nvml_status() is None:
        import pytest

        pytest.skip("NVML is reachable here")
    proc, first = _start_sampler(0.01)
    assert proc is None
    assert first["ok"] is False and first["reason"].startswith("NVML unavailable")
