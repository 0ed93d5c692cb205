"""The GitHub Actions files: valid by GitHub's schema, clean by zizmor's audit, and safe on
a persistent GPU runner: a fork's code can never reach it, jobs on one GPU never overlap,
tokens are read-only unless a job needs more, and every remote action is pinned.

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
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from gha import evaluate, load_yaml

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / ".github"
WORKFLOWS = sorted((GITHUB / "workflows").glob("*.yml"))
ACTION = GITHUB / "actions" / "memtrack" / "action.yml"
HOOK = GITHUB / "memtrack-runner-hook.sh"
REPO = "octo/memtrack"


def _load(path: Path) -> dict[str, Any]:
    return load_yaml(path)


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def _jobs() -> list[tuple[str, str, dict[str, Any]]]:
    return [(wf.name, name, job) for wf in WORKFLOWS for name, job in _load(wf)["jobs"].items()]


def _labels(job: dict[str, Any]) -> list[str]:
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):  # {group:, labels:}
        runs_on = runs_on.get("labels", [])
    return [runs_on] if isinstance(runs_on, str) else list(runs_on)


def _self_hosted(job: dict[str, Any]) -> bool:
    """Self-hosted, or not known before run time (an expression): both need the guard."""
    return any(label == "self-hosted" or "${{" in label for label in _labels(job))


def test_the_files_exist() -> None:
    assert {wf.name for wf in WORKFLOWS} >= {"memtrack.yml", "tests.yml"}
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


def test_zizmor_offline_finds_nothing() -> None:
    out = subprocess.run(
        [_tool("zizmor"), "--offline", "--no-progress", str(GITHUB)],
        capture_output=True,
        text=True,
        cwd=ROOT,
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


def test_forks_get_a_hosted_cpu_job_and_the_required_check_still_reports() -> None:
    jobs = {name: job for wf, name, job in _jobs() if wf == "memtrack.yml"}
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
        assert "pull_request_target" not in names, wf.name
        assert "workflow_run" not in names, wf.name


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
        assert top is not None, f"{path.name}: no top-level permissions (the default may write)"
        assert top in ({}, "read-all") or (
            isinstance(top, dict) and set(top.values()) <= {"read", "none"}
        ), f"{path.name}: top-level permissions {top} are not read-only"
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
                found.append((f"{path.name}: {line.strip()}", m.group(1) + m.group(2)))
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
    install = _load(ACTION)["runs"]["steps"][0]["run"]
    assert 'pip install --quiet "$GITHUB_ACTION_PATH/../../.."' in install
    # The pull request's own code runs in the measuring jobs, which never learn where the
    # history is: only the gate has MEMTRACK_DB.
    workflow = _load(GITHUB / "workflows" / "memtrack.yml")
    assert "MEMTRACK_DB" not in workflow.get("env", {})
    for name, job in jobs.items():
        assert ("MEMTRACK_DB" in job.get("env", {})) == (name == "gate"), name


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
    script = GITHUB / "actions" / "memtrack" / "comment.py"

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

    path = GITHUB / "actions" / "memtrack" / "comment.py"
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
