"""Rules that turn a Trace into Diagnoses, each with a plain-words message and a concrete fix.

Works on plain data only: `inplace` holds the in-place family, `flow` the errors of gradient
flow (freed and cut graphs, missing and NaN gradients), `errors` the errors PyTorch raises whose
message names no line of the user's (and the floor for any other error of backward), `paths` the
walks they share.
"""
from __future__ import annotations

from typing import Dict, List

from ..model import PROBLEM_KINDS, Diagnosis, Trace
from ..render.text import EXPLAINS
from . import errors, flow, inplace
from .paths import ancestors

_ORDER = {kind: i for i, kind in enumerate(PROBLEM_KINDS)}


def diagnose(trace: Trace) -> List[Diagnosis]:
    ranks: Dict[int, tuple] = {}
    saved = inplace._saved_tensor_writes(trace, ranks)
    cuts = flow.graph_cut(trace)
    # Parameters starved by a cut on the way to a loss that graph-cut names are that problem, said
    # once (with the loss): the cut is among the ops the loss was computed from.
    # (By line: in a loop, the loss named and the cut met by the missing gradient may be of
    # different iterations.)
    upstream = set()
    for d in cuts:
        upstream |= ancestors(trace, d.tids, len(trace.ops))
    upstream_lines = {(op.location.filename, op.location.line) for op in trace.ops
                      if op.location is not None and any(t in upstream for t in op.outputs)}
    missing = [d for d in flow.missing_grad(trace) if (d.filename, d.line) not in upstream_lines]
    found = (inplace._leaf_inplace(trace) + saved + inplace._accumulated_graphs(trace) + inplace._retained_history(trace)
             + flow.graph_freed(trace) + cuts + missing + flow.nan_gradient(trace) + errors.error_kinds(trace))
    found += errors.backward_error(trace, found, EXPLAINS)
    # Within a kind: leaf writes in the order they ran; saved-tensor problems in the order backward
    # meets them; the rest in the order of their lines.
    found.sort(key=lambda d: (_ORDER[d.kind], ranks.get(id(d), ()), d.op_index if d.op_index is not None else -1))
    return found
