"""The shipped example suite: pinned, self-contained workloads (models built in code,
inputs from seeds). Defaults run on 2 CPU cores; raise the params to fill a GPU."""

from memtrack.examples import decoder, gpt, loading, training, vision

__all__ = ["decoder", "gpt", "loading", "training", "vision"]
