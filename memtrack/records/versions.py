"""What differs between two recorded environments: the confounders a baseline never crosses
(GPUs, driver, CUDA, cuDNN, NCCL, torch, Python, OS, the allocator's variables) and every
installed distribution, each as 'what: old -> new'."""

from __future__ import annotations

from memtrack.records.model import Environment, distribution_key
from memtrack.units import format_size

WHOLE_RECORD = "click"
"""A distribution every install of memtrack has (a dependency of its own): a record whose
packages name it lists every distribution, an older one only memory-relevant ones."""


def environment_diff(old: Environment, new: Environment) -> list[str]:
    """'what: old -> new' for each confounder that differs."""

    def gpus(e: Environment) -> str:
        return ", ".join(f"{g.name} ({format_size(g.total_bytes)})" for g in e.gpus) or "none"

    pairs = [
        ("GPUs", gpus(old), gpus(new)),
        ("driver", old.driver, new.driver),
        ("CUDA", old.cuda_runtime, new.cuda_runtime),
        ("cuDNN", old.cudnn, new.cudnn),
        ("NCCL", old.nccl, new.nccl),
        ("torch", old.torch, new.torch),
        ("Python", old.python, new.python),
        ("OS", old.os, new.os),
    ]
    out = [f"{what}: {a or '-'} -> {b or '-'}" for what, a, b in pairs if a != b]
    for name in sorted(set(old.env_vars) | set(new.env_vars)):
        if old.env_vars.get(name) != new.env_vars.get(name):
            out.append(
                f"{name}: {old.env_vars.get(name, '(unset)')} -> "
                f"{new.env_vars.get(name, '(unset)')}"
            )
    was, now = _packages(old), _packages(new)
    # A record made before every distribution was recorded holds the memory-relevant ones
    # alone: beside it, a package only one side names is no install or removal.
    whole = all(WHOLE_RECORD in p for p in (was, now))
    for name in sorted(set(was) | set(now)):
        if name == "torch" or was.get(name) == now.get(name):
            continue
        if whole or (name in was and name in now):
            out.append(f"{name}: {was.get(name, '-')} -> {now.get(name, '-')}")
    return out


def _packages(e: Environment) -> dict[str, str]:
    """The environment's packages by normalised name (an older record's 'flash_attn')."""
    return {distribution_key(k): v for k, v in e.packages.items()}


__all__ = ["WHOLE_RECORD", "environment_diff"]
