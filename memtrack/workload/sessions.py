"""Concurrent sessions of a step: the `concurrency` param measured, not multiplied.

With `concurrency = N` one iteration is N sessions of the workload's step started together
(N threads released by one barrier), each on its own CUDA stream on a GPU, and the
iteration ends when all N are done. The weights are shared; whatever a step allocates for
its request (a KV cache, activations) exists once per session, for as long as the sessions
overlap: that peak is what serving N requests at once needs, and it is less than N x one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from memtrack.errors import WorkloadError

PARAM = "concurrency"
"""The reserved param name (like `dtype`): how many sessions of the step run at once."""


def concurrency(params: dict[str, Any]) -> int:
    """The case's concurrency (1 without the param); a value that is not a count is refused."""
    value = params.get(PARAM, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"param {PARAM}={value!r} must be a whole number of sessions, >= 1")
    return value


class Sessions:
    """Calling it runs `step` in `n` threads at once and returns when every one is done.

    `scope` is entered by each thread around its session (a tracker that must see the
    thread's tensors enters it there). An exception in any session is raised here, after
    every thread has ended; the barrier is broken so that no thread waits for ever.
    """

    def __init__(self, step: Callable[[], Any], n: int, device: Any,
                 scope: Callable[[], contextlib.AbstractContextManager[Any]] | None = None):
        self.step, self.n, self.device = step, n, device
        self.scope = scope or contextlib.nullcontext
        self.streams: list[Any] = [None] * n
        if device.type == "cuda":
            import torch

            self.streams = [torch.cuda.Stream(device) for _ in range(n)]

    def __call__(self) -> None:
        barrier = threading.Barrier(self.n)
        errors: list[BaseException] = []
        if self.device.type == "cuda":
            import torch

            current = torch.cuda.current_stream(self.device)
            for s in self.streams:
                s.wait_stream(current)  # what setup queued (the weights) comes first

        def session(stream: Any) -> None:
            try:
                with self.scope(), _on_stream(stream):
                    barrier.wait()
                    self.step()
            except threading.BrokenBarrierError:
                pass  # another session failed first: its error is the one to report
            except BaseException as exc:  # raised in the caller's thread below
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=session, args=(s,), name=f"memtrack-session-{i}")
                   for i, s in enumerate(self.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.device.type == "cuda":
            import torch

            current = torch.cuda.current_stream(self.device)
            for s in self.streams:
                current.wait_stream(s)  # the caller's synchronisation now covers every session
        if errors:
            raise errors[0]


@contextlib.contextmanager
def _on_stream(stream: Any) -> Any:
    if stream is None:
        yield
        return
    import torch

    with torch.cuda.stream(stream):
        yield
