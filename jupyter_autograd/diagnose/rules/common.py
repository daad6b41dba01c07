"""What several rule families read of a trace the same way."""
from __future__ import annotations

import re
from typing import List, Optional

from ...model import Checkpoint, OpRecord, TraceData
from ...model.queries import at_maker, engine_order


def name(trace: TraceData, tid: Optional[int]) -> Optional[str]:
    """The tensor's name, or None (never a description)."""
    info = trace.tensors.get(tid) if tid is not None else None
    return info.name if info is not None else None


def label(trace: TraceData, tid: Optional[int]) -> Optional[str]:
    """The tensor's name, or a description of it; None for no recorded tensor."""
    return trace.tensor_label(tid) if tid is not None and tid in trace.tensors else None


def backward_checkpoints(trace: TraceData) -> List[Checkpoint]:
    return [cp for cp in trace.checkpoints if cp.kind == "backward" and cp.op_index < len(trace.ops)]



# -- the errors PyTorch raises ----------------------------------------------------------------------

def raised(error: str, whole: bool = False) -> str:
    """The words of the error as PyTorch wrote them: its first line, or of a long one (DDP's run to
    hundreds of words) its first sentence, unless the whole line is wanted."""
    line = error.split(": ", 1)[-1].split("\n")[0].strip()
    if whole or len(line) <= 240 or ". " not in line:
        return line
    return line[:line.index(". ") + 1]


def shown(label: Optional[str]) -> str:
    """A label in backticks when it is a name the user's code has, as it is when it describes."""
    return "`%s`" % label if label and re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)*", label) else (label or "")


def op_words(op: OpRecord, missing: str = "") -> str:
    """An op's name for a sentence: `torch.unique`; an op whose function has no name of its own (a
    dispatching wrapper) by PyTorch's internal name for it."""
    if "<" in op.name:
        return "PyTorch's `%s`" % missing if missing else "an operation"
    return "`%s`" % op.name


def made(trace: TraceData, tid: Optional[int]) -> Optional[OpRecord]:
    """The op that made a tensor, at its own line: the innermost line of the user's, where a fix goes."""
    info = trace.tensors.get(tid) if tid is not None else None
    if info is None or info.created_by is None or info.created_by >= len(trace.ops):
        return None
    return trace.ops[info.created_by]


def maker(trace: TraceData, tid: Optional[int]) -> Optional[OpRecord]:
    """The op that made a tensor, at the line that called the user-written module which returned it."""
    return at_maker(trace, tid, made(trace, tid))


def nodes_run(trace: TraceData, op: OpRecord) -> List[int]:
    """The nodes the backward call `op` runs, in the engine's order ([] when it was not walked)."""
    cp = next((cp for cp in trace.checkpoints if cp.kind == "backward" and cp.op_index == op.index), None)
    return engine_order(trace, cp) if cp is not None else []


def plain_node_name(name: str) -> str:
    """`Unique2Backward0`, `_unique2` and `Unique2` alike: how PyTorch's messages and nodes spell an op."""
    return re.sub(r"Backward\d*$", "", name).replace("_", "").lower()


def node_made(trace: TraceData, key: Optional[int]) -> Optional[OpRecord]:
    node = trace.nodes.get(key) if key is not None else None
    if node is None or node.created_by is None or node.created_by >= len(trace.ops):
        return None
    return trace.ops[node.created_by]


def output_of(op: Optional[OpRecord]) -> Optional[int]:
    return op.outputs[0] if op is not None and op.outputs else None
