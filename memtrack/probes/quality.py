"""The step's output against its reference, in the worker: one extra call after the memory
pass, recorded as a reference file or compared with one.

The call comes after every measured iteration, so keeping its output alive cannot raise a
measured peak; the output goes to the host (float64) and is released before the reference
is read. Figures are taken on the flattened outputs in float64 on the CPU:

    max_abs = max |out - ref|
    max_rel = max_abs / max |ref|      (norm-wise: element-wise ratios explode at zeros)
    cosine  = <out, ref> / (|out| |ref|)

With several outputs (a tuple or dict of tensors) the worst of each is kept.

`QualitySpec`, what the parent asks of the worker, is defined here, below the worker that
carries it in its spec (memtrack.worker.protocol): the parent imports it without torch, which
only the functions that handle tensors import.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class QualitySpec:
    """What the worker does with the step's output after the memory pass."""

    mode: str
    """'compare' with the reference, or 'record' it (`memtrack reference`)."""
    path: str | None = None
    """The reference file to compare with, or the file to record into; None: none recorded."""
    reference: str | None = None
    """Case id of the reference (compare)."""
    sha256: str | None = None
    """The reference file's sha256 as the manifest pins it (compare)."""
    device: str | None = None
    """Where the reference was recorded ('cpu', 'cuda:0'), as the manifest says (compare);
    None in entries recorded before it was kept."""


UPPER = {"max_abs": "max_abs", "max_rel": "max_rel", "metric": "value"}
"""Tolerance keys that bound a figure from above, and the figure each bounds."""
LOWER = {"cosine": "cosine", "metric_min": "value"}
"""Tolerance keys that bound a figure from below."""


class OutputError(Exception):
    """The step's output cannot be compared (no tensor, another structure, other shapes)."""


def flatten(output: Any) -> tuple[str, dict[str, torch.Tensor]]:
    """(structure, name -> tensor): 'tensor' -> {'output'}, a tuple or list -> {'0', '1', ...},
    a dict -> its own keys. Anything else has no tensor output to compare."""
    import torch

    if isinstance(output, torch.Tensor):
        return "tensor", {"output": output}
    if isinstance(output, (tuple, list)) and output:
        kind, items = type(output).__name__, {str(i): v for i, v in enumerate(output)}
    elif isinstance(output, dict) and output:
        kind, items = "dict", dict(output)
    else:
        raise OutputError(
            f"the step returned {_describe(output)}, not a tensor, or a tuple, "
            "list or dict of tensors"
        )
    for key, value in items.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise OutputError(
                f"the step returned a {kind} whose item {key!r} is "
                f"{_describe(value)}: every item must be a tensor"
            )
    return kind, items


def rebuild(structure: str, flat: dict[str, torch.Tensor]) -> Any:
    """The step's structure again, from flattened tensors (for the workload's own metric)."""
    if structure == "tensor":
        return flat["output"]
    if structure in ("tuple", "list"):
        items = [flat[str(i)] for i in range(len(flat))]
        return tuple(items) if structure == "tuple" else items
    return dict(flat)


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (tuple, list, dict)) and not value:
        return f"an empty {type(value).__name__}"
    return f"a {type(value).__name__}"


def _extra_call(step: Callable[[], Any], ctx: Any) -> tuple[str, dict[str, torch.Tensor]]:
    import torch

    caches = ctx.cache_peak_bytes  # the memory pass's figure: this call is not measured
    ctx.new_iteration()
    output = step()
    ctx.cache_peak_bytes = caches
    structure, flat = flatten(output)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    return structure, flat


def record(step: Callable[[], Any], ctx: Any, path: Path) -> None:
    """Save the output as CPU float32 tensors at `path` (torch.save of a dict of tensors),
    and what it is (structure, shapes, dtypes, torch) at `path`.json. Raises OutputError
    when the step returns no tensor."""
    import torch

    structure, flat = _extra_call(step, ctx)
    outputs = {
        k: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        for k, t in flat.items()
    }
    tensors = {k: t.detach().to("cpu", torch.float32).contiguous() for k, t in flat.items()}
    del flat
    torch.save(tensors, path)
    meta = {
        "structure": structure,
        "outputs": outputs,
        "torch": torch.__version__,
        "device": str(ctx.device),
    }
    Path(f"{path}.json").write_text(json.dumps(meta))


def compare(step: Callable[[], Any], ctx: Any, wl: Any, spec: QualitySpec) -> dict[str, Any]:
    """The output against the reference named in `spec` (its reference, path and sha256):
    the `quality_*` fields of the measurement. Never raises for the reference or the
    output: a problem with either is a quality error, recorded, and the case stands."""
    import torch

    out: dict[str, Any] = {
        "quality_reference": spec.reference,
        "quality_tolerance": dict(wl.tolerance),
    }
    if not spec.path or not spec.sha256:
        return {
            **out,
            "quality_status": "none",
            "quality_message": f"no reference recorded for {spec.reference}: record "
            f"one with `memtrack reference -k '{spec.reference}'`",
        }
    elsewhere = other_device(spec, ctx.device)
    try:
        structure, flat = _extra_call(step, ctx)
    except OutputError as exc:
        return {**out, "quality_status": "error", "quality_message": str(exc)}
    got = {k: t.detach().to("cpu", torch.float64) for k, t in flat.items()}
    del flat  # before the reference is read: one copy of the output at a time
    try:
        ref, sha = _load(Path(spec.path), spec.sha256 or "")
        out["quality_reference_sha256"] = sha
        if set(ref) != set(got):
            raise OutputError(f"the output has {_names(got)}, the reference {_names(ref)}")
        for k in sorted(got):
            if got[k].shape != ref[k].shape:
                raise OutputError(
                    f"output {k!r} has shape {list(got[k].shape)}, the "
                    f"reference {list(ref[k].shape)}"
                )
    except OutputError as exc:
        return {**out, "quality_status": "error", "quality_message": elsewhere + str(exc)}
    figures, bad = _figures(got, ref)
    if wl.quality is not None and bad is None:
        try:
            value = float(wl.quality(rebuild(structure, got), rebuild(structure, ref)))
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            return {
                **out,
                "quality_status": "error",
                "quality_message": f"the workload's quality function raised "
                f"{type(exc).__name__}: {first}",
            }
        figures["value"] = value
    status, message = judge(figures, wl.tolerance, bad)
    return {
        **out,
        **{f"quality_{k}": _finite(v) for k, v in figures.items()},
        "quality_status": status,
        "quality_message": elsewhere + message,
    }


def other_device(spec: QualitySpec, device: torch.device) -> str:
    """The warning that opens the quality message when the reference was recorded on another
    kind of device: kernels differ between them (on a GPU, cuDNN computes float32
    convolutions in TF32 by default), so part of the difference is the device's. Empty
    where the devices are of one kind, or the manifest does not say."""
    if not spec.device or spec.device.partition(":")[0] == device.type:
        return ""
    return (
        f"reference recorded on {spec.device}, compared on {device}: kernels differ "
        "between them (TF32 convolutions on a GPU, ...); record it on this kind of "
        f"device with `memtrack reference -k '{spec.reference}'`; "
    )


def _names(flat: dict[str, Any]) -> str:
    return "outputs " + ", ".join(repr(k) for k in sorted(flat))


def _load(path: Path, expected: str) -> tuple[dict[str, torch.Tensor], str]:
    """The reference's tensors (float64), read once: the bytes checked are the bytes loaded."""
    import torch

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise OutputError(
            f"{path}: reference file not found (the manifest names it); record "
            "it again with `memtrack reference`"
        ) from None
    except OSError as exc:
        raise OutputError(f"{path}: cannot be read ({exc.strerror})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise OutputError(
            f"{path}: sha256 {digest[:16]}... differs from the manifest's "
            f"{expected[:16]}...: reference refused (record it again with "
            "`memtrack reference`)"
        )
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise OutputError(f"{path}: not a reference file ({first})") from None
    if (
        not isinstance(loaded, dict)
        or not loaded
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items())
    ):
        raise OutputError(f"{path}: not a reference file (expected a dict of tensors)")
    return {k: v.to(torch.float64) for k, v in loaded.items()}, digest


def _figures(
    got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
) -> tuple[dict[str, float], str | None]:
    """max_abs, max_rel, cosine over every output (the worst of each); and why there are
    none, where an output or the reference holds NaN or infinity."""
    import torch

    bad_out = sum(int((~torch.isfinite(t)).sum()) for t in got.values())
    bad_ref = sum(int((~torch.isfinite(t)).sum()) for t in ref.values())
    if bad_out or bad_ref:
        return {}, (
            f"{bad_out} non-finite value(s) (NaN or inf) in the output, {bad_ref} in the reference"
        )
    max_abs, max_rel, cosine = 0.0, 0.0, 1.0
    for k in got:
        a, b = got[k].flatten(), ref[k].flatten()
        if a.numel() == 0:
            continue
        err = float((a - b).abs().max())
        scale = float(b.abs().max())
        rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
        na, nb = float(a.norm()), float(b.norm())
        if na == 0 or nb == 0:
            cos = 1.0 if na == nb else 0.0
        else:
            cos = max(-1.0, min(1.0, float(a @ b) / (na * nb)))
        max_abs, max_rel, cosine = max(max_abs, err), max(max_rel, rel), min(cosine, cos)
    return {"max_abs": max_abs, "max_rel": max_rel, "cosine": cosine}, None


def judge(
    figures: dict[str, float], tolerance: dict[str, float], bad: str | None
) -> tuple[str, str]:
    """('ok' | 'fail', one line naming each bounded figure against its tolerance)."""
    if bad is not None:
        return "fail", bad
    broken: list[str] = []
    kept: list[str] = []
    for key, bound in tolerance.items():
        upper = key in UPPER
        name = UPPER.get(key) or LOWER[key]
        value = figures.get(name, math.nan)
        shown = "metric" if name == "value" else name
        ok = value <= bound if upper else value >= bound
        sign = ("<=" if ok else ">") if upper else (">=" if ok else "<")
        digits = 6 if name == "cosine" else 4  # a cosine's story is in its nines
        (kept if ok else broken).append(
            f"{shown} {_num(value, digits)} {sign} {_num(bound, digits)}"
        )
    if broken:
        return "fail", (
            "breaks tolerance: "
            + ", ".join(broken)
            + (f"; within: {', '.join(kept)}" if kept else "")
        )
    return "ok", "within tolerance: " + ", ".join(kept)


def _num(x: float, digits: int = 4) -> str:
    return "inf" if x == math.inf else f"{x:.{digits}g}"


def _finite(x: float) -> float | None:
    """Records hold finite numbers: an infinite figure is recorded as not measured."""
    return x if math.isfinite(x) else None
