"""A framework's own training loop as the case's step: one call, one optimizer step.

A trainer (`transformers.Trainer.train()`, `lightning.Trainer.fit()`) makes its optimizer,
its DataLoader and the DataLoader's worker processes inside its loop, and runs its callbacks
there. `Driven` runs that loop in a thread of its own and pauses it at the end of each
optimizer step (its callback calls `pause()`); each call of the step lets it run exactly one
more optimizer step and returns when that step has ended. The loop is never restarted: the
DataLoader's iterator, its workers and the optimizer's state live on from one iteration to
the next, as in the real job, and setup ends at the loop's first pause (the loop has made its
optimizer by then: `memtrack.integrations` marks it).

The loop's thread enters `scope()` around each step, as a concurrent session's thread does
(workload.sessions): memtrack's CPU tracker is a dispatch mode, which is per thread. Once
memtrack is done, `close()` ends the loop at its pause by raising `LoopClosed` there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from memtrack.errors import WorkloadError

CLOSE_WAIT_S = 60.0
"""How long `close()` waits for the loop to unwind (a daemon thread left running holds no
exit)."""


class LoopClosed(BaseException):
    """Raised in the loop's thread at its pause once memtrack is done with it: a
    BaseException, so that a framework's `except Exception` does not swallow it."""


class Driven:
    """`loop()` (a trainer's whole run) in a thread of its own, one optimizer step per call.

    `what` names the loop in errors ("trainer.train()"). `start()` runs it up to its first
    pause; each call then runs it to the next. An exception in the loop is raised by the call
    that was waiting for it; a loop that ends while memtrack still calls is an error that
    says how many steps it ran."""

    def __init__(self, loop: Callable[[], Any], what: str):
        self.loop, self.what = loop, what
        self.scope: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        """Entered by the loop's thread around each step (memtrack sets it)."""
        self.steps = 0
        """Optimizer steps run by calls so far."""
        self._go = threading.Semaphore(0)
        self._paused = threading.Semaphore(0)
        self._entered: contextlib.AbstractContextManager[Any] | None = None
        self._error: BaseException | None = None
        self._ended = False
        self._closing = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="memtrack-loop")

    def start(self) -> None:
        """Run the loop until its first pause (the trainer's begin: its optimizer exists)."""
        self.thread.start()
        self._paused.acquire()
        self._raise("before its first pause")

    def pause(self) -> None:
        """Called by the framework's callback in the loop's thread: at the loop's begin, and
        at the end of each optimizer step. Returns when the next call lets the loop go on.
        Outside the thread `Driven` runs (the callback in a loop memtrack does not drive),
        nothing."""
        if threading.current_thread() is not self.thread:
            return
        self._leave_scope()
        self._paused.release()
        self._go.acquire()
        if self._closing:
            raise LoopClosed
        entered = self.scope()
        entered.__enter__()
        self._entered = entered

    def __call__(self) -> None:
        if self._closing:
            raise RuntimeError(f"{self.what} was closed")
        if self._ended:
            self._raise(f"after {self.steps} optimizer steps")
        self._go.release()
        self._paused.acquire()
        self._raise(f"after {self.steps} optimizer steps")
        self.steps += 1

    def _raise(self, when: str) -> None:
        """The loop's error, where it failed; a loop that returned is an error too."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._ended:
            raise WorkloadError(
                f"{self.what} ended {when}, while memtrack still measured: let it run "
                "longer than the case's warm-up, timing and memory passes"
            )

    def _run(self) -> None:
        try:
            self.loop()
        except LoopClosed:
            pass
        except BaseException as exc:  # raised by the call that waits for it
            self._error = exc
        finally:
            self._leave_scope()
            self._ended = True
            self._paused.release()

    def _leave_scope(self) -> None:
        entered, self._entered = self._entered, None
        if entered is not None:
            entered.__exit__(None, None, None)

    def close(self) -> None:
        """End the loop at its pause (idempotent)."""
        if self._closing or not self.thread.is_alive():
            return
        self._closing = True
        self._go.release()
        self.thread.join(CLOSE_WAIT_S)


__all__ = ["CLOSE_WAIT_S", "Driven", "LoopClosed"]
