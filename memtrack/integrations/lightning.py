"""A PyTorch Lightning `Trainer.fit()` as a memtrack case:

    import lightning as L
    import memtrack
    from memtrack.integrations.lightning import fit_steps

    @memtrack.workload(params={"batch": 8, "precision": "bf16-mixed"})
    def fit(ctx):
        trainer = L.Trainer(
            accelerator=ctx.device.type,
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
measures: its epoch and step limits are lifted.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from memtrack.integrations import declared, drive
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
    trainer.fit_loop.max_epochs = -1  # no limit: memtrack ends the loop
    trainer.fit_loop.epoch_loop.max_steps = -1
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
