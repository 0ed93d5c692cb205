"""Print the package's structure: modules, flat modules, import cycles, loops of packages,
private names imported across modules (imports inside functions counted), the largest
files, the functions over 80 lines (in the package and in dashboard/ beside it), the SQL
run by the judge, report/check.py's size, and the pairs of places the `duplicates` tool
finds in the package (where it is on the PATH).

    python scripts/structure.py [PACKAGE_DIR]     (default: memtrack/)

The same measurement backs tests/test_layout.py, which holds the layout to its rules.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Structure:
    """What the import graph of one package looks like."""

    modules: dict[str, Path]
    """Module name -> file."""
    imports: dict[str, set[str]] = field(default_factory=dict)
    """Module -> the package's modules it imports (at any depth of the file)."""
    private: list[tuple[str, str, str]] = field(default_factory=list)
    """(importer, imported module, name) for each `_name` taken from another module."""

    @property
    def flat(self) -> list[str]:
        top = next(iter(self.modules)).split(".")[0]
        return sorted(
            m
            for m, p in self.modules.items()
            if m.count(".") == 1 and p.name != "__init__.py" and m != top
        )

    def cycles(self) -> list[list[str]]:
        """The strongly connected components of more than one module (Tarjan)."""
        return _components(self.imports)

    def package_imports(self) -> dict[str, set[str]]:
        """Subpackage -> the other subpackages its modules import (the flat top level, the
        shared basics every stage may import, aside)."""
        top = next(iter(self.modules)).split(".")[0]

        def package(module: str) -> str | None:
            parts = module.split(".")
            if len(parts) > 2 or (len(parts) == 2 and self.modules[module].name == "__init__.py"):
                return ".".join(parts[:2])
            return None  # the package itself, or a flat module of its top level

        out: dict[str, set[str]] = {}
        for importer, targets in self.imports.items():
            a = package(importer)
            if a is None or a == top:
                continue
            for target in targets:
                b = package(target)
                if b is not None and b != a:
                    out.setdefault(a, set()).add(b)
        return out

    def package_cycles(self) -> list[list[str]]:
        """Loops between subpackages: one stage importing another that imports it back,
        whichever modules carry the arrows."""
        return _components(self.package_imports())


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node of `graph` (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def measure(package: Path) -> Structure:
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    s = Structure({module_name(p, package): p for p in files})
    for name, path in s.modules.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    target = _known(a.name, s.modules)
                    if target:
                        found.add(target)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, is_pkg)
                if base is None:
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in s.modules:  # `from pkg import module`
                        found.add(sub)
                        continue
                    target = _known(base, s.modules)
                    if target:
                        found.add(target)
                        if a.name.startswith("_") and target != name:
                            s.private.append((name, target, a.name))
        found.discard(name)
        s.imports[name] = found
    return s


def _absolute(node: ast.ImportFrom, importer: str, is_pkg: bool) -> str | None:
    if node.level == 0:
        return node.module
    base = importer.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def main(argv: list[str]) -> int:
    package = Path(argv[0] if argv else Path(__file__).resolve().parents[1] / "memtrack")
    s = measure(package)
    sizes = sorted(
        ((len(p.read_text(encoding="utf-8").splitlines()), m) for m, p in s.modules.items()),
        reverse=True,
    )
    packages = sorted(m for m, p in s.modules.items() if p.name == "__init__.py")
    print(f"modules: {len(s.modules)} in {len(packages)} packages")
    print(f"flat modules at the top: {len(s.flat)} ({', '.join(s.flat)})")
    cycles = s.cycles()
    print(f"import cycles: {len(cycles)}")
    for c in cycles:
        print(f"  {' <-> '.join(c)}")
    loops = s.package_cycles()
    print(f"package loops: {len(loops)}")
    for c in loops:
        print(f"  {' <-> '.join(c)}")
    print(f"private names imported across modules: {len(s.private)}")
    for importer, target, name in s.private:
        print(f"  {importer} takes {name} from {target}")
    print("largest files: " + ", ".join(f"{m} {n}" for n, m in sizes[:5]))
    long = long_functions([package, package.parent / "dashboard"])
    print(f"functions over {LONG} lines: {len(long)}")
    for n, where in long:
        print(f"  {where} {n}")
    judge = package / "judge"
    sql = sum(p.read_text(encoding="utf-8").count("execute") for p in sorted(judge.glob("*.py")))
    print(f"`execute` in {package.name}/judge: {sql}")
    check = package / "report" / "check.py"
    if check.is_file():
        print(f"{package.name}/report/check.py: {len(check.read_text().splitlines())} lines")
    print(f"duplicates in {package.name}/: {duplicate_pairs(package)}")
    return 0


LONG = 80
"""A function longer than this is several functions (schema literals aside)."""


def long_functions(folders: list[Path]) -> list[tuple[int, str]]:
    """(lines, 'file:function') of every function longer than LONG, longest first."""
    out = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > LONG:
                        out.append((n, f"{path.relative_to(folder.parent)}:{node.name}"))
    return sorted(out, reverse=True)


def duplicate_pairs(package: Path) -> str:
    """The first line of `duplicates` run in the package's folder, where it is installed."""
    import shutil
    import subprocess

    if shutil.which("duplicates") is None:
        return "the `duplicates` tool is not on the PATH"
    out = subprocess.run(
        ["duplicates", "--seconds", "60"], cwd=package, capture_output=True, text=True
    )
    return (out.stdout.splitlines() or ["(no answer)"])[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
