"""What a repository needs to adopt memtrack, written by `memtrack init` and checked by
`memtrack init --check`: the `[tool.memtrack]` table (in pyproject.toml, else a
memtrack.toml), a workloads module to adapt, the CI workflow and the GPU runner's pre-job
hook.

The workflow installs memtrack from a pinned requirement (a version, or a git URL at a full
commit), never from the repository it measures. Nothing here overwrites a file: new files
are created exclusively, and the table is appended to a pyproject.toml that has none, after
the result is checked to parse. This module does not import torch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path

from memtrack.config import find_config, is_branch, load_config
from memtrack.errors import ConfigError, MemtrackError
from memtrack.machine.provenance import git_ignore_rule

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

WORKLOADS = Path("perf/workloads.py")
WORKFLOW = Path(".github/workflows/memtrack.yml")
HOOK = Path(".github/memtrack-runner-hook.sh")
REFERENCES = "perf/references"
"""Beside the workloads, never under data/: many repositories ignore data/, and reference
outputs must be committed."""

IGNORE_DATABASE = (
    "# memtrack's database and its journal files: CI keeps the history on "
    "its runner\nmemtrack.db*\n"
)
_PINNED = re.compile(
    r"^memtrack(==[0-9][0-9A-Za-z.+!-]*|\s*@\s*git\+https://[^\s@\"'#]+@[0-9a-f]{40})$"
)


@dataclass(frozen=True)
class Planned:
    """One file `memtrack init` writes, appends to, or leaves as it is."""

    path: Path
    """Relative to the repository's root."""
    what: str
    action: str
    """create | append | exists"""
    text: str
    """What is written (the table alone, for an append); '' where it exists."""


@dataclass(frozen=True)
class Missing:
    """One thing `memtrack init --check` finds missing or wrong."""

    path: Path
    why: str


def repository_root(cwd: Path) -> Path:
    """The root of the git work tree around `cwd`; ConfigError outside one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        raise ConfigError(f"git cannot be run ({exc.strerror}): memtrack needs git") from None
    if out.returncode != 0:
        raise ConfigError(
            f"{cwd}: not inside a git repository (memtrack records every run's "
            "commit: `git init` first)"
        )
    return Path(out.stdout.strip()).resolve()


def pinned_requirement() -> str:
    """How CI installs the memtrack that runs here: its git URL at its commit where it was
    installed from git (PEP 610's direct_url.json), else its version."""
    dist = metadata.distribution("memtrack")
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    vcs = direct.get("vcs_info") or {}
    url = str(direct.get("url", ""))
    commit = str(vcs.get("commit_id", ""))
    if (
        vcs.get("vcs") == "git"
        and url.startswith("https://")
        and re.fullmatch(r"[0-9a-f]{40}", commit)
    ):
        return f"memtrack @ git+{url}@{commit}"
    return f"memtrack=={dist.version}"


def check_requirement(requirement: str) -> str:
    """A requirement that pins one memtrack, or ConfigError saying how to write one."""
    text = requirement.strip()
    if not _PINNED.match(text):
        raise ConfigError(
            f"--requirement: {requirement!r} does not pin memtrack (write "
            "memtrack==VERSION, or memtrack @ git+https://HOST/OWNER/REPO@COMMIT "
            "with the full 40-digit commit)"
        )
    return text


def _base_branch(root: Path) -> str:
    """origin's default branch where known, else the branch checked out, else main."""
    for args in (
        ["symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD"],
        ["symbolic-ref", "--quiet", "--short", "HEAD"],
    ):
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        name = out.stdout.strip().removeprefix("origin/")
        if out.returncode == 0 and name:
            return name
    return "main"


def _project(root: Path) -> tuple[str | None, bool]:
    """The repository's own package name (from pyproject.toml) and whether pip can install
    the repository (a [project] table, or a setup.py / setup.cfg)."""
    name = None
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{pyproject}: not valid TOML ({exc})") from None
        project = data.get("project")
        if isinstance(project, dict) and isinstance(project.get("name"), str):
            name = project["name"]
        if isinstance(project, dict):
            return name, True
    return name, (root / "setup.py").is_file() or (root / "setup.cfg").is_file()


def flat_discovery(root: Path) -> bool:
    """Whether the repository's package is built by setuptools' automatic discovery in a
    flat layout, which refuses to build once several top-level folders (perf/, data/) could
    be packages."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or (root / "setup.py").is_file() or (root / "setup.cfg").is_file():
        return False
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False
    backend = str((data.get("build-system") or {}).get("build-backend", "setuptools"))
    tool = (data.get("tool") or {}).get("setuptools") or {}
    return (
        "project" in data
        and backend.startswith("setuptools")
        and not (root / "src").is_dir()
        and not any(k in tool for k in ("packages", "py-modules"))
    )


def config_table(base_branch: str, pyproject: bool) -> str:
    """The configuration memtrack init writes: a `[tool.memtrack]` table, or memtrack.toml."""
    head = "[tool.memtrack]\n" if pyproject else ""
    budgets = "[[tool.memtrack.budgets]]" if pyproject else "[[budgets]]"
    return (
        f"{head}"
        "# memtrack: see `memtrack --help`. Paths are relative to this file.\n"
        'modules = ["perf.workloads"]      # the workloads (module names or .py paths)\n'
        'database = "data/memtrack.db"     # git-ignored; CI points --db at the runner\'s\n'
        f"base_branch = {json.dumps(base_branch)}\n"
        f'references = "{REFERENCES}"    # reference outputs: commit them\n'
        "\n"
        "# An absolute ceiling, with the reason that makes raising it a reviewed change:\n"
        f"# {budgets}\n"
        '# workload = "forward"\n'
        '# limit = "40 GiB"\n'
        '# reason = "must fit one 48 GB GPU beside the serving runtime"\n'
    )


def _template(name: str) -> str:
    return (resources.files("memtrack") / "templates" / name).read_text(encoding="utf-8")


def workflow_text(base_branch: str, requirement: str, install_project: bool) -> str:
    project = (
        '"$venv/bin/python" -m pip install --quiet -e .  # this repository\'s package'
        if install_project
        else "# this repository is not a pip project: the workloads import it from its root"
    )
    return (
        _template("workflow.yml")
        # a YAML flow scalar of its own: quotes, commas, `]#` and newlines stay in it
        .replace("@@BASE_BRANCH@@", json.dumps(base_branch))
        .replace("@@REQUIREMENT@@", requirement)
        .replace("@@INSTALL_PROJECT@@", project)
    )


def plan_files(
    root: Path, *, requirement: str | None = None, base_branch: str | None = None
) -> list[Planned]:
    """What `memtrack init` would write in the repository at `root`, nothing written yet."""
    requirement = check_requirement(requirement or pinned_requirement())
    what = "--base-branch" if base_branch else "the branch checked out"
    branch = check_branch(base_branch or _base_branch(root), what)
    package, installable = _project(root)
    out: list[Planned] = []
    pyproject = root / "pyproject.toml"
    existing = find_config(root)
    if existing is not None and existing.parent == root:
        out.append(Planned(existing.relative_to(root), "configuration", "exists", ""))
    elif pyproject.is_file():
        out.append(
            Planned(Path("pyproject.toml"), "configuration", "append", config_table(branch, True))
        )
    else:
        out.append(
            Planned(Path("memtrack.toml"), "configuration", "create", config_table(branch, False))
        )
    database = root / "data" / "memtrack.db"
    if not git_ignore_rule(root, database):  # a new file of its own: no .gitignore is edited
        ignore = Path("data/.gitignore")
        exists = (root / ignore).exists()
        out.append(
            Planned(
                ignore,
                "git-ignores the database",
                "exists" if exists else "create",
                "" if exists else IGNORE_DATABASE,
            )
        )
    module = package.replace("-", "_") if package else "your_package"
    for path, what, text in (
        (WORKLOADS, "workloads to adapt", _template("workloads.py").replace("@@PACKAGE@@", module)),
        (WORKFLOW, "CI workflow", workflow_text(branch, requirement, installable)),
        (HOOK, "GPU runner's pre-job hook", _template("memtrack-runner-hook.sh")),
    ):
        exists = (root / path).exists()
        out.append(Planned(path, what, "exists" if exists else "create", "" if exists else text))
    return out


def check_branch(branch: str, what: str) -> str:
    """A branch name init can write into the config and the workflow: one git accepts
    (`git check-ref-format --branch`, closely), and no GitHub Actions expression (`${{`,
    which Actions would evaluate inside any string of the workflow)."""
    if not is_branch(branch) or "${{" in branch:
        raise ConfigError(f"{what}: {branch!r} is not a branch name memtrack init can write")
    return branch


def check_links(root: Path, planned: list[Planned]) -> None:
    """Refuse, before anything is written, a planned file whose path goes through a symbolic
    link out of the repository (`perf/`, `data/`, `.github/` or a file itself): init writes
    inside the repository or nowhere."""
    top = root.resolve()
    for item in planned:
        if item.action == "exists":
            continue
        at = root
        for part in item.path.parts:
            at = at / part
            if at.is_symlink() and not at.resolve().is_relative_to(top):
                raise ConfigError(
                    f"{at}: a symbolic link out of the repository (to {at.resolve()}): "
                    "memtrack init writes nothing through it"
                )


def write_files(root: Path, planned: list[Planned]) -> list[Planned]:
    """Write what `plan_files` planned; return what was written. A file that appeared
    meanwhile is left as it is (listed as existing). Nothing is written where a planned
    path goes out of the repository through a link (`check_links`)."""
    check_links(root, planned)
    done: list[Planned] = []
    for item in planned:
        path = root / item.path
        if item.action == "append":
            current = path.read_text(encoding="utf-8")
            joined = (
                current
                + ("" if current.endswith("\n") or not current else "\n")
                + ("\n" + item.text)
            )
            try:
                tomllib.loads(joined)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(
                    f"{path}: a [tool.memtrack] table cannot be added to it as "
                    f"it is ({exc}); write memtrack.toml instead"
                ) from None
            with path.open("a", encoding="utf-8") as f:
                f.write(joined[len(current) :])
            done.append(item)
        elif item.action == "create":
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with path.open("x", encoding="utf-8") as f:
                    f.write(item.text)
            except FileExistsError:
                done.append(Planned(item.path, item.what, "exists", ""))
                continue
            if item.path == HOOK:
                path.chmod(0o755)
            done.append(item)
        else:
            done.append(item)
    return done


def missing(root: Path) -> list[Missing]:
    """What the repository at `root` lacks to run memtrack in CI; [] when nothing."""
    out: list[Missing] = []
    config_path = find_config(root)
    if config_path is None:
        return [Missing(Path("pyproject.toml"), "no [tool.memtrack] table (nor a memtrack.toml)")]
    rel = config_path.relative_to(root) if config_path.is_relative_to(root) else config_path
    try:
        config = load_config(config_path)
    except MemtrackError as exc:
        return [Missing(rel, str(exc))]
    for ref in config.modules:
        if ref.endswith(".py") or "/" in ref:
            if not (config.root / ref).is_file():
                out.append(Missing(rel, f"modules: {ref} does not exist"))
        elif not _module_exists(ref, config.root):
            out.append(Missing(rel, f"modules: no module {ref} under {config.root}"))
    workflows = sorted((root / ".github" / "workflows").glob("*.y*ml"))
    runs_check = re.compile(r"memtrack[\"']?\s+check\b")
    if not any(
        runs_check.search(w.read_text(encoding="utf-8", errors="replace")) for w in workflows
    ):
        out.append(Missing(WORKFLOW, "no workflow under .github/workflows runs `memtrack check`"))
    hook = root / HOOK
    if not hook.is_file():
        out.append(Missing(HOOK, "the GPU runner's pre-job hook is missing"))
    elif not os.access(hook, os.X_OK):
        out.append(Missing(HOOK, "not executable (chmod +x)"))
    references = config.references
    if references.is_relative_to(root):
        rule = git_ignore_rule(root, references / "manifest.json")
        if rule:
            out.append(
                Missing(
                    references.relative_to(root),
                    f"git ignores the references folder ({rule}), and references "
                    "must be committed: set `references` to a folder git keeps",
                )
            )
    database = config.database
    if database.is_relative_to(root) and not git_ignore_rule(root, database):
        out.append(
            Missing(
                database.relative_to(root), "the database is not git-ignored: add it to .gitignore"
            )
        )
    return out


def _module_exists(ref: str, root: Path) -> bool:
    """Whether `ref` names a module file or package under `root`, or an installed one,
    without importing it."""
    parts = ref.split(".")
    base = root.joinpath(*parts)
    if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
        return True
    import importlib.util

    try:
        return importlib.util.find_spec(parts[0]) is not None
    except (ImportError, ValueError):
        return False


def next_steps(root: Path, done: list[Planned]) -> list[str]:
    """What to do after `memtrack init`, in order."""
    req = next((i.text for i in done if i.path == WORKFLOW and i.action == "create"), "")
    versioned = re.search(r'MEMTRACK_REQUIREMENT: "memtrack==', req) is not None
    steps = [
        f"adapt {WORKLOADS} to build your model at the sizes you serve, then "
        "`memtrack run` (or `memtrack estimate` without a GPU) and `memtrack show`",
        "commit the files above",
        f"on the GPU runner: label it `gpu`, set ACTIONS_RUNNER_HOOK_JOB_STARTED to {HOOK} "
        "(a copy outside the repository), and give it a CUDA build of torch (MEMTRACK_PYTHON)",
        "after the first runs on the base branch, require the `memtrack verdict` check",
        "`memtrack init --check` tells what is still missing",
    ]
    if flat_discovery(root):
        steps.insert(
            1,
            "pyproject.toml: setuptools finds your packages automatically in a "
            "flat layout, and refuses to build beside the new top-level folders "
            "(perf/, data/): name them, e.g. [tool.setuptools] packages = "
            '["your_package"]',
        )
    if versioned:
        steps.insert(
            2,
            f"{WORKFLOW} installs memtrack by its version from your package "
            "index: point MEMTRACK_REQUIREMENT at your team's copy "
            "(memtrack @ git+https://.../memtrack@COMMIT) unless it is there",
        )
    return steps


__all__ = [
    "HOOK",
    "REFERENCES",
    "WORKFLOW",
    "WORKLOADS",
    "Missing",
    "Planned",
    "check_requirement",
    "config_table",
    "flat_discovery",
    "missing",
    "next_steps",
    "pinned_requirement",
    "plan_files",
    "repository_root",
    "workflow_text",
    "write_files",
]
