"""A commit measured in a git worktree of its own, beside the user's tree: what
`memtrack bisect` measures (recorded into the database as a run of that commit), and the
reference side of a paired timing (measure.pairs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from memtrack.config import Config
from memtrack.machine.provenance import git_output
from memtrack.store.url import Database, ServerUrl

FORGET = ("GITHUB_HEAD_REF", "GITHUB_REF_NAME")
"""What would name a measured commit's run after the branch CI checked out: these runs are
of their commits alone (no branch), so that no baseline takes them for the base branch's
newest runs."""


def without_branch_names() -> dict[str, str]:
    """This process's environment less what names the checked-out branch (FORGET)."""
    return {k: v for k, v in os.environ.items() if k not in FORGET}


@contextlib.contextmanager
def worktree(config: Config, commit: str) -> Iterator[tuple[Path | None, str | None]]:
    """A detached worktree of `commit`, removed after the block: (the config file there,
    None), or (None, why there is none, in one line)."""
    top = Path(git_output(config.root, "rev-parse", "--show-toplevel") or config.root)
    config_path = (config.path or top / "pyproject.toml").resolve()
    if not config_path.is_relative_to(top.resolve()):
        yield None, f"the config {config_path} is outside the repository at {top}"
        return
    rel = config_path.relative_to(top.resolve())
    folder = Path(tempfile.mkdtemp(prefix="memtrack-worktree-"))
    tree = folder / "tree"
    try:
        git_output(top, "worktree", "prune")  # what a killed run left registered
        made = git_output(top, "worktree", "add", "--detach", "--quiet", revs=(str(tree), commit))
        if made is None:
            yield None, f"no worktree of {commit[:12]} could be made"
        elif not (tree / rel).is_file():
            yield None, f"no {rel.as_posix()} at {commit[:12]}"
        else:
            yield tree / rel, None
    finally:
        git_output(top, "worktree", "remove", "--force", revs=(str(tree),))
        shutil.rmtree(folder, ignore_errors=True)


def measure_at(config: Config, db: Database, commit: str, case: str) -> str | None:
    """`memtrack run -k CASE` at `commit`, in a worktree of its own, recorded into `db`:
    None, or why the commit could not be measured (in one line)."""
    with worktree(config, commit) as (config_file, why):
        if config_file is None:
            return why
        env = without_branch_names()
        # a server's URL by the environment: a command line is for everyone on the machine
        # a file's path made absolute here: the run's working directory is the worktree
        env["MEMTRACK_DB"] = db.url if isinstance(db, ServerUrl) else str(Path(db).absolute())
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "memtrack.cli",
                "run",
                "--unpaired",
                "-k",
                case,
                "--config",
                str(config_file),
            ],
            cwd=config_file.parent,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            return lines[-1] if lines else f"memtrack run exited {done.returncode}"
        return None


__all__ = ["FORGET", "measure_at", "without_branch_names", "worktree"]
