"""The kinds of problem a diagnosis can be, the words each is known by, and the Diagnosis record."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

# By importance: silent problems and the in-place family first, then the errors that stop a
# training step, the floor for any other autograd error last.
PROBLEM_KINDS = ("leaf-inplace", "view-inplace", "saved-tensor-modified", "silent-data-mutation", "accumulated-graph",
                 "graph-freed", "graph-cut", "nonscalar-backward", "not-differentiable", "invalid-gradient",
                 "inference-tensor-saved", "nonleaf-requires-grad", "needs-grad", "grad-to-numpy", "nonleaf-copied",
                 "nonleaf-optimized", "not-a-parameter", "fp16-gradients", "transform-unsupported", "checkpoint-incompatible",
                 "ddp-unused-parameters", "ddp-ready-twice", "missing-grad", "nan-gradient", "backward-error")

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
    "grad-to-numpy": "history from",             # where the history of the tensor handed to NumPy began
    "needs-grad": "raised at",                   # the call that needed a gradient (register_hook, autograd.grad)
    "nonleaf-copied": "copied at",               # the deepcopy that met the tensor
    "nonleaf-optimized": "optimizer built",      # the optimizer handed the tensor
    "not-a-parameter": "parameter made",         # where the class makes the attribute an nn.Parameter
    "fp16-gradients": "raised at",               # the GradScaler call
    "transform-unsupported": "raised at",
    "checkpoint-incompatible": "raised at",      # the .grad() or backward(inputs=...) that met it
}


# The words of PyTorch's own error that each kind explains: a note goes on an exception only when
# the diagnosis is about that very error, never on an unrelated one (a NameError, a shape mismatch).
EXPLAINS = {
    "leaf-inplace": ("leaf Variable that requires grad", "out=... arguments don't support automatic differentiation"),
    "saved-tensor-modified": ("modified by an inplace operation",),
    "graph-freed": ("backward through the graph a second time", "saved tensors after they have already been freed"),
    "graph-cut": ("does not require grad and does not have a grad_fn",),
    "missing-grad": ("not have been used in the graph",),
    "nan-gradient": ("returned nan values", "returned inf values"),
    "view-inplace": ("is a view and is being modified inplace", "is being modified inplace with grad mode enabled",
                     "is being modified inplace in normal mode", "Inplace update to inference tensor outside"),
    "inference-tensor-saved": ("Inference tensors cannot be saved for backward",),
    "nonleaf-requires-grad": ("you can only change requires_grad flags of leaf variables",),
    "nonscalar-backward": ("grad can be implicitly created only for scalar outputs",),
    "not-differentiable": ("derivative for",),
    "invalid-gradient": ("returned an invalid gradient at index", "returned an incorrect number of gradients",
                         "returned a gradient different than None at position"),
    "ddp-unused-parameters": ("Expected to have finished reduction in the prior iteration",),
    "ddp-ready-twice": ("Expected to mark a variable ready only once",),
    # The errors about a property of a tensor or a call (diagnose/rules/causes.py reads the property from these).
    "grad-to-numpy": ("Can't call numpy() on Tensor that requires grad",),
    "needs-grad": ("One of the differentiated Tensors does not require grad", "of the input tensors does not require grad",
                   "cannot register a hook on a tensor that doesn't require gradient",
                   "can't retain_grad on Tensor that has requires_grad=False"),
    "nonleaf-copied": ("Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol",),
    "nonleaf-optimized": ("can't optimize a non-leaf Tensor",),
    "not-a-parameter": ("(torch.nn.Parameter or None expected)", "(torch.nn.Parameter or None required)"),
    "fp16-gradients": ("Attempting to unscale FP16 gradients",),
    "transform-unsupported": ("it must override the setup_context staticmethod",),
    "checkpoint-incompatible": ("torch.utils.checkpoint is incompatible with .grad()",
                                "Checkpointing is not compatible with .grad()"),
    # The floor has no words of its own: it explains the very error it quotes (see exception_note).
    "backward-error": (),
}



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
                "nan-gradient": "NaN or Inf gradient",
                "view-inplace": "In-place change of a view that PyTorch forbids writing",
                "inference-tensor-saved": "A tensor made in inference mode is used by autograd",
                "nonleaf-requires-grad": "requires_grad set on a tensor that is not a leaf",
                "nonscalar-backward": "backward() from a tensor that is not a scalar",
                "not-differentiable": "An operation without a derivative is on the way to the loss",
                "invalid-gradient": "A custom autograd.Function returned a wrong gradient",
                "ddp-unused-parameters": "Parameters that DistributedDataParallel waited for got no gradient",
                "ddp-ready-twice": "DistributedDataParallel got a parameter's gradient twice",
                "grad-to-numpy": "NumPy was handed a tensor that requires grad",
                "needs-grad": "A gradient is needed of a tensor that does not require grad",
                "nonleaf-copied": "copy.deepcopy met a tensor with a history",
                "nonleaf-optimized": "An optimizer was handed a tensor that is not a leaf",
                "not-a-parameter": "A module's parameter was assigned a plain tensor",
                "fp16-gradients": "GradScaler met float16 gradients",
                "transform-unsupported": "An autograd.Function without setup_context under torch.func",
                "checkpoint-incompatible": "Reentrant checkpointing met .grad() or backward(inputs=...)",
                "backward-error": "backward() raised"}.get(self.kind, self.kind)
        if not self.tensor:
            return what
        return what + (" (%s)" if is_description(self.tensor) else " (`%s`)") % self.tensor


def is_description(label: str) -> bool:
    """Whether a tensor's label is a description (Trace.tensor_label: "the float32 result of ...", "a
    float32 tensor of ..."), not a name the user's code has."""
    return label.startswith(("the ", "a ", "an "))
