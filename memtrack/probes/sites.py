"""Where the peak's memory was allocated: the tensors alive at one iteration's peak, grouped
by the `nn.Module` that made them and by the source site (the innermost frame in the
workload's own code, outside torch, memtrack and installed packages, as `file:function`).

One extra iteration, after the memory pass, under a dispatch mode (`SiteMode`) that notes
each new storage an op returns: its bytes, the module path running then (from global module
hooks, per thread) and the source site. A storage's finalizer takes it off when it is freed,
so the running totals by module and by site are those of the live storages; at each new high
of their sum both are copied. What was alive when the iteration started (weights, inputs,
optimizer state) is attributed by what holds it: a parameter or buffer to its module,
optimizer state and tensors held from setup to a group of their own, their site `(setup)`. A
pair of the top ones keeps its frames in the workload's own files: the allocating line's
calls and where its module was made; a weight's or buffer's, where it was registered
(probes.made, noted while the case set up). The measured peak less this pass's tensor peak
is kernel scratch and allocator rounding (no tensor holds it): one row of its own, so that
the sites sum to the peak. The gated figures are never read from this pass.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from memtrack.probes.framework import live_tensors
from memtrack.probes.made import Made, joined, own_frames
from memtrack.records.model import BACKWARD, SETUP, Site, pair_key, pair_parts
from memtrack.workload.frames import NO_SOURCE, named, own

TOP = 20
"""Sites kept per grouping whatever their size; the rest is one row."""
KEPT, SMALLEST = 500, 1 / 1000
"""Beyond TOP, sites kept up to KEPT per grouping while each holds at least SMALLEST of the
peak: a site small in the baseline that grows in a change is then diffed against its own
baseline bytes, not read as new while its bytes hide in the baseline's rest."""
MODULE, SOURCE, PAIR, RETAINED = "module", "source", "pair", "retained"
HELD = "(held from setup)"
OPTIMIZER = "(optimizer state)"
NO_MODULE = "(no module)"
SCRATCH = "(inside kernels: no tensor holds it)"
REST = "(the rest)"


class SiteMode(TorchDispatchMode):
    """Notes each new storage an op returns on `device`, with its module and source site."""

    def __init__(
        self,
        device: torch.device,
        names: dict[int, str],
        root: Path | None,
        made: Made | None = None,
    ):
        super().__init__()
        self.device = device
        self.names = names
        """id(module) -> its path among the marked modules."""
        self.root = root
        self.made = made
        self.stacks: dict[tuple[str, int], tuple[str, ...]] = {}
        """(source site, line) -> the own frames it was first reached through, innermost
        first."""
        self.module_frames: dict[str, tuple[str, ...]] = {}
        """A module path -> where its module was made (probes.made)."""
        self.setup_frames: dict[str, tuple[int, tuple[str, ...]]] = {}
        """A '(setup)' pair -> its largest weight's or buffer's bytes and where it was made."""
        self.local = threading.local()
        self.lock = threading.Lock()
        self.live: dict[int, tuple[int, str, str, str, int | None]] = {}
        """A live storage's finalizer key -> (bytes, module, source, their pair, line)."""
        self.by_module: dict[str, int] = {}
        self.by_source: dict[str, int] = {}
        self.by_pair: dict[str, int] = {}
        self.lines: dict[str, dict[int, int]] = {}
        """Per source site, the bytes alive that each of its lines allocated."""
        self.peak_lines: dict[str, dict[int, int]] = {}
        """`lines` at the pass's peak: a site's line is the one holding most of the peak
        (the forward that made a step's saved activations, not the backward that frees
        them), not the one that allocated most over the iteration."""
        self.total = 0
        self.peak = -1
        self.peak_groups: tuple[dict[str, int], ...] = ({}, {}, {})
        self._seen: Any = WeakIdKeyDictionary()
        self._next = 0
        self._files: dict[str, str] = {}

    # the module stack, per thread (concurrent sessions run in threads)
    def stack(self) -> list[str]:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def enter_module(self, module: Any, _inputs: Any) -> None:
        name = self.names.get(id(module))
        if name is None and not self.stack():  # a model no mark named: its paths from here
            self.names.update(module_names((module,)))
            name = self.names[id(module)]
        elif name is None:
            name = f"{self.stack()[-1]}.{type(module).__name__}"
        if self.made is not None and name not in self.module_frames:
            self.module_frames[name] = self.made.of_module(module)
        self.stack().append(name)

    def leave_module(self, _module: Any, _inputs: Any, _outputs: Any) -> None:
        if self.stack():
            self.stack().pop()

    def _source(self) -> tuple[str, int | None]:
        frame = sys._getframe(2)
        while frame is not None:
            if own(frame.f_code.co_filename):
                source = f"{self._file(frame.f_code.co_filename)}:{frame.f_code.co_name}"
                if (source, frame.f_lineno) not in self.stacks:
                    self.stacks[source, frame.f_lineno] = own_frames(frame, self.root, self._files)
                return source, frame.f_lineno
            frame = frame.f_back  # type: ignore[assignment]
        return NO_SOURCE, None

    def frames(self, pair: str, line: int | None) -> tuple[str, ...]:
        """A pair's frames (Site.frames): its line's calls, then where its module was made;
        a '(setup)' pair's, where its largest tensor was made."""
        module, source = pair_parts(pair)
        if source == SETUP:
            return self.setup_frames.get(pair, (0, ()))[1]
        stack = self.stacks.get((source, line), ()) if line is not None else ()
        return joined(stack, self.module_frames.get(module, ()))

    def _file(self, filename: str) -> str:
        """The file as the repository names it (cached: asked for every allocation)."""
        found = self._files.get(filename)
        if found is None:
            found = self._files[filename] = named(filename, self.root)
        return found

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device == self.device:
                self._note(t)
        return out

    def _note(self, t: torch.Tensor) -> None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if storage in self._seen or storage.nbytes() == 0:
            return
        self._seen[storage] = True
        stack = self.stack()
        in_backward = torch._C._current_graph_task_id() != -1
        module = stack[-1] if stack else (BACKWARD if in_backward else NO_MODULE)
        source, line = self._source()
        self.add(storage, storage.nbytes(), module, source, line)

    def add(self, owner: Any, nbytes: int, module: str, source: str, line: int | None) -> None:
        """Count `nbytes` held by `owner` (a storage) until it is freed."""
        with self.lock:
            key = self._next
            self._next += 1
            pair = pair_key(module, source)
            self.live[key] = (nbytes, module, source, pair, line)
            self.by_module[module] = self.by_module.get(module, 0) + nbytes
            self.by_source[source] = self.by_source.get(source, 0) + nbytes
            self.by_pair[pair] = self.by_pair.get(pair, 0) + nbytes
            if line is not None:
                at = self.lines.setdefault(source, {})
                at[line] = at.get(line, 0) + nbytes
            self.total += nbytes
            if self.total > self.peak:
                self.peak = self.total
                self.peak_groups = (
                    dict(self.by_module),
                    dict(self.by_source),
                    dict(self.by_pair),
                )
                self.peak_lines = {s: dict(at) for s, at in self.lines.items()}
        weakref.finalize(owner, self._free, key)

    def _free(self, key: int) -> None:
        with self.lock:
            found = self.live.pop(key, None)
            if found is None:
                return
            nbytes, module, source, pair, line = found
            self.by_module[module] -= nbytes
            self.by_source[source] -= nbytes
            self.by_pair[pair] -= nbytes
            if line is not None:
                self.lines[source][line] -= nbytes
            self.total -= nbytes

    def retained(self) -> tuple[Site, ...]:
        """What the pass's iteration allocated and still holds (after a collection): what a
        leak keeps, by the pair that made it, largest first, with the line that made most of
        each."""
        kept: dict[str, int] = {}
        lines: dict[str, dict[int, int]] = {}
        with self.lock:
            for nbytes, _, source, pair, line in self.live.values():
                if source == SETUP:
                    continue
                kept[pair] = kept.get(pair, 0) + nbytes
                if line is not None:
                    at = lines.setdefault(pair, {})
                    at[line] = at.get(line, 0) + nbytes
        out = []
        for pair, nbytes in sorted(kept.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]:
            line = max(lines[pair], key=lines[pair].__getitem__) if pair in lines else None
            out.append(Site(RETAINED, pair, nbytes, line, self.frames(pair, line)))
        return tuple(out)

    def close(self) -> None:
        """Stop counting frees (what is freed after the pass is not its business)."""
        with self.lock:
            self.live.clear()


def module_names(objects: tuple[Any, ...]) -> dict[int, str]:
    """id(module) -> its path among the marked modules (the first marked module is the root:
    its own path is its class name)."""
    names: dict[int, str] = {}
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for name, module in obj.named_modules():
                names.setdefault(id(module), name or type(obj).__name__)
    return names


def _attribute_setup(mode: SiteMode, objects: tuple[Any, ...], *, counted: bool = True) -> None:
    """What is alive when the pass starts: parameters and buffers to their modules,
    optimizer state apart, every other live tensor on the device as held from setup. Not
    `counted`, it is only known, so that a view of it (a weight's transpose) is not taken
    for a new allocation."""

    def count(t: torch.Tensor, module: str) -> int:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return 0
        if t.device != mode.device or storage in mode._seen or storage.nbytes() == 0:
            return 0
        mode._seen[storage] = True
        if counted:
            mode.add(storage, storage.nbytes(), module, SETUP, None)
        return storage.nbytes()

    def made_at(module: torch.nn.Module, path: str, tensor: str, nbytes: int) -> None:
        """The pair's frames: where its largest weight or buffer was made."""
        pair = pair_key(path, SETUP)
        if mode.made is not None and nbytes > mode.setup_frames.get(pair, (0, ()))[0]:
            mode.setup_frames[pair] = (nbytes, mode.made.of_tensor(module, tensor))

    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            root = type(obj).__name__
            for name, module in obj.named_modules():
                path = name or root
                for tensors in (module.named_parameters, module.named_buffers):
                    for tensor, t in tensors(recurse=False):
                        made_at(module, path, tensor, count(t, path))
                        if isinstance(t, torch.nn.Parameter) and t.grad is not None:
                            count(t.grad, path)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        count(value, OPTIMIZER)
    for t in live_tensors(mode.device):
        count(t, HELD)


@contextlib.contextmanager
def recording(
    device: torch.device,
    objects: tuple[Any, ...],
    root: Path | None,
    *,
    setup: bool = True,
    made: Made | None = None,
) -> Iterator[SiteMode]:
    """The sites of what one iteration inside the block allocates on `device`, with what was
    alive at its start (without `setup`: only what the block allocates, a span's rise), and
    with `made`, where the case's modules and tensors were made. A concurrent case's session
    threads enter `mode` themselves (a dispatch mode is per thread)."""
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    mode = SiteMode(device, module_names(objects), root, made)
    _attribute_setup(mode, objects, counted=setup)
    pre = register_module_forward_pre_hook(mode.enter_module)
    post = register_module_forward_hook(mode.leave_module)
    try:
        yield mode
    finally:
        pre.remove()
        post.remove()
        mode.close()


def sites(
    mode: SiteMode, measured_peak: int | None, top: int = TOP, upto: int = KEPT
) -> tuple[Site, ...]:
    """The top `top` sites of each grouping at the pass's peak (and beyond them those of
    SMALLEST of the peak or more, `upto` at most), the rest as one row, and
    what the measured peak holds beyond the pass's tensors as another: each grouping sums
    to the measured peak (to the pass's own where the measured one is lower)."""
    by_module, by_source, by_pair = mode.peak_groups
    scratch = max(0, (measured_peak or 0) - max(mode.peak, 0))
    out: list[Site] = []
    for grouping, groups in ((MODULE, by_module), (SOURCE, by_source), (PAIR, by_pair)):
        ranked = sorted(((k, v) for k, v in groups.items() if v > 0), key=lambda kv: -kv[1])
        least = SMALLEST * max(measured_peak or 0, mode.peak)
        kept = [kv for i, kv in enumerate(ranked) if i < top or (i < upto and kv[1] >= least)]
        for i, (key, nbytes) in enumerate(kept):
            source = pair_parts(key)[1] if grouping == PAIR else key
            lines = mode.peak_lines.get(source) if grouping != MODULE else None
            line = max(lines, key=lines.__getitem__) if lines else None
            frames = mode.frames(key, line) if grouping == PAIR and i < top else ()
            out.append(Site(grouping, key, nbytes, line, frames))
        rest = sum(v for _, v in ranked[len(kept) :])
        if rest:
            out.append(Site(grouping, REST, rest))
        if scratch:
            out.append(Site(grouping, SCRATCH, scratch))
    return tuple(out)


__all__ = ["Site", "SiteMode", "module_names", "recording", "sites"]
