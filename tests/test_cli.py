from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

import memtrack
from memtrack.cli import main


def test_public_api_is_sorted_and_importable():
    assert memtrack.__all__ == sorted(memtrack.__all__)
    for name in memtrack.__all__:
        assert hasattr(memtrack, name)


def test_every_command_has_help():
    runner = CliRunner()
    assert main.commands, "no commands registered"
    for name, command in main.commands.items():
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, name
        assert command.help and len(command.help.strip()) > 20, f"{name} has no help text"


def test_help_does_not_import_torch():
    code = "import sys; from memtrack.cli import main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_doctor_reports_plainly_without_a_gpu(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "doctor", "--db", str(tmp_path / "m.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "torch" in out.stdout and "disk" in out.stdout
    if "nvml" in out.stdout and "WARN nvml" in out.stdout:  # no driver here
        assert out.returncode == 0
        assert "cases run on the CPU" in out.stdout
