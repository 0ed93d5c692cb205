"""The process group of one rank of a multi-rank case, in its worker: joined from the
variables `torchrun` would set, a barrier between phases, and its end.

The runner starts every rank of a case at once with RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR (127.0.0.1) and a free MASTER_PORT. Each rank measures its
own device: the CPU under gloo, cuda:LOCAL_RANK under NCCL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from memtrack.errors import WorkloadError
from memtrack.worker.protocol import Spec


@dataclass(frozen=True)
class Rank:
    """This worker's place in its case's process group."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    """'cpu' or 'cuda:LOCAL_RANK'."""


def _env_int(name: str) -> int:
    value = os.environ.get(name, "")
    if not value.isdigit():
        raise WorkloadError(
            f"multi-rank case: environment variable {name}={value!r} is not "
            "a rank number (the runner sets it)"
        )
    return int(value)


def setup(spec: Spec) -> Rank | None:
    """Join the case's process group when the case has the `ranks` param; None otherwise.
    On CUDA this rank's device becomes the current one, before anything touches CUDA."""
    if spec.ranks is None:
        return None
    import torch
    import torch.distributed as dist

    rank, world, local = (_env_int(n) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if spec.device == "cuda":
        if local >= torch.cuda.device_count():
            raise WorkloadError(
                f"rank {rank} needs cuda:{local}, but torch sees "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        # device_id: the communicator is made now, in setup, not inside a measured pass
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    return Rank(rank, world, local, str(device))


def barrier(rank: Rank | None) -> None:
    """Wait for every rank, so that all of them measure the same phase at the same time."""
    if rank is None:
        return
    import torch.distributed as dist

    if rank.device.startswith("cuda"):
        dist.barrier(device_ids=[rank.local_rank])
    else:
        dist.barrier()


def teardown(rank: Rank | None) -> None:
    """Leave the process group once every rank has finished."""
    if rank is None:
        return
    import torch.distributed as dist

    barrier(rank)
    dist.destroy_process_group()


__all__ = ["Rank", "barrier", "setup", "teardown"]
