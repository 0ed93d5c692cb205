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
        """The password as written in the URL (user part, else a `password=` parameter)."""
        written = _written_password(self.url)
        if written:
            return written
        query = re.search(r"[?&]password=([^&]*)", self.url)
        return query.group(1) if query and query.group(1) else None

    def redact(self, text: str) -> str:
        """`text` with this URL's password written `***`: as written, decoded, and
        percent-encoded (a driver may quote any of them)."""
        secret = self.password
        if not secret:
            return text
        forms = {secret, urllib.parse.unquote(secret), urllib.parse.quote(secret, safe="")}
        for form in sorted(forms, key=len, reverse=True):
            if form:
                text = text.replace(form, "***")
        return text


Database = Path | ServerUrl
"""A database as the commands take it."""


def present(db: Database) -> bool:
    """Whether the database is there as far as can be told without opening it: a file that
    exists; a server's database always (the server says when it is not)."""
    return isinstance(db, ServerUrl) or db.is_file()


def _written_password(url: str) -> str | None:
    """The password of `scheme://user:password@host...` as written, whatever it holds: all
    between the user's ':' and the last '@' (an unencoded '/', '?' or '#' in a password
    would end the address's authority for a URL parser, which then finds none)."""
    head, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return None
    user, colon, secret = rest[:at].partition(":")
    return secret if colon and secret else None


def redact_url(url: str) -> str:
    """A URL with its password (in the user part or a `password=` query parameter) `***`."""
    head, sep, rest = url.partition("://")
    if sep and _written_password(url) is not None:
        at = rest.rfind("@")
        user = rest[:at].partition(":")[0]
        rest = f"{user}:***@{rest[at + 1 :]}"
    return re.sub(r"([?&]password=)[^&]*", r"\1***", f"{head}{sep}{rest}")


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
    secret = _written_password(url)
    if secret and any(c in secret for c in "/?#@"):
        raise ConfigError(
            f"{where}{shown!r}: its password holds '/', '?', '#' or '@': percent-encode it "
            "(or leave it to PGPASSWORD or PGPASSFILE)"
        )
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
