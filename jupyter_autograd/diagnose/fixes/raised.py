"""The fixes of the errors torch raises inside the block about a property of a tensor or a call
(rules/causes.py): NumPy handed a tensor that requires grad, a tensor that does not require grad where
a gradient is needed, deepcopy of a non-leaf, a parameter assigned a plain tensor, float16 gradients
under GradScaler, an autograd.Function without setup_context under torch.func, reentrant
checkpointing under .grad()."""
from __future__ import annotations

import ast
import re
from typing import Optional

from ...model import OpRecord
from ...source.index import parse_fresh
from ...source.rewrites import as_code, is_code_name, is_simple_statement
from .words import NO_ONE_LINE_FIX, REPLACE, code, line_ref


def numpy_fix(src: str, name: Optional[str], began: Optional[OpRecord]) -> str:
    """`.detach()` before `.numpy()` on the line that raised, where the line says which call it is."""
    rewritten = None
    if src.count(".numpy(") == 1:
        rewritten = src.replace(".numpy(", ".detach().numpy(")
    elif is_code_name(name) and src.count("%s.numpy(" % name) == 1:
        rewritten = src.replace("%s.numpy(" % name, "%s.detach().numpy(" % name)
    untrained = (" If nothing is trained from it, compute it under `torch.no_grad()` where its history begins (%s)."
                 % line_ref(began)) if began is not None else ""
    if rewritten is not None and is_simple_statement(rewritten.split("#")[0].strip()):
        return ("Hand NumPy the values without the graph: `.detach()` returns the same values without history (the "
                "tensor itself keeps its graph for backward). %s\n%s\n%s" % (REPLACE, code(rewritten), untrained.strip()))
    return ("%s hand NumPy values without a history: `.detach()` each tensor (or `.item()` for one number) before NumPy "
            "sees it.%s" % (NO_ONE_LINE_FIX, untrained))


def needs_grad_fix(raising: str, name: Optional[str], why: str, guarded, cut_fix_text: Optional[str],
                   as_leaf: Optional[str] = None) -> str:
    """A tensor that does not require grad where a gradient is needed: a tensor of data made without
    requires_grad made a leaf that requires it where it is made (`as_leaf`: that statement rewritten);
    a parameter frozen or made without it on purpose left out where the call is made (`guarded`:
    (first line, last line, file label, the statement rewritten, whether that is the whole fix)); a
    computed tensor kept on the graph (the fix of its cut)."""
    shown = "`%s`" % as_code(name) if is_code_name(name) else "it"
    if why in ("made-without", "data") and as_leaf is not None:
        return ("Make it a leaf that requires grad where it is made, so that autograd records what is computed from "
                "it and can give its gradient. %s\n%s" % (REPLACE, code(as_leaf)))
    if why in ("frozen", "made-without") and guarded is not None:
        first, last, label, block, one_line = guarded
        if not one_line:  # the gradients come back for fewer tensors: code that pairs them with the list changes
            return ("%s ask for the gradients of the tensors that require grad only (%s was made that way on purpose, "
                    "frozen or constant, and never gets a gradient), and pair the gradients with that same list, "
                    "not with the full one:\n%s\nTo train it instead, set `requires_grad_(True)` on it where it is "
                    "made." % (NO_ONE_LINE_FIX, shown, code(block)))
        head = ("Replace line %d of %s with:" % (first, label) if first == last else
                "Replace lines %d to %d of %s with:" % (first, last, label))
        return ("Leave out what does not require grad where the gradients are asked for (%s was made that way on "
                "purpose, frozen or constant): a tensor without requires_grad never gets a gradient. %s\n%s\n"
                "To train it instead, set `requires_grad_(True)` on it where it is made." % (shown, head, code(block)))
    if why in ("frozen", "made-without"):
        return ("%s %s does not require grad: leave it out of %s (test `.requires_grad` first), or make it trainable "
                "with `requires_grad_(True)` where it is made." % (NO_ONE_LINE_FIX, shown, raising))
    if cut_fix_text is not None:
        return cut_fix_text
    return ("%s %s has to be computed on the graph, from tensors that require grad, with grad on, before %s can "
            "use its gradient." % (NO_ONE_LINE_FIX, shown, raising))


def no_grad_cut_fix(name: Optional[str]) -> str:
    """A tensor computed with grad off, needed with a gradient."""
    shown = "`%s`" % as_code(name) if is_code_name(name) else "it"
    return ("%s compute %s with grad on: outside `torch.no_grad()` and `torch.inference_mode()`, which record no "
            "graph (a helper written for evaluation needs a twin that records one)." % (NO_ONE_LINE_FIX, shown))


_WEIGHT_NORM_OP = "torch._weight_norm"  # the op by which torch.nn.utils.weight_norm computes `weight`


def nonleaf_copied_fix(src: str, stored: Optional[str], maker: str = "") -> str:
    """copy.deepcopy of a tensor with a history; `maker`: the name of the op that made it."""
    rewritten = None
    if maker == _WEIGHT_NORM_OP and src.count("weight_norm(") == 1:
        if "utils.weight_norm(" in src:
            rewritten = src.replace("utils.weight_norm(", "utils.parametrizations.weight_norm(")
        elif re.search(r"(?<![\w.])weight_norm\(", src):  # imported by its own name
            rewritten = re.sub(r"(?<![\w.])weight_norm\(", "torch.nn.utils.parametrizations.weight_norm(", src)
    if rewritten is not None:
        return ("Use the parametrization version of weight normalization: it computes `weight` when it is read, so "
                "the module holds only leaves and copies. %s\n%s" % (REPLACE, code(rewritten)))
    if maker == _WEIGHT_NORM_OP:  # made by the hook that weight_norm installs, at the call of the module
        return ("%s where weight normalization is applied to the module, use its parametrization version, "
                "`torch.nn.utils.parametrizations.weight_norm`: it computes `weight` when it is read, so the module "
                "holds only leaves and copies." % NO_ONE_LINE_FIX)
    if stored:
        return ("%s keep on the object only what copies: store `%s` detached where only its value is needed later "
                "(`.detach()`), or clear it (set it to None) before the object is copied." % (NO_ONE_LINE_FIX, stored))
    return ("%s copy a tensor with a history as `.detach().clone()` (its values, without the graph), or compute it under "
            "`torch.no_grad()` if nothing is trained from it." % NO_ONE_LINE_FIX)


def nonleaf_optimized_fix(name: Optional[str], rewritten, label: str) -> str:
    """An optimizer handed a tensor with a history: make a leaf of its values where it is made."""
    shown = "`%s`" % as_code(name) if is_code_name(name) else "the tensor"
    if rewritten is not None:
        first, last, block = rewritten
        head = REPLACE if first == last else "Replace lines %d to %d of %s with:" % (first, last, label)
        return ("Make %s a leaf that requires grad, with the same values: `.detach()` drops the history and "
                "`.requires_grad_()` makes the new leaf trainable. %s\n%s" % (shown, head, code(block)))
    return ("%s hand the optimizer leaves: set requires_grad after the last operation (`x = x.detach()."
            "requires_grad_()`), or create the tensor where it is used, with `device=` and `dtype=` given to its "
            "factory." % NO_ONE_LINE_FIX)


def not_a_parameter_fix(target: Optional[str]) -> str:
    """A module's parameter assigned a plain tensor."""
    written = "`%s.copy_(new_value)`" % as_code(target) if is_code_name(target) else "`.copy_()`"
    return ("%s to change the parameter's values, write them into it under `torch.no_grad()` (%s), so that the "
            "module and any optimizer keep the same parameter; to use a computed tensor instead, give it a name of "
            "its own and use that name where the computed value is meant; to replace the parameter, assign "
            "`nn.Parameter(new_value)` (an optimizer built earlier still holds the old one)." % (NO_ONE_LINE_FIX, written))


def fp16_fix() -> str:
    return ("%s keep the parameters you train in float32: `torch.autocast` runs the forward in float16 where that is "
            "safe, and the scaler then unscales float32 gradients; cast to float16 only modules you do not train. A "
            "model trained in float16 on purpose is trained without a GradScaler (bfloat16 needs none)."
            % NO_ONE_LINE_FIX)


def setup_context_fix(function: str) -> str:
    return ("%s split `%s.forward` in two staticmethods: `forward(...)` without ctx, which returns the outputs, and "
            "`setup_context(ctx, inputs, output)`, which saves what backward needs (ctx.save_for_backward); under "
            "torch.vmap, also set `generate_vmap_rule = True` on the class (or write a `vmap` staticmethod)."
            % (NO_ONE_LINE_FIX, function))


def applied_function_fix(function: str) -> str:
    return ("%s `%s` belongs to a library: call it outside the transform (batch the inputs instead of vmap, "
            "differentiate with `torch.autograd.grad` instead of torch.func.grad), or use a version of it that "
            "supports torch.func." % (NO_ONE_LINE_FIX, function))


def reentrant_fix(src: str) -> str:
    """Checkpoint with use_reentrant=False on the culprit line."""
    rewritten = _non_reentrant(src)
    if rewritten is not None:
        return ("Checkpoint without a reentrant backward: the recomputation then runs inside the graph of the call "
                "that needs it, which supports .grad(), backward(inputs=...) and torch.func. %s\n%s"
                % (REPLACE, code(rewritten)))
    return ("%s pass use_reentrant=False to the checkpoint call: the recomputation then runs inside the graph of the "
            "call that needs it." % NO_ONE_LINE_FIX)


def checkpoint_under_transform_fix(src: str) -> str:
    """A reentrant checkpoint under a torch.func transform: the block called directly inside it. That
    holds under every transform and torch version; use_reentrant=False does not (torch.func.grad and
    vjp refuse its saved-tensor hooks, and before torch 2.11 vmap and jvp refuse it too)."""
    rewritten = _without_checkpoint(src)
    keep = ("" if not _non_reentrant_runs_under_forward_transforms() else
            " To keep the memory saving under vmap or jvp, `use_reentrant=False` instead runs there on this torch "
            "(not under torch.func.grad or vjp, which refuse its saved-tensor hooks).")
    if rewritten is not None:
        return ("Call the block without checkpointing inside the transform: torch.func runs the block itself, and "
                "it keeps what the block's backward needs.%s %s\n%s" % (keep, REPLACE, code(rewritten)))
    return ("%s call the checkpointed function directly inside the torch.func transform (no checkpoint there).%s"
            % (NO_ONE_LINE_FIX, keep))


def _one_call(src: str, names) -> Optional[tuple]:
    """(the tree of the one-statement line `src`, its one call of a function named in `names`), or None."""
    tree = parse_fresh(src.partition("#")[0].strip())
    if tree is None or len(tree.body) != 1:
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).rpartition(".")[2] in names]
    return (tree, calls[0]) if len(calls) == 1 else None


def _without_checkpoint(src: str) -> Optional[str]:
    found = _one_call(src, ("checkpoint",))
    if found is None or not found[1].args or isinstance(found[1].args[0], ast.Starred):
        return None
    tree, call = found
    options = {"use_reentrant", "preserve_rng_state", "determinism_check", "debug", "context_fn"}
    call.func, call.args = call.args[0], call.args[1:]
    call.keywords = [k for k in call.keywords if k.arg not in options]
    return ast.unparse(tree)


_FORWARD_TRANSFORM_PROBE: list = []


def _non_reentrant_runs_under_forward_transforms() -> bool:
    """Whether this torch runs a non-reentrant checkpoint under torch.func.jvp and vmap (2.11 and later
    do; 2.10 refuses both): tried once on a one-element tensor of our own, with no mode of the tool."""
    if not _FORWARD_TRANSFORM_PROBE:
        import torch
        from torch.utils.checkpoint import checkpoint
        try:
            with torch._C.DisableTorchFunction():
                t = torch.zeros(1)
                torch.func.jvp(lambda x: checkpoint(torch.sin, x, use_reentrant=False), (t,), (t,))
                torch.func.vmap(lambda x: checkpoint(torch.sin, x, use_reentrant=False))(t)
            _FORWARD_TRANSFORM_PROBE.append(True)
        except Exception:  # any refusal means: not on this torch
            _FORWARD_TRANSFORM_PROBE.append(False)
    return _FORWARD_TRANSFORM_PROBE[0]


def _non_reentrant(src: str) -> Optional[str]:
    found = _one_call(src, ("checkpoint", "checkpoint_sequential"))
    if found is None:
        return None
    tree, call = found
    call.keywords = [k for k in call.keywords if k.arg != "use_reentrant"] + [
        ast.keyword(arg="use_reentrant", value=ast.Constant(False))]
    return ast.unparse(tree)
