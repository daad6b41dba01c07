"""What a rule finds, as structure: the kind of problem, which case of it (`reason`), the culprit op or
line, the second line (saved, freed by, backward, ...), the tensor it is about and the facts its
words need. The words (message, fix, the tensor's name) are written after every rule has run and
each tensor has its final name (wording.py), once."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..model import Location, OpRecord, TraceData


@dataclass
class Finding:
    kind: str                            # one of model.PROBLEM_KINDS
    reason: str                          # which case of its kind: the words it gets (wording.WORDS)
    # The culprit op, at its line (or placed at the line that called the module it ran in: queries.at_caller).
    op: Optional[OpRecord] = None
    at: Optional[Location] = None        # the culprit line, where it is not the op's (a store, the block's error)
    saved: Optional[OpRecord] = None     # the op of the second line (Diagnosis.saved_label says what it is)
    saved_at: Optional[Location] = None  # ... where it is not that op's line
    subject: Optional[int] = None        # the tensor it is about, named when it is worded
    tids: Tuple[int, ...] = ()           # the tensors it concerns (the subject first)
    node_key: Optional[int] = None       # the graph node it points at
    saved_version: Optional[int] = None
    current_version: Optional[int] = None
    predicted: bool = False              # found from the graph before any backward ran into it
    facts: Dict[str, Any] = field(default_factory=dict)  # what its words need
    rank: tuple = ()                     # its order among the findings of its kind


class Words(NamedTuple):
    message: str
    fix: str
    tensor: Optional[str] = None         # the name the diagnosis gives its tensor (its subject's, unless set)
    also: Tuple[str, ...] = ()           # other tensors the same problem broke, by name


# A rule: what it looks for (said in the trace's warnings if it fails) and the function that looks.
# Every rule has the one signature `(trace, source) -> [Finding]`.
class Rule(NamedTuple):
    looks_for: str
    find: Callable[[TraceData, Any], List[Finding]]
