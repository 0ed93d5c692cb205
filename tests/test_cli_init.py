"""`memtrack init` in repositories that are not memtrack's own: what it writes, that it never
overwrites, what `--check` finds missing; the requirement it pins (what a runner can install,
read from how memtrack was installed); a flat-layout package that still installs beside
perf/ and data/; and the whole path an adopter lives, from a wheel built from this tree into
a fresh virtual environment, through the generated workflow's own steps (run here as a
runner would), to a blocked pull request and the dashboard."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import GIT_ENV, commit_all, git, init_repo, venv_with_this_environment
from gha import load_yaml, run_job

from memtrack.cli import main
from memtrack.config import load_config

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = Path(".github/workflows/memtrack.yml")
HOOK = Path(".github/memtrack-runner-hook.sh")
COMMENT = Path(".github/memtrack-comment.py")
REQ = "memtrack==0.1.0"
SHA = "0123456789abcdef" * 2 + "01234567"


def _init(repo: Path, *args: str):
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        return CliRunner().invoke(main, ["init", *args])
    finally:
        os.chdir(cwd)


def _adopt(repo: Path) -> None:
    """What an adopter does after `memtrack init`: adapt the workload, commit."""
    workloads = repo / "perf" / "workloads.py"
    workloads.write_text(workloads.read_text().replace('"width": 1024', '"width": 512'))
    commit_all(repo, "memtrack")


def _files(repo: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(repo)): p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(repo).parts
    }


def test_init_writes_the_table_workloads_workflow_and_hook_then_nothing_more(tmp_path):
    repo = init_repo(tmp_path / "app")
    pyproject = '[project]\nname = "tiny-llm"\nversion = "0.1"\n\n[tool.ruff]\nline-length = 99\n'
    (repo / "pyproject.toml").write_text(pyproject)
    (repo / "tiny_llm").mkdir()
    (repo / "tiny_llm" / "__init__.py").write_text("")
    res = _init(repo, "--requirement", REQ)
    assert res.exit_code == 0, res.output
    text = (repo / "pyproject.toml").read_text()
    assert text.startswith(pyproject)  # appended, what was there kept byte for byte
    config = load_config(repo / "pyproject.toml")
    assert config.modules == ("perf.workloads",) and config.base_branch == "main"
    assert config.references == repo / "perf" / "references"
    assert "from tiny_llm import build_model" in (repo / "perf/workloads.py").read_text()
    assert os.access(repo / HOOK, os.X_OK)
    # the hook and the comment script are the ones memtrack's own CI uses
    assert (repo / HOOK).read_bytes() == (ROOT / HOOK).read_bytes()
    own_comment = ROOT / "memtrack" / "templates" / "comment.py"
    assert (repo / COMMENT).read_bytes() == own_comment.read_bytes()
    wf = (repo / WORKFLOW).read_text()
    assert 'MEMTRACK_REQUIREMENT: "memtrack==0.1.0"' in wf and 'MEMTRACK_INDEX_URL: ""' in wf
    assert '"$python" -m pip install --quiet -e .  # this repository\'s package' in wf
    lines = res.output.splitlines()
    assert lines[0].startswith("appended pyproject.toml")
    assert lines[1].startswith("appended pyproject.toml") and "setuptools" in lines[1]
    assert any(x.startswith("created  perf/workloads.py") for x in lines)
    assert "next:" in lines and any("memtrack init --check" in x for x in lines)
    # the database is git-ignored by a file of its own: no .gitignore edited
    assert git(repo, "check-ignore", "data/memtrack.db", "data/memtrack.db-wal")
    _adopt(repo)
    assert _init(repo, "--check").exit_code == 0

    before = _files(repo)
    again = _init(repo, "--requirement", REQ)
    assert again.exit_code == 0 and _files(repo) == before
    assert "created" not in again.output and "appended" not in again.output


def test_check_right_after_init_names_the_template_and_what_is_not_committed(tmp_path):
    """What the README promises: `--check` lists what is still missing, and right after
    `memtrack init` that is the workload to adapt and the files to commit (CI checks out
    the commit); once adapted and committed, nothing."""
    repo = init_repo(tmp_path / "app")
    assert _init(repo, "--requirement", REQ).exit_code == 0
    res = _init(repo, "--check")
    assert res.exit_code == 2, res.output
    missing = [line for line in res.output.splitlines() if line.startswith("missing")]
    assert missing[0] == (
        "missing  perf/workloads.py: still the template `memtrack init` wrote: adapt its "
        "workload to your model"
    )
    uncommitted = sorted(line.split(":")[0].split()[-1] for line in missing[1:])
    assert uncommitted == sorted(
        map(str, [COMMENT, HOOK, WORKFLOW, "data/.gitignore", "memtrack.toml", "perf/workloads.py"])
    )
    assert all("not committed: CI checks out the commit" in line for line in missing[1:])
    commit_all(repo, "memtrack, as init wrote it")
    res = _init(repo, "--check")
    assert [line for line in res.output.splitlines() if line.startswith("missing")] == missing[:1]
    workloads = repo / "perf" / "workloads.py"
    workloads.write_text(workloads.read_text().replace('"width": 1024', '"width": 512'))
    res = _init(repo, "--check")
    assert [line for line in res.output.splitlines() if line.startswith("missing")] == [
        "missing  perf/workloads.py: has changes not committed: CI checks out the commit, "
        "without them"
    ]
    commit_all(repo, "the workload adapted")
    res = _init(repo, "--check")
    assert res.exit_code == 0 and res.output == f"{repo.resolve()}: nothing missing\n"


def test_init_never_overwrites_and_without_a_pyproject_writes_memtrack_toml(tmp_path):
    repo = init_repo(tmp_path / "app", branch="trunk")
    (repo / "perf").mkdir()
    (repo / "perf" / "workloads.py").write_text("# ours\n")
    res = _init(repo, "--requirement", REQ)
    assert res.exit_code == 0, res.output
    assert (repo / "perf" / "workloads.py").read_text() == "# ours\n"
    assert "exists   perf/workloads.py" in res.output
    config = load_config(repo / "memtrack.toml")
    assert config.base_branch == "trunk"  # the branch checked out
    wf = load_yaml(repo / WORKFLOW)
    assert wf["on"]["push"]["branches"] == ["trunk"]
    # not a pip project: nothing of it is installed, the workloads import it from its root
    assert "pip install --quiet -e ." not in (repo / WORKFLOW).read_text()
    assert "setuptools" not in res.output


def test_the_generated_workflow_is_valid_and_audited_clean(tmp_path):
    """GitHub's schema (vendored in check-jsonschema) and zizmor, offline, on what init
    writes under .github: the workflow, its comment script, the runner hook. How its jobs
    keep forks off the runners and the database from pull requests' code:
    tests/test_workflows.py, which audits it beside memtrack's own."""
    repo = init_repo(tmp_path / "app")
    (repo / "pyproject.toml").write_text('[project]\nname = "app"\nversion = "1"\n')
    req = f"memtrack @ git+https://github.com/acme/memtrack@{SHA}"
    assert _init(repo, "--requirement", req).exit_code == 0
    for tool, args in (
        ("check-jsonschema", ["--builtin-schema", "vendor.github-workflows", str(repo / WORKFLOW)]),
        ("zizmor", ["--offline", "--no-progress", str(repo / ".github")]),
    ):
        exe = shutil.which(tool, path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        assert exe, f"{tool} is not installed: pip install -e '.[test]'"
        out = subprocess.run([exe, *args], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        if tool == "zizmor":
            assert "No findings" in out.stdout, out.stdout
    wf = load_yaml(repo / WORKFLOW)
    assert wf["env"] == {"MEMTRACK_REQUIREMENT": req, "MEMTRACK_INDEX_URL": ""}
    assert set(wf["jobs"]) == {"measure", "gate", "comment", "fork", "verdict"}


FORMS = (
    "memtrack==VERSION, memtrack @ git+https://HOST/OWNER/REPO@COMMIT (the full 40-digit "
    "commit), memtrack @ https://HOST/PATH/memtrack-VERSION-py3-none-any.whl, or the "
    "absolute path of such a file on the runner"
)


@pytest.mark.parametrize(
    "requirement",
    [
        "memtrack",
        "memtrack>=0.1",
        "memtrack==0.*",
        "memtrack @ git+https://github.com/acme/memtrack@main",
        f"memtrack @ git+https://github.com/acme/memtrack@{SHA[:12]}",
        f"memtrack @ git+https://token@github.com/acme/memtrack@{SHA}",
        f"memtrack @ git+file:///srv/memtrack@{SHA}",
        "memtrack==0.1; rm -rf /",
        "memtrack==0.1 ; python_version > '3'",
        "memtrack @ http://example.org/memtrack-0.1.0-py3-none-any.whl",
        "memtrack @ https://example.org/other-0.1.0-py3-none-any.whl",
        "memtrack @ https://example.org/memtrack/",
        "./dist/memtrack-0.1.0-py3-none-any.whl",  # in the checkout: the pull request's
        "/opt/wheels/memtrack/",  # a folder: pins nothing
        "other==0.1.0",
        "memtrack @ https://example.org/${{ github.token }}/memtrack-0.1.0.tar.gz",
        'memtrack==0.1.0"\nrun: curl evil',
    ],
)
def test_a_requirement_a_runner_cannot_install_pinned_is_refused_and_nothing_written(
    tmp_path, requirement
):
    repo = init_repo(tmp_path / "app")
    res = _init(repo, "--requirement", requirement)
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"memtrack: error: --requirement: {requirement!r} does not pin memtrack to something "
        f"a runner can install (write {FORMS})"
    ]
    assert _files(repo) == {}


@pytest.mark.parametrize(
    "requirement",
    [
        "memtrack==0.1.0",
        "Memtrack == 2.0.1rc1",
        f"memtrack @ git+https://github.com/acme/memtrack@{SHA}",
        f"memtrack @ git+https://git.example.org:8443/ml/memtrack.git@{SHA}#subdirectory=py",
        f"memtrack @ git+ssh://git@github.com/acme/memtrack@{SHA}",
        "memtrack @ https://files.example.org/memtrack-0.1.0-py3-none-any.whl",
        "memtrack @ https://files.example.org/memtrack-0.1.0.tar.gz#sha256=" + "ab" * 32,
        "memtrack @ file:///opt/wheels/memtrack-0.1.0-py3-none-any.whl",
        "/opt/wheels/memtrack-0.1.0-py3-none-any.whl",  # a file on the runner
    ],
)
def test_a_pinned_requirement_is_written_as_given_and_check_accepts_it(tmp_path, requirement):
    repo = init_repo(tmp_path / "app")
    res = _init(repo, "--requirement", requirement)
    assert res.exit_code == 0, res.output
    assert load_yaml(repo / WORKFLOW)["env"]["MEMTRACK_REQUIREMENT"] == requirement
    _adopt(repo)
    assert _init(repo, "--check").exit_code == 0


@pytest.mark.parametrize(
    "value",
    [
        '"memtrack"',
        "memtrack>=0.1",
        '"memtrack @ git+https://github.com/acme/memtrack@main"',
        "'memtrack @ git+https://github.com/acme/memtrack@v1.0'  # a tag moves",
        "${{ vars.MEMTRACK_REQUIREMENT }}",
    ],
)
def test_check_refuses_a_workflow_requirement_that_pins_nothing(tmp_path, value):
    repo = init_repo(tmp_path / "app")
    assert _init(repo, "--requirement", REQ).exit_code == 0
    wf = repo / WORKFLOW
    wf.write_text(
        wf.read_text().replace(f'MEMTRACK_REQUIREMENT: "{REQ}"', f"MEMTRACK_REQUIREMENT: {value}")
    )
    _adopt(repo)
    res = _init(repo, "--check")
    assert res.exit_code == 2
    problems = [line for line in res.output.splitlines() if line.startswith("missing")]
    (line,) = problems
    assert line.startswith(f"missing  {WORKFLOW}: MEMTRACK_REQUIREMENT: ")
    assert "does not pin memtrack to something a runner can install" in line
    assert load_yaml(wf)["env"]["MEMTRACK_REQUIREMENT"].strip() in line  # the value, named


def test_check_refuses_an_index_that_is_no_https_url_or_holds_credentials(tmp_path):
    repo = init_repo(tmp_path / "app")
    assert _init(repo, "--requirement", REQ).exit_code == 0
    _adopt(repo)
    wf = repo / WORKFLOW
    text = wf.read_text()
    for index, said in (
        ("http://pypi.example.org/simple", "is not an https URL of a package index"),
        ("https://ci:s3cret@pypi.example.org/simple", "written with credentials"),
    ):
        wf.write_text(text.replace('MEMTRACK_INDEX_URL: ""', f'MEMTRACK_INDEX_URL: "{index}"'))
        git(repo, "add", "-A")  # committed, so that the value is all --check finds
        git(repo, "commit", "-q", "--allow-empty", "-m", index)
        res = _init(repo, "--check")
        assert res.exit_code == 2
        (line,) = [x for x in res.output.splitlines() if x.startswith("missing")]
        assert line.startswith(f"missing  {WORKFLOW}: MEMTRACK_INDEX_URL: ") and said in line
        assert "s3cret" not in res.output


# -- what init pins by itself: how the memtrack running it was installed (PEP 610) --------


def _installed(site: Path, direct_url: dict | None, version: str = "1.2.3") -> None:
    """memtrack's installed metadata as pip leaves it, first on the import path: its
    METADATA, and its direct_url.json (PEP 610) where it was installed from a URL."""
    info = site / f"memtrack-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: memtrack\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


@pytest.mark.parametrize(
    ("direct_url", "requirement"),
    [
        (
            {
                "url": "https://github.com/acme/memtrack",
                "vcs_info": {"vcs": "git", "commit_id": SHA, "requested_revision": "main"},
            },
            f"memtrack @ git+https://github.com/acme/memtrack@{SHA}",
        ),
        (
            {
                "url": "ssh://git@git.example.org/ml/memtrack.git",
                "vcs_info": {"vcs": "git", "commit_id": SHA},
                "subdirectory": "python",
            },
            f"memtrack @ git+ssh://git@git.example.org/ml/memtrack.git@{SHA}#subdirectory=python",
        ),
        (
            {
                "url": "https://files.example.org/memtrack-1.2.3-py3-none-any.whl",
                "archive_info": {"hashes": {"sha256": "ab" * 32}},
            },
            "memtrack @ https://files.example.org/memtrack-1.2.3-py3-none-any.whl#sha256="
            + "ab" * 32,
        ),
    ],
)
def test_init_pins_the_git_commit_or_archive_memtrack_was_installed_from(
    tmp_path, monkeypatch, direct_url, requirement
):
    _installed(tmp_path / "site", direct_url)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    repo = init_repo(tmp_path / "app")
    res = _init(repo)
    assert res.exit_code == 0, res.output
    assert load_yaml(repo / WORKFLOW)["env"] == {
        "MEMTRACK_REQUIREMENT": requirement,
        "MEMTRACK_INDEX_URL": "",
    }
    assert "make sure that index serves" not in res.output


@pytest.mark.parametrize(
    ("index", "written"),
    [
        ("https://pypi.org/simple/", ""),
        ("https://pypi.example.org/simple/", "https://pypi.example.org/simple"),
    ],
)
def test_init_pins_an_index_install_by_version_and_keeps_an_index_not_pypis(
    tmp_path, monkeypatch, index, written
):
    _installed(tmp_path / "site", None)  # installed by name: no direct_url.json
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PIP_INDEX_URL", index)
    repo = init_repo(tmp_path / "app")
    res = _init(repo)
    assert res.exit_code == 0, res.output
    env = load_yaml(repo / WORKFLOW)["env"]
    assert env == {"MEMTRACK_REQUIREMENT": "memtrack==1.2.3", "MEMTRACK_INDEX_URL": written}
    said = written or "the runners' package index (PyPI's"
    assert f"installs memtrack==1.2.3 from {said}" in res.output
    _adopt(repo)
    assert _init(repo, "--check").exit_code == 0


@pytest.mark.parametrize(
    ("direct_url", "said"),
    [
        (
            {"url": "file:///home/dev/memtrack", "dir_info": {"editable": True}},
            "an editable source tree (file:///home/dev/memtrack)",
        ),
        (
            {"url": "file:///home/dev/memtrack", "dir_info": {}},
            "a folder (file:///home/dev/memtrack)",
        ),
        (
            {
                "url": "file:///tmp/dist/memtrack-1.2.3-py3-none-any.whl",
                "archive_info": {"hashes": {"sha256": "ab" * 32}},
            },
            "a wheel file (file:///tmp/dist/memtrack-1.2.3-py3-none-any.whl)",
        ),
        (
            {"url": "file:///srv/git/memtrack", "vcs_info": {"vcs": "git", "commit_id": SHA}},
            "a git repository (file:///srv/git/memtrack)",
        ),
    ],
)
def test_init_from_a_memtrack_no_runner_can_reach_says_so_and_takes_a_requirement(
    tmp_path, monkeypatch, direct_url, said
):
    _installed(tmp_path / "site", direct_url)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    repo = init_repo(tmp_path / "app")
    res = _init(repo)
    assert res.exit_code == 2
    (line,) = res.output.strip().splitlines()
    assert line == (
        f"memtrack: error: memtrack here was installed from {said}, which a CI runner "
        f"cannot install from: name what the workflow installs with --requirement ({FORMS})"
    )
    assert _files(repo) == {}
    named = _init(repo, "--requirement", f"memtrack @ git+https://github.com/acme/memtrack@{SHA}")
    assert named.exit_code == 0, named.output


def test_an_index_with_credentials_is_never_written(tmp_path, monkeypatch):
    _installed(tmp_path / "site", None)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PIP_INDEX_URL", "https://ci:s3cret@pypi.example.org/simple")
    repo = init_repo(tmp_path / "app")
    res = _init(repo)
    assert res.exit_code == 2 and "s3cret" not in res.output
    assert "https://pypi.example.org/simple is written with credentials" in res.output
    assert _files(repo) == {}
    given = _init(repo, "--requirement", REQ, "--index-url", "https://pypi.example.org/simple")
    assert given.exit_code == 0, given.output
    assert load_yaml(repo / WORKFLOW)["env"]["MEMTRACK_INDEX_URL"] == (
        "https://pypi.example.org/simple"
    )


def test_a_pyproject_the_table_cannot_join_is_refused_whole(tmp_path):
    repo = init_repo(tmp_path / "app")
    (repo / "pyproject.toml").write_text("tool = { ruff = { line-length = 99 } }\n")
    res = _init(repo, "--requirement", REQ)
    assert res.exit_code == 2
    assert "pyproject.toml: a [tool.memtrack] table cannot be added to it as it is" in res.output
    assert "write memtrack.toml instead" in res.output
    assert _files(repo) == {"pyproject.toml": b"tool = { ruff = { line-length = 99 } }\n"}


def test_init_outside_a_git_repository_is_one_line_exit_2(tmp_path):
    res = _init(tmp_path)
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"memtrack: error: {tmp_path.resolve()}: not inside a git "
        "repository (memtrack records every run's commit: `git init` "
        "first)"
    )


def test_check_lists_what_is_missing_and_exits_2(tmp_path):
    repo = init_repo(tmp_path / "app")
    res = _init(repo, "--check")
    assert res.exit_code == 2
    assert res.output.splitlines()[0] == (
        "missing  pyproject.toml: no [tool.memtrack] table (nor a memtrack.toml)"
    )
    # a hand-written config that keeps references and the database where this repository
    # ignores and keeps them
    (repo / ".gitignore").write_text("data/\n")
    (repo / "memtrack.toml").write_text(
        'modules = ["perf.workloads"]\nreferences = "data/references"\ndatabase = "memtrack.db"\n'
    )
    res = _init(repo, "--check")
    assert res.exit_code == 2
    assert res.output.splitlines()[:-1] == [
        f"missing  memtrack.toml: modules: no module perf.workloads under {repo.resolve()}",
        f"missing  {WORKFLOW}: no workflow under .github/workflows runs `memtrack check`",
        f"missing  {HOOK}: the GPU runner's pre-job hook is missing",
        "missing  data/references: git ignores the references folder (.gitignore:1:data/), "
        "and references must be committed: set `references` to a folder git keeps",
        "missing  memtrack.db: the database is not git-ignored: add it to .gitignore",
        "missing  memtrack.toml: not committed: CI checks out the commit, without it "
        "(git add, git commit)",
    ]
    assert res.output.splitlines()[-1].startswith("memtrack: error: 6 thing(s) missing in ")


def test_reference_refuses_a_folder_git_ignores_before_running_anything(tmp_path):
    repo = init_repo(tmp_path / "app")
    (repo / ".gitignore").write_text("data/\n")
    (repo / "wl.py").write_text(
        textwrap.dedent("""
        import memtrack

        @memtrack.workload(tolerance={"cosine": 0.99})
        def one(ctx):
            raise AssertionError("never run: the references could not be committed")
        """)
    )
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\nreferences = "data/references"\n')
    out = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "reference"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (
        f"memtrack: error: {repo.resolve()}/data/references: git ignores it "
        f"(.gitignore:1:data/), and references must be committed: set `references` in "
        f"{repo.resolve()}/memtrack.toml to a folder git keeps, or un-ignore it"
    )
    assert not (repo / "data" / "references").exists()


# -- a flat-layout package still installs beside perf/ and data/ ---------------------------

FLAT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "tinymlp"
version = "0.1"
"""


def _flat_layout(repo: Path, kind: str = "package") -> Path:
    """A repository whose pyproject.toml names no packages: setuptools finds `tinymlp` (a
    package folder, or a module) at the root by itself. tests/ is a folder it never takes."""
    init_repo(repo)
    (repo / "pyproject.toml").write_text(FLAT)
    if kind == "package":
        (repo / "tinymlp" / "layers").mkdir(parents=True)
        (repo / "tinymlp" / "__init__.py").write_text("WIDTH = 64\n")
        (repo / "tinymlp" / "layers" / "__init__.py").write_text("")
    else:
        (repo / "tinymlp.py").write_text("WIDTH = 64\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_tinymlp.py").write_text("")
    return repo


def _venv_with_setuptools(venv: Path) -> Path:
    """A venv without pip of its own, whose pip and setuptools are those of an interpreter
    that builds offline (`_builder`): an editable install needs no network. Its python."""
    builder = _builder()
    subprocess.run([builder, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    paths = subprocess.run(
        [builder, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "builder.pth").write_text(paths)
    return python


def _pip_install_editable(python: Path, repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "pip", "install", "-e", ".", "--no-deps", "--no-build-isolation"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


def _imported_from(python: Path, module: str, cwd: Path) -> str:
    out = subprocess.run(
        [python, "-c", f"import {module}; print({module}.__file__)"],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(
    ("kind", "table", "module"),
    [
        (
            "package",
            '[tool.setuptools.packages.find]\ninclude = ["tinymlp", "tinymlp.*"]',
            "tinymlp.layers",
        ),
        ("module", '[tool.setuptools]\npy-modules = ["tinymlp"]', "tinymlp"),
    ],
)
def test_a_flat_layout_project_still_installs_after_init_and_check_says_when_it_would_not(
    tmp_path, kind, table, module
):
    repo = _flat_layout(tmp_path / "tinymlp", kind)
    res = _init(repo, "--requirement", REQ)
    assert res.exit_code == 0, res.output
    assert (repo / "perf").is_dir() and (repo / "data").is_dir()
    pyproject = repo / "pyproject.toml"
    assert pyproject.read_text().endswith(table + "\n")
    assert "setuptools' package list" in res.output
    python = _venv_with_setuptools(tmp_path / "venv")
    installed = _pip_install_editable(python, repo)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert _imported_from(python, module, tmp_path / "venv").startswith(str(repo))
    _adopt(repo)
    assert _init(repo, "--check").exit_code == 0

    # Without that table, setuptools refuses to build, and --check says so with the fix.
    text = pyproject.read_text()
    pyproject.write_text(text[: text.index("# setuptools would")])
    commit_all(repo, "without the table")
    refused = _pip_install_editable(python, repo)
    assert refused.returncode != 0
    assert "Multiple top-level packages discovered in a flat-layout: ['data', 'perf'" in (
        refused.stdout + refused.stderr
    )
    check = _init(repo, "--check")
    assert check.exit_code == 2
    found = "data, perf, tinymlp" if kind == "package" else "data, perf"
    assert [line for line in check.output.splitlines() if line.startswith("missing")] == [
        f"missing  pyproject.toml: setuptools finds several top-level packages in this flat "
        f"layout ({found}) and refuses to build it (`pip install -e .` fails): "
        f"add {' '.join(table.split())}"
    ]


def test_where_init_cannot_name_the_package_it_says_what_to_add_and_check_reports_it(tmp_path):
    # One module, and a [tool.setuptools] table already: py-modules cannot be appended.
    repo = _flat_layout(tmp_path / "tinymlp", "module")
    with (repo / "pyproject.toml").open("a") as f:
        f.write("\n[tool.setuptools]\nzip-safe = false\n")
    before = (repo / "pyproject.toml").read_text()
    res = _init(repo, "--requirement", REQ)
    assert res.exit_code == 0, res.output
    assert "setuptools" not in (repo / "pyproject.toml").read_text()[len(before) :]
    problem = (
        "setuptools finds several top-level packages in this flat layout (data, perf) and "
        "refuses to build it (`pip install -e .` fails): name your packages in "
        "[tool.setuptools] packages = [...]"
    )
    assert f"  2. pyproject.toml: {problem}" in res.output.splitlines()
    check = _init(repo, "--check")
    assert check.exit_code == 2
    assert f"missing  pyproject.toml: {problem}" in check.output.splitlines()


# -- the adopter's path, from a wheel ---------------------------------------------------

PACKAGE = '''
"""A small model package of the adopting team's own."""

import torch


def build_model(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(width, HIDDEN * width), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN * width, width))


HIDDEN = 4
'''

ADAPTED = """
import torch

import memtrack
from tiny_llm import build_model


@memtrack.workload(params={"batch": 64, "width": 256, "dtype": "float32"})
def forward(ctx: memtrack.Context):
    model = build_model(ctx["width"]).to(ctx.device, ctx.dtype).eval()
    ctx.mark(model)
    x = ctx.randn(ctx["batch"], ctx["width"])

    @torch.no_grad()
    def step() -> torch.Tensor:
        return model(x)

    return step
"""


def _builder() -> str:
    """An interpreter whose setuptools builds a wheel offline (without build isolation):
    this one, else the one its venv was made from (a Python 3.11 venv's own setuptools 65
    cannot build a wheel without the `wheel` package)."""
    probe = (
        "import setuptools, sys; v = tuple(int(p) for p in setuptools.__version__"
        ".split('.')[:2]); sys.exit(0 if v >= (70, 1) else 1)"
    )
    for exe in dict.fromkeys([sys.executable, getattr(sys, "_base_executable", sys.executable)]):
        if subprocess.run([exe, "-c", probe], capture_output=True).returncode == 0:
            return exe
    pytest.skip("no setuptools >= 70.1 here to build a wheel offline")


def _wheel(tmp_path: Path) -> Path:
    """A wheel built from this tree as it is (a copy: the checkout gains no build files)."""
    src = tmp_path / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path / "wheels"
    subprocess.run(
        [
            _builder(),
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out.glob("memtrack-*.whl")
    return wheel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _wheel(tmp_path_factory.mktemp("wheel"))


def _adopter(wheel: Path, venv: Path) -> dict[str, str]:
    """The adopter's machine: a fresh venv that reuses the installed torch, memtrack from
    the wheel file, offline; no PYTHONPATH to this checkout. The environment its commands
    run in."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONPATH" and not k.startswith(("GITHUB_", "MEMTRACK_", "PIP_"))
    }
    env.update(
        GIT_ENV,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheel.parent),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_BUILD_ISOLATION="0",
    )
    python = venv_with_this_environment(venv)
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", wheel],
        check=True,
        env=env,
    )
    return env


@pytest.mark.slow
def test_from_a_wheel_init_asks_for_a_requirement_and_a_flat_layout_package_still_installs(
    tmp_path, wheel
):
    venv = tmp_path / "venv"
    env = _adopter(wheel, venv)

    def memtrack(*args: str, cwd: Path, **more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [venv / "bin" / "memtrack", *args],
            cwd=cwd,
            env={**env, **more},
            capture_output=True,
            text=True,
            timeout=300,
        )

    repo = _flat_layout(tmp_path / "tinymlp")
    before = _files(repo)
    # A wheel file is nowhere a runner can install it from: init says so, and writes nothing.
    refused = memtrack("init", cwd=repo)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"memtrack: error: memtrack here was installed from a wheel file ({wheel.as_uri()}), "
        "which a CI runner cannot install from: name what the workflow installs with "
        f"--requirement ({FORMS})"
    ]
    assert _files(repo) == before
    version = wheel.name.split("-")[1]
    requirement = f"memtrack=={version}"
    index = "https://pypi.example.org/simple"
    done = memtrack("init", "--requirement", requirement, "--index-url", index, cwd=repo)
    assert done.returncode == 0, done.stderr
    assert load_yaml(repo / WORKFLOW)["env"] == {
        "MEMTRACK_REQUIREMENT": requirement,
        "MEMTRACK_INDEX_URL": index,
    }
    # The repository's own package still installs beside perf/ and data/, and --check,
    # which would name a layout setuptools refuses, finds nothing missing.
    installed = _pip_install_editable(_venv_with_setuptools(tmp_path / "project"), repo)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    _adopt(repo)
    check = memtrack("init", "--check", cwd=repo)
    assert check.returncode == 0 and check.stdout == f"{repo.resolve()}: nothing missing\n"

    # Installed by name instead (from an index; here the folder of wheels), it pins its
    # version and the index pip is configured with.
    subprocess.run(
        [venv / "bin/python", "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall"]
        + ["memtrack"],
        check=True,
        env=env,
    )
    by_name = subprocess.run(
        [
            venv / "bin/python",
            "-c",
            "from memtrack.scaffold import installed_pin; p = installed_pin(); "
            "print(p.requirement, p.index_url)",
        ],
        cwd=tmp_path,
        env={**env, "PIP_INDEX_URL": f"{index}/"},
        capture_output=True,
        text=True,
    )
    assert by_name.stdout.split() == [requirement, index], by_name.stderr


HOSTILE = """
from pathlib import Path

# Imported by a job that runs memtrack only: a file of the checkout ran there.
Path(__file__).resolve().parents[{depth}].joinpath("ran-in-the-gate.txt").write_text(__name__)
"""

SEEN = """
import os
from pathlib import Path

# What the measured code can see of the history's whereabouts.
with Path(__file__).resolve().parents[2].joinpath("seen.txt").open("a") as f:
    f.write(f"MEMTRACK_DB={os.environ.get('MEMTRACK_DB', '')}\\n")
"""


@pytest.mark.slow
def test_an_adopter_from_a_wheel_gets_a_blocked_pull_request_and_a_dashboard(tmp_path, wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {
        "memtrack/dashboard/app.py",
        "memtrack/dashboard/views/history.py",
        "memtrack/templates/workflow.yml",
        "memtrack/templates/workloads.py",
        "memtrack/templates/comment.py",
    } <= names
    # torch warns "Failed to initialize NumPy" on every import without it
    assert any(line.startswith("Requires-Dist: numpy") for line in meta.splitlines())

    venv = tmp_path / "venv"
    env = _adopter(wheel, venv)

    def sh(*args: str | Path, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
        )
        assert not check or out.returncode == 0, out.stdout + out.stderr
        return out

    where = sh(venv / "bin/python", "-c", "import memtrack; print(memtrack.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout

    repo = init_repo(tmp_path / "tiny-llm")
    (repo / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "tiny-llm"
        version = "0.1"
        """)
    )
    (repo / "tiny_llm").mkdir()
    (repo / "tiny_llm" / "__init__.py").write_text(PACKAGE)
    (repo / "README.md").write_text("tiny-llm\n")
    # memtrack from the wheel's folder, which the "runners" here install from (PIP_FIND_LINKS)
    init = sh(venv / "bin/memtrack", "init", "--requirement", "memtrack==0.1.0", cwd=repo)
    assert "created  .github/workflows/memtrack.yml" in init.stdout
    # setuptools finds the package by itself: init keeps it finding that package alone
    assert "setuptools' package list" in init.stdout
    unadapted = sh(venv / "bin/memtrack", "init", "--check", cwd=repo, check=False)
    assert unadapted.returncode == 2 and "still the template" in unadapted.stdout
    (repo / "perf" / "workloads.py").write_text(SEEN + ADAPTED)  # the adopter adapts it
    commit_all(repo, "memtrack")
    assert sh(venv / "bin/memtrack", "init", "--check", cwd=repo).returncode == 0

    builder = _builder()
    purelib = subprocess.run(
        [builder, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Two runners, as the workflow has them: `gpu` measures, `memtrack-db` keeps the history.
    gpu, keeper = tmp_path / "gpu-runner", tmp_path / "db-runner"
    db = keeper / "memtrack.db"
    variables = {"MEMTRACK_DB": str(db), "MEMTRACK_PYTHON": sys.executable}
    contexts = {
        "matrix": {"shard": 1},
        "strategy": {"job-total": 1},
        "needs": {"measure": {"result": "success"}},
    }
    seen, ran = tmp_path / "seen.txt", tmp_path / "ran-in-the-gate.txt"

    def job(name: str, runner: Path, event: str, steps: set[str], **github: str):
        summary = runner / f"summary-{event}.md"
        summary.unlink(missing_ok=True)
        head = git(repo, "rev-parse", "HEAD")
        jobenv = {
            **env,
            "RUNNER_TEMP": str(runner),
            "GITHUB_EVENT_NAME": event,
            "GITHUB_SHA": head,
            "GITHUB_REPOSITORY": "acme/tiny-llm",
            "GITHUB_STEP_SUMMARY": str(summary),
            **github,
        }
        # Offline, pip builds the package without isolation, and a Python 3.11 venv's own
        # setuptools (65) cannot build a wheel nor satisfy torch: the install steps get
        # this machine's.
        offline = {"Install": {"PYTHONPATH": purelib}, "Install memtrack": {"PYTHONPATH": purelib}}
        base = {"base_ref": "main"} if event == "pull_request" else {}
        return run_job(
            repo / WORKFLOW,
            name,
            github={"event_name": event, "sha": head, **base},
            env=jobenv,
            cwd=repo,
            workdir=runner / "steps",
            variables=variables,
            steps=steps,
            step_env=offline,
            contexts=contexts,
        ), summary

    def measure_then_gate(event: str, first: bool, **github: str):
        steps = {"Python environment", "Install", "Record"} if first else {"Record"}
        measured, _ = job("measure", gpu, event, steps, **github)
        assert measured.failed_step is None, measured.log
        # The record travels as an artifact: the gate downloads it into its runner's temp.
        records = keeper / "memtrack-records"
        shutil.rmtree(records, ignore_errors=True)
        records.mkdir(parents=True)
        for record in (gpu / "memtrack-out").glob("*.json"):
            shutil.copy2(record, records / record.name)
        # The gate's checkout holds whatever the pull request adds: none of it may run there.
        hostile = {
            "json.py": HOSTILE.format(depth=1),
            "sysconfig.py": HOSTILE.format(depth=1),
            "pip/__init__.py": HOSTILE.format(depth=2),
            "pip/__main__.py": HOSTILE.format(depth=2),
        }
        for name, text in hostile.items():
            (repo / name).parent.mkdir(exist_ok=True)
            (repo / name).write_text(text)
        try:
            gate_steps = {"Every shard must have been measured", "Ingest and check"}
            if first:
                gate_steps |= {"Python environment", "Install memtrack"}
            return job("gate", keeper, event, gate_steps, **github)
        finally:
            shutil.rmtree(repo / "pip")
            for name in ("json.py", "sysconfig.py"):
                (repo / name).unlink()

    # Three pushes to main, each measured and checked as the workflow does (installed once
    # on each runner)
    gpu.mkdir()
    keeper.mkdir()
    for n in range(3):
        if n:
            (repo / "README.md").write_text(f"tiny-llm, take {n}\n")
            commit_all(repo, f"docs {n}")
        push = {"GITHUB_REF_NAME": "main", "GITHUB_REF": "refs/heads/main"}
        result, _ = measure_then_gate("push", n == 0, **push)
        assert result.failed_step is None, result.log
    measured_with = sh(gpu / "memtrack-venv/bin/python", "-m", "pip", "list", cwd=tmp_path).stdout
    assert "tiny-llm" in measured_with and "memtrack" in measured_with  # the repo's, and memtrack
    judged_with = sh(keeper / "memtrack-venv/bin/python", "-m", "pip", "list", cwd=tmp_path)
    assert "tiny-llm" not in judged_with.stdout and "memtrack" in judged_with.stdout
    # The measured code ran (and saw no database); nothing of the checkout ran in the gate.
    assert set(seen.read_text().splitlines()) == {"MEMTRACK_DB="}
    assert not ran.exists()
    assert db.is_file()

    # A pull request whose change to the package grows memory: the gate blocks it
    git(repo, "checkout", "-q", "-b", "wider")
    pkg = repo / "tiny_llm" / "__init__.py"
    pkg.write_text(pkg.read_text().replace("HIDDEN = 4", "HIDDEN = 6"))
    commit_all(repo, "a wider hidden layer")
    result, summary = measure_then_gate(
        "pull_request",
        False,
        GITHUB_HEAD_REF="wider",
        GITHUB_BASE_REF="main",
        GITHUB_REF="refs/pull/1/merge",
    )
    assert (result.failed_step, result.returncode) == ("Ingest and check", 1), result.log
    verdict = (keeper / "memtrack-gate" / "verdict.md").read_text()
    case = "forward[batch=64,dtype=float32,width=256]"
    assert case in verdict and "regression" in verdict, verdict
    assert "weights grew" in verdict, verdict  # the wider layers
    assert case in summary.read_text()
    assert not ran.exists()
    # its time was paired with its merge-base: REF's passes recorded as a run of REF, and
    # not checked as a candidate
    refs = sorted(p.name for p in (keeper / "memtrack-records").glob("*.ref.json"))
    assert refs == ["run-1-of-1.ref.json"]
    with sqlite3.connect(db) as c:
        timing_runs = c.execute(
            "select count(distinct run_id) from measurements where kind = 'timing'"
        ).fetchone()
    assert timing_runs == (1,)

    # The dashboard from the wheel serves that history
    app = sh(
        venv / "bin/python",
        "-c",
        "from memtrack.commands.dashboard import app_path; print(app_path())",
        cwd=repo,
    )
    site = next(venv.glob("lib/python*/site-packages"))
    assert app.stdout.strip() == str(site / "memtrack" / "dashboard" / "app.py")
    port = _free_port()
    server = subprocess.Popen(
        [venv / "bin/memtrack", "dashboard", "--db", str(db), "--port", str(port)],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        health = ""
        for _ in range(600):  # waits for the server to start, however long that takes here
            if server.poll() is not None:
                pytest.fail(f"the dashboard exited: {server.stdout and server.stdout.read()}")
            try:
                with urllib.request.urlopen(f"{base}/_stcore/health", timeout=5) as r:
                    health = r.read().decode()
                    break
            except OSError:
                time.sleep(0.5)
        assert health == "ok"
        with urllib.request.urlopen(base, timeout=30) as r:
            assert r.status == 200 and "<title>Streamlit</title>" in r.read().decode()
    finally:
        server.terminate()
        server.wait(timeout=60)
    # ...and what it shows of it: the installed app, run over the same database
    shown = sh(
        venv / "bin/python",
        "-c",
        textwrap.dedent(f"""
        import sys
        from streamlit.testing.v1 import AppTest
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from apptables import table
        sys.argv = [{str(app.stdout.strip())!r}, "--db", {str(db)!r}]
        at = AppTest.from_file(sys.argv[0], default_timeout=120).run()
        assert not at.exception, at.exception
        row = table(at, "overview_table").set_index("case id").loc[{case!r}]
        print(row["status"], len(row["trend"]))
        """),
        cwd=repo,
    )
    assert shown.stdout.split() == ["ok", "3"], shown.stdout  # main's three runs, the series


@pytest.mark.parametrize("link", ["perf", "data", ".github", ".github/workflows", "memtrack.toml"])
def test_init_writes_nothing_through_a_link_out_of_the_repository(tmp_path, link):
    repo = init_repo(tmp_path / "app")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (repo / link).parent.mkdir(parents=True, exist_ok=True)
    if link == "memtrack.toml":  # a file of its own that does not exist yet, out there
        (repo / link).symlink_to(outside / "memtrack.toml")
    else:
        (repo / link).symlink_to(outside, target_is_directory=True)
    before = _files(repo)
    res = _init(repo, "--requirement", "memtrack==0.1.0")
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert f"{repo / link}: a symbolic link out of the repository" in line
    assert _files(repo) == before and list(outside.iterdir()) == []


@pytest.mark.parametrize("branch", ['rel"ease', "main]#x", "a,b", "dev's"])
def test_init_quotes_a_branch_name_git_accepts_in_the_config_and_the_workflow(tmp_path, branch):
    import yaml

    repo = init_repo(tmp_path / "app")
    res = _init(repo, "--requirement", "memtrack==0.1.0", "--base-branch", branch)
    assert res.exit_code == 0, res.output
    assert load_config(repo / "memtrack.toml").base_branch == branch
    workflow = yaml.safe_load((repo / WORKFLOW).read_text())
    on = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert on["push"]["branches"] == [branch] and on["pull_request"]["branches"] == [branch]


@pytest.mark.parametrize("branch", ["${{github.token}}", "a\nb", "x..y", "-main", "a b"])
def test_init_refuses_a_branch_name_it_cannot_write_and_writes_nothing(tmp_path, branch):
    repo = init_repo(tmp_path / "app")
    res = _init(repo, "--requirement", "memtrack==0.1.0", "--base-branch", branch)
    assert res.exit_code == 2, res.output
    assert "is not a branch name memtrack init can write" in res.output
    assert _files(repo) == {}


def test_init_for_a_postgresql_history_writes_the_gate_reading_the_secret(tmp_path):
    repo = init_repo(tmp_path / "app")
    (repo / "pyproject.toml").write_text('[project]\nname = "app"\nversion = "1"\n')
    done = _init(repo, "--requirement", REQ, "--database", "postgresql")
    assert done.exit_code == 0, done.output
    workflow = (repo / WORKFLOW).read_text()
    assert "MEMTRACK_DATABASE_URL: ${{ secrets.MEMTRACK_DATABASE_URL }}" in workflow
    assert "MEMTRACK_DB" not in workflow
    # the config keeps the local default for runs on a laptop: no URL is ever written
    assert "postgresql://" not in (repo / "pyproject.toml").read_text()
    refused = _init(tmp_path, "--database", "mysql")
    assert refused.exit_code == 2
