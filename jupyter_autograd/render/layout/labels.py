"""The words on the things drawn: labels clipped to what a picture can hold, shapes, the line
an op ran at, the file of the block."""
from __future__ import annotations

from typing import Optional

from ...model import TraceData

MAX_CHARS = 34           # the longest label, in characters


def main_file(trace: TraceData) -> str:
    """The user's file (the cell): where a diagnosis points, else where code outside modules ran."""
    for d in trace.diagnoses:
        if d.filename:
            return d.filename
    return block_file(trace)


def block_file(trace: TraceData) -> str:
    """The file of the block itself (the `%%autograd` cell): where its last op outside any
    module ran (a block ends in its own code; its first ops may run in a model's __init__)."""
    for op in reversed(trace.ops):
        if op.location is not None and not op.module:
            return op.location.filename
    return next((op.location.filename for op in trace.ops if op.location is not None), "")


def short_name(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else name


def clip(text: str, width: int = MAX_CHARS) -> str:
    """A label every picture can draw: one line of at most `width` characters (a name can be
    100,000 long), with what is not printable (ESC, NUL, a lone surrogate: XML cannot hold them,
    fonts have no glyph for them) written as Python writes it in a repr (`\\x1b`)."""
    if len(text) <= width and text.isprintable() and "  " not in text:
        return text
    text = " ".join(text.split())
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def shape_of(trace: TraceData, tid: Optional[int]) -> str:
    info = trace.tensors.get(tid) if tid is not None else None
    if info is None:
        return ""
    return "[%s]" % ", ".join(str(s) for s in info.shape) if info.shape else "scalar"


def node_shape(trace: TraceData, key: int) -> str:
    """The shape of what node `key` made (its gradient's shape), when that is one shape: the
    op's output for the node an op recorded as its own, the parameter's for a leaf."""
    n = trace.nodes[key]
    if n.variable is not None:
        return shape_of(trace, n.variable)
    if n.created_by is None or not 0 <= n.created_by < len(trace.ops):
        return ""
    op = trace.ops[n.created_by]
    if op.node != key or not op.outputs:
        return ""  # one of several nodes of one op (an RNN's steps): which output is not known
    if len(op.outputs) == 1:
        return shape_of(trace, op.outputs[0])
    shapes = {shape_of(trace, tid) for tid in op.outputs}
    return shapes.pop() if len(shapes) == 1 else ""


def short_label(trace: TraceData, tid: int) -> str:
    """A tensor's name, else what made it (`F.linear output`): tensor_label's description is a
    sentence, too long for a box."""
    info = trace.tensors.get(tid)
    if info is None or info.name:
        return trace.tensor_label(tid)
    if info.created_by is not None and 0 <= info.created_by < len(trace.ops):
        return "%s output" % trace.ops[info.created_by].name
    return "input " + shape_of(trace, tid)


def saved_state(d) -> str:
    """What a saved tensor's box adds to its name, so that it is not mistaken for the node of
    the same name: the version it was saved at, or that its graph was freed."""
    if d.kind == "graph-freed":
        return " (graph freed)"
    return " (saved v%d)" % d.saved_version if d.saved_version is not None else " (saved)"


def line_labeller(trace: TraceData):
    """`where(op_index)`: the line an op ran at, as the labels say it: `line 7` when the trace's
    lines are all in one file, else `In [2], line 7` (a cell) or `model.py, line 41`."""
    ops = trace.ops
    files = {op.location.filename for op in ops if op.location is not None}
    one_file = len(files) <= 1

    def where(op_index: Optional[int]) -> str:
        if op_index is None or not 0 <= op_index < len(ops) or ops[op_index].location is None:
            return ""
        loc = ops[op_index].location
        return "line %d" % loc.line if one_file else trace.place(loc.filename, loc.line)
    return where
