"""The rules, in the order they run. Each is `(trace, source) -> [Finding]` (findings.Rule)."""
from __future__ import annotations

from .findings import Rule
from .rules.freed import graph_freed
from .rules.nan import nan_gradient

RULES = [
    Rule("freed graphs (graph-freed)", graph_freed),
    Rule("NaN or Inf gradients (nan-gradient)", nan_gradient),
]
