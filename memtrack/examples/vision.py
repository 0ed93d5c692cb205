"""An image model at its largest supported resolution and batch (inference)."""

from __future__ import annotations

import torch
from torch import nn

import memtrack


def _convnet(width: int, classes: int) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        )

    return nn.Sequential(
        block(3, width),
        block(width, 2 * width),
        block(2 * width, 4 * width),
        block(4 * width, 8 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8 * width, classes),
    )


@memtrack.workload(params={"batch": 8, "resolution": 224, "width": 16, "dtype": "float32"})
def image_classify(ctx: memtrack.Context):
    """A convolutional classifier on a batch of the largest images it accepts."""
    p = ctx.params
    model = _convnet(p["width"], 1000).to(ctx.device, ctx.dtype).eval()
    ctx.mark(model)
    images = ctx.randn(p["batch"], 3, p["resolution"], p["resolution"])

    @torch.inference_mode()
    def step() -> torch.Tensor:
        return model(images).argmax(-1)

    return step
