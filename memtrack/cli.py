"""The `memtrack` command. Each command lives in memtrack/commands/<name>.py and stays thin:
parse options, call one library function, format the result.

Exit status 1 means only "a verdict blocks". Every error, the ones memtrack raises on purpose
and any other (a full disk, a corrupted database), is one line and exit status 2; `--debug`
or MEMTRACK_DEBUG=1 adds the traceback."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import click

from memtrack.errors import MemtrackError


def _unexpected(exc: Exception) -> str:
    import sqlite3

    from memtrack import store

    if isinstance(exc, (sqlite3.Error, OSError)):
        return store.describe_failure(exc, None if isinstance(exc, OSError) else store.last_path)
    if isinstance(exc, RecursionError):
        return "input nested too deeply"
    if isinstance(exc, MemoryError):
        return "out of memory"
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _usage(exc: click.exceptions.UsageError) -> str:
    """Click's Usage / Try / Error lines as the one line every other error is."""
    text = " ".join(exc.format_message().split())
    where = exc.ctx.command_path if exc.ctx is not None else "memtrack"
    return f"{text} (see: {where} --help)"


class _Group(click.Group):
    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `memtrack`: the help
                exc.show()
                sys.exit(exc.exit_code)
            click.echo(f"memtrack: error: {_usage(exc)}", err=True)
            sys.exit(2)
        except click.exceptions.ClickException as exc:
            click.echo(f"memtrack: error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(2)
        except click.Abort:
            click.echo("memtrack: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        debug = ctx.params.get("debug") or os.environ.get("MEMTRACK_DEBUG", "") not in ("", "0")
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit):
            raise
        except (KeyboardInterrupt, click.Abort):
            # Not exit 1 ("a verdict blocks"): the shell's status for an interrupt.
            click.echo("memtrack: interrupted", err=True)
            sys.exit(130)
        except MemtrackError as exc:
            if debug:
                traceback.print_exc()
            click.echo(f"memtrack: error: {exc}", err=True)
            sys.exit(2)
        except Exception as exc:
            if debug:
                traceback.print_exc()
            hint = "" if debug else " (--debug shows the traceback)"
            click.echo(f"memtrack: error: {_unexpected(exc)}{hint}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memtrack")
@click.option("--debug", is_flag=True, help="Show the traceback of an error (or MEMTRACK_DEBUG=1).")
def main(debug: bool) -> None:
    """Measure the peak memory of pinned workloads, record it per commit, gate regressions."""


def _register() -> None:
    from memtrack.commands import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_register()


if __name__ == "__main__":
    main()
