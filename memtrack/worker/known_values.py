"""A workload's setup under fake tensors, where small tensors made from known values keep them.

Model construction reads values: timm draws its drop-path rates with
`[x.item() for x in torch.linspace(0, rate, depth)]`, transformers builds buffers from
`torch.arange(n)` and branches on them. A fake tensor holds no values, so each of these
failed an estimate before its step was reached.

Why this design. During setup, `KnownValues` sits above `FakeTensorMode`: every op still
runs on fake tensors first (so the estimate counts the same storages as before), and when
all of an op's tensor inputs have known values and its outputs are small (at most `LIMIT`
bytes in all), the op is also run for real on those values, on the CPU, and each output
carries its value. Values start at factories of Python numbers (`linspace`, `arange`,
`full`, `torch.tensor(...)`) and at small real tensors a module made at import. `.item()`,
`int(t)`, `if t:`, `.tolist()` read them; an op with a data-dependent output shape
(`nonzero`, boolean masks) runs on them and gives fake outputs that carry theirs. Views of
a value are views of it, so a write through one is seen by the others; a write that cannot
be followed (a random fill, a copy from a tensor of unknown value) forgets the value.

What was set aside. `torch.set_default_device("meta")` holds no values either. Running
setup for real with only large tensors faked would mix real and fake tensors in one model,
which then has to be converted before the step (and real tensors in a model's graph break
autograd over fake ones); torch's own constant propagation (`FakeTensor.constant`) keeps
values only for tensors of one element, not factories, and computes an op's real output
before it knows its size. Here nothing larger than `LIMIT` is ever computed for real, so a
model of any size is built without its memory, and random values stay unknown: a tensor
drawn at random is as unreadable as before. Outside setup (the warm-up and the measured
step) values are not kept: the step is what is estimated, op by op as fake tensors run it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
)
from torch.utils import _pytree as pytree
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

LIMIT = 64 * 1024
"""The most bytes an op's outputs may take, in all, for their values to be computed."""

VALUE = "_memtrack_value"
"""The attribute of a fake tensor that holds its value (a CPU tensor of its shape)."""

CPU = torch.device("cpu")
aten = torch.ops.aten


def value_of(t: Any) -> torch.Tensor | None:
    """The known value of `t` (a CPU tensor), or None: a fake tensor's kept value, unless a
    write forgot it; a small real CPU tensor is its own."""
    if isinstance(t, FakeTensor):
        v = t.__dict__.get(VALUE)
        if v is None or (v.numel() > 0 and v.untyped_storage().nbytes() == 0):
            return None  # never known, or forgotten (see `forget`)
        return v
    if isinstance(t, torch.Tensor) and t.device == CPU and _nbytes(t) <= LIMIT:
        return t
    return None


def forget(t: Any) -> None:
    """Forget the value of `t` and of every tensor whose value shares its storage: the
    storage is emptied (its memory freed), which `value_of` reads as unknown. A fake
    tensor's value never shares storage with a real tensor (see `KnownValues._keep`)."""
    if isinstance(t, FakeTensor):
        v = t.__dict__.get(VALUE)
        if v is not None:
            with no_dispatch():
                v.untyped_storage().resize_(0)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _written(
    func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """The tensors `func` writes to (in place, `out=`, or a view's metadata)."""
    out: list[Any] = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        arg = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
        out.extend(x for x in pytree.tree_leaves(arg) if isinstance(x, torch.Tensor))
    return out


class KnownValues(TorchDispatchMode):
    """Fake tensors that carry their values where those are known and small (see above)."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.OpOverload):
            return func(*args, **kwargs)
        if func is aten._local_scalar_dense.default:  # .item(), int(t), `if t:`, .tolist()
            value = value_of(args[0])
            if value is not None:
                with no_dispatch():  # a real tensor, read by the CPU: no fake mode
                    return value.item()
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            real = self._run(func, args, kwargs)
            if real is None:
                raise
            return self._fakes_of(real, args)
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        written = _written(func, args, kwargs)
        if not outputs and not written:
            return out  # a query (a device, a size): nothing to know
        real = None
        if sum(_nbytes(t) for t in outputs) <= LIMIT:
            real = self._run(func, args, kwargs)
        if real is None or not self._keep(out, real, args):
            for t in written:
                forget(t)
        return out

    @staticmethod
    def _run(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`func` run for real on its inputs' values on the CPU, or None where one is unknown,
        the op draws random numbers, it would write to a real tensor, or it fails."""
        if torch.Tag.nondeterministic_seeded in func.tags:
            return None
        if any(not isinstance(t, FakeTensor) for t in _written(func, args, kwargs)):
            return None  # a real tensor is never written to: fake mode does not either

        def real(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                v = value_of(x)
                if v is None:
                    raise LookupError
                return v
            return CPU if isinstance(x, torch.device) else x

        try:
            real_args, real_kwargs = pytree.tree_map(real, (args, kwargs))
        except LookupError:
            return None
        try:
            with no_dispatch():
                return func(*real_args, **real_kwargs)
        except Exception:
            return None  # its value stays unknown; the fake result stands

    @staticmethod
    def _keep(out: Any, real: Any, args: tuple[Any, ...]) -> bool:
        """Each fake output carries its value; False where the two do not match."""
        fakes, spec = pytree.tree_flatten(out)
        values, real_spec = pytree.tree_flatten(real)
        if spec != real_spec:
            return False
        pairs = [(f, v) for f, v in zip(fakes, values, strict=True) if isinstance(f, torch.Tensor)]
        if not all(
            isinstance(f, FakeTensor)
            and isinstance(v, torch.Tensor)
            and f.shape == v.shape
            and f.dtype == v.dtype
            for f, v in pairs
        ):
            return False
        shared = {
            a.untyped_storage().data_ptr()
            for a in pytree.tree_leaves(args)
            if isinstance(a, torch.Tensor) and not isinstance(a, FakeTensor)
        }
        for f, v in pairs:
            if v.untyped_storage().data_ptr() in shared:
                with no_dispatch():
                    v = v.clone()  # a view of a real tensor: a value of its own, to forget freely
            f.__dict__[VALUE] = v
        return True

    @staticmethod
    def _fakes_of(real: Any, args: tuple[Any, ...]) -> Any:
        """Fake tensors for the real outputs of an op fake tensors cannot size, on the
        device of its inputs, each carrying its value."""
        device = next(
            (a.device for a in pytree.tree_leaves(args) if isinstance(a, FakeTensor)), CPU
        )

        def fake(v: torch.Tensor) -> torch.Tensor:
            f = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
            f.__dict__[VALUE] = v
            return f

        return pytree.tree_map_only(torch.Tensor, fake, real)


__all__ = ["LIMIT", "KnownValues", "forget", "value_of"]
