"""Errors PyTorch raises at a forward op, whose message names no line of the user's: view-inplace (an
in-place write to a view it forbids changing), inference-tensor-saved (an op that records a graph
must save an inference tensor), nonleaf-requires-grad (requires_grad set on a tensor with a history).
Each starts from the error kept on the op record that raised it.

Reasons: `view-write`, `inference-saved`, `nonleaf-flag`."""
from __future__ import annotations

import ast
import re
from typing import List, Optional, Tuple

from ...model import OpRecord, TraceData
from ...source.index import parse_statement
from ..findings import Finding, Words
from ..fixes import describe_write, inference_tensor_fix, line_ref, nonleaf_requires_grad_fix, view_write_fix, where
from ..wording import words
from .common import label, maker, op_words, output_of, raised, shown

# The words of each error (also in model/kinds.py's EXPLAINS, for the exception's note).
_MULTIPLE_VIEWS = "This view is the output of a function that returns multiple views"
_VIEW_IN_MODE = re.compile(r"A view was created in (no_grad|inference) mode and is being modified inplace")
_VIEW_WRITE = re.compile(r"is a view and is being modified inplace|A view was created in \w+ mode and is being "
                         r"modified inplace|Inplace update to inference tensor outside InferenceMode")
_INFERENCE_SAVED = "Inference tensors cannot be saved for backward"
_NONLEAF_FLAG = "you can only change requires_grad flags of leaf variables"


# -- view-inplace ---------------------------------------------------------------------------------

def view_inplace(trace: TraceData, source) -> List[Finding]:
    """An in-place write PyTorch refuses: to one of several views a function returned (chunk, split,
    unbind), to a view taken under no_grad or inference mode with grad on, or to an inference
    tensor outside inference mode. Culprit: the write; saved: the line that made the view."""
    out = []
    for op in trace.ops:
        if op.is_backward or not op.error or not _VIEW_WRITE.search(op.error):
            continue
        written = _written_view(trace, op)
        made, how = _view_origin(trace, written, op.error)
        element = _element_name(made, written)
        out.append(Finding("view-inplace", "view-write", op=op, saved=made, subject=None if element else written,
                           tids=tuple(t for t in (written,) if t is not None),
                           facts={"how": how, "element": element, "written": written}))
    return out


@words("view-write")
def _view_write(trace: TraceData, f: Finding) -> Words:
    op, made, how, written = f.op, f.saved, f.facts["how"], f.facts["written"]
    name = f.facts["element"] or label(trace, written)
    info = trace.tensors.get(written) if written is not None else None
    # Only a name the user's code has: the memory a view shares may belong to a tensor made inside an op.
    base = trace.tensors[info.base].name if info is not None and info.base in trace.tensors else None
    said = shown(name) if name else "the tensor it writes"
    made_at = " on %s" % line_ref(made) if made is not None else ""
    if how == "views":
        what = ("%s is one of the views that %s returned%s: they all share memory with %s, and PyTorch "
                "forbids changing such a view in place, because autograd cannot rewrite the gradient of an "
                "operation that returned several views when one of them changes"
                % (said, op_words(made) if made is not None else "a function", made_at,
                   shown(base) if base else "the tensor they were taken from"))
    elif how == "inference tensor":
        what = ("%s was made under `torch.inference_mode()`%s: it is an inference tensor, which cannot be "
                "changed in place outside inference mode" % (said, made_at))
    else:
        mode = "torch.no_grad()" if how == "no_grad" else "torch.inference_mode()"
        what = ("%s is a view taken under `%s`%s and changed in place with grad on: PyTorch cannot tell "
                "whether that write should be part of the graph, so it forbids it" % (said, mode, made_at))
    message = "%s. %s changes it in place with %s. PyTorch raised: \"%s\"" % (
        what, where(op), describe_write(op), raised(op.error))
    fix = view_write_fix(op.location.source if op.location else "", name, base, how)
    return Words(message, fix, name)


def _element_name(made: Optional[OpRecord], tid: Optional[int]) -> Optional[str]:
    """`parts[0]` for the first view of `parts = list(torch.split(h, 2))`: a line that gives one name
    to the several views an op returned names the sequence that holds them, in their order."""
    if made is None or len(made.outputs) < 2 or tid not in made.outputs or made.location is None:
        return None
    tree = parse_statement(made.location.source)
    stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0],
                                                                              (ast.Name, ast.Attribute)):
        return "%s[%d]" % (ast.unparse(stmt.targets[0]), made.outputs.index(tid))
    return None


def _written_view(trace: TraceData, op: OpRecord) -> Optional[int]:
    """The input the refused write went to: a view, or an inference tensor (no version counter)."""
    for tid, version in zip(op.inputs, op.versions_before or (0,) * len(op.inputs)):
        info = trace.tensors.get(tid)
        if info is not None and (info.base is not None or version is None):
            return tid
    return op.inputs[0] if op.inputs else None


def _view_origin(trace: TraceData, tid: Optional[int], error: str) -> Tuple[Optional[OpRecord], str]:
    """(the op that made the view the error is about, how: "views", "no_grad", "inference" or
    "inference tensor"), walking up from the written tensor through the ops that took views of
    views: the op that returned several views, or the one run without grad."""
    mode = _VIEW_IN_MODE.search(error)
    how = "views" if _MULTIPLE_VIEWS in error else mode.group(1) if mode else "inference tensor"
    first = current = maker(trace, tid)
    seen = set()
    while current is not None and current.index not in seen:
        seen.add(current.index)
        if (how == "views" and len(current.outputs) > 1) or (how != "views" and not current.grad_enabled):
            return current, how
        source = current.inputs[0] if current.inputs else None
        info = trace.tensors.get(source) if source is not None else None
        if info is None or (info.base is None and how == "views"):
            break
        current = maker(trace, source)
    return first, how


# -- inference-tensor-saved -----------------------------------------------------------------------

def inference_tensor_saved(trace: TraceData, source) -> List[Finding]:
    """An op that records a graph tried to save an inference tensor. Culprit: the line that made it
    under inference mode; saved: the op that tried to save it."""
    out = []
    for op in trace.ops:
        if op.is_backward or not op.error or _INFERENCE_SAVED not in op.error:
            continue
        used = next((t for t, v in zip(op.inputs, op.versions_before) if v is None), None)
        origin = _inference_origin(trace, used)
        tensor = output_of(origin) if origin is not None else used
        out.append(Finding("inference-tensor-saved", "inference-saved", op=origin if origin is not None else op,
                           saved=op if origin is not None else None, subject=tensor,
                           tids=tuple(t for t in (tensor, used) if t is not None),
                           facts={"origin": origin, "saving": op}))
    return out


@words("inference-saved")
def _inference_saved(trace: TraceData, f: Finding) -> Words:
    origin, op, tensor = f.facts["origin"], f.facts["saving"], f.subject
    name = label(trace, tensor)
    if origin is None:
        what = ("%s is an inference tensor (made under `torch.inference_mode()`, before this block or where it "
                "was not recorded)" % (shown(name) if name else "An input of this operation"))
    else:
        what = ("%s ran under `torch.inference_mode()`, so %s is an inference tensor: it has no version counter "
                "and can never be part of a graph" % (where(origin), shown(name) if name else "its result"))
    message = ("%s. %s then uses it in an operation that records the graph (a parameter or an input that "
               "requires grad), and that operation has to save it for backward. PyTorch raised: \"%s\""
               % (what, where(op), raised(op.error)))
    return Words(message, inference_tensor_fix(name), name)


def _inference_origin(trace: TraceData, tid: Optional[int]) -> Optional[OpRecord]:
    """The op that ran under inference mode (grad off) and made the inference tensor `tid`, through
    the ops outside it that took views of it or computed from it without a graph."""
    current, seen = maker(trace, tid), set()
    while current is not None and current.index not in seen:
        seen.add(current.index)
        if not current.grad_enabled:
            return current
        inference = next((t for t, v in zip(current.inputs, current.versions_before) if v is None), None)
        if inference is None:
            return None
        current = maker(trace, inference)
    return None


# -- nonleaf-requires-grad ------------------------------------------------------------------------

def nonleaf_requires_grad(trace: TraceData, source) -> List[Finding]:
    """`x.requires_grad = ...` or `x.requires_grad_(False)` on a tensor with a history. Culprit: that
    line; saved: the op that made the tensor (and so made it a non-leaf)."""
    out = []
    for op in trace.ops:
        if op.is_backward or not op.error or _NONLEAF_FLAG not in op.error or not op.inputs:
            continue
        tid = op.inputs[0]
        name = label(trace, tid)
        # The same line setting the flag of other tensors without error, held by other names (a helper over a
        # model's parameters; not an earlier value of the name a loop rebinds).
        also_set = len({other.inputs[0] for other in trace.ops if other.location == op.location and other.inputs
                        and other.name == op.name and not other.error and other.inputs[0] != tid
                        and label(trace, other.inputs[0]) != name}) if op.location else 0
        out.append(Finding("nonleaf-requires-grad", "nonleaf-flag", op=op, saved=maker(trace, tid), subject=tid,
                           tids=(tid,), facts={"also_set": also_set}))
    return out


@words("nonleaf-flag")
def _nonleaf_flag(trace: TraceData, f: Finding) -> Words:
    op, made, tid = f.op, f.saved, f.subject
    name = label(trace, tid)
    node = trace.tensors[tid].grad_fn if tid in trace.tensors else None
    carried = (made is not None and made.location is not None and op.location is not None
               and made.location.filename == op.location.filename
               and made.location.function == op.location.function and made.location.line > op.location.line)
    history = ("the result of `%s` on %s%s" % (made.name, line_ref(made), ", in the previous iteration of the loop"
                                                if carried else "") if made is not None else "computed")
    message = ("`%s` is not a leaf: it is %s, so it already has a history%s and requires grad through it. Only "
               "a leaf's requires_grad can be set. %s sets it. PyTorch raised: \"%s\""
               % (name, history, " (grad_fn %s)" % node if node else "", where(op), raised(op.error)))
    fix = nonleaf_requires_grad_fix(op.location.source if op.location else "", name, f.facts["also_set"])
    return Words(message, fix, name)
