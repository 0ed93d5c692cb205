"""Checks a machine before its figures are trusted: GPU, driver, CUDA, NVML, torch, host, and
what the suite's cases need of them (native bf16, shared memory for NCCL)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memtrack.records import Environment
from memtrack.store.url import Database
from memtrack.units import format_size
from memtrack.workload.registry import Case, ranks_of

BF16 = ("bfloat16", "bf16")
NATIVE_BF16 = (8, 0)
"""Compute capability from which GPUs have bf16 arithmetic (Ampere); before it (V100, T4)
torch runs bf16 emulated, with other kernels and workspaces."""
SHM_FOR_NCCL = 2**30
"""NCCL keeps its intra-node buffers in /dev/shm; below 1 GiB (a container's default is
64 MiB) two or more ranks can fail ('unhandled system error', a bus error)."""


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


def runs_on(capability: str, arch_list: tuple[str, ...]) -> bool:
    """Can a torch built for `arch_list` run kernels on a GPU of this compute capability?

    Code for sm_XY runs on X.Z for any Z >= Y (never across majors; an 'a' build only on X.Y
    itself); PTX (compute_XY) is compiled when loaded, for X.Y or anything newer.
    """
    major, minor = (int(x) for x in capability.split("."))
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", arch)
        if not m:
            continue
        kind, built, suffix = m[1], (int(m[2]), int(m[3])), m[4]
        if suffix == "a":
            ok = built == (major, minor)
        elif kind == "sm" or suffix == "f":
            ok = built[0] == major and built[1] <= minor
        else:
            ok = built <= (major, minor)
        if ok:
            return True
    return False


def _cuda_check(env: Environment) -> Check | None:
    """Can torch start CUDA on the GPUs this machine has? Asked of torch itself."""
    if env.cuda_available is None or not env.cuda_runtime:
        return None  # not recorded, or a CPU build (each GPU line says so)
    if env.cuda_available:
        return Check("cuda", "ok", f"torch sees {env.cuda_device_count} device(s)")
    if env.gpus:
        return Check("cuda", "fail", f"torch cannot start CUDA: {env.cuda_unavailable_reason}")
    return Check("cuda", "info", f"no GPU: cases run on the CPU ({env.cuda_unavailable_reason})")


def _without_nvml(env: Environment) -> str:
    """What NVML's absence means here: CUDA does not need it (a container without the
    driver's `utility` capability, nvidia-ml-py not installed), so where torch starts CUDA the
    cases still run on the GPU, only without the device view."""
    if env.cuda_available:
        return (
            "cases run on CUDA without the device view (no sampled device figures, no "
            "`device` metric, no workspace); torch still starts CUDA"
        )
    if env.cuda_available is False:
        return "no device view; cases run on the CPU"
    return "no device view"  # an environment recorded before CUDA's availability was


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """The size of the shared-memory file system; None where there is none."""
    try:
        return shutil.disk_usage(path).total
    except OSError:
        return None


def in_container() -> bool:
    """Docker, Podman or Kubernetes, by the marks they leave."""
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    if os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("container"):
        return True
    try:
        text = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(mark in text for mark in ("docker", "kubepods", "containerd", "libpod"))


def _bf16_checks(env: Environment, cases: Sequence[Case]) -> list[Check]:
    bf16 = [c.case_id for c in cases if str(c.params.get("dtype", "")) in BF16]
    if not bf16:
        return []
    out = []
    for g in env.gpus:
        cc = re.fullmatch(r"(\d+)\.(\d+)", g.compute_capability or "")
        if cc and (int(cc[1]), int(cc[2])) < NATIVE_BF16:
            shown = ", ".join(bf16[:3]) + (f" and {len(bf16) - 3} more" if len(bf16) > 3 else "")
            out.append(
                Check(
                    f"gpu {g.index} bf16",
                    "warn",
                    f"{g.name} (cc {g.compute_capability}) has no native bfloat16 (cc 8.0 and "
                    f"newer have it): {len(bf16)} bf16 case(s) run emulated, with other kernels, "
                    f"workspaces and times than on the GPUs they stand for: {shown}",
                )
            )
    return out


def _shm_check(
    env: Environment, cases: Sequence[Case], shm: int | None, container: bool
) -> Check | None:
    ranks = max((ranks_of(c.params) or 1 for c in cases), default=1)
    if ranks < 2 or not env.gpus or shm is None or shm >= SHM_FOR_NCCL:
        return None
    where = "this container's" if container else "this machine's"
    return Check(
        "shm",
        "warn",
        f"/dev/shm is {format_size(shm)} ({where}): NCCL keeps its buffers between the "
        f"{ranks} ranks of a case there, and they can fail; give it {format_size(SHM_FOR_NCCL)} "
        "or more (docker run --shm-size=1g, or a memory-backed emptyDir in Kubernetes)",
    )


def _allocator_check(env: Environment) -> Check | None:
    backend = env.allocator_backend
    if backend is None:
        return None
    if backend == "native":
        return Check("allocator", "info", "native (PyTorch's caching allocator)")
    return Check(
        "allocator",
        "warn",
        f"{backend}: peak requested bytes, allocation retries and OOM counts are not kept "
        "(recorded as none), reserved is an upper bound, and `memtrack snapshot` is refused; "
        "runs are compared only with runs of the same PYTORCH_ALLOC_CONF",
    )


def _build_check(env: Environment) -> Check | None:
    """A CUDA build of torch where no GPU is: every worker still loads the CUDA libraries."""
    if not env.cuda_runtime or env.gpus or env.cuda_available:
        return None
    version = (env.torch or "").split("+")[0] or "VERSION"
    return Check(
        "torch build",
        "warn",
        f"a CUDA build (CUDA {env.cuda_runtime}) on a machine without a GPU: every worker "
        "loads the CUDA libraries, which about doubles each case's host peak RSS and raises "
        "the gated `host` figure, and its runs are never compared with a CPU build's; to "
        f"measure on the CPU: pip install 'torch=={version}' "
        "--index-url https://download.pytorch.org/whl/cpu",
    )


def checks(
    env: Environment,
    db_path: Database,
    nvml_error: str | None,
    cases: Sequence[Case] = (),
    shm: int | None = None,
    container: bool = False,
) -> list[Check]:
    """The doctor's report. `cases`: the suite, for what its cases need of the machine;
    `shm`: the size of /dev/shm; `container`: whether this runs in a container."""
    out = [
        Check("python", "info", env.python or "?"),
        Check("torch", "info", f"{env.torch} (CUDA {env.cuda_runtime or 'none: CPU build'})"),
        Check("host", "info", f"{env.cpu} x{env.cpu_count}, RAM {format_size(env.host_ram_bytes)}"),
    ]
    if nvml_error:
        out.append(Check("nvml", "warn", f"not reachable ({nvml_error}): {_without_nvml(env)}"))
    else:
        out.append(Check("nvml", "ok", f"driver {env.driver}, {len(env.gpus)} GPU(s)"))
    cuda = _cuda_check(env)
    if cuda:
        out.append(cuda)
    build = _build_check(env)
    if build:
        out.append(build)
    for g in env.gpus:
        cc = g.compute_capability
        detail = f"{g.name} {g.uuid} VRAM {format_size(g.total_bytes)} cc {cc}"
        if g.mig_mode == "enabled":
            detail += ", MIG enabled (no device view: NVML's figures span all instances)"
        elif g.mig_mode == "instance":
            detail += ", a MIG instance"
        if not env.cuda_runtime:
            out.append(Check(f"gpu {g.index}", "fail", detail + ": torch is a CPU build"))
        elif (
            env.torch_cuda_arch_list
            and re.fullmatch(r"\d+\.\d+", cc or "")
            and not runs_on(cc or "", env.torch_cuda_arch_list)
        ):
            out.append(
                Check(
                    f"gpu {g.index}",
                    "fail",
                    f"{detail}: torch has no code for it ({' '.join(env.torch_cuda_arch_list)})",
                )
            )
        else:
            out.append(Check(f"gpu {g.index}", "ok", detail))
    for note in env.notes:
        out.append(Check("query", "warn", note))
    out.extend(_bf16_checks(env, cases))
    for extra in (_allocator_check(env), _shm_check(env, cases, shm, container)):
        if extra:
            out.append(extra)
    if env.gpus and env.cudnn is None:
        out.append(Check("cudnn", "warn", "cuDNN not found"))
    elif env.cudnn:
        out.append(Check("cudnn", "ok", env.cudnn))
    for k, v in env.env_vars.items():
        out.append(Check(k, "info", v))
    if not isinstance(db_path, Path):  # a server's database: its own disk, not this one's
        return out
    folder = db_path.parent if db_path.parent.exists() else Path.cwd()
    free = shutil.disk_usage(folder).free
    out.append(
        Check("disk", "ok" if free > 2**30 else "warn", f"{format_size(free)} free at {folder}")
    )
    return out
