"""missing-grad: a tensor the user trains gets no gradient.

Reasons: `moved-leaf` (`w = torch.randn(3, requires_grad=True).double()`: `w` is the move's result,
not the leaf), `unused-input` (autograd.grad asked for an input off the path to its outputs),
`replaced-parameter` (a parameter replaced after the optimizer was built), `cut-parameter` (a
parameter used in the forward whose path to the loss an op cut; one finding per cut, with the
other parameters it starves). Information that is not a problem (parameters unused by design,
frozen ones) goes to `trace.notes`."""
from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional

from ...model import Checkpoint, Location, OpRecord, TraceData
from ...model.queries import FunctionCalls, ancestors, engine_order, exit_before, first_use, is_exit, \
    made_from_values, stops_after
from ...source.alignment import Alignment
from ...source.rewrites import leaf_after_move, rebound_as_leaf, without_exit
from ..findings import Finding, Words
from ..fixes import NO_ONE_LINE_FIX, REPLACE, code, starved_fix, where
from ..wording import words
from .common import backward_checkpoints, first_line, in_backticks
from .cut_place import why_cut

_UNUSED_INPUT = re.compile(r"[Dd]ifferentiated Tensors? (?:at index (\d+) )?appears? to not have been used in the graph")
_MOVES = {"to", "cuda", "cpu", "double", "float", "half", "bfloat16", "type", "long", "int", "mps", "xpu"}
# Ops whose result the user takes for the tensor itself: moves, copies, and views that only reshape it.
_COPIES = _MOVES | {"clone", "contiguous", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten",
                    "squeeze", "unsqueeze", "t", "transpose", "permute"}


def missing_grad(trace: TraceData, source) -> List[Finding]:
    out = _moved_leaves(trace) + _unused_inputs(trace) + _replaced_parameters(trace, source)
    out += _cut_parameters(trace, {trace.tensor_label(f.subject) for f in out if f.subject is not None}
                           | {f.facts["named"] for f in out if "named" in f.facts})
    return out


def _ran_backward(trace: TraceData) -> List[OpRecord]:
    return [op for op in trace.ops if op.is_backward and op.error is None]


# -- replaced-parameter -----------------------------------------------------------------------------

def _replaced_parameters(trace: TraceData, source: Alignment) -> List[Finding]:
    """A parameter an optimizer holds that its module no longer holds at the end, because another
    parameter, which the optimizer does not hold, took its place in the forward (the same operand of
    the same op: `self.mask = nn.Parameter(new)` after the optimizer was built): from then on the old
    one gets no gradient and the new one, which gets them, is never updated. Named at the assignment
    that replaced it, found in the source as the one that ran between the last use of the old
    parameter and the first of the new; else at that first use."""
    out = []
    runs = _ran_backward(trace)
    params = [info for info in trace.tensors.values() if info.is_leaf and info.is_parameter]
    for old in params:
        if not old.optimized or old.owner is not None:
            continue
        uses = [op for op in trace.ops if old.tid in op.inputs and op.module and op.grad_enabled and not op.is_backward]
        if not uses:
            continue
        last = uses[-1]
        place = (last.location, last.inputs.index(old.tid))
        new = next(((info, op) for info in params if not info.optimized and info.requires_grad
                    for op in trace.ops[last.index + 1:] if info.tid in op.inputs and op.module and op.grad_enabled
                    and (op.location, op.inputs.index(info.tid)) == place), None)
        if new is None or not any(run.index > new[1].index for run in runs):
            continue
        replacement, first = new
        named = replacement.name or old.name or trace.tensor_label(old.tid)
        at = _assignment_between(trace, source, named.rpartition(".")[2], last.index, first.index) or first.location
        subject = next((t for t in (old.tid, replacement.tid) if trace.tensor_label(t) == named), None)
        out.append(Finding("missing-grad", "replaced-parameter", op=first, at=at, subject=subject,
                           tids=(old.tid, replacement.tid), facts={"named": named}))
    return out


@words("replaced-parameter")
def _replaced(trace: TraceData, f: Finding) -> Words:
    old, replacement = (trace.tensors[t] for t in f.tids)
    named = replacement.name or old.name or trace.tensor_label(old.tid)
    message = (
        "`%s` was replaced by a new parameter at line %d, after the optimizer was built: the optimizer still "
        "holds the old one, which the forward no longer uses, so it gets no gradient from then on, and the new "
        "one, which gets the gradients, is in no optimizer and is never updated." % (named, f.at.line))
    fix = ("%s keep the parameter and change its values in place (`with torch.no_grad(): %s.copy_(new_values)`), "
           "or give the new parameter to the optimizer (`optimizer.add_param_group`, or build the optimizer again "
           "after replacing it)." % (NO_ONE_LINE_FIX, named))
    return Words(message, fix, named)


def _assignment_between(trace: TraceData, source: Alignment, attr: str, after: int, before: int) -> Optional[Location]:
    """The last statement assigning an attribute `attr` (`self.mask = ...`, `model.mask = ...`) in a
    function that ran ops between op indices `after` and `before`."""
    ran = {(op.location.filename, op.location.scope) for op in trace.ops[after + 1:before] if op.location}
    found = None
    for filename, tree in source.index.trees():
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = first_line(function)
            if (filename, first) not in ran:
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Attribute) and t.attr == attr for t in node.targets):
                    found = Location(filename, node.lineno, function.name, trace.sources[filename][node.lineno - 1].strip(),
                                     first)
    return found


# -- moved-leaf -------------------------------------------------------------------------------------

def _moved_leaves(trace: TraceData) -> List[Finding]:
    """`w = torch.randn(3, requires_grad=True).double()`: `w` is the move's result, not the leaf."""
    out = []
    runs = _ran_backward(trace)
    if not runs:
        return out
    last_use: Dict[int, int] = {}
    for rec in trace.ops:
        for t in rec.inputs:
            last_use[t] = rec.index
    for info in trace.tensors.values():
        if info.created_by is None or not info.name or info.is_leaf:
            continue
        found = _copied_from_lost_leaf(trace, info)
        if found is None:
            continue
        first, op = found
        after = [run.index for run in runs if run.index > op.index]
        # Kept to be trained: alive at the end, or used again after a backward (an object that held
        # it across the steps of a training function, gone by the end of the block).
        if not after or not (info.alive or last_use.get(info.tid, -1) > after[0]):
            continue
        rebound = trace.tensors[first.inputs[0]].name == info.name
        out.append(Finding("missing-grad", "moved-leaf", op=first, subject=info.tid, tids=(info.tid, first.inputs[0]),
                           facts={"move": op, "rebound": rebound}))
    return out


@words("moved-leaf")
def _moved(trace: TraceData, f: Finding) -> Words:
    info, op, first, rebound = trace.tensors[f.subject], f.facts["move"], f.op, f.facts["rebound"]
    message = (
        "`%s` is the result of `%s`, not the leaf that requires grad: it is not a leaf itself, so "
        "backward() never stores a gradient in `%s.grad` (it stays None, and PyTorch only warns when it is "
        "read). The gradient goes to the original tensor, which %s, and which nothing updates."
        % (info.name, op.name, info.name, "the name `%s` no longer holds" % info.name if rebound else
           "has no name"))
    source = first.location.source if first.location else ""
    fixed = rebound_as_leaf(source, info.name) if rebound else None
    if fixed is not None:
        fix = "Make the copy the leaf. %s\n%s" % (REPLACE, code(fixed))
    else:
        fix = _leaf_after_move_fix(source, info.name)
    return Words(message, fix, info.name)


def _leaf_after_move_fix(src: str, named: str) -> str:
    """Set requires_grad after the move: `w = torch.randn(3).double().requires_grad_()`."""
    fallback = ("Make the leaf where it will live: create it with the dtype and device it needs and "
                "`requires_grad=True` (`torch.randn(3, dtype=torch.float64, requires_grad=True)`), or call "
                "`.requires_grad_()` after the move.")
    found = leaf_after_move(src, named)
    if found is None:
        return fallback
    how, target, fixed = found
    if how == "parameter":  # `nn.Parameter(x).to(d)`: a Parameter stays one only if made after the move
        return ("Move the tensor before it becomes a Parameter, so that `%s` is the Parameter the module "
                "registers and the optimizer updates. %s\n%s" % (target, REPLACE, code(fixed)))
    # The name that line gives it (`log_alpha`, returned and called `la` by the caller).
    return "Set requires_grad after the move, so `%s` is the leaf. %s\n%s" % (target, REPLACE, code(fixed))


def _copied_from_lost_leaf(trace: TraceData, info):
    """(the copy applied to the leaf, the one that made `info`) when `info` is a copy (moves, `.clone()`,
    a view that only reshapes) or a chain of copies of a leaf that required grad when it was copied
    (made with requires_grad=True, or set so later: the copy requires grad then), and the leaf has no
    name of its own: none at all, or the very name the copy now goes by (`x = x.view(2, 3)` rebinds
    it). The user holds the copy, and nothing holds the leaf, which gets the gradient. Else None."""
    op = last = trace.ops[info.created_by]
    while op.name.rpartition(".")[2] in _COPIES and op.inputs:
        source = trace.tensors.get(op.inputs[0])
        if source is None or (source.name and source.name != info.name):
            return None
        if source.is_leaf:
            return (op, last) if source.first_requires_grad or _copied_from_the_leaf_itself(trace, op, source.tid) \
                else None
        if source.created_by is None:
            return None
        op = trace.ops[source.created_by]
    return None


def _copied_from_the_leaf_itself(trace: TraceData, op, leaf: int) -> bool:
    """The copy's node leads straight to the leaf's AccumulateGrad: the leaf required grad when it was
    copied, though it was made without (`x.requires_grad = True` later). A tensor made a leaf and then
    written in place with a value that requires grad is no longer a leaf: its copy leads to the write."""
    node = trace.nodes.get(op.node) if op.node is not None else None
    return node is not None and any(
        k in trace.nodes and trace.nodes[k].name == "AccumulateGrad" and trace.nodes[k].variable == leaf
        for k in node.inputs)


# -- unused-input -----------------------------------------------------------------------------------

def _unused_inputs(trace: TraceData) -> List[Finding]:
    """autograd.grad(out, [a, b]) where `b` is not on the path: PyTorch names only an index."""
    out = []
    for cp in backward_checkpoints(trace):
        op = trace.ops[cp.op_index]
        m = _UNUSED_INPUT.search(op.error or "")
        if m is None or not cp.input_tids:
            continue
        index = int(m.group(1)) if m.group(1) is not None else None
        if index is not None and index < len(cp.input_tids):
            candidates = [cp.input_tids[index]]
        else:  # older PyTorch names no index: the inputs backward cannot reach
            reached = set(engine_order(trace, Checkpoint(op_index=cp.op_index, kind=cp.kind, roots=cp.roots)))
            candidates = [t for t, k in zip(cp.input_tids, cp.inputs) if k not in reached]
        for tid in candidates[:1]:
            cut = path_cut(trace, tid, cp, FunctionCalls(trace))
            # torch 2.10 and older name no index: the input's position says it.
            out.append(Finding("missing-grad", "unused-input", op=cut["op"] if cut else op, subject=tid, tids=(tid,),
                               facts={"index": cp.input_tids.index(tid) if index is None else index,
                                      "said_index": index is not None, "raised": m.group(0), "cut": cut}))
    return out


@words("unused-input")
def _unused(trace: TraceData, f: Finding) -> Words:
    tensor = trace.tensor_label(f.subject)
    index, cut = f.facts["index"], f.facts["cut"]
    naming = "naming only its index" if f.facts["said_index"] else "naming neither it nor its index"
    if cut is None:
        message = ("`%s` (input %s of `torch.autograd.grad`) was never used to compute the outputs, so it has "
                   "no gradient; PyTorch raised \"%s\", %s." % (tensor, index, f.facts["raised"], naming))
    else:
        message = ("`%s` (input %s of `torch.autograd.grad`) is off the path to the outputs: %s cut it off "
                   "(%s). PyTorch raised %s." % (tensor, index, where(f.op), _why_path_cut(cut), naming))
    fix = ("%s compute the outputs from `%s` without cutting the chain, or drop it from the inputs (or "
           "pass allow_unused=True to `torch.autograd.grad` and expect None for it)." % (NO_ONE_LINE_FIX, tensor))
    return Words(message, fix, tensor)


# -- cut-parameter ----------------------------------------------------------------------------------

def path_cut(trace: TraceData, tid: int, cp: Checkpoint, calls: FunctionCalls, start: Optional[OpRecord] = None):
    """Where a data-flow path from `tid` to the backward call's roots stopped requiring grad, as
    {"op": the op, "how": what cut it}: the first such op on the way (`.detach()`, an op under
    no_grad, the indices of `torch.max(y, 1)`, a comparison, an integer cast, the Python numbers a
    tensor was rebuilt from), how "function" (an op that ran with grad off inside a custom
    autograd.Function's forward was cut by the call that ran it, `checkpoint(block, x)`, which is where
    the user's code can change it), "op" (an op's results without grad), "integral" (an integer or
    boolean result; `kept`: the op also returned values that keep theirs), "exit" (the Python numbers
    a tensor was rebuilt from). None when there is no such path."""
    start = start if start is not None else first_use(trace, tid)
    if start is None:
        return None
    _, stops = stops_after(trace, tid, start.index - 1, cp.op_index)
    backward = trace.ops[cp.op_index]
    roots = ancestors(trace, backward.inputs[:1], cp.op_index)
    on_path = [(op, cut) for op, cut in stops
               if any(t in roots for t in cut) or (not op.outputs and any(t in roots for t in op.inputs))]
    if not on_path:
        # A tensor rebuilt from Python numbers (`torch.tensor([l1.item(), l2.item()])`) comes from every
        # number taken out on the line where the last one was.
        exits = [(op, cut) for op, cut in stops if not op.outputs]
        rebuilt = {(e.location.filename, e.location.function, e.location.line)
                   for e in (exit_before(trace, f, made_from_values(trace, f)) for f in trace.ops[:cp.op_index]
                             if not f.inputs and any(t in roots for t in f.outputs)) if e is not None}
        on_path = [(op, cut) for op, cut in exits if op.location is not None and
                   (op.location.filename, op.location.function, op.location.line) in rebuilt]
    if not on_path:
        return None
    cut, outputs = on_path[0]
    call = calls.enclosing(cut)
    if call is not None:
        return {"op": call, "how": "function"}
    if outputs and not all(_is_integral(trace, t) for t in outputs):
        return {"op": cut, "how": "op"}
    if outputs:
        return {"op": cut, "how": "integral", "kept": any(t not in outputs for t in cut.outputs)}
    return {"op": cut, "how": "exit"}


def _why_path_cut(cut) -> str:
    op, how = cut["op"], cut["how"]
    if how == "function":
        return ("`%s` runs its forward with grad off, as every custom autograd.Function does, and none of the tensors "
                "passed to it requires grad, so what it returns has no history: the parameters used inside it get no "
                "gradient" % op.name)
    if how == "integral":
        kept = cut["kept"]
        return ("the %s that `%s` returns%s carries no gradient (an integer or boolean tensor: indices, a comparison, "
                "a cast)" % ("indices" if kept else "result", op.name, ", unlike its values," if kept else ""))
    return why_cut({"why": "op", "why_op": op})


def _advice(cut) -> str:
    how = cut["how"]
    if how == "function":
        return ("pass it at least one tensor that requires grad, or, for `torch.utils.checkpoint.checkpoint`, "
                "use `use_reentrant=False`, which records the checkpointed function's graph as it runs")
    if how == "op":
        return ("keep the forward differentiable from it to the loss at that line: use the tensor itself instead of "
                "`.detach()` or `.data`, and torch operations instead of a NumPy round trip")
    if how == "integral":
        return ("an index, a comparison or an integer cast has no gradient, so what is computed from it cannot train "
                "what came before: go through a differentiable path instead (the values rather than the indices, a "
                "softmax over the scores, `F.gumbel_softmax`, or a straight-through estimator)")
    return "compute the loss from the tensor itself, with torch operations, without a round trip through Python numbers or NumPy"


def _is_integral(trace: TraceData, tid: int) -> bool:
    info = trace.tensors.get(tid)
    return info is not None and (info.dtype.startswith(("int", "uint")) or info.dtype == "bool")


def _forward_use(trace: TraceData, tid: int, calls: FunctionCalls, grad_enabled: bool = True) -> Optional[OpRecord]:
    """The first op that used `tid` in a forward pass where a graph could have been built: took it as
    an input with grad on (or inside a custom Function's forward, called with grad on) and made a
    tensor of it or turned it into Python values, without writing it (an initialisation, an update).
    A read of its shape builds nothing. With `grad_enabled=False`: the first such op with grad off."""
    for op in trace.ops:
        if (tid in op.inputs and not op.is_backward and tid not in op.writes and (op.outputs or is_exit(op))
                and calls.grad_enabled(op) == grad_enabled):
            return op
    return None


def _cut_parameters(trace: TraceData, already) -> List[Finding]:
    """A parameter meant to be trained (an optimizer in the block holds it, or its model got
    gradients for its other parameters) that requires grad, was used in the forward of a block that
    backpropagates, and got no gradient: named with the op where its chain to the loss stopped
    requiring grad. One cut that starves many parameters (a layer's weight and bias) is one problem.
    Unused and frozen parameters are information, not problems."""
    runs = _ran_backward(trace)
    if not runs:
        return []
    # A gradient that arrived by a backward we did not see (reentrant checkpointing runs its own
    # inside the engine) still counts.
    got = {-1 - k for k, n in trace.nodes.items() if k < 0 and n.consumed_by}
    got |= {t.tid for t in trace.tensors.values() if t.is_leaf and (t.grad is not None or t.stepped_with_grad)}
    trained_owners = {trace.tensors[t].owner for t in got if t in trace.tensors and trace.tensors[t].owner}
    by_cut: Dict[tuple, Finding] = {}
    unused, frozen, grad_off = [], [], []
    checkpoints = backward_checkpoints(trace)
    calls = FunctionCalls(trace)
    for info in trace.tensors.values():
        if not info.is_leaf or (info.owner is None and not info.optimized) or info.tid in got:
            continue
        if info.elements == 0:  # nothing of it here (FSDP keeps an empty shard of what another process holds)
            continue
        if not info.requires_grad:
            if info.owner in trained_owners:
                frozen.append(info.name)
            continue
        if not (info.optimized or info.owner in trained_owners):
            continue
        use = _forward_use(trace, info.tid, calls)
        if use is None and _forward_use(trace, info.tid, calls, grad_enabled=False) is not None:
            # Where no graph could be built, no cut starves it: it is not trained in this block (a
            # frozen backbone run under no_grad, with the optimizer over every parameter).
            grad_off.append(trace.tensor_label(info.tid))
            continue
        if use is None or not any(run.index > use.index for run in runs):
            unused.append(trace.tensor_label(info.tid))
            continue
        cut = None
        for cp in checkpoints:
            if cp.op_index > use.index and trace.ops[cp.op_index].error is None:
                cut = path_cut(trace, info.tid, cp, calls, use)
                if cut is not None:
                    break
        if cut is None:
            unused.append(trace.tensor_label(info.tid))
            continue
        if trace.tensor_label(info.tid) in already:
            continue
        op = cut["op"]
        line = (op.location.filename, op.location.line) if op.location else (None, None)
        found = by_cut.get(line)
        if found is None:
            by_cut[line] = Finding("missing-grad", "cut-parameter", op=op, subject=info.tid, tids=(info.tid,),
                                   facts={"cut": cut, "others": []})
        else:  # the same cut starves this one too
            found.facts["others"].append(info.tid)
            found.tids = tuple(dict.fromkeys(found.tids + (info.tid,)))
    if unused:
        trace.notes.append("Not used on the way to the loss in this block, so no gradient (by design, as an "
                           "unrouted expert, or not: check): %s." % in_backticks(unused))
    if frozen:
        trace.notes.append("Frozen on purpose (requires_grad=False), so no gradient: %s." % in_backticks(frozen))
    if grad_off:
        trace.notes.append("Used only with gradient recording off (`torch.no_grad()`, `set_grad_enabled(False)`, "
                           "inference mode), so not trained in this block: %s." % in_backticks(grad_off))
    return list(by_cut.values())


@words("cut-parameter")
def _starved(trace: TraceData, f: Finding) -> Words:
    info, cut = trace.tensors[f.subject], f.facts["cut"]
    tensor = trace.tensor_label(f.subject)
    op = cut["op"]
    message = ("`%s` %s, and it is used in the forward pass, but no backward reached it: %s cut its path to "
               "the loss (%s). Its `.grad` stays None and the optimizer skips it, silently." % (
                   tensor, "is held by an optimizer" if info.optimized else "belongs to `%s`, whose other "
                   "parameters get gradients" % info.owner, where(op), _why_path_cut(cut)))
    fix = starved_fix(tensor, op, without_exit(op.location.source) if op.location else None, _advice(cut))
    others = [trace.tensor_label(t) for t in f.facts["others"]]
    others = [n for n in others if n]
    if others:
        message += " The same cut also starves %s." % in_backticks(others)
    return Words(message, fix, tensor, tuple(others))
