"""Turns of a paired timing in live processes: two workers, one per side (the reference and
the candidate), each set up once, take turns at the machine. Each turn (a side's setup with
its warm-up, then each of its timing passes) waits for a token on its side's pipe and hands
it on when done, so that one side runs at a time, in the pair's schedule: setups first, then
rounds of passes A B, A B, ... (measure.pairs writes the schedule and the first token). The
setups too run one at a time: two processes' OpenMP threads spinning on the same cores slow
each other many times over (a decoder's warm-up took 1.5 s beside the other side's, 0.1 s
alone). With OpenMP's idle threads asleep, setups side by side (a patched schedule, not
kept) saved about 0.1 s a case of the shipped suite, and a 2x slower matmul's first rounds
then read 1.9-4.3x, against 1.9-2.2x in turn (6 pairs each). Every pass follows the other
side's: with OpenMP's idle threads asleep, a pass that followed its own side's ran 1.6-1.8x
slower than one that followed the other's (a decoder's generation), so rounds of A B, B A
gave ratios of 0.57 and 1.7 by turns, where A B, A B gives 0.84-1.08.

The token carries what the rounds decide by. The pass that opens a round hands on its
figures (its median iteration by each figure it holds for every iteration, in seconds, as
measure.pairs.pass_medians reads them from the record); the pass that ends it compares them
with its own on the figure the time verdict reads (the first of PAIR_FIGURES
both hold: judge.timing) and counts the rounds in which the candidate was not slower. Once
`stop_after` rounds were not slower, the candidate can no longer be found slower
(judge.timing.futile_after): the pair ends there, and the other side is told so (`STOP`). A
round with a figure of 0 on either side is never counted (the verdict leaves it out, or
judges no pair at all).

The candidate's pass always runs second in its round: a load that grows steadily over the
rounds weighs on it a little more, where A B, B A would cancel it; the floor of 5 % and the
spread rule stand against that, and a pass after its own side's cost far more (above).

The pipes are two FIFOs in one folder, `side-0` and `side-1`, each opened read-write by both
workers and by the runner: opening never blocks, and a message written before its reader
looks is kept. One message is in flight at a time and each is one write of less than
PIPE_BUF bytes, so each read reads one whole message. A side that dies leaves the other
waiting: the launcher ends the pair when either worker fails (measure.launcher)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from memtrack.records.model import PAIR_FIGURES

TOKEN = b"t"
STOP = b"s"
"""The rounds are over before the schedule's end: the side told so runs no more passes."""
_MESSAGE = 1024
"""The longest message: the token and a pass's figures, well under PIPE_BUF."""


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
    the reference first (A B, A B, ...: each pass follows the other side's)."""
    return (0, 1, *(side for _ in range(rounds) for side in (0, 1)))


def start(fds: list[int], order: tuple[int, ...]) -> None:
    """The first token, to the first turn's side (the pair's pipes: `make`)."""
    os.write(fds[order[0]], TOKEN + json.dumps({"not_slower": 0}).encode())


SETUPS = 2
"""The schedule's first turns, one setup a side."""


def not_slower(candidate: Mapping[str, float], reference: Mapping[str, float]) -> bool | None:
    """Whether a round's candidate pass was not slower than REF's on the figure the time
    verdict reads (the first both hold); None where that figure is 0 on either side (the
    verdict leaves such a round out) or neither holds one."""
    figure = next((f for f in PAIR_FIGURES if f in candidate and f in reference), None)
    if figure is None or candidate[figure] <= 0 or reference[figure] <= 0:
        return None
    return candidate[figure] <= reference[figure]


class Turns:
    """One worker's turns in the schedule."""

    def __init__(self, folder: Path, side: int, order: tuple[int, ...], stop_after: int = 0):
        self.side, self.order, self.stop_after = side, order, stop_after
        self.fds = [os.open(pipe(folder, s), os.O_RDWR) for s in (0, 1)]
        self.mine: Iterator[int] = iter(i for i, s in enumerate(order) if s == side)
        self.at = -1
        """The schedule's turn this side runs now."""
        self.state: dict[str, Any] = {}
        """What the token brought: the rounds not slower so far, the opening pass's figures."""

    @contextlib.contextmanager
    def setup(self) -> Iterator[None]:
        """This side's setup and warm-up, in its turn."""
        if not self.wait():
            raise RuntimeError("the paired timing ended before this side's setup")
        yield
        self._send(self.order[self.at + 1], self.state)

    def wait(self) -> bool:
        """Wait for this side's next turn: False where it has none (the schedule's end, or
        the rounds were stopped)."""
        at = next(self.mine, None)
        if at is None:
            return False
        message = os.read(self.fds[self.side], _MESSAGE)
        if message == STOP:
            return False
        if message[:1] != TOKEN:
            raise RuntimeError("the paired timing's turn pipe closed")
        self.at, self.state = at, json.loads(message[1:])
        return True

    def done(self, figures: Mapping[str, float]) -> None:
        """This side's pass is done, with these figures: hand the token on (or, where the
        rounds are decided, tell the other side they are over)."""
        at, other = self.at, 1 - self.side
        if at + 1 >= len(self.order):
            return
        if (at - SETUPS) % 2 == 0:  # this pass opens its round
            self._send(other, {**self.state, "figures": dict(figures)})
            return
        count = int(self.state["not_slower"])
        theirs = self.state["figures"]
        mine_is_candidate = self.side == 1
        candidate, reference = (figures, theirs) if mine_is_candidate else (theirs, figures)
        count += not_slower(candidate, reference) is True
        if self.stop_after and count >= self.stop_after:
            os.write(self.fds[other], STOP)
            self.mine = iter(())
            return
        self._send(self.order[at + 1], {"not_slower": count})

    def _send(self, side: int, state: dict[str, Any]) -> None:
        message = TOKEN + json.dumps(state).encode()
        if len(message) > _MESSAGE:
            raise RuntimeError(f"a paired timing's message of {len(message)} bytes")
        os.write(self.fds[side], message)


__all__ = ["STOP", "Turns", "make", "not_slower", "pipe", "schedule", "start"]
