"""Secrets out of recorded text: well-known token shapes are replaced before anything is
stored or reported (a workload's error message can quote a URL, a header or a variable).
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memtrack.records.model import RunRecord

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


def redact_run(run: RunRecord) -> RunRecord:
    """A run record (from another machine, or crafted) with its workloads' text redacted as
    `memtrack run` redacts it: messages, tracebacks, notes. Redacting twice changes nothing."""
    return dataclasses.replace(run, measurements=tuple(
        dataclasses.replace(
            m, message=redact(m.message), traceback=redact(m.traceback),
            device_view_note=redact(m.device_view_note),
            notes=tuple(redact(n) or "" for n in m.notes))
        for m in run.measurements))
