"""Concurrent sessions of a step: the `concurrency` param measured, not multiplied.

With `concurrency = N` one iteration is N sessions of the workload's step started together
(N threads released by one barrier), each on its own CUDA stream on a GPU, and the
iteration ends when all N are done. The weights are shared; whatever a step allocates for
its request (a KV cache, activations) exists once per session, for as long as the sessions
overlap: that peak is what serving N requests at once needs, and it is less than N x one.

The N threads are made once per case and serve every iteration (warm-up, timing and memory
pass alike), each bound to its stream for its whole life. torch keeps one cuBLAS workspace
per (handle, stream) pair, allocated through the caching allocator (32 MiB each on Hopper),
and a handle belongs to a thread: a thread that exits returns it to a pool from which the
next thread takes any. New threads in every iteration therefore made new pairs, each a new
workspace, and allocated grew from one iteration to the next.
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
    """Calling it runs `step` once in each of `n` session threads at once and returns when
    every one is done. The threads start with the object and serve every call; `close()`
    ends them (they are daemon threads: a process that exits without it is not held).

    `scope` is entered by each thread around its session, in every call (a tracker that must
    see the thread's tensors enters it there; it may be replaced between calls). An
    exception in any session is raised here, after every session of the call has ended; the
    sessions' common start is then broken, so that no thread waits for one that failed.
    """

    def __init__(
        self,
        step: Callable[[], Any],
        n: int,
        device: Any,
        scope: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ):
        self.step, self.n, self.device = step, n, device
        self.scope = scope or contextlib.nullcontext
        self.streams: list[Any] = [None] * n
        if device.type == "cuda":
            import torch

            self.streams = [torch.cuda.Stream(device) for _ in range(n)]
        # The caller and the n threads meet at `_go` (a call begins) and `_done` (it ended);
        # the n sessions meet at `_start`, inside their scopes, to begin the step together.
        self._go = threading.Barrier(n + 1)
        self._start = threading.Barrier(n)
        self._done = threading.Barrier(n + 1)
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._closed = False
        self._alone = False  # a call by `solo`: the first session only
        self.threads = [
            threading.Thread(
                target=self._serve, args=(i, s), daemon=True, name=f"memtrack-session-{i}"
            )
            for i, s in enumerate(self.streams)
        ]
        for t in self.threads:
            t.start()

    def _serve(self, index: int, stream: Any) -> None:
        try:
            _bind(self.device, stream)
            unbound: BaseException | None = None
        except BaseException as exc:  # said at every call, raised by the caller
            unbound = exc
        try:
            while True:
                self._go.wait()
                if self._closed:
                    return
                alone = self._alone
                if not alone or index == 0:  # a call by `solo` is the first session's
                    self._session(unbound, together=not alone)
                self._done.wait()
        except threading.BrokenBarrierError:
            return  # abandoned: a session run alone did not end (see `solo`)

    def _session(self, unbound: BaseException | None, *, together: bool) -> None:
        try:
            if unbound is not None:
                raise unbound
            with self.scope():
                if together:
                    self._start.wait()
                self.step()
        except threading.BrokenBarrierError:
            pass  # another session failed first: its error is the one to report
        except BaseException as exc:
            with self._lock:
                self._errors.append(exc)
            self._start.abort()

    def __call__(self) -> None:
        self._call(None)

    def _call(self, timeout_s: float | None) -> bool:
        """One call; False when the sessions did not end within `timeout_s`."""
        if self._closed:
            raise RuntimeError("the sessions were closed")
        if self.device.type == "cuda":
            import torch

            current = torch.cuda.current_stream(self.device)
            for s in self.streams:
                s.wait_stream(current)  # what setup queued (the weights) comes first
        self._go.wait()
        try:
            self._done.wait(timeout_s)
        except threading.BrokenBarrierError:
            self._abandon()
            return False
        if self.device.type == "cuda":
            for s in self.streams:
                current.wait_stream(s)  # the caller's synchronisation now covers every session
        errors, self._errors = self._errors, []
        if self._start.broken:
            self._start.reset()
        if errors:
            raise errors[0]
        return True

    def solo(self, timeout_s: float | None = None) -> bool:
        """Run the step once in the first session alone: in its thread, on its stream, with
        its cuBLAS handle and workspace, so that one session's figures are read beside the
        concurrent ones without a workspace no session has (the caller's thread would make
        one for its own handle and stream). False when it did not end within `timeout_s`:
        a session that waits for the others (at a barrier, as overlapping requests are
        written) never ends alone. It is then left waiting and the sessions are closed."""
        self._alone = True
        try:
            return self._call(timeout_s)
        finally:
            self._alone = False

    def _abandon(self) -> None:
        """Close without waiting for a session that does not end: the other threads leave
        at their next barrier, the waiting one stays (a daemon thread holds no exit)."""
        self._closed = True
        self._go.abort()
        self._done.abort()

    def close(self) -> None:
        """End the session threads (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._go.wait()
        for t in self.threads:
            t.join()

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _bind(device: Any, stream: Any) -> None:
    """This thread's device and current stream, once for its life (both are per thread)."""
    if stream is None:
        return
    import torch

    torch.cuda.set_device(device)
    torch.cuda.set_stream(stream)
