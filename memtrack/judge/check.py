"""A check: gather the candidate's evidence once (memtrack.judge.gather.check), then decide
its verdicts (memtrack.judge.decide). `memtrack.report` shows what this returns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memtrack.config import Config
from memtrack.judge.decide import CheckResult, decide
from memtrack.judge.gather.check import gather

if TYPE_CHECKING:
    from memtrack.store.database import Store


def check(store: Store, config: Config, **where: Any) -> CheckResult:
    """Judge a candidate against its baseline and the config's budgets, in the history of
    the candidate's repository. `where`: which candidate, as `gather` takes it (run_id,
    commit, base_branch, root)."""
    return decide(gather(store, config, **where), config)


__all__ = ["CheckResult", "check"]
