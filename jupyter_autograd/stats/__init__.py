"""Gradient health: per parameter and per module, from the norms the capture read (plain data)."""
from .grad_stats import grad_stats

__all__ = ["grad_stats"]
