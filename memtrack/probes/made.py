"""Where the persistent set was made: while a case sets up, the frames in the workload's own
files (workload.frames.own) at which each parameter, buffer and submodule was registered on
its module, innermost first. A weights' or buffers' growth is then named by the line that
made the grown tensor ('`Tiny` made at tiny/model.py:10'), and a pull request's changed line
among those frames is where its annotation points (probes.sites keeps them on each site).

Global registration hooks of `torch.nn` (`register_module_*_registration_hook`): a tensor
assigned to a module attribute, `register_buffer`, or a submodule assigned in `__init__`.
Keyed by the module object and the tensor's name, so that `.to(device)` or `.half()`, which
swap a tensor under its name, keep where it was made."""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memtrack.workload.frames import named, own

DEPTH = 8
"""Frames kept per registration, innermost first."""


def own_frames(frame: Any, root: Path | None, files: dict[str, str]) -> tuple[str, ...]:
    """The frames from `frame` outwards that are in the workload's own files, as
    'file:line' (the file as the repository names it; `files` caches those names), DEPTH
    at most."""
    out: list[str] = []
    while frame is not None and len(out) < DEPTH:
        filename = frame.f_code.co_filename
        if own(filename):
            name = files.get(filename)
            if name is None:
                name = files[filename] = named(filename, root)
            out.append(f"{name}:{frame.f_lineno}")
        frame = frame.f_back
    return tuple(out)


class Made:
    """Where each module, and each tensor under its name on a module, was registered."""

    def __init__(self, root: Path | None):
        self.root = root
        self.modules: Any = weakref.WeakKeyDictionary()
        """module -> its frames where it was first made a child of another."""
        self.births: Any = weakref.WeakKeyDictionary()
        """module -> the frames that constructed it (outside its own constructor), read at
        the first registration on it."""
        self.tensors: Any = weakref.WeakKeyDictionary()
        """module -> {tensor name: the frames where it was registered}."""
        self._files: dict[str, str] = {}

    def _frames(self, on: Any) -> tuple[str, ...]:
        """The own frames of a registration on module `on` (called from its hook); the
        first one on it also notes the frames that construct it."""
        frame = sys._getframe(2)
        if on not in self.births:
            outside: Any = frame
            while outside is not None and outside.f_locals.get("self") is on:
                outside = outside.f_back  # its constructor, and what it called on itself
            self.births[on] = own_frames(outside, self.root, self._files)
        return own_frames(frame, self.root, self._files)

    def _tensor(self, module: Any, name: str, value: Any) -> None:
        if value is not None:
            self.tensors.setdefault(module, {})[name] = self._frames(module)

    def _module(self, parent: Any, _name: str, value: Any) -> None:
        if value is not None:
            frames = self._frames(parent)
            if value not in self.modules:
                self.modules[value] = frames

    def of_module(self, module: Any) -> tuple[str, ...]:
        """Where `module` was made: the frames that constructed it, else (a module holding
        nothing of its own) where it was made a child of another."""
        return self.births.get(module) or self.modules.get(module) or ()

    def of_tensor(self, module: Any, name: str) -> tuple[str, ...]:
        """Where `module`'s tensor `name` was registered, then where `module` was made."""
        return joined(self.tensors.get(module, {}).get(name, ()), self.of_module(module))


def joined(*frames: tuple[str, ...]) -> tuple[str, ...]:
    """Frames one after another, each once, DEPTH at most."""
    return tuple(dict.fromkeys(f for part in frames for f in part))[:DEPTH]


@contextlib.contextmanager
def making(root: Path | None) -> Iterator[Made]:
    """Note where the modules and tensors registered inside the block are made."""
    from torch.nn.modules.module import (
        register_module_buffer_registration_hook,
        register_module_module_registration_hook,
        register_module_parameter_registration_hook,
    )

    made = Made(root)
    handles = (
        register_module_parameter_registration_hook(made._tensor),
        register_module_buffer_registration_hook(made._tensor),
        register_module_module_registration_hook(made._module),
    )
    try:
        yield made
    finally:
        for h in handles:
            h.remove()


__all__ = ["DEPTH", "Made", "joined", "making", "own_frames"]
