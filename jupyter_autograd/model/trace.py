"""The plain data of one captured block (TraceData) and the autograd graph as a networkx graph.

Nothing here imports torch, IPython or ipywidgets: a trace can be built in tests by hand,
serialised to JSON, and rendered anywhere. The public `Trace` (session.py) adds the views.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .kinds import Diagnosis
from .records import Checkpoint, CompiledCall, DistributedModel, GraphNode, Location, ModuleCall, OpRecord, \
    TensorInfo

@dataclass
class TraceData:
    """Everything captured from one block. Plain data: safe to keep after the block ends."""
    ops: List[OpRecord] = field(default_factory=list)
    tensors: Dict[int, TensorInfo] = field(default_factory=dict)
    nodes: Dict[int, GraphNode] = field(default_factory=dict)
    checkpoints: List[Checkpoint] = field(default_factory=list)
    diagnoses: List[Diagnosis] = field(default_factory=list)
    roots: List[int] = field(default_factory=list)  # node keys of live results and backward roots
    # A factory, not `= None`: a plain default would live on the class and hide the lazy build.
    error: Optional[str] = field(default_factory=lambda: None)  # the user's exception, if any
    # The innermost line of the user's code in that exception's traceback: where it was raised, or
    # the call it came out of (a DDP forward, a hook run by backward).
    error_location: Optional[Location] = field(default_factory=lambda: None)
    distributed: List[DistributedModel] = field(default_factory=list)  # DDP modules called in the block
    warnings: List[str] = field(default_factory=list)  # problems of the tool itself
    notes: List[str] = field(default_factory=list)     # things the tool did that the user may want to know
    sources: Dict[str, List[str]] = field(default_factory=dict)  # filename -> lines, for display
    # filename -> the name a person knows it by, where the file's own name means nothing to them:
    # a notebook cell's code is compiled under a hashed name (`2786300238.py`); Jupyter says `In [2]`.
    source_names: Dict[str, str] = field(default_factory=dict)
    modules: Dict[str, str] = field(default_factory=dict)  # dotted module name -> class name
    calls: List[ModuleCall] = field(default_factory=list)  # calls of user-written modules, by first op
    # Modules with backward hooks when the block ended: dotted name -> (each hook's `__name__`, or None,
    # and how it was registered: "register_backward_hook", "register_full_backward_hook", ...)
    backward_hooks: Dict[str, Tuple[Tuple[Optional[str], str], ...]] = field(default_factory=dict)
    # Tensors with a grad_fn still alive at a backward call after the one that followed them (or at
    # the block's end): tid -> op index of the first and of the last backward call (len(ops): the end)
    # that found them alive. Something kept them: a variable, a list, an attribute, a helper object.
    kept: Dict[int, Tuple[int, int]] = field(default_factory=dict)
    # Calls of custom autograd.Functions whose forward ran recorded ops: (its first such op, the call's
    # own op). The forward runs with grad off because the call runs it, in the grad mode of the call.
    function_calls: List[Tuple[int, int]] = field(default_factory=list)
    # Calls of torch.compile regions recorded as their graphs' ops (at the lines inside them), in call order.
    compiled: List[CompiledCall] = field(default_factory=list)
    # With check_nan: {"backward": op index, "node": key, "name": node name, "facts": what its saved inputs held}
    nan_origin: Optional[Dict[str, Any]] = field(default_factory=lambda: None)
    # Checked backward calls (1, 2, 4, 8, ...): op index -> whether the tensors it started from (the loss)
    # were finite. A NaN gradient from a NaN loss was made by the forward pass, not by backward.
    roots_finite: Dict[int, bool] = field(default_factory=dict)
    # Where a checked backward started from a NaN/Inf on the CPU: its op index -> the first op whose result,
    # alive at that call, held NaN (else Inf).
    nonfinite_forward: Dict[int, int] = field(default_factory=dict)

    # -- convenience -------------------------------------------------------------------------
    @property
    def graph(self):
        """The autograd graph as a networkx.DiGraph (built on each access)."""
        return to_networkx(self)

    def tensor_label(self, tid: Optional[int]) -> str:
        """The user's name for a tensor, or, when it has none we are sure of, a description
        (a wrong name is worse than none): its shape, the op that made it and where."""
        info = self.tensors.get(tid) if tid is not None else None
        if info is None:
            return "an unrecorded tensor"
        if info.name:
            return info.name
        shape = "shape (%s)" % ", ".join(str(s) for s in info.shape) if info.shape else "a scalar"
        made = self.ops[info.created_by] if info.created_by is not None and info.created_by < len(self.ops) else None
        if made is None:
            if info.is_leaf and info.first_requires_grad:  # made before the block, or as an nn.Parameter in it
                return "a %s leaf tensor of %s that requires grad" % (info.dtype, shape)
            return "a %s tensor of %s from before the block" % (info.dtype, shape)
        where = " in %s" % made.module[-1] if made.module else ""
        line = " (line %d)" % made.location.line if made.location else ""
        return "the %s result of %s%s%s, %s" % (info.dtype, made.name, where, line, shape)

    def source_line(self, filename: Optional[str], line: Optional[int]) -> str:
        lines = self.sources.get(filename or "", [])
        if line and 0 < line <= len(lines):
            return lines[line - 1].rstrip("\n")
        return ""

    def file_label(self, filename: Optional[str]) -> str:
        """`In [2]` for a notebook cell, `train.py` for a file, `<string>` for code with no file.
        Where another file of the trace has the same base name, as much of the path as tells
        them apart (`a/model.py`, `b/model.py`)."""
        if not filename:
            return ""
        named = self.source_names.get(filename)
        if named:
            return named
        if filename.startswith("<"):
            return filename
        parts = filename.replace("\\", "/").split("/")
        others = [f.replace("\\", "/").split("/") for f in self.sources
                  if f != filename and not f.startswith("<") and f not in self.source_names]
        others = [o for o in others if o[-1] == parts[-1]]
        depth = 1
        while depth < len(parts) and any(o[-depth:] == parts[-depth:] for o in others):
            depth += 1
        return "/".join(p for p in parts[-depth:])

    def place(self, filename: Optional[str], line: Optional[int]) -> str:
        """Where a line is, as a person finds it: `In [2], line 16`, `train.py, line 41`."""
        label = self.file_label(filename)
        if line is None:
            return label
        return "%s, line %d" % (label, line) if label else "line %d" % line

    def backward_calls(self) -> List[OpRecord]:
        return [op for op in self.ops if op.is_backward]

    def __repr__(self) -> str:
        kinds = ", ".join(d.kind for d in self.diagnoses) or "no problems"
        return "<Trace: %d ops, %d graph nodes, %s>" % (len(self.ops), len(self.nodes), kinds)


def node_id(key: int) -> str:
    return "fn%d" % key


def tensor_id(tid: int) -> str:
    return "t%d" % tid


def to_networkx(trace: TraceData):
    """The autograd graph with tensors: grad_fn nodes, leaves, saved tensors and root tensors.

    Node attribute `kind` is one of "fn" (a grad_fn node), "leaf" (a leaf tensor that gets a
    .grad), "saved" (a tensor a node saved), "tensor" (a live result). Edges run from a node
    to what it needs in backward: `next` (next_functions), `saves`, `accumulates`, `grad_fn`.
    """
    import networkx as nx

    g = nx.DiGraph()
    culprits = {d.node_key for d in trace.diagnoses if d.node_key is not None}
    bad_tids = {t for d in trace.diagnoses for t in d.tids}

    def add_tensor(tid: int, kind: str) -> str:
        nid = tensor_id(tid)
        info = trace.tensors.get(tid)
        if nid not in g:
            g.add_node(nid, kind=kind, tid=tid, label=trace.tensor_label(tid),
                       shape=tuple(info.shape) if info else (), problem=tid in bad_tids)
        elif kind == "leaf":
            g.nodes[nid]["kind"] = "leaf"
        return nid

    for key, node in trace.nodes.items():
        g.add_node(node_id(key), kind="fn", key=key, label=node.name, problem=key in culprits,
                   created_by=node.created_by)
    for key, node in trace.nodes.items():
        src = node_id(key)
        if node.variable is not None:
            g.add_edge(src, add_tensor(node.variable, "leaf"), kind="accumulates")
        for child in node.inputs:
            if child in trace.nodes:
                g.add_edge(src, node_id(child), kind="next")
        for slot in node.saved:
            if slot.tid is not None and not (slot.tid in trace.tensors and trace.tensors[slot.tid].is_leaf
                                             and trace.tensors[slot.tid].requires_grad):
                g.add_edge(src, add_tensor(slot.tid, "saved"), kind="saves", slot=slot.slot)
            elif slot.tid is not None:
                g.add_edge(src, add_tensor(slot.tid, "leaf"), kind="saves", slot=slot.slot)
    for info in trace.tensors.values():
        if info.alive and info.name and info.grad_fn is not None:
            key = info.node
            if key is not None and key in trace.nodes:
                g.add_edge(add_tensor(info.tid, "tensor"), node_id(key), kind="grad_fn")
    return g

