"""A check: gather the candidate's evidence once (memtrack.judge.gather.check), then decide
its verdicts (memtrack.judge.decide). `memtrack.report` shows what this returns."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from memtrack.config import Config
from memtrack.judge.decide import CheckResult, decide
from memtrack.judge.gather.check import gather

if TYPE_CHECKING:
    from memtrack.store.database import Store


def check(
    store: Store,
    config: Config,
    *,
    run_id: str | None = None,
    commit: str | None = None,
    base_branch: str | None = None,
    root: Path | None = None,
) -> CheckResult:
    """Judge a candidate against its baseline and the config's budgets, in the history of
    the candidate's repository."""
    found = gather(store, config, run_id=run_id, commit=commit, base_branch=base_branch, root=root)
    return decide(found, config)


__all__ = ["CheckResult", "check"]
