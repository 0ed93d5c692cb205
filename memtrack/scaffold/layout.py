"""Whether the repository's own package still builds beside the folders memtrack adds.

setuptools, given a pyproject.toml that names no packages, finds them by itself; in a flat
layout (the package folder at the root) it takes every folder whose name is an identifier,
with or without an `__init__.py`, and refuses to build once it finds more than one:
`perf/` and `data/` beside `tinymlp/` stop `pip install -e .` with "Multiple top-level
packages discovered in a flat-layout". These functions mirror that discovery (without
importing setuptools) and name the table that keeps the package list what it was.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MEMTRACK_FOLDERS = ("perf", "data")
"""The top-level folders `memtrack init` and `memtrack run` add."""

# setuptools.discovery.FlatLayoutPackageFinder._EXCLUDE and FlatLayoutModuleFinder's: names
# that automatic discovery never takes for a package or a module.
_NOT_PACKAGES = (
    "ci bin debian doc docs documentation manpages news newsfragments changelog test tests "
    "unit_test unit_tests example examples scripts tools util utils python build dist venv "
    "env requirements tasks fabfile site_scons benchmark benchmarks exercise exercises "
    "htmlcov [._]*"
).split()
_NOT_MODULES = (
    "setup conftest test tests example examples build toxfile noxfile pavement dodo tasks "
    "fabfile [Ss][Cc]onstruct conanfile manage benchmark benchmarks exercise exercises [._]*"
).split()


@dataclass(frozen=True)
class FlatLayout:
    """What setuptools' automatic discovery finds at the top of a flat layout."""

    packages: tuple[str, ...]
    """Top-level folders it takes for packages, sorted."""
    modules: tuple[str, ...]
    """Top-level .py files it takes for modules, sorted (looked at only where no package is)."""
    has_table: bool = False
    """Whether pyproject.toml has a [tool.setuptools] table already (one more cannot be
    appended)."""

    @property
    def broken(self) -> bool:
        """Whether setuptools refuses to build it (several packages, or several modules)."""
        return len(self.packages) > 1 or (not self.packages and len(self.modules) > 1)

    def without(self, names: tuple[str, ...]) -> FlatLayout:
        return FlatLayout(
            tuple(p for p in self.packages if p not in names),
            tuple(m for m in self.modules if m not in names),
            self.has_table,
        )


def _pyproject(root: Path) -> dict | None:
    try:
        return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


def flat_layout(root: Path) -> FlatLayout | None:
    """What setuptools finds by itself in the repository at `root`; None where it does not
    look (no pyproject.toml with a [project] table built by setuptools, a setup.py or
    setup.cfg, packages, modules or package folders named, or a src/ layout)."""
    data = _pyproject(root)
    if data is None or "project" not in data:
        return None
    if (root / "setup.py").is_file() or (root / "setup.cfg").is_file():
        return None
    backend = str((data.get("build-system") or {}).get("build-backend", "setuptools"))
    tool = (data.get("tool") or {}).get("setuptools") or {}
    named = any(k in tool for k in ("packages", "py-modules", "package-dir", "ext-modules"))
    if not backend.startswith("setuptools") or named or (root / "src").is_dir():
        return None
    packages, modules = [], []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            if entry.name.isidentifier() and not _matches(entry.name, _NOT_PACKAGES):
                packages.append(entry.name)
        elif entry.suffix == ".py" and entry.is_file():
            name = entry.name[:-3]
            if name.isidentifier() and not _matches(name, _NOT_MODULES):
                modules.append(name)
    return FlatLayout(tuple(packages), tuple(modules), "setuptools" in (data.get("tool") or {}))


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatchcase(name, p) for p in patterns)


def keeping_table(layout: FlatLayout) -> str | None:
    """The pyproject.toml table that keeps setuptools building what it found before
    memtrack's folders came (`layout` without them): the one package and its subpackages,
    or the one module. None where there is no one thing to name."""
    own = layout.without(MEMTRACK_FOLDERS)
    if len(own.packages) == 1:
        (name,) = own.packages
        return (
            "[tool.setuptools.packages.find]\n"
            f"include = [{json.dumps(name)}, {json.dumps(name + '.*')}]\n"
        )
    if not own.packages and len(own.modules) == 1 and not own.has_table:
        return f"[tool.setuptools]\npy-modules = [{json.dumps(own.modules[0])}]\n"
    return None


def layout_problem(root: Path) -> str | None:
    """Why setuptools will not build the repository at `root` as it is, and what to add;
    None where it builds (or does not discover by itself)."""
    layout = flat_layout(root)
    if layout is None or not layout.broken:
        return None
    kind, found = ("packages", layout.packages) if layout.packages else ("modules", layout.modules)
    table = keeping_table(layout)
    fix = (
        f"add {' '.join(table.split())}"
        if table
        else "name your packages in [tool.setuptools] packages = [...]"
    )
    return (
        f"setuptools finds several top-level {kind} in this flat layout "
        f"({', '.join(found)}) and refuses to build it (`pip install -e .` fails): {fix}"
    )


__all__ = ["MEMTRACK_FOLDERS", "FlatLayout", "flat_layout", "keeping_table", "layout_problem"]
