"""The oracle's hook (scripts/judge_oracle.py tests): where MEMTRACK_ORACLE names a file, every
`memtrack.judge.check.check` and `memtrack.judge.history.analyze_history` of this process writes
its verdicts there, one JSON line each, with the test that made it (PYTEST_CURRENT_TEST, which
pytest sets in its workers and every process they start inherits). Nothing happens without it."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

OUT = os.environ.get("MEMTRACK_ORACLE")
_calls = [0]


def _write(rows: list[dict]) -> None:
    if not rows:
        return
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _call_id() -> tuple[str, str, int]:
    _calls[0] += 1
    test = os.environ.get("PYTEST_CURRENT_TEST", "(no test)").rsplit(" (", 1)[0]
    return test, f"{os.getpid()}:{_calls[0]}", time.time_ns()


def _check_rows(result) -> list[dict]:
    test, call, t = _call_id()
    rows = []
    for v in result.verdicts:
        t_, b = getattr(v, "threshold", None), getattr(v, "baseline_value", None)
        rows.append(
            {
                "source": "tests",
                "test": test,
                "call": call,
                "t": t,
                "case": v.case_id,
                "metric": v.metric,
                "kind": v.kind,
                "blocking": bool(v.blocking),
                "baseline": b,
                "room": None if t_ is None or b is None else float(t_) - float(b),
            }
        )
    return rows


def _history_rows(result) -> list[dict]:
    test, call, t = _call_id()
    rows = []
    for s in result.steps:
        rows.append(
            {
                "source": "tests",
                "test": test,
                "call": call,
                "t": t,
                "case": f"step {s.case_id} {s.commit[:12]}",
                "metric": s.metric,
                "kind": "accepted step" if s.accepted else "step",
                "blocking": False,
                "baseline": s.before,
                "room": s.headroom,
            }
        )
    for c in result.creeps:
        rows.append(
            {
                "source": "tests",
                "test": test,
                "call": call,
                "t": t,
                "case": f"creep {c.case_id}",
                "metric": c.metric,
                "kind": "creep" if c.flagged else "no creep",
                "blocking": bool(c.flagged),
                "baseline": c.anchor_value,
                "room": c.allowed,
            }
        )
    return rows


def _wrap(module, name: str, rows_of) -> None:
    inner = getattr(module, name, None)
    if inner is None or getattr(inner, "_oracle", False):
        return

    def wrapped(*args, **kwargs):
        result = inner(*args, **kwargs)
        try:
            _write(rows_of(result))
        except Exception as exc:  # the oracle never changes what it watches
            print(f"oracle hook: {exc!r}", file=sys.stderr)
        return result

    wrapped._oracle = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = inner  # type: ignore[attr-defined]
    setattr(module, name, wrapped)


_TARGETS = {
    "memtrack.judge.check": ("check", _check_rows),
    "memtrack.judge.history": ("analyze_history", _history_rows),
    "memtrack.judge.gather.history": ("analyze_history", _history_rows),
}


def wrap_all() -> None:
    """Wrap every target module already importable (for pytest, whose assertion rewriting
    imports the package's modules past this finder)."""
    import importlib

    for name, (attr, rows_of) in _TARGETS.items():
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        _wrap(module, attr, rows_of)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _wrap(module, *_TARGETS[self.name])


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, name)
                return spec
        return None


if OUT:
    sys.meta_path.insert(0, _Finder())
