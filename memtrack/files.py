"""Reading a file someone named (a config, a GPU catalog, a run record): a regular file of
bounded size, opened without blocking, so that `--config /dev/zero`, a FIFO or a terminal
is refused at once instead of reading forever or waiting for a writer."""

from __future__ import annotations

import os
import stat
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


def read_text(path: Path, limit: int) -> str:
    """As `read_bytes`, decoded as UTF-8 (raises UnicodeDecodeError)."""
    return read_bytes(path, limit).decode("utf-8")
