"""The machine to one test: a test marked `quiet` runs while no other test of the session
does (on any xdist worker), for what it measures of time on a machine with no other load
than its own. Every other test holds a shared lock while it runs; a quiet one takes it
exclusively. A turnstile keeps the quiet test from waiting for ever behind a stream of
shared holders: each test passes through it before taking the shared lock, and the quiet
test holds it while it waits.

The lock is held per process: a quiet module fixture and the tests inside it take it once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

_held: list[str] = []  # this process's hold: "ex" or "sh", nested


def session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session's lock lives: the xdist workers' common temp folder, else this
    session's own (another pytest session of the user is another machine share)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def share(folder: Path, exclusive: bool) -> Iterator[None]:
    """Hold the session's machine lock in `folder` (the xdist workers' common temp folder):
    exclusively for a quiet test, shared for any other."""
    if _held and (_held[0] == "ex" or not exclusive):
        _held.append(_held[0])
        try:
            yield
        finally:
            _held.pop()
        return
    assert not _held, "a quiet test inside a shared hold would wait for itself"
    with (
        open(folder / "memtrack-machine.turn", "a") as turn,
        open(folder / "memtrack-machine.lock", "a") as lock,
    ):
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turn, fcntl.LOCK_UN)
        _held.append("ex" if exclusive else "sh")
        try:
            yield
        finally:
            _held.pop()
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turn, fcntl.LOCK_UN)
