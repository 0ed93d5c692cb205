from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from factories import commit_all, init_repo, make_measurement, make_run

import memtrack
from memtrack.cli import main
from memtrack.store.database import Store


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
            f"{name} has no help text"
        )
        assert name in runner.invoke(main, ["--help"]).output


def test_a_command_imports_no_other_commands_module():
    """`memtrack check` and `memtrack ingest` start without what `run` or `plan` import."""
    code = (
        "import sys; from memtrack.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('memtrack.commands.')))"
    )
    for name in ("check", "ingest"):
        out = subprocess.run(
            [sys.executable, "-c", code, name, "--help"], capture_output=True, text=True, check=True
        )
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


# -- edges of the command line: each one line, exit 2, nothing written --------------------


def _memtrack(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )


def _one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memtrack: error: "), res.stderr
    return lines[0]


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path, str]:
    """A repository with a config, and a database holding one run of its HEAD."""
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    sha = commit_all(repo, "a project")
    db = tmp_path / "m.db"
    run = make_run([make_measurement("decoder", {"batch": 1})], commit=sha)
    with Store.open(db) as store:
        store.write_run(run)
    return repo, db, run.run_id


def _verdicts(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("select count(*) from verdicts").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize(
    "args, words",
    [
        (["check", "--base", "--output=X"], "--base: '--output=X' is not a branch name"),
        (["check", "--history", "--anchor", "--output=X"], "--anchor: '--output=X' is not a tag"),
        (["check", "--history", "--anchor", "-5"], "--anchor: '-5' is not a tag"),
        (["check", "--history", "--anchor", "0"], "--anchor: '0' is not a tag"),
        (["check", "--anchor", "3"], "--anchor and -k/--workload go with --history"),
        (["check", "--json", "/proc/version"], "--json /proc/version: "),
        (["check", "--markdown", "missing/folder/v.md"], "no such folder missing/folder"),
        (
            ["history", "decoder", "-n", "99999999999999999999999"],
            "Invalid value for '-n' / '--limit'",
        ),
    ],
)
def test_a_bad_option_of_check_or_history_is_one_line_and_records_nothing(project, args, words):
    repo, db, _ = project
    res = _memtrack(*args, "--db", str(db), cwd=repo)
    assert words in _one_line_error(res)
    assert _verdicts(db) == 0  # nothing judged and recorded before the refusal
    assert not (repo / "missing").exists()  # no folder made


WORKLOAD = """
import memtrack

@memtrack.workload
def tiny(ctx):
    return lambda: None
"""


@pytest.mark.parametrize(
    "args, words",
    [
        (["run", "--no-db"], "--no-db without --json would measure the suite and keep nothing"),
        (["run", "--shard", "1/9999999999999999999"], "--shard: '1/9999999999999999999' is not"),
        (["run", "--shard", "+1/2"], "--shard: '+1/2' is not of the form i/n"),
        (["run", "--json", "missing/folder/run.json"], "no such folder missing/folder"),
        (["run", "--config", "."], "Invalid value for '--config'"),
        (["run", "--no-such-option"], "No such option '--no-such-option'"),
        (["hisotry", "x"], "No such command 'hisotry'"),
    ],
)
def test_run_refuses_a_bad_option_before_measuring(tmp_path, args, words):
    (tmp_path / "wl.py").write_text(WORKLOAD)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    res = _memtrack(*args, cwd=tmp_path)
    line = _one_line_error(res)
    assert words in line, line
    assert "running" not in res.stdout + res.stderr
    assert not (tmp_path / "missing").exists() and not (tmp_path / "data").exists()


def test_two_workloads_of_one_name_in_a_module_are_refused(tmp_path):
    (tmp_path / "wl.py").write_text(
        WORKLOAD + "\n\n@memtrack.workload\ndef tiny(ctx):\n    return lambda: 1\n"
    )
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    line = _one_line_error(_memtrack("run", cwd=tmp_path))
    assert "workload 'tiny' is declared twice" in line and "wl.py" in line


def test_backup_and_export_make_no_missing_folders(project):
    repo, db, _ = project
    for args in (["backup", "missing/folder/copy.db"], ["export", "missing/folder/out"]):
        line = _one_line_error(_memtrack(*args, "--db", str(db), cwd=repo))
        assert "missing" in line and "no such directory" in line, line
        assert not (repo / "missing").exists()
