"""How CI installs memtrack: a requirement a runner can reach, pinned, never the repository
under test. `installed_pin` reads it from how the memtrack running here was installed (PEP
610's direct_url.json, through importlib.metadata); `check_requirement` refuses anything
else. Nothing here reaches the network."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from urllib.parse import urlsplit, urlunsplit

from memtrack.errors import ConfigError

FORMS = (
    "memtrack==VERSION, memtrack @ git+https://HOST/OWNER/REPO@COMMIT (the full 40-digit "
    "commit), memtrack @ https://HOST/PATH/memtrack-VERSION-py3-none-any.whl, or the "
    "absolute path of such a file on the runner"
)
"""The requirements a workflow may install memtrack from, as an error lists them."""

PYPI = ("https://pypi.org/simple", "https://pypi.python.org/simple")

_HOST_PATH = r"[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%+-]+)+"
_VCS = re.compile(
    rf"git\+(?:https://|ssh://git@){_HOST_PATH}@[0-9a-f]{{40}}"
    r"(?:#subdirectory=[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*)?"
)
_ARCHIVE_URL = re.compile(rf"(?:https://{_HOST_PATH}|file://(?:/[A-Za-z0-9._~%+-]+)+)")
_HASH = re.compile(r"#sha256=[0-9a-f]{64}")
_PATH = re.compile(r"(?:/[A-Za-z0-9._~%+-]+)+")
_ARCHIVE = (".whl", ".tar.gz", ".zip")
_PINNED_VERSION = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(?P<version>[0-9][0-9A-Za-z.+!_-]*)"
)
_DIRECT = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*@\s*(?P<url>\S+)")


@dataclass(frozen=True)
class Pin:
    """How the workflow installs memtrack."""

    requirement: str
    """One of `FORMS`: a version, a git commit, an archive by URL or a file on the runner."""
    index_url: str = ""
    """The package index that serves a `memtrack==VERSION` ('': the runner's own)."""


def _is_memtrack(name: str) -> bool:
    return re.sub(r"[-_.]+", "-", name).lower() == "memtrack"


def _archive(url: str) -> bool:
    """An https or file URL (or a path) of a wheel or an sdist named memtrack, its sha256
    fragment aside."""
    path = _HASH.sub("", url, count=1) if _HASH.search(url) else url
    if not (_ARCHIVE_URL.fullmatch(path) or _PATH.fullmatch(path)):
        return False
    filename = path.rsplit("/", 1)[-1]
    return filename.endswith(_ARCHIVE) and _is_memtrack(filename.split("-", 1)[0])


def _valid(text: str) -> bool:
    if any(c.isspace() and c != " " for c in text) or "${{" in text:
        return False
    if _PATH.fullmatch(text):  # a file on the runner: pip takes its path as it is
        return _archive(text)
    m = _PINNED_VERSION.fullmatch(text)
    if m is not None:
        ok = _is_memtrack(m["name"]) and "*" not in m["version"]
    else:
        m = _DIRECT.fullmatch(text)
        ok = (
            m is not None
            and _is_memtrack(m["name"])
            and (_VCS.fullmatch(m["url"]) is not None or _archive(m["url"]))
        )
    return ok and _parses(text)


def _parses(text: str) -> bool:
    """PEP 508 and PEP 440, as pip reads them, where `packaging` is installed."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # pragma: no cover - pip vendors it; most environments have it
        return True
    try:
        return Requirement(text).marker is None
    except InvalidRequirement:
        return False


def by_version(requirement: str) -> bool:
    """Whether `requirement` pins a version, which a package index serves (the other forms
    name where memtrack comes from by themselves)."""
    return _PINNED_VERSION.fullmatch(requirement.strip()) is not None


def check_requirement(requirement: str, what: str = "--requirement") -> str:
    """A requirement that pins one memtrack a runner can install (one of `FORMS`), checked
    offline, or ConfigError naming it."""
    text = requirement.strip()
    if not _valid(text):
        raise ConfigError(
            f"{what}: {requirement!r} does not pin memtrack to something a runner can "
            f"install (write {FORMS})"
        )
    return text


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))


def check_index_url(url: str, what: str = "--index-url") -> str:
    """A package index the workflow may name: https, no credentials (the runner
    authenticates through its own pip configuration), no query; '' for the runner's own."""
    text = url.strip().rstrip("/")
    if not text:
        return ""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        parts = None
    if parts is None or parts.scheme != "https" or not parts.hostname:
        raise ConfigError(f"{what}: {url!r} is not an https URL of a package index")
    if parts.username or parts.password:
        raise ConfigError(
            f"{what}: the index {_without_credentials(text)} is written with credentials, "
            "which a workflow file must not hold: name it without them (the runner "
            "authenticates through its own pip configuration)"
        )
    if parts.query or parts.fragment or not re.fullmatch(r"[A-Za-z0-9._~%+/:@-]+", text):
        raise ConfigError(f"{what}: {url!r} is not an https URL of a package index")
    return "" if text in PYPI else text


def configured_index() -> str:
    """The index pip installs from here (PIP_INDEX_URL, else pip's configuration), as
    `check_index_url` takes it; '' for PyPI's."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        try:
            out = subprocess.run(
                [sys.executable, "-m", "pip", "config", "list"],
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        found = dict(re.findall(r"^(global|install)\.index-url='(.*)'$", out, re.M))
        url = found.get("install") or found.get("global") or ""
    return check_index_url(url, "the index pip is configured with here") if url else ""


def _unreachable(what: str, url: str) -> ConfigError:
    return ConfigError(
        f"memtrack here was installed from {what} ({url}), which a CI runner cannot "
        f"install from: name what the workflow installs with --requirement ({FORMS})"
    )


def installed_pin(dist: metadata.Distribution | None = None) -> Pin:
    """How CI installs the memtrack that runs here (`dist`, by default the installed one):
    its git URL at its commit where it was installed from git, its archive's https URL
    (with its sha256) where from one, its version and the index pip is configured with
    where by name. ConfigError where a runner cannot reach it: a local path, a wheel file,
    an editable install, a source tree."""
    if dist is None:
        try:
            dist = metadata.distribution("memtrack")
        except metadata.PackageNotFoundError:
            raise ConfigError(
                "memtrack runs here from a source tree, not installed, which a CI runner "
                f"cannot install from: name what the workflow installs with --requirement "
                f"({FORMS})"
            ) from None
    text = dist.read_text("direct_url.json")
    if text is None:  # installed by name, from an index (or a folder of wheels)
        pin = Pin(f"memtrack=={dist.version}", configured_index())
        return Pin(check_requirement(pin.requirement, "memtrack's version"), pin.index_url)
    try:
        direct = json.loads(text)
        url = str(direct["url"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            "memtrack's direct_url.json (how it was installed) is not valid JSON with a url: "
            f"name what the workflow installs with --requirement ({FORMS})"
        ) from None
    parts = urlsplit(url)
    if parts.scheme in ("https", "http") and (parts.username or parts.password):
        raise ConfigError(
            f"memtrack here was installed from {_without_credentials(url)} with "
            "credentials, which a workflow file must not hold: name what it installs with "
            f"--requirement ({FORMS})"
        )
    if isinstance(direct.get("vcs_info"), dict):
        vcs = direct["vcs_info"]
        if vcs.get("vcs") != "git" or not url.startswith(("https://", "ssh://git@")):
            raise _unreachable(f"a {vcs.get('vcs')} repository", url)
        sub = direct.get("subdirectory")
        requirement = f"memtrack @ git+{url}@{vcs.get('commit_id')}" + (
            f"#subdirectory={sub}" if isinstance(sub, str) and sub else ""
        )
        return Pin(check_requirement(requirement, "how memtrack here was installed"))
    if isinstance(direct.get("dir_info"), dict):
        editable = direct["dir_info"].get("editable") is True
        raise _unreachable("an editable source tree" if editable else "a folder", url)
    if isinstance(direct.get("archive_info"), dict):
        if not url.startswith("https://"):
            wheel = urlsplit(url).path.endswith(".whl")
            raise _unreachable("a wheel file" if wheel else "an archive", url)
        info = direct["archive_info"]
        hashes = info.get("hashes") if isinstance(info.get("hashes"), dict) else {}
        sha = str(hashes.get("sha256") or info.get("hash") or "").removeprefix("sha256=")
        requirement = f"memtrack @ {url}" + (f"#sha256={sha}" if sha else "")
        return Pin(check_requirement(requirement, "how memtrack here was installed"))
    raise _unreachable("an unknown kind of source", url)


__all__ = [
    "FORMS",
    "PYPI",
    "Pin",
    "by_version",
    "check_index_url",
    "check_requirement",
    "configured_index",
    "installed_pin",
]
