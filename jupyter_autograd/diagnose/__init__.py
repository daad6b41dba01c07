"""The diagnosis: rules turn a trace into findings (structured: kind, ops, tensors, reason), each
tensor a finding names goes by the expression its culprit line uses for it, then the findings are
worded, once, into Diagnoses with a plain-words message and a concrete fix.

Works on plain data only. The rules are in `rules/` (one module a family of problems) and
registered in `registry.py`; the words each reason gets are registered next to its rule
(`wording.words`); the fixes' wording is in `fixes/`.
"""
from __future__ import annotations

from typing import List, Optional

from ..model import PROBLEM_KINDS, Diagnosis, TraceData
from ..model.queries import ancestors
from ..source.alignment import Alignment
from ..source.naming import names_at_culprits
from . import registry
from .findings import Finding
from .rules.floor import backward_errors
from .wording import worded

_ORDER = {kind: i for i, kind in enumerate(PROBLEM_KINDS)}


def diagnose(trace: TraceData, source: Optional[Alignment] = None) -> List[Diagnosis]:
    """Every rule, each failing alone: a rule that raises loses its own kind of problem, said in
    `trace.warnings`, and the others still run. Then each tensor a finding names goes by the
    expression its culprit line uses for it (source/naming.py), and the findings are worded, in
    order: by kind; within a kind, leaf writes in the order they ran, saved-tensor problems in the
    order backward meets them, the rest in the order of their lines. `source`: the user's source as
    the trace's ops ran it (the build's, so that nothing is read twice)."""
    source = source if source is not None else Alignment(trace)
    findings = _find(trace, source)
    findings.sort(key=lambda f: (_ORDER[f.kind], f.rank, f.op.index if f.op is not None else -1))
    try:
        renamed = names_at_culprits(trace, source, [_claim(f) for f in findings])
    except Exception as exc:
        trace.warnings.append("reading the names the culprit lines use failed (%s: %s): tensors keep the names "
                              "the block gave them" % (type(exc).__name__, exc))
        renamed = {}
    for tid, name in renamed.items():
        trace.tensors[tid].name = name
    out = []
    for f in findings:
        try:
            out.append(worded(trace, f))
        except Exception as exc:
            trace.warnings.append("writing the diagnosis of a %s problem failed (%s: %s): it is not shown"
                                  % (f.kind, type(exc).__name__, exc))
    return out


def _find(trace: TraceData, source: Alignment) -> List[Finding]:
    found = []
    for rule in registry.RULES:
        try:
            found += rule.find(trace, source)
        except Exception as exc:
            trace.warnings.append("the rule for %s failed (%s: %s): problems of that kind were not looked for"
                                  % (rule.looks_for, type(exc).__name__, exc))
    found = _said_once(trace, found)
    try:
        found += backward_errors(trace, source, found)
    except Exception as exc:
        trace.warnings.append("the rule for other errors of backward (backward-error) failed (%s: %s): problems of "
                              "that kind were not looked for" % (type(exc).__name__, exc))
    return found


def _claim(f: Finding):
    """(culprit op index, culprit line, the tensor it names) of a finding: what names_at_culprits reads."""
    at = f.at if f.at is not None else (f.op.location if f.op is not None else None)
    return f.op.index if f.op is not None else None, (at.filename, at.line) if at else None, f.subject


def _said_once(trace: TraceData, found: List[Finding]) -> List[Finding]:
    """Parameters starved by a cut on the way to a loss that graph-cut names are that problem, said
    once (with the loss): the cut is among the ops the loss was computed from. (By line: in a loop,
    the loss named and the cut met by the missing gradient may be of different iterations.) Inf
    gradients of float16 parameters that GradScaler refused (fp16-gradients) are that problem too:
    a float16 gradient of the scaled loss overflows."""
    float16 = {t for f in found if f.kind == "fp16-gradients" for t in f.tids}
    if float16:
        found = [f for f in found if f.kind != "nan-gradient" or not set(f.tids) <= float16]
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
