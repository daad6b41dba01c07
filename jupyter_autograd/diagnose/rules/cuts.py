"""graph-cut: backward() or autograd.grad() from a tensor with no path to anything that requires grad
(or from a leaf computed in the block: `loss.requires_grad = True` hid the error), and a term added
to a loss that lost its path to what it was computed from (it trains nothing). Named at the op that
cut the chain, or where grad was switched off.

Reasons: `rebuilt-loss` (a new leaf made, with requires_grad, from values the parameters computed),
`cut` (the chain to the parameters cut at an op, a switch or frozen parameters), `dead-term`.
Why a chain was cut is a code in the facts (`why`): "frozen", "data" (made from data alone), "op"
(the op `why_op` cut it), "switched" (grad was switched off by `switch` where `why_op` ran)."""
from __future__ import annotations

import ast
from typing import List, Optional

from ...model import FREEZE_SETTER, Checkpoint, OpRecord, TraceData
from ...model.queries import ancestors, exit_before, is_cut, made_from_values, reachable, requires_grad
from ...source.index import parse_fresh, parse_statement
from ...source.rewrites import without_exit
from ..findings import Finding, Words
from ..fixes import NO_ONE_LINE_FIX, REPLACE, code, where
from ..wording import words
from .common import ADDS, STOP_GRADIENT, backward_checkpoints, name
from .cut_place import cut_fix, place_cut, where_at, why_cut
from .starved import starved_terms

NO_GRAD_FN = "does not require grad and does not have a grad_fn"
_SETS_REQUIRES_GRAD = {"Tensor.requires_grad_", FREEZE_SETTER}


def graph_cut(trace: TraceData, source) -> List[Finding]:
    out, said, explained = [], [], set()
    for cp in backward_checkpoints(trace):
        backward = trace.ops[cp.op_index]
        root = backward.inputs[0] if backward.inputs else None
        info = trace.tensors.get(root) if root is not None else None
        rebuilt = _rebuilt_leaves(trace, cp, root)
        if rebuilt and info is not None:
            made = trace.ops[trace.tensors[rebuilt[0]].created_by]
            line = _line_of(made)
            if not any(at == line for at, _ in said):
                out.append(Finding("graph-cut", "rebuilt-loss", op=made, subject=root, tids=(root, *rebuilt),
                                   predicted=True, facts={"rebuilt": rebuilt}))
                said.append((line, trace.tensor_label(root)))
            explained.add(cp.op_index)
            continue
        if cp.roots or info is None:
            continue
        made_here = info.created_by is not None
        raised = backward.error is not None and NO_GRAD_FN in backward.error
        if not raised and not made_here:
            continue  # backward on a leaf the user made on purpose
        # A backward that ran on a tensor made here without grad means its flag was set by hand
        # (the tensor may be gone by the end of the block: a loss inside a training function).
        if not raised and (info.first_requires_grad or (info.alive and not info.requires_grad)):
            continue
        cut, at, facts = cut_of(trace, source, root, cp.op_index)
        facts.update(hidden=not raised, backward=backward, made_without=cut is None)
        cut = cut if cut is not None else backward
        key = ((at.filename, at.line) if at is not None else _line_of(cut), trace.tensor_label(root))
        explained.add(backward.index)
        if key in said:
            continue  # the same cut, met again by the next iteration of a loop
        said.append(key)
        out.append(Finding("graph-cut", "cut", op=cut, at=at, subject=root, tids=(root,), predicted=True,
                           facts=facts))
    out += _dead_terms(trace, source)
    return out + starved_terms(trace, source, {_named_line(f) for f in out}, explained)


def _named_line(f: Finding):
    at = f.at if f.at is not None else (f.op.location if f.op is not None else None)
    return (at.filename, at.line) if at is not None else (None, None)


def cut_of(trace: TraceData, source, tid: int, before: int):
    """(the op to name, the line to name where it is not the op's, facts) for the chain from tensor
    `tid` back to what requires grad, cut before op `before`: the op that cut it, placed where grad
    was switched off when it ran with grad off (the switch left off, the line of the grad-off block
    that called the module which ran it, the decorator of the function it ran in); (None, None,
    facts) when nothing it came from ever required grad. `why` in the facts: "op", "frozen", "data",
    "switched" (by `switch`, where `why_op` ran), "decorated" (by the decorator at `decorator`),
    "no-graph" (a derivative taken by `why_op` without a graph of its own: `create_graph` says
    whether it was asked for)."""
    cut, why = _find_cut(trace, tid, before)
    facts = {"why": why, "why_op": cut, "switch": None}
    if cut is None or why in ("frozen", "no-graph"):
        if why == "no-graph":
            facts["create_graph"] = _asked_for_graph(trace, source, cut)
            facts["with_graph"] = _with_graph(trace, source, cut)
            facts["file"] = trace.file_label(cut.location.filename) if cut.location else ""
        return cut, None, facts
    return place_cut(trace, source, cut, facts)


def _line_of(op: OpRecord):
    return (op.location.filename, op.location.line) if op.location else (None, None)


def _dead_terms(trace: TraceData, source) -> List[Finding]:
    """A term added to a loss (one value added to another that requires grad, on the way to a backward
    call) that was computed from tensors that required grad but has no path to any of them: it trains
    nothing, and its weight changes no gradient (a penalty computed through argmax, `.item()`, a
    comparison). Named at the first op on its way where the chain stopped requiring grad. A term cut
    by `.detach()` or `.data`, whose only purpose is to stop the gradient, was cut on purpose (a
    stop-gradient target, a total kept for logging). Each place in the code is judged once (the
    iterations of a loop do the same)."""
    out, judged, reached = [], set(), {}
    backwards = [cp for cp in backward_checkpoints(trace) if trace.ops[cp.op_index].error is None and cp.roots]
    for op in trace.ops:
        if op.name.rpartition(".")[2] not in ADDS or op.is_backward or op.node is None or op.location is None \
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
            # The cuts on its history: ops that made a tensor it came from, or took out the values of one.
            cuts = [o for o in trace.ops[:op.index] if is_cut(trace, o) and not _reads_only_the_layout(o)
                    and any(t in sources for t in (o.outputs or o.inputs))]
            if not cuts or any(o.name.rpartition(".")[2] in STOP_GRADIENT for o in cuts):
                continue  # `.detach()` on the way says the term is meant to carry no gradient
            cut, at, facts = place_cut(trace, source, cuts[0])
            facts["added_at"] = op.location.line
            out.append(Finding("graph-cut", "dead-term", op=cut, at=at, subject=term, tids=(term,), facts=facts))
    return out


@words("cut")
def _cut(trace: TraceData, f: Finding) -> Words:
    facts, cut = f.facts, f.op
    tensor = trace.tensor_label(f.subject)
    why = why_cut(facts)
    if facts["made_without"]:
        what = "`%s` was made without any tensor that requires grad (%s)" % (tensor, why)
    else:
        what = "%s cut `%s` off the graph: %s" % (where_at(cut, f.at), tensor, why)
    if facts["hidden"]:
        message = ("%s. `%s.requires_grad` was then set by hand, which silences PyTorch's error, but backward() stops "
                   "at `%s`: no parameter gets a gradient, and training does nothing." % (what, tensor, tensor))
        fix = ("%s remove the line that sets `%s.requires_grad`, and keep the loss connected to the parameters "
               "(%s)." % (NO_ONE_LINE_FIX, tensor, why))
    else:
        call = "torch.autograd.grad()" if facts["backward"].name == "torch.autograd.grad" else "backward()"
        message = ("%s. %s %s \"element 0 of tensors does not require grad and does not have a grad_fn\". "
                   "Setting `%s.requires_grad = True` would hide the error and train nothing: the chain to the "
                   "parameters is still cut." % (what, call, "raised" if facts["backward"].error else "will raise",
                                                 tensor))
        fix = cut_fix(cut, facts["why"], facts)
    return Words(message, fix, tensor)


@words("dead-term")
def _dead_term(trace: TraceData, f: Finding) -> Words:
    tensor = trace.tensor_label(f.subject)
    message = ("`%s` is added to the loss at line %d, but it has no path to the tensors it was computed from: %s "
               "cut it (%s). backward() runs, and this term changes no gradient: it trains nothing, and its weight "
               "does nothing." % (tensor, f.facts["added_at"], where_at(f.op, f.at), why_cut(f.facts)))
    return Words(message, cut_fix(f.op, f.facts["why"], f.facts), tensor)


@words("rebuilt-loss")
def _rebuilt_loss(trace: TraceData, f: Finding) -> Words:
    made, root, rebuilt = f.op, f.subject, f.facts["rebuilt"]
    tensor = name(trace, root) or trace.tensor_label(root)
    leaf = "`%s`" % name(trace, rebuilt[0]) if name(trace, rebuilt[0]) and rebuilt[0] != root else "a new leaf"
    message = (
        "%s made %s from values the parameters computed, and set `requires_grad` on it: a tensor made that way "
        "has no history, so backward() from `%s` stops there. PyTorch raises nothing, but no parameter gets a "
        "gradient, and training does nothing." % (where(made), leaf, tensor))
    rewritten = without_exit(made.location.source) if made.location else None
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
    return Words(message, fix, tensor)


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
                or trained(info):
            return []  # a flag set by hand later is found with the cut it hides (graph_cut above)
        made = trace.ops[info.created_by]
        sources = ancestors(trace, made.inputs or [tid], made.index + 1) - {tid}
        if not any(t in trace.tensors and trained(trace.tensors[t]) and trace.tensors[t].first_requires_grad
                   for t in sources):
            return []
        rebuilt.append(tid)
    return rebuilt


def trained(info) -> bool:
    return info.is_parameter or info.optimized or info.owner is not None


def _find_cut(trace: TraceData, root: int, before: int):
    """(the op that cut the chain from `root` back to what requires grad, why: "op" or "frozen"), or
    (None, "data")."""
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

    def required(info):
        if info.alive:
            return info.requires_grad
        return info.first_requires_grad and info.tid not in set_on

    leaves = [trace.tensors[t] for t in found if t in trace.tensors and trace.tensors[t].is_leaf]
    frozen = [info.tid for info in leaves if info.owner and not required(info)]
    if frozen and not any(required(info) for info in leaves):
        freezing = [op for op in setting if any(t in op.inputs for t in frozen)]
        uses = [op for op in trace.ops[:before] if any(t in op.inputs for t in frozen)]
        # Where it was frozen, if a recorded call did it; else the forward that used it (not the
        # initialisation inside the module's constructor).
        in_forward = [op for op in uses if op.module]
        use = freezing[-1] if freezing else (in_forward or uses or [None])[0]
        return use, "frozen"
    if cuts:
        # A cut that drops a graph already built, before one where no graph was recorded on purpose (a
        # reward or a teacher run under no_grad); of those, the last.
        cut = max(cuts, key=lambda op: (_drops_a_graph(trace, op), op.index))
        return cut, "op"
    # A derivative (autograd.grad, whose results the walk does not go through) that came back without a
    # graph while what it differentiated had one: the chain ends there.
    derivative = [op for op in trace.ops[:before] if op.is_backward and op.error is None and
                  any(t in found and not requires_grad(trace, t) for t in op.outputs) and
                  any(requires_grad(trace, t) for t in op.inputs)]
    if derivative:
        return derivative[-1], "no-graph"
    return None, "data"


def _asked_for_graph(trace: TraceData, source, op: OpRecord) -> Optional[bool]:
    """Whether the derivative `op` (autograd.grad, backward) was asked to record a graph: False where
    its graph was not kept (retain_graph defaults to create_graph); else what its call says for
    `create_graph` (None where the call cannot be read)."""
    cp = next((cp for cp in trace.checkpoints if cp.kind == "backward" and cp.op_index == op.index), None)
    if cp is not None and not cp.retain:
        return False
    call = _the_call(source, op)
    if call is None:
        return None
    given = next((k.value for k in call.keywords if k.arg == "create_graph"), None)
    if given is None:
        return False if not any(k.arg is None for k in call.keywords) else None
    return given.value if isinstance(given, ast.Constant) and isinstance(given.value, bool) else None


def _with_graph(trace: TraceData, source, op: OpRecord):
    """(first line, last line, the statement) of op's statement with `create_graph=True` in its call
    of the derivative, or None."""
    if op.location is None or source is None:
        return None
    tree = parse_fresh(source.text(op.location))
    call = _the_call(source, op, tree)
    if call is None or len(tree.body) != 1:
        return None
    call.keywords = [k for k in call.keywords if k.arg != "create_graph"] + [
        ast.keyword(arg="create_graph", value=ast.Constant(True))]
    first = source.index.first_line(op.location)
    span = source.index.facts(op.location.filename).spans.get(op.location.line)
    return first, span[1] if span else first, ast.unparse(tree)


def _the_call(source, op: OpRecord, tree=None) -> Optional[ast.Call]:
    """The one call of `torch.autograd.grad` / `.backward` in op's statement, as written."""
    if op.location is None or source is None:
        return None
    tree = tree if tree is not None else parse_statement(source.text(op.location))
    short = op.name.rpartition(".")[2]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))
             and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id) == short] if tree else []
    return calls[0] if len(calls) == 1 else None


def _drops_a_graph(trace: TraceData, cut: OpRecord) -> bool:
    """Whether `cut` took its values from a tensor with a graph behind it (`log_probs[0, i].item()`),
    not from what ran with no graph recorded at all (a reward model's forward under no_grad)."""
    return any(t in trace.tensors and trace.tensors[t].first_requires_grad and not trace.tensors[t].is_leaf
               for t in cut.inputs)


