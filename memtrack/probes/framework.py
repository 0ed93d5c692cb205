"""Framework view: what the framework's allocator (CUDA) or tensor tracker (CPU) saw.

Both probes share one interface, so the worker runs CPU and CUDA cases alike:
`mark(objects)` reads the persistent set, `iteration()` wraps one measured iteration and
keeps its peak, `summary()` returns the figures for the Measurement.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from memtrack.probes import packed
from memtrack.probes.allocator import ThreadEvents, cpu_allocator_events, highest_running_sum
from memtrack.probes.packed import Packed


class FrameworkProbe(Protocol):
    name: str
    samples: list[int]
    """Each measured iteration's peak."""
    levels: list[int]
    """The level each measured iteration started from."""
    retained: list[int]
    """What each measured iteration left allocated at its end, after a collection."""

    def mark(self, objects: tuple[Any, ...]) -> int: ...

    def iteration(self) -> contextlib.AbstractContextManager[None]: ...

    def summary(self) -> dict[str, Any]: ...

    def session_scope(self) -> contextlib.AbstractContextManager[None]: ...

    def prime(self, step: Any) -> None: ...

    def priming(self) -> contextlib.AbstractContextManager[None]: ...


def _category_tracker() -> Any:
    """A tracker for the probe: one session or several in threads (see `_probe_tracker_class`)."""
    return _probe_tracker_class(category_tracker_class())()


def category_tracker_class() -> type:
    """A MemTracker that tolerates a module called again in one session (a decode loop):
    only the global peak by category is used here, so per-module statistics are reset
    instead of refused when a root module runs twice (the probe's tracker,
    `_probe_tracker_class`, replaces them; `memtrack snapshot`'s keeps them for its table).
    Tensors alive when an iteration starts that are no parameter, buffer, gradient,
    optimizer state or tagged cache (the input batch) count as `INPUT` ("Input"). Imported
    here: a torch without MemTracker (before 2.5) fails only what needs it."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    except ImportError as exc:
        raise RuntimeError(
            f"torch {torch.__version__} has no torch.distributed._tools.mem_tracker "
            "(torch >= 2.5 has it): no CPU framework view or category breakdown"
        ) from exc

    class CategoryTracker(MemTracker):
        """Also keeps, for the tags' sake, when each storage was counted and dropped and
        when the peak was reached, in one sequence of the tracker's own updates."""

        def __init__(self) -> None:
            super().__init__()
            # the snapshot's keys: MemTracker's categories, and the tensors held from setup
            self._ref_class = (*_MemRefType, input_category())  # type: ignore[assignment]
            self.seq = 0
            self.peak_seq: dict[Any, int] = {}
            self.tags: dict[int, tuple[Any, int, Any]] = {}
            """id(winfo) -> (winfo, the update at its first tag, its category before it)."""

        def _update_snap(self, u_type: Any, winfo: Any, *args: Any, **kwargs: Any) -> None:
            self.seq += 1
            name = getattr(u_type, "name", str(u_type))
            if name == "ADD":
                winfo.memtrack_born = self.seq
            elif name == "DEL":
                winfo.memtrack_died = self.seq
            super()._update_snap(u_type, winfo, *args, **kwargs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            for dev, peak in self._peak_mem.items():
                if peak > before.get(dev, -1):
                    self.peak_seq[dev] = self.seq

        def tag(self, tensor: torch.Tensor, category: Any) -> None:
            """Count `tensor`'s storages as `category` from now on, and remember the first
            tag of each, so that a storage tagged after the peak can count at the peak."""
            _tag(self, tensor, category)

        def tagged_at_peak(self, device: Any, category: Any) -> dict[Any, int]:
            """Bytes to move to `category` in the peak snapshot of `device`, by the category
            they had there: storages tagged after the peak that were alive at it."""
            return _tagged_at_peak(self, device, category)

        def _track_module_params_and_buffers(
            self, module: Any, install_grad_hooks: bool = True
        ) -> tuple[int, int]:
            """MemTracker's, gradient hooks on trainable parameters only (`_hook_trainable`)."""
            counted = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                _hook_trainable(self, module)
            return counted  # type: ignore[no-any-return]

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


def _hook_trainable(tracker: Any, module: Any) -> None:
    """MemTracker's two gradient hooks (the gradient as it is made, and once accumulated) on
    each of `module`'s parameters that requires a gradient and has none yet, kept where
    MemTracker removes them when it exits (torch 2.5 to 2.14 alike). torch's own registers
    one on every parameter, and a frozen one (a LoRA fine-tune's base weights, a model served
    with `requires_grad_(False)`) raises "cannot register a hook on a tensor that doesn't
    require gradient"."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    def count(grad: torch.Tensor | None) -> None:
        if grad is not None:
            tracker._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

    handles = tracker._param_to_grad_hook_handles
    for param in module.parameters():
        if param.requires_grad and handles.get(param) is None:
            handles[param] = (
                param.register_hook(count),
                param.register_post_accumulate_grad_hook(lambda p: count(p.grad)),
            )


def _tag(tracker: Any, tensor: torch.Tensor, category: Any) -> None:
    """CategoryTracker.tag: each storage's category before its first tag, and when."""
    from torch.distributed._tools.common_utils import get_untyped_storages

    storages = get_untyped_storages(tensor)
    before = {
        id(st): (tracker._WINFO[st][0].reftype if st in tracker._WINFO else None) for st in storages
    }
    tracker._update_and_maybe_create_winfos(tensor, category)
    for st in storages:
        winfo = tracker._WINFO[st][0]
        tracker.tags.setdefault(id(winfo), (winfo, tracker.seq, before[id(st)]))


def _tagged_at_peak(tracker: Any, device: Any, category: Any) -> dict[Any, int]:
    """CategoryTracker.tagged_at_peak: the storages tagged after the peak that were alive at
    it, by the category they had there."""
    at = tracker.peak_seq.get(device)
    moves: dict[Any, int] = {}
    if at is None:
        return moves
    for winfo, tagged, before in tracker.tags.values():
        born = getattr(winfo, "memtrack_born", None)
        died = getattr(winfo, "memtrack_died", None)
        alive = born is not None and born <= at and (died is None or died > at)
        if (
            alive
            and tagged > at
            and before is not None
            and before != category
            and winfo.device == device
        ):
            moves[before] = moves.get(before, 0) + winfo.mem_consumed
    return moves


_INPUT: Any = None


def input_category() -> Any:
    """The tracker's category for tensors held from setup that no other category names:
    'Input', as PyTorch's memory profiler calls an input batch."""
    global _INPUT
    if _INPUT is None:
        from torch.distributed._tools.mem_tracker import _RefType

        class _Held(_RefType):
            INPUT = "Input"

        _INPUT = _Held.INPUT
    return _INPUT


def _probe_tracker_class(base: type) -> type:
    """`base` as the probe uses it: accounting under one lock, modules counted once.

    MemTracker's module tracker registers a hook on each module's outputs for its backward
    statistics; with autograd on, those hooks kept every recorded graph alive, even through
    a collection, so that each repeat of a training-free step that returns a loss started
    2.5 MB higher than the last (a three-layer attention block). Only the global peak by
    category is used here, so `_SharedModules` stands in for it: no hooks on outputs, and
    forward or backward told apart by autograd's own state. Concurrent sessions (threads)
    update one tally: every method that reads and writes it holds the lock, while the ops
    themselves run outside it, so that the sessions still overlap."""

    class SharedTracker(base):  # type: ignore[valid-type,misc]
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
    """Stands in for MemTracker's module tracker (see `_probe_tracker_class`).

    The module tracker keeps one stack of active modules, which interleaved threads would
    corrupt (and it refuses a root module entered twice), and hooks each module's outputs.
    Only the global peak by category is used here, so no module is ever 'active' (no
    per-module peaks) and a module's parameters and buffers are counted when it first runs,
    as MemTracker does.
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

        # The tracker removes its gradient hooks when it exits: each entry installs them anew.
        self.seen = weakref.WeakSet()
        self.handle = register_module_forward_pre_hook(self._forward)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()


def live_tensors(device: torch.device) -> Iterator[torch.Tensor]:
    """Every tensor on `device` that the garbage collector finds alive (what the interpreter
    held before a case, frozen by the worker, is not walked)."""
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.device == device:
            yield obj


@contextlib.contextmanager
def pushed(mode: Any) -> Iterator[None]:
    """A dispatch mode on this thread's mode stack for the block: the way a mode enters
    several threads at once (its own `with` keeps one thread's state on the object)."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode

    _push_mode(mode)
    try:
        yield
    finally:
        _pop_mode()


def trackable(objects: tuple[Any, ...]) -> list[Any]:
    """What the tracker counts of what `ctx.mark` was given: modules, optimizers, and
    tensors built in setup (the persistent set, as the CUDA allocator counts it; a tensor
    that is no parameter counts as an input)."""
    return [
        o for o in objects if isinstance(o, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor))
    ]


class MemTrackerProbe:
    """CPU framework view: every live tensor at each iteration's peak, by category.

    The peak is the CPU allocator's (`allocator=True`, the measured CPU view): the level at
    the iteration's start plus the highest running sum of the allocations and frees that
    torch's profiler reports within it, so that scratch a kernel allocates inside itself
    (SDPA's buffers) is counted, which no tensor tracker sees. The level is every live
    tensor on the device, as CUDA's allocated counts them: the tracker's, and any other
    that the garbage collector finds alive (an input batch, a plain attribute made in
    setup), counted as 'Input'. The breakdown by category is MemTracker's, at its own peak;
    what the allocator held beyond it is unattributed. Without `allocator` (estimates under
    fake tensors, and the CUDA breakdown) the figure is the tracker's.

    Concurrent sessions run in threads of their own, which torch's profiler does not follow:
    each session's thread records its allocations apart (`session_scope`), and the
    iteration's running sum is read over all of them in time order.

    Tensors the workload tags as caches are counted under MemTracker's 'Other' category
    (nothing else is registered as Other), each storage once, however the cache grows; a
    storage tagged at any time during the iteration that was alive at the peak counts as
    cache at the peak (a cache built inside the model's forward is tagged after it). Where
    every tag of the peak's iteration came after its peak, a note says so.
    """

    name = "memtracker"

    def __init__(
        self,
        device: torch.device,
        sessions: int = 1,
        *,
        allocator: bool = False,
        only_fake: bool = False,
        fake_mode: Any = None,
    ):
        self.device = device
        self.sessions = sessions
        self.tracker = _category_tracker()
        self.allocator = allocator
        self.only_fake = only_fake
        """Count only fake tensors as held (an estimate: real ones are its own machinery)."""
        self.fake_mode = fake_mode
        """The estimate's FakeTensorMode: its fake tensors alone are the case's (torch.compile
        traces with fake copies of the weights of a mode of its own)."""
        self.samples: list[int] = []
        self.tracker_samples: list[int] = []
        self.levels: list[int] = []
        """The level each iteration started from (what its peak is the rise above)."""
        self.retained: list[int] = []
        """What each iteration left allocated at its end: its allocations less its frees."""
        self.peak_snapshot: dict[str, int] = {}
        self.late_tags = False
        """Whether every cache tag of the peak's iteration came after its peak, and no
        storage they tagged was alive at it (caches at the peak then read 0 B)."""
        self.tracked: list[Any] = []
        self.active = False
        self.primed = False
        self._threads: ThreadEvents | None = None
        """The session threads' allocations while a concurrent iteration is recorded."""
        self.marked = 0
        """The tracked total at the mark: the persistent set's tensors."""
        self.packed: Packed | None = None
        """The quantized modules' packed weights (probes.packed), measured at the first
        iteration's end; None without any."""
        self._packed_read = False
        self._claimed: dict[Any, int] = {}
        """Bytes moved to parameters by `_claim`, by their category before."""

    def mark(self, objects: tuple[Any, ...]) -> int:
        gc.collect()  # what setup left in reference cycles is garbage, not the persistent set
        self.tracked = trackable(objects)
        self._track_marked()
        self._track_held()
        self.marked = self._current_total()
        return self.marked

    def packed_bytes(self) -> int:
        """The bytes of the marked modules' packed weights (0 without any, or where they
        could not be measured: a note says so), measured once, after an iteration: never
        inside one, and after the host view's figures (the copy is made and dropped)."""
        if not self._packed_read:
            self._packed_read = True
            if self.device.type == "cpu" and not self.only_fake:
                self.packed = packed.measure(tuple(self.tracked), self._claim)
        return (self.packed.nbytes or 0) if self.packed is not None else 0

    def _claim(self, tensor: torch.Tensor) -> int:
        """`packed.measure`'s claim: the bytes of `tensor` the tracker counts (a packed
        object's tensor that Python holds too, found live at the mark as an input), filed
        as parameters from now on; the iteration being read moves them too (`_claimed`)."""
        from torch.distributed._tools.common_utils import get_untyped_storages
        from torch.distributed._tools.mem_tracker import _MemRefType

        counted = 0
        with self.tracker.lock:
            for st in get_untyped_storages(tensor):
                entry = self.tracker._WINFO.get(st)
                if entry is None:
                    continue
                winfo = entry[0]
                if winfo.reftype != _MemRefType.PARAM:
                    self._claimed[winfo.reftype] = (
                        self._claimed.get(winfo.reftype, 0) + winfo.mem_consumed
                    )
                    self.tracker._update_and_maybe_create_winfos(tensor, _MemRefType.PARAM)
                counted += winfo.mem_consumed
        return counted

    def _track_marked(self) -> None:
        others = [o for o in self.tracked if not isinstance(o, torch.Tensor)]
        if others:
            self.tracker.track_external(*others)
        for t in self.tracked:
            if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
                self.tracker._update_and_maybe_create_winfos(t, input_category())
        if others:
            from torch.distributed._tools.mem_tracker import _MemRefType

            # a quantized weight's scales and codes (bitsandbytes), kept beside its data
            for t in packed.attached_tensors(tuple(others)):
                self.tracker._update_and_maybe_create_winfos(t, _MemRefType.PARAM)

    def _track_held(self) -> None:
        """Every live tensor on the device that the tracker does not know yet, as 'Input':
        the collector finds each one the workload holds from Python, however."""
        from torch.distributed._tools.common_utils import get_untyped_storages

        known, held = self.tracker._WINFO, input_category()
        fake = _fake_check()
        for obj in live_tensors(self.device):
            # Under an estimate only fake tensors are the case's; measured, a fake tensor
            # holds no memory (torch.compile keeps fake copies of the weights it traced).
            if fake(obj) != self.only_fake:
                continue
            if self.fake_mode is not None and getattr(obj, "fake_mode", None) is not self.fake_mode:
                continue
            try:
                storages = get_untyped_storages(obj)
            except (RuntimeError, NotImplementedError):  # no storage (sparse, nested, ...)
                continue
            if storages and not any(st in known for st in storages):
                self.tracker._update_and_maybe_create_winfos(obj, held)

    def tag(self, tensors: tuple[torch.Tensor, ...]) -> bool:
        """Count these tensors' storages as caches; False when no iteration is tracked."""
        if not self.active:
            return False
        try:
            from torch.distributed._tools.mem_tracker import _MemRefType

            with self.tracker.lock:
                for t in tensors:
                    self.tracker.tag(t, _MemRefType.OTH)
        except (ImportError, AttributeError):  # a tracker without it: count them apart
            return False
        return True

    def prime(self, step: Any) -> None:
        """One unmeasured iteration under the profiler before the first measured one. The
        profiler knows the size of a block only if it saw it allocated: a block made in the
        uninstrumented timing pass and freed in a measured iteration (last step's gradients)
        would be missed, and the running sum read high after it."""
        if self.allocator and not self.primed:
            with self.priming():
                step()

    @contextlib.contextmanager
    def priming(self) -> Iterator[None]:
        """`prime`'s context, for a step run in another thread (it starts the profiler in
        the thread that enters it, as `iteration` does); the session threads record too."""
        if not self.allocator or self.primed:
            yield
            return
        with self._events():
            yield
        self.primed = True

    @contextlib.contextmanager
    def _events(self) -> Iterator[list[int]]:
        """The allocations and frees of this thread, and of every thread that enters
        `session_scope` meanwhile (concurrent sessions, a trainer's loop), in time order,
        filled in when the block ends."""
        threads = ThreadEvents()
        self._threads = threads  # concurrent sessions', or a trainer's loop's, thread too
        try:
            with cpu_allocator_events(threads) as recorded:
                yield recorded
        finally:
            self._threads = None

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        # What the last iteration left in reference cycles is freed before the level is read.
        gc.collect()
        self.tracker.reset_mod_stats()
        self.tracker.tags.clear()
        # Again before every iteration: an optimizer's state is created lazily by its first
        # step (in the warm-up, after the mark), and tensors created outside the tracker are
        # otherwise never counted: the first measured iteration then read 8-27 % low.
        self._track_marked()
        self._track_held()
        level = self._current_total()
        events = self._events() if self.allocator else contextlib.nullcontext(None)
        with self.tracker:  # entering resets the peak to the current total
            with events as recorded:
                self.active = True
                try:
                    yield
                    # Inside the window: a graph held in a reference cycle is freed, and
                    # counted, before it closes, so that what the iteration retained is
                    # what it left alive. Frees only lower the running sum: the peak stands.
                    gc.collect()
                finally:
                    self.active = False
        self._read(level, recorded)

    def _read(self, level: int, recorded: list[int] | None) -> None:
        """The iteration's figures, from the tracker's peak snapshot and the allocator's
        events."""
        from torch.distributed._tools.mem_tracker import _MemRefType

        snap = self.tracker.get_tracker_snapshot("peak")
        device = self.device if self.device in snap else next(iter(snap), self.device)
        by_device = dict(snap.get(device, {}))
        moved = self.tracker.tagged_at_peak(device, _MemRefType.OTH)
        for before, nbytes in moved.items():
            by_device[before] = by_device.get(before, 0) - nbytes
            by_device[_MemRefType.OTH] = by_device.get(_MemRefType.OTH, 0) + nbytes
        # Packed weights (quantized modules) are no tensor: held throughout, they raise the
        # level, and the peak with it, by their bytes.
        held = self.packed_bytes()
        for before, nbytes in self._claimed.items():  # persistent: alive at the peak
            by_device[before] = by_device.get(before, 0) - nbytes
            by_device[_MemRefType.PARAM] = by_device.get(_MemRefType.PARAM, 0) + nbytes
        self._claimed = {}
        if held:
            by_device[packed.CATEGORY] = held
            by_device["Total"] = by_device.get("Total", 0) + held
        level += held
        tracked = int(by_device.get("Total", 0))
        total = tracked
        if recorded is not None:
            total = max(tracked, level + highest_running_sum(recorded))
        self.tracker_samples.append(tracked)
        self.samples.append(total)
        self.levels.append(level)
        self.retained.append(
            sum(recorded) if recorded is not None else self._current_total() - level
        )
        if total >= max(self.samples):
            self.peak_snapshot = {str(getattr(k, "value", k)): int(v) for k, v in by_device.items()}
            self.peak_snapshot["Total"] = total
            self.late_tags = not moved and self._tags_after_peak(device)

    def _tags_after_peak(self, device: Any) -> bool:
        """Whether this iteration tagged caches, each of them only after its peak."""
        at = self.tracker.peak_seq.get(device)
        tagged = [seq for _, seq, _ in self.tracker.tags.values()]
        return at is not None and bool(tagged) and min(tagged) > at

    def _current_total(self) -> int:
        snap = self.tracker.get_tracker_snapshot("current")
        return int(snap.get(self.device, {}).get("Total", 0))

    @contextlib.contextmanager
    def session_scope(self) -> Iterator[None]:
        """Entered by each concurrent session's thread: the tracker, a dispatch mode, is
        per thread, so a measured iteration's sessions each push it onto their own stack;
        and each records its allocations while the iteration's events are read."""
        threads = self._threads
        recording = threads.record() if threads is not None else contextlib.nullcontext()
        with pushed(self.tracker) if self.active else contextlib.nullcontext(), recording:
            yield

    def summary(self) -> dict[str, Any]:
        cats = {k: v for k, v in self.peak_snapshot.items() if k != "Total"}
        # MemTracker files every tensor made inside optimizer.step() as Optstate, the step's
        # temporaries too. The state itself is what the optimizers hold (alive at the peak,
        # since it persists across steps): the rest of that figure is temporaries.
        state = _optimizer_state_bytes(self.tracked)
        if state is not None and cats.get("Optstate", 0) > state:
            cats["Temp"] = cats.get("Temp", 0) + cats["Optstate"] - state
            cats["Optstate"] = state
        held = self.packed_bytes()
        return {
            **({"persistent_bytes": self.marked + held} if held else {}),
            "framework": "cpu-allocator" if self.allocator else self.name,
            "peak_allocated_bytes": max(self.samples) if self.samples else None,
            "allocated_samples": list(self.samples),
            "retained_samples": list(self.retained),
            "categories": cats,
        }

    @property
    def notes(self) -> list[str]:
        """What a reader of the figures must know (the worker adds them to the case's)."""
        notes = [packed.note(self.packed)] if self.packed is not None else []
        if not self.late_tags:
            return notes
        return [
            *notes,
            "caches: every cache tag of the peak's iteration came after its peak, and no "
            "storage it tagged was alive at the peak: caches at the peak read 0 B (tag a "
            "cache where it is made); the largest tagged cache is recorded apart",
        ]


def _fake_check() -> Any:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake


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
    return [
        i
        for i in range(torch.cuda.device_count())
        if i == own or torch._C._cuda_hasPrimaryContext(i)  # type: ignore[attr-defined]
    ]


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
    peaks = {
        i: (int(torch.cuda.max_memory_allocated(i)), int(torch.cuda.max_memory_reserved(i)))
        for i in devices
    }
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

    A process may use several GPUs (a model spread over them). Devices do not pool: each
    iteration's allocated, reserved and requested peaks are the largest per-device peaks,
    as a multi-rank case's are, and the persistent set and the level an iteration starts
    from are those of the device that holds the allocated peak (`peak_device`).
    """

    name = "cuda-caching-allocator"

    def __init__(self, device: torch.device):
        self.device = device
        self.backend = allocator_backend()
        self.samples: list[int] = []
        self.reserved: list[int] = []
        self.requested: list[int] = []
        self.levels: list[int] = []
        self.retained: list[int] = []
        self.per_device: dict[int, tuple[int, int]] = {}
        self.marked: dict[int, int] = {}
        """What each device used held at the mark: the persistent set, per device."""

    @property
    def own(self) -> int:
        """The case's own device's index."""
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def mark(self, objects: tuple[Any, ...]) -> int:
        gc.collect()  # what setup left in reference cycles is garbage, not the persistent set
        for i in used_devices(self.device):
            torch.cuda.synchronize(i)
            self.marked[i] = int(torch.cuda.memory_allocated(i))
        return self.marked[self.own]

    def peak_device(self) -> torch.device:
        """The device that holds the largest allocated peak so far (the case's own before
        any iteration, and on a tie)."""
        top = max(
            self.per_device, key=lambda i: (self.per_device[i][0], i == self.own), default=None
        )
        return self.device if top is None or top == self.own else torch.device("cuda", top)

    def session_scope(self) -> contextlib.AbstractContextManager[None]:
        """The allocator's counters are process-wide: sessions need nothing of their own."""
        return contextlib.nullcontext()

    def prime(self, step: Any) -> None:
        """Nothing to prime: the allocator's counters are exact from the process's start."""

    def priming(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        # What the timing pass left in reference cycles is freed before the level is read,
        # as the step's own is after it: else a collection that runs inside the first
        # iteration frees it there, and that iteration reads as having freed memory.
        gc.collect()
        before = {i: int(torch.cuda.memory_allocated(i)) for i in used_devices(self.device)}
        for i in before:
            torch.cuda.reset_peak_memory_stats(i)
        yield
        gc.collect()  # frees only: the peaks stand
        used = used_devices(self.device)  # a device first used in this iteration counts too
        for i in used:
            torch.cuda.synchronize(i)
        self.retained.append(
            sum(int(torch.cuda.memory_allocated(i)) - before.get(i, 0) for i in used)
        )
        peaks = {i: _peaks(torch.cuda.memory_stats(i)) for i in used}
        # the device holding this iteration's allocated peak (the case's own on a tie)
        top = max(used, key=lambda i: (peaks[i][0], i == self.own))
        self.levels.append(before.get(top, 0))
        self.samples.append(max(a for a, _, _ in peaks.values()))
        self.reserved.append(max(r for _, r, _ in peaks.values()))
        if self.backend == NATIVE:
            self.requested.append(max(q for _, _, q in peaks.values()))
        for i, (a, r, _) in peaks.items():
            alloc, res = self.per_device.get(i, (0, 0))
            self.per_device[i] = (max(alloc, a), max(res, r))

    def summary(self) -> dict[str, Any]:
        devices = sorted(self.per_device) or used_devices(self.device)
        top = self.peak_device().index
        top = self.own if top is None else top
        persistent = {"persistent_bytes": self.marked[top]} if top in self.marked else {}
        return {
            **persistent,
            "framework": self.name,
            "allocator_backend": self.backend,
            "peak_allocated_bytes": max(self.samples) if self.samples else None,
            "peak_reserved_bytes": max(self.reserved) if self.reserved else None,
            "peak_requested_bytes": max(self.requested) if self.requested else None,
            "allocated_samples": list(self.samples),
            "retained_samples": list(self.retained),
            **counters(devices, self.backend),
            "cuda_devices": [device_entry(i, *self.per_device[i]) for i in sorted(self.per_device)],
        }


def _peaks(stats: dict[str, Any]) -> tuple[int, int, int]:
    """(allocated, reserved, requested) peaks of one device's `memory_stats`."""
    return tuple(  # type: ignore[return-value]
        int(stats.get(f"{k}_bytes.all.peak", 0)) for k in ("allocated", "reserved", "requested")
    )


def device_uuid(props: Any) -> str | None:
    """torch's UUID of a device, spelt as NVML spells a GPU's."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def category_breakdown(
    step: Any, device: torch.device, objects: tuple[Any, ...], tagging: Any, sessions: int = 1
) -> tuple[dict[str, int], list[str]]:
    """One extra iteration under MemTracker, for the category breakdown on CUDA, and the
    probe's notes.
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
    return probe.summary()["categories"], probe.notes
