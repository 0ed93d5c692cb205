"""A training step with AdamW: weights, gradients, optimizer state and activations."""

from __future__ import annotations

import torch
from torch import nn

import memtrack


@memtrack.workload(
    params={"batch": 32, "seq_len": 64, "d_model": 128, "layers": 2, "dtype": "float32"}
)
def train_step(ctx: memtrack.Context):
    """One optimizer step of a small transformer encoder on pinned random data."""
    p = ctx.params
    layer = nn.TransformerEncoderLayer(
        p["d_model"], nhead=4, dim_feedforward=4 * p["d_model"], batch_first=True, dropout=0.0
    )
    model = nn.Sequential(
        nn.TransformerEncoder(layer, p["layers"], enable_nested_tensor=False),
        nn.Linear(p["d_model"], 1),
    )
    model = model.to(ctx.device, ctx.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ctx.mark(model, optimizer)
    x = ctx.randn(p["batch"], p["seq_len"], p["d_model"])
    y = ctx.randn(p["batch"], p["seq_len"], 1, offset=1)

    def step() -> torch.Tensor:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step
