"""Units parsed once at the edge: sizes to int bytes, durations to float seconds,
percentages to fractions. Each is bounded: any other input is a one-line ConfigError."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from decimal import ROUND_HALF_EVEN, Decimal

from memtrack.errors import ConfigError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_NUMBER_RE = re.compile(r"^\s*[+-]?[0-9]+(?:\.[0-9]+)?\s*$")
_TIME_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


MAX_SIZE = 2**62
"""The largest size accepted: beyond it a figure is a typo, and SQLite's integers end."""
MAX_DURATION_S = 365 * 86400.0
"""The longest duration accepted (a year)."""


def _show(value: object) -> str:
    """A value as an error quotes it: repr, on one line, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_size(value: str | int, *, what: str = "size") -> int:
    """'12 GiB' -> 12884901888; '512MB' -> 512000000; an int is taken as bytes."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{what}: expected a size such as '2 GiB', got {_show(value)}")
    if isinstance(value, int):
        number = Decimal(value)
    else:
        match = _SIZE_RE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise ConfigError(
                f"{what}: {_show(value)} is not a size "
                "(use a number with B, KB, MB, GB, KiB, MiB or GiB)"
            )
        number = Decimal(match.group(1)) * _SIZE_UNITS[unit]  # exact, however many digits
    if number < 0:
        raise ConfigError(f"{what}: a size cannot be negative, got {_show(value)}")
    if number > MAX_SIZE:
        raise ConfigError(f"{what}: {_show(value)} is more than the largest size, 2**62 bytes")
    return int(number.to_integral_value(ROUND_HALF_EVEN))


def parse_duration(value: str | int | float, *, what: str = "duration") -> float:
    """'90s' -> 90.0; '5 min' -> 300.0; a number is taken as seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a duration such as '90s', got {_show(value)}")
    if isinstance(value, (int, float)):
        seconds = float(max(-1, min(value, 2 * MAX_DURATION_S)))
    else:
        match = _SIZE_RE.match(value) if isinstance(value, str) else None
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _TIME_UNITS:
            raise ConfigError(
                f"{what}: {_show(value)} is not a duration (use e.g. '90s', '500ms', '5 min')"
            )
        seconds = float(match.group(1)) * _TIME_UNITS[unit]
    if not 0 < seconds <= MAX_DURATION_S:  # also refuses nan
        raise ConfigError(
            f"{what}: a duration must be positive and at most a year, got {_show(value)}"
        )
    return seconds


def parse_fraction(value: str | int | float, *, what: str = "fraction") -> float:
    """'2%' -> 0.02; 0.02 -> 0.02: a fraction of a figure, finite and never negative."""
    number = None
    if isinstance(value, str) and value.strip().endswith("%"):
        match = _NUMBER_RE.match(value.strip()[:-1])
        number = float(match.group(0)) / 100 if match else None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value if isinstance(value, float) else float(max(-1, min(value, 2**53)))
    if number is None or not math.isfinite(number):
        raise ConfigError(f"{what}: expected a percentage such as '1%' or 0.01, got {_show(value)}")
    if number < 0:
        raise ConfigError(f"{what}: cannot be negative, got {_show(value)}")
    return number


BINARY_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
"""The units sizes are shown in, largest first."""


def format_size(n: int | None) -> str:
    """Binary units, exact about it: 1536 -> '1.50 KiB'."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, factor in BINARY_UNITS:
        if n >= factor:
            return f"{sign}{n / factor:.2f} {unit}"
    return f"{sign}{n} B"


def format_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.1f} ms"
    return f"{s:.2f} s"


def parse_time(iso: str | None) -> datetime | None:
    """An ISO 8601 time as an aware datetime (UTC when it names no zone); None if not one."""
    if not iso:
        return None
    try:
        t = datetime.fromisoformat(iso.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
