"""Turns of a paired timing in live processes: two workers, one per side (the reference and
the candidate), each set up once, take turns at the machine. Each turn (a side's setup with
its warm-up, then each of its timing passes) waits for a token on its side's pipe and hands
it on when done, so that one side runs at a time, in the pair's schedule: setups first, then
rounds of passes A B, B A, ... (measure.pairs writes the schedule and the first token).

The pipes are two FIFOs in one folder, `side-0` and `side-1`, each opened read-write by both
workers and by the runner: opening never blocks and a token written before its reader looks
is kept. A side that dies leaves the other waiting: the launcher ends the pair when either
worker fails (measure.launcher)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

TOKEN = b"t"


def pipe(folder: Path, side: int) -> Path:
    return folder / f"side-{side}"


def make(folder: Path) -> list[int]:
    """The pair's two pipes in `folder`, opened read-write (the runner keeps them open for
    the pair's life, so that a token is never lost)."""
    fds = []
    for side in (0, 1):
        os.mkfifo(pipe(folder, side), 0o600)
        fds.append(os.open(pipe(folder, side), os.O_RDWR))
    return fds


def schedule(rounds: int) -> tuple[int, ...]:
    """The sides' turns: each side's setup (0 then 1), then `rounds` rounds of one pass each,
    the reference first in the even rounds (A B, B A, ...)."""
    passes = [side for i in range(rounds) for side in ((0, 1) if i % 2 == 0 else (1, 0))]
    return (0, 1, *passes)


class Turns:
    """One worker's turns in the schedule."""

    def __init__(self, folder: Path, side: int, order: tuple[int, ...]):
        self.side, self.order = side, order
        self.fds = [os.open(pipe(folder, s), os.O_RDWR) for s in (0, 1)]
        self.mine = iter(i for i, s in enumerate(order) if s == side)

    @property
    def passes(self) -> int:
        """This side's timing passes: its turns less its setup."""
        return self.order.count(self.side) - 1

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Wait for this side's next turn, run the block, hand the token to the next turn's
        side (after the last turn: nobody)."""
        i = next(self.mine)
        if os.read(self.fds[self.side], 1) != TOKEN:
            raise RuntimeError("the paired timing's turn pipe closed")
        yield
        if i + 1 < len(self.order):
            os.write(self.fds[self.order[i + 1]], TOKEN)


__all__ = ["Turns", "make", "pipe", "schedule"]
