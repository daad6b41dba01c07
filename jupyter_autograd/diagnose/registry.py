"""The rules, in the order they run. Each is `(trace, source) -> [Finding]` (findings.Rule); what it
looks for is said in the trace's warnings if it fails. The floor (rules/floor.py) runs after them all:
it says what no rule explained."""
from __future__ import annotations

from .findings import Rule
from .rules.causes import raised_causes
from .rules.cuts import graph_cut
from .rules.ddp import ddp_ready_twice, ddp_unused_parameters
from .rules.freed import graph_freed
from .rules.kept import accumulated_graphs, retained_history
from .rules.missing import missing_grad
from .rules.nan import nan_gradient
from .rules.raised import invalid_gradient, nonscalar_backward, not_differentiable
from .rules.refused import inference_tensor_saved, nonleaf_requires_grad, view_inplace
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
    Rule("in-place changes of views (view-inplace)", view_inplace),
    Rule("inference tensors saved for backward (inference-tensor-saved)", inference_tensor_saved),
    Rule("requires_grad set on non-leaves (nonleaf-requires-grad)", nonleaf_requires_grad),
    Rule("backward from tensors that are not scalars (nonscalar-backward)", nonscalar_backward),
    Rule("operations without a derivative (not-differentiable)", not_differentiable),
    Rule("wrong gradients of custom Functions (invalid-gradient)", invalid_gradient),
    Rule("parameters DistributedDataParallel waited for (ddp-unused-parameters)", ddp_unused_parameters),
    Rule("gradients DistributedDataParallel got twice (ddp-ready-twice)", ddp_ready_twice),
    Rule("errors about a property of a tensor or a call, at its cause (grad-to-numpy, needs-grad, nonleaf-copied, "
         "not-a-parameter, fp16-gradients, transform-unsupported, checkpoint-incompatible)", raised_causes),
]
