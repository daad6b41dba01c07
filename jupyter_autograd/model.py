"""Plain data describing one captured block: operations, tensors, the autograd graph, diagnoses.

Nothing here imports torch, IPython or ipywidgets: a Trace can be built in tests by hand,
serialised to JSON, and rendered anywhere.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

# The op name of `t.requires_grad = ...` (a property set, recorded as an op: it can freeze a parameter).
FREEZE_SETTER = "Tensor.requires_grad ="
# The op name of `t.data = new`: it swaps the memory behind `t` (recorded as a write of `t`, whose
# version counter does not move).
DATA_SWAP = "Tensor.data ="
# The op names of grad-mode switches (no_grad, set_grad_enabled and enable_grad call the first; entering
# and leaving inference mode is recorded as the second): ops with no tensors and the mode they left.
GRAD_MODE_SWITCHES = ("torch._C._set_grad_enabled", "torch.inference_mode")

# By importance: silent problems and the in-place family first, then the errors that stop a
# training step, the floor for any other autograd error last.
PROBLEM_KINDS = ("leaf-inplace", "view-inplace", "saved-tensor-modified", "silent-data-mutation", "accumulated-graph",
                 "graph-freed", "graph-cut", "nonscalar-backward", "not-differentiable", "invalid-gradient",
                 "inference-tensor-saved", "nonleaf-requires-grad", "ddp-unused-parameters", "ddp-ready-twice",
                 "missing-grad", "nan-gradient", "backward-error")

# What a diagnosis's second line (`Diagnosis.saved_line`) is, per kind: every output labels it
# with these words, next to "culprit". "saved" would be wrong for most: the backward that freed a
# graph saved nothing.
SECOND_LINE_LABELS = {
    "saved-tensor-modified": "saved",           # the op that saved the tensor the culprit changed
    "silent-data-mutation": "saved",
    "graph-freed": "freed by",                  # the backward call that freed the graph
    "nan-gradient": "in the backward",          # the backward call that made the NaN/Inf
    "accumulated-graph": "backward",            # the backward that ran the graph kept alive
    "view-inplace": "views made",               # the op that made the views (chunk, split, no_grad)
    "inference-tensor-saved": "saved by",       # the op that tried to save the inference tensor
    "nonleaf-requires-grad": "made",            # the op that made the tensor a non-leaf
    "nonscalar-backward": "backward",
    "not-differentiable": "backward",
    "invalid-gradient": "backward",
    "ddp-ready-twice": "backward",
    "backward-error": "backward",
}


@dataclass(frozen=True, slots=True)
class Location:
    filename: str
    line: int
    function: str = ""
    source: str = ""  # the stripped text of that line, "" when not available
    scope: int = 0    # the first line of the function's code: tells two functions of one name in one file apart

    def __str__(self) -> str:
        return "%s:%d" % (self.filename, self.line)


@dataclass(slots=True)
class TensorInfo:
    """What is known about one tensor seen in the block (never the tensor itself)."""
    tid: int
    shape: Tuple[int, ...]
    dtype: str
    device: str
    requires_grad: bool
    is_leaf: bool
    name: Optional[str] = None
    by_variable: bool = False            # its name is a variable of the user's that held it (a namespace's,
                                         # or a local where a backward ran), not a path or an assignment
    grad_fn: Optional[str] = None        # grad_fn name when first seen
    created_by: Optional[int] = None     # index of the op that produced it
    base: Optional[int] = None           # tid of the tensor it is a view of
    data_alias_of: Optional[int] = None  # tid of the tensor whose `.data` this is (own version counter)
    versions: List[Tuple[int, int]] = field(default_factory=list)  # (op index, version after that op)
    alive: bool = False                  # still referenced by the user when the block ended
    node: Optional[int] = None           # key of its grad_fn node at the end of the block
    version: Optional[int] = None        # its version counter at the end of the block
    grad: Optional[str] = None           # summary of .grad at the end of the block
    first_requires_grad: bool = False    # requires_grad when first seen (made, or first used)
    owner: Optional[str] = None          # for a parameter: the outermost module called in the block that holds it
    optimized: bool = False              # a parameter of an optimizer that stepped in the block
    is_parameter: bool = False           # an nn.Parameter
    stepped_with_grad: bool = False      # ... and that step found a gradient in its `.grad`
    nonfinite_after: Optional[int] = None  # the first backward call after which its gradient held NaN/Inf
    elements: Optional[int] = None       # elements it holds at the end of the block, if alive (0: sharded away)
    # (backward op index, L2 norm of its .grad right after that call) for each checked backward
    # call that reached this leaf (calls 1, 2, 4, 8, ... and the last: see Trace.grad_stats)
    grad_norms: List[Tuple[int, float]] = field(default_factory=list)
    norm: Optional[float] = None         # for a leaf with grad_norms: its own L2 norm at the end of the block

    @property
    def label(self) -> str:
        return self.name or "tensor#%d" % self.tid


@dataclass(slots=True)
class OpRecord:
    index: int
    name: str                            # user-facing name: torch.matmul, Tensor.add_, F.relu, ...
    location: Optional[Location]
    inputs: Tuple[int, ...] = ()
    outputs: Tuple[int, ...] = ()
    writes: Tuple[int, ...] = ()         # inputs whose version counter moved during the op (or, for
                                         # DATA_SWAP, whose memory was swapped)
    versions_before: Tuple[int, ...] = ()
    versions_after: Tuple[int, ...] = ()
    write_ranges: Tuple[Tuple[int, int], ...] = ()  # byte ranges written, one per entry of `writes`
    grad_enabled: bool = True
    node: Optional[int] = None           # key of the grad_fn node this op created
    error: Optional[str] = None          # "RuntimeError: ..." when the op raised
    out: Tuple[int, ...] = ()            # for a call that raised: the tensors it was given as `out=`
    is_backward: bool = False
    module: Tuple[str, ...] = ()         # the nn.Module forwards it ran in, outermost first


@dataclass(slots=True)
class ModuleCall:
    """A call of a module whose forward the user wrote (its ops run at the lines of that forward):
    the caller's line, the ops it ran and the tensors it returned."""
    location: Location                   # the line that called it (`fake = G(z)`)
    module: Tuple[str, ...]              # its module path, outermost first, as OpRecord.module
    first_op: int                        # index of its first op
    end_op: int                          # one past its last op
    outputs: Tuple[Optional[int], ...] = ()  # tids of what it returned (a tensor, or a tuple's elements)
    inputs: Tuple[int, ...] = ()         # tids of the tensors among its arguments (and in tuples of them)
    columns: Optional[Tuple[int, int]] = None  # (first, end) UTF-8 columns of the call on its line
    span: Optional[Tuple[int, int, int, int]] = None  # (first line, column, end line, column): over several lines


@dataclass(slots=True)
class SavedSlot:
    """One tensor a grad_fn node saved for backward, as seen at one checkpoint."""
    node: int
    slot: str                            # e.g. "self", "other", "result", "tensors[0]"
    tid: Optional[int]
    shape: Tuple[int, ...]
    dtype: str
    saved_version: Optional[int]
    current_version: Optional[int]
    stale: bool                          # PyTorch's own version check fails: backward will raise
    freed: bool                          # buffers already released by an earlier backward
    byte_range: Optional[Tuple[int, int]] = None
    is_output: bool = False
    hooked: bool = False                 # packed by a saved-tensor hook (checkpointing, save_on_cpu): not checked


@dataclass(slots=True)
class GraphNode:
    key: int
    name: str                            # MulBackward0, AccumulateGrad, ...
    created_by: Optional[int] = None     # op index
    inputs: List[int] = field(default_factory=list)  # keys of next_functions, in order
    saved: List[SavedSlot] = field(default_factory=list)
    variable: Optional[int] = None       # tid of the leaf, for AccumulateGrad
    consumed_by: List[int] = field(default_factory=list)  # op indices of backward calls that ran it


@dataclass(slots=True)
class Checkpoint:
    """The graph's saved tensors, inspected just before a backward call or at the block's end."""
    op_index: int                        # the backward op, or len(ops) for the end of the block
    kind: str                            # "backward" or "end"
    roots: List[int] = field(default_factory=list)
    slots: List[SavedSlot] = field(default_factory=list)
    inputs: List[int] = field(default_factory=list)  # node keys backward differentiates for (autograd.grad inputs)
    input_tids: List[int] = field(default_factory=list)  # the tensors behind those keys, in the call's order
    retain: bool = True                  # the backward call keeps the graph's buffers (retain_graph)


@dataclass(slots=True)
class Diagnosis:
    kind: str
    message: str
    fix: str
    filename: Optional[str] = None
    line: Optional[int] = None
    source: str = ""
    saved_line: Optional[int] = None
    saved_filename: Optional[str] = None
    saved_source: str = ""
    tensor: Optional[str] = None
    node: Optional[str] = None
    saved_version: Optional[int] = None
    current_version: Optional[int] = None
    op_index: Optional[int] = None       # the culprit op
    saved_op_index: Optional[int] = None
    node_key: Optional[int] = None
    tids: Tuple[int, ...] = ()
    predicted: bool = False              # made from the graph before any backward ran into it
    also: Tuple[str, ...] = ()           # other tensors the same write broke

    @property
    def saved_label(self) -> str:
        """What the second line is ("saved", "freed by", ...): see SECOND_LINE_LABELS."""
        return SECOND_LINE_LABELS.get(self.kind, "see also")

    @property
    def title(self) -> str:
        what = {"leaf-inplace": "In-place change of a leaf that requires grad",
                "saved-tensor-modified": "A tensor saved for backward was modified in place",
                "silent-data-mutation": "Silent gradient corruption through .data",
                "accumulated-graph": "Graphs accumulated across iterations",
                "graph-freed": "Backward through a graph that an earlier backward freed",
                "graph-cut": "The loss is cut off from everything that requires grad",
                "missing-grad": "A tensor you train gets no gradient",
                "nan-gradient": "NaN or Inf gradient from a finite forward pass",
                "view-inplace": "In-place change of a view that PyTorch forbids writing",
                "inference-tensor-saved": "A tensor made in inference mode is used by autograd",
                "nonleaf-requires-grad": "requires_grad set on a tensor that is not a leaf",
                "nonscalar-backward": "backward() from a tensor that is not a scalar",
                "not-differentiable": "An operation without a derivative is on the way to the loss",
                "invalid-gradient": "A custom autograd.Function returned a wrong gradient",
                "ddp-unused-parameters": "Parameters that DistributedDataParallel waited for got no gradient",
                "ddp-ready-twice": "DistributedDataParallel got a parameter's gradient twice",
                "backward-error": "backward() raised"}.get(self.kind, self.kind)
        if not self.tensor:
            return what
        return what + (" (%s)" if is_description(self.tensor) else " (`%s`)") % self.tensor


def is_description(label: str) -> bool:
    """Whether a tensor's label is a description (Trace.tensor_label: "the float32 result of ...", "a
    float32 tensor of ..."), not a name the user's code has."""
    return label.startswith(("the ", "a ", "an "))


@dataclass(slots=True)
class DistributedModel:
    """A DistributedDataParallel module called in the block: the parameters its reducer waits for,
    in the order its errors count them ("Parameter indices which did not receive grad: 4 5")."""
    name: str                            # the user's name for the DDP module (`ddp`, `self.model`)
    module: str                          # how the user's code reaches the module it wraps (`model`, `ddp.module`)
    parameters: Tuple[int, ...] = ()     # tids, in the reducer's order
    parameter_names: Tuple[str, ...] = ()  # the same, dotted within the wrapped module (`aux_head.weight`)
    find_unused_parameters: bool = False
_IN_PROGRESS = object()  # Trace._pending while its build runs


@dataclass
class Trace:
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
    # With check_nan: {"backward": op index, "node": key, "name": node name, "facts": what its saved inputs held}
    nan_origin: Optional[Dict[str, Any]] = field(default_factory=lambda: None)

    # -- built on first use -------------------------------------------------------------------
    def _defer(self, build) -> None:
        """Drop the fields; `build()` makes them when one is first read (see capture.finish), once,
        whichever thread reads first: the others wait for it. A build cut off (Ctrl-C) leaves the
        trace as it was, to be built on the next read."""
        self.__dict__.clear()
        self.__dict__["_pending"] = build
        self.__dict__["_building"] = threading.RLock()

    def __getattr__(self, name):
        lock = self.__dict__.get("_building")
        if name.startswith("__"):
            raise AttributeError(name)
        if lock is None:  # built (perhaps by another thread since this read began), or never deferred
            return object.__getattribute__(self, name)
        with lock:
            pending = self.__dict__.get("_pending")
            if pending is not None:  # else another thread built it while this one waited
                if pending is _IN_PROGRESS:  # read by the build itself (this thread holds the lock)
                    raise AttributeError("%s: the trace is being built" % name)
                self.__dict__["_pending"] = _IN_PROGRESS
                try:
                    built = pending()
                except BaseException:
                    self.__dict__["_pending"] = pending
                    raise
                fields = built.__dict__
                self.__dict__.update(fields)
                for extra in [k for k in self.__dict__ if k not in fields]:
                    del self.__dict__[extra]  # _pending and _building: built, for good
        return object.__getattribute__(self, name)

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

    def summary(self) -> str:
        from .render.text import graph_summary
        return graph_summary(self)

    def report(self) -> str:
        from .render.text import text_report
        return text_report(self)

    def grad_stats(self) -> Dict[str, Any]:
        """Gradient health per parameter and per module, as plain data (JSON-ready).

        Read from the gradients the capture reads anyway after backward calls 1, 2, 4, 8, ... and
        the block's last ("the checked backward calls"), one pass each, and from each of those
        leaves' own norm when the block ended. Empty lists when no backward ran.

        {"steps": [{"op_index": int, "place": str}, ...],
            the checked backward calls, in order: the index of the backward op in `ops` and where it is
            ("train.py, line 14"). Every `norms` list below has one value per step.
         "parameters": [{...}, ...], one per leaf whose gradient was read, and per trainable
            parameter (of a module called in the block, or held by an optimizer) that got none:
            "name": the parameter's dotted name (`net.0.weight`) or the tensor's name or description,
            "module": the dotted name of the module that holds it (`net.0`), or None,
            "shape": list of int, "dtype": str ("float32"), "is_parameter": bool (an nn.Parameter),
            "norms": [float or None], the L2 norm of its .grad right after each step (None: that
                backward did not reach it; NaN or Inf: the gradient held one),
            "param_norm": float or None, the L2 norm of the tensor itself at the end of the block,
            "ratio": float or None, the last finite norm over param_norm (None when param_norm is 0,
                as for a bias initialised to zero: there is no own scale to judge it by),
            "change": float or None, the last finite norm over the first (None with fewer than two),
            "nonfinite_at": int or None, the first step (an index into steps) whose norm was NaN/Inf,
            "flags": list of str, any of
                "nan-or-inf": the gradient held NaN or Inf after some step;
                "never-updated": no step gave it a gradient, or only zeros;
                "vanishing": ratio below 2**-24 (an update at learning rate 1 is lost to float32
                    rounding), or more than 1000 times below the median ratio of the list;
                "exploding": ratio above 100 (an SGD step at learning rate 0.01 would move it by more
                    than its own size)},
         "modules": [{...}, ...], one per module that holds listed parameters, at every level of its
            path (`net.0` and `net`), sorted by name: "name", "cls" (its class name), "module" (the
            module that holds it, or None), "parameters" (the names of its listed parameters,
            nested ones included), "norms", "param_norm", "ratio", "change", "nonfinite_at" as
            above for all its parameters taken as one tensor (the root of the sum of their squared
            norms), and "flags": every flag of its parameters,
         "thresholds": {"vanishing_ratio": 2**-24, "vanishing_below_median": 1000.0,
                        "exploding_ratio": 100.0}}
        """
        from .grad_stats import grad_stats
        return grad_stats(self)

    def to_json(self) -> Dict[str, Any]:
        return {
            "ops": [asdict(op) for op in self.ops],
            "tensors": {str(k): asdict(v) for k, v in self.tensors.items()},
            "nodes": {str(k): asdict(v) for k, v in self.nodes.items()},
            "diagnoses": [asdict(d) for d in self.diagnoses],
            "roots": list(self.roots),
            "error": self.error,
            "warnings": list(self.warnings),
            "grad_stats": self.grad_stats(),
        }

    def show(self):
        """Display the interactive widget (in Jupyter) for this trace, with its static fallback."""
        from .widget import display_trace
        display_trace(self)

    def save_html(self, path):
        """Write one self-contained HTML file with the interactive view (no server, no kernel)."""
        from .widget import save_html
        return save_html(self, path)

    def _repr_mimebundle_(self, include=None, exclude=None):
        try:
            from .widget import AutogradWidget
            return AutogradWidget(self)._repr_mimebundle_(include=include, exclude=exclude)
        except ImportError:
            return {"text/plain": self.report()}

    def __repr__(self) -> str:
        kinds = ", ".join(d.kind for d in self.diagnoses) or "no problems"
        return "<Trace: %d ops, %d graph nodes, %s>" % (len(self.ops), len(self.nodes), kinds)


def node_id(key: int) -> str:
    return "fn%d" % key


def tensor_id(tid: int) -> str:
    return "t%d" % tid


def to_networkx(trace: Trace):
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

