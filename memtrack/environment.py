"""The environment fingerprint: GPUs, driver, CUDA, cuDNN, NCCL, torch, Python, host.

`collect()` runs in a child process (`python -m memtrack.environment`), so that the
parent never creates a CUDA context of its own: one would show in every case's device view.
GPU facts come from NVML (which creates no context), versions from torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

from memtrack.records import Environment, GpuInfo

ENV_ALLOWLIST = (
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
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

_PACKAGE_PREFIXES = (
    "torch",
    "triton",
    "numpy",
    "nvidia-",
    "transformers",
    "accelerate",
    "xformers",
    "flash-attn",
    "flash_attn",
    "deepspeed",
    "bitsandbytes",
    "vllm",
    "safetensors",
    "memtrack",
)


def fingerprint_of(env: dict[str, Any]) -> str:
    """Hash of what confounds a comparison of memory figures."""
    key = {
        "gpus": sorted((g["name"], g["total_bytes"]) for g in env["gpus"]),
        "driver": env["driver"],
        "cuda_runtime": env["cuda_runtime"],
        "cudnn": env["cudnn"],
        "torch": env["torch"],
        "python": ".".join((env["python"] or "").split(".")[:2]),
        "env_vars": env["env_vars"],
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _gpus_from_nvml() -> tuple[list[dict[str, Any]], str | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return [], None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
                mig = "enabled" if current else "disabled"
            except pynvml.NVMLError:
                mig = None
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            gpus.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                    "total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "compute_capability": f"{major}.{minor}",
                    "mig_mode": mig,
                }
            )
        driver = pynvml.nvmlSystemGetDriverVersion()
        return gpus, driver.decode() if isinstance(driver, bytes) else driver
    finally:
        pynvml.nvmlShutdown()


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

    gpus, driver = _gpus_from_nvml()
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
    packages = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(_PACKAGE_PREFIXES):
            packages[name] = dist.version
    env: dict[str, Any] = {
        "gpus": gpus,
        "driver": driver,
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
    }
    env["fingerprint"] = fingerprint_of(env)
    return env


def from_dict(data: dict[str, Any]) -> Environment:
    data = dict(data)
    data["gpus"] = tuple(GpuInfo(**g) for g in data["gpus"])
    data["torch_cuda_arch_list"] = tuple(data["torch_cuda_arch_list"])
    return Environment(**data)


def probe(timeout_s: float = 120.0) -> Environment:
    """Collect the environment in a child process."""
    out = subprocess.run(
        [sys.executable, "-m", "memtrack.environment"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return from_dict(json.loads(out.stdout))


if __name__ == "__main__":
    json.dump(collect(), sys.stdout)
