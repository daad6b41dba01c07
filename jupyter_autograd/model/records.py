"""The plain records of one captured block: where code ran, the tensors, the ops, the module calls,
the autograd graph's nodes and saved tensors, the checkpoints taken before each backward call.

Nothing here imports torch, IPython or ipywidgets, nor any other part of the package.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

# The op name of `t.requires_grad = ...` (a property set, recorded as an op: it can freeze a parameter).
FREEZE_SETTER = "Tensor.requires_grad ="
# The op name of `t.data = new`: it swaps the memory behind `t` (recorded as a write of `t`, whose
# version counter does not move).
DATA_SWAP = "Tensor.data ="
# The op names of grad-mode switches (no_grad, set_grad_enabled and enable_grad call the first; entering
# and leaving inference mode is recorded as the second): ops with no tensors and the mode they left.
GRAD_MODE_SWITCHES = ("torch._C._set_grad_enabled", "torch.inference_mode")


@dataclass(frozen=True, slots=True)
class Location:
    filename: str
    line: int
    function: str = ""
    source: str = ""  # the stripped text of that line, "" when not available
    scope: int = 0    # the first line of the function's code: tells two functions of one name in one file apart

    def __str__(self) -> str:
        return "%s:%d" % (self.filename, self.line)

    @property
    def function_key(self) -> Tuple[str, str, int]:
        """The function this line is in: equal for two lines of one function, in any call of it."""
        return self.filename, self.function, self.scope


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
    # Tuples, not lists, here and below: a trace holds thousands of these records, and a tuple of ints
    # leaves the cyclic GC's care where a list stays in it (each full collection walks every list kept).
    versions: Tuple[Tuple[int, int], ...] = ()  # (op index, version after that op)
    alive: bool = False                  # still referenced by the user when the block ended
    node: Optional[int] = None           # key of its grad_fn node at the end of the block
    version: Optional[int] = None        # its version counter at the end of the block
    grad: Optional[str] = None           # summary of .grad at the end of the block
    first_requires_grad: bool = False    # requires_grad when first seen (made, or first used)
    owner: Optional[str] = None          # for a parameter: the outermost module called in the block that holds it
    optimized: bool = False              # a parameter of an optimizer that stepped in the block
    is_parameter: bool = False           # an nn.Parameter
    is_buffer: bool = False              # a buffer of a module called in the block (its name: the dotted path)
    stepped_with_grad: bool = False      # ... and that step found a gradient in its `.grad`
    nonfinite_after: Optional[int] = None  # the first backward call after which its gradient held NaN/Inf
    elements: Optional[int] = None       # elements it holds at the end of the block, if alive (0: sharded away)
    # (backward op index, L2 norm of its .grad right after that call) for each checked backward
    # call that reached this leaf (calls 1, 2, 4, 8, ... and the last: see Trace.grad_stats)
    grad_norms: Tuple[Tuple[int, float], ...] = ()
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
class CompiledCall:
    """A call of a torch.compile region recorded as the ops of its graph, at the lines inside it."""
    name: str                            # the compiled function's name (`f`, `Model.forward`)
    first_op: int                        # index of its first op
    end_op: int                          # one past its last op
    depth: int = 0                       # how many modules of its ops' paths were running at the call


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
    inputs: Tuple[int, ...] = ()         # keys of next_functions, in order (tuples: see TensorInfo.versions)
    saved: Tuple[SavedSlot, ...] = ()
    variable: Optional[int] = None       # tid of the leaf, for AccumulateGrad
    consumed_by: Tuple[int, ...] = ()    # op indices of backward calls that ran it


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
class DistributedModel:
    """A DistributedDataParallel module called in the block: the parameters its reducer waits for,
    in the order its errors count them ("Parameter indices which did not receive grad: 4 5")."""
    name: str                            # the user's name for the DDP module (`ddp`, `self.model`)
    module: str                          # how the user's code reaches the module it wraps (`model`, `ddp.module`)
    parameters: Tuple[int, ...] = ()     # tids, in the reducer's order
    parameter_names: Tuple[str, ...] = ()  # the same, dotted within the wrapped module (`aux_head.weight`)
    find_unused_parameters: bool = False
