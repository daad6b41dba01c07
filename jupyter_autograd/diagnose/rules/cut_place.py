"""Where a cut is named, why it cut, and its fix: what graph-cut's rules (cuts, starved) and the
causes that end at a cut (causes, missing) say about one op that cut a chain to what requires grad."""
from __future__ import annotations

from typing import Optional

from ...model import GRAD_MODE_SWITCHES, OpRecord, TraceData
from ...model.queries import scope_call, switch_left_on
from ...source.rewrites import without_exit
from ..fixes import NO_ONE_LINE_FIX, REPLACE, REPLACE_LINES, code, line_ref, where
from .common import grad_off_decorator


def place_cut(trace: TraceData, source, cut: OpRecord, facts=None):
    """(the op to name, the line to name where it is not the op's, facts) for an op that cut a chain:
    where grad was switched off when it ran with grad off (see cut_of); else the op itself."""
    facts = facts if facts is not None else {"why": "op", "why_op": cut, "switch": None}
    switch = switch_left_on(trace, cut)
    in_block = scope_call(trace, cut) if switch is None else None
    if in_block is not None:  # the line of the grad-off block that called the module which ran it
        return in_block, None, facts
    if switch is not None:  # the cut is where grad was switched off, not where that was met
        facts.update(why="switched", switch=switch)
        return switch, None, facts
    decorator = grad_off_decorator(trace, source, cut)
    if decorator is not None:  # switched off by a decorator, for every call of the function
        facts.update(why="decorated", decorator=decorator)
        return cut, decorator, facts
    return cut, None, facts


def why_cut(facts) -> str:
    """Why a chain was cut, in words, from a finding's facts (`why`, `why_op`, `switch`)."""
    why = facts["why"]
    if why == "frozen":
        return "every parameter it was computed from is frozen (`requires_grad=False`)"
    if why == "data":
        return "from data alone"
    if why == "switched":
        return why_switched_off(facts["switch"], facts["why_op"])
    if why == "decorated":
        decorator, met = facts["decorator"], facts["why_op"]
        return ("`%s` on `%s()` switches gradient recording off for every call of it, and %s (`%s`) ran inside "
                "such a call: `%s` there recorded no graph" % (decorator.source, decorator.function, line_ref(met),
                                                               met.location.source, met.name))
    if why == "no-graph":
        derivative, asked = facts["why_op"], facts.get("create_graph")
        if asked is False:
            return ("`%s` on %s took a derivative without `create_graph=True`, so what it returned has no graph: "
                    "nothing computed from it can be differentiated again" % (derivative.name, line_ref(derivative)))
        if asked:
            return ("the derivative that `%s` on %s returned does not depend on anything that requires grad (what "
                    "it differentiated is linear in its inputs), so it is a constant without a graph, even with "
                    "create_graph=True" % (derivative.name, line_ref(derivative)))
        return ("the derivative that `%s` on %s returned has no graph: it was taken without `create_graph=True`, "
                "or it is a constant" % (derivative.name, line_ref(derivative)))
    return why_op_cut(facts["why_op"])


def where_at(op: OpRecord, at) -> str:
    """`where(op)`, or the line `at` (a Location) where the finding names another line than its op's."""
    if at is None:
        return where(op)
    return "Line %d (`%s`)" % (at.line, at.source) if at.source else "Line %d" % at.line


def why_switched_off(switch: OpRecord, met: OpRecord) -> str:
    """Why a grad-mode switch (see queries.switch_left_on) cut the graph where `met` ran."""
    ran = line_ref(met) + (" (`%s`)" % met.location.source if met.location and met.location.source else "")
    if switch.location.source.startswith(("with ", "async with ")):
        how = ("its block switched gradient recording off, and the mode stays off until the block ends: %s ran "
               "before that (in a function called from inside the block, or while a generator was suspended at "
               "a `yield` inside it)" % ran)
    else:
        how = ("it switched gradient recording off for everything that runs after it, and nothing switched it "
               "back on before %s ran" % ran)
    return "%s; `%s` there recorded no graph" % (how, met.name)


def why_op_cut(op: OpRecord) -> str:
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


def cut_fix(op: Optional[OpRecord], why: str, facts=None) -> str:
    """The fix for a cut at `op`; `why` (and, for some, the rest of the facts) as in a finding's facts."""
    src = op.location.source if op is not None and op.location else ""
    short = op.name.rpartition(".")[2] if op is not None else ""
    facts = facts or {}
    if why == "decorated":
        decorator = facts["decorator"]
        return ("%s `%s` switches recording off for every call of `%s()`, the training call included: take it off "
                "and switch recording off where the function is evaluated (`with torch.no_grad():` around that "
                "call), or keep a version of the function without it for training." % (
                    NO_ONE_LINE_FIX, decorator.source, decorator.function))
    if why == "no-graph":
        rewritten = facts.get("with_graph")
        if facts.get("create_graph") is False and rewritten is not None:
            first, last, block = rewritten
            head = REPLACE if first == last else REPLACE_LINES % (first, last, facts["file"])
            return ("Ask for the derivative's graph, so that what is computed from it can be differentiated. %s\n%s"
                    % (head, code(block)))
        if facts.get("create_graph"):
            return ("%s the derivative is a constant, so its own derivative is zero: check `.requires_grad` of what "
                    "`%s` returned before differentiating it again, and use zeros where it is False." % (
                        NO_ONE_LINE_FIX, op.name))
        return ("%s pass `create_graph=True` to `%s` where a derivative of its result is taken later; if it was "
                "given, the derivative is a constant and its own derivative is zero." % (NO_ONE_LINE_FIX, op.name))
    if why == "frozen":
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
    rewritten = without_exit(src) if short in ("item", "tolist", "numpy", "__float__") else None
    if rewritten:
        return "Keep the loss a tensor, with no round trip through Python numbers. %s\n%s" % (REPLACE, code(rewritten))
    if short == "detach" and src.count(".detach()") == 1 and ".numpy()" not in src:
        return "Keep the chain to the loss. %s\n%s" % (REPLACE, code(src.replace(".detach()", "")))
    return ("%s compute the loss with differentiable torch operations from the model's output (`torch.clamp` "
            "rather than NumPy's clip, for example); do not go through `.item()`, `.numpy()`, `.detach()`, argmax "
            "or integer casts on the way." % NO_ONE_LINE_FIX)
