"""Renderers: the verdicts of `check`, the tables of `run`, `show` and `history`, and plans,
as terminal text, Markdown or JSON. Nothing here decides; nothing here imports torch."""
