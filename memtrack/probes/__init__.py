"""Probes: one small module per view of memory (host, framework, device)."""
