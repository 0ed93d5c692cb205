"""The package's layout keeps its rules: one package per stage, no import cycle (of modules or
of packages), no private name taken from another module (imports inside functions counted), a
flat top level of at most eight modules, and every module a docstring names exists. Measured
by scripts/structure.py, the same command that prints the structure for people."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "memtrack"


def _structure_module():
    spec = importlib.util.spec_from_file_location("structure", ROOT / "scripts" / "structure.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["structure"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def structure():
    return _structure_module().measure(PACKAGE)


def test_no_import_cycle(structure):
    assert structure.cycles() == []


def test_no_package_imports_a_package_that_imports_it_back(structure):
    # The stages import down their order (measure -> worker -> probes -> records, ...): an
    # arrow back up (probes taking the worker's QualitySpec once did) closes a loop of
    # packages even where no two modules import each other.
    assert structure.package_cycles() == []
    assert "memtrack.worker" not in structure.package_imports().get("memtrack.probes", set())


def test_no_private_name_is_imported_from_another_module(structure):
    assert structure.private == []


def test_the_top_level_keeps_only_entry_points_and_shared_basics(structure):
    assert len(structure.flat) <= 8, structure.flat
    # the entry points (the CLI, `memtrack init`'s scaffold) and the basics every stage
    # shares: units, errors, the config, inert text for every output, bounded reading of a
    # named file
    assert set(structure.flat) <= {
        "memtrack.cli",
        "memtrack.scaffold",
        "memtrack.config",
        "memtrack.errors",
        "memtrack.units",
        "memtrack.escape",
        "memtrack.files",
    }


def test_every_package_says_what_it_is_in_one_docstring():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(ROOT)} has no docstring"


def test_the_measurement_finds_a_cycle_and_a_private_import_in_a_made_up_package(tmp_path):
    # The measurement itself can fail: a package whose modules import each other in a
    # function is a cycle, and a private name taken across them is found.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A package."""\n')
    (pkg / "a.py").write_text("def f():\n    from pkg.b import _g\n    return _g\n")
    (pkg / "b.py").write_text("from pkg import a\n\ndef _g():\n    return a\n")
    s = _structure_module().measure(pkg)
    assert s.cycles() == [["pkg.a", "pkg.b"]]
    assert s.private == [("pkg.a", "pkg.b", "_g")]


def test_the_measurement_finds_a_loop_of_packages_in_a_made_up_package(tmp_path):
    # No module imports one that imports it back, yet the packages x and y do: x.a -> y.b,
    # y.c -> x.d; the flat module pkg.basics, imported both ways, is no package of its own.
    pkg = tmp_path / "pkg"
    for folder in (pkg, pkg / "x", pkg / "y"):
        folder.mkdir()
        (folder / "__init__.py").write_text('"""A package."""\n')
    (pkg / "basics.py").write_text("from pkg.x import d\n")
    (pkg / "x" / "a.py").write_text("from pkg.y import b\nfrom pkg import basics\n")
    (pkg / "x" / "d.py").write_text("X = 1\n")
    (pkg / "y" / "b.py").write_text("Y = 1\n")
    (pkg / "y" / "c.py").write_text("from pkg.x import d\n")
    s = _structure_module().measure(pkg)
    assert s.cycles() == []
    assert s.package_cycles() == [["pkg.x", "pkg.y"]]
    (pkg / "y" / "c.py").write_text("Z = 1\n")
    assert _structure_module().measure(pkg).package_cycles() == []


DOTTED = re.compile(r"(?<![\w./])memtrack(?:\.[a-z_]+)+")
FILE_NAMES = {"memtrack.db", "memtrack.toml", "memtrack.invalid"}


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_module_a_docstring_or_comment_names_exists():
    named = set()
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "dashboard").rglob("*.py")]:
        named |= set(DOTTED.findall(path.read_text()))
    missing = sorted(n for n in named - FILE_NAMES if not _resolves(n))
    assert missing == []
