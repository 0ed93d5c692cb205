"""Trainers as memtrack cases, without hand work: the workload builds its trainer and returns
what these make of it (`huggingface.train_steps`, `lightning.fit_steps`). The trainer's own
loop then runs in a thread of its own, one optimizer step per iteration of the case
(workload.driven): its DataLoader and the DataLoader's workers live on across iterations, and
the persistent set is marked once the loop has made its optimizer. Each framework is an
optional dependency, imported only by its module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memtrack.errors import WorkloadError
from memtrack.workload.context import Context
from memtrack.workload.driven import Driven

LOOP_STEPS = 1_000_000
"""The step limit a trainer is given: more optimizer steps than any case measures."""


def drive(
    ctx: Context, loop: Callable[[], Any], what: str, pauses: Callable[[Driven], None]
) -> Driven:
    """`loop` (the trainer's run, named `what`) started and paused at its begin: `pauses(d)`
    installs the framework's callback that calls `d.pause()`. Refused in an estimate: fake
    tensors are per thread, and the loop's thread would allocate real ones."""
    if ctx.fake:
        raise WorkloadError(
            f"{what} runs in a thread of its own, which an estimate's fake tensors do not "
            "follow: measure this case instead (memtrack run)"
        )
    driven = Driven(loop, what)
    pauses(driven)
    driven.start()
    return driven


def declared(ctx: Context, running: str, how: str) -> None:
    """The case's declared precision (its `precision` param) against the one the trainer
    runs (`running`, from `how`): a case that says otherwise is refused; one that says
    nothing gets a note where the trainer does not compute in float32."""
    if ctx.precision is not None and ctx.precision != running:
        raise WorkloadError(
            f"param precision={ctx.precision!r}, but the trainer runs {running} ({how}): "
            "build the trainer from the param"
        )
    if ctx.precision is None and running != "32-true":
        ctx.note(f"precision: the trainer runs {running}; declare it with the precision param")


__all__ = ["LOOP_STEPS", "declared", "drive"]
