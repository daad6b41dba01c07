"""The rules, in the order they run. Each is `(trace, source) -> [Finding]` (findings.Rule)."""
from __future__ import annotations

from .findings import Rule
from .rules.cuts import graph_cut
from .rules.freed import graph_freed
from .rules.missing import missing_grad
from .rules.nan import nan_gradient

RULES = [
    Rule("freed graphs (graph-freed)", graph_freed),
    Rule("graphs cut off (graph-cut)", graph_cut),
    Rule("tensors that get no gradient (missing-grad)", missing_grad),
    Rule("NaN or Inf gradients (nan-gradient)", nan_gradient),
]
