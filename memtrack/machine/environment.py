"""The environment fingerprint: GPUs, driver, CUDA, cuDNN, NCCL, torch, Python, host.

`collect()` runs in a child process (`python -m memtrack.machine.environment PARENT_PID`, which
dies with its parent), so that the parent never creates a CUDA context of its own: one would
show in every case's device view.
The GPUs are those torch sees (after CUDA_VISIBLE_DEVICES), as torch numbers them; when torch
cannot start CUDA, those NVML sees, and torch's reason. Versions come from torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from memtrack.errors import ProbeError
from memtrack.probes.nvml import guarded, memory_info, resolve, usable_total
from memtrack.probes.tree import die_with_parent
from memtrack.records import Environment, GpuInfo, distribution_key

ENV_ALLOWLIST = (
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "TORCH_CUBLAS_WORKSPACE_CACHE",
    "TORCH_CUBLASLT_UNIFIED_WORKSPACE",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_MODULE_LOADING",
    "CUDA_LAUNCH_BLOCKING",
    "NCCL_BUFFSIZE",
    "NCCL_NVLS_ENABLE",
    "OMP_NUM_THREADS",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
)
"""Memory-relevant variables; the rest of the environment is never recorded."""


def installed_packages(path: list[str] | None = None) -> dict[str, str]:
    """The version of every installed distribution, by its normalised name ('peft',
    'typing-extensions'), as `import` finds it: the first distribution of a name on
    `sys.path` (or `path`). A wheel's `name-version.dist-info` folder says both in its
    name, so nothing is read for it; an older layout (`name.egg-info`, a folder name without
    its version) has its metadata read. Where reading every one's metadata costs tens of
    milliseconds, this costs a listing of each folder."""
    found: dict[str, str] = {}
    for entry in sys.path if path is None else path:
        try:
            folders = sorted(os.listdir(entry or "."))
        except OSError:  # a zip file, a folder gone
            continue
        for folder in folders:
            stem, _, kind = folder.rpartition(".")
            if kind not in ("dist-info", "egg-info"):
                continue
            where = os.path.join(entry or ".", folder)
            if not os.path.isdir(where):  # a file of that name is no distribution
                continue
            name, _, version = stem.partition("-")
            if kind == "egg-info" or not version[:1].isdigit() or "-" in version:
                try:
                    dist = metadata.Distribution.at(where)
                    name, version = dist.metadata["Name"] or "", dist.version
                except Exception:  # unreadable metadata: not a package import sees
                    continue
            key = distribution_key(name)
            if key and version and key not in found:
                found[key] = version
    return found


_NOT_FINGERPRINTED = ("CUDA_VISIBLE_DEVICES",)
"""Which physical card runs a case does not change its figures; the visible GPUs' models
and count (in `gpus`) do, and are in the fingerprint."""


def fingerprint_of(env: dict[str, Any]) -> str:
    """Hash of what confounds a comparison of memory figures."""
    key = {
        "gpus": sorted((g["name"] or "", g["total_bytes"] or 0) for g in env["gpus"]),
        "driver": env["driver"],
        "cuda_runtime": env["cuda_runtime"],
        "cudnn": env["cudnn"],
        "torch": env["torch"],
        "python": ".".join((env["python"] or "").split(".")[:2]),
        "env_vars": {k: v for k, v in env["env_vars"].items() if k not in _NOT_FINGERPRINTED},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def torch_cuda(torch: Any) -> dict[str, Any]:
    """What torch says about CUDA: its devices' properties, or its own reason for none."""
    if not torch.version.cuda:
        return {"available": False, "reason": "torch is a CPU build", "devices": []}
    try:
        torch.cuda.init()  # raises with torch's words: no driver, driver too old, no device
        devices = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"available": False, "reason": reason, "devices": []}
    return {"available": True, "reason": None, "devices": devices}


def gpus_from_torch(nvml: Any, devices: list[Any], notes: list[str]) -> list[dict[str, Any]]:
    """The devices torch sees, numbered as torch numbers them; NVML adds the MIG mode and
    its own UUID for the device (torch spells a MIG instance's UUID GPU-..., a name that
    nothing else knows; NVML's MIG-... is what CUDA_VISIBLE_DEVICES and nvidia-smi take)."""
    from memtrack.probes.framework import device_uuid

    gpus = []
    for i, props in enumerate(devices):
        uuid = device_uuid(props)
        mig_mode = None
        if nvml and uuid:
            uuid, mig_mode = _nvml_facts(nvml, uuid, i, notes)
        gpus.append(
            {
                "index": i,
                "name": props.name,
                "uuid": uuid,
                "total_bytes": int(props.total_memory),
                "compute_capability": f"{props.major}.{props.minor}",
                "mig_mode": mig_mode,
            }
        )
    return gpus


def _nvml_facts(nvml: Any, uuid: str, index: int, notes: list[str]) -> tuple[str, str | None]:
    """(NVML's UUID for the device torch names `uuid`, its MIG mode)."""
    handle = guarded(notes, f"GPU {index} NVML handle", resolve, nvml, uuid)
    if handle is None:
        return uuid, None
    own = guarded(notes, f"GPU {index} UUID", nvml.nvmlDeviceGetUUID, handle)
    uuid = _text(own) or uuid
    if guarded(notes, f"GPU {index} MIG query", nvml.nvmlDeviceIsMigDeviceHandle, handle):
        return uuid, "instance"
    return uuid, _mig_of(nvml, handle)


def _mig_of(nvml: Any, handle: Any) -> str | None:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # a GPU without MIG says "not supported"
        return None
    return "enabled" if current else "disabled"


def gpus_from_nvml(nvml: Any, notes: list[str]) -> list[dict[str, Any]]:
    """Every GPU NVML sees, by NVML index: what doctor shows when torch cannot start CUDA.
    Each query is guarded: a failing one leaves None and a note."""
    gpus = []
    for i in range(guarded(notes, "NVML device count", nvml.nvmlDeviceGetCount) or 0):
        h = guarded(notes, f"NVML device {i}", nvml.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            continue
        cc = guarded(notes, f"GPU {i} capability", nvml.nvmlDeviceGetCudaComputeCapability, h)
        name = guarded(notes, f"GPU {i} name", nvml.nvmlDeviceGetName, h)
        uuid = guarded(notes, f"GPU {i} UUID", nvml.nvmlDeviceGetUUID, h)
        gpus.append(
            {
                "index": i,
                "name": _text(name),
                "uuid": _text(uuid),
                "total_bytes": usable_total(memory_info(nvml, h, notes, f"GPU {i}")),
                "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
                "mig_mode": _mig_of(nvml, h),
            }
        )
    return gpus


def _visible_uuids(gpus: list[dict[str, Any]], notes: list[str]) -> list[str]:
    """All or none: the sampler numbers devices by their place in this list."""
    uuids = [g["uuid"] for g in gpus]
    if all(uuids):
        return uuids
    notes.append("torch gives no UUID for some device: no device view")
    return []


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # doctor says why (nvml_status); cases run without a device view
        return None


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _host_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def collect() -> dict[str, Any]:
    """Gather the environment as plain data (run in a child process; see module doc)."""
    import torch

    notes: list[str] = []
    cuda = torch_cuda(torch)
    nvml = _nvml()
    try:
        if cuda["available"]:
            gpus = gpus_from_torch(nvml, cuda["devices"], notes)
        else:
            gpus = gpus_from_nvml(nvml, notes) if nvml else []
        driver = guarded(notes, "driver version", nvml.nvmlSystemGetDriverVersion) if nvml else None
    finally:
        if nvml:
            nvml.nvmlShutdown()
    cuda_runtime = torch.version.cuda
    cudnn = nccl = None
    if cuda_runtime:
        try:
            v = torch.backends.cudnn.version()
            cudnn = str(v) if v else None
        except Exception:
            cudnn = None
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    packages = installed_packages()
    env: dict[str, Any] = {
        "gpus": gpus,
        "driver": _text(driver),
        "cuda_runtime": cuda_runtime,
        "cudnn": cudnn,
        "nccl": nccl,
        "torch": torch.__version__,
        "torch_cuda_arch_list": list(torch.cuda.get_arch_list()) if cuda_runtime else [],
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "host_ram_bytes": _host_ram(),
        "packages": dict(sorted(packages.items())),
        "env_vars": {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ},
        "cuda_available": cuda["available"],
        "cuda_device_count": len(cuda["devices"]),
        "visible_uuids": _visible_uuids(gpus, notes) if cuda["available"] else [],
        "cuda_unavailable_reason": cuda["reason"],
        "notes": notes,
        "allocator_backend": torch.cuda.get_allocator_backend() if cuda["available"] else None,
    }
    env["fingerprint"] = fingerprint_of(env)
    return env


def from_dict(data: dict[str, Any]) -> Environment:
    data = dict(data)
    data["gpus"] = tuple(GpuInfo(**g) for g in data["gpus"])
    data["torch_cuda_arch_list"] = tuple(data["torch_cuda_arch_list"])
    data["visible_uuids"] = tuple(data["visible_uuids"])
    data["notes"] = tuple(data["notes"])
    return Environment(**data)


class Probing:
    """The environment probe, started in a child process when made, while the caller does
    something else; `result()` waits for its answer."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self.what = f"the environment probe ({sys.executable} -m memtrack.machine.environment)"
        self.child = subprocess.Popen(
            [sys.executable, "-m", "memtrack.machine.environment", str(os.getpid())],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=None if env is None else dict(env),
        )

    def result(self, timeout_s: float = 120.0) -> Environment:
        """Its environment. ProbeError, in one line, where the probe hangs past `timeout_s`
        (a hung GPU driver) or fails."""
        try:
            out, err = self.child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.communicate()
            raise ProbeError(
                f"{self.what} gave no answer within {timeout_s:g} s (a hung GPU driver? try "
                "`nvidia-smi`)"
            ) from None
        if self.child.returncode != 0:
            lines = (err or out).strip().splitlines()
            said = f": {lines[-1]}" if lines else ""
            raise ProbeError(f"{self.what} exited with status {self.child.returncode}{said}")
        try:
            return from_dict(json.loads(out))
        except ValueError as exc:
            raise ProbeError(f"{self.what} answered what is not an environment: {exc}") from None


def probe(timeout_s: float = 120.0, env: Mapping[str, str] | None = None) -> Environment:
    """Collect the environment in a child process; `env`: the environment the workers run
    in (its allowlisted variables are what is recorded), by default this process's.
    ProbeError, in one line, where the probe hangs past `timeout_s` (a hung GPU driver) or
    fails."""
    return Probing(env).result(timeout_s)


if __name__ == "__main__":
    if len(sys.argv) > 1:  # the parent's pid: a hung NVML must not outlive it
        die_with_parent(int(sys.argv[1]))
    json.dump(collect(), sys.stdout)
