"""Where the memory at a peak was allocated: the CPU allocator's blocks alive at the highest
point of a span, grouped by the nn.Module whose forward made them and by the line of the
user's own code that made them (its innermost frame outside torch, memtrack, pytest, the
standard library and installed packages).

    with record_sites() as recording:
        step()
    recording.sites.by_source   # top sites and one remainder, summing to the peak

It runs torch's profiler with Python stacks (`with_stack`), which slows the span several
times over: a caller runs it in a pass of its own, not while it measures.
"""

from __future__ import annotations

import contextlib
import os
import site
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from memtrack.probes.span import profiler

NO_MODULE = "(outside any module)"
NO_SOURCE = "(no frame of your code)"
NOT_YOURS = frozenset({"torch", "memtrack", "_pytest", "pytest", "pluggy", "xdist", "execnet"})
"""Top-level packages whose frames are never a site, wherever they are installed."""


@dataclass(frozen=True)
class Site:
    """One group of the blocks alive at the peak."""

    label: str
    """'model.py:work:12' (file:function:line), 'Net.encoder.0 (Linear)' (module path and
    class), or 'N other sites' for the remainder."""
    nbytes: int
    blocks: int


@dataclass(frozen=True)
class PeakSites:
    """The blocks alive at a span's peak, two ways. Each grouping's sites sum to the peak."""

    peak_bytes: int
    by_module: tuple[Site, ...] = ()
    by_source: tuple[Site, ...] = ()


@dataclass
class Recording:
    """`record_sites`'s result: `sites` is filled in when the block ends."""

    top: int
    sites: PeakSites = field(default_factory=lambda: PeakSites(0))


@contextlib.contextmanager
def record_sites(top: int = 5) -> Iterator[Recording]:
    """Profile the block in this thread and find the sites of its peak (top `top` per
    grouping, and one remainder)."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    recording = Recording(top)
    modules: dict[int, Any] = {}

    def seen(module: Any, inputs: Any) -> None:  # returns None: the inputs stay as they are
        modules[id(module)] = module

    hook = register_module_forward_pre_hook(seen)
    prof = profiler(profile_memory=True, with_stack=True)
    try:
        with prof:
            yield recording
    finally:
        hook.remove()
        roots = prof.kineto_results.experimental_event_tree()
        recording.sites = sites_at_peak(roots, module_paths(modules.values()), top)


def module_paths(modules: Any) -> dict[int, str]:
    """id(module) -> its path from the outermost module that ran: 'Net.encoder.0'."""
    modules = list(modules)
    children = {id(c) for m in modules for c in m.children()}
    paths: dict[int, str] = {}
    for root in (m for m in modules if id(m) not in children):
        for name, sub in root.named_modules():
            paths.setdefault(
                id(sub), f"{type(root).__name__}.{name}" if name else type(root).__name__
            )
    return paths


def sites_at_peak(roots: list[Any], paths: dict[int, str], top: int = 5) -> PeakSites:
    """The CPU blocks alive at the highest running sum of a profile's allocations and frees
    (frees of blocks allocated before it began count for nothing, as in the span's figure),
    grouped by module and by source line."""
    events = sorted(_allocations(roots), key=lambda n: n.start_time_ns)
    live: dict[int, Any] = {}
    running = best = 0
    best_at = -1
    for i, node in enumerate(events):
        size = node.extra_fields.alloc_size
        running += size if size > 0 or node.extra_fields.ptr in live else 0
        if size > 0:
            live[node.extra_fields.ptr] = node
        else:
            live.pop(node.extra_fields.ptr, None)
        if running > best:
            best, best_at = running, i
    alive: dict[int, Any] = {}
    for node in events[: best_at + 1]:
        if node.extra_fields.alloc_size > 0:
            alive[node.extra_fields.ptr] = node
        else:
            alive.pop(node.extra_fields.ptr, None)
    blocks = list(alive.values())
    return PeakSites(
        peak_bytes=sum(n.extra_fields.alloc_size for n in blocks),
        by_module=_top(blocks, lambda n: _module_of(n, paths), top),
        by_source=_top(blocks, _source_of, top),
    )


def _allocations(roots: list[Any]) -> Iterator[Any]:
    stack = list(roots)
    while stack:
        node = stack.pop()
        kind = type(node.extra_fields).__name__
        if kind == "_ExtraFields_Allocation" and str(node.extra_fields.device) == "cpu":
            yield node
        stack.extend(node.children)


def _top(blocks: list[Any], key: Any, top: int) -> tuple[Site, ...]:
    groups: dict[str, list[int]] = {}
    for n in blocks:
        g = groups.setdefault(key(n), [0, 0])
        g[0] += n.extra_fields.alloc_size
        g[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    sites = [Site(label, nbytes, count) for label, (nbytes, count) in ranked[:top]]
    rest = ranked[top:]
    if rest:
        sites.append(
            Site(
                f"{len(rest)} other sites",
                sum(v[0] for _, v in rest),
                sum(v[1] for _, v in rest),
            )
        )
    return tuple(sites)


def _module_of(node: Any, paths: dict[int, str]) -> str:
    """The innermost module whose forward the block was allocated in."""
    while node is not None:
        fields = node.extra_fields
        module = getattr(fields, "module", None) if "PyCall" in type(fields).__name__ else None
        if module is not None:
            path = paths.get(module.self_ptr)
            return f"{path} ({module.cls_name})" if path else str(module.cls_name)
        node = node.parent
    return NO_MODULE


def _source_of(node: Any) -> str:
    """'file:function:line' of the innermost frame of the user's code above the block."""
    while node is not None:
        frame = getattr(node.extra_fields, "caller", None)
        if frame is not None and is_users(frame.file_name):
            return f"{_shown(frame.file_name)}:{frame.function_name}:{frame.line_number}"
        node = node.parent
    return NO_SOURCE


@cache
def _not_users_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders |= set(site.getsitepackages()) | {site.getusersitepackages()}
    return tuple(os.path.realpath(f) for f in folders if f)


@cache
def is_users(file_name: str) -> bool:
    """A frame of the user's own code: not of torch, memtrack, pytest or their helpers, the
    standard library or an installed package. The profiler names a file relative to the
    import-path entry it was found under; it is looked up there."""
    if file_name.startswith("<"):  # <string>, <frozen importlib._bootstrap>
        return False
    parts = file_name.replace("\\", "/").split("/")
    top = parts[0] if not os.path.isabs(file_name) else None
    if top is not None and (top in NOT_YOURS or top.removesuffix(".py") in NOT_YOURS):
        return False
    if any(p in ("site-packages", "dist-packages") for p in parts):
        return False
    bad = _not_users_folders()
    candidates = (
        [file_name]
        if os.path.isabs(file_name)
        else [os.path.join(p or ".", file_name) for p in sys.path]
    )
    for path in candidates:
        if os.path.exists(path):
            real = os.path.realpath(path)
            if any(real.startswith(b + os.sep) for b in bad):
                return False
            return not any(f"{os.sep}{name}{os.sep}" in real for name in NOT_YOURS)
    return top is None or top.removesuffix(".py") not in sys.stdlib_module_names


def _shown(file_name: str) -> str:
    """A file as a person reads it: relative to the current folder where it lies under it."""
    if os.path.isabs(file_name):
        rel = os.path.relpath(file_name)
        return file_name if rel.startswith("..") else rel
    return file_name


__all__ = [
    "NO_MODULE",
    "NO_SOURCE",
    "PeakSites",
    "Recording",
    "Site",
    "is_users",
    "module_paths",
    "record_sites",
    "sites_at_peak",
]
