"""nan-gradient: NaN or Inf gradients, made by backward from a finite forward pass or carried in from a
forward pass that was not finite.

Reasons: `nan-at-node` (with check_nan: the node whose backward first turned finite gradients into
NaN/Inf, named at the forward line that made it, with what its saved inputs held), `nan-after-backward`
(without it: the leaves whose gradients held NaN/Inf after a checked backward call), `nan-in-forward`
(the tensor that backward started from already held NaN/Inf: named at the first op whose result held
one, where the CPU let the tool read it, else at the line that made that tensor). Whether the loss
was finite is read, not assumed (trace.roots_finite)."""
from __future__ import annotations

import re
from typing import List

from ...model import TraceData
from ..findings import Finding, Words
from ..fixes import NO_ONE_LINE_FIX, line_ref, where
from ..wording import words
from .common import in_backticks, made, name

_CAUSES = {
    "Sqrt": ("result", "zeros", "the square root of 0 at {n} of {total} positions: its derivative 1/(2*sqrt(x)) is "
             "infinite there", "add a small epsilon inside the root (`torch.sqrt(x + 1e-12)`, or "
             "`x.clamp_min(1e-12).sqrt()`)"),
    "Rsqrt": ("self", "zeros", "rsqrt of 0 at {n} of {total} positions", "clamp the input: `x.clamp_min(1e-12).rsqrt()`"),
    "Log": ("self", "zeros", "the log of 0 at {n} of {total} positions: its derivative 1/x is infinite there",
            "clamp the input: `torch.log(x.clamp_min(1e-12))`, or use `torch.log_softmax` / `torch.log1p`"),
    "Div": ("other", "zeros", "a division by 0 at {n} of {total} positions (a zero norm or count)",
            "divide by a clamped value: `x / y.clamp_min(1e-12)`, or use `torch.nn.functional.normalize`"),
    "Pow": ("self", "zeros", "a power below 1 of 0 at {n} of {total} positions (`x ** p` with p < 1 has an "
            "infinite derivative at 0)", "add an epsilon: `(x + 1e-12) ** p`"),
    "LinalgVectorNorm": ("result", "zeros", "the norm of a zero vector at {n} of {total} positions: its "
                         "derivative x / norm(x) is 0/0", "add an epsilon: `torch.sqrt((x ** 2).sum(-1) + 1e-12)`, "
                         "or `torch.nn.functional.normalize(x, eps=1e-12)`"),
    "Norm": ("result", "zeros", "the norm of a zero vector at {n} of {total} positions", "add an epsilon inside "
             "the norm, or use `torch.nn.functional.normalize(x, eps=1e-12)`"),
    "Acos": ("self", "unit", "acos at +-1 at {n} of {total} positions", "clamp the input to (-1 + 1e-7, 1 - 1e-7)"),
    "Asin": ("self", "unit", "asin at +-1 at {n} of {total} positions", "clamp the input to (-1 + 1e-7, 1 - 1e-7)"),
}


def nan_gradient(trace: TraceData, source) -> List[Finding]:
    origin = trace.nan_origin
    if origin is not None:
        key = origin["node"]
        node = trace.nodes.get(key)
        op = trace.ops[node.created_by] if node is not None and node.created_by is not None else None
        if origin.get("op") is not None:  # a compiled region's node: the line inside it that made the NaN
            op = trace.ops[origin["op"]]
    if origin is not None and (trace.roots_finite.get(origin["backward"]) is not False or (
            op is not None and trace.nonfinite_forward.get(origin["backward"]) == op.index)):
        # A finite loss (or not read), or a node made by the very op where the forward pass first left the
        # finite numbers (log of 0): the node's own cause says most.
        backward = trace.ops[origin["backward"]] if origin["backward"] < len(trace.ops) else None
        made = op.outputs[0] if op is not None and op.outputs else None
        return [Finding("nan-gradient", "nan-at-node", op=op, saved=backward, subject=made,
                        tids=tuple(t for t in (made,) if t is not None), node_key=key,
                        facts={"node": origin["name"], "inputs": origin["facts"] or {}})]
    bad = [t.tid for t in trace.tensors.values() if t.nonfinite_after is not None]
    if not bad:
        return []
    first = min(bad, key=lambda t: trace.tensors[t].nonfinite_after)
    backward = trace.ops[trace.tensors[first].nonfinite_after]
    if trace.roots_finite.get(backward.index) is False:
        return [_from_forward(trace, backward, bad)]
    return [Finding("nan-gradient", "nan-after-backward", op=backward, subject=bad[0], tids=tuple(bad))]


def _from_forward(trace: TraceData, backward, bad) -> Finding:
    """The backward started from NaN/Inf: the forward pass made it. Culprit: the first op whose result
    held NaN (else Inf), where it was read; else the line that made the tensor backward started from."""
    root = next((t for t in backward.inputs if t in trace.tensors), None)
    first = trace.nonfinite_forward.get(backward.index)
    op = trace.ops[first] if first is not None and first < len(trace.ops) else made(trace, root)
    result = op.outputs[0] if op is not None and op.outputs else None
    return Finding("nan-gradient", "nan-in-forward", op=op if op is not None else backward, saved=backward,
                   subject=result if first is not None else root,
                   tids=tuple(t for t in (result, root) if t is not None) + tuple(bad),
                   facts={"root": root, "traced": first is not None, "gradients": tuple(bad)})


@words("nan-in-forward")
def _in_forward(trace: TraceData, f: Finding) -> Words:
    facts, backward, op = f.facts, f.saved, f.op
    root = trace.tensor_label(facts["root"]) if facts["root"] is not None else "the tensor backward started from"
    gradients = [trace.tensor_label(t) for t in facts["gradients"]]
    if facts["traced"]:
        first = ("%s is the first line whose result (`%s`) held NaN or Inf" % (where(op), trace.tensor_label(f.subject))
                 if op is not None else "")
        message = ("`%s` already held NaN or Inf when backward started from it on %s: the forward pass made it, "
                   "and backward carried it into the gradient of %s. %s. An optimizer step with these gradients "
                   "turns the weights into NaN."
                   % (root, line_ref(backward), in_backticks(gradients), first[:1].upper() + first[1:]))
        fix = ("%s make the forward values finite where %s makes NaN or Inf: a log or a division of 0, a softmax "
               "over a row masked entirely with -inf (fill with a large negative number such as "
               "`torch.finfo(x.dtype).min`, or keep one position unmasked), 0 * inf from a masked value."
               % (NO_ONE_LINE_FIX, line_ref(op) if op is not None else "the forward pass"))
    else:
        message = ("`%s`%s already held NaN or Inf when backward started from it on %s: the forward pass made it, "
                   "and backward carried it into the gradient of %s. An optimizer step with these gradients turns "
                   "the weights into NaN." % (root, " (%s)" % where(op) if op is not None else "", line_ref(backward),
                                              in_backticks(gradients)))
        fix = ("%s find the first forward line whose result holds NaN or Inf (`torch.isfinite(t).all()` after each, "
               "or run the block on the CPU, where the tool names it) and make its values finite there."
               % NO_ONE_LINE_FIX)
    return Words(message, fix, root if not facts["traced"] else trace.tensor_label(f.subject))


@words("nan-after-backward")
def _after_backward(trace: TraceData, f: Finding) -> Words:
    names = [trace.tensor_label(t) for t in f.tids]
    message = ("After %s, the gradient of %s holds NaN or Inf values. An optimizer step with it turns the weights "
               "into NaN." % (line_ref(f.op), in_backticks(names)))
    fix = ("%s run the block with capture(check_nan=True) (`%%%%autograd --nan` in a notebook) to find the "
           "forward line whose backward made the first NaN/Inf and the input values that caused it; it costs less "
           "than `torch.autograd.detect_anomaly()` with check_nan." % NO_ONE_LINE_FIX)
    return Words(message, fix, names[0])


@words("nan-at-node")
def _at_node(trace: TraceData, f: Finding) -> Words:
    key, node_name, facts = f.node_key, f.facts["node"], f.facts["inputs"]
    op, backward = f.op, f.saved
    tensor = name(trace, f.subject)
    base = re.sub(r"Backward\d*$", "", node_name)
    cause = _CAUSES.get(base)
    what, fix = None, None
    if cause is not None:
        slot, stat, text, remedy = cause
        saved = facts.get(slot)
        if saved and saved.get(stat):
            what, fix = text.format(n=saved[stat], total=saved["numel"]), remedy
    if what is None:
        what = "%s turned finite incoming gradients into NaN/Inf" % node_name
        fix = "keep the inputs of this operation away from the points where its derivative is infinite or undefined"
    parents = [n for n in trace.nodes.values() if key in n.inputs]
    if any(p.name.startswith("WhereBackward") for p in parents):
        what += ("; `torch.where` chose the other branch at those positions, but the unused branch still gets "
                 "gradient 0, and 0 * inf = NaN")
        fix = ("make the unused branch's input safe before computing it (the double-where trick): first "
               "`safe = torch.where(mask, x, torch.ones_like(x))`, then `torch.where(mask, safe.sqrt(), 0)`, "
               "with your own mask and input")
    fix = "%s %s." % (NO_ONE_LINE_FIX, fix)
    finite = trace.roots_finite.get(backward.index) if backward is not None else None
    message = ("%sackward%s made NaN/Inf first in %s, the gradient of %s%s: %s."
               % ("The forward pass was finite, but b" if finite is True else
                  "The forward pass first made NaN or Inf there too, and b" if finite is False else "B",
                  " on %s" % line_ref(backward) if backward is not None else "", node_name,
                  where(op) if op is not None else "an operation", " (`%s`)" % tensor if tensor else "", what))
    return Words(message, fix, tensor)
