"""Packed weights: the quantized modules of torch.ao (dynamic and static Linear, Conv,
embeddings) keep their weights in an opaque packed object (`torch.classes.quantized.*`, a
ScriptObject), no parameter, buffer or tensor at all: a tensor tracker sees none of it.

The packing (fbgemm, oneDNN, QNNPACK) is the backend's: padded to its blocks, with column
offsets and, on some paths, the original int8 weight kept beside it, so its size is not the
int8 weight's (measured here: 2.1x for a 256x1024 layer, 1.01x for 4096x4096). Its bytes are
measured, not computed: one copy of each packed object is made through its own pickling
(unpacked and packed again, as `torch.load` would) while glibc's `mallinfo2` counts the heap,
and the bytes the copy holds once made are the object's. The copy is dropped at once; it is
made after the host view's figures are read, never during a measured iteration.

Tensor subclasses (torchao's quantized weights, bitsandbytes' `Params4bit`) are tensors and
need nothing here: the tracker counts their inner storages (`__tensor_flatten__`).
"""

from __future__ import annotations

import copy
import ctypes
import gc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

CATEGORY = "Packed"
"""The packed weights' key among a framework view's categories: weights, with parameters
and buffers."""


@dataclass(frozen=True)
class Packed:
    """What the packed objects among a case's modules hold."""

    modules: int
    """How many packed objects (one per quantized layer)."""
    nbytes: int | None
    """Their bytes, as the heap counts them; None where they could not be measured."""
    why: str | None = None
    """Why not, in one line, where `nbytes` is None."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


def _heap_counter() -> Any:
    """A function giving the bytes the C heap has handed out (in-use chunks and mmapped
    blocks), from glibc's `mallinfo2` (glibc 2.33+); None elsewhere."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2

    def used() -> int:
        info = fn()
        return int(info.uordblks + info.hblkhd)

    return used


def packed_objects(objects: tuple[Any, ...]) -> Iterator[Any]:
    """Each packed object held by a module among `objects` (or their submodules), once."""
    seen: set[int] = set()
    for obj in objects:
        if not isinstance(obj, torch.nn.Module):
            continue
        for module in obj.modules():
            for value in vars(module).values():
                if isinstance(value, torch._C.ScriptObject) and id(value) not in seen:
                    seen.add(id(value))
                    yield value


def _tensors(state: Any) -> Iterator[torch.Tensor]:
    """The tensors in a packed object's pickled state, at any depth."""
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, (tuple, list)):
        for item in state:
            yield from _tensors(item)
    elif isinstance(state, dict):
        for item in state.values():
            yield from _tensors(item)


def measure(objects: tuple[Any, ...], claim: Callable[[torch.Tensor], int]) -> Packed | None:
    """The packed objects' bytes, less those of the tensors they share with Python; None
    where the modules hold none.

    A packed object may keep a tensor that Python holds too (a quantized Linear's float
    bias): such a tensor is a live tensor the caller counts already. `claim(t)` is given
    each tensor of each object's state, and returns the bytes of it that the caller counts
    (and files as weights from then on); those are not counted twice."""
    found = list(packed_objects(objects))
    if not found:
        return None
    used = _heap_counter()
    if used is None:
        return Packed(
            len(found), None, "no glibc mallinfo2 here to measure them: weights exclude them"
        )
    total = 0
    for obj in found:
        try:
            total -= sum(claim(t) for t in _tensors(obj.__getstate__()))
            total += _copy_bytes(obj, used)
        except Exception as exc:  # a packed class without pickling
            kind = obj._type().qualified_name()
            return Packed(len(found), None, f"{kind} cannot be copied ({exc}): weights exclude it")
    return Packed(len(found), max(0, total))


def _copy_bytes(obj: Any, used: Callable[[], int]) -> int:
    """The heap bytes one copy of `obj` holds once made."""
    gc.collect()
    before = used()
    clone = copy.deepcopy(obj)
    gc.collect()  # the unpacked state the copy was made from
    held = max(0, used() - before)
    del clone
    return held


def packed_dtypes(objects: tuple[Any, ...]) -> dict[str, int]:
    """The packed weights' bytes by dtype ('qint8', 'float16'), from the quantized modules'
    shapes (`in_features` x `out_features`, or a convolution's channels and kernel) and the
    dtype they record (torch.ao's LinearPackedParams keeps it; a static convolution is
    qint8): the weights alone, without unpacking anything."""
    held: dict[str, int] = {}
    for obj in objects:
        if not isinstance(obj, torch.nn.Module):
            continue
        for module in obj.modules():
            owner = module
            inner = getattr(module, "_packed_params", None)
            if isinstance(inner, torch.nn.Module):  # a Linear's LinearPackedParams
                module = inner
            if not any(isinstance(v, torch._C.ScriptObject) for v in vars(module).values()):
                continue
            dtype = getattr(module, "dtype", None)
            name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else "qint8"
            held[name] = held.get(name, 0) + _numel(owner) * (2 if name == "float16" else 1)
    return held


def _numel(module: Any) -> int:
    """A quantized module's weight elements, from its shape attributes (0 if it has none)."""
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        return int(module.in_features) * int(module.out_features)
    if hasattr(module, "in_channels") and hasattr(module, "kernel_size"):
        kernel = math.prod(int(k) for k in module.kernel_size)
        groups = int(getattr(module, "groups", 1))
        return int(module.out_channels) * int(module.in_channels) // groups * kernel
    return 0


def attached_tensors(objects: tuple[Any, ...]) -> Iterator[torch.Tensor]:
    """The tensors a quantized weight keeps beside its data, as attributes of the parameter
    (bitsandbytes: a `Params4bit`'s `quant_state` with its `absmax`, `code` and nested
    state; an `Int8Params`' `SCB`): weights, though no parameter or buffer names them."""
    from torch._subclasses.fake_tensor import FakeTensor

    for obj in objects:
        if not isinstance(obj, torch.nn.Module):
            continue
        for param in obj.parameters():
            # a fake parameter's attributes are its fake mode's machinery, and its caches
            if not isinstance(param, FakeTensor):
                yield from _attributes(vars(param), 3)


def _attributes(values: dict[str, Any], depth: int) -> Iterator[torch.Tensor]:
    for value in values.values():
        if isinstance(value, torch.Tensor):
            yield value
        elif (
            depth > 1
            and hasattr(value, "__dict__")
            and not isinstance(value, (type, torch.nn.Module))
        ):
            yield from _attributes(vars(value), depth - 1)


def note(packed: Packed) -> str:
    """The line a case's notes carry about its packed weights."""
    if packed.nbytes is None:
        return f"packed weights ({packed.modules} quantized modules) not measured: {packed.why}"
    return (
        f"weights include {packed.nbytes:,} B of packed quantized weights ({packed.modules} "
        "packed objects, as the heap counts one copy of each)"
    )
