"""The `memtrack` command. Each command lives in memtrack/commands/<name>.py and stays thin:
parse options, call one library function, format the result. Errors that memtrack raises
on purpose become a one-line message and exit status 2."""

from __future__ import annotations

import sys
from typing import Any

import click

from memtrack.errors import MemtrackError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MemtrackError as exc:
            click.echo(f"memtrack: error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memtrack")
def main() -> None:
    """Measure the peak memory of pinned workloads, record it per commit, gate regressions."""


def _register() -> None:
    from memtrack.commands import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_register()


if __name__ == "__main__":
    main()
