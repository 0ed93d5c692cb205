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


# -- first contact: what a newcomer meets in the first minutes ------------------------------

BROKEN = """
import memtrack

@memtrack.workload(params={"batch": 2})
def train_step(ctx):
    def step():
        raise ValueError("shapes (2, 3) and (4, 5) do not multiply")
    return step
"""


def _repo(tmp_path: Path, workload: str = BROKEN) -> Path:
    repo = init_repo(tmp_path / "repo")
    (repo / "wl.py").write_text(workload)
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    commit_all(repo, "a suite")
    return repo


def test_run_outside_a_git_repository_is_refused_and_records_nothing(tmp_path):
    (tmp_path / "wl.py").write_text(WORKLOAD)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    line = _one_line_error(_memtrack("run", "--db", str(tmp_path / "m.db"), cwd=tmp_path))
    assert "not inside a git repository with a commit" in line
    assert not (tmp_path / "m.db").exists()


def test_run_says_why_a_case_failed_on_its_line(tmp_path):
    repo = _repo(tmp_path)
    res = _memtrack("run", "--db", str(tmp_path / "m.db"), cwd=repo)
    assert res.returncode == 0, res.stderr  # a failure is data, recorded
    (line,) = [x for x in res.stderr.splitlines() if "train_step[batch=2] (" in x]
    assert line.split()[0] == "error"
    assert line.endswith(": ValueError: shapes (2, 3) and (4, 5) do not multiply")


def test_run_into_a_folder_that_does_not_exist_is_refused_and_makes_none(tmp_path):
    repo = _repo(tmp_path, WORKLOAD)
    missing = tmp_path / "nonexistent" / "dir"
    line = _one_line_error(_memtrack("run", "--db", str(missing / "x.db"), cwd=repo))
    assert f"--db {missing / 'x.db'}: no such folder {missing}" in line
    assert not (tmp_path / "nonexistent").exists()


def test_check_under_a_config_whose_module_cannot_be_found_says_so(project):
    repo, db, _ = project
    (repo / "memtrack.toml").write_text('modules = ["perf/workloads.py"]\n')
    line = _one_line_error(_memtrack("check", "--db", str(db), cwd=repo))
    assert "modules: cannot find 'perf/workloads.py'" in line
    (repo / "memtrack.toml").write_text('modules = ["perf.workloads"]\n')
    assert "cannot find 'perf.workloads'" in _one_line_error(
        _memtrack("check", "--db", str(db), cwd=repo)
    )
    assert _verdicts(db) == 0


def test_show_takes_a_commit_and_history_lists_the_run_ids_it_takes(project):
    repo, db, run_id = project
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    shown = CliRunner().invoke(main, ["show", sha[:7], "--db", str(db)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert run_id in shown.output
    history = CliRunner().invoke(main, ["history", "decoder", "--db", str(db)], terminal_width=200)
    assert run_id[:12] in history.output
    by_id = CliRunner().invoke(main, ["show", run_id[:12], "--db", str(db)], terminal_width=200)
    assert by_id.exit_code == 0 and run_id in by_id.output
    nothing = CliRunner().invoke(main, ["show", "abcdef1", "--db", str(db)])
    assert nothing.exit_code == 2 and "no run or commit 'abcdef1'" in nothing.output


@pytest.mark.parametrize("command", [["run"], ["snapshot"]])
def test_a_misspelt_case_gets_a_did_you_mean(tmp_path, command):
    repo = _repo(tmp_path)
    args = [*command, "-k", "trian"] if command == ["run"] else [*command, "trian"]
    line = _one_line_error(_memtrack(*args, "--db", str(tmp_path / "m.db"), cwd=repo))
    assert "did you mean train_step" in line
    assert not (tmp_path / "m.db").exists()
