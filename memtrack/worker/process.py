"""What every worker process does around its case: die with its parent, read its spec, and
turn how the case ended into its result (an exception is data: the case's status)."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrack.probes.tree import die_with_parent
from memtrack.worker.protocol import ResultFile, Spec


def serve(
    argv: list[str],
    run: Callable[[Spec, ResultFile], None],
    failure: Callable[[Exception, Spec], dict[str, Any]],
) -> int:
    """`argv` is SPEC_PATH RUNNER_PID. Runs the case; `failure(exc, spec)` gives the result
    fields of a case that raised (its status and message)."""
    die_with_parent(int(argv[1]))
    spec = Spec.read(Path(argv[0]))
    result = ResultFile(Path(spec.result_path))
    try:
        run(spec, result)
    except MemoryError as exc:
        result.update(status="oom", message=f"MemoryError: {exc}", traceback=traceback.format_exc())
        return 0
    except Exception as exc:
        result.update(**failure(exc, spec), traceback=traceback.format_exc()[-20000:])
        return 0
    result.update(status="ok")
    return 0


__all__ = ["serve"]
