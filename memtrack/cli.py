"""The `memtrack` command. Each command lives in memtrack/commands/<name>.py and stays thin:
parse options, call one library function, format the result.

Exit status 1 means only "a verdict blocks". Every error, the ones memtrack raises on purpose
and any other (a full disk, a corrupted database), is one line and exit status 2; `--debug`
or MEMTRACK_DEBUG=1 adds the traceback."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any

import click

from memtrack.commands import COMMANDS
from memtrack.errors import MemtrackError


def _unexpected(exc: Exception) -> str:
    import sqlite3

    from memtrack.store import database as store

    if "psycopg" in sys.modules and isinstance(exc, sys.modules["psycopg"].Error):
        from memtrack.store import opening, server

        return server.describe(exc, opening.last_server)
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


class Interrupted(KeyboardInterrupt):
    """SIGTERM (what CI sends on cancel), SIGHUP or SIGQUIT (^\\), raised where the program
    is, as ^C raises KeyboardInterrupt: the same clean-up runs (every case's processes ended,
    nothing half written) and the exit status is the shell's for that signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM, SIGHUP and SIGQUIT raise Interrupted, once: a second one while the first is
    being cleaned up is ignored, so that the clean-up finishes. The previous handlers come
    back."""
    raised: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if not raised:
            raised.append(signum)
            raise Interrupted(signum)

    caught = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    try:
        before = {sig: signal.signal(sig, handler) for sig in caught}
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            module = importlib.import_module(f"memtrack.commands.{COMMANDS[name]}")
            self.add_command(getattr(module, name), name)
        return self.commands.get(name)

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `memtrack`: the help
                exc.show()
                sys.exit(exc.exit_code)
            _error(_usage(exc))
            sys.exit(2)
        except click.exceptions.ClickException as exc:
            _error(" ".join(exc.format_message().split()))
            sys.exit(2)
        except click.Abort:
            click.echo("memtrack: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        debug = ctx.params.get("debug") or os.environ.get("MEMTRACK_DEBUG", "") not in ("", "0")
        try:
            with _interruptible():
                return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit):
            raise
        except (KeyboardInterrupt, click.Abort) as exc:
            # Not exit 1 ("a verdict blocks"): the shell's status for an interrupt, 128 + the
            # signal's number (130 for ^C).
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            name = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
            click.echo(f"memtrack: interrupted{name}", err=True)
            sys.exit(128 + signum)
        except MemtrackError as exc:
            if debug:
                _traceback()
            _error(str(exc))
            sys.exit(2)
        except Exception as exc:
            if debug:
                _traceback()
            hint = "" if debug else " (--debug shows the traceback)"
            _error(f"{_unexpected(exc)}{hint}")
            sys.exit(2)


def _traceback() -> None:
    """--debug: the exception's traceback, secrets out as in every error."""
    from memtrack.records.redact import redact

    click.echo(redact(traceback.format_exc()), err=True, nl=False)


def _error(text: str) -> None:
    """An error in one line on stderr. Secrets out first: a message can quote a value of a
    record, a config or a workload's exception (a token, a URL with its password), and CI
    logs are public; then control characters shown, not acted on (`terminal_text`)."""
    from memtrack.escape import terminal_text
    from memtrack.records.redact import redact

    # one line whatever it quotes: a case id or message holding a newline or an escape
    click.echo(f"memtrack: error: {terminal_text(redact(text))}", err=True)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memtrack")
@click.option("--debug", is_flag=True, help="Show the traceback of an error (or MEMTRACK_DEBUG=1).")
def main(debug: bool) -> None:
    """Measure the peak memory of pinned workloads, record it per commit, gate regressions."""


if __name__ == "__main__":
    main()
