"""The words of the findings, written once, after every rule has run and each tensor has the name its
culprit line uses for it: each finding's reason has a function `(trace, finding) -> Words` (the
message, the fix, the tensor's name), registered by the rule module that finds it."""
from __future__ import annotations

from typing import Callable, Dict

from ..model import Diagnosis, TraceData
from .findings import Finding, Words

# reason -> the function that words a finding of that reason (each rule module registers its own)
WORDS: Dict[str, Callable[[TraceData, Finding], Words]] = {}


def words(*reasons: str):
    """Register a function as the words of findings of these reasons."""
    def register(function):
        for reason in reasons:
            WORDS[reason] = function
        return function
    return register


def worded(trace: TraceData, finding: Finding) -> Diagnosis:
    """The finding as a Diagnosis: its lines from its ops (or its own locations), and its words."""
    said = WORDS[finding.reason](trace, finding)
    op, saved = finding.op, finding.saved
    at = finding.at if finding.at is not None else (op.location if op is not None else None)
    d = Diagnosis(kind=finding.kind, message=said.message, fix=said.fix, filename=at.filename if at else None,
                  line=at.line if at else None, source=at.source if at else "", tensor=said.tensor,
                  op_index=op.index if op is not None else None, tids=tuple(finding.tids), predicted=finding.predicted,
                  also=tuple(said.also), saved_version=finding.saved_version,
                  current_version=finding.current_version)
    saved_at = finding.saved_at if finding.saved_at is not None else (saved.location if saved is not None else None)
    if saved_at is not None:
        d.saved_line, d.saved_filename, d.saved_source = saved_at.line, saved_at.filename, saved_at.source
        d.saved_op_index = saved.index if saved is not None and saved.location is not None else None
    if finding.node_key is not None:
        d.node_key = finding.node_key
        node = trace.nodes.get(finding.node_key)
        d.node = node.name if node is not None else finding.facts.get("node")
    return d
