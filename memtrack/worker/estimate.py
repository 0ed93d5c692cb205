"""One case's memory estimate, in its own process: setup, warm-up and one step under fake tensors.

Started by `memtrack.measure.estimate` as `python -m memtrack.worker.estimate SPEC.json PARENT_PID`.
The workload runs under `FakeTensorMode`: tensors carry shapes, dtypes and devices but no
data, so nothing is allocated and no GPU is needed. The same tensor tracker as the measured
CPU view (MemTracker, through `MemTrackerProbe`) counts the live fake storages by category,
so the estimate has the measured framework peak's definition: the peak of live tensor bytes
over the measured step, the persistent set (weights, optimizer state made by the warm-up)
included. Setup may read the values of small tensors it made from known values, as model
construction does (`memtrack.worker.known_values`). Like the measuring worker, it writes
its result file after every phase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import sys
import traceback
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memtrack.worker.process import serve
from memtrack.worker.protocol import ResultFile, Spec

FRAMEWORK = "fake-tensor-estimate"


class NotFakeable(Exception):
    """The workload does something fake tensors cannot represent; the message says what."""


def _cuda_support() -> str | None:
    """Why this torch cannot fake CUDA tensors, or None when it can try."""
    import torch

    if torch.backends.cuda.is_built():
        return None
    # A CPU-only build makes an empty fake CUDA tensor, but no op on one runs (a module's
    # initialisation fails first), and a CUDA generator (seeded inputs) cannot be made.
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode():
            torch.empty(1, device="cuda:0").uniform_()
    except Exception as exc:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    else:
        why = "no CUDA generator for seeded inputs"
    return (
        f"this torch build has no CUDA support: torch {torch.__version__} cannot run ops "
        f"on fake CUDA tensors ({why}); estimate with --device cpu, or with a CUDA "
        "build of torch"
    )


def describe(exc: BaseException, root: Path | None = None) -> str:
    """One line saying what could not be faked, and where in the workload's code."""
    text = _what(exc)
    where = workload_line(exc, root)
    return f"{text} at {where}"[:2000] if where else text


def workload_line(exc: BaseException, root: Path | None = None) -> str | None:
    """'perf/workloads.py:42: if t > 0:', the innermost frame outside torch and memtrack
    (the shipped examples aside) where `exc` was raised: the workload's line, or that of a
    library it calls (a diffusers scheduler reading a tensor timestep)."""
    import torch

    import memtrack

    skip = (Path(torch.__file__).parent, Path(memtrack.__file__).parent)
    examples = Path(memtrack.__file__).parent / "examples"
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if not path.is_absolute() or (
            any(path.is_relative_to(d) for d in skip) and not path.is_relative_to(examples)
        ):
            continue
        found = frame
    if found is None:
        return None
    path = Path(found.filename)
    if root is not None and path.is_relative_to(root):
        path = path.relative_to(root)
    code = (found.line or "").strip()
    return f"{path}:{found.lineno}" + (f": {code}" if code else "")


def _what(exc: BaseException) -> str:
    from torch._subclasses import fake_tensor as ft

    fake_errors = (
        ft.DynamicOutputShapeException,
        ft.DataDependentOutputException,
        ft.UnsupportedOperatorException,
        ft.UnsupportedFakeTensorException,
    )
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, fake_errors):
        cause = cause.__cause__ or cause.__context__
    exc = cause or exc
    func = getattr(exc, "func", None)
    if isinstance(exc, ft.DynamicOutputShapeException):
        return (
            f"cannot be faked: {func} has a data-dependent output shape "
            "(e.g. torch.nonzero, boolean-mask indexing, torch.unique)"
        )
    if isinstance(exc, ft.DataDependentOutputException):
        return (
            f"cannot be faked: {func} reads a tensor's value "
            "(e.g. .item(), .tolist(), a tensor in an `if`), which fake tensors do not hold"
        )
    if isinstance(exc, ft.UnsupportedOperatorException):
        import torch

        return (
            f"cannot be faked: {func} has no fake (meta) kernel in torch {torch.__version__} "
            "(an op torch cannot fake, or a custom kernel), and an estimate never runs an "
            "op's real kernel"
        )
    if isinstance(exc, ft.UnsupportedFakeTensorException):
        return f"cannot be faked: {getattr(exc, 'reason', exc)}"
    text = str(exc).strip().splitlines()
    if "hasPrimaryContext" in str(exc):
        # autograd's engine asks the driver for each device's context before it runs a
        # backward pass, even over fake tensors: without a GPU there is none to ask
        return (
            "cannot be estimated: backward on fake CUDA tensors needs a CUDA device "
            "(autograd asks the driver for its context, and this machine has no GPU); "
            "estimate the training step with --device cpu and the target dtype "
            f"({type(exc).__name__}: {text[0] if text else ''})"
        )[:2000]
    frames = traceback.extract_tb(exc.__traceback__)
    if any(f.filename.replace("\\", "/").endswith("torch/serialization.py") for f in frames):
        return (
            "cannot be faked: the workload saves or loads a checkpoint (torch.save / "
            "torch.load), and fake tensors hold no data to write or read "
            f"({type(exc).__name__}: {text[0] if text else ''})"
        )[:2000]
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:2000]


@dataclasses.dataclass(frozen=True)
class _Layout:
    """A saved fake tensor, as a fake checkpoint keeps it (a leaf to pytree, not a tuple)."""

    shape: Any
    stride: Any
    dtype: Any
    device: Any


@contextlib.contextmanager
def _fake_checkpoints() -> Iterator[None]:
    """`torch.save` of fake tensors to a path (a checkpoint the workload writes in setup)
    cannot pickle them: their layout is kept, nothing is written, and `torch.load` of that
    path gives new fake tensors of the same shapes, dtypes and strides, on `map_location`
    where it names a device, as a real load makes new tensors."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves, tree_map_only

    save, load = torch.save, torch.load
    saved: dict[str, Any] = {}

    def fake_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        fakes = [t for t in tree_leaves(obj) if isinstance(t, FakeTensor)]
        if not fakes or not isinstance(f, (str, os.PathLike)):
            return save(obj, f, *args, **kwargs)
        # the tensors' layout alone: the saved ones are freed as a real save's are
        saved[os.path.realpath(f)] = tree_map_only(
            torch.Tensor, lambda t: _Layout(t.shape, t.stride(), t.dtype, t.device), obj
        )
        return None

    def fake_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        obj = saved.get(os.path.realpath(f)) if isinstance(f, (str, os.PathLike)) else None
        if obj is None:
            return load(f, *args, **kwargs)
        where = kwargs.get("map_location", args[0] if args else None)
        device = torch.device(where) if isinstance(where, (str, torch.device)) else None
        return tree_map_only(
            _Layout,
            lambda t: torch.empty_strided(
                t.shape, t.stride, dtype=t.dtype, device=device or t.device
            ),
            obj,
        )

    torch.save, torch.load = fake_save, fake_load
    try:
        yield
    finally:
        torch.save, torch.load = save, load


@contextlib.contextmanager
def _fake_module_support(mode: Any) -> Iterator[None]:
    """What a workload's usual setup needs under fake tensors, and torch lacks.

    - `module.to(device, dtype)` after construction swaps each fake parameter for a new one,
      and a swap refuses a tensor with a weak reference: the fake mode's converter keeps one
      to every fake tensor it made. The converter's entry is dropped just before the swap.
    - `copy.deepcopy` of a fake tensor (`nn.TransformerEncoder` clones its layer) builds it
      in a new fake mode, which the next op refuses to mix: here it is cloned in this mode.
    - `nn.init.trunc_normal_` (timm's and transformers' weight init) draws by rejection,
      looping until no value falls outside its bounds: on a fake tensor, whose values are
      never drawn, one in-place fill stands for it (it allocates nothing either way).
    - a checkpoint the workload writes and reads in setup (`_fake_checkpoints`).
    """
    import torch
    import torch.utils
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    memo = mode.fake_tensor_converter.meta_converter.tensor_memo
    swap = torch.utils.swap_tensors
    init = torch.nn.init
    # trunc_normal_ calls it by its module's name, however a workload imported trunc_normal_
    trunc_normal = init._no_grad_trunc_normal_

    def fake_trunc_normal(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(tensor, FakeTensor):
            return trunc_normal(tensor, *args, **kwargs)
        with torch.no_grad():
            return tensor.uniform_()

    def forget(t: Any) -> None:
        # The memo's references know their keys: no scan of the memo per parameter. (A
        # function of its own: the references it held are gone when it returns.)
        for ref in weakref.getweakrefs(t):
            key = getattr(ref, "key", None)
            if isinstance(ref, weakref.KeyedRef) and memo.data.get(key) is ref:
                del memo.data[key]

    def swap_tensors(t1: Any, t2: Any) -> Any:
        for t in (t1, t2):
            if isinstance(t, FakeTensor):
                forget(t)
        return swap(t1, t2)

    class DeepcopyInMode(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if func is torch.Tensor.__deepcopy__ and isinstance(args[0], FakeTensor):
                tensor, copies = args
                if id(tensor) in copies:
                    return copies[id(tensor)]
                with torch.no_grad():
                    out = tensor.clone()
                if isinstance(tensor, torch.nn.Parameter) or getattr(tensor, "_is_param", False):
                    out = torch.nn.Parameter(out, requires_grad=tensor.requires_grad)
                else:
                    out.requires_grad_(tensor.requires_grad)
                copies[id(tensor)] = out
                return out
            return func(*args, **kwargs)

    torch.utils.swap_tensors = swap_tensors
    init._no_grad_trunc_normal_ = fake_trunc_normal
    try:
        with DeepcopyInMode(), _fake_checkpoints():
            yield
    finally:
        torch.utils.swap_tensors = swap
        init._no_grad_trunc_normal_ = trunc_normal


def estimate_case(spec: Spec, result: ResultFile) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memtrack.probes.framework import MemTrackerProbe
    from memtrack.worker.known_values import KnownValues
    from memtrack.workload.context import Context
    from memtrack.workload.registry import find, import_workload_module, repository_first

    gc.freeze()  # as a measured case does (worker.measure): a collection walks the case's objects
    result.update(phase="setup")
    device = spec.device
    if device == "cuda":
        reason = _cuda_support()
        if reason:
            raise NotFakeable(reason)
        device = "cuda:0"  # an explicit index: no CUDA call to find the current device
    torch.manual_seed(spec.seed)
    repository_first(Path(spec.root))  # a forked worker has it so from its server already
    import_workload_module(spec.module, Path(spec.root))
    wl = find(spec.workload)
    # Tensors a workload module made at import are real: they enter as fake constants.
    # No fallback kernels: for an op without a meta kernel torch would run the real kernel on
    # real zero-filled tensors of the full size (on the GPU where there is one), allocating
    # what the estimate is there to predict; the op is named instead.
    mode = FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False)
    with mode, _fake_module_support(mode):
        ctx = Context(spec.params, spec.seed, device, Path(spec.data_dir), fake=True)
        probe = MemTrackerProbe(ctx.device, only_fake=True, fake_mode=mode)
        # Tags go to the tracker (outside the measured step it drops them); the context's
        # own bookkeeping reads data pointers, which fake storages do not have, and skips them.
        ctx.tag_hook = probe.tag
        # Setup may read the values of small tensors it made (see `known_values`).
        with KnownValues():
            step = wl.fn(ctx)
        if not callable(step):
            raise TypeError(f"workload {wl.name!r} must return the step to measure, got {step!r}")
        objects = ctx.marked_objects if ctx.marked_objects is not None else ()
        if ctx.marked_objects is None:
            result.notes.append("no ctx.mark(): the persistent set is what setup left")
        persistent = probe.mark(objects)
        result.update(phase="warmup", persistent_bytes=persistent)
        # Warm-up as measured: lazily created state (AdamW's moments) is then persistent.
        for _ in range(spec.warmup):
            ctx.new_iteration()
            step()
        result.update(phase="memory")
        sessions = ctx.concurrency
        for _ in range(spec.repeats):
            ctx.new_iteration()
            with probe.iteration(), _op_levels(probe, sessions > 1) as levels:
                step()
        summary = probe.summary()
    summary["framework"] = FRAMEWORK
    # What an iteration retains is the allocator's to say, in a measured run: under fake
    # tensors a concurrent case's step is one session's, and nothing here scales it.
    summary.pop("retained_samples", None)
    if sessions > 1:
        summary = overlapping_sessions(summary, levels, sessions)
        result.notes.append(
            f"concurrency {sessions}: the sessions modelled in step, one op apart (each at "
            "the lowest of its levels within one op of the others), from one session's "
            "step; neither one session nor the sum of "
            f"{sessions}: see `memtrack.worker.estimate.overlapping_sessions`"
        )
    result.update(phase="done", **summary)


@contextlib.contextmanager
def _op_levels(probe: Any, wanted: bool) -> Iterator[list[dict[str, int]]]:
    """The tracker's live bytes on the probe's device by category ('Total' too), once
    before the step and after each op of it, while the block runs (nothing unless
    `wanted`). The tracker updates its peak after every op: that is where it is read."""
    levels: list[dict[str, int]] = []
    if not wanted:
        yield levels
        return
    tracker = probe.tracker

    def read() -> None:
        snap = tracker.get_tracker_snapshot("current").get(probe.device, {})
        levels.append({str(getattr(k, "value", k)): int(v) for k, v in snap.items()})

    update = tracker._update_peak_stats

    def update_and_read(*args: Any, **kwargs: Any) -> None:
        update(*args, **kwargs)
        read()

    read()
    tracker._update_peak_stats = update_and_read
    try:
        yield levels
    finally:
        del tracker._update_peak_stats  # the class's own again


def overlapping_sessions(
    summary: dict[str, Any], levels: list[dict[str, int]], sessions: int
) -> dict[str, Any]:
    """One session's step, as `sessions` concurrent sessions of it overlap when measured.

    A measured iteration releases its sessions together (one barrier, `workload.sessions`)
    and each runs the same ops in the same order, so they advance side by side: at any
    moment every session is at the same op as the others, give or take one. The others
    then hold what they held around that op (what outlives an op: their caches, the
    residual stream, a layer's inputs), but not necessarily its own short-lived output: a
    spike held for one op (an attention's scores, an MLP's widest activation) is not
    every session's at the same instant. So with `s(t)` one session's live bytes above
    the iteration's start after its op `t` (0 before the first op and after the last),
    the peak is the largest over the ops of

        s(t) + (sessions - 1) x min(s(t-1), s(t), s(t+1))

    above the start. It lies between one session's peak and the sum of the sessions (every
    one at its peak at once, which the sessions reach only if their spikes coincide) and
    is the sum where what a session holds changes slowly. Fake tensors run the sessions'
    ops in one thread (a dispatch mode is per thread), so the overlap is modelled, never
    observed; the measured figure varies with the interleaving (the shipped
    `decoder_serve` at 4 sessions on 2 cores: repeats from 9.12 to 10.45 MiB, the
    recorded peak, their largest, 10.45 MiB in every run; the sum of the sessions 11.90 MiB,
    this model 10.45 MiB). The breakdown is that of the op where the peak is: its
    session's categories there, and the others' at their lower level.
    """
    if len(levels) < 2:
        return summary
    start = levels[0]
    rise = [lv.get("Total", 0) - start.get("Total", 0) for lv in levels]
    # rise[0] is before the first op; after the last op the step's outputs are let go:
    # the end is the start again.
    padded = [*rise, 0]
    best, at, low_at = -1, 0, 0
    for t in range(1, len(rise)):
        low = min((t - 1, t, t + 1), key=padded.__getitem__)
        total = rise[t] + (sessions - 1) * padded[low]
        if total > best:
            best, at, low_at = total, t, low
    out = dict(summary)
    level = start.get("Total", 0)
    out["peak_allocated_bytes"] = level + max(0, best)
    out["allocated_samples"] = [out["peak_allocated_bytes"]]
    lower = levels[low_at] if low_at < len(levels) else start
    cats = {}
    for k in {*start, *levels[at], *lower} - {"Total"}:
        base = start.get(k, 0)
        own = levels[at].get(k, 0) - base
        other = lower.get(k, 0) - base
        cats[k] = max(0, base + own + (sessions - 1) * other)
    out["categories"] = cats
    return out


def failure(exc: Exception, spec: Spec) -> dict[str, Any]:
    """A case that raised: what could not be faked, in one line, naming the workload's line."""
    message = str(exc) if isinstance(exc, NotFakeable) else describe(exc, Path(spec.root).resolve())
    return {"status": "error", "message": message.splitlines()[0][:2000]}


def main(argv: list[str]) -> int:
    return serve(argv, estimate_case, failure)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    import os

    os._exit(code)  # skip interpreter teardown: the result is written
