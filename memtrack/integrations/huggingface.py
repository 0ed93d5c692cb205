"""A Hugging Face `transformers.Trainer` as a memtrack case:

    import memtrack
    from memtrack.integrations.huggingface import train_steps

    @memtrack.workload(params={"batch": 8, "precision": "bf16-mixed"})
    def fine_tune(ctx):
        args = TrainingArguments(
            output_dir=str(ctx.scratch_dir),
            per_device_train_batch_size=ctx["batch"],
            bf16=ctx.precision == "bf16-mixed",
            dataloader_num_workers=2,
            dataloader_persistent_workers=True,  # one set of workers for the whole case
        )
        trainer = Trainer(model=build_model(), args=args, train_dataset=dataset(ctx))
        return train_steps(ctx, trainer)

Each iteration of the case is one optimizer step of `trainer.train()` (a pause at
`on_step_end`); setup ends at `on_train_begin`, where the Trainer has made its optimizer and
scheduler, and the model and the optimizer are marked as the persistent set (the optimizer's
state, made by the first step, is counted from then on). `train()` runs for as many steps as
memtrack measures: `max_steps` is set past them, so a schedule that depends on it (a warm-up
ratio, a decay) stays at its start. Without `dataloader_persistent_workers`, each epoch's end
forks new workers inside an iteration, as the real job does. A Trainer that sees several
GPUs (it would wrap the model in DataParallel) is refused: a case is one process on one
device.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback

from memtrack.errors import WorkloadError
from memtrack.integrations import LOOP_STEPS, declared, drive
from memtrack.workload.context import Context
from memtrack.workload.driven import Driven

_TRUE = {"float32": "32-true", "bfloat16": "bf16-true", "float16": "16-true", "float64": "64-true"}


class PauseCallback(TrainerCallback):  # type: ignore[misc]
    """Pauses the Trainer's loop for memtrack at its begin and after each optimizer step."""

    def __init__(self, driven: Driven):
        self.driven = driven

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driven.pause()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driven.pause()


def precision(trainer: Trainer) -> str:
    """What the Trainer computes in, in the `precision` param's words: `*-mixed` is autocast
    over float32 weights; weights of another type are `*-true`, autocast or not."""
    model = trainer.model
    first = next(model.parameters(), None) if model is not None else None
    dtype = str(first.dtype).removeprefix("torch.") if first is not None else "float32"
    if dtype == "float32" and trainer.args.bf16:
        return "bf16-mixed"
    if dtype == "float32" and trainer.args.fp16:
        return "16-mixed"
    return _TRUE.get(dtype, "32-true")


def train_steps(ctx: Context, trainer: Trainer) -> Driven:
    """The case's step: one optimizer step of `trainer.train()` per call (see the module)."""
    declared(ctx, precision(trainer), "TrainingArguments bf16/fp16 and the model's dtype")
    if trainer.args.n_gpu > 1:  # it would wrap the model in DataParallel over them all
        raise WorkloadError(
            f"the Trainer sees {trainer.args.n_gpu} GPUs: a case measures one process on one "
            "device (make one visible, CUDA_VISIBLE_DEVICES, or use the `ranks` param)"
        )
    trainer.args.max_steps = LOOP_STEPS
    driven = drive(
        ctx, trainer.train, "trainer.train()", lambda d: trainer.add_callback(PauseCallback(d))
    )
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
    ctx.mark(trainer.model, optimizer)
    return driven


__all__ = ["PauseCallback", "precision", "train_steps"]
