"""`python -m memtrack.worker SPEC.json RUNNER_PID`: measure one case (memtrack.worker.measure)."""

import os
import sys

from memtrack.worker.measure import main

code = main(sys.argv[1:])
sys.stdout.flush()
os._exit(code)  # skip interpreter teardown: figures are written, nothing is left to do
