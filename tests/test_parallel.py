"""The README's test command runs the tests on every core (`pytest -n auto`), and a fixture
that the tests of a module share (a recorded run, a built wheel: seconds to make) is made
once, on one worker, not once on each worker that runs one of its tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")

SHARED = """
import os
import pytest

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    with open(os.environ["MADE"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return 1

@pytest.fixture
def through_another(recorded):
    return recorded

@pytest.mark.parametrize("i", range(4))
def test_uses_it(recorded, i):
    assert recorded == 1

@pytest.mark.parametrize("i", range(4))
def test_uses_it_through_another_fixture(through_another, i):
    assert through_another == 1

@pytest.mark.parametrize("i", range(8))
def test_needs_nothing(i):
    pass
"""


def _without_pytest_variables() -> dict[str, str]:
    """This process's environment less what pytest-xdist set for this worker, and no
    plugin loaded but those named."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def test_a_module_fixture_is_made_once_on_one_worker(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    # The suite's own conftest, loaded whole under another name (its hooks are what is tested).
    (project / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(CONFTEST)!r})\n"
        "suite = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(suite)\n"
        "pytest_cmdline_main = suite.pytest_cmdline_main\n"
        "pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler\n"
    )
    (project / "test_shared.py").write_text(SHARED)
    made = tmp_path / "made.txt"
    done = subprocess.run(
        # pytest-xdist alone of the installed plugins (the others only cost their import)
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "xdist.plugin",
            "-n",
            "2",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=project,
        env={**_without_pytest_variables(), "MADE": str(made)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16 passed" in done.stdout
    assert len(made.read_text().splitlines()) == 1, made.read_text()
