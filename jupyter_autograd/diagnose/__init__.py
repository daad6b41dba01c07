"""Rules that turn a Trace into Diagnoses, each with a plain-words message and a concrete fix.

Works on plain data only: `inplace` holds the in-place family, `flow` the errors of gradient
flow (freed and cut graphs, missing and NaN gradients), `errors` the errors PyTorch raises whose
message names no line of the user's (and the floor for any other error of backward), `paths` the
walks they share.
"""
from __future__ import annotations

from typing import Dict, List

from ..model import EXPLAINS, PROBLEM_KINDS, Diagnosis, TraceData
from ..model.queries import ancestors
from ..source.naming import names_at_culprits
from . import errors, flow, inplace

_ORDER = {kind: i for i, kind in enumerate(PROBLEM_KINDS)}


def diagnose(trace: TraceData) -> List[Diagnosis]:
    """Every rule, each failing alone: a rule that raises loses its own kind of problem, said in
    `trace.warnings`, and the others still run. Then each tensor a diagnosis names goes by the
    expression its culprit line uses for it (names.py), and the rules say it again with those names."""
    warnings, notes = list(trace.warnings), list(trace.notes)
    found = _rules(trace)
    try:
        renamed = names_at_culprits(trace, found)
    except Exception as exc:
        trace.warnings.append("reading the names the culprit lines use failed (%s: %s): tensors keep the names "
                              "the block gave them" % (type(exc).__name__, exc))
        return found
    if not renamed:
        return found
    for tid, name in renamed.items():
        trace.tensors[tid].name = name
    trace.warnings[:], trace.notes[:] = warnings, notes  # said again by the rules
    return _rules(trace)


def _rules(trace: TraceData) -> List[Diagnosis]:
    ranks: Dict[int, tuple] = {}

    def rule(find, kinds, *args):
        try:
            return find(trace, *args)
        except Exception as exc:
            trace.warnings.append("the rule for %s failed (%s: %s): problems of that kind were not looked for"
                                  % (kinds, type(exc).__name__, exc))
            return []

    saved = rule(inplace._saved_tensor_writes, "saved tensors changed in place (saved-tensor-modified, "
                 "silent-data-mutation)", ranks)
    cuts = rule(flow.graph_cut, "graphs cut off (graph-cut)")
    # Parameters starved by a cut on the way to a loss that graph-cut names are that problem, said
    # once (with the loss): the cut is among the ops the loss was computed from.
    # (By line: in a loop, the loss named and the cut met by the missing gradient may be of
    # different iterations.)
    def starved_by_cuts(trace):
        upstream = set()
        for d in cuts:
            upstream |= ancestors(trace, d.tids, len(trace.ops))
        upstream_lines = {(op.location.filename, op.location.line) for op in trace.ops
                          if op.location is not None and any(t in upstream for t in op.outputs)}
        return [d for d in flow.missing_grad(trace) if (d.filename, d.line) not in upstream_lines]

    missing = rule(starved_by_cuts, "tensors that get no gradient (missing-grad)")
    found = (rule(inplace._leaf_inplace, "in-place changes of leaves (leaf-inplace)") + saved
             + rule(inplace._accumulated_graphs, "accumulated graphs (accumulated-graph)")
             + rule(inplace._retained_history, "graphs run again with retain_graph (accumulated-graph)")
             + rule(flow.graph_freed, "freed graphs (graph-freed)") + cuts + missing
             + rule(flow.nan_gradient, "NaN or Inf gradients (nan-gradient)")
             + rule(errors.error_kinds, "errors that backward and the ops raised (their kinds)"))
    found += rule(errors.backward_error, "other errors of backward (backward-error)", found, EXPLAINS)
    # Within a kind: leaf writes in the order they ran; saved-tensor problems in the order backward
    # meets them; the rest in the order of their lines.
    found.sort(key=lambda d: (_ORDER[d.kind], ranks.get(id(d), ()), d.op_index if d.op_index is not None else -1))
    return found
