"""What several rule families read of a trace the same way."""
from __future__ import annotations

from typing import List, Optional

from ...model import Checkpoint, TraceData


def name(trace: TraceData, tid: Optional[int]) -> Optional[str]:
    """The tensor's name, or None (never a description)."""
    info = trace.tensors.get(tid) if tid is not None else None
    return info.name if info is not None else None


def label(trace: TraceData, tid: Optional[int]) -> Optional[str]:
    """The tensor's name, or a description of it; None for no tensor."""
    return trace.tensor_label(tid) if tid is not None else None


def backward_checkpoints(trace: TraceData) -> List[Checkpoint]:
    return [cp for cp in trace.checkpoints if cp.kind == "backward" and cp.op_index < len(trace.ops)]

