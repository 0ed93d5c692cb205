"""A PyTorch Lightning `Trainer.fit()` as a memtrack case:

    import lightning as L
    import memtrack
    from memtrack.integrations.lightning import fit_steps

    @memtrack.workload(params={"batch": 8, "precision": "bf16-mixed"})
    def fit(ctx):
        trainer = L.Trainer(
            accelerator=ctx.device.type,
            devices=[ctx.device.index] if ctx.device.type == "cuda" else 1,
            precision=ctx.precision,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
        )
        loader = DataLoader(dataset(ctx), batch_size=ctx["batch"], num_workers=2,
                            persistent_workers=True)
        return fit_steps(ctx, trainer, Model(), train_dataloaders=loader)

Each iteration of the case is one optimizer step of `trainer.fit()` (a pause at the end of
the training batch that stepped the optimizer); setup ends at `on_train_start`, where
Lightning has made the optimizers (and run its sanity check), and the module and the
optimizers are marked as the persistent set. `fit()` runs for as many steps as memtrack
measures: its epochs are not limited, and its steps are limited far past them, so a
schedule sized by `estimated_stepping_batches` (OneCycleLR) stays at its start. It runs on
one device: a Trainer on several is refused (a multi-device case is the `ranks` param's).
"""

from __future__ import annotations

from typing import Any

import lightning as L

from memtrack.errors import WorkloadError
from memtrack.integrations import LOOP_STEPS, declared, drive
from memtrack.workload.context import Context
from memtrack.workload.driven import Driven


class PauseCallback(L.Callback):  # type: ignore[misc]
    """Pauses Lightning's loop for memtrack at its start and after each optimizer step."""

    def __init__(self, driven: Driven):
        self.driven = driven
        self.steps = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.steps = trainer.global_step
        self.driven.pause()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        if trainer.global_step != self.steps:  # this batch stepped the optimizer
            self.steps = trainer.global_step
            self.driven.pause()


def fit_steps(ctx: Context, trainer: L.Trainer, model: L.LightningModule, **fit: Any) -> Driven:
    """The case's step: one optimizer step of `trainer.fit(model, **fit)` per call (see the
    module)."""
    declared(ctx, str(trainer.precision), "the Trainer's precision")
    if trainer.num_devices > 1:  # its launcher would start the worker again, once per device
        raise WorkloadError(
            f"the Trainer runs on {trainer.num_devices} devices: a case measures one process "
            "on one device (devices=1, or the `ranks` param for several)"
        )
    # epochs without limit, steps past the case (a schedule sized by
    # estimated_stepping_batches gets a finite count); memtrack ends the loop
    trainer.fit_loop.max_epochs = -1
    trainer.fit_loop.epoch_loop.max_steps = LOOP_STEPS
    driven = drive(
        ctx,
        lambda: trainer.fit(model, **fit),
        "trainer.fit()",
        # set by Lightning's callback connector at init, undeclared on the class
        lambda d: trainer.callbacks.append(PauseCallback(d)),  # type: ignore[attr-defined]
    )
    ctx.mark(model, *trainer.optimizers)
    return driven


__all__ = ["PauseCallback", "fit_steps"]
