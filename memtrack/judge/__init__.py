"""Deciding: baselines split at their steps, headroom from observed noise, budgets,
reviewed acceptances, time at the level of runs, and the base branch's history.

`check.check` judges one run; `history.analyze_history` looks along the base branch.
Nothing here prints and nothing here imports torch.
"""
