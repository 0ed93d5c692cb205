"""Capacity planning: fitting memory against a swept param, the GPU catalog, and sweeps."""
