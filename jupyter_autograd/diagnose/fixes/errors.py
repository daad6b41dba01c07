"""The fixes of the errors of gradient flow and of the errors PyTorch raises: a cut kept connected, a
non-leaf made a leaf, a loss reduced, a custom Function's gradients, DDP's parameters, the floor."""
from __future__ import annotations

import ast
from typing import Optional

from ...model import OpRecord
from ...source.rewrites import as_code, is_code_name, is_simple_statement, reduced, single_statement
from .words import NO_ONE_LINE_FIX, REPLACE, code, cut_spelling, line_ref


def starved_fix(name: str, cut: OpRecord, rewritten: Optional[str], advice: Optional[str] = None) -> str:
    """The fix for a trained tensor whose path to the loss one op cut: it names that op (`.item()`
    on line 11) and, where the line rebuilt a tensor from it (`torch.tensor(x.mean().item())`), gives
    the line that keeps the tensor: the same value, now with its history."""
    spelled = cut_spelling(cut)
    freeze = "If `%s` should not be trained, freeze it on purpose (`requires_grad_(False)`)." % as_code(name)
    if rewritten and is_simple_statement(rewritten):
        return ("Keep the chain from `%s` to the loss: %s on %s gives a value without history. %s\n%s\n%s"
                % (as_code(name), spelled, line_ref(cut), REPLACE, code(rewritten), freeze))
    if advice:  # what to do about this kind of cut (an index, a checkpoint given no tensor that requires grad)
        return ("%s %s on %s cuts the chain from `%s` to the loss: %s, so that `%s` gets a gradient. %s"
                % (NO_ONE_LINE_FIX, spelled, line_ref(cut), as_code(name), advice, as_code(name), freeze))
    instead = "outside `torch.no_grad()` and `torch.inference_mode()`" if not cut.grad_enabled else \
        "with torch operations on the tensor itself, without %s" % spelled
    return ("%s %s on %s cuts the chain from `%s` to the loss: compute that value %s. %s"
            % (NO_ONE_LINE_FIX, spelled, line_ref(cut), as_code(name), instead, freeze))

def nonleaf_requires_grad_fix(src: str, name: Optional[str], also_set: int = 0) -> str:
    """`x.requires_grad = True` on a tensor with a history (see errors.nonleaf_requires_grad): make a leaf
    of it, `x = x.detach().requires_grad_()`; for False, `x = x.detach()`. Not where the line also set
    the flag of `also_set` other tensors (leaves): rebinding its name to a copy would drop the change
    for them, the line's purpose."""
    stmt = single_statement(src)
    target, flag = None, None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute) \
            and stmt.targets[0].attr == "requires_grad" and isinstance(stmt.value, ast.Constant):
        target, flag = stmt.targets[0].value, bool(stmt.value.value)
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "requires_grad_":
        call = stmt.value
        given = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "requires_grad"), None)
        if given is None or isinstance(given, ast.Constant):
            target, flag = call.func.value, True if given is None else bool(given.value)
    if not isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)):
        return ("%s to train `%s` as a tensor of its own, make a new leaf of it: `%s.detach().requires_grad_()`, "
                "assigned where the code reads it; to read the gradient of the non-leaf itself, call `.retain_grad()` "
                "on it before backward." % (NO_ONE_LINE_FIX, name, as_code(name) if is_code_name(name) else "x"))
    expr = ast.unparse(target)
    if also_set:
        held = "`%s`" % as_code(name) if is_code_name(name) and name != expr else "it"
        return ("%s this line also sets requires_grad of %d other tensor%s (leaves, for which it works): rebinding "
                "`%s` to a copy would take the change away from them, and would not reach the code that holds %s. "
                "Hand this code a tensor that is a leaf: %s where it is made or passed in, or leave tensors that "
                "are not leaves (`%s.is_leaf` is False) out of it."
                % (NO_ONE_LINE_FIX, also_set, "" if also_set == 1 else "s", expr, held,
                   "`%s`" % (("%s.detach()" if not flag else "%s.detach().requires_grad_()") % as_code(name))
                   if is_code_name(name) else "a detached copy", expr))
    if flag:
        return ("Make it a new leaf with the same values: backward then stores its gradient in `%s.grad`, and the "
                "history before it is dropped, which is what setting requires_grad asks for. %s\n%s\n"
                "To read the gradient of the non-leaf itself instead, keep its history and call `%s.retain_grad()` "
                "before backward." % (expr, REPLACE, code("%s = %s.detach().requires_grad_()" % (expr, expr)), expr))
    return ("To use its values without its history, take a detached copy. %s\n%s"
            % (REPLACE, code("%s = %s.detach()" % (expr, expr))))

def nonscalar_fix(src: str, name: Optional[str], grad_call: bool, backward_at: str) -> str:
    """backward() from a tensor with many values (see errors.nonscalar_backward): reduce it where it is
    made, and say that the reduction is a choice."""
    shown = as_code(name) if is_code_name(name) else ""
    choice = ("The mean is what every built-in loss gives by default (reduction='mean'); if the sum was meant, "
              "use `.sum()` instead (the gradients then grow with the batch size); to weight the values, multiply "
              "by the weights before reducing. To backpropagate a gradient for each value instead, pass it: %s."
              % ("`%s.backward(torch.ones_like(%s))`" % (shown, shown) if shown else "`backward(gradient)`"))
    if grad_call:
        return ("%s `torch.autograd.grad` needs a gradient for each value of %s: pass %s on %s (the gradient of "
                "their sum, what a gradient penalty needs), or reduce it first (`.sum()`, `.mean()`)."
                % (NO_ONE_LINE_FIX, "`%s`" % shown if shown else "its outputs",
                   "`grad_outputs=torch.ones_like(%s)`" % shown if shown else "`grad_outputs`", backward_at))
    rewritten = reduced(src, name)
    if rewritten is not None:
        return "Reduce it to one number where it is made. %s\n%s\n%s" % (REPLACE, code(rewritten), choice)
    return ("%s reduce %s to one number before backward(): `.mean()` or `.sum()`. %s"
            % (NO_ONE_LINE_FIX, "`%s`" % shown if shown else "it", choice))

def not_differentiable_fix(op_name: str, name: Optional[str], input_name: Optional[str]) -> str:
    """An op without a derivative on the way to the loss (see errors.not_differentiable)."""
    detached = "`%s.detach()`" % as_code(input_name) if is_code_name(input_name) else "`.detach()`"
    return ("%s %s has no derivative, so no gradient can flow back through %s. If what it computes only selects, "
            "sorts or counts (indices, a mask, the distinct values), compute it from the detached input (%s) and "
            "keep the values the loss needs on a differentiable path (index the original tensor with what it "
            "returns); otherwise replace it with a differentiable operation (a soft version, `torch.softmax` "
            "instead of a hard choice)." % (NO_ONE_LINE_FIX, op_name,
                                            "`%s`" % as_code(name) if is_code_name(name) else "its result", detached))

def second_order_fix(op_name: str, inner_backward: str) -> str:
    """A second-order gradient through an op whose backward has no derivative (see errors.not_differentiable)."""
    return ("%s the backward of %s cannot be differentiated, so no gradient of a gradient can flow through it. "
            "Either take the inner gradient on %s without create_graph=True (a first-order approximation: its "
            "result then enters the loss as a constant), or compute %s with operations whose backward is "
            "differentiable (its plain formula, written with torch operations)."
            % (NO_ONE_LINE_FIX, op_name, inner_backward, op_name))

def invalid_gradient_fix(function: str, shape: bool) -> str:
    """A custom Function whose backward returns the wrong gradients (see errors.invalid_gradient)."""
    what = ("each with the shape of its input: sum a broadcast gradient back over the broadcast dimensions "
            "(`.sum(dim, keepdim=True)`), reshape a flattened one (`.reshape(...)`)" if shape else
            "one value for each")
    return ("%s `%s.backward` must return one gradient per input of `%s.forward` (after ctx), in the same order, %s, "
            "and None for an input that is not a tensor or needs no gradient. `torch.autograd.gradcheck` on small "
            "double-precision inputs then checks its values against finite differences."
            % (NO_ONE_LINE_FIX, function, function, what))

def ddp_unused_fix(module: str, names, why: str) -> str:
    """Parameters a DDP waited for in vain (see errors.ddp_unused_parameters)."""
    owner = as_code(names[0].rpartition(".")[0]) if names and is_code_name(names[0]) else ""
    build = ("\n%s\n" % code("ddp = torch.nn.parallel.DistributedDataParallel(%s, find_unused_parameters=True)"
                             % as_code(module)) if is_code_name(module) else " ")
    listed = ", ".join("`%s`" % n for n in names[:8]) + (" and %d more" % (len(names) - 8) if len(names) > 8 else "")
    return ("%s in the last iteration %s got no gradient: %s. If that is on purpose (an auxiliary head used only on "
            "some steps, a branch not taken), build the DDP with find_unused_parameters=True, and it looks for such "
            "parameters in every iteration (one more walk over the graph):%sIf they should train, make what they "
            "compute part of the loss; if they should not train at all, freeze them before wrapping the model%s."
            % (NO_ONE_LINE_FIX, listed, why, build, " (`%s.requires_grad_(False)`)" % owner if owner else ""))

def ddp_ready_twice_fix(src: str, by_function: bool) -> str:
    """A parameter's gradient delivered twice to DDP in one backward (see errors.ddp_ready_twice)."""
    others = ("Or, if the model's graph is the same in every iteration, build the DDP with static_graph=True; or "
              "with find_unused_parameters=False if every parameter is used in every iteration.")
    if "use_reentrant=True" in src and is_simple_statement(src.replace("use_reentrant=True", "use_reentrant=False")):
        return ("Checkpoint without a reentrant backward: the recomputation then runs inside this backward's own "
                "graph, and DDP sees each parameter's gradient once. %s\n%s\n%s"
                % (REPLACE, code(src.replace("use_reentrant=True", "use_reentrant=False")), others))
    if by_function:
        return ("%s pass use_reentrant=False to the checkpoint on that line, so that the recomputation runs inside "
                "this backward's graph. %s" % (NO_ONE_LINE_FIX, others))
    return ("%s use the parameter only inside the forward of the DDP module, so that its gradient reaches DDP once. %s"
            % (NO_ONE_LINE_FIX, others))

def backward_error_fix(name: Optional[str], line: Optional[int], error: Optional[str],
                       hook: Optional[str] = None) -> str:
    """The floor (see errors.backward_error): where to look, and how to make PyTorch say more; for a hook
    whose return value PyTorch refused, what a hook must return."""
    if hook is not None:
        return ("%s make the hook `%s` return None (to leave the gradient as it is) or a gradient like the one it "
                "gets: of the same shape, dtype and device (for a module's hook, one for each gradient of the tuple "
                "it gets, in the same order). A module hook registered with `register_backward_hook` gets the "
                "gradients of the module's last operation, whose inputs may not be the module's (a layer without "
                "bias has one input less): `register_full_backward_hook` gives those of the module's own inputs."
                % (NO_ONE_LINE_FIX, hook))
    if error and "grad_output" in error:
        return ("%s the gradient given to backward() must have the shape and dtype of the tensor it starts from: "
                "%s for the gradient of its sum, or the gradient you computed, reshaped and cast to match."
                % (NO_ONE_LINE_FIX, "`torch.ones_like(%s)`" % as_code(name) if is_code_name(name) else
                   "`torch.ones_like(...)` of that tensor"))
    return ("%s jupyter-autograd does not know this error in detail; %s is where it comes from. Running the forward "
            "pass and the backward call under `torch.autograd.detect_anomaly()` adds the forward traceback of the "
            "failing node to PyTorch's message." % (NO_ONE_LINE_FIX, "line %d" % line if line else "the line above"))
