"""Files someone named. Read (a config, a GPU catalog, a run record): a regular file of
bounded size, opened without blocking, so that `--config /dev/zero`, a FIFO or a terminal
is refused at once instead of reading forever or waiting for a writer. Written (a report,
a record): checked before any work, in a folder that exists (none is made: a typo must
not plant folders, as root, anywhere), never a device or a file that refuses writes."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from memtrack.units import format_size


class NotReadable(Exception):
    """The file cannot be read as asked; the message says why, in a few words."""


def read_bytes(path: Path, limit: int) -> bytes:
    """The contents of the regular file at `path`, at most `limit` bytes. Raises
    FileNotFoundError, NotReadable (not a regular file, larger than `limit`) or OSError."""
    # O_NONBLOCK: opening a FIFO with no writer returns at once (then refused by its
    # type) instead of waiting; on a regular file it changes nothing.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise NotReadable("a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise NotReadable("not a regular file (a device, FIFO or socket)")
        if info.st_size > limit:
            raise NotReadable(f"larger than {format_size(limit)}")
        chunks, size = [], 0
        while True:  # a file growing as it is read is still cut at the limit
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise NotReadable(f"larger than {format_size(limit)}")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_named(path: Path, limit: int, error: Callable[[str], Exception]) -> bytes:
    """As `read_bytes`, every failure one `error` that names the file and says why."""
    try:
        return read_bytes(path, limit)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except NotReadable as exc:
        raise error(f"{path}: {exc}") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None


def read_text(path: Path, limit: int) -> str:
    """As `read_bytes`, decoded as UTF-8 (raises UnicodeDecodeError)."""
    return read_bytes(path, limit).decode("utf-8")


def output_problem(path: Path) -> str | None:
    """Why a file cannot be written at `path` (made anew, or replaced whole through a
    temporary file beside it), in a few words; None when it can."""
    folder = path.parent
    if not folder.is_dir():
        return f"no such folder {folder}" if not folder.exists() else f"{folder} is not a folder"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        return f"cannot be written ({exc.strerror})"
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            return "is a directory"
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file (a device, FIFO or socket)"
        try:  # append mode changes nothing; a file of /proc or /sys refuses it
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        except OSError as exc:
            return f"cannot be written ({exc.strerror})"
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        return f"its folder cannot be written ({exc.strerror})"
    return None
