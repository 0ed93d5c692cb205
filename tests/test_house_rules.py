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


def test_a_test_that_times_out_says_what_the_machines_load_was(tmp_path):
    """pytest-timeout's limit guards against a hang; a test it stops names the load, so a
    machine too busy to finish in time is told from a hang."""
    import os
    import re
    import subprocess
    import sys

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_hangs.py").write_text(
        "import threading\n\n\ndef test_hangs():\n    threading.Event().wait()\n"
    )
    tests = Path(__file__).resolve().parent
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "timeouts", "-p", "no:cacheprovider"]
        + ["--timeout=1", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tests)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Timeout" in done.stdout
    assert "machine load at the timeout" in done.stdout, done.stdout
    assert re.search(
        r"load average [\d.]+ [\d.]+ [\d.]+ \(1, 5, 15 min\) on \d+ cores", done.stdout
    )
