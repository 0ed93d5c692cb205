"""The house rules are enforced, not hoped for: .ci/run runs ruff check, ruff format --check
and mypy before the tests, and the pre-commit hook runs the same commands."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ("ruff check", "ruff format --check", "mypy memtrack dashboard")


def _ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]


def test_ci_runs_every_check_before_the_tests():
    lines = _ci_lines()
    tests_at = next(i for i, line in enumerate(lines) if "&& pytest" in line)
    for check in CHECKS:
        at = next((i for i, line in enumerate(lines) if line.startswith(check)), None)
        assert at is not None and at < tests_at, check


def test_the_pre_commit_hook_runs_the_same_checks():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    entries = [h["entry"] for repo in config["repos"] for h in repo["hooks"]]
    for check in CHECKS:
        assert any(e.startswith(check) for e in entries), check


def test_the_package_says_it_is_typed():
    assert (ROOT / "memtrack" / "py.typed").is_file()
