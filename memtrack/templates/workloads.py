"""This repository's memtrack workloads, written by `memtrack init`: adapt the one below.

A workload builds what persists (the model, on `ctx.device` at `ctx.dtype`), marks it with
`ctx.mark(...)`, and returns the step whose peak memory memtrack measures, in a fresh
process per case. Every combination of `params` is one case with its own history: set them
at the intended precision, batch, longest input and concurrency, since memory grows with
each. Nothing may be downloaded at run time: build the model in code, and seed the inputs
(`ctx.randn`, `ctx.randint`) or read pinned files (`ctx.data_file`).
"""

from __future__ import annotations

import torch

import memtrack

# Your own model, e.g.:
# from @@PACKAGE@@ import build_model


@memtrack.workload(params={"batch": [1, 8], "width": 1024, "dtype": "float32"})
def forward(ctx: memtrack.Context):
    """One forward pass at inference (replace the model with yours)."""
    width = ctx["width"]
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    )
    model = model.to(ctx.device, ctx.dtype).eval()
    ctx.mark(model)  # memory now = the persistent set (the weights)
    x = ctx.randn(ctx["batch"], width)  # pinned by the case's seed

    @torch.no_grad()  # inference: no autograd graph kept
    def step() -> torch.Tensor:
        return model(x)

    return step
