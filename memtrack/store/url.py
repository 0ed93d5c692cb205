"""Where the history lives: a database named by a path (the embedded SQLite file) or by a
server URL (PostgreSQL), as `--db`, `$MEMTRACK_DB`, `$MEMTRACK_DATABASE_URL` or the config's
`database` give it.

A server URL's password is never shown: `str()` of a `ServerUrl` writes it as `***`, and
`redact` takes it out of any text (a driver's error message) before that text is shown.
The URL is handed to libpq as it is, so its TLS options (`sslmode`, `sslrootcert`, ...) pass
through, and a password it lacks comes from where libpq looks for one (`PGPASSWORD`,
`PGPASSFILE`, a service file): memtrack reads none of them.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from memtrack.errors import ConfigError

SERVER_SCHEMES = {"postgresql": "postgresql", "postgres": "postgresql"}
"""URL schemes of a database server -> the engine (SQLAlchemy's `+driver` suffix, as in
`postgresql+psycopg://`, is accepted and dropped)."""
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


@dataclass(frozen=True)
class ServerUrl:
    """A PostgreSQL database by its URL. `url` holds the password where one was given: it is
    passed to the driver only; everything shown is `str(self)`, the password as `***`."""

    url: str = field(repr=False)

    def __str__(self) -> str:
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"ServerUrl({str(self)!r})"

    @property
    def password(self) -> str | None:
        parts = urllib.parse.urlsplit(self.url)
        query = urllib.parse.parse_qs(parts.query)
        if "password" in query:
            return query["password"][-1]
        return urllib.parse.unquote(parts.password) if parts.password else None

    def redact(self, text: str) -> str:
        """`text` with this URL's password (as given, and percent-encoded) written `***`."""
        secret = self.password
        if not secret:
            return text
        for form in {secret, urllib.parse.quote(secret, safe="")}:
            text = text.replace(form, "***")
        return text


Database = Path | ServerUrl
"""A database as the commands take it."""


def present(db: Database) -> bool:
    """Whether the database is there as far as can be told without opening it: a file that
    exists; a server's database always (the server says when it is not)."""
    return isinstance(db, ServerUrl) or db.is_file()


def redact_url(url: str) -> str:
    """A URL with its password (in the user part or a `password=` query parameter) `***`."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        name = user.partition(":")[0]
        netloc = f"{name}:***@{host}"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def parse_database(text: str, where: str) -> Database:
    """A database as `text` names it: a server URL (postgresql://...), an SQLite URL
    (sqlite:///relative.db, sqlite:////absolute.db) or a path. ConfigError naming `where`
    (the option, variable or key) and the value, its password hidden, for anything else."""
    where = f"{where}: " if where else ""
    match = _SCHEME.match(text)
    if not match:
        if not text.strip() or "\0" in text:
            raise ConfigError(f"{where}expected a file path or a database URL, got {text!r}")
        return Path(text)
    scheme = match.group(1).lower()
    engine = scheme.partition("+")[0]
    if engine == "sqlite":
        rest = text[match.end() :]
        if not rest.startswith("/") or not rest[1:].strip():
            raise ConfigError(
                f"{where}{text!r} names no file (sqlite:///relative.db or "
                "sqlite:////absolute/path.db)"
            )
        return Path(rest[1:])
    if engine not in SERVER_SCHEMES:
        raise ConfigError(
            f"{where}{redact_url(text)!r} is of an unknown database scheme {scheme!r} "
            "(a file path, sqlite:///PATH or postgresql://...)"
        )
    url = "postgresql" + text[match.end(1) :]
    shown = redact_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError on a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"{where}{shown!r} is not a valid URL ({exc})") from None
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ConfigError(f"{where}{shown!r} holds a space or a control character")
    if not parts.path.strip("/"):
        raise ConfigError(
            f"{where}{shown!r} names no database (postgresql://USER@HOST:PORT/DATABASE)"
        )
    return ServerUrl(url)


__all__ = ["SERVER_SCHEMES", "Database", "ServerUrl", "parse_database", "present", "redact_url"]
