"""What a repository needs to adopt memtrack, written by `memtrack init` and checked by
`memtrack init --check`: the `[tool.memtrack]` table (in pyproject.toml, else a
memtrack.toml), a workloads module to adapt, the CI workflow, its comment script and the
GPU runner's pre-job hook; and, where setuptools finds the repository's package by itself,
the table that keeps it finding that package alone beside perf/ and data/ (`layout`).

The workflow installs memtrack from a pinned requirement a runner can reach (`requirement`),
never from the repository it measures. Nothing here overwrites a file: new files are created
exclusively, and a table is appended to a pyproject.toml only after the result is checked to
parse. This package does not import torch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from memtrack.config import find_config, is_branch, load_config
from memtrack.errors import ConfigError, MemtrackError
from memtrack.machine.provenance import git_ignore_rule
from memtrack.scaffold.layout import flat_layout, keeping_table, layout_problem
from memtrack.scaffold.requirement import (
    Pin,
    by_version,
    check_index_url,
    check_requirement,
    installed_pin,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

WORKLOADS = Path("perf/workloads.py")
WORKFLOW = Path(".github/workflows/memtrack.yml")
HOOK = Path(".github/memtrack-runner-hook.sh")
COMMENT = Path(".github/memtrack-comment.py")
CONFIGURATION = "configuration"
REFERENCES = "perf/references"
"""Beside the workloads, never under data/: many repositories ignore data/, and reference
outputs must be committed."""

IGNORE_DATABASE = (
    "# memtrack's database and its journal files: CI keeps the history on "
    "its runner\nmemtrack.db*\n"
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


DATABASES = ("sqlite", "postgresql")
"""Where the generated workflow keeps the history: an SQLite file on the gate's runner, or a
PostgreSQL database named by the repository secret MEMTRACK_DATABASE_URL."""

_SERVER_GATE = (
    # (as the SQLite workflow has it, as the PostgreSQL one has it)
    (
        "#   memtrack gate        [self-hosted, memtrack-db]: the only job with MEMTRACK_DB; "
        "runs no code\n"
        "#                        of this repository, only memtrack, pinned: ingests the "
        "records, judges\n"
        "#                        them, writes the history\n",
        "#   memtrack gate        [self-hosted, memtrack-db]: the only job given the secret\n"
        "#                        MEMTRACK_DATABASE_URL; runs no code of this repository, only\n"
        "#                        memtrack, pinned: ingests the records into the PostgreSQL\n"
        "#                        history, judges them\n",
    ),
    (
        "# Repository variables (Settings > Secrets and variables > Actions > Variables), "
        "optional:\n"
        "#   MEMTRACK_DB         the persistent database on the `memtrack-db` runner\n"
        "#                       (default /var/lib/memtrack/memtrack.db)\n",
        "# Repository secret (Settings > Secrets and variables > Actions > Secrets), required:\n"
        "#   MEMTRACK_DATABASE_URL  postgresql://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=verify-full\n"
        "#                       read by the gate alone: the measuring jobs, which run the pull\n"
        "#                       request's code, never see it, and GitHub gives no secret to a\n"
        "#                       fork's pull request\n"
        "# Repository variables (Settings > Secrets and variables > Actions > Variables), "
        "optional:\n",
    ),
    (
        "    env:\n      MEMTRACK_DB: ${{ vars.MEMTRACK_DB || '/var/lib/memtrack/memtrack.db' }}\n",
        "    env:\n      MEMTRACK_DATABASE_URL: ${{ secrets.MEMTRACK_DATABASE_URL }}\n",
    ),
    (
        '          "$bin/memtrack" ingest --db "$MEMTRACK_DB" "${records[@]}" || exit\n',
        '          "$bin/memtrack" ingest "${records[@]}" || exit\n',
    ),
    ('          args=(--db "$MEMTRACK_DB")\n', "          args=()\n"),
)
_SNAPSHOT = "      # A read-only snapshot of the history after each push to the base branch"
_COMMENT_JOB = "\n  comment:\n"


def _on_a_server(text: str) -> str:
    """The workflow with its history on PostgreSQL: the gate reads the URL from the secret,
    and no database snapshot is uploaded (the dashboard reads the server)."""
    for old, new in _SERVER_GATE:
        if old not in text:
            raise AssertionError(f"the workflow template lacks {old[:60]!r}")
        text = text.replace(old, new)
    start, end = text.index(_SNAPSHOT), text.index(_COMMENT_JOB)
    return text[:start].rstrip("\n") + "\n" + text[end:]


def workflow_text(
    base_branch: str, pin: Pin, install_project: bool, database: str = "sqlite"
) -> str:
    """The CI workflow for a repository whose base branch is `base_branch`, installing
    memtrack as `pin` says, and the repository's own package where pip can install it;
    the history in an SQLite file on the gate's runner, or (`database` "postgresql") in
    the PostgreSQL database of the secret MEMTRACK_DATABASE_URL."""
    project = (
        '"$python" -m pip install --quiet -e .  # this repository\'s package'
        if install_project
        else "# this repository is not a pip project: the workloads import it from its root"
    )
    text = (
        _template("workflow.yml")
        # YAML flow scalars of their own: quotes, commas, `]#` and newlines stay in them
        .replace("@@BASE_BRANCH@@", json.dumps(base_branch))
        .replace("@@REQUIREMENT@@", json.dumps(pin.requirement))
        .replace("@@INDEX_URL@@", json.dumps(pin.index_url))
        .replace("@@INSTALL_PROJECT@@", project)
    )
    return _on_a_server(text) if database == "postgresql" else text


def choose_pin(requirement: str | None, index_url: str | None) -> Pin:
    """How the workflow installs memtrack: `requirement` (and `index_url`) as given, checked,
    else as the memtrack running here was installed (`installed_pin`)."""
    index = check_index_url(index_url) if index_url is not None else None
    if requirement is not None:
        pin = Pin(check_requirement(requirement), index or "")
    else:
        pin = installed_pin()
        pin = Pin(pin.requirement, pin.index_url if index is None else index)
    if pin.index_url and not by_version(pin.requirement):
        raise ConfigError(
            f"--index-url: {pin.requirement!r} names where memtrack comes from by itself: "
            "an index goes with memtrack==VERSION"
        )
    return pin


def plan_files(
    root: Path,
    *,
    requirement: str | None = None,
    base_branch: str | None = None,
    index_url: str | None = None,
    database: str = "sqlite",
) -> list[Planned]:
    """What `memtrack init` would write in the repository at `root`, nothing written yet."""
    what = "--base-branch" if base_branch else "the branch checked out"
    branch = check_branch(base_branch or _base_branch(root), what)
    pin = choose_pin(requirement, index_url)
    package, installable = _project(root)
    out: list[Planned] = []
    pyproject = root / "pyproject.toml"
    existing = find_config(root)
    if existing is not None and existing.parent == root:
        out.append(Planned(existing.relative_to(root), CONFIGURATION, "exists", ""))
    elif pyproject.is_file():
        out.append(
            Planned(Path("pyproject.toml"), CONFIGURATION, "append", config_table(branch, True))
        )
    else:
        out.append(
            Planned(Path("memtrack.toml"), CONFIGURATION, "create", config_table(branch, False))
        )
    layout = flat_layout(root)
    table = keeping_table(layout) if layout else None
    if table:
        out.append(
            Planned(
                Path("pyproject.toml"),
                "setuptools' package list, as it found it (perf/ and data/ are no packages)",
                "append",
                "# setuptools would otherwise take perf/ and data/ for packages too, and "
                "refuse to build\n" + table,
            )
        )
    local = root / "data" / "memtrack.db"
    if not git_ignore_rule(root, local):  # a new file of its own: no .gitignore is edited
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
        (WORKFLOW, "CI workflow", workflow_text(branch, pin, installable, database)),
        (COMMENT, "the workflow's pull request comment", _template("comment.py")),
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


def _appends(root: Path, planned: list[Planned]) -> dict[int, str]:
    """What each append adds to its file, every append to one file joined in order and
    checked to parse before anything is written."""
    texts: dict[Path, str] = {}
    added: dict[int, str] = {}
    for n, item in enumerate(planned):
        if item.action != "append":
            continue
        path = root / item.path
        current = texts[path] if path in texts else path.read_text(encoding="utf-8")
        gap = "\n" if current.endswith("\n") or not current else "\n\n"
        joined = current + gap + item.text
        try:
            tomllib.loads(joined)
        except tomllib.TOMLDecodeError as exc:
            table = next(line for line in item.text.splitlines() if line.startswith("["))
            instead = (
                "write memtrack.toml instead"
                if item.what == CONFIGURATION
                else f"add it by hand: {' '.join(item.text[item.text.index(table) :].split())}"
            )
            raise ConfigError(
                f"{path}: a {table} table cannot be added to it as it is ({exc}); {instead}"
            ) from None
        texts[path], added[n] = joined, joined[len(current) :]
    return added


def write_files(root: Path, planned: list[Planned]) -> list[Planned]:
    """Write what `plan_files` planned; return what was written. A file that appeared
    meanwhile is left as it is (listed as existing). Nothing is written where a planned
    path goes out of the repository through a link (`check_links`), or where a table
    cannot be appended."""
    check_links(root, planned)
    appends = _appends(root, planned)
    done: list[Planned] = []
    for n, item in enumerate(planned):
        path = root / item.path
        if item.action == "append":
            with path.open("a", encoding="utf-8") as f:
                f.write(appends[n])
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
    for workflow in workflows:
        out += _install_problems(root, workflow)
    if (
        any("memtrack-comment.py" in w.read_text(errors="replace") for w in workflows)
        and not (root / COMMENT).is_file()
    ):
        out.append(Missing(COMMENT, "the script the workflow comments with is missing"))
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
    if (
        isinstance(database, Path)
        and database.is_relative_to(root)
        and not git_ignore_rule(root, database)
    ):
        out.append(
            Missing(
                database.relative_to(root), "the database is not git-ignored: add it to .gitignore"
            )
        )
    problem = layout_problem(root)
    if problem:
        out.append(Missing(Path("pyproject.toml"), problem))
    if is_template(root / WORKLOADS):
        out.append(
            Missing(
                WORKLOADS,
                "still the template `memtrack init` wrote: adapt its workload to your model",
            )
        )
    modules = [Path(ref) for ref in config.modules if ref.endswith(".py") or "/" in ref]
    adopted = [rel, WORKLOADS, WORKFLOW, COMMENT, HOOK, Path("data/.gitignore"), *modules]
    kept = [p for p in adopted if not p.is_absolute() and (root / p).exists()]
    return out + uncommitted(root, kept)


def is_template(path: Path) -> bool:
    """Whether the file at `path` is still the workloads template `memtrack init` wrote,
    byte for byte but the package its comment names."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    template = re.escape(_template("workloads.py")).replace("@@PACKAGE@@", r"[\w.]+")
    return re.fullmatch(template, text) is not None


def uncommitted(root: Path, paths: list[Path]) -> list[Missing]:
    """Which of `paths` (relative to `root`) are not committed as they are: CI checks out
    the commit, so a file that is only here is not there."""
    if not paths:
        return []
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *paths],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except OSError:
        return []
    if out.returncode != 0:
        return []
    found: list[Missing] = []
    entries = iter(out.stdout.split("\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        state, path = entry[:2], Path(entry[3:])
        if "R" in state or "C" in state:
            next(entries, None)  # a rename's or copy's source
        if state == "??":
            why = "not committed: CI checks out the commit, without it (git add, git commit)"
        else:
            why = "has changes not committed: CI checks out the commit, without them"
        found.append(Missing(path, why))
    return found


def workflow_value(text: str, key: str) -> str | None:
    """The value a workflow's text gives `key` (its first `KEY: value` line), as YAML reads
    a double-quoted, single-quoted or plain scalar on one line; None where no line sets it."""
    m = re.search(rf"^[ \t]*{re.escape(key)}:[ \t]*(.*?)[ \t]*$", text, re.M)
    if m is None:
        return None
    value = m[1]
    if value.startswith('"'):
        try:
            parsed, end = json.JSONDecoder().raw_decode(value)
        except ValueError:
            return value
        rest = value[end:].strip()
        return parsed if isinstance(parsed, str) and (not rest or rest.startswith("#")) else value
    if value.startswith("'"):
        q = re.match(r"'((?:[^']|'')*)'(\s+#.*)?$", value)
        return q[1].replace("''", "'") if q else value
    return re.sub(r"\s+#.*$", "", value)


def _install_problems(root: Path, workflow: Path) -> list[Missing]:
    """A workflow's MEMTRACK_REQUIREMENT that pins nothing a runner can install, and its
    MEMTRACK_INDEX_URL that is no https index (checked offline)."""
    text = workflow.read_text(encoding="utf-8", errors="replace")
    rel = workflow.relative_to(root)
    out = []
    for key, check in (
        ("MEMTRACK_REQUIREMENT", check_requirement),
        ("MEMTRACK_INDEX_URL", check_index_url),
    ):
        value = workflow_value(text, key)
        if value is None:
            continue
        try:
            check(value, key)
        except ConfigError as exc:
            out.append(Missing(rel, str(exc)))
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
    workflow = next((i.text for i in done if i.path == WORKFLOW and i.action == "create"), "")
    requirement = workflow_value(workflow, "MEMTRACK_REQUIREMENT") or ""
    steps = [
        f"adapt {WORKLOADS} to build your model at the sizes you serve, then "
        "`memtrack run` (or `memtrack estimate` without a GPU) and `memtrack show`",
        "commit the files above",
        "register the GPU runner with the labels `gpu` (it measures) and `memtrack-db` (it "
        f"keeps the database; one machine may have both), set ACTIONS_RUNNER_HOOK_JOB_STARTED "
        f"to a copy of {HOOK} outside the repository, and give it a CUDA build of torch "
        "(MEMTRACK_PYTHON)",
        "after the first runs on the base branch, require the `memtrack verdict` check",
        "`memtrack init --check` tells what is still missing",
    ]
    problem = layout_problem(root)
    if problem:
        steps.insert(1, f"pyproject.toml: {problem}")
    if by_version(requirement):
        index = workflow_value(workflow, "MEMTRACK_INDEX_URL") or (
            "the runners' package index (PyPI's, unless their pip is configured otherwise)"
        )
        steps.insert(
            2,
            f"{WORKFLOW} installs {requirement} from {index}: make sure that index serves "
            "your memtrack, or set MEMTRACK_REQUIREMENT to memtrack @ "
            "git+https://HOST/OWNER/REPO@COMMIT",
        )
    return steps


__all__ = [
    "COMMENT",
    "CONFIGURATION",
    "HOOK",
    "REFERENCES",
    "WORKFLOW",
    "WORKLOADS",
    "Missing",
    "Pin",
    "Planned",
    "check_requirement",
    "choose_pin",
    "config_table",
    "installed_pin",
    "is_template",
    "missing",
    "next_steps",
    "plan_files",
    "repository_root",
    "uncommitted",
    "workflow_text",
    "workflow_value",
    "write_files",
]
