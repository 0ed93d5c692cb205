"""`memtrack init` in repositories that are not memtrack's own: what it writes, that it never
overwrites, what `--check` finds missing; and the whole path an adopter lives, from a wheel
built from this tree into a fresh virtual environment, through the generated workflow's own
steps (run here as a runner would), to a blocked pull request and the dashboard."""

from __future__ import annotations

import os
import shutil
import socket
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
from gha import evaluate, load_yaml, run_job

from memtrack.cli import main
from memtrack.config import load_config

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = Path(".github/workflows/memtrack.yml")
HOOK = Path(".github/memtrack-runner-hook.sh")


def _init(repo: Path, *args: str):
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        return CliRunner().invoke(main, ["init", *args])
    finally:
        os.chdir(cwd)


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
    res = _init(repo)
    assert res.exit_code == 0, res.output
    text = (repo / "pyproject.toml").read_text()
    assert text.startswith(pyproject)  # appended, what was there kept byte for byte
    config = load_config(repo / "pyproject.toml")
    assert config.modules == ("perf.workloads",) and config.base_branch == "main"
    assert config.references == repo / "perf" / "references"
    assert "from tiny_llm import build_model" in (repo / "perf/workloads.py").read_text()
    assert os.access(repo / HOOK, os.X_OK)
    # the hook is the one memtrack's own runner uses
    assert (repo / HOOK).read_bytes() == (ROOT / HOOK).read_bytes()
    wf = (repo / WORKFLOW).read_text()
    assert 'MEMTRACK_REQUIREMENT: "memtrack==' in wf
    assert "pip install --quiet -e .  # this repository's package" in wf
    lines = res.output.splitlines()
    assert lines[0].startswith("appended pyproject.toml")
    assert any(x.startswith("created  perf/workloads.py") for x in lines)
    assert "next:" in lines and any("memtrack init --check" in x for x in lines)
    # the database is git-ignored by a file of its own: no .gitignore edited
    assert git(repo, "check-ignore", "data/memtrack.db", "data/memtrack.db-wal")
    assert _init(repo, "--check").exit_code == 0

    before = _files(repo)
    again = _init(repo)
    assert again.exit_code == 0 and _files(repo) == before
    assert "created" not in again.output and "appended" not in again.output


def test_init_never_overwrites_and_without_a_pyproject_writes_memtrack_toml(tmp_path):
    repo = init_repo(tmp_path / "app", branch="trunk")
    (repo / "perf").mkdir()
    (repo / "perf" / "workloads.py").write_text("# ours\n")
    res = _init(repo)
    assert res.exit_code == 0, res.output
    assert (repo / "perf" / "workloads.py").read_text() == "# ours\n"
    assert "exists   perf/workloads.py" in res.output
    config = load_config(repo / "memtrack.toml")
    assert config.base_branch == "trunk"  # the branch checked out
    wf = load_yaml(repo / WORKFLOW)
    assert wf["on"]["push"]["branches"] == ["trunk"]
    # not a pip project: nothing of it is installed, the workloads import it from its root
    assert "pip install --quiet -e ." not in (repo / WORKFLOW).read_text()


def test_the_generated_workflow_is_valid_audited_clean_and_keeps_forks_off_the_runner(tmp_path):
    repo = init_repo(tmp_path / "app")
    sha = "0123456789abcdef" * 2 + "01234567"
    req = f"memtrack @ git+https://github.com/acme/memtrack@{sha}"
    assert _init(repo, "--requirement", req).exit_code == 0
    for tool, args in (
        ("check-jsonschema", ["--builtin-schema", "vendor.github-workflows", str(repo / WORKFLOW)]),
        ("zizmor", ["--offline", "--no-progress", str(repo / ".github")]),
    ):
        exe = shutil.which(tool, path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        assert exe, f"{tool} is not installed: pip install -e '.[test]'"
        out = subprocess.run([exe, *args], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    wf = load_yaml(repo / WORKFLOW)
    assert wf["env"]["MEMTRACK_REQUIREMENT"] == req
    gate, verdict = wf["jobs"]["gate"], wf["jobs"]["verdict"]
    assert "self-hosted" in gate["runs-on"]

    def github(event: str, head: str | None) -> dict:
        payload = {"pull_request": {"head": {"repo": {"full_name": head} if head else None}}}
        return {
            "github": {
                "event_name": event,
                "repository": "acme/app",
                "event": payload if event == "pull_request" else {},
            }
        }

    assert evaluate(gate["if"], github("push", None)) is True
    assert evaluate(gate["if"], github("pull_request", "acme/app")) is True
    for fork in ("someone/app", None):
        assert evaluate(gate["if"], github("pull_request", fork)) is False
    assert "always()" in verdict["if"] and verdict["needs"] == "gate"
    # memtrack comes from the requirement only, never from the repository under test
    install = next(s for s in gate["steps"] if s.get("name") == "Install")["run"]
    assert 'pip install --quiet --no-deps --force-reinstall "$MEMTRACK_REQUIREMENT"' in install
    assert "pip install --quiet ." not in install


@pytest.mark.parametrize(
    "requirement",
    [
        "memtrack",
        "memtrack>=0.1",
        "memtrack @ git+https://github.com/acme/memtrack@main",
        "memtrack==0.1; rm -rf /",
    ],
)
def test_an_unpinned_requirement_is_refused_and_nothing_is_written(tmp_path, requirement):
    repo = init_repo(tmp_path / "app")
    res = _init(repo, "--requirement", requirement)
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"memtrack: error: --requirement: {requirement!r} does not pin memtrack (write "
        "memtrack==VERSION, or memtrack @ git+https://HOST/OWNER/REPO@COMMIT with the full "
        "40-digit commit)"
    ]
    assert _files(repo) == {}


def test_a_pyproject_the_table_cannot_join_is_refused_whole(tmp_path):
    repo = init_repo(tmp_path / "app")
    (repo / "pyproject.toml").write_text("tool = { ruff = { line-length = 99 } }\n")
    res = _init(repo)
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
    ]
    assert res.output.splitlines()[-1].startswith("memtrack: error: 5 thing(s) missing in ")


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


@pytest.mark.slow
def test_an_adopter_from_a_wheel_gets_a_blocked_pull_request_and_a_dashboard(tmp_path):
    wheel = _wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {
        "memtrack/dashboard/app.py",
        "memtrack/dashboard/views/history.py",
        "memtrack/templates/workflow.yml",
        "memtrack/templates/workloads.py",
    } <= names
    # torch warns "Failed to initialize NumPy" on every import without it
    assert any(line.startswith("Requires-Dist: numpy") for line in meta.splitlines())

    # The adopter's machine: a fresh venv that reuses the installed torch, memtrack from the
    # wheel, offline; no PYTHONPATH to this checkout.
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONPATH" and not k.startswith(("GITHUB_", "MEMTRACK_"))
    }
    env.update(
        GIT_ENV,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheel.parent),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_BUILD_ISOLATION="0",
    )
    venv = tmp_path / "venv"
    venv_with_this_environment(venv)
    subprocess.run(
        [
            venv / "bin/python",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--force-reinstall",
            str(wheel),
        ],
        check=True,
        env=env,
    )

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
    init = sh(venv / "bin/memtrack", "init", cwd=repo)
    assert "created  .github/workflows/memtrack.yml" in init.stdout
    # setuptools' automatic discovery refuses a flat layout with perf/ and data/ beside the
    # package: init says so, and the adopter names the package
    assert "name them, e.g. [tool.setuptools] packages" in init.stdout
    with (repo / "pyproject.toml").open("a") as f:
        f.write('\n[tool.setuptools]\npackages = ["tiny_llm"]\n')
    assert sh(venv / "bin/memtrack", "init", "--check", cwd=repo).returncode == 0
    (repo / "perf" / "workloads.py").write_text(ADAPTED)  # the adopter adapts it
    commit_all(repo, "memtrack")

    builder = _builder()
    purelib = subprocess.run(
        [builder, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    runner = tmp_path / "runner"
    db = runner / "memtrack.db"
    ci = {**env, "RUNNER_TEMP": str(runner), "MEMTRACK_PYTHON": sys.executable}
    variables = {"MEMTRACK_DB": str(db), "MEMTRACK_PYTHON": sys.executable}

    def job(event: str, steps: set[str], **github: str):
        summary = runner / f"summary-{event}.md"
        summary.unlink(missing_ok=True)
        head = git(repo, "rev-parse", "HEAD")
        jobenv = {
            **ci,
            "GITHUB_EVENT_NAME": event,
            "GITHUB_SHA": head,
            "GITHUB_REPOSITORY": "acme/tiny-llm",
            "GITHUB_STEP_SUMMARY": str(summary),
            **github,
        }
        # Offline, pip builds the package without isolation, and a Python 3.11 venv's own
        # setuptools (65) cannot build a wheel: the Install step gets this machine's.
        offline = {"Install": {"PYTHONPATH": purelib}}
        return run_job(
            repo / WORKFLOW,
            "gate",
            github={"event_name": event, "sha": head},
            env=jobenv,
            cwd=repo,
            workdir=runner / "steps",
            variables=variables,
            steps=steps,
            step_env=offline,
        ), summary

    # Three pushes to main, each measured and checked as the workflow does (installed once)
    runner.mkdir()
    for n in range(3):
        if n:
            (repo / "README.md").write_text(f"tiny-llm, take {n}\n")
            commit_all(repo, f"docs {n}")
        steps = {"Install", "Record", "Check"} if n == 0 else {"Record", "Check"}
        result, _ = job("push", steps, GITHUB_REF_NAME="main", GITHUB_REF="refs/heads/main")
        assert result.failed_step is None, result.log
    pip_list = sh(runner / "memtrack-venv/bin/python", "-m", "pip", "list", cwd=tmp_path).stdout
    assert "tiny-llm" in pip_list and "memtrack" in pip_list  # the repo's package, and memtrack

    # A pull request whose change to the package grows memory: the gate blocks it
    git(repo, "checkout", "-q", "-b", "wider")
    pkg = repo / "tiny_llm" / "__init__.py"
    pkg.write_text(pkg.read_text().replace("HIDDEN = 4", "HIDDEN = 6"))
    commit_all(repo, "a wider hidden layer")
    result, summary = job(
        "pull_request",
        {"Record", "Check"},
        GITHUB_HEAD_REF="wider",
        GITHUB_BASE_REF="main",
        GITHUB_REF="refs/pull/1/merge",
    )
    assert (result.failed_step, result.returncode) == ("Check", 1), result.log
    verdict = (runner / "memtrack-verdict.md").read_text()
    case = "forward[batch=64,dtype=float32,width=256]"
    assert case in verdict and "regression" in verdict, verdict
    assert "weights grew" in verdict, verdict  # the wider layers
    assert case in summary.read_text()

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
