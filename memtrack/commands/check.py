from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from memtrack.commands.options import (
    config_option,
    db_option,
    json_path_option,
    patterns_option,
    repository_of,
    resolve,
    rich_console,
)
from memtrack.config import MAX_COUNT, Config, is_branch, is_revision
from memtrack.errors import ConfigError, StoreError
from memtrack.files import output_problem
from memtrack.workload.registry import missing_modules

if TYPE_CHECKING:
    from memtrack.store.database import Store


def _anchor(value: str | None) -> str | int | None:
    """--anchor: N (the run N commits ago, 1 to MAX_COUNT) or a git revision, which git can
    never read as an option."""
    if value is None:
        return None
    if value.isdigit() and 1 <= int(value) <= MAX_COUNT:
        return int(value)
    if value.isdigit() or not is_revision(value):
        raise ConfigError(
            f"--anchor: {value!r} is not a tag, a commit or a number of commits "
            f"from 1 to {MAX_COUNT:,}"
        )
    return value


REPOSITORY = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def source_url(config: Config, result: Any) -> str | None:
    """Where the candidate's files are on the forge ('https://github.com/o/r/blob/SHA/'),
    for the PR comment's links: from GitHub Actions' GITHUB_REPOSITORY and the checked
    commit; None outside it, or where either is not one."""
    repository = os.environ.get("GITHUB_REPOSITORY", "")
    commit = result.commit or ""
    if not REPOSITORY.fullmatch(repository) or not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        return None
    return f"{config.forge_url.rstrip('/')}/{repository}/blob/{commit}/"


def _refuse_mixed(history: bool, candidate: bool, history_options: bool) -> None:
    """Refuse --history with a candidate (--run, --commit), and its options without it."""
    if history and candidate:
        raise ConfigError("--history looks at the base branch: it takes no --run or --commit")
    if not history and history_options:
        raise ConfigError("--anchor and -k/--workload go with --history")


def _output(option: str, path: Path | None) -> None:
    """Refuse before judging (and recording verdicts) an output that cannot be written."""
    if path is not None:
        problem = output_problem(path)
        if problem:
            raise ConfigError(f"{option} {path}: {problem}")


def _write(path: Path, text: str, *, append: bool = False) -> None:
    """Write a report whole or not at all (a full disk leaves no half report), naming the
    file when it fails."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        if append:
            with open(path, "a", encoding="utf-8") as f:
                f.write(text)
            return
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from None


@click.command()
@config_option
@db_option
@click.option("--run", "run_id", help="The run to check (id or unique prefix).")
@click.option("--commit", help="Check the newest run of this commit (default: HEAD's).")
@click.option("--base", "base_branch", help="Base branch (default: the config's base_branch).")
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write a compact Markdown report here.",
)
@json_path_option("the verdicts as JSON")
@click.option("--no-record", is_flag=True, help="Do not record the verdicts in the database.")
@click.option(
    "--history",
    is_flag=True,
    help="Instead: find the steps of every series on the base branch, and creep "
    "against an anchor. Exit 1 when a series crept past creep_tolerance.",
)
@click.option(
    "--anchor",
    help="With --history: a tag or commit, or N (the run N commits "
    "ago); default: the config's creep_anchor.",
)
@patterns_option("With --history:")
@click.option(
    "--annotations/--no-annotations",
    default=None,
    help="Print a GitHub Actions annotation per blocking verdict and warning, at the site "
    "that grew (default: on where GITHUB_ACTIONS=true).",
)
def check(
    config_path: Path | None,
    db_path: Path | None,
    run_id: str | None,
    commit: str | None,
    base_branch: str | None,
    markdown_path: Path | None,
    json_path: Path | None,
    no_record: bool,
    history: bool,
    anchor: str | None,
    patterns: tuple[str, ...],
    annotations: bool | None,
) -> None:
    """Compare a run with its baseline and budgets; exit 1 when something blocks.

    Exit status: 0 nothing blocks, 1 something blocks, 2 a usage, config or data error.
    With GITHUB_STEP_SUMMARY set, a compact Markdown summary is appended there.
    """
    from memtrack.store.database import ALL_REPOSITORIES
    from memtrack.store.opening import open_store
    from memtrack.store.url import present

    config, db = resolve(config_path, db_path)
    _refuse_mixed(history, bool(run_id or commit), anchor is not None or bool(patterns))
    if base_branch is not None and not is_branch(base_branch):
        raise ConfigError(f"--base: {base_branch!r} is not a branch name")
    history_anchor = _anchor(anchor)
    # a suite whose module cannot be found could never be measured: said, not judged
    missing = None if history else missing_modules(config)
    if missing is not None:
        raise missing
    _output("--markdown", markdown_path)
    _output("--json", json_path)
    if not present(db):
        raise StoreError(f"{db}: no such database (record a run with `memtrack run`)")
    # the working tree's repository, where runs are found by branch or commit (not by id)
    here = repository_of(config) if history or not run_id else ALL_REPOSITORIES
    if annotations is None:
        annotations = os.environ.get("GITHUB_ACTIONS") == "true"
    with open_store(db, readonly=history or no_record, create=False, repository=here) as store:
        if not (history or no_record):  # runs kept while the database could not take them
            from memtrack.store import spool

            for line in spool.drain(store, db):
                click.echo(line, err=True)
        if history:
            shown = _history(store, config, base_branch, patterns, history_anchor)
        else:
            shown = _judged(store, config, run_id, commit, base_branch)
        # Shown and written first: a verdict that cannot be recorded still reaches the job.
        _show(shown, markdown_path, json_path, annotations)
        if shown.record is not None and not no_record:
            _record(store, shown.record)
    sys.exit(shown.code)


class _Shown(NamedTuple):
    """What a check or a history shows: the terminal's renderables, the exit status, and
    the Markdown and JSON reports, made only where they are written."""

    renderables: list[Any]
    code: int
    markdown: Callable[[], str]
    data: Callable[[], Any]
    annotations: Callable[[], list[str]] = list
    record: Any = None
    """A check's result, to record after it is shown; None for a history."""


def _history(
    store: Store,
    config: Config,
    base_branch: str | None,
    patterns: tuple[str, ...],
    anchor: str | int | None,
) -> _Shown:
    from memtrack.judge.gather.history import analyze_history
    from memtrack.report import history as report

    h = analyze_history(
        store, config, base_branch=base_branch, patterns=tuple(patterns), anchor=anchor
    )
    return _Shown(
        report.history_terminal(h),
        h.exit_code,
        lambda: report.history_markdown(h, dashboard_url=config.dashboard_url),
        lambda: dataclasses.asdict(h),
    )


def _judged(
    store: Store,
    config: Config,
    run_id: str | None,
    commit: str | None,
    base_branch: str | None,
) -> _Shown:
    from memtrack.judge.check import check as run_check
    from memtrack.report import check as report
    from memtrack.report.annotations import workflow_commands

    result = run_check(store, config, run_id=run_id, commit=commit, base_branch=base_branch)
    return _Shown(
        report.terminal(result),
        result.exit_code,
        lambda: report.markdown(
            result, dashboard_url=config.dashboard_url, source_url=source_url(config, result)
        ),
        lambda: report.to_json(result),
        lambda: workflow_commands(result, config.root),
        result,
    )


def _record(store: Store, result: Any) -> None:
    """Record a check's verdicts; where the database refuses (a read-only user, a server
    gone), one warning line: the verdict, already shown, stands."""
    from memtrack.report.check import record

    try:
        record(store, result)
    except (StoreError, OSError) as exc:
        click.echo(f"warning: verdicts not recorded: {exc}", err=True)
    except Exception as exc:  # noqa: BLE001 - a driver's own error (sqlite3, psycopg)
        if type(exc).__module__.split(".")[0] not in ("sqlite3", "psycopg"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        click.echo(f"warning: verdicts not recorded: {first}", err=True)


def _show(
    shown: _Shown, markdown_path: Path | None, json_path: Path | None, annotations: bool
) -> None:
    """Print the terminal lines (and the annotations, where asked), and write the reports
    asked for."""
    from rich.text import Text

    console = rich_console()
    for r in shown.renderables:
        # One verdict, one line: unwrapped lines stay whole in CI logs and for grep.
        console.print(r, soft_wrap=isinstance(r, Text))
    if annotations:
        for line in shown.annotations():
            click.echo(line)  # as it is: a workflow command is one line, escaped
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    text = shown.markdown() if markdown_path or summary else ""
    if markdown_path:
        _write(markdown_path, text)
    if summary:
        _write(Path(summary), text + "\n", append=True)
    if json_path:
        _write(json_path, json.dumps(shown.data(), indent=2, default=str) + "\n")
