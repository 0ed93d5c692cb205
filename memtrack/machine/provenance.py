"""Where a run happened: the git commit (gitpython) and the CI job (GitHub Actions variables).

Never raises for a missing repository, a detached HEAD or a shallow clone: it records what
it can and says, in `notes`, what it could not.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from datetime import timezone
from pathlib import Path

from memtrack.records import CIInfo, GitInfo

_REPO_PATH = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)+")
_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?([A-Za-z0-9.-]+):(?!/)(.+)$")


def remote_identity(url: str) -> str | None:
    """A remote's URL as a repository identity, 'host/owner/name': scheme, credentials, port
    and a trailing '.git' left out, the host in lower case, so that the https and ssh
    remotes of one repository are one identity. None for a local path or what reads as no
    repository address."""
    import urllib.parse

    url = url.strip()
    scp = _SCP_LIKE.match(url) if "://" not in url else None
    if scp:
        host, path = scp.group(1), scp.group(2)
    elif "://" in url:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "file" or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path
    else:
        return None
    path = path.strip("/")
    path = path[: -len(".git")] if path.endswith(".git") else path
    identity = f"{host.lower()}/{path}"
    return identity if _REPO_PATH.fullmatch(identity) else None


def repository_identity(
    path: Path, configured: str | None = None, env: Mapping[str, str] | None = None
) -> str | None:
    """The repository's identity, as a run records it: `configured` (the config's
    `repository`), else GitHub's GITHUB_SERVER_URL host and GITHUB_REPOSITORY, else the
    origin remote of the repository at `path`; None where none is known."""
    import urllib.parse

    env = os.environ if env is None else env
    if configured:
        return configured
    name = env.get("GITHUB_REPOSITORY", "")
    if _REPO_PATH.fullmatch(name):
        host = urllib.parse.urlsplit(env.get("GITHUB_SERVER_URL") or "https://github.com")
        return f"{(host.hostname or 'github.com').lower()}/{name}"
    origin = git_output(path, "config", "--get", "remote.origin.url")
    return remote_identity(origin) if origin else None


def git_info(
    path: Path,
    base_branch: str,
    env: Mapping[str, str] | None = None,
    repository: str | None = None,
) -> GitInfo:
    """The commit at `path`, its merge-base with `base_branch` when that can be found, and
    the repository's identity (`repository`, the config's, else `repository_identity`'s)."""
    env = os.environ if env is None else env
    repository = repository_identity(path, repository, env)
    try:
        import git
    except ImportError:  # pragma: no cover - gitpython is a dependency
        return GitInfo(
            base_branch=base_branch, notes=("gitpython is not installed",), repository=repository
        )
    try:
        repo = git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return GitInfo(
            base_branch=base_branch,
            notes=(f"{path} is not inside a git repository",),
            repository=repository,
        )
    notes: list[str] = []
    try:
        head = repo.head.commit
    except ValueError:
        return GitInfo(
            base_branch=base_branch,
            notes=("the repository has no commits yet",),
            repository=repository,
        )
    shallow = Path(repo.git_dir, "shallow").exists()
    if shallow:
        notes.append("shallow clone: history and merge-base may be incomplete")
    branch = None
    if not repo.head.is_detached:
        branch = repo.active_branch.name
    else:
        # CI checks out a detached commit; GitHub says which branch it stands for.
        branch = env.get("GITHUB_HEAD_REF") or env.get("GITHUB_REF_NAME") or None
        if branch is None:
            notes.append("detached HEAD: branch unknown")
    try:
        parent = head.parents[0].hexsha if head.parents else None
    except (ValueError, git.GitCommandError):
        parent = None
    if parent is None and shallow:
        notes.append("parent commit is beyond the shallow boundary")
    merge_base = _merge_base(repo, head, base_branch, notes)
    try:
        dirty = repo.is_dirty(untracked_files=False)
    except git.GitCommandError:
        dirty = None
    return GitInfo(
        commit=head.hexsha,
        branch=branch,
        parent=parent,
        subject=head.summary if isinstance(head.summary, str) else head.summary.decode(),
        committed_at=head.committed_datetime.astimezone(timezone.utc).isoformat(timespec="seconds"),
        dirty=dirty,
        base_branch=base_branch,
        merge_base=merge_base,
        shallow=shallow,
        notes=tuple(notes),
        repository=repository,
    )


def _merge_base(repo: object, head: object, base_branch: str, notes: list[str]) -> str | None:
    import git

    assert isinstance(repo, git.Repo)
    for ref in (base_branch, f"origin/{base_branch}", f"refs/remotes/origin/{base_branch}"):
        try:
            base = repo.commit(ref)
        except (git.BadName, ValueError, git.GitCommandError):
            continue
        try:
            bases = repo.merge_base(head, base)
        except git.GitCommandError:
            bases = []
        if bases:
            return bases[0].hexsha
        notes.append(f"no merge-base with {ref} (shallow clone or unrelated history)")
        return None
    notes.append(f"base branch {base_branch!r} not found locally: merge-base unknown")
    return None


_PR_REF = re.compile(r"^refs/pull/(\d+)/")


def ci_info(env: Mapping[str, str] | None = None) -> CIInfo:
    """GitHub Actions context from its variables; an empty CIInfo elsewhere."""
    env = os.environ if env is None else env
    if env.get("GITHUB_ACTIONS") != "true" and not env.get("GITHUB_EVENT_NAME"):
        return CIInfo()
    ref = env.get("GITHUB_REF")
    match = _PR_REF.match(ref or "")
    server, repo, run = (
        env.get("GITHUB_SERVER_URL"),
        env.get("GITHUB_REPOSITORY"),
        env.get("GITHUB_RUN_ID"),
    )
    return CIInfo(
        provider="github-actions",
        event=env.get("GITHUB_EVENT_NAME"),
        ref=ref,
        sha=env.get("GITHUB_SHA"),
        pr_number=int(match.group(1)) if match else None,
        base_ref=env.get("GITHUB_BASE_REF") or None,
        head_ref=env.get("GITHUB_HEAD_REF") or None,
        run_url=f"{server}/{repo}/actions/runs/{run}" if server and repo and run else None,
        runner_name=env.get("RUNNER_NAME"),
    )


def git_output(root: Path, *args: str, revs: tuple[str, ...] = ()) -> str | None:
    """git's output, or None when git fails (no repository, unknown object).

    `args` are the subcommand and its options, written in the code; revisions, which come
    from records, configs and the command line, go in `revs`: after `--end-of-options`, so
    a value such as '--output=FILE' is never read as an option.
    """
    cmd = ["git", "-C", str(root), *args]
    if revs:
        cmd += ["--end-of-options", *revs]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_ignore_rule(root: Path, path: Path) -> str | None:
    """The rule by which git ignores `path` in the work tree at `root` ('.gitignore:3:data/'),
    or None: not ignored, already tracked, outside a work tree, or no git."""
    try:
        out = subprocess.run(
            ["git", "check-ignore", "--verbose", str(path)],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if out.returncode != 0:
        return None
    return out.stdout.split("\t", 1)[0].strip() or "an ignore rule"
