"""Probes: one small module per view of memory (host, framework, device), and of the
machine's load while a case is timed."""
