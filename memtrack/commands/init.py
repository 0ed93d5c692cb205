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
    help="How CI installs memtrack, pinned: memtrack==VERSION, memtrack @ "
    "git+https://HOST/OWNER/REPO@COMMIT, memtrack @ https://HOST/PATH/memtrack-VERSION-"
    "py3-none-any.whl, or the absolute path of such a file on the runner (default: as the "
    "memtrack running this was installed: its git commit, its archive's URL, or its "
    "version from the index pip is configured with; a wheel file, a folder or an editable "
    "install cannot be reached from a runner, and must be named here).",
)
@click.option(
    "--index-url",
    metavar="URL",
    help="The https package index that serves a memtrack==VERSION requirement (default: "
    "the runner's own).",
)
@click.option(
    "--base-branch",
    metavar="NAME",
    help="The branch whose runs are the baseline (default: origin's default "
    "branch, else the branch checked out).",
)
@click.option(
    "--database",
    type=click.Choice(scaffold.DATABASES),
    default="sqlite",
    show_default=True,
    help="Where the workflow keeps the history: an SQLite file on the gate's runner, or a "
    "PostgreSQL database named by the repository secret MEMTRACK_DATABASE_URL (read by the "
    "gate alone).",
)
def init(
    check_only: bool,
    requirement: str | None,
    index_url: str | None,
    base_branch: str | None,
    database: str,
) -> None:
    """Set up this git repository for memtrack: the [tool.memtrack] table (in
    pyproject.toml, else memtrack.toml), perf/workloads.py to adapt, the CI workflow and its
    comment script, and the GPU runner's pre-job hook. Where setuptools finds the
    repository's package by itself, also the table that keeps it building that package
    alone. Never overwrites a file; prints the next steps."""
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
    planned = scaffold.plan_files(
        root,
        requirement=requirement,
        base_branch=base_branch,
        index_url=index_url,
        database=database,
    )
    done = scaffold.write_files(root, planned)
    for item in done:
        left = " (left as it is)" if item.action == "exists" else ""
        click.echo(f"{_VERB[item.action]} {str(item.path):36} {item.what}{left}")
    click.echo("next:")
    for n, step in enumerate(scaffold.next_steps(root, done), 1):
        click.echo(f"  {n}. {step}")
