"""Framework view: what the framework's allocator (CUDA) or tensor tracker (CPU) saw.

Both probes share one interface, so the worker runs CPU and CUDA cases alike:
`mark(objects)` reads the persistent set, `iteration()` wraps one measured iteration and
keeps its peak, `summary()` returns the figures for the Measurement.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

import torch


class FrameworkProbe(Protocol):
    name: str

    def mark(self, objects: tuple[Any, ...]) -> int: ...

    def iteration(self) -> contextlib.AbstractContextManager[None]: ...

    def summary(self) -> dict[str, Any]: ...

    def session_scope(self) -> contextlib.AbstractContextManager[None]: ...


def _category_tracker(sessions: int = 1) -> Any:
    """A tracker instance: one session, or several sessions in threads (see below)."""
    tracker = category_tracker_class()
    if sessions == 1:
        return tracker()
    return _shared_tracker_class(tracker)()


def category_tracker_class() -> type:
    """A MemTracker that tolerates a module called again in one session (a decode loop).

    Only the global peak by category is used here, so per-module statistics are reset
    instead of refused when a root module runs twice. Imported here, not at the top: a
    torch without MemTracker (before 2.5) then fails only what needs it, with this message.

    With several concurrent sessions (threads) the tracker's accounting is serialised by a
    lock, and its per-module tracking, which assumes one call stack, is replaced by one
    that only counts each module's parameters and buffers once (see `_SharedModules`).
    """
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as exc:
        raise RuntimeError(
            f"torch {torch.__version__} has no torch.distributed._tools.mem_tracker "
            "(torch >= 2.5 has it): no CPU framework view or category breakdown"
        ) from exc

    class CategoryTracker(MemTracker):
        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
            try:
                super()._pre_fw_hook(module, inputs)
            except NotImplementedError:
                self.reset_mod_stats()
                super()._pre_fw_hook(module, inputs)

        def _pre_bw_hook(self, module: Any, args: Any) -> None:
            if module in self.memory_tracking:
                super()._pre_bw_hook(module, args)

        def _post_bw_hook(self, module: Any, args: Any) -> None:
            if module in self.memory_tracking:
                super()._post_bw_hook(module, args)

    return CategoryTracker


def _shared_tracker_class(base: type) -> type:
    """`base` for sessions in threads: accounting under one lock, modules counted once."""

    class SharedTracker(base):  # type: ignore[valid-type,misc]
        # Threads update one tally: every method that reads and writes it holds the lock.
        # The ops themselves run outside it, so the sessions still overlap.
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.RLock()
            self._mod_tracker = _SharedModules(self)  # type: ignore[assignment]

        def _track(self, *args: Any) -> None:
            with self.lock:
                super()._track(*args)

        def _update_peak_stats(self, *args: Any) -> None:
            with self.lock:
                super()._update_peak_stats(*args)

        def _update_and_maybe_create_winfos(self, *args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return super()._update_and_maybe_create_winfos(*args, **kwargs)

        def _delete_callback(self, *args: Any) -> None:
            with self.lock:  # a storage freed in any thread
                super()._delete_callback(*args)

    return SharedTracker


class _SharedModules:
    """Stands in for MemTracker's module tracker when sessions run in threads.

    The module tracker keeps one stack of active modules, which interleaved threads would
    corrupt (and it refuses a root module entered twice). Only the global peak by category
    is used here, so no module is ever 'active' (no per-module peaks) and a module's
    parameters and buffers are counted when it first runs, as MemTracker does.
    """

    parents: frozenset[str] = frozenset()

    def __init__(self, tracker: Any):
        self.tracker = tracker
        self.seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self.handle: Any = None

    @property
    def is_bw(self) -> bool:
        return torch._C._current_graph_task_id() != -1

    def register_user_hooks(self, *hooks: Any) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def get_known_fqn(self, module: Any) -> None:
        return None

    def _forward(self, module: Any, inputs: Any) -> None:
        with self.tracker.lock:
            if module not in self.seen:
                self.seen.add(module)
                self.tracker._track_module_params_and_buffers(module, install_grad_hooks=True)

    def __enter__(self) -> _SharedModules:
        from torch.nn.modules.module import register_module_forward_pre_hook

        self.handle = register_module_forward_pre_hook(self._forward)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()


def trackable(objects: tuple[Any, ...]) -> list[Any]:
    return [o for o in objects if isinstance(o, (torch.nn.Module, torch.optim.Optimizer))]


class MemTrackerProbe:
    """CPU framework view: MemTracker's exact accounting of live tensor memory by category.

    Tensors the workload tags as caches are counted under MemTracker's 'Other' category
    (nothing else is registered as Other), so the peak snapshot holds the caches alive at
    the peak, each storage once, however the cache grows.
    """

    name = "memtracker"

    def __init__(self, device: torch.device, sessions: int = 1):
        self.device = device
        self.sessions = sessions
        self.tracker = _category_tracker(sessions)
        self.samples: list[int] = []
        self.peak_snapshot: dict[str, int] = {}
        self.tracked: list[Any] = []
        self.active = False

    def mark(self, objects: tuple[Any, ...]) -> int:
        self.tracked = trackable(objects)
        if self.tracked:
            self.tracker.track_external(*self.tracked)
        snap = self.tracker.get_tracker_snapshot("current").get(self.device, {})
        return int(snap.get("Total", 0))

    def tag(self, tensors: tuple[torch.Tensor, ...]) -> bool:
        """Count these tensors' storages as caches; False when no iteration is tracked."""
        if not self.active:
            return False
        try:
            from torch.distributed._tools.mem_tracker import _MemRefType

            for t in tensors:
                self.tracker._update_and_maybe_create_winfos(t, _MemRefType.OTH)
        except (ImportError, AttributeError):  # a tracker without it: count them apart
            return False
        return True

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        self.tracker.reset_mod_stats()
        # Again before every iteration: an optimizer's state is created lazily by its first
        # step (in the warm-up, after the mark), and tensors created outside the tracker are
        # otherwise never counted: the first measured iteration then read 8-27 % low.
        if self.tracked:
            self.tracker.track_external(*self.tracked)
        with self.tracker:  # entering resets the peak to the current total
            self.active = True
            try:
                yield
            finally:
                self.active = False
        snap = self.tracker.get_tracker_snapshot("peak")
        by_device = snap.get(self.device) or (next(iter(snap.values())) if snap else {})
        total = int(by_device.get("Total", 0))
        self.samples.append(total)
        if total >= max(self.samples):
            self.peak_snapshot = {str(getattr(k, "value", k)): int(v) for k, v in by_device.items()}

    @contextlib.contextmanager
    def session_scope(self) -> Iterator[None]:
        """Entered by each concurrent session's thread: the tracker, a dispatch mode, is
        per thread, so a measured iteration's sessions each push it onto their own stack."""
        if not self.active:
            yield
            return
        from torch.utils._python_dispatch import _pop_mode, _push_mode

        _push_mode(self.tracker)
        try:
            yield
        finally:
            _pop_mode()

    def summary(self) -> dict[str, Any]:
        cats = {k: v for k, v in self.peak_snapshot.items() if k != "Total"}
        # MemTracker files every tensor made inside optimizer.step() as Optstate, the step's
        # temporaries too. The state itself is what the optimizers hold (alive at the peak,
        # since it persists across steps): the rest of that figure is temporaries.
        state = _optimizer_state_bytes(self.tracked)
        if state is not None and cats.get("Optstate", 0) > state:
            cats["Temp"] = cats.get("Temp", 0) + cats["Optstate"] - state
            cats["Optstate"] = state
        return {
            "framework": self.name,
            "peak_allocated_bytes": max(self.samples) if self.samples else None,
            "allocated_samples": list(self.samples),
            "categories": cats,
        }


def _optimizer_state_bytes(objects: list[Any]) -> int | None:
    """Bytes of the tensors the optimizers among `objects` hold in their state, each storage
    once; None when there is no optimizer."""
    optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
    if not optimizers:
        return None
    storages: dict[int, int] = {}
    for opt in optimizers:
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    st = value.untyped_storage()
                    # the storage's identity: fake storages (estimates) have no data pointer
                    storages[st._cdata] = st.nbytes()
    return sum(storages.values())


NATIVE = "native"
"""PyTorch's own caching allocator: every counter below is kept."""


def allocator_backend() -> str:
    """'native' or 'cudaMallocAsync': the backend PYTORCH_ALLOC_CONF chose, as torch says."""
    return str(torch.cuda.get_allocator_backend())


def used_devices(device: torch.device) -> list[int]:
    """The CUDA devices the case uses: its own, and every other one with a primary context.
    The driver is asked without creating a context: under cudaMallocAsync, resetting a
    device's counters creates one there (0.3-0.5 GB of device memory, in every worker and
    every rank), and a device the case never touched has nothing to count."""
    own = device.index if device.index is not None else torch.cuda.current_device()
    return [i for i in range(torch.cuda.device_count())
            if i == own or torch._C._cuda_hasPrimaryContext(i)]  # type: ignore[attr-defined]


def counters(devices: list[int], backend: str) -> dict[str, int | None]:
    """num_alloc_retries and num_ooms summed over `devices` (an OOM on any device the case
    used is the case's); None where the backend keeps no such counter: cudaMallocAsync
    reports 0 whatever happened."""
    if backend != NATIVE:
        return {"num_alloc_retries": None, "num_ooms": None}
    stats = [torch.cuda.memory_stats(i) for i in devices]
    return {k: sum(int(st.get(k, 0)) for st in stats) for k in ("num_alloc_retries", "num_ooms")}


def device_entry(i: int, alloc: int, reserved: int) -> dict[str, Any]:
    """One device's allocator view, as the worker's result carries it (`cuda_devices`)."""
    props = torch.cuda.get_device_properties(i)
    return {
        "index": i,
        "uuid": device_uuid(props),
        "name": props.name,
        "total_bytes": int(props.total_memory),
        "peak_allocated_bytes": alloc,
        "peak_reserved_bytes": reserved,
        # after the memory pass: the quiet level the device view is read against
        "reserved_after_bytes": int(torch.cuda.memory_reserved(i)),
    }


def failure_figures() -> dict[str, Any]:
    """The allocator's figures when a case failed (an OOM's peak and num_ooms matter most),
    over every device it used."""
    backend = allocator_backend()
    devices = used_devices(torch.device("cuda", torch.cuda.current_device()))
    peaks = {i: (int(torch.cuda.max_memory_allocated(i)), int(torch.cuda.max_memory_reserved(i)))
             for i in devices}
    return {
        "framework": CudaAllocatorProbe.name,
        "allocator_backend": backend,
        "peak_allocated_bytes": max(a for a, _ in peaks.values()),
        "peak_reserved_bytes": max(r for _, r in peaks.values()),
        **counters(devices, backend),
        "cuda_devices": [device_entry(i, a, r) for i, (a, r) in peaks.items()],
    }


class CudaAllocatorProbe:
    """CUDA framework view: the caching allocator's exact counters, per iteration.

    `reset_peak_memory_stats` sets peak = current, so each iteration's peak includes the
    persistent set; the persistent set itself is read at the mark. Only the devices the
    case uses are asked (`used_devices`). Under cudaMallocAsync the requested bytes, the
    retries and the OOM count are not kept by the backend: they are None, not 0.
    """

    name = "cuda-caching-allocator"

    def __init__(self, device: torch.device):
        self.device = device
        self.backend = allocator_backend()
        self.samples: list[int] = []
        self.reserved: list[int] = []
        self.requested: list[int] = []
        self.per_device: dict[int, tuple[int, int]] = {}

    def mark(self, objects: tuple[Any, ...]) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def session_scope(self) -> contextlib.AbstractContextManager[None]:
        """The allocator's counters are process-wide: sessions need nothing of their own."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        for i in used_devices(self.device):
            torch.cuda.reset_peak_memory_stats(i)
        yield
        used = used_devices(self.device)  # a device first used in this iteration counts too
        for i in used:
            torch.cuda.synchronize(i)
        stats = torch.cuda.memory_stats(self.device)
        self.samples.append(int(stats.get("allocated_bytes.all.peak", 0)))
        self.reserved.append(int(stats.get("reserved_bytes.all.peak", 0)))
        if self.backend == NATIVE:
            self.requested.append(int(stats.get("requested_bytes.all.peak", 0)))
        for i in used:
            alloc, res = self.per_device.get(i, (0, 0))
            self.per_device[i] = (
                max(alloc, torch.cuda.max_memory_allocated(i)),
                max(res, torch.cuda.max_memory_reserved(i)),
            )

    def summary(self) -> dict[str, Any]:
        devices = sorted(self.per_device) or used_devices(self.device)
        return {
            "framework": self.name,
            "allocator_backend": self.backend,
            "peak_allocated_bytes": max(self.samples) if self.samples else None,
            "peak_reserved_bytes": max(self.reserved) if self.reserved else None,
            "peak_requested_bytes": max(self.requested) if self.requested else None,
            "allocated_samples": list(self.samples),
            **counters(devices, self.backend),
            "cuda_devices": [device_entry(i, *self.per_device[i])
                             for i in sorted(self.per_device)],
        }


def device_uuid(props: Any) -> str | None:
    """torch's UUID of a device, spelt as NVML spells a GPU's."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def category_breakdown(step: Any, device: torch.device, objects: tuple[Any, ...],
                       tagging: Any, sessions: int = 1) -> dict[str, int]:
    """One extra iteration under MemTracker, for the category breakdown on CUDA.
    `tagging(probe)` is a context in which the workload's cache tags reach this probe;
    with several `sessions`, `step` is the concurrent iteration (a `Sessions`), whose
    threads then enter this probe's scope."""
    probe = MemTrackerProbe(device, sessions)
    probe.mark(objects)
    previous = getattr(step, "scope", None)
    if previous is not None:
        step.scope = probe.session_scope
    try:
        with tagging(probe), probe.iteration():
            step()
    finally:
        if previous is not None:
            step.scope = previous
    torch.cuda.synchronize(device)
    return probe.summary()["categories"]
