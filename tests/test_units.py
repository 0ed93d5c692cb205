"""The unit parsers, for any input at all: a value in range or a one-line ConfigError."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from memtrack.errors import ConfigError
from memtrack.units import MAX_DURATION_S, MAX_SIZE, parse_duration, parse_fraction, parse_size

# Text near the grammar (digits, dots, signs, units, percent, spaces) finds the edges
# faster than arbitrary text; both are drawn.
_NEAR = st.text(alphabet="0123456789.+-eE% \t\nkKmMgGiIbBsStTnNfFhH", max_size=30)
ANY = st.one_of(
    _NEAR,
    st.text(max_size=30),
    st.integers(),
    st.integers(min_value=-(10**500), max_value=10**500),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.builds(lambda n: "9" * n + " GiB", st.integers(0, 500)),
)


def _one_line_naming(exc: ConfigError, what: str) -> None:
    message = str(exc)
    assert message.startswith(what + ": ") and "\n" not in message and len(message) < 200


@settings(max_examples=400)
@given(ANY)
def test_any_size_is_bytes_in_range_or_a_one_line_error(value):
    try:
        size = parse_size(value, what="budgets[0].limit")
    except ConfigError as exc:
        _one_line_naming(exc, "budgets[0].limit")
        return
    assert type(size) is int and 0 <= size <= MAX_SIZE


@settings(max_examples=400)
@given(ANY)
def test_any_duration_is_seconds_in_range_or_a_one_line_error(value):
    try:
        seconds = parse_duration(value, what="timeout")
    except ConfigError as exc:
        _one_line_naming(exc, "timeout")
        return
    assert type(seconds) is float and 0 < seconds <= MAX_DURATION_S


@settings(max_examples=400)
@given(ANY)
def test_any_percentage_is_a_finite_fraction_or_a_one_line_error(value):
    try:
        fraction = parse_fraction(value, what="creep_tolerance")
    except ConfigError as exc:
        _one_line_naming(exc, "creep_tolerance")
        return
    assert type(fraction) is float and math.isfinite(fraction) and fraction >= 0


@given(st.integers(0, MAX_SIZE))
def test_every_size_in_range_reads_back_exactly(n):
    assert parse_size(n) == n
    assert parse_size(f"{n} B") == n and parse_size(f" {n}") == n


def test_the_edges_of_each_range():
    assert parse_size(MAX_SIZE) == MAX_SIZE and parse_size("4194304 TiB") == MAX_SIZE
    assert parse_duration(365 * 86400) == MAX_DURATION_S
    assert parse_fraction("+2%") == 0.02 and parse_fraction(0) == 0.0
    for bad in (MAX_SIZE + 1, "4194305 TiB", "1" * 401, -1):
        try:
            parse_size(bad)
        except ConfigError:
            continue
        raise AssertionError(f"{bad!r} was accepted as a size")
