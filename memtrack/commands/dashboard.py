from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import click

from memtrack.commands.options import config_option, db_option, resolve

INSTALL_HINT = "pip install 'memtrack[dashboard]'"


def app_path() -> Path:
    """The dashboard's app.py: the repository's dashboard/, shipped as memtrack.dashboard, found
    through the import system the same way in an editable install and a wheel."""
    spec = importlib.util.find_spec("memtrack.dashboard")
    if spec is None or spec.origin is None:
        return Path("memtrack/dashboard/app.py")  # reported as missing below
    return Path(spec.origin).resolve().parent / "app.py"


def streamlit_problem() -> str | None:
    """Why Streamlit cannot be used here, or None when it can."""
    try:
        importlib.import_module("streamlit")
        importlib.import_module("altair")
    except ImportError as exc:
        return f"the dashboard needs Streamlit and Altair ({exc}); install them: {INSTALL_HINT}"
    return None


def _fail(message: str) -> None:
    click.echo(f"memtrack: error: {message}", err=True)
    sys.exit(2)


@click.command()
@config_option
@db_option
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8501,
    show_default=True,
    help="Port to serve on.",
)
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Address to serve on. Keep 127.0.0.1 behind a reverse proxy with "
    "sign-on; 0.0.0.0 exposes it, without any, to the network.",
)
def dashboard(config_path: Path | None, db_path: Path | None, port: int, address: str) -> None:
    """Serve the Streamlit dashboard over the database, read-only."""
    _, db = resolve(config_path, db_path)
    app = app_path()
    if not app.is_file():
        _fail(
            f"the dashboard app is not part of this installation ({app} is missing); "
            f"reinstall memtrack with it: {INSTALL_HINT}"
        )
    problem = streamlit_problem()
    if problem:
        _fail(problem)
    if isinstance(db, Path):
        args = ["--db", str(db.resolve())]
    else:  # a server's URL by the environment: a command line is for everyone to read
        args = []
        os.environ["MEMTRACK_DATABASE_URL"] = db.url
    if config_path:
        args += ["--config", str(config_path.resolve())]
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.address",
        address,
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--",
        *args,
    ]
    click.echo(
        f"memtrack dashboard on http://{address}:{port} over {db} (read-only); Ctrl+C stops it",
        err=True,
    )
    if os.name == "posix":
        # Become the server: signals (Ctrl+C, a service manager's SIGTERM) reach it directly
        # and no orphan is left behind.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, cmd)
    try:
        sys.exit(subprocess.call(cmd))
    except KeyboardInterrupt:
        sys.exit(0)
