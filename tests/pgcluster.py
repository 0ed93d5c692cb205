"""A throwaway PostgreSQL cluster for the tests: initdb into a temporary folder, a server
listening on a unix socket in it only (no TCP port), password authentication (scram) for
the one role, and a fresh database per test. Debian's PostgreSQL is used where installed,
else the one the `pgserver` wheel (the test extra) carries. As root, the server runs as the
`postgres` user (else `nobody`), since PostgreSQL refuses to run as root."""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import urllib.parse
import uuid
from pathlib import Path

USER = "memtrack"
PASSWORD = "c0rrect:h@rse/battery"
"""The role's password: with characters a URL must percent-encode, so both of its forms are
looked for wherever a test checks that it is never shown or stored."""


def binaries() -> Path | None:
    """The folder of initdb and postgres: Debian's newest, else pgserver's, else PATH's."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(re.sub(r"\D", "", p.parent.parent.name) or 0),
    )
    if debian:
        return debian[-1].parent
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin:
        folder = Path(spec.origin).parent / "pginstall" / "bin"
        if (folder / "initdb").is_file():
            return folder
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def unavailable() -> str | None:
    """Why no cluster can be started here, in one line; None when one can."""
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed (pip install -e '.[test]')"
    if binaries() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql, or pip install pgserver)"
    if os.geteuid() == 0 and _server_user() is None:
        return "running as root without a 'postgres' or 'nobody' user to run the server as"
    return None


def _server_user() -> str | None:
    """Whom the server runs as where this runs as root: Debian's `postgres`, else `nobody`."""
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    return None


class Cluster:
    """One server for a test session; `database()` makes a new empty database on it."""

    def __init__(self, *, fsync: bool = False) -> None:
        """`fsync`: the server syncs its writes to disk, as a production server does (the
        tests' server does not: a throwaway cluster)."""
        self.bin = binaries()
        assert self.bin is not None
        self.root = Path(tempfile.mkdtemp(prefix="memtrack-pg-"))
        self.data = self.root / "data"
        self.user = _server_user() if os.geteuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.user:
            os.chown(pwfile, pwd.getpwnam(self.user).pw_uid, -1)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--no-locale",
            "-E",
            "UTF8",
            "--no-sync",
        )
        pwfile.unlink()
        self.options = options = (
            f"-k {self.root} -c listen_addresses='' -c fsync={'on' if fsync else 'off'} "
            "-c max_connections=100"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-o",
            options,
            "-w",
            "start",
        )

    def _run(self, tool: str, *args: str) -> None:
        assert self.bin is not None
        done = subprocess.run(
            [str(self.bin / tool), *args],
            user=self.user,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr or done.stdout}")

    def url(self, database: str = "postgres", password: str | None = PASSWORD) -> str:
        secret = f":{urllib.parse.quote(password, safe='')}" if password is not None else ""
        return f"postgresql://{USER}{secret}@/{database}?host={self.root}"

    def database(self) -> str:
        """A new, empty database; its URL (with the password)."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'create database "{name}"')
        return self.url(name)

    def restart(self) -> None:
        """`pg_ctl restart -m fast`, as an administrator restarts a server: every session
        ended, the server back with the options it had."""
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-m", "fast", "-w", "restart")

    def halt(self) -> None:
        """Stopped (fast), its data kept for `resume`."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", self.options, "-w", "start")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (RuntimeError, OSError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)
