"""Secrets out of recorded text: replaced before anything is stored or reported (a
workload's error message can quote a URL, a header, a key file or a variable).

Two nets. The values of this process's own secret-looking variables (a name with TOKEN,
SECRET, KEY, PASSWORD, CREDENTIAL, ...): whatever their shape, a workload that prints one
leaks exactly that text (a lowercase word too, where the name is surely a secret's:
`DB_PASSWORD=correcthorsebatterystaple`). And well-known token shapes (GitHub, Hugging
Face, AWS, OpenAI, Slack, Google, GitLab, Stripe, npm, PyPI, JWTs, PEM private keys, Azure
connection strings, authorization headers, credentials in a URL), for secrets of other
machines.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memtrack.records.model import RunRecord

MASK = "[redacted]"

SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|KEY|AUTH(?!OR)|COOKIE|SESSION"
    r"|SIGNATURE|CERT|_PWD|_PASS\b|^PASS|DSN|WEBHOOK",
    re.IGNORECASE,
)
"""A variable whose value is a secret by its name."""
SURELY_SECRET_NAME = re.compile(
    r"(?:^|_)[A-Z0-9]*(?:PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN)(?:_|$)", re.IGNORECASE
)
"""A name that is a secret's whatever its value looks like (`DB_PASSWORD`, `HF_TOKEN`,
`CLIENT_SECRET`): a word of the name ends in one of these. `TOKENIZERS_PARALLELISM` is
not one; a `..._KEY` or `..._SESSION` may hold an ordinary word ('production')."""
MIN_SECRET_LENGTH = 4
"""Shorter values ('1', 'on') are too common in text to stand for a secret; a value of a
secret-named variable from four characters on is one (`API_KEY=k3y99z`)."""

# Each pattern's group 1, where it has one, is kept: the name that says what was redacted.
_PATTERNS = [
    re.compile(p, re.IGNORECASE if i > 1 else 0)
    for i, p in enumerate(
        [
            # A PEM private key block (or what is left of one after a cut), newlines real or
            # escaped as \n in a repr.
            r"(-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----)[\s\S]*?"
            r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\Z)",
            # Case-sensitive shapes: GitHub, Hugging Face, AWS key ids, OpenAI and Anthropic,
            # Slack, Google API keys, GitLab, Stripe, npm, PyPI, JWTs.
            r"\b(?:gh[opusr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}"
            r"|(?:AKIA|ASIA)[A-Z0-9]{16}|sk-[A-Za-z0-9_\-]{20,}"
            r"|xox[abposr]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"
            r"|AIza[0-9A-Za-z_\-]{35}"
            r"|gl(?:pat|dt|rt|ptt|cbt|soat|ft|imt|oas)-[0-9A-Za-z_\-]{20,}"
            r"|(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}|npm_[A-Za-z0-9]{36}"
            r"|pypi-AgE[A-Za-z0-9_\-]{50,}"
            r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*)",
            # Slack webhooks carry their secret in the path.
            r"(hooks\.slack\.com/services/)[A-Za-z0-9/]+",
            # Authorization headers and bearer tokens.
            r"(authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|token|basic)?\s*)[^\s\"',;]+",
            r"(\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}",
            # Azure connection strings and SAS tokens: AccountKey=...; SharedAccessKey=...
            r"((?:AccountKey|SharedAccessKey|SharedAccessSignature|sig)=)[^;&\s\"']{8,}",
            # Assignments of secrets: aws_secret_access_key=..., password: ..., api_key=...
            r"((?:\b|_)(?:secret_access_key|secret|password|passwd|token|api_?key|access_?key)"
            r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&]{6,}",
            # Credentials in a URL: scheme://user:password@host
            r"(://[^/\s:@]+:)[^@\s/]+(?=@)",
        ]
    )
]


def _looks_secret(value: str) -> bool:
    """A value worth hunting for in text: long enough, one word, not a plain number, flag
    or lowercase word (a variable named *_KEY may hold 'production')."""
    return (
        len(value) >= MIN_SECRET_LENGTH
        and not any(c.isspace() for c in value)
        and not value.isdigit()
        and not (value.isalpha() and value.islower())
    )


def secret_values(environ: Any = None) -> tuple[str, ...]:
    """The values of the secret-looking variables of `environ` (default: this process's
    environment, which the workers inherit), in every form text quotes them (as they are,
    URL-encoded, base64-encoded), longest first."""
    env = os.environ if environ is None else environ
    found = {
        v
        for k, v in env.items()
        if SECRET_NAME.search(k)
        and (_looks_secret(v) or (SURELY_SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LENGTH))
    }
    forms = {form for v in found for form in _forms(v)}
    return tuple(sorted(forms, key=lambda v: (-len(v), v)))


def _forms(value: str) -> set[str]:
    """A secret as text may quote it: itself; URL-encoded (a query string, a form); and
    base64-encoded, alone or inside a longer encoded text (`user:token` in a Basic
    authorization header): the characters of its encoding at each of the three offsets it
    can start at that depend on it alone."""
    import base64
    import urllib.parse

    forms = {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)}
    raw = value.encode()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode().rstrip("=")
        # the characters that hold a padding byte, and the last one of a short group,
        # depend on bytes outside the value
        start = -(-offset * 4 // 3)
        end = (offset + len(raw)) * 4 // 3
        for alphabet in (encoded, encoded.replace("+", "-").replace("/", "_")):
            core = alphabet[start:end]
            if len(core) >= MIN_SECRET_LENGTH + 2:
                forms.add(core)
    return {f for f in forms if len(f) >= MIN_SECRET_LENGTH}


@functools.lru_cache(maxsize=8)
def _values_pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(map(re.escape, values))) if values else None


_ANY = re.compile(
    "|".join(f"(?{'i' if p.flags & re.IGNORECASE else ''}:{p.pattern})" for p in _PATTERNS)
)
"""One search for them all: most text holds no secret, and is then left after one pass."""


def redact(text: str | None, *, values: tuple[str, ...] | None = None) -> str | None:
    """`text` with every secret replaced by [redacted]: the values of this process's secret
    variables (or `values`), and every recognised token shape; a NUL character (which no
    history may hold: PostgreSQL cannot store one) as U+FFFD. None stays None."""
    if not text:
        return text
    if "\0" in text:
        text = text.replace("\0", "\ufffd")
    own = _values_pattern(secret_values() if values is None else values)
    if own is not None:
        text = own.sub(MASK, text)
    if not _ANY.search(text):
        return text
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) or "" if m.re.groups else "") + MASK, text)
    return text


_TEXT = {
    "RunRecord": ("config_path",),
    "GitInfo": ("subject", "notes"),
    "CIInfo": ("run_url", "runner_name"),
    "Environment": ("env_vars", "notes", "cuda_unavailable_reason"),
    "Measurement": ("message", "traceback", "device_view_note", "notes", "quality_message"),
    "RankMeasurement": ("message",),
}
"""The free text of a record, where a secret can be quoted: what workloads printed or
raised, the commit's subject and notes, the variables' values, the CI fields. Identities
(case ids, commits, branches) and versions are validated where they are read."""


def _text(value: Any, values: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return redact(value, values=values)
    if isinstance(value, tuple):
        return tuple(redact(x, values=values) if isinstance(x, str) else x for x in value)
    if isinstance(value, dict):  # env_vars: a variable named as a secret is masked whole
        return {
            k: (MASK if v and SECRET_NAME.search(k) else redact(v, values=values))
            if isinstance(v, str)
            else v
            for k, v in value.items()
        }
    return value


def _redacted(obj: Any, values: tuple[str, ...]) -> Any:
    changes = {}
    for name in _TEXT[type(obj).__name__]:
        value = getattr(obj, name)
        if value:
            new = _text(value, values)
            if new != value:
                changes[name] = new
    return dataclasses.replace(obj, **changes) if changes else obj


def redact_run(run: RunRecord, *, values: tuple[str, ...] | None = None) -> RunRecord:
    """A run record with its free text redacted: its workloads' messages, tracebacks and
    notes, the commit subject and notes, the CI fields, the environment's notes and its
    allowlisted variables' values. As `memtrack run` stores a run, so `memtrack ingest`
    stores one from another machine or crafted. Redacting twice changes nothing. `values`:
    the secret values to find (default: this process's, see `secret_values`)."""
    values = secret_values() if values is None else values
    measurements = tuple(
        _redacted(
            dataclasses.replace(m, ranks=tuple(_redacted(r, values) for r in m.ranks))
            if m.ranks
            else m,
            values,
        )
        for m in run.measurements
    )
    return _redacted(
        dataclasses.replace(
            run,
            git=_redacted(run.git, values),
            ci=_redacted(run.ci, values),
            environment=_redacted(run.environment, values),
            measurements=measurements,
        ),
        values,
    )


__all__ = ["MASK", "SECRET_NAME", "redact", "redact_run", "secret_values"]
