"""Which source files are the workload's own: not torch, not memtrack (its shipped examples
are a workload), not an installed package, not the standard library. A site of memory is
named by the innermost frame in such a file. Nothing here imports torch."""

from __future__ import annotations

import importlib.util
import os
import re
import sysconfig
from pathlib import Path


def _skipped_roots() -> tuple[str, ...]:
    memtrack_root = Path(__file__).resolve().parents[1]
    roots = {str(memtrack_root)}
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        roots.add(str(Path(spec.origin).resolve().parent))
    roots.update(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots))


_SKIPPED = _skipped_roots()
_EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples") + os.sep
NO_SOURCE = "(no frame of the workload's own)"
"""The source site of memory that no frame of the workload's own file allocated."""
_OWN: dict[str, bool] = {}
_INSTALLED = re.compile(r"/(site-packages|dist-packages)/|/lib/python\d+\.\d+/")
"""Installed packages and the standard library by their paths' shape, as another machine
(the GPU runner that wrote a snapshot) lays them out."""


def own(filename: str) -> bool:
    """Whether a frame's file is the workload's own (cached: asked for every frame)."""
    found = _OWN.get(filename)
    if found is None:
        path = os.path.realpath(filename)
        found = path.startswith(_EXAMPLES) or (
            not path.startswith(_SKIPPED)
            and not filename.startswith("<")
            and not _INSTALLED.search(filename)
        )
        _OWN[filename] = found
    return found


def named(filename: str, root: Path | None) -> str:
    """A file as the repository names it (relative to `root`), else its name alone."""
    path = Path(filename)
    if root is not None:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return path.name
