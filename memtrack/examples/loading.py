"""A model loaded from its checkpoint, then used for inference: the loading step's host
memory, disk reads and disk space, measured apart from the step."""

from __future__ import annotations

import torch
from torch import nn

import memtrack


def _mlp(width: int, layers: int) -> nn.Module:
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers))
    )


@memtrack.workload(params={"width": 1024, "layers": 12, "batch": 8, "dtype": "float32"})
def load_checkpoint(ctx: memtrack.Context):
    """Reload a 48 MiB checkpoint (written here, in code) into a freshly built model.

    `torch.load` materialises the whole state dict in host memory before `load_state_dict`
    copies it into the model's own parameters: for a moment the weights are there twice,
    which is why loading, not the step, sets this case's host peak.
    """
    p = ctx.params
    checkpoint = ctx.scratch_dir / "model.pt"
    # What a training job would have saved; torch.save, not safetensors: safetensors maps
    # the file, and reads through a mapping are not counted as the process's reads.
    torch.save(_mlp(p["width"], p["layers"]).state_dict(), checkpoint)
    with ctx.loading():
        model = _mlp(p["width"], p["layers"])
        state = torch.load(checkpoint, map_location=ctx.device, weights_only=True)
        model.load_state_dict(state)
        del state
    model = model.to(ctx.device, ctx.dtype).eval()
    ctx.mark(model)
    x = ctx.randn(p["batch"], p["width"])

    @torch.inference_mode()
    def step() -> torch.Tensor:
        return model(x).sum(-1)

    return step
