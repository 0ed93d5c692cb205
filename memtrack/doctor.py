"""Checks a machine before its figures are trusted: GPU, driver, CUDA, NVML, torch, host."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from memtrack.records import Environment
from memtrack.units import format_size


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: str
    """ok | warn | fail | info"""
    detail: str


def nvml_status() -> str | None:
    """None when NVML initialises; else why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return None
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return f"{type(exc).__name__}: {exc}"


def checks(env: Environment, db_path: Path, nvml_error: str | None) -> list[Check]:
    out = [
        Check("python", "info", env.python or "?"),
        Check("torch", "info", f"{env.torch} (CUDA {env.cuda_runtime or 'none: CPU build'})"),
        Check("host", "info", f"{env.cpu} x{env.cpu_count}, RAM {format_size(env.host_ram_bytes)}"),
    ]
    if nvml_error:
        out.append(
            Check(
                "nvml",
                "warn",
                f"not reachable ({nvml_error}): no device view; cases run on the CPU",
            )
        )
    else:
        out.append(Check("nvml", "ok", f"driver {env.driver}, {len(env.gpus)} GPU(s)"))
    for g in env.gpus:
        arch = f"sm_{(g.compute_capability or '').replace('.', '')}"
        detail = f"{g.name} {g.uuid} VRAM {format_size(g.total_bytes)} cc {g.compute_capability}"
        if g.mig_mode == "enabled":
            detail += ", MIG enabled (figures are per instance)"
        if not env.cuda_runtime:
            out.append(Check(f"gpu {g.index}", "fail", detail + ": torch is a CPU build"))
        elif (
            env.torch_cuda_arch_list
            and arch not in env.torch_cuda_arch_list
            and not any(a.startswith("compute_") for a in env.torch_cuda_arch_list)
        ):
            out.append(
                Check(
                    f"gpu {g.index}",
                    "fail",
                    f"{detail}: torch is not built for {arch} "
                    f"({' '.join(env.torch_cuda_arch_list)})",
                )
            )
        else:
            out.append(Check(f"gpu {g.index}", "ok", detail))
    if env.gpus and env.cudnn is None:
        out.append(Check("cudnn", "warn", "cuDNN not found"))
    elif env.cudnn:
        out.append(Check("cudnn", "ok", env.cudnn))
    for k, v in env.env_vars.items():
        out.append(Check(k, "info", v))
    folder = db_path.parent if db_path.parent.exists() else Path.cwd()
    free = shutil.disk_usage(folder).free
    out.append(
        Check("disk", "ok" if free > 2**30 else "warn", f"{format_size(free)} free at {folder}")
    )
    return out
