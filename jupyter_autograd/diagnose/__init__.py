"""The diagnosis: rules turn a trace into findings (structured: kind, ops, tensors, reason), each
tensor a finding names goes by the expression its culprit line uses for it, then the findings are
worded, once, into Diagnoses with a plain-words message and a concrete fix.

Works on plain data only. The rules are in `rules/` (one module a family of problems) and
registered in `registry.py`; the words each reason gets are registered next to its rule
(`wording.words`); the fixes' wording is in `fixes/`.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from ..model import EXPLAINS, PROBLEM_KINDS, Diagnosis, TraceData
from ..model.queries import ancestors
from ..source.index import SourceIndex
from ..source.naming import names_at_culprits
from . import errors
from .findings import Finding
from . import registry
from .wording import worded

_ORDER = {kind: i for i, kind in enumerate(PROBLEM_KINDS)}


def diagnose(trace: TraceData, source: Optional[SourceIndex] = None) -> List[Diagnosis]:
    """Every rule, each failing alone: a rule that raises loses its own kind of problem, said in
    `trace.warnings`, and the others still run. Then each tensor a diagnosis names goes by the
    expression its culprit line uses for it (source/naming.py), and the findings are worded."""
    source = source if source is not None else SourceIndex(trace.sources)
    warnings, notes = list(trace.warnings), list(trace.notes)
    findings = _find(trace, source)
    found_warnings, found_notes = trace.warnings[len(warnings):], trace.notes[len(notes):]
    ranks: Dict[int, tuple] = {}
    found = _rules(trace, ranks, findings)
    try:
        renamed = names_at_culprits(trace, source, _claims(trace, findings, found, ranks))
    except Exception as exc:
        trace.warnings.append("reading the names the culprit lines use failed (%s: %s): tensors keep the names "
                              "the block gave them" % (type(exc).__name__, exc))
        renamed = {}
    if renamed:
        for tid, name in renamed.items():
            trace.tensors[tid].name = name
        trace.warnings[:], trace.notes[:] = warnings + found_warnings, notes + found_notes  # said again by the rules
        ranks.clear()
        found = _rules(trace, ranks, findings)
    for f in findings:
        d = worded(trace, f)
        ranks[id(d)] = f.rank
        found.append(d)
    # Within a kind: leaf writes in the order they ran; saved-tensor problems in the order backward
    # meets them; the rest in the order of their lines.
    found.sort(key=lambda d: (_ORDER[d.kind], ranks.get(id(d), ()), d.op_index if d.op_index is not None else -1))
    return found


def _find(trace: TraceData, source: SourceIndex) -> List[Finding]:
    found = []
    for rule in registry.RULES:
        try:
            found += rule.find(trace, source)
        except Exception as exc:
            trace.warnings.append("the rule for %s failed (%s: %s): problems of that kind were not looked for"
                                  % (rule.looks_for, type(exc).__name__, exc))
    return _said_once(trace, found)


def _said_once(trace: TraceData, found: List[Finding]) -> List[Finding]:
    """Parameters starved by a cut on the way to a loss that graph-cut names are that problem, said
    once (with the loss): the cut is among the ops the loss was computed from. (By line: in a loop,
    the loss named and the cut met by the missing gradient may be of different iterations.)"""
    cuts = [f for f in found if f.kind == "graph-cut"]
    if not cuts:
        return found
    upstream = set()
    for f in cuts:
        upstream |= ancestors(trace, f.tids, len(trace.ops))
    upstream_lines = {(op.location.filename, op.location.line) for op in trace.ops
                      if op.location is not None and any(t in upstream for t in op.outputs)}

    def line(f):
        at = f.at if f.at is not None else (f.op.location if f.op is not None else None)
        return (at.filename, at.line) if at is not None else (None, None)

    return [f for f in found if f.kind != "missing-grad" or line(f) not in upstream_lines]


def _claims(trace: TraceData, findings: List[Finding], found: List[Diagnosis], ranks: Dict[int, tuple]):
    """(culprit op index, culprit line, named tensor) of every finding and diagnosis, in their order."""
    keyed = []
    for f in findings:
        at = f.at if f.at is not None else (f.op.location if f.op is not None else None)
        keyed.append(((_ORDER[f.kind], f.rank, f.op.index if f.op is not None else -1),
                      (f.op.index if f.op is not None else None, (at.filename, at.line) if at else None, f.subject)))
    for d in found:
        tid = next((t for t in d.tids if t in trace.tensors and trace.tensor_label(t) == d.tensor), None) \
            if d.tensor is not None else None
        keyed.append(((_ORDER[d.kind], ranks.get(id(d), ()), d.op_index if d.op_index is not None else -1),
                      (d.op_index, (d.filename, d.line), tid)))
    keyed.sort(key=lambda k: k[0])
    return [claim for _, claim in keyed]


def _rules(trace: TraceData, ranks: Dict[int, tuple], findings: List[Finding]) -> List[Diagnosis]:
    def rule(find, kinds, *args):
        try:
            return find(trace, *args)
        except Exception as exc:
            trace.warnings.append("the rule for %s failed (%s: %s): problems of that kind were not looked for"
                                  % (kinds, type(exc).__name__, exc))
            return []

    found = rule(errors.error_kinds, "errors that backward and the ops raised (their kinds)")
    found += rule(errors.backward_error, "other errors of backward (backward-error)", found + findings, EXPLAINS)
    return found
