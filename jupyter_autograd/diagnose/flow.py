"""Where gradients cannot flow: graph-freed, graph-cut, missing-grad, nan-gradient.

Each rule names the user's line: the op that reused a freed graph, the op that cut the chain,
the op that made a non-leaf of a tensor the user trains, the forward op whose backward made the
first NaN. Information that is not a problem (parameters unused by design, frozen ones) goes to
`trace.notes`.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Set

from .fixes import NO_ONE_LINE_FIX, REPLACE, code, line_ref, starved_fix, where
from ..model import FREEZE_SETTER, GRAD_MODE_SWITCHES, Checkpoint, Diagnosis, Location, OpRecord, TraceData
from ..source.index import SourceIndex, parse_fresh, parse_statement
from ..model.queries import (FunctionCalls, ancestors, engine_order, exit_before, first_use,
                    is_cut, is_exit, made_from_values, reachable, scope_call, stops_after,
                    switch_left_on)

_NO_GRAD_FN = "does not require grad and does not have a grad_fn"
_UNUSED_INPUT = re.compile(r"[Dd]ifferentiated Tensors? (?:at index (\d+) )?appears? to not have been used in the graph")
_MOVES = {"to", "cuda", "cpu", "double", "float", "half", "bfloat16", "type", "long", "int", "mps", "xpu"}
# Ops whose result the user takes for the tensor itself: moves, copies, and views that only reshape it.
_COPIES = _MOVES | {"clone", "contiguous", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten",
                    "squeeze", "unsqueeze", "t", "transpose", "permute"}
_SETS_REQUIRES_GRAD = {"Tensor.requires_grad_", FREEZE_SETTER}


def _diag(kind: str, op: Optional[OpRecord], message: str, fix: str, tensor=None, tids=()) -> Diagnosis:
    loc = op.location if op is not None else None
    return Diagnosis(kind=kind, message=message, fix=fix, filename=loc.filename if loc else None,
                     line=loc.line if loc else None, source=loc.source if loc else "", tensor=tensor,
                     op_index=op.index if op is not None else None, tids=tuple(t for t in tids if t is not None))


def _with_saved(diag: Diagnosis, op: Optional[OpRecord]) -> Diagnosis:
    if op is not None and op.location is not None:
        diag.saved_line, diag.saved_filename, diag.saved_source = (op.location.line, op.location.filename,
                                                                   op.location.source)
        diag.saved_op_index = op.index
    return diag


def _name(trace: TraceData, tid: Optional[int]) -> Optional[str]:
    info = trace.tensors.get(tid) if tid is not None else None
    return info.name if info is not None else None


def _backward_checkpoints(trace: TraceData) -> List[Checkpoint]:
    return [cp for cp in trace.checkpoints if cp.kind == "backward" and cp.op_index < len(trace.ops)]


# -- graph-cut ------------------------------------------------------------------------------------

def graph_cut(trace: TraceData) -> List[Diagnosis]:
    """backward() or autograd.grad() from a tensor with no path to anything that requires grad,
    or from a leaf that was computed in the block (`loss.requires_grad = True` hid the error)."""
    out = []
    for cp in _backward_checkpoints(trace):
        backward = trace.ops[cp.op_index]
        root = backward.inputs[0] if backward.inputs else None
        info = trace.tensors.get(root) if root is not None else None
        rebuilt = _rebuilt_leaves(trace, cp, root)
        if rebuilt and info is not None:
            diag = _rebuilt_loss(trace, root, rebuilt)
            if not any((d.filename, d.line) == (diag.filename, diag.line) for d in out):
                out.append(diag)
            continue
        if cp.roots or info is None:
            continue
        made_here = info.created_by is not None
        raised = backward.error is not None and _NO_GRAD_FN in backward.error
        if not raised and not made_here:
            continue  # backward on a leaf the user made on purpose
        # A backward that ran on a tensor made here without grad means its flag was set by hand
        # (the tensor may be gone by the end of the block: a loss inside a training function).
        if not raised and (info.first_requires_grad or (info.alive and not info.requires_grad)):
            continue
        cut, why = _find_cut(trace, root, cp.op_index)
        name = info.name or trace.tensor_label(root)
        hidden = not raised
        switch = switch_left_on(trace, cut) if cut is not None and "frozen" not in why else None
        in_block = scope_call(trace, cut) if cut is not None and switch is None and "frozen" not in why else None
        if in_block is not None:  # the line of the grad-off block that called the module which ran it
            cut = in_block
            what = "%s cut `%s` off the graph: %s" % (where(cut), name, why)
        elif switch is not None:  # the cut is where grad was switched off, not where that was met
            why = _why_switched_off(switch, cut)
            cut = switch
            what = "%s cut `%s` off the graph: %s" % (where(cut), name, why)
        elif cut is not None:
            what = "%s cut `%s` off the graph: %s" % (where(cut), name, why)
        else:
            cut = backward
            what = "`%s` was made without any tensor that requires grad (%s)" % (name, why)
        message = (
            "%s. %s" % (what, (
                "`%s.requires_grad` was then set by hand, which silences PyTorch's error, but backward() stops at "
                "`%s`: no parameter gets a gradient, and training does nothing." % (name, name)) if hidden else (
                "backward() %s \"element 0 of tensors does not require grad and does not have a grad_fn\". "
                "Setting `%s.requires_grad = True` would hide the error and train nothing: the chain to the "
                "parameters is still cut." % ("raised" if backward.error else "will raise", name))))
        fix = _cut_fix(trace, cut, why) if not hidden else (
            "%s remove the line that sets `%s.requires_grad`, and keep the loss connected to the parameters "
            "(%s)." % (NO_ONE_LINE_FIX, name, why))
        diag = _diag("graph-cut", cut, message, fix, tensor=name, tids=(root,))
        diag.predicted = True
        if any((d.filename, d.line, d.tensor) == (diag.filename, diag.line, diag.tensor) for d in out):
            continue  # the same cut, met again by the next iteration of a loop
        out.append(diag)
    return out + dead_terms(trace)


# Ops whose only purpose is to stop the gradient: a term cut by one was cut on purpose.
_STOP_GRADIENT = {"detach", "detach_", "data"}
# Ops that add their inputs: a loss made of terms.
_ADDS = {"add", "add_", "sub", "sub_", "rsub", "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__"}


def dead_terms(trace: TraceData) -> List[Diagnosis]:
    """A term added to a loss (one value added to another that requires grad, on the way to a backward
    call) that was computed from tensors that required grad but has no path to any of them: it trains
    nothing, and its weight changes no gradient (a penalty computed through argmax, `.item()`, a
    comparison). Named at the first op on its way where the chain stopped requiring grad. A term cut
    by `.detach()` or `.data`, whose only purpose is to stop the gradient, was cut on purpose (a
    stop-gradient target, a total kept for logging). Each place in the code is judged once (the
    iterations of a loop do the same)."""
    out, judged, reached = [], set(), {}
    backwards = [cp for cp in _backward_checkpoints(trace) if trace.ops[cp.op_index].error is None and cp.roots]
    for op in trace.ops:
        if op.name.rpartition(".")[2] not in _ADDS or op.is_backward or op.node is None or op.location is None \
                or not any(_scalar_requiring_grad(trace, t) for t in op.outputs):
            continue
        for position, term in enumerate(op.inputs):
            info = trace.tensors.get(term)
            if info is None or info.first_requires_grad or (op.location, position) in judged or _numel(info) != 1:
                continue
            judged.add((op.location, position))
            cp = next((cp for cp in backwards if cp.op_index > op.index), None)
            if cp is None:
                continue
            if cp.op_index not in reached:
                reached[cp.op_index] = reachable(trace, cp.roots)
            if op.node not in reached[cp.op_index]:
                continue  # a sum that no backward call runs through
            sources = ancestors(trace, [term], op.index)
            if not any(t != term and t in trace.tensors and trace.tensors[t].first_requires_grad for t in sources):
                continue  # made from data alone: a constant of the loss
            cuts = [o for o in trace.ops[:op.index] if is_cut(trace, o) and not _reads_only_the_layout(o)
                    and any(t in sources for t in o.inputs + o.outputs)]
            if not cuts or any(o.name.rpartition(".")[2] in _STOP_GRADIENT for o in cuts):
                continue  # `.detach()` on the way says the term is meant to carry no gradient
            cut = cuts[0]
            name = info.name or trace.tensor_label(term)
            why = _why_cut(cut)
            message = (
                "`%s` is added to the loss at line %d, but it has no path to the tensors it was computed from: %s "
                "cut it (%s). backward() runs, and this term changes no gradient: it trains nothing, and its weight "
                "does nothing." % (name, op.location.line, where(cut), why))
            out.append(_diag("graph-cut", cut, message, _cut_fix(trace, cut, why), tensor=name, tids=(term,)))
    return out


def _reads_only_the_layout(op: OpRecord) -> bool:
    """`torch.zeros_like(x)`, `x.new_zeros(())`: a tensor made from x's shape, dtype and device, not
    from its values (a running sum started from it is no term cut off the model)."""
    short = op.name.rpartition(".")[2]
    return short.endswith("_like") or short in ("new_zeros", "new_ones", "new_full", "new_empty")


def _scalar_requiring_grad(trace: TraceData, tid: int) -> bool:
    info = trace.tensors.get(tid)
    return info is not None and info.first_requires_grad and _numel(info) == 1


def _numel(info) -> int:
    n = 1
    for size in info.shape:
        n *= size
    return n


def _rebuilt_leaves(trace: TraceData, cp: Checkpoint, root: Optional[int]) -> List[int]:
    """The leaves a backward call reaches when every one of them is a new leaf made in the block, with
    requires_grad=True, from what the parameters computed (`torch.tensor(loss.item(), requires_grad=True)`, a prediction
    rewrapped by `torch.tensor(..., requires_grad=True)`): the chain to the parameters was cut and
    the flag set on the copy hid it, so the backward trains nothing. Else []. A leaf made from data
    alone (an input whose gradient is wanted) is no such leaf; nor is one autograd.grad asks for."""
    backward = trace.ops[cp.op_index]
    if backward.error is not None or cp.inputs or root is None:
        return []
    if cp.roots:
        reached = [trace.nodes[k].variable for k in reachable(trace, cp.roots)]
        leaves = [t for t in reached if t is not None]
    else:
        leaves = [root]
    rebuilt = []
    for tid in dict.fromkeys(leaves):
        info = trace.tensors.get(tid)
        if info is None or not info.is_leaf or info.created_by is None or not info.first_requires_grad \
                or _trained(info):
            return []  # a flag set by hand later is found with the cut it hides (graph_cut below)
        made = trace.ops[info.created_by]
        sources = ancestors(trace, made.inputs or [tid], made.index + 1) - {tid}
        if not any(t in trace.tensors and _trained(trace.tensors[t]) and trace.tensors[t].first_requires_grad
                   for t in sources):
            return []
        rebuilt.append(tid)
    return rebuilt


def _trained(info) -> bool:
    return info.is_parameter or info.optimized or info.owner is not None


def _rebuilt_loss(trace: TraceData, root: int, rebuilt: List[int]) -> Diagnosis:
    made = trace.ops[trace.tensors[rebuilt[0]].created_by]
    name = _name(trace, root) or trace.tensor_label(root)
    leaf = "`%s`" % _name(trace, rebuilt[0]) if _name(trace, rebuilt[0]) and rebuilt[0] != root else "a new leaf"
    message = (
        "%s made %s from values the parameters computed, and set `requires_grad` on it: a tensor made that way "
        "has no history, so backward() from `%s` stops there. PyTorch raises nothing, but no parameter gets a "
        "gradient, and training does nothing." % (where(made), leaf, name))
    rewritten = _without_exit(made.location.source) if made.location else None
    assigned = parse_statement(rewritten).body[0] if rewritten else None
    if assigned is not None and ast.unparse(assigned.targets[0]) == ast.unparse(assigned.value):
        fix = ("Delete the culprit line: `%s` already holds the tensor whose value it copies, with the history "
               "that backward needs." % ast.unparse(assigned.value))
    elif rewritten:
        fix = "Keep the loss a tensor, with no round trip through Python numbers. %s\n%s" % (REPLACE, code(rewritten))
    else:
        fix = ("%s compute the loss with torch operations from the model's output itself, and do not rewrap it "
               "with `torch.tensor(..., requires_grad=True)`, which copies the values and drops their history (a "
               "threshold or an argmax has no gradient: use a soft version, such as a sigmoid, to train through it)."
               % NO_ONE_LINE_FIX)
    diag = _diag("graph-cut", made, message, fix, tensor=name, tids=(root, *rebuilt))
    diag.predicted = True
    return diag


def _find_cut(trace: TraceData, root: int, before: int):
    """(the op that cut the chain from `root` back to what requires grad, why), or (None, why)."""
    found = ancestors(trace, [root], before)
    cuts = [op for op in trace.ops[:before] if any(t in found for t in op.outputs + op.writes) and is_cut(trace, op)]
    for op in trace.ops[:before]:  # a Python value in the chain: the op that made it is the cut
        if any(t in found for t in op.inputs + op.outputs) and not op.is_backward:
            exit_op = exit_before(trace, op, made_from_values(trace, op))
            if exit_op is not None and is_cut(trace, exit_op) and (
                    any(t in found for t in exit_op.inputs) or _drops_a_graph(trace, exit_op)):
                cuts.append(exit_op)
    # Frozen: without grad when the block ends if still alive (a model built in the block and frozen
    # there was made with it), else when first seen. When nothing it came from requires grad but
    # frozen parameters, that is the reason, whatever op looks like a cut on the way.
    # A parameter gone by the end whose requires_grad a call set (`requires_grad_()`, `p.requires_grad =`)
    # counts as frozen there: with nothing else it came from requiring grad, that call froze it.
    setting = [op for op in trace.ops[:before] if op.name in _SETS_REQUIRES_GRAD]
    set_on = {t for op in setting for t in op.inputs}

    def requires_grad(info):
        if info.alive:
            return info.requires_grad
        return info.first_requires_grad and info.tid not in set_on

    leaves = [trace.tensors[t] for t in found if t in trace.tensors and trace.tensors[t].is_leaf]
    frozen = [info.tid for info in leaves if info.owner and not requires_grad(info)]
    if frozen and not any(requires_grad(info) for info in leaves):
        freezing = [op for op in setting if any(t in op.inputs for t in frozen)]
        uses = [op for op in trace.ops[:before] if any(t in op.inputs for t in frozen)]
        # Where it was frozen, if a recorded call did it; else the forward that used it (not the
        # initialisation inside the module's constructor).
        in_forward = [op for op in uses if op.module]
        use = freezing[-1] if freezing else (in_forward or uses or [None])[0]
        return use, "every parameter it was computed from is frozen (`requires_grad=False`)"
    if cuts:
        # A cut that drops a graph already built, before one where no graph was recorded on purpose (a
        # reward or a teacher run under no_grad); of those, the last.
        cut = max(cuts, key=lambda op: (_drops_a_graph(trace, op), op.index))
        return cut, _why_cut(cut)
    return None, "from data alone"


def _drops_a_graph(trace: TraceData, cut: OpRecord) -> bool:
    """Whether `cut` took its values from a tensor with a graph behind it (`log_probs[0, i].item()`),
    not from what ran with no graph recorded at all (a reward model's forward under no_grad)."""
    return any(t in trace.tensors and trace.tensors[t].first_requires_grad and not trace.tensors[t].is_leaf
               for t in cut.inputs)


def _why_switched_off(switch: OpRecord, met: OpRecord) -> str:
    """Why a grad-mode switch (see paths.switch_left_on) cut the graph where `met` ran."""
    ran = line_ref(met) + (" (`%s`)" % met.location.source if met.location and met.location.source else "")
    if switch.location.source.startswith(("with ", "async with ")):
        how = ("its block switched gradient recording off, and the mode stays off until the block ends: %s ran "
               "before that (in a function called from inside the block, or while a generator was suspended at "
               "a `yield` inside it)" % ran)
    else:
        how = ("it switched gradient recording off for everything that runs after it, and nothing switched it "
               "back on before %s ran" % ran)
    return "%s; `%s` there recorded no graph" % (how, met.name)


def _why_cut(op: OpRecord) -> str:
    short = op.name.rpartition(".")[2]
    if not op.grad_enabled:
        return "`%s` ran under `torch.no_grad()` (or inference mode), which records no graph" % op.name
    if short == "detach" or short == "detach_":
        return "`.detach()` returns a tensor without history"
    if short == "data":
        return "`.data` returns a tensor without history"
    if short in ("item", "tolist", "__float__", "__int__", "__index__", "__complex__"):
        return "`%s` turns the tensor into a Python number, and a tensor rebuilt from it has no history" % op.name
    if short in ("numpy", "__array__"):
        return "`.numpy()` leaves PyTorch, and a tensor rebuilt from the array has no history"
    return "`%s` is not differentiable (its result never requires grad)" % op.name


def _cut_fix(trace: TraceData, op: Optional[OpRecord], why: str) -> str:
    src = op.location.source if op is not None and op.location else ""
    short = op.name.rpartition(".")[2] if op is not None else ""
    if "frozen" in why:
        return ("%s unfreeze the parameters you want to train (`requires_grad_(True)` on each), or compute the "
                "loss from a model that has trainable parameters." % NO_ONE_LINE_FIX)
    if op is not None and op.name in GRAD_MODE_SWITCHES:
        if src.startswith(("with ", "async with ")):
            return ("%s end this block before anything that needs a graph runs: compute only what must not be "
                    "recorded inside it, and leave the loss outside (a generator yields after the block, "
                    "not inside it)." % NO_ONE_LINE_FIX)
        return ("%s switch gradient recording off only where it is meant to be off: `with torch.no_grad():` "
                "around the evaluation code puts the mode back when the block ends, on every path (an exception "
                "or an early `return` included), where `torch.set_grad_enabled(False)` stays until something "
                "switches it back." % NO_ONE_LINE_FIX)
    if op is not None and not op.grad_enabled:
        return ("%s compute the loss outside `torch.no_grad()` and `torch.inference_mode()`, which record no "
                "graph (a helper written for evaluation needs a training twin)." % NO_ONE_LINE_FIX)
    rewritten = _without_exit(src) if short in ("item", "tolist", "numpy", "__float__") else None
    if rewritten:
        return "Keep the loss a tensor, with no round trip through Python numbers. %s\n%s" % (REPLACE, code(rewritten))
    if short == "detach" and src.count(".detach()") == 1 and ".numpy()" not in src:
        return "Keep the chain to the loss. %s\n%s" % (REPLACE, code(src.replace(".detach()", "")))
    return ("%s compute the loss with differentiable torch operations from the model's output (`torch.clamp` "
            "rather than NumPy's clip, for example); do not go through `.item()`, `.numpy()`, `.detach()`, argmax "
            "or integer casts on the way." % NO_ONE_LINE_FIX)


def _without_exit(src: str) -> Optional[str]:
    """`loss = torch.tensor(x.mean().item())` -> `loss = x.mean()`."""
    tree = parse_fresh(src)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
        return None
    value = tree.body[0].value
    if isinstance(value, ast.Call) and len(value.args) == 1 and ast.unparse(value.func) in (
            "torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor", "torch.FloatTensor"):
        inner = value.args[0]
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr in (
                "item", "numpy", "tolist") and not inner.args:
            base = inner.func.value
            while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute) and base.func.attr in (
                    "cpu", "detach", "numpy"):
                base = base.func.value
            tree.body[0].value = base
            return ast.unparse(tree.body[0])
    return None


# -- missing-grad ---------------------------------------------------------------------------------

def missing_grad(trace: TraceData) -> List[Diagnosis]:
    out = _moved_leaves(trace) + _unused_inputs(trace) + _replaced_parameters(trace)
    out += _cut_parameters(trace, {d.tensor for d in out})
    return out


def _replaced_parameters(trace: TraceData) -> List[Diagnosis]:
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
        name = replacement.name or old.name or trace.tensor_label(old.tid)
        at = _assignment_between(trace, name.rpartition(".")[2], last.index, first.index) or first.location
        message = (
            "`%s` was replaced by a new parameter at line %d, after the optimizer was built: the optimizer still "
            "holds the old one, which the forward no longer uses, so it gets no gradient from then on, and the new "
            "one, which gets the gradients, is in no optimizer and is never updated." % (name, at.line))
        fix = ("%s keep the parameter and change its values in place (`with torch.no_grad(): %s.copy_(new_values)`), "
               "or give the new parameter to the optimizer (`optimizer.add_param_group`, or build the optimizer again "
               "after replacing it)." % (NO_ONE_LINE_FIX, name))
        out.append(Diagnosis(kind="missing-grad", message=message, fix=fix, filename=at.filename, line=at.line,
                             source=at.source, tensor=name, op_index=first.index,
                             tids=(old.tid, replacement.tid)))
    return out


def _assignment_between(trace: TraceData, attr: str, after: int, before: int) -> Optional[Location]:
    """The last statement assigning an attribute `attr` (`self.mask = ...`, `model.mask = ...`) in a
    function that ran ops between op indices `after` and `before`."""
    ran = {(op.location.filename, op.location.scope) for op in trace.ops[after + 1:before] if op.location}
    found = None
    for filename, tree in SourceIndex(trace.sources).trees():
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = min([function.lineno] + [d.lineno for d in function.decorator_list])
            if (filename, first) not in ran:
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Attribute) and t.attr == attr for t in node.targets):
                    found = Location(filename, node.lineno, function.name, trace.sources[filename][node.lineno - 1].strip(),
                                     first)
    return found


def _ran_backward(trace: TraceData) -> List[OpRecord]:
    return [op for op in trace.ops if op.is_backward and op.error is None]


def _moved_leaves(trace: TraceData) -> List[Diagnosis]:
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
        message = (
            "`%s` is the result of `%s`, not the leaf that requires grad: it is not a leaf itself, so "
            "backward() never stores a gradient in `%s.grad` (it stays None, and PyTorch only warns when it is "
            "read). The gradient goes to the original tensor, which %s, and which nothing updates."
            % (info.name, op.name, info.name, "the name `%s` no longer holds" % info.name if rebound else
               "has no name"))
        source = first.location.source if first.location else ""
        fix = (_rebound_leaf_fix(source, info.name) if rebound else None) or _leaf_after_move_fix(source, info.name)
        out.append(_diag("missing-grad", first, message, fix, tensor=info.name, tids=(info.tid, first.inputs[0])))
    return out


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


def _rebound_leaf_fix(src: str, name: str) -> Optional[str]:
    """`w = w.type(torch.float)` -> `w = w.type(torch.float).detach().requires_grad_()`: the name then
    holds a leaf of its own, which backward gives the gradient. In a tuple assignment
    (`inputs, targets = inputs.float(), targets.long()`), only the value the name gets."""
    tree = parse_fresh(src)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign) or len(tree.body[0].targets) != 1:
        return None
    stmt = tree.body[0]
    target = stmt.targets[0]

    def as_leaf(value):
        detached = ast.Call(func=ast.Attribute(value=value, attr="detach", ctx=ast.Load()), args=[], keywords=[])
        return ast.Call(func=ast.Attribute(value=detached, attr="requires_grad_", ctx=ast.Load()), args=[],
                        keywords=[])

    if isinstance(target, (ast.Tuple, ast.List)):
        values = stmt.value.elts if isinstance(stmt.value, (ast.Tuple, ast.List)) else None
        at = [i for i, element in enumerate(target.elts) if ast.unparse(element) == name]
        if values is None or len(values) != len(target.elts) or len(at) != 1:
            return None
        values[at[0]] = as_leaf(values[at[0]])
        fixed = "%s = %s" % (", ".join(map(ast.unparse, target.elts)), ", ".join(map(ast.unparse, values)))
    else:
        fixed = "%s = %s" % (ast.unparse(target), ast.unparse(as_leaf(stmt.value)))
    return "Make the copy the leaf. %s\n%s" % (REPLACE, code(fixed))


def _leaf_after_move_fix(src: str, name: str) -> str:
    """Set requires_grad after the move: `w = torch.randn(3).double().requires_grad_()`."""
    fallback = ("Make the leaf where it will live: create it with the dtype and device it needs and "
                "`requires_grad=True` (`torch.randn(3, dtype=torch.float64, requires_grad=True)`), or call "
                "`.requires_grad_()` after the move.")
    tree = parse_fresh(src)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
        return fallback
    stmt = tree.body[0]
    target = ast.unparse(stmt.targets[0]) if len(stmt.targets) == 1 else name
    inside = _moved_into_parameter(stmt.value)
    if inside is not None:  # `nn.Parameter(x).to(d)`: a Parameter stays one only if made after the move
        stmt.value = inside
        return ("Move the tensor before it becomes a Parameter, so that `%s` is the Parameter the module "
                "registers and the optimizer updates. %s\n%s" % (target, REPLACE, code(ast.unparse(stmt))))
    removed = False
    for node in ast.walk(stmt.value):
        if isinstance(node, ast.Call):
            kept = [k for k in node.keywords if k.arg != "requires_grad"]
            removed = removed or len(kept) != len(node.keywords)
            node.keywords = kept
    if not removed:
        return fallback
    stmt.value = ast.Call(func=ast.Attribute(value=stmt.value, attr="requires_grad_", ctx=ast.Load()),
                          args=[], keywords=[])
    # The name that line gives it (`log_alpha`, returned and called `la` by the caller).
    return "Set requires_grad after the move, so `%s` is the leaf. %s\n%s" % (target, REPLACE, code(ast.unparse(stmt)))


def _moved_into_parameter(value: ast.expr) -> Optional[ast.expr]:
    """`nn.Parameter(x, requires_grad=True).to(d, t)` as `nn.Parameter(x.to(d, t), requires_grad=True)`:
    the methods called on the Parameter, called on what it wraps. None for any other expression."""
    def is_parameter(node):
        return isinstance(node, ast.Call) and ast.unparse(node.func).rpartition(".")[2] == "Parameter"

    chain = []
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and not is_parameter(value):
        chain.append(value)
        value = value.func.value
    if not chain or not is_parameter(value) or not value.args:
        return None
    wrapped = value.args[0]
    for call in reversed(chain):
        wrapped = ast.Call(func=ast.Attribute(value=wrapped, attr=call.func.attr, ctx=ast.Load()), args=call.args,
                           keywords=call.keywords)
    return ast.Call(func=value.func, args=[wrapped] + value.args[1:], keywords=value.keywords)


def _unused_inputs(trace: TraceData) -> List[Diagnosis]:
    """autograd.grad(out, [a, b]) where `b` is not on the path: PyTorch names only an index."""
    out = []
    for cp in _backward_checkpoints(trace):
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
            name = _name(trace, tid) or trace.tensor_label(tid)
            cut, why, _ = _path_cut(trace, tid, cp, FunctionCalls(trace))
            if cut is None:
                message = ("`%s` (input %s of `torch.autograd.grad`) was never used to compute the outputs, so it has "
                           "no gradient; PyTorch raised \"%s\", naming only its index." % (
                               name, index if index is not None else "?", m.group(0)))
                cut = op
            else:
                message = ("`%s` (input %s of `torch.autograd.grad`) is off the path to the outputs: %s cut it off "
                           "(%s). PyTorch raised naming only its index." % (
                               name, index, where(cut), why))
            fix = ("%s compute the outputs from `%s` without cutting the chain, or drop it from the inputs (or "
                   "pass allow_unused=True to `torch.autograd.grad` and expect None for it)." % (NO_ONE_LINE_FIX, name))
            out.append(_diag("missing-grad", cut, message, fix, tensor=name, tids=(tid,)))
    return out


def _path_cut(trace: TraceData, tid: int, cp: Checkpoint, calls: FunctionCalls, start: Optional[OpRecord] = None):
    """(the op, why, what to do) where a data-flow path from `tid` to the backward call's roots stopped
    requiring grad: the first such op on the way (`.detach()`, an op under no_grad, the indices of
    `torch.max(y, 1)`, a comparison, an integer cast, the Python numbers a tensor was rebuilt from).
    An op that ran with grad off inside a custom autograd.Function's forward was cut by the call that
    ran it (`checkpoint(block, x)`), which is where the user's code can change it. (None, "", "")
    when there is no such path."""
    start = start if start is not None else first_use(trace, tid)
    if start is None:
        return None, "", ""
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
        return None, "", ""
    cut, outputs = on_path[0]
    call = calls.enclosing(cut)
    if call is not None:
        why = ("`%s` runs its forward with grad off, as every custom autograd.Function does, and none of the tensors "
               "passed to it requires grad, so what it returns has no history: the parameters used inside it get no "
               "gradient" % call.name)
        advice = ("pass it at least one tensor that requires grad, or, for `torch.utils.checkpoint.checkpoint`, "
                  "use `use_reentrant=False`, which records the checkpointed function's graph as it runs")
        return call, why, advice
    if outputs and not all(_is_integral(trace, t) for t in outputs):
        return cut, _why_cut(cut), ("keep the forward differentiable from it to the loss at that line: use the tensor "
                                    "itself instead of `.detach()` or `.data`, and torch operations instead of a NumPy "
                                    "round trip")
    if outputs:
        kept = [t for t in cut.outputs if t not in outputs]
        why = ("the %s that `%s` returns%s carries no gradient (an integer or boolean tensor: indices, a comparison, "
               "a cast)" % ("indices" if kept else "result", cut.name, ", unlike its values," if kept else ""))
        advice = ("an index, a comparison or an integer cast has no gradient, so what is computed from it cannot train "
                  "what came before: go through a differentiable path instead (the values rather than the indices, a "
                  "softmax over the scores, `F.gumbel_softmax`, or a straight-through estimator)")
        return cut, why, advice
    return cut, _why_cut(cut), ("compute the loss from the tensor itself, with torch operations, without a round "
                                "trip through Python numbers or NumPy")


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


def _cut_parameters(trace: TraceData, already: Set[Optional[str]]) -> List[Diagnosis]:
    """A parameter meant to be trained (an optimizer in the block holds it, or its model got
    gradients for its other parameters) that requires grad, was used in the forward of a block that
    backpropagates, and got no gradient: named with the op where its chain to the loss stopped
    requiring grad. Unused and frozen parameters are information, not problems."""
    runs = _ran_backward(trace)
    if not runs:
        return []
    # A gradient that arrived by a backward we did not see (reentrant checkpointing runs its own
    # inside the engine) still counts.
    got = {-1 - k for k, n in trace.nodes.items() if k < 0 and n.consumed_by}
    got |= {t.tid for t in trace.tensors.values() if t.is_leaf and (t.grad is not None or t.stepped_with_grad)}
    trained_owners = {trace.tensors[t].owner for t in got if t in trace.tensors and trace.tensors[t].owner}
    out, unused, frozen, grad_off = [], [], [], []
    checkpoints = _backward_checkpoints(trace)
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
            grad_off.append(info.name or trace.tensor_label(info.tid))
            continue
        if use is None or not any(run.index > use.index for run in runs):
            unused.append(info.name or trace.tensor_label(info.tid))
            continue
        cut = None
        for cp in checkpoints:
            if cp.op_index > use.index and trace.ops[cp.op_index].error is None:
                cut, why, advice = _path_cut(trace, info.tid, cp, calls, use)
                if cut is not None:
                    break
        if cut is None:
            unused.append(info.name or trace.tensor_label(info.tid))
            continue
        name = info.name or trace.tensor_label(info.tid)
        if name in already:
            continue
        message = ("`%s` %s, and it is used in the forward pass, but no backward reached it: %s cut its path to "
                   "the loss (%s). Its `.grad` stays None and the optimizer skips it, silently." % (
                       name, "is held by an optimizer" if info.optimized else "belongs to `%s`, whose other "
                       "parameters get gradients" % info.owner, where(cut), why))
        fix = starved_fix(name, cut, _without_exit(cut.location.source) if cut.location else None, advice)
        out.append(_diag("missing-grad", cut, message, fix, tensor=name, tids=(info.tid,)))
    out = _one_per_cut(out)
    if unused:
        trace.notes.append("Not used on the way to the loss in this block, so no gradient (by design, as an "
                           "unrouted expert, or not: check): %s." % _listing(unused))
    if frozen:
        trace.notes.append("Frozen on purpose (requires_grad=False), so no gradient: %s." % _listing(frozen))
    if grad_off:
        trace.notes.append("Used only with gradient recording off (`torch.no_grad()`, `set_grad_enabled(False)`, "
                           "inference mode), so not trained in this block: %s." % _listing(grad_off))
    return out


def _one_per_cut(found: List[Diagnosis]) -> List[Diagnosis]:
    """One cut that starves many parameters (a layer's weight and bias) is one problem."""
    by_cut: Dict[tuple, List[Diagnosis]] = {}
    for d in found:
        by_cut.setdefault((d.filename, d.line), []).append(d)
    merged = []
    for group in by_cut.values():
        first = group[0]
        others = [d.tensor for d in group[1:] if d.tensor]
        if others:
            first.message += " The same cut also starves %s." % _listing(others)
            first.also = tuple(others)
            first.tids = tuple(dict.fromkeys(first.tids + tuple(t for d in group[1:] for t in d.tids)))
        merged.append(first)
    return merged


def _listing(names: List[Optional[str]]) -> str:
    shown = ["`%s`" % n for n in names[:8] if n]
    return ", ".join(shown) + (" and %d more" % (len(names) - 8) if len(names) > 8 else "")


# -- nan-gradient ---------------------------------------------------------------------------------
