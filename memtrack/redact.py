"""Secrets out of recorded text: well-known token shapes are replaced before anything is
stored or reported (a workload's error message can quote a URL, a header or a variable).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memtrack.records import Measurement, RunRecord

MASK = "[redacted]"

# Each pattern's group 1, where it has one, is kept: the name that says what was redacted.
_PATTERNS = [
    re.compile(p, re.IGNORECASE if i else 0)
    for i, p in enumerate(
        [
            # Case-sensitive shapes first: GitHub, Hugging Face, AWS key ids, OpenAI-style.
            r"\b(?:gh[opusr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}"
            r"|(?:AKIA|ASIA)[A-Z0-9]{16}|sk-[A-Za-z0-9_\-]{20,})",
            # Authorization headers and bearer tokens.
            r"(authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|token|basic)?\s*)[^\s\"',;]+",
            r"(\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}",
            # Assignments of secrets: aws_secret_access_key=..., password: ..., api_key=...
            r"((?:\b|_)(?:secret_access_key|secret|password|passwd|token|api_?key|access_?key)"
            r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&]{6,}",
            # Credentials in a URL: scheme://user:password@host
            r"(://[^/\s:@]+:)[^@\s/]+(?=@)",
        ]
    )
]


def redact(text: str | None) -> str | None:
    """`text` with every recognised secret replaced by [redacted]; None stays None."""
    if not text:
        return text
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.re.groups else "") + MASK, text)
    return text


_redact_often = functools.lru_cache(maxsize=512)(redact)
"""redact, remembering recent texts: the records of a batch repeat their notes."""


def _redact_measurement(m: Measurement) -> Measurement:
    changes: dict[str, Any] = {}
    for name in ("message", "traceback", "device_view_note", "quality_message"):
        text = getattr(m, name)
        if text and (clean := _redact_often(text)) != text:
            changes[name] = clean
    notes = tuple(_redact_often(n) or "" for n in m.notes)
    if notes != m.notes:
        changes["notes"] = notes
    ranks = tuple(r if not r.message or (clean := _redact_often(r.message)) == r.message
                  else dataclasses.replace(r, message=clean) for r in m.ranks)
    if ranks != m.ranks:
        changes["ranks"] = ranks
    # most records hold no secret: they are kept as they are, not copied
    return dataclasses.replace(m, **changes) if changes else m


def redact_run(run: RunRecord) -> RunRecord:
    """A run record (from another machine, or crafted) with its workloads' text redacted as
    `memtrack run` redacts it: messages (a rank's too), tracebacks, notes, the quality
    message. Redacting twice changes nothing."""
    measurements = tuple(_redact_measurement(m) for m in run.measurements)
    if all(map(operator.is_, measurements, run.measurements)):
        return run
    return dataclasses.replace(run, measurements=measurements)
