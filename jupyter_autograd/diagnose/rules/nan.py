"""nan-gradient: a backward made NaN or Inf gradients from a finite forward pass.

Reasons: `nan-at-node` (with check_nan: the node whose backward first turned finite gradients into
NaN/Inf, named at the forward line that made it, with what its saved inputs held), `nan-after-backward`
(without it: the leaves whose gradients held NaN/Inf after a checked backward call)."""
from __future__ import annotations

import re
from typing import List

from ...model import TraceData
from ..findings import Finding, Words
from ..fixes import NO_ONE_LINE_FIX, line_ref, where
from ..wording import words
from .common import name

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
    return [Finding("nan-gradient", "nan-after-backward", op=backward, subject=bad[0], tids=tuple(bad))]


@words("nan-after-backward")
def _after_backward(trace: TraceData, f: Finding) -> Words:
    names = [trace.tensor_label(t) for t in f.tids]
    message = ("After %s, the gradient of %s holds NaN or Inf values. An optimizer step with it turns the weights "
               "into NaN." % (line_ref(f.op), _listing(names)))
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
    message = ("The forward pass was finite, but backward%s made NaN/Inf first in %s, the gradient of %s%s: %s."
               % (" on %s" % line_ref(backward) if backward is not None else "", node_name,
                  where(op) if op is not None else "an operation", " (`%s`)" % tensor if tensor else "", what))
    return Words(message, fix, tensor)


def _listing(names) -> str:
    shown = ["`%s`" % n for n in names[:8] if n]
    return ", ".join(shown) + (" and %d more" % (len(names) - 8) if len(names) > 8 else "")
