from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

import memtrack
from memtrack.cli import main


def test_public_api_is_sorted_and_importable():
    assert memtrack.__all__ == sorted(memtrack.__all__)
    for name in memtrack.__all__:
        assert hasattr(memtrack, name)


def test_every_command_has_help():
    runner = CliRunner()
    names = main.list_commands(click.Context(main))
    assert names, "no commands registered"
    for name in names:
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, name
        command = main.get_command(click.Context(main), name)
        assert command and command.help and len(command.help.strip()) > 20, (
            f"{name} has no help text")
        assert name in runner.invoke(main, ["--help"]).output


def test_a_command_imports_no_other_commands_module():
    """`memtrack check` and `memtrack ingest` start without what `run` or `plan` import."""
    code = ("import sys; from memtrack.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('memtrack.commands.')))")
    for name in ("check", "ingest"):
        out = subprocess.run([sys.executable, "-c", code, name, "--help"], capture_output=True,
                             text=True, check=True)
        loaded = out.stdout.strip().splitlines()[-1]
        assert "memtrack.commands.run" not in loaded and f"memtrack.commands.{name}" in loaded


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
