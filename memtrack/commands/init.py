from __future__ import annotations

from pathlib import Path

import click

from memtrack import scaffold

_VERB = {"create": "created ", "append": "appended", "exists": "exists  "}


@click.command()
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing: list what is missing. Exit 0 when nothing is, 2 otherwise.",
)
@click.option(
    "--requirement",
    metavar="REQ",
    help="How CI installs memtrack, pinned: memtrack==VERSION or memtrack @ "
    "git+https://HOST/OWNER/REPO@COMMIT (default: the memtrack running this, "
    "by its git commit where it was installed from git, else its version).",
)
@click.option(
    "--base-branch",
    metavar="NAME",
    help="The branch whose runs are the baseline (default: origin's default "
    "branch, else the branch checked out).",
)
def init(check_only: bool, requirement: str | None, base_branch: str | None) -> None:
    """Set up this git repository for memtrack: the [tool.memtrack] table (in
    pyproject.toml, else memtrack.toml), perf/workloads.py to adapt, the CI workflow and
    the GPU runner's pre-job hook. Never overwrites a file; prints the next steps."""
    root = scaffold.repository_root(Path.cwd())
    if check_only:
        problems = scaffold.missing(root)
        for p in problems:
            click.echo(f"missing  {p.path}: {p.why}")
        if problems:
            click.echo(
                f"memtrack: error: {len(problems)} thing(s) missing in {root} "
                "(`memtrack init` writes what it can)",
                err=True,
            )
            raise SystemExit(2)
        click.echo(f"{root}: nothing missing")
        return
    planned = scaffold.plan_files(root, requirement=requirement, base_branch=base_branch)
    done = scaffold.write_files(root, planned)
    for item in done:
        left = " (left as it is)" if item.action == "exists" else ""
        click.echo(f"{_VERB[item.action]} {str(item.path):36} {item.what}{left}")
    click.echo("next:")
    for n, step in enumerate(scaffold.next_steps(root, done), 1):
        click.echo(f"  {n}. {step}")
