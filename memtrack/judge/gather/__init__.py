"""The gather step: the only part of the judge that reads the store or runs git. Each module
answers the rules' questions once, into frozen inputs (memtrack.judge.evidence): a check's
(`check`), its baselines and the base branch's open regressions (`baseline`), the history's
series (`history`), a bisection's commits (`bisect`), and what git says (`git`)."""
