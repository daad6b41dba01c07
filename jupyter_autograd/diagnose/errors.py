"""The errors PyTorch raises whose message names an internal node, an index or nothing at all:
each rule starts from the error kept on the op record that raised it (or from the block's own
exception and the user's line it came out of) and turns it into the user's line, the user's name
and a fix.

view-inplace, inference-tensor-saved and nonleaf-requires-grad are raised by a forward op;
nonscalar-backward, not-differentiable, invalid-gradient and ddp-ready-twice by a backward call;
ddp-unused-parameters by the next forward of a DistributedDataParallel. `backward_error` is the
floor: any other error raised by backward(), autograd.grad() or an autograd check gets at least the
forward line of the node it names and the tensor's name.
"""
from __future__ import annotations

import ast
import re
from typing import Iterable, List, Optional, Tuple

from . import fixes
from .fixes import line_ref, where
from ..source.index import parse_statement
from ..model import Checkpoint, Diagnosis, DistributedModel, Location, OpRecord, TraceData, is_description
from ..model.queries import at_maker, engine_order, node_at

# The words of each error (also in render/text.py's EXPLAINS, for the exception's note).
_MULTIPLE_VIEWS = "This view is the output of a function that returns multiple views"
_VIEW_IN_MODE = re.compile(r"A view was created in (no_grad|inference) mode and is being modified inplace")
_INFERENCE_WRITE = "Inplace update to inference tensor outside InferenceMode"
_VIEW_WRITE = re.compile(r"is a view and is being modified inplace|A view was created in \w+ mode and is being "
                         r"modified inplace|Inplace update to inference tensor outside InferenceMode")
_INFERENCE_SAVED = "Inference tensors cannot be saved for backward"
_NONLEAF_FLAG = "you can only change requires_grad flags of leaf variables"
_NONSCALAR = "grad can be implicitly created only for scalar outputs"
# `_unique2`, `aten::floor_divide`, `igamma: input` (the derivative for one input only): the op's name.
_NO_DERIVATIVE = re.compile(r"derivative for '?(?:aten::)?([\w.]+?)(?:: \w+)?'? is not implemented")
_INVALID_GRADIENT = re.compile(r"[Ff]unction (\w+) returned (?:an invalid gradient at index (\d+)|an incorrect number "
                               r"of gradients \(expected (\d+), got (\d+)\)|a gradient different than None at "
                               r"position (\d+))")
_EXPECTED_SHAPE = re.compile(r"got \[([\d, ]*)\] but expected shape compatible with \[([\d, ]*)\]")
_UNFINISHED_REDUCTION = "Expected to have finished reduction in the prior iteration"
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank \d+: ([^\n]+)")
_READY_TWICE = "Expected to mark a variable ready only once"
_MARKED_TWICE = re.compile(r"Parameter at index (\d+)(?: with name ([\w.]+))? has been marked as ready twice")
# How PyTorch names a node in its messages: `MulBackward0`, `Function 'SqrtBackward0'`, `output 0 of Split`.
_NODE_NAMED = re.compile(r"\b(\w+Backward\d*)\b|output \d+ of (\w+)")
# How PyTorch names a hook whose return value it refused: by its `__name__`.
_HOOK_NAMED = re.compile(r"\bhook '([^']*)' (?:has|returned)")


def _diagnosis(kind: str, at: Optional[Location], message: str, fix: str, tensor: Optional[str] = None,
               tids: Iterable[Optional[int]] = (), op: Optional[OpRecord] = None) -> Diagnosis:
    return Diagnosis(kind=kind, message=message, fix=fix, filename=at.filename if at else None,
                     line=at.line if at else None, source=at.source if at else "", tensor=tensor,
                     op_index=op.index if op is not None else None, tids=tuple(t for t in tids if t is not None))


def _saved_at(diag: Diagnosis, op: Optional[OpRecord]) -> Diagnosis:
    if op is not None and op.location is not None:
        diag.saved_line, diag.saved_filename, diag.saved_source = (op.location.line, op.location.filename,
                                                                   op.location.source)
        diag.saved_op_index = op.index
    return diag


def _raised(error: str, whole: bool = False) -> str:
    """The words of the error as PyTorch wrote them: its first line, or of a long one (DDP's run to
    hundreds of words) its first sentence, unless the whole line is wanted."""
    line = error.split(": ", 1)[-1].split("\n")[0].strip()
    if whole or len(line) <= 240 or ". " not in line:
        return line
    return line[:line.index(". ") + 1]


def _shown(label: Optional[str]) -> str:
    """A label in backticks when it is a name the user's code has, as it is when it describes."""
    return "`%s`" % label if label and re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)*", label) else (label or "")


def _op_words(op: OpRecord, missing: str = "") -> str:
    """An op's name for a sentence: `torch.unique`; an op whose function has no name of its own (a
    dispatching wrapper) by PyTorch's internal name for it."""
    if "<" in op.name:
        return "PyTorch's `%s`" % missing if missing else "an operation"
    return "`%s`" % op.name


def _name(trace: TraceData, tid: Optional[int]) -> Optional[str]:
    return trace.tensor_label(tid) if tid is not None and tid in trace.tensors else None


def _made(trace: TraceData, tid: Optional[int]) -> Optional[OpRecord]:
    """The op that made a tensor, at its own line: the innermost line of the user's, where a fix goes."""
    info = trace.tensors.get(tid) if tid is not None else None
    if info is None or info.created_by is None or info.created_by >= len(trace.ops):
        return None
    return trace.ops[info.created_by]


def _maker(trace: TraceData, tid: Optional[int]) -> Optional[OpRecord]:
    """The op that made a tensor, at the line that called the user-written module which returned it."""
    return at_maker(trace, tid, _made(trace, tid))


def _checkpoint_of(trace: TraceData, op: OpRecord) -> Optional[Checkpoint]:
    return next((cp for cp in trace.checkpoints if cp.kind == "backward" and cp.op_index == op.index), None)


def _nodes_run(trace: TraceData, op: OpRecord) -> List[int]:
    """The nodes the backward call `op` runs, in the engine's order ([] when it was not walked)."""
    cp = _checkpoint_of(trace, op)
    return engine_order(trace, cp) if cp is not None else []


def _plain_node_name(name: str) -> str:
    """`Unique2Backward0`, `_unique2` and `Unique2` alike: how PyTorch's messages and nodes spell an op."""
    return re.sub(r"Backward\d*$", "", name).replace("_", "").lower()


def _node_made(trace: TraceData, key: Optional[int]) -> Optional[OpRecord]:
    node = trace.nodes.get(key) if key is not None else None
    if node is None or node.created_by is None or node.created_by >= len(trace.ops):
        return None
    return trace.ops[node.created_by]


def _output_of(trace: TraceData, op: Optional[OpRecord]) -> Optional[int]:
    return op.outputs[0] if op is not None and op.outputs else None


# -- view-inplace ---------------------------------------------------------------------------------

def view_inplace(trace: TraceData) -> List[Diagnosis]:
    """An in-place write PyTorch refuses: to one of several views a function returned (chunk, split,
    unbind), to a view taken under no_grad or inference mode with grad on, or to an inference
    tensor outside inference mode. Culprit: the write; saved: the line that made the view."""
    out = []
    for op in trace.ops:
        if op.is_backward or not op.error or not _VIEW_WRITE.search(op.error):
            continue
        written = _written_view(trace, op)
        made, how = _view_origin(trace, written, op.error)
        name = _element_name(made, written) or _name(trace, written)
        info = trace.tensors.get(written) if written is not None else None
        # Only a name the user's code has: the memory a view shares may belong to a tensor made inside an op.
        base = trace.tensors[info.base].name if info is not None and info.base in trace.tensors else None
        shown = _shown(name) if name else "the tensor it writes"
        made_at = " on %s" % line_ref(made) if made is not None else ""
        if how == "views":
            what = ("%s is one of the views that %s returned%s: they all share memory with %s, and PyTorch "
                    "forbids changing such a view in place, because autograd cannot rewrite the gradient of an "
                    "operation that returned several views when one of them changes"
                    % (shown, _op_words(made) if made is not None else "a function", made_at,
                       _shown(base) if base else "the tensor they were taken from"))
        elif how == "inference tensor":
            what = ("%s was made under `torch.inference_mode()`%s: it is an inference tensor, which cannot be "
                    "changed in place outside inference mode" % (shown, made_at))
        else:
            mode = "torch.no_grad()" if how == "no_grad" else "torch.inference_mode()"
            what = ("%s is a view taken under `%s`%s and changed in place with grad on: PyTorch cannot tell "
                    "whether that write should be part of the graph, so it forbids it" % (shown, mode, made_at))
        message = "%s. %s changes it in place with %s. PyTorch raised: \"%s\"" % (
            what, where(op), fixes.describe_write(op), _raised(op.error))
        fix = fixes.view_write_fix(op.location.source if op.location else "", name, base, how)
        diag = _diagnosis("view-inplace", op.location, message, fix, tensor=name, tids=(written,), op=op)
        out.append(_saved_at(diag, made))
    return out


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
    first = current = _maker(trace, tid)
    seen = set()
    while current is not None and current.index not in seen:
        seen.add(current.index)
        if (how == "views" and len(current.outputs) > 1) or (how != "views" and not current.grad_enabled):
            return current, how
        source = current.inputs[0] if current.inputs else None
        info = trace.tensors.get(source) if source is not None else None
        if info is None or (info.base is None and how == "views"):
            break
        current = _maker(trace, source)
    return first, how


# -- inference-tensor-saved -----------------------------------------------------------------------

def inference_tensor_saved(trace: TraceData) -> List[Diagnosis]:
    """An op that records a graph tried to save an inference tensor. Culprit: the line that made it
    under inference mode; saved: the op that tried to save it."""
    out = []
    for op in trace.ops:
        if op.is_backward or not op.error or _INFERENCE_SAVED not in op.error:
            continue
        used = next((t for t, v in zip(op.inputs, op.versions_before) if v is None), None)
        origin = _inference_origin(trace, used)
        tensor = _output_of(trace, origin) if origin is not None else used
        name = _name(trace, tensor) if tensor is not None else None
        if origin is None:
            what = ("%s is an inference tensor (made under `torch.inference_mode()`, before this block or where it "
                    "was not recorded)" % (_shown(name) if name else "An input of this operation"))
        else:
            what = ("%s ran under `torch.inference_mode()`, so %s is an inference tensor: it has no version counter "
                    "and can never be part of a graph" % (where(origin), _shown(name) if name else "its result"))
        message = ("%s. %s then uses it in an operation that records the graph (a parameter or an input that "
                   "requires grad), and that operation has to save it for backward. PyTorch raised: \"%s\""
                   % (what, where(op), _raised(op.error)))
        fix = fixes.inference_tensor_fix(name)
        culprit = origin if origin is not None else op
        diag = _diagnosis("inference-tensor-saved", culprit.location, message, fix, tensor=name,
                          tids=(tensor, used), op=culprit)
        out.append(_saved_at(diag, op) if origin is not None else diag)
    return out


def _inference_origin(trace: TraceData, tid: Optional[int]) -> Optional[OpRecord]:
    """The op that ran under inference mode (grad off) and made the inference tensor `tid`, through
    the ops outside it that took views of it or computed from it without a graph."""
    current, seen = _maker(trace, tid), set()
    while current is not None and current.index not in seen:
        seen.add(current.index)
        if not current.grad_enabled:
            return current
        inference = next((t for t, v in zip(current.inputs, current.versions_before) if v is None), None)
        if inference is None:
            return None
        current = _maker(trace, inference)
    return None


# -- nonleaf-requires-grad ------------------------------------------------------------------------

def nonleaf_requires_grad(trace: TraceData) -> List[Diagnosis]:
    """`x.requires_grad = ...` or `x.requires_grad_(False)` on a tensor with a history. Culprit: that
    line; saved: the op that made the tensor (and so made it a non-leaf)."""
    out = []
    for op in trace.ops:
        if op.is_backward or not op.error or _NONLEAF_FLAG not in op.error or not op.inputs:
            continue
        tid = op.inputs[0]
        name = _name(trace, tid)
        made = _maker(trace, tid)
        node = trace.tensors[tid].grad_fn if tid in trace.tensors else None
        carried = (made is not None and made.location is not None and op.location is not None
                   and made.location.filename == op.location.filename
                   and made.location.function == op.location.function and made.location.line > op.location.line)
        history = ("the result of `%s` on %s%s" % (made.name, line_ref(made), ", in the previous iteration of the loop"
                                                    if carried else "") if made is not None else "computed")
        message = ("`%s` is not a leaf: it is %s, so it already has a history%s and requires grad through it. Only "
                   "a leaf's requires_grad can be set. %s sets it. PyTorch raised: \"%s\""
                   % (name, history, " (grad_fn %s)" % node if node else "", where(op), _raised(op.error)))
        # The same line setting the flag of other tensors without error, held by other names (a helper over a
        # model's parameters; not an earlier value of the name a loop rebinds).
        also_set = len({other.inputs[0] for other in trace.ops if other.location == op.location and other.inputs
                        and other.name == op.name and not other.error and other.inputs[0] != tid
                        and _name(trace, other.inputs[0]) != name}) if op.location else 0
        fix = fixes.nonleaf_requires_grad_fix(op.location.source if op.location else "", name, also_set)
        diag = _diagnosis("nonleaf-requires-grad", op.location, message, fix, tensor=name, tids=(tid,), op=op)
        out.append(_saved_at(diag, made))
    return out


# -- nonscalar-backward ---------------------------------------------------------------------------

def nonscalar_backward(trace: TraceData) -> List[Diagnosis]:
    """backward() (or autograd.grad() without grad_outputs) from a tensor with more than one element.
    Culprit: the line that made it, where the reduction goes: its own line, also inside a module the
    user wrote (a loss module returning a value per sample); saved: the backward call."""
    out = []
    for op in trace.ops:
        if not op.is_backward or not op.error or _NONSCALAR not in op.error:
            continue
        root = next((t for t in op.inputs if t in trace.tensors and _numel(trace.tensors[t].shape) != 1), None)
        made = _made(trace, root)
        name = _name(trace, root)
        shape = trace.tensors[root].shape if root is not None else ()
        if name and is_description(name):  # says what made it, its line and its shape
            what = "%s%s, has %d values, not one" % (name[:1].upper(), name[1:], _numel(shape))
        else:
            what = "%s is a tensor of shape (%s), %d values, not a scalar" % (
                "%s, made on %s," % (_shown(name), line_ref(made)) if made is not None and name else
                _shown(name) if name else "The tensor", ", ".join(str(s) for s in shape), _numel(shape))
        message = ("%s: backward() has to start from one number (or be given a gradient for each value). %s calls "
                   "%s from it. PyTorch raised: \"%s\""
                   % (what, where(op), "torch.autograd.grad()" if op.name == "torch.autograd.grad" else "backward()",
                      _raised(op.error)))
        culprit = made if made is not None else op
        fix = fixes.nonscalar_fix(culprit.location.source if culprit.location else "", name,
                                  op.name == "torch.autograd.grad", line_ref(op))
        diag = _diagnosis("nonscalar-backward", culprit.location, message, fix, tensor=name, tids=(root,),
                          op=culprit)
        out.append(_saved_at(diag, op))
    return out


def _numel(shape) -> int:
    n = 1
    for size in shape:
        n *= size if isinstance(size, int) else 2  # a ragged size: more than one value
    return n


# -- not-differentiable ---------------------------------------------------------------------------

def not_differentiable(trace: TraceData) -> List[Diagnosis]:
    """An op whose derivative PyTorch does not implement, on the way to the loss. Culprit: the forward
    line that ran it (for the backward formula of an op, run by a backward with create_graph=True, the
    forward line of that op); saved: the backward call that met its node."""
    out = []
    for op in trace.ops:
        m = _NO_DERIVATIVE.search(op.error or "")
        if m is None:
            continue
        missing = m.group(1)
        made, key, through = (op, op.node, None) if not op.is_backward else _without_derivative(trace, op, missing)
        result = _output_of(trace, made)
        name = _name(trace, result)
        if through is not None:
            ran = ("%s runs %s, whose backward (`%s` to PyTorch) has no derivative itself. The backward on %s "
                   "ran it with create_graph=True, so that gradient is on the way to the tensor this backward "
                   "starts from, and a second-order gradient cannot go through it"
                   % (where(made), _op_words(made), missing, line_ref(through)))
            message = "%s. PyTorch raised: \"%s\"" % (ran, _raised(op.error))
            fix = fixes.second_order_fix(_op_words(made), line_ref(through))
        else:
            ran = ("%s runs %s" % (where(made), _op_words(made, missing))) if made is not None else \
                "An operation of the forward pass"
            known_as = [] if made is not None and "<" in made.name else ["`%s` to PyTorch" % missing]
            known_as += ["node %s" % trace.nodes[key].name] if key in trace.nodes else []
            message = ("%s, which has no derivative%s. Its result%s requires grad and is on the way "
                       "to the tensor backward starts from, so backward cannot go through it. PyTorch raised: \"%s\""
                       % (ran, " (%s)" % ", ".join(known_as) if known_as else "",
                          "" if not name else " (%s)" % name if is_description(name) else " " + _shown(name),
                          _raised(op.error)))
            inputs = [_name(trace, t) for t in made.inputs] if made is not None else []
            fix = fixes.not_differentiable_fix(_op_words(made, missing) if made is not None else "`%s`" % missing,
                                               name, next((n for n in inputs if n), None))
        culprit = made if made is not None else op
        diag = _diagnosis("not-differentiable", culprit.location, message, fix, tensor=name, tids=(result,),
                          op=culprit)
        if key in trace.nodes:
            diag.node_key, diag.node = key, trace.nodes[key].name
        out.append(_saved_at(diag, op) if op.is_backward else diag)
    return out


def _without_derivative(trace: TraceData, backward: OpRecord, missing: str):
    """(the forward op that made the node without a derivative which `backward` met, its node key, and
    the earlier backward call that ran that op's backward with create_graph=True when the missing
    derivative is of a backward formula), from the nodes `backward` runs. A node of the op's own name
    (`Unique2Backward0`: PyTorch declares its derivative not implemented) was made by its op. An op
    with no derivative formula at all gets a node `NotImplemented` without a sequence number: it is
    the grad_fn of an input of the op that made a node run before it, the input made with grad on
    whose op got no numbered node; or a backward that recorded a graph (create_graph=True) made it,
    while it ran the backward formula of a forward op: the node of that op's name."""
    order = _nodes_run(trace, backward)
    named = [k for k in order if _plain_node_name(trace.nodes[k].name) == _plain_node_name(missing)]
    if named:
        made, key = _node_made(trace, named[0]), named[0]
    else:
        unnumbered = {k for k in order if trace.nodes[k].name == "NotImplemented"}
        key = next(iter(unnumbered), None)
        # The roots first: backward runs them before anything else.
        makers = [_unnumbered_maker(trace, t) for t in backward.inputs[:1]]
        for parent in order:
            if unnumbered.intersection(trace.nodes[parent].inputs):
                user = _node_made(trace, parent)
                if user is not None and user.is_backward:
                    makers.append(user)
                elif user is not None:
                    makers += [_unnumbered_maker(trace, t) for t in user.inputs]
        made = next((m for m in makers if m is not None), None)
    if made is None or not made.is_backward:
        return made, key, None
    # Made by a backward that recorded a graph of its own: the missing derivative is that of the
    # backward formula (`_cdist_backward`) of a forward op whose node it ran (CdistBackward0).
    stem = re.sub(r"_backward$", "", missing)
    forward = next((k for k in _nodes_run(trace, made)
                    if stem != missing and _plain_node_name(trace.nodes[k].name) == _plain_node_name(stem)), None)
    return (_node_made(trace, forward), forward, made) if forward is not None else (made, key, None)


def _unnumbered_maker(trace: TraceData, tid: int) -> Optional[OpRecord]:
    """The forward op that made tensor `tid` with grad on and gave it a grad_fn without a sequence
    number (it requires grad and is no leaf, yet its op made no numbered node), if one did."""
    info = trace.tensors.get(tid)
    if info is None or info.is_leaf or not info.first_requires_grad or info.created_by is None \
            or info.created_by >= len(trace.ops):
        return None
    maker = trace.ops[info.created_by]
    if maker.is_backward or maker.node is not None or tid in maker.inputs or not maker.grad_enabled:
        return None
    return maker


# -- invalid-gradient -----------------------------------------------------------------------------

def invalid_gradient(trace: TraceData) -> List[Diagnosis]:
    """A custom autograd.Function whose backward returned a gradient of the wrong shape, or the wrong
    number of them. Culprit: the forward line that applied it; saved: the backward call."""
    out = []
    for op in trace.ops:
        m = _INVALID_GRADIENT.search(op.error or "") if op.is_backward else None
        if m is None:
            continue
        node_name = m.group(1)
        key = next((k for k in _nodes_run(trace, op) if trace.nodes[k].name == node_name), None)
        applied = _node_made(trace, key)
        function = applied.name[:-len(".apply")] if applied is not None and applied.name.endswith(".apply") else \
            re.sub(r"Backward$", "", node_name)
        shapes = _EXPECTED_SHAPE.search(op.error)
        if m.group(2) is not None:
            index = int(m.group(2))
            got, expected = (tuple(_sizes(shapes.group(1))), tuple(_sizes(shapes.group(2)))) if shapes else (None, None)
            tensor = _input_at(trace, applied, index, expected)
            name = _name(trace, tensor)
            what = ("`%s.backward` returned, for input %d of `%s.forward`%s, a gradient of shape %s, where that input "
                    "has shape %s" % (function, index, function, " (%s)" % _shown(name) if name else "",
                                      _shape_text(got), _shape_text(expected))) if shapes else (
                "`%s.backward` returned an invalid gradient for input %d of `%s.forward`%s"
                % (function, index, function, " (%s)" % _shown(name) if name else ""))
        elif m.group(5) is not None:
            tensor = _output_of(trace, applied)
            name = _name(trace, tensor)
            what = ("`%s.backward` returned a gradient for argument %s of `%s.forward` (after ctx), which is not a "
                    "tensor: the gradient of an argument that is not a tensor must be None" % (function, m.group(5),
                                                                                                function))
        else:
            tensor = _output_of(trace, applied)
            name = _name(trace, tensor)
            what = ("`%s.backward` returned %s values, but `%s.forward` takes %s inputs after ctx: backward must "
                    "return one gradient per input" % (function, m.group(4), function, m.group(3)))
        message = ("%s. %s applied `%s`; the backward on %s ran its backward and PyTorch checked what it returned. "
                   "PyTorch raised: \"%s\"" % (what, where(applied) if applied is not None else "The forward pass",
                                               function, line_ref(op), _raised(op.error)))
        fix = fixes.invalid_gradient_fix(function, m.group(2) is not None)
        culprit = applied if applied is not None else op
        diag = _diagnosis("invalid-gradient", culprit.location, message, fix, tensor=name, tids=(tensor,),
                          op=culprit)
        if key is not None:
            diag.node_key, diag.node = key, node_name
        out.append(_saved_at(diag, op))
    return out


def _sizes(text: str) -> List[int]:
    return [int(s) for s in text.replace(" ", "").split(",") if s]


def _shape_text(shape) -> str:
    return "(%s)" % ", ".join(str(s) for s in shape) if shape else "() (a scalar)"


def _input_at(trace: TraceData, applied: Optional[OpRecord], index: int, expected) -> Optional[int]:
    """The tensor argument the Function's input `index` is: that position among its tensors when the
    shape agrees (arguments that are not tensors are not recorded), else the only one of that shape."""
    if applied is None:
        return None
    inputs = list(applied.inputs)
    if index < len(inputs) and (expected is None or tuple(trace.tensors[inputs[index]].shape) == expected):
        return inputs[index]
    same = [t for t in inputs if expected is not None and tuple(trace.tensors[t].shape) == expected]
    return same[0] if len(same) == 1 else None


# -- DistributedDataParallel ----------------------------------------------------------------------

def ddp_unused_parameters(trace: TraceData) -> List[Diagnosis]:
    """DDP without find_unused_parameters, and parameters that got no gradient in an iteration: its
    reduction never finished, and the next forward raised. Culprit: that forward's line; tensor: the
    first such parameter, as the user's code reaches it."""
    error = trace.error or ""
    if _UNFINISHED_REDUCTION not in error or not trace.distributed:
        return []
    indices = _UNUSED_INDICES.search(error)
    named = _UNUSED_NAMES.search(error)
    model, tids = _ddp_parameters(trace.distributed, [int(i) for i in indices.group(1).split()] if indices else [],
                                  [n.strip() for n in named.group(1).split(",")] if named else [])
    if model is None or not tids:
        return []
    names = [trace.tensor_label(t) for t in tids]
    why = _why_no_gradient(trace, model, tids[0])
    at = trace.error_location
    message = ("`%s` is wrapped in DistributedDataParallel (`%s`) without find_unused_parameters, so in every "
               "iteration DDP waits for a gradient for each of its parameters before it can finish reducing them "
               "across processes. In the last iteration %s got none: %s. DDP never finished that iteration, and the "
               "next forward%s raised: \"%s\"" % (model.module, model.name, _listing(names), why,
                                                   " (line %d)" % at.line if at else "", _raised(error)))
    fix = fixes.ddp_unused_fix(model.module, names, why)
    diag = _diagnosis("ddp-unused-parameters", at, message, fix, tensor=names[0], tids=tids)
    diag.also = tuple(names[1:])
    return [diag]


def _ddp_parameters(models: List[DistributedModel], indices: List[int], names: List[str]):
    """(the DDP model, the tids) that an error's indices or names point to; (None, []) if none fits."""
    for model in models:
        # By index first: in the reducer's order, the model's (the names come in another).
        if indices and all(i < len(model.parameters) for i in indices) and not (
                names and not all(n in model.parameter_names for n in names)):
            return model, [model.parameters[i] for i in indices]
        if names and all(n in model.parameter_names for n in names):
            return model, [model.parameters[model.parameter_names.index(n)] for n in names]
    return None, []


def _why_no_gradient(trace: TraceData, model: DistributedModel, tid: int) -> str:
    """Why a parameter of a DDP model got no gradient in the last iteration, from the ops of its forward."""
    inside = model.parameter_names[model.parameters.index(tid)]
    owner = inside.rpartition(".")[0]
    # The last iteration: the forward before the last backward call, after the one before it.
    backward = [op.index for op in trace.ops if op.is_backward]
    since, until = (backward[-2] if len(backward) > 1 else -1), (backward[-1] if backward else len(trace.ops))
    forward = [op for op in trace.ops[since + 1:until] if op.module and op.module[0] == model.name]
    uses = [op for op in forward if tid in op.inputs]
    shown = _shown(trace.tensor_label(tid))
    if not uses:
        owner_ran = owner and any(len(op.module) > 1 and "%s.%s" % (op.module[1], owner) in op.module
                                  for op in forward)
        if owner and not owner_ran:
            return "`%s.%s`, the module that holds %s, was never called in the forward pass" % (
                model.module, owner, shown)
        return "%s was never used in the forward pass" % shown
    if not any(op.grad_enabled for op in uses):
        return "%s was used only without recording a graph (under no_grad), on %s" % (shown, line_ref(uses[-1]))
    return ("%s was used on %s, but what it computed never reached the tensor backward ran from (an output the "
            "loss leaves out, or a path cut on the way)" % (shown, line_ref(uses[-1])))


def ddp_ready_twice(trace: TraceData) -> List[Diagnosis]:
    """DDP's hook for one parameter fired twice in a backward: a reentrant backward (checkpointing
    with use_reentrant=True) ran it again, with find_unused_parameters=True, or the parameter was used
    outside the DDP's forward. Culprit: the checkpoint call; saved: the backward call."""
    out = []
    for op in trace.ops:
        if not op.is_backward or not op.error or _READY_TWICE not in op.error:
            continue
        m = _MARKED_TWICE.search(op.error)
        model, tids = (None, [])
        if m is not None:
            model, tids = _ddp_parameters(trace.distributed, [] if m.group(2) else [int(m.group(1))],
                                          [m.group(2)] if m.group(2) else [])
        tid = tids[0] if tids else None
        name = trace.tensor_label(tid) if tid is not None else (m.group(2) if m is not None else None)
        culprit, why = _ran_twice_by(trace, op, model, tid)
        message = ("%s. DistributedDataParallel%s counts each parameter's gradient once per backward; the backward "
                   "on %s delivered %s twice. PyTorch raised: \"%s\""
                   % (why, " (`%s`, find_unused_parameters=True)" % model.name if model is not None and
                      model.find_unused_parameters else "", line_ref(op), _shown(name) if name else "a parameter",
                      _raised(op.error)))
        fix = fixes.ddp_ready_twice_fix(culprit.location.source if culprit is not None and culprit.location else "",
                                        culprit is not None and culprit.name.endswith(".apply"))
        diag = _diagnosis("ddp-ready-twice", (culprit or op).location, message, fix, tensor=name, tids=(tid,),
                          op=culprit or op)
        out.append(_saved_at(diag, op) if culprit is not None else diag)
    return out


def _ran_twice_by(trace: TraceData, backward: OpRecord, model: Optional[DistributedModel], tid: Optional[int]):
    """(the op that made the backward deliver a parameter's gradient twice, why). A custom Function
    whose forward ran the parameter without a graph and whose backward runs one of its own
    (reentrant checkpointing): the first such Function applied after that use, on this backward's path.
    Else a use of the parameter outside the DDP's forward."""
    on_path = {trace.nodes[k].created_by for k in _nodes_run(trace, backward) if trace.nodes[k].created_by is not None}
    parameters = [tid] if tid is not None else list(model.parameters) if model is not None else []
    for index in sorted(on_path):
        applied = trace.ops[index]
        if not applied.name.endswith(".apply"):
            continue
        if any(not op.grad_enabled and any(t in op.inputs for t in parameters) for op in trace.ops[:index]):
            return applied, ("%s applies `%s`, which ran its part of the model without recording a graph and "
                             "recomputes it in a backward of its own (reentrant checkpointing). DDP, told that some "
                             "parameters may go unused, found no path to that part's parameters in the graph and "
                             "marked them ready; then the inner backward delivered their gradients again"
                             % (where(applied), applied.name[:-len(".apply")]))
    if tid is not None and model is not None:
        outside = [op for op in trace.ops[:backward.index] if tid in op.inputs and op.grad_enabled
                   and not op.is_backward and not (op.module and op.module[0] == model.name)]
        if outside:
            return outside[-1], ("%s uses %s outside the DDP module's forward, so its gradient arrives through a "
                                 "second path DDP does not expect"
                                 % (where(outside[-1]), _shown(trace.tensor_label(tid))))
    return None, "Some parameter's gradient was delivered twice in one backward"


def _listing(names: List[Optional[str]]) -> str:
    shown = [_shown(n) for n in names[:8] if n]
    return ", ".join(shown) + (" and %d more" % (len(names) - 8) if len(names) > 8 else "")


# -- the floor: any other error of backward or an autograd check ----------------------------------

def backward_error(trace: TraceData, found: List[Diagnosis], explains) -> List[Diagnosis]:
    """A backward call (or an autograd check such as gradcheck) that raised an error no other
    diagnosis explains. Culprit: the forward line of the node the error names; else the user's code
    that backward ran and that raised (a hook, a custom Function's backward); else the line that made
    the tensor backward started from. Saved: the backward call."""
    def explained(error: str) -> bool:
        return any(d.kind != "backward-error" and any(w in error for w in explains.get(d.kind, ())) for d in found)

    out = []
    failed = [op for op in trace.ops if op.is_backward and op.error]
    for op in failed:
        if not explained(op.error):
            out.append(_floor(trace, op))
    error, at = trace.error, trace.error_location
    if error and at is not None and not explained(error) and not any(op.error == error for op in failed) and any(
            op.is_backward and op.location is not None and (op.location.filename, op.location.line) ==
            (at.filename, at.line) for op in trace.ops):
        # An autograd check (gradcheck) raised at a line whose backward calls did not.
        message = ("%s ran backward passes to check gradients, and the check raised: \"%s\""
                   % ("Line %d (`%s`)" % (at.line, at.source) if at.source else "Line %d" % at.line,
                      _raised(error, whole=True)))
        out.append(_diagnosis("backward-error", at, message, fixes.backward_error_fix(None, at.line, None)))
    return out


def _floor(trace: TraceData, op: OpRecord) -> Diagnosis:
    order = _nodes_run(trace, op)
    key = None
    for m in _NODE_NAMED.finditer(op.error):
        wanted = _plain_node_name(m.group(1) or m.group(2))
        key = next((k for k in order if _plain_node_name(trace.nodes[k].name) == wanted), None)
        if key is not None:
            break
    at = trace.error_location
    raised_inside = (trace.error == op.error and at is not None and op.location is not None
                     and (at.filename, at.line) != (op.location.filename, op.location.line))
    root = op.inputs[0] if op.inputs else None
    named = _node_made(trace, key)
    hooked = _hooked(trace, op, order) if named is None and not raised_inside else None
    if named is not None:
        tensor = _output_of(trace, named)
        culprit, place = named, named.location
        how = ("the error names %s, the node made by %s, which computes %s" % (
            trace.nodes[key].name, line_ref(named), _shown(_name(trace, tensor)) if tensor is not None else
            "its result"))
    elif raised_inside:
        tensor, culprit, place = root, None, at
        how = ("it was raised by your code that backward ran, line %d in `%s()`%s: a hook or a custom Function's "
               "backward" % (at.line, at.function, " (`%s`)" % at.source if at.source else ""))
    elif hooked is not None:
        tensor, culprit, how = hooked
        place = culprit.location
    else:
        tensor = root
        culprit = _maker(trace, root)
        place = culprit.location if culprit is not None else op.location
        how = ("it started from %s%s" % (_shown(_name(trace, root)) if root is not None else "its outputs",
                                        ", made on %s" % line_ref(culprit) if culprit is not None else ""))
    message = "%s raised \"%s\": %s." % (where(op), _raised(op.error, whole=True), how)
    # The user's name, or none: a description would make a title of a sentence.
    name = trace.tensors[tensor].name if tensor in trace.tensors else None
    fix = fixes.backward_error_fix(name, place.line if place is not None else None, op.error,
                                   _HOOK_NAMED.search(op.error).group(1) if hooked is not None else None)
    diag = _diagnosis("backward-error", place, message, fix, tensor=name, tids=(tensor,), op=culprit or op)
    if key is not None:
        diag.node_key, diag.node = key, trace.nodes[key].name
    return _saved_at(diag, op)


def _hooked(trace: TraceData, backward: OpRecord, order: List[int]):
    """(the tensor, the op, how) for an error PyTorch raised about what a hook returned (`hook 'name'
    has changed the size of value`): the forward line that made the node the hook sits on, the node
    whose gradients it changed. A module's backward hook of that name sits on the node of what each
    call of the module returned (the first the backward ran); else the one tensor hook on a tensor
    this backward runs through (`h.register_hook(...)`: the hook's name is not recorded), at the line
    that made the tensor, or the line that registered it on a leaf. None when neither is certain."""
    m = _HOOK_NAMED.search(backward.error or "")
    if m is None:
        return None
    hook = m.group(1)
    position = {k: i for i, k in enumerate(order)}
    outputs = []
    for module, hooks in trace.backward_hooks.items():
        registered = [how for name, how in hooks if name == hook]
        if registered:
            outputs += [(position[made.node], made, module, registered[0]) for made in _call_results(trace, module)
                        if made.node in position]
    if outputs:
        _, made, module, how = min(outputs, key=lambda found: found[0])
        return _output_of(trace, made), made, (
            "`%s` (%s) has the backward hook `%s` (%s), which backward ran on the gradients of the node that "
            "%s made for what the call of `%s` returned, and what it returned does not fit them" % (
                module, trace.modules.get(module, "a module"), hook, how, line_ref(made), module))
    registrations = {}
    for op in trace.ops[:backward.index]:
        if op.name == "Tensor.register_hook" and op.inputs and op.location is not None:
            key = node_at(trace, op.inputs[0], op.index)
            if key in position:
                registrations.setdefault(key, (op, op.inputs[0]))
    if len(registrations) != 1:
        return None
    [(registration, tensor)] = registrations.values()
    made = _made(trace, tensor)
    culprit = made if made is not None and made.location is not None else registration
    shown = _shown(_name(trace, tensor)) or "its tensor"
    return tensor, culprit, (
        "the hook that %s registered on %s%s changed the gradient of %s, and what it returned does not fit it" % (
            line_ref(registration), shown, ", made on %s," % line_ref(made) if culprit is made else "", shown))


def _call_results(trace: TraceData, module: str) -> List[OpRecord]:
    """For each call of a module (a run of consecutive ops inside it), the last op that made a node:
    what the call returned."""
    out, last = [], None
    for op in trace.ops:
        if module in op.module:
            if op.node is not None and not op.is_backward:
                last = op
        elif last is not None:
            out.append(last)
            last = None
    return out + ([last] if last is not None else [])


def error_kinds(trace: TraceData) -> List[Diagnosis]:
    """Every rule of this module but the floor, which needs to know what the others explained."""
    return (view_inplace(trace) + inference_tensor_saved(trace) + nonleaf_requires_grad(trace)
            + nonscalar_backward(trace) + not_differentiable(trace) + invalid_gradient(trace)
            + ddp_unused_parameters(trace) + ddp_ready_twice(trace))
