"""A stand-in for NVML's Python bindings (`pynvml`), for tests on machines without a GPU.

Put this folder first on PYTHONPATH (a sampler process then imports it as `pynvml`), or load
it by path in-process. It reads its scenario, the JSON file named by $FAKE_NVML, on every
query, so a test, or a test workload in another process, changes what the "GPUs" show while
a sampler runs (write the file atomically: see `write_scenario` in test_nvml.py):

  {"init": "ok" | "hang" | "fail",
   "driver": "580.65",
   "devices": [{"uuid": "GPU-...", "name": "NVIDIA H200", "total": 150000000000,
                "reserved": 500000000, "used": 1000000000, "procs": [[pid, bytes], ...],
                "mps_procs": [[pid, bytes], ...],
                "capability": [9, 0], "mig": "none" | "disabled" | "enabled" | "instance",
                "fail": ["memory", "procs", "name", ...]}]}

"mps_procs" is NVML's list of MPS clients (under MPS, "procs" holds the MPS server).
A device with "mig": "instance" is a MIG instance: found by UUID only, not by index, and its
UUID spelt MIG-... A query named in "fail" raises NVMLError_NoPermission; "memory_v2" fails
only memory info v2 (NVMLError_Unknown, a transient failure), "memory" both versions. Every
memory query appends "UUID USED" to $FAKE_NVML.seen, so a workload can wait until the sampler
has read a figure instead of sleeping and hoping.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

nvmlMemory_v2 = 2


class NVMLError(Exception):
    pass


class NVMLError_NoPermission(NVMLError):
    def __str__(self) -> str:
        return "Insufficient Permissions"


class NVMLError_NotFound(NVMLError):
    def __str__(self) -> str:
        return "Not Found"


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


class NVMLError_Unknown(NVMLError):
    def __str__(self) -> str:
        return "Unknown Error"


def _scenario() -> dict[str, Any]:
    with open(os.environ["FAKE_NVML"]) as f:
        return json.load(f)


def _device(handle: str, query: str) -> dict[str, Any]:
    for d in _scenario()["devices"]:
        if d["uuid"] == handle:
            if query in d.get("fail", []):
                raise NVMLError_NoPermission()
            return d
    raise NVMLError_NotFound()


def _gpus() -> list[dict[str, Any]]:
    return [d for d in _scenario()["devices"] if d.get("mig") != "instance"]


def nvmlInit() -> None:
    mode = _scenario().get("init", "ok")
    while mode == "hang":
        time.sleep(1)
    if mode == "fail":
        raise NVMLError("Driver Not Loaded")


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return _scenario().get("driver", "580.65")


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(i: int) -> str:
    return _gpus()[i]["uuid"]


def nvmlDeviceGetHandleByUUID(uuid: str) -> str:
    return _device(uuid, "handle")["uuid"]


def nvmlDeviceGetUUID(handle: str) -> str:
    return _device(handle, "uuid")["uuid"]


def nvmlDeviceGetName(handle: str) -> bytes:
    return _device(handle, "name")["name"].encode()  # older bindings return bytes


def nvmlDeviceGetCudaComputeCapability(handle: str) -> tuple[int, int]:
    major, minor = _device(handle, "capability").get("capability", [9, 0])
    return major, minor


def nvmlDeviceGetMemoryInfo(handle: str, version: int | None = None) -> SimpleNamespace:
    d = _device(handle, "memory")
    if version == nvmlMemory_v2 and "memory_v2" in d.get("fail", []):
        raise NVMLError_Unknown()
    used, reserved, total = d["used"], d.get("reserved", 0), d["total"]
    with open(os.environ["FAKE_NVML"] + ".seen", "a") as f:
        f.write(f"{handle} {used}\n")
    if version == nvmlMemory_v2:
        return SimpleNamespace(total=total, reserved=reserved, used=used, free=total - used)
    return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)


def nvmlDeviceGetComputeRunningProcesses(handle: str) -> list[SimpleNamespace]:
    procs = _device(handle, "procs").get("procs", [])
    return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs]


def nvmlDeviceGetMPSComputeRunningProcesses(handle: str) -> list[SimpleNamespace]:
    procs = _device(handle, "mps_procs").get("mps_procs", [])
    return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs]


def nvmlDeviceGetMigMode(handle: str) -> tuple[int, int]:
    mig = _device(handle, "mig_mode").get("mig", "none")
    if mig in ("none", "instance"):
        raise NVMLError_NotSupported()
    current = 1 if mig == "enabled" else 0
    return current, current


def nvmlDeviceIsMigDeviceHandle(handle: str) -> bool:
    return _device(handle, "is_mig").get("mig") == "instance"
