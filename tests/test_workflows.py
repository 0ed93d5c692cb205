"""The GitHub Actions files, memtrack's own and the workflow `memtrack init` writes: valid by
GitHub's schema, clean by zizmor's audit, and safe on a persistent GPU runner: a fork's code
can never reach it, jobs on one GPU never overlap, tokens are read-only unless a job needs
more, every remote action is pinned, and only the gate, which runs no code of the pull
request, knows where the history is. Both have the jobs and runner labels the docs describe.

The `if:` conditions are evaluated, not only read: a small evaluator of GitHub's
expression language runs each job's condition for a push, a pull request from the
repository and one from a fork.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from gha import evaluate, load_yaml, run_job

from memtrack.scaffold import Pin, workflow_text

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / ".github"
ACTION = GITHUB / "actions" / "memtrack" / "action.yml"
HOOK = GITHUB / "memtrack-runner-hook.sh"
REPO = "octo/memtrack"

# The workflow `memtrack init` writes, audited beside memtrack's own.
_INIT = tempfile.TemporaryDirectory(prefix="memtrack-init-")
INIT_GITHUB = Path(_INIT.name) / ".github"
GENERATED = INIT_GITHUB / "workflows" / "memtrack.yml"
GENERATED.parent.mkdir(parents=True)
GENERATED.write_text(
    workflow_text("main", Pin("memtrack @ git+https://github.com/acme/memtrack@" + "0" * 40), True)
)
# ...and its variant with the history on PostgreSQL (`memtrack init --database postgresql`).
_INIT_PG = tempfile.TemporaryDirectory(prefix="memtrack-init-pg-")
INIT_PG_GITHUB = Path(_INIT_PG.name) / ".github"
GENERATED_PG = INIT_PG_GITHUB / "workflows" / "memtrack.yml"
GENERATED_PG.parent.mkdir(parents=True)
GENERATED_PG.write_text(
    workflow_text(
        "main",
        Pin("memtrack @ git+https://github.com/acme/memtrack@" + "0" * 40),
        True,
        "postgresql",
    )
)
WORKFLOWS = [*sorted((GITHUB / "workflows").glob("*.yml")), GENERATED, GENERATED_PG]
MEMTRACK_WORKFLOWS = {"memtrack.yml": GITHUB / "workflows" / "memtrack.yml", "init": GENERATED}


def _load(path: Path) -> dict[str, Any]:
    return load_yaml(path)


def _name(path: Path) -> str:
    if path == GENERATED_PG:
        return "init --database postgresql: memtrack.yml"
    return "init: memtrack.yml" if path == GENERATED else path.name


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def _jobs() -> list[tuple[str, str, dict[str, Any]]]:
    return [(_name(wf), name, job) for wf in WORKFLOWS for name, job in _load(wf)["jobs"].items()]


def _labels(job: dict[str, Any]) -> list[str]:
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):  # {group:, labels:}
        runs_on = runs_on.get("labels", [])
    return [runs_on] if isinstance(runs_on, str) else list(runs_on)


def _self_hosted(job: dict[str, Any]) -> bool:
    """Self-hosted, or not known before run time (an expression): both need the guard."""
    return any(label == "self-hosted" or "${{" in label for label in _labels(job))


def test_the_files_exist() -> None:
    assert {_name(wf) for wf in WORKFLOWS} >= {"memtrack.yml", "tests.yml", "init: memtrack.yml"}
    assert ACTION.is_file() and HOOK.is_file()


# -- GitHub's schema and zizmor ---------------------------------------------------------


def test_workflows_and_action_match_githubs_schema() -> None:
    schemas = [("vendor.github-workflows", WORKFLOWS), ("vendor.github-actions", [ACTION])]
    for schema, files in schemas:
        out = subprocess.run(
            [_tool("check-jsonschema"), "--builtin-schema", schema, *map(str, files)],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    "github", [GITHUB, INIT_GITHUB, INIT_PG_GITHUB], ids=["memtrack", "init", "init-postgresql"]
)
def test_zizmor_offline_finds_nothing(github: Path) -> None:
    out = subprocess.run(
        [_tool("zizmor"), "--offline", "--no-progress", str(github)],
        capture_output=True,
        text=True,
        cwd=github.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "No findings" in out.stdout, out.stdout


def _context(event: str, head_repo: str | None = REPO) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    if event == "pull_request":
        head = {"repo": {"full_name": head_repo} if head_repo else None, "sha": "a" * 40}
        payload = {"pull_request": {"number": 7, "head": head, "base": {"sha": "b" * 40}}}
    results = {"result": "success"}
    return {
        "github": {
            "event_name": event,
            "repository": REPO,
            "event": payload,
            "ref": "refs/heads/main",
        },
        "needs": {name: results for _, name, _ in _jobs()},
        "vars": {},
    }


PUSH, SAME_REPO_PR = _context("push"), _context("pull_request")
FORK_PR = _context("pull_request", "someone/memtrack")
DELETED_FORK_PR = _context("pull_request", None)


def test_the_evaluator_reads_conditions_as_github_does() -> None:
    guard = (
        "github.event_name == 'push' || "
        "github.event.pull_request.head.repo.full_name == github.repository"
    )
    assert evaluate(guard, PUSH) is True
    assert evaluate(guard, SAME_REPO_PR) is True
    assert evaluate(guard, FORK_PR) is False
    assert evaluate(f"${{{{ !cancelled() && ({guard}) }}}}", FORK_PR) is False
    assert evaluate("always() && vars.X != 'false'", PUSH) is True
    assert evaluate("github.event_name == 'PUSH'", PUSH) is True
    # Different types are compared as numbers: a missing value equals ''.
    assert evaluate("vars.MISSING == ''", PUSH) is True
    assert evaluate("vars.MISSING != 'false'", PUSH) is True


def test_every_self_hosted_job_refuses_forks() -> None:
    self_hosted = [(wf, name, job) for wf, name, job in _jobs() if _self_hosted(job)]
    assert self_hosted, "the memtrack workflow measures on a self-hosted runner"
    for wf, name, job in self_hosted:
        condition = job.get("if")
        assert condition, f"{wf}: job {name!r} runs on a self-hosted runner without a fork guard"
        for context in (FORK_PR, DELETED_FORK_PR):
            assert not evaluate(str(condition), context), f"{wf}: {name!r} would run a fork's code"
        # ...and the guard does not switch the job off altogether.
        assert evaluate(str(condition), PUSH), f"{wf}: job {name!r} never runs on a push"
        assert evaluate(str(condition), SAME_REPO_PR), f"{wf}: {name!r} never runs on a PR"


@pytest.mark.parametrize("workflow", MEMTRACK_WORKFLOWS.values(), ids=MEMTRACK_WORKFLOWS)
def test_forks_get_a_hosted_cpu_job_and_the_required_check_still_reports(workflow: Path) -> None:
    jobs = _load(workflow)["jobs"]
    for_forks = [n for n, j in jobs.items() if evaluate(str(j.get("if", "true")), FORK_PR)]
    assert for_forks, "a fork's pull request gets some job"
    for name in for_forks:
        assert not _self_hosted(jobs[name])
        assert all(label.startswith("ubuntu-") for label in _labels(jobs[name])), name
    # A skipped job passes a required check: the verdict job must run (and decide) even
    # when the gate is skipped or failed.
    verdict = jobs["verdict"]
    assert "always()" in verdict["if"] and "gate" in verdict["needs"]
    assert "needs.gate.result" in json.dumps(verdict["steps"])


def test_no_workflow_triggers_on_pull_request_target_or_workflow_run() -> None:
    for wf in WORKFLOWS:
        triggers = _load(wf)["on"]
        names = [triggers] if isinstance(triggers, str) else list(triggers)
        assert "pull_request_target" not in names, _name(wf)
        assert "workflow_run" not in names, _name(wf)


def test_jobs_on_one_gpu_never_overlap() -> None:
    gpu_jobs = [(wf, n, j) for wf, n, j in _jobs() if "gpu" in _labels(j)]
    assert gpu_jobs
    groups = set()
    for wf, name, job in gpu_jobs:
        concurrency = job.get("concurrency")
        assert isinstance(concurrency, dict), f"{wf}: GPU job {name!r} has no concurrency group"
        assert concurrency.get("cancel-in-progress") is False, (
            f"{wf}: {name!r} would kill a running measurement"
        )
        groups.add(re.sub(r"\$\{\{.*?\}\}", "", concurrency["group"]))
    assert groups == {"memtrack-gpu-"}, f"GPU jobs must share one group family, got {groups}"
    # The database is written by one job at a time too.
    for _, _, job in _jobs():
        if "memtrack-db" in _labels(job):
            assert job["concurrency"]["group"] == "memtrack-db"
            assert job["concurrency"]["cancel-in-progress"] is False


def test_permissions_are_least_privilege() -> None:
    for path in WORKFLOWS:
        top = _load(path).get("permissions")
        assert top is not None, f"{_name(path)}: no top-level permissions (the default may write)"
        assert top in ({}, "read-all") or (
            isinstance(top, dict) and set(top.values()) <= {"read", "none"}
        ), f"{_name(path)}: top-level permissions {top} are not read-only"
    for wf, name, job in _jobs():
        perms = job.get("permissions", {})
        writes = {k for k, v in (perms.items() if isinstance(perms, dict) else []) if v == "write"}
        if not writes:
            continue
        assert writes == {"pull-requests"}, f"{wf}: {name!r} asks for {writes}"
        assert not _self_hosted(job), f"{wf}: {name!r} holds a write token on a self-hosted runner"
        # A job with a write token runs no code of the pull request.
        for step in job.get("steps", []):
            if str(step.get("uses", "")).startswith("actions/checkout@"):
                assert step["with"]["ref"] == "${{ github.event.pull_request.base.sha }}"


def _uses_lines() -> list[tuple[str, str]]:
    found = []
    for path in [*WORKFLOWS, ACTION]:
        for line in path.read_text().splitlines():
            m = re.match(r"^\s*(?:-\s*)?uses:\s*(\S+)(.*)$", line)
            if m:
                found.append((f"{_name(path)}: {line.strip()}", m.group(1) + m.group(2)))
    return found


def test_every_remote_action_is_pinned_to_a_full_commit_sha() -> None:
    uses = _uses_lines()
    assert len(uses) >= 6
    for where, value in uses:
        ref = value.split()[0]
        if ref.startswith("./"):
            continue
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{where}: not pinned to a SHA"
        assert re.search(r"#\s*v\d+\.\d+\.\d+\b", value), f"{where}: no '# vX.Y.Z' comment"


def _checkouts(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        step
        for step in job.get("steps", [])
        if str(step.get("uses", "")).startswith("actions/checkout@")
    ]


def test_checkouts_persist_no_credentials_and_measure_the_pr_head() -> None:
    for wf, name, job in _jobs():
        for step in _checkouts(job):
            assert step.get("with", {}).get("persist-credentials") is False, f"{wf}: {name}"
            if _self_hosted(job) and "path" not in step["with"]:
                # The PR head, with the history that finds its merge-base with the base branch.
                assert "github.event.pull_request.head.sha" in step["with"]["ref"], name
                assert step["with"]["fetch-depth"] == 0, name


def test_the_gate_judges_and_writes_the_history_with_the_base_branchs_memtrack() -> None:
    """A same-repository pull request's code must not write the canonical history: the gate
    (the one job that opens the database) checks out the base branch beside the pull
    request and takes the action, and the memtrack it installs, from there."""
    jobs = _load(GITHUB / "workflows" / "memtrack.yml")["jobs"]
    gate = jobs["gate"]
    assert "memtrack-db" in _labels(gate)
    trusted = [s for s in _checkouts(gate) if "path" in s["with"]]
    assert len(trusted) == 1, "the gate checks out the trusted memtrack once, in a folder"
    (tool,) = trusted
    assert tool["with"]["ref"] == "${{ github.event.pull_request.base.sha || github.sha }}"
    folder = tool["with"]["path"].strip("/")
    actions = [str(s["uses"]) for s in gate["steps"] if str(s.get("uses", "")).startswith("./")]
    assert actions == [f"./{folder}/.github/actions/memtrack"], actions
    # ...and the action installs the memtrack of the checkout it comes from.
    install = next(s for s in _load(ACTION)["runs"]["steps"] if s.get("id") == "setup")["run"]
    assert 'pip install --quiet "$GITHUB_ACTION_PATH/../../..")' in install


@pytest.mark.parametrize("workflow", MEMTRACK_WORKFLOWS.values(), ids=MEMTRACK_WORKFLOWS)
def test_only_the_gate_knows_where_the_history_is(workflow: Path) -> None:
    """The pull request's own code runs in the measuring jobs (and a fork's in the hosted
    estimate), which never learn where the history is: only the gate has MEMTRACK_DB, in
    its own env, and no other job names it at all."""
    spec = _load(workflow)
    assert "MEMTRACK_DB" not in spec.get("env", {})
    for name, job in spec["jobs"].items():
        assert ("MEMTRACK_DB" in job.get("env", {})) == (name == "gate"), name
        if name != "gate":
            assert "MEMTRACK_DB" not in json.dumps(job), name


def test_on_postgresql_only_the_gate_is_given_the_database_secret() -> None:
    """With the history on a server, its URL (password included) is a repository secret
    that only the gate reads: the measuring jobs run the pull request's code and must not
    be able to write the base branch's history, a fork's pull request gets no job that
    names it (and GitHub gives it no secret), and nothing points at a file any more."""
    spec = _load(GENERATED_PG)
    text = GENERATED_PG.read_text()
    assert "MEMTRACK_DB" not in text and "--db" not in text and "memtrack backup" not in text
    gate = spec["jobs"]["gate"]
    assert gate["env"] == {"MEMTRACK_DATABASE_URL": "${{ secrets.MEMTRACK_DATABASE_URL }}"}
    assert not evaluate(str(gate["if"]), FORK_PR) and evaluate(str(gate["if"]), SAME_REPO_PR)
    for name, job in spec["jobs"].items():
        if name != "gate":
            assert "secrets." not in json.dumps(job), name
            assert "MEMTRACK_DATABASE_URL" not in json.dumps(job), name
    ingest = next(s["run"] for s in gate["steps"] if s.get("name") == "Ingest and check")
    assert '"$bin/memtrack" ingest "${records[@]}"' in ingest
    assert "--run" in ingest  # each measured run checked, by the same URL


def test_the_generated_gate_runs_memtrack_pinned_and_nothing_of_the_checkout() -> None:
    """In an adopter's repository the gate installs memtrack from MEMTRACK_REQUIREMENT and
    nothing else: the checkout is data (config, budgets, git history), the record comes as
    an artifact, and no Python is started where it would import the checkout's files
    first (the working directory): it runs from $RUNNER_TEMP, or isolated (-I)."""
    spec = _load(GENERATED)
    gate, measure = spec["jobs"]["gate"], spec["jobs"]["measure"]
    assert gate["needs"] == "measure" and "memtrack-db" in _labels(gate)
    uses = [str(s["uses"]).split("@")[0] for s in gate["steps"] if "uses" in s]
    assert uses == [
        "actions/checkout",
        "actions/download-artifact",
        "actions/upload-artifact",
        "actions/upload-artifact",
    ]
    download = next(s for s in gate["steps"] if "download-artifact" in str(s.get("uses")))
    assert download["with"]["pattern"] == "memtrack-record-*"
    upload = next(s for s in measure["steps"] if "upload-artifact" in str(s.get("uses")))
    assert upload["with"]["name"].startswith("memtrack-record-")
    scripts = {s["name"]: s["run"] for s in gate["steps"] if "run" in s}
    install = scripts["Install memtrack"]
    assert re.findall(r'pip install [^\n]*"(\$\w+)"', install) == ["$MEMTRACK_REQUIREMENT"] * 2
    for name, script in scripts.items():
        assert not re.search(r"pip install[^\n]*(-e|\s\.)(\s|$)", script), name
        _no_python_in_the_checkout(name, script)
    # The environment step is the measuring job's, to the letter, and the action's.
    env_step = [s for s in gate["steps"] if s.get("name") == "Python environment"]
    assert env_step == [s for s in measure["steps"] if s.get("name") == "Python environment"]
    (action_env,) = [s for s in _load(ACTION)["runs"]["steps"] if s.get("id") == "environment"]
    assert action_env["run"] == env_step[0]["run"]


def _no_python_in_the_checkout(where: str, script: str) -> None:
    """Every Python `script` starts runs isolated (-I), or after it left the working
    directory (the checkout) for $RUNNER_TEMP."""
    lines = script.splitlines()
    for n, line in enumerate(lines):
        if re.search(r'python"? (?!-I)', line) or 'MEMTRACK_PYTHON" -m' in line:
            away = any('cd "$RUNNER_TEMP"' in x for x in lines[: n + 1])
            assert away, f"{where}: {line.strip()} runs in the checkout"


def test_the_actions_gate_steps_start_no_python_in_the_checkout() -> None:
    """memtrack's own gate runs the action from the trusted checkout in the pull request's:
    the steps it runs there start no Python that would import the checkout's files first
    (the install of `install:`, which only a measuring job gives, aside)."""
    for step in _load(ACTION)["runs"]["steps"]:
        if "run" in step:
            script = re.sub(r'(?s)if \[ -n "\$MEMTRACK_INSTALL" \].*?fi', "", step["run"])
            _no_python_in_the_checkout(str(step.get("name")), script)


def _table(text: str, header: str) -> dict[str, str]:
    """A Markdown table's first two columns (backticks dropped), by its header row."""
    rows = text[text.index(header) :].split("\n\n")[0].splitlines()[2:]
    cells = [[c.strip().strip("`") for c in row.strip("|").split("|")] for row in rows]
    return {c[0]: c[1] for c in cells}


def _runs_on(job: dict[str, Any]) -> str:
    labels = _labels(job)
    return f"[{', '.join(labels)}]" if "self-hosted" in labels else "hosted"


@pytest.mark.parametrize("workflow", MEMTRACK_WORKFLOWS.values(), ids=MEMTRACK_WORKFLOWS)
def test_the_docs_describe_the_workflows_jobs_and_runner_labels(workflow: Path) -> None:
    """docs/ci.md and the README's CI section list the jobs of the workflow `memtrack init`
    writes (and memtrack's own, of the same design) with the runners they run on, and the
    labels a runner is registered with are those the jobs ask for."""
    ci = (ROOT / "docs" / "ci.md").read_text()
    readme = (ROOT / "README.md").read_text()
    header = "| job | runs on | when | does |"
    documented = _table(ci, header)
    assert _table(readme, header) == documented
    jobs = _load(workflow)["jobs"].values()
    actual = {re.sub(r" \(shard .*\)$", "", job.get("name", "")): _runs_on(job) for job in jobs}
    assert actual == documented
    labels = {x for job in jobs for x in _labels(job) if _self_hosted(job)} - {"self-hosted"}
    registered = re.search(r"\./config\.sh .*--labels (\S+)", ci)
    assert registered and set(registered[1].split(",")) == labels == {"gpu", "memtrack-db"}
    assert "Only the gate job has `MEMTRACK_DB`" in ci


def test_the_jobs_environment_sees_a_virtual_environments_packages(tmp_path: Path) -> None:
    """MEMTRACK_PYTHON may be a venv's python, whose torch is in the venv itself: the job's
    fresh environment sees its packages (importable, and known to pip, so that nothing
    reinstalls them), where --system-site-packages alone sees only its base interpreter's.
    A package of the venv's own stands for its torch."""
    runner = tmp_path / "runner"
    runner.mkdir()
    theirs = tmp_path / "torch-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(theirs)], check=True)
    site = subprocess.run(
        [theirs / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "gpu_stack").mkdir()
    (Path(site) / "gpu_stack" / "__init__.py").write_text("CUDA = '12.8'\n")
    info = Path(site) / "gpu_stack-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpu-stack\nVersion: 2.13.0\n")
    (info / "RECORD").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for job in ("measure", "gate"):
        result = run_job(
            GENERATED,
            job,
            github={"event_name": "push"},
            env={**env, "RUNNER_TEMP": str(runner)},
            cwd=tmp_path,
            workdir=runner / "steps",
            variables={"MEMTRACK_PYTHON": str(theirs / "bin/python")},
            steps={"Python environment"},
        )
        assert result.ran == ["Python environment"] and result.failed_step is None, result.log
        python = runner / "memtrack-venv" / "bin" / "python"
        seen = subprocess.run(
            [python, "-c", "import gpu_stack; print(gpu_stack.CUDA)"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert seen.stdout.strip() == "12.8", seen.stderr
        shown = subprocess.run(
            [python, "-m", "pip", "show", "gpu-stack"], cwd=runner, capture_output=True, text=True
        )
        assert "Version: 2.13.0" in shown.stdout, shown.stderr


def _run_scripts() -> list[tuple[str, str]]:
    scripts = []
    for wf, name, job in _jobs():
        scripts += [(f"{wf}: {name}", s["run"]) for s in job.get("steps", []) if "run" in s]
    for step in _load(ACTION)["runs"]["steps"]:
        if "run" in step:
            scripts.append((f"action: {step.get('name')}", step["run"]))
    return scripts


def test_no_untrusted_value_is_interpolated_into_a_script() -> None:
    for where, script in _run_scripts():
        for expression in re.findall(r"\$\{\{(.*?)\}\}", script):
            pytest.fail(f"{where}: ${{{{{expression}}}}} inside run: (pass it through env:)")


def test_the_action_has_the_inputs_a_repository_adopts_it_with() -> None:
    action = _load(ACTION)
    assert action["runs"]["using"] == "composite"
    assert set(action["inputs"]) >= {
        "config",
        "database",
        "base-branch",
        "comment",
        "python",
        "extra-args",
    }
    for step in action["runs"]["steps"]:
        if "run" in step:
            assert step.get("shell") == "bash", step.get("name")


# -- the runner's pre-job hook -----------------------------------------------------------


def _hook(
    tmp_path: Path, event: str, payload: dict[str, Any], **extra: str
) -> subprocess.CompletedProcess:
    event_file = tmp_path / "event.json"
    event_file.write_text(json.dumps(payload))
    env = {
        "PATH": os.environ["PATH"],
        "GITHUB_EVENT_NAME": event,
        "GITHUB_REPOSITORY": REPO,
        "GITHUB_EVENT_PATH": str(event_file),
        **extra,
    }
    return subprocess.run(["bash", str(HOOK)], env=env, capture_output=True, text=True)


def test_runner_hook_refuses_forks_and_other_events(tmp_path: Path) -> None:
    def pr(full_name: str | None) -> dict[str, Any]:
        return {"pull_request": {"head": {"repo": {"full_name": full_name} if full_name else None}}}

    assert _hook(tmp_path, "push", {}).returncode == 0
    assert _hook(tmp_path, "pull_request", pr(REPO)).returncode == 0
    fork = _hook(tmp_path, "pull_request", pr("someone/memtrack"))
    assert fork.returncode == 1 and "someone/memtrack" in fork.stderr
    assert _hook(tmp_path, "pull_request", pr(None)).returncode == 1
    assert _hook(tmp_path, "pull_request_target", pr(REPO)).returncode == 1
    assert _hook(tmp_path, "issue_comment", {}).returncode == 1
    other = _hook(tmp_path, "push", {}, MEMTRACK_ALLOWED_REPOSITORIES="octo/other octo/more")
    assert other.returncode == 1 and "not in MEMTRACK_ALLOWED_REPOSITORIES" in other.stderr
    assert _hook(tmp_path, "push", {}, MEMTRACK_ALLOWED_REPOSITORIES=f"x/y {REPO}").returncode == 0


# -- the pull request comment, against a fake GitHub API (no network here) ---------------


class _FakeGitHub(BaseHTTPRequestHandler):
    """GitHub's comment endpoints as they answer a token: GraphQL `viewer` names the token's
    identity (None: it will not say), and only a comment's author may edit it."""

    comments: list[dict[str, Any]] = []
    calls: list[str] = []
    viewer: str | None = "github-actions"
    author: dict[str, str] = {"login": "github-actions[bot]", "type": "Bot"}
    refuse_edits = False

    def _reply(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict[str, Any]:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def do_GET(self) -> None:  # noqa: N802
        self.calls.append(f"GET {self.path}")
        assert self.headers["Authorization"] == "Bearer t0ken"
        if self.path == "/user":  # REST: refused to an integration's token
            self._reply(403, {"message": "Resource not accessible by integration"})
            return
        page = int(re.search(r"[?&]page=(\d+)", self.path).group(1))  # type: ignore[union-attr]
        self._reply(200, self.comments[(page - 1) * 100 : page * 100])

    def do_POST(self) -> None:  # noqa: N802
        self.calls.append(f"POST {self.path}")
        if self.path == "/graphql":
            assert "viewer" in self._body()["query"]
            if self.viewer is None:
                self._reply(401, {"message": "Bad credentials"})
            else:
                self._reply(200, {"data": {"viewer": {"login": self.viewer}}})
            return
        comment = {
            "id": 1000 + len(self.comments),
            "body": self._body()["body"],
            "user": dict(self.author),
            "html_url": "https://example.invalid/c",
        }
        self.comments.append(comment)
        self._reply(201, comment)

    def do_PATCH(self) -> None:  # noqa: N802
        self.calls.append(f"PATCH {self.path}")
        cid = int(self.path.rsplit("/", 1)[1])
        comment = next(c for c in self.comments if c["id"] == cid)
        if self.refuse_edits or comment["user"]["login"] != self.author["login"]:
            self._reply(403, {"message": "Resource not accessible by integration"})
            return
        comment["body"] = self._body()["body"]
        self._reply(200, comment)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_github():
    """A fake GitHub API on 127.0.0.1 (no network here), and `post(text)` running the
    comment script against it."""
    _FakeGitHub.comments, _FakeGitHub.calls = [], []
    _FakeGitHub.viewer, _FakeGitHub.refuse_edits = "github-actions", False
    _FakeGitHub.author = {"login": "github-actions[bot]", "type": "Bot"}
    server = HTTPServer(("127.0.0.1", 0), _FakeGitHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "GITHUB_TOKEN": "t0ken",
        "GITHUB_REPOSITORY": REPO,
        "GITHUB_API_URL": f"http://127.0.0.1:{server.server_port}",
    }
    script = GITHUB.parent / "memtrack" / "templates" / "comment.py"

    def post(text: str, tmp: Path) -> subprocess.CompletedProcess:
        verdict = tmp / "verdict.md"
        verdict.write_text(text)
        command = [sys.executable, str(script), "--pr", "7", "--body-file", str(verdict)]
        return subprocess.run(command, env=env, capture_output=True, text=True)

    yield post
    server.shutdown()


def _user(login: str) -> dict[str, str]:
    return {"login": login, "type": "User"}


def _ours() -> list[dict[str, Any]]:
    return [c for c in _FakeGitHub.comments if c["user"]["login"] == _FakeGitHub.author["login"]]


def test_comment_is_created_once_then_updated_in_place_fake_github_api(tmp_path, fake_github):
    # Many earlier comments: the marker is found past the first page.
    _FakeGitHub.comments = [
        {"id": i, "body": f"comment {i}", "user": _user("dev")} for i in range(150)
    ]
    first = fake_github("## memtrack: 1 regression\n", tmp_path)
    assert first.returncode == 0 and "created" in first.stdout, first.stderr
    second = fake_github("## memtrack: all clear\n", tmp_path)
    assert second.returncode == 0 and "updated" in second.stdout, second.stderr
    ours = [c for c in _FakeGitHub.comments if c["body"].startswith("<!-- memtrack -->")]
    assert len(ours) == 1, "the verdict is one comment, updated in place"
    assert "all clear" in ours[0]["body"] and "regression" not in ours[0]["body"]
    assert len(_FakeGitHub.comments) == 151
    assert [c for c in _FakeGitHub.calls if c.startswith("POST /repos")] == [
        f"POST /repos/{REPO}/issues/7/comments"
    ]
    assert f"PATCH /repos/{REPO}/issues/comments/{ours[0]['id']}" in _FakeGitHub.calls


def test_a_marker_comment_someone_else_wrote_is_never_edited_fake_github_api(tmp_path, fake_github):
    forged = {"id": 1, "body": "<!-- memtrack -->\nall clear, trust me", "user": _user("mallory")}
    _FakeGitHub.comments = [dict(forged)]
    for text in ("## memtrack: 1 regression\n", "## memtrack: 2 regressions\n"):
        result = fake_github(text, tmp_path)
        assert result.returncode == 0, result.stderr
    assert _FakeGitHub.comments[0] == forged
    assert f"PATCH /repos/{REPO}/issues/comments/1" not in _FakeGitHub.calls
    (ours,) = _ours()  # its own, posted once and then updated
    assert "2 regressions" in ours["body"]


def test_an_app_installation_token_edits_its_bot_comment_fake_github_api(tmp_path, fake_github):
    _FakeGitHub.viewer = "memtrack-app"  # GraphQL names the app; its comments, the bot
    _FakeGitHub.author = {"login": "memtrack-app[bot]", "type": "Bot"}
    assert "created" in fake_github("first\n", tmp_path).stdout
    assert "updated" in fake_github("second\n", tmp_path).stdout
    assert [c["body"] for c in _ours()] == ["<!-- memtrack -->\nsecond\n"]


def test_a_refused_edit_posts_a_new_comment_instead_fake_github_api(tmp_path, fake_github):
    assert fake_github("first\n", tmp_path).returncode == 0
    _FakeGitHub.refuse_edits = True
    result = fake_github("second\n", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "created (editing comment 1000 was refused: 403)" in result.stdout
    assert [c["body"] for c in _ours()][-1] == "<!-- memtrack -->\nsecond\n"


def test_an_unknown_identity_edits_nothing_and_posts_fake_github_api(tmp_path, fake_github):
    assert fake_github("first\n", tmp_path).returncode == 0
    _FakeGitHub.viewer = None  # neither GraphQL nor /user says who the token is
    result = fake_github("second\n", tmp_path)
    assert result.returncode == 0 and "identity is unknown" in result.stdout, result.stderr
    assert [c["body"].split("\n")[1] for c in _ours()] == ["first", "second"]
    assert not any(c.startswith("PATCH") for c in _FakeGitHub.calls)


def _comment_module():
    import importlib.util

    path = GITHUB.parent / "memtrack" / "templates" / "comment.py"
    spec = importlib.util.spec_from_file_location("memtrack_comment_script", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.parametrize("unit", ["x", "\U0001f3af"])  # an emoji is 2 UTF-16 units
def test_an_oversized_verdict_is_cut_at_a_line_with_its_blocks_closed(unit):
    comment = _comment_module()
    rows = "\n".join(f"| case_{i} | {unit * 40} |" for i in range(3000))
    markdown = f"## memtrack\n<details><summary>all cases</summary>\n\n```\n{rows}\n```\n</details>"
    body = comment.body_of(markdown)
    assert len(body.encode("utf-16-le")) // 2 <= 65_536
    assert body.startswith("<!-- memtrack -->\n## memtrack\n<details>")
    head, _, tail = body.rpartition("```\n</details>\n")
    assert tail == comment.CUT_NOTE and head.endswith(" |\n")  # a whole row, then closed
    assert body.count("<details>") == body.count("</details>") == 1
    assert comment.body_of("short") == "<!-- memtrack -->\nshort\n"
