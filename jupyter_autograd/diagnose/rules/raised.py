"""Errors backward raises about the graph it runs, whose message names an internal node, an index or
nothing at all: nonscalar-backward (backward from a tensor with many values), not-differentiable (an
op with no derivative on the way to the loss) and invalid-gradient (a custom Function's backward
returned gradients of the wrong shape or number). Each starts from the error kept on the backward
call that raised it and names the forward line where the fix goes.

Reasons: `nonscalar`, `no-derivative`, `no-second-derivative`, `invalid-gradient`."""
from __future__ import annotations

import re
from typing import List, Optional

from ...model import OpRecord, TraceData, is_description
from ..findings import Finding, Words
from ..fixes import (invalid_gradient_fix, line_ref, nonscalar_fix, not_differentiable_fix, second_order_fix,
                     where)
from ..wording import words
from .common import label, made, node_made, nodes_run, op_words, output_of, plain_node_name, raised, shown

_NONSCALAR = "grad can be implicitly created only for scalar outputs"
# `_unique2`, `aten::floor_divide`, `igamma: input` (the derivative for one input only): the op's name.
_NO_DERIVATIVE = re.compile(r"derivative for '?(?:aten::)?([\w.]+?)(?:: \w+)?'? is not implemented")
_INVALID_GRADIENT = re.compile(r"[Ff]unction (\w+) returned (?:an invalid gradient at index (\d+)|an incorrect number "
                               r"of gradients \(expected (\d+), got (\d+)\)|a gradient different than None at "
                               r"position (\d+))")
_EXPECTED_SHAPE = re.compile(r"got \[([\d, ]*)\] but expected shape compatible with \[([\d, ]*)\]")


# -- nonscalar-backward ---------------------------------------------------------------------------

def nonscalar_backward(trace: TraceData, source) -> List[Finding]:
    """backward() (or autograd.grad() without grad_outputs) from a tensor with more than one element.
    Culprit: the line that made it, where the reduction goes: its own line, also inside a module the
    user wrote (a loss module returning a value per sample); saved: the backward call."""
    out = []
    for op in trace.ops:
        if not op.is_backward or not op.error or _NONSCALAR not in op.error:
            continue
        root = next((t for t in op.inputs if t in trace.tensors and _numel(trace.tensors[t].shape) != 1), None)
        culprit = made(trace, root)
        out.append(Finding("nonscalar-backward", "nonscalar", op=culprit if culprit is not None else op, saved=op,
                           subject=root, tids=tuple(t for t in (root,) if t is not None),
                           facts={"made": culprit}))
    return out


@words("nonscalar")
def _nonscalar(trace: TraceData, f: Finding) -> Words:
    op, root, maker_op = f.saved, f.subject, f.facts["made"]
    name = label(trace, root)
    shape = trace.tensors[root].shape if root is not None else ()
    if name and is_description(name):  # says what made it, its line and its shape
        what = "%s%s, has %d values, not one" % (name[:1].upper(), name[1:], _numel(shape))
    else:
        what = "%s is a tensor of shape (%s), %d values, not a scalar" % (
            "%s, made on %s," % (shown(name), line_ref(maker_op)) if maker_op is not None and name else
            shown(name) if name else "The tensor", ", ".join(str(s) for s in shape), _numel(shape))
    message = ("%s: backward() has to start from one number (or be given a gradient for each value). %s calls "
               "%s from it. PyTorch raised: \"%s\""
               % (what, where(op), "torch.autograd.grad()" if op.name == "torch.autograd.grad" else "backward()",
                  raised(op.error)))
    culprit = f.op
    fix = nonscalar_fix(culprit.location.source if culprit.location else "", name,
                        op.name == "torch.autograd.grad", line_ref(op))
    return Words(message, fix, name)


def _numel(shape) -> int:
    n = 1
    for size in shape:
        n *= size if isinstance(size, int) else 2  # a ragged size: more than one value
    return n


# -- not-differentiable ---------------------------------------------------------------------------

def not_differentiable(trace: TraceData, source) -> List[Finding]:
    """An op whose derivative PyTorch does not implement, on the way to the loss. Culprit: the forward
    line that ran it (for the backward formula of an op, run by a backward with create_graph=True, the
    forward line of that op); saved: the backward call that met its node."""
    out = []
    for op in trace.ops:
        m = _NO_DERIVATIVE.search(op.error or "")
        if m is None:
            continue
        missing = m.group(1)
        ran, key, through = (op, op.node, None) if not op.is_backward else _without_derivative(trace, op, missing)
        result = output_of(ran)
        out.append(Finding("not-differentiable", "no-second-derivative" if through is not None else "no-derivative",
                           op=ran if ran is not None else op, saved=op if op.is_backward else None, subject=result,
                           tids=tuple(t for t in (result,) if t is not None),
                           node_key=key if key in trace.nodes else None,
                           facts={"raising": op, "missing": missing, "ran": ran, "through": through, "key": key}))
    return out


@words("no-derivative", "no-second-derivative")
def _no_derivative(trace: TraceData, f: Finding) -> Words:
    op, missing, ran, through, key = (f.facts[k] for k in ("raising", "missing", "ran", "through", "key"))
    name = label(trace, f.subject)
    if through is not None:
        said = ("%s runs %s, whose backward (`%s` to PyTorch) has no derivative itself. The backward on %s "
                "ran it with create_graph=True, so that gradient is on the way to the tensor this backward "
                "starts from, and a second-order gradient cannot go through it"
                % (where(ran), op_words(ran), missing, line_ref(through)))
        message = "%s. PyTorch raised: \"%s\"" % (said, raised(op.error))
        fix = second_order_fix(op_words(ran), line_ref(through))
    else:
        said = ("%s runs %s" % (where(ran), op_words(ran, missing))) if ran is not None else \
            "An operation of the forward pass"
        known_as = [] if ran is not None and "<" in ran.name else ["`%s` to PyTorch" % missing]
        known_as += ["node %s" % trace.nodes[key].name] if key in trace.nodes else []
        message = ("%s, which has no derivative%s. Its result%s requires grad and is on the way "
                   "to the tensor backward starts from, so backward cannot go through it. PyTorch raised: \"%s\""
                   % (said, " (%s)" % ", ".join(known_as) if known_as else "",
                      "" if not name else " (%s)" % name if is_description(name) else " " + shown(name),
                      raised(op.error)))
        inputs = [label(trace, t) for t in ran.inputs] if ran is not None else []
        fix = not_differentiable_fix(op_words(ran, missing) if ran is not None else "`%s`" % missing,
                                     name, next((n for n in inputs if n), None))
    return Words(message, fix, name)


def _without_derivative(trace: TraceData, backward: OpRecord, missing: str):
    """(the forward op that made the node without a derivative which `backward` met, its node key, and
    the earlier backward call that ran that op's backward with create_graph=True when the missing
    derivative is of a backward formula), from the nodes `backward` runs. A node of the op's own name
    (`Unique2Backward0`: PyTorch declares its derivative not implemented) was made by its op. An op
    with no derivative formula at all gets a node `NotImplemented` without a sequence number: it is
    the grad_fn of an input of the op that made a node run before it, the input made with grad on
    whose op got no numbered node; or a backward that recorded a graph (create_graph=True) made it,
    while it ran the backward formula of a forward op: the node of that op's name."""
    order = nodes_run(trace, backward)
    named = [k for k in order if plain_node_name(trace.nodes[k].name) == plain_node_name(missing)]
    # Where torch numbers a NotImplemented node (2.10 and older), its op made it, as any node's.
    named = named or [k for k in order if trace.nodes[k].name == "NotImplemented" and node_made(trace, k) is not None]
    if named:
        ran, key = node_made(trace, named[0]), named[0]
    else:
        unnumbered = {k for k in order if trace.nodes[k].name == "NotImplemented"}
        key = next(iter(unnumbered), None)
        # The roots first: backward runs them before anything else.
        makers = [_unnumbered_maker(trace, t) for t in backward.inputs[:1]]
        for parent in order:
            if unnumbered.intersection(trace.nodes[parent].inputs):
                user = node_made(trace, parent)
                if user is not None and user.is_backward:
                    makers.append(user)
                elif user is not None:
                    makers += [_unnumbered_maker(trace, t) for t in user.inputs]
        ran = next((m for m in makers if m is not None), None)
    if ran is None or not ran.is_backward:
        return ran, key, None
    # Made by a backward that recorded a graph of its own: the missing derivative is that of the
    # backward formula (`_cdist_backward`) of a forward op whose node it ran (CdistBackward0).
    stem = re.sub(r"_backward$", "", missing)
    forward = next((k for k in nodes_run(trace, ran)
                    if stem != missing and plain_node_name(trace.nodes[k].name) == plain_node_name(stem)), None)
    return (node_made(trace, forward), forward, ran) if forward is not None else (ran, key, None)


def _unnumbered_maker(trace: TraceData, tid: int) -> Optional[OpRecord]:
    """The forward op that made tensor `tid` with grad on and gave it a grad_fn without a sequence
    number (it requires grad and is no leaf, yet its op made no numbered node), if one did."""
    info = trace.tensors.get(tid)
    if info is None or info.is_leaf or not info.first_requires_grad or info.created_by is None \
            or info.created_by >= len(trace.ops):
        return None
    maker_op = trace.ops[info.created_by]
    if maker_op.is_backward or maker_op.node is not None or tid in maker_op.inputs or not maker_op.grad_enabled:
        return None
    return maker_op


# -- invalid-gradient -----------------------------------------------------------------------------

def invalid_gradient(trace: TraceData, source) -> List[Finding]:
    """A custom autograd.Function whose backward returned a gradient of the wrong shape, or the wrong
    number of them. Culprit: the forward line that applied it; saved: the backward call."""
    out = []
    for op in trace.ops:
        m = _INVALID_GRADIENT.search(op.error or "") if op.is_backward else None
        if m is None:
            continue
        node_name = m.group(1)
        key = next((k for k in nodes_run(trace, op) if trace.nodes[k].name == node_name), None)
        applied = node_made(trace, key)
        shapes = _EXPECTED_SHAPE.search(op.error)
        if m.group(2) is not None:
            expected = tuple(_sizes(shapes.group(2))) if shapes else None
            tensor = _input_at(trace, applied, int(m.group(2)), expected)
        else:
            tensor = output_of(applied)
        out.append(Finding("invalid-gradient", "invalid-gradient", op=applied if applied is not None else op,
                           saved=op, subject=tensor, tids=tuple(t for t in (tensor,) if t is not None),
                           node_key=key, facts={"applied": applied, "node": node_name}))
    return out


@words("invalid-gradient")
def _invalid(trace: TraceData, f: Finding) -> Words:
    op, applied, node_name = f.saved, f.facts["applied"], f.facts["node"]
    m = _INVALID_GRADIENT.search(op.error)
    function = applied.name[:-len(".apply")] if applied is not None and applied.name.endswith(".apply") else \
        re.sub(r"Backward$", "", node_name)
    name = label(trace, f.subject)
    shapes = _EXPECTED_SHAPE.search(op.error)
    if m.group(2) is not None:
        index = int(m.group(2))
        got, expected = (tuple(_sizes(shapes.group(1))), tuple(_sizes(shapes.group(2)))) if shapes else (None, None)
        what = ("`%s.backward` returned, for input %d of `%s.forward`%s, a gradient of shape %s, where that input "
                "has shape %s" % (function, index, function, " (%s)" % shown(name) if name else "",
                                  _shape_text(got), _shape_text(expected))) if shapes else (
            "`%s.backward` returned an invalid gradient for input %d of `%s.forward`%s"
            % (function, index, function, " (%s)" % shown(name) if name else ""))
    elif m.group(5) is not None:
        what = ("`%s.backward` returned a gradient for argument %s of `%s.forward` (after ctx), which is not a "
                "tensor: the gradient of an argument that is not a tensor must be None" % (function, m.group(5),
                                                                                            function))
    else:
        what = ("`%s.backward` returned %s values, but `%s.forward` takes %s inputs after ctx: backward must "
                "return one gradient per input" % (function, m.group(4), function, m.group(3)))
    message = ("%s. %s applied `%s`; the backward on %s ran its backward and PyTorch checked what it returned. "
               "PyTorch raised: \"%s\"" % (what, where(applied) if applied is not None else "The forward pass",
                                           function, line_ref(op), raised(op.error)))
    return Words(message, invalid_gradient_fix(function, m.group(2) is not None), name)


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
