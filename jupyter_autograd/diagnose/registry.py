"""The rules, in the order they run. Each is `(trace, source) -> [Finding]` (findings.Rule)."""
from __future__ import annotations

from .findings import Rule
from .rules.cuts import graph_cut
from .rules.kept import accumulated_graphs, retained_history
from .rules.freed import graph_freed
from .rules.missing import missing_grad
from .rules.nan import nan_gradient
from .rules.writes import leaf_inplace, saved_tensor_writes

RULES = [
    Rule("in-place changes of leaves (leaf-inplace)", leaf_inplace),
    Rule("saved tensors changed in place (saved-tensor-modified, silent-data-mutation)", saved_tensor_writes),
    Rule("accumulated graphs (accumulated-graph)", accumulated_graphs),
    Rule("graphs run again with retain_graph (accumulated-graph)", retained_history),
    Rule("freed graphs (graph-freed)", graph_freed),
    Rule("graphs cut off (graph-cut)", graph_cut),
    Rule("tensors that get no gradient (missing-grad)", missing_grad),
    Rule("NaN or Inf gradients (nan-gradient)", nan_gradient),
]
