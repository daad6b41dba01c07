"""backward-error, the floor: any error raised by backward(), autograd.grad() or an autograd check that
no other finding explains gets at least the forward line of the node it names and the tensor's
name; never silence. It runs after every rule of the registry (it needs what they explained).

Reasons: `floor` (a backward call that raised; how it found the line is in the facts: "node", "inside",
"hook" or "root"), `check` (an autograd check such as gradcheck raised at a line whose backward calls
did not)."""
from __future__ import annotations

import re
from typing import List

from ...model import EXPLAINS, OpRecord, TraceData
from ...model.queries import node_at
from ..findings import Finding, Words
from ..fixes import backward_error_fix, line_ref, where
from ..wording import words
from .common import label, made, maker, node_made, nodes_run, output_of, plain_node_name, raised, shown

# How PyTorch names a node in its messages: `MulBackward0`, `Function 'SqrtBackward0'`, `output 0 of Split`.
_NODE_NAMED = re.compile(r"\b(\w+Backward\d*)\b|output \d+ of (\w+)")
# How PyTorch names a hook whose return value it refused: by its `__name__`.
_HOOK_NAMED = re.compile(r"\bhook '([^']*)' (?:has|returned)")


def backward_errors(trace: TraceData, source, found) -> List[Finding]:
    """A backward call (or an autograd check such as gradcheck) that raised an error no finding in
    `found` explains. Culprit: the forward line of the node the error names; else the user's code
    that backward ran and that raised (a hook, a custom Function's backward); else the line that made
    the tensor backward started from. Saved: the backward call."""
    def explained(error: str) -> bool:
        return any(f.kind != "backward-error" and any(w in error for w in EXPLAINS.get(f.kind, ())) for f in found)

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
        out.append(Finding("backward-error", "check", at=at))
    return out


@words("check")
def _check(trace: TraceData, f: Finding) -> Words:
    at = f.at
    message = ("%s ran backward passes to check gradients, and the check raised: \"%s\""
               % ("Line %d (`%s`)" % (at.line, at.source) if at.source else "Line %d" % at.line,
                  raised(trace.error, whole=True)))
    return Words(message, backward_error_fix(None, at.line, None))


def _floor(trace: TraceData, op: OpRecord) -> Finding:
    order = nodes_run(trace, op)
    key = None
    for m in _NODE_NAMED.finditer(op.error):
        wanted = plain_node_name(m.group(1) or m.group(2))
        key = next((k for k in order if plain_node_name(trace.nodes[k].name) == wanted), None)
        if key is not None:
            break
    at = trace.error_location
    raised_inside = (trace.error == op.error and at is not None and op.location is not None
                     and (at.filename, at.line) != (op.location.filename, op.location.line))
    root = op.inputs[0] if op.inputs else None
    named = node_made(trace, key)
    hooked = _hooked(trace, op, order) if named is None and not raised_inside else None
    if named is not None:
        tensor, culprit, place, how = output_of(named), named, named.location, ("node", key)
    elif raised_inside:
        tensor, culprit, place, how = root, None, at, ("inside", at)
    elif hooked is not None:
        tensor, culprit, how = hooked
        place = culprit.location
    else:
        tensor = root
        culprit = maker(trace, root)
        place = culprit.location if culprit is not None else op.location
        how = ("root", culprit)
    # The user's name, or none: a description would make a title of a sentence.
    named_tensor = tensor in trace.tensors and trace.tensors[tensor].name is not None
    return Finding("backward-error", "floor", op=culprit or op, at=place, saved=op,
                   subject=tensor if named_tensor else None, tids=tuple(t for t in (tensor,) if t is not None),
                   node_key=key, facts={"tensor": tensor, "how": how, "hooked": hooked is not None})


@words("floor")
def _floor_words(trace: TraceData, f: Finding) -> Words:
    op, tensor, (how, detail), place = f.saved, f.facts["tensor"], f.facts["how"], f.at
    if how == "node":
        said = ("the error names %s, the node made by %s, which computes %s" % (
            trace.nodes[detail].name, line_ref(f.op), shown(label(trace, tensor)) if tensor is not None else
            "its result"))
    elif how == "inside":
        said = ("it was raised by your code that backward ran, line %d in `%s()`%s: a hook or a custom Function's "
                "backward" % (detail.line, detail.function, " (`%s`)" % detail.source if detail.source else ""))
    elif how == "hook-module":
        module, hook, registered, result = detail
        said = ("`%s` (%s) has the backward hook `%s` (%s), which backward ran on the gradients of the node that "
                "%s made for what the call of `%s` returned, and what it returned does not fit them" % (
                    module, trace.modules.get(module, "a module"), hook, registered, line_ref(result), module))
    elif how == "hook-tensor":
        registration, hooked, making, at_making = detail
        named = shown(label(trace, hooked)) or "its tensor"
        said = ("the hook that %s registered on %s%s changed the gradient of %s, and what it returned does not fit "
                "it" % (line_ref(registration), named, ", made on %s," % line_ref(making) if at_making else "", named))
    else:
        culprit = detail
        root = op.inputs[0] if op.inputs else None
        said = ("it started from %s%s" % (shown(label(trace, root)) if root is not None else "its outputs",
                                          ", made on %s" % line_ref(culprit) if culprit is not None else ""))
    message = "%s raised \"%s\": %s." % (where(op), raised(op.error, whole=True), said)
    name = trace.tensors[tensor].name if tensor in trace.tensors else None
    fix = backward_error_fix(name, place.line if place is not None else None, op.error,
                             _HOOK_NAMED.search(op.error).group(1) if f.facts["hooked"] else None)
    return Words(message, fix, name)


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
            outputs += [(position[result.node], result, module, registered[0]) for result in _call_results(trace, module)
                        if result.node in position]
    if outputs:
        _, result, module, how = min(outputs, key=lambda found: found[0])
        return output_of(result), result, ("hook-module", (module, hook, how, result))
    registrations = {}
    for op in trace.ops[:backward.index]:
        if op.name == "Tensor.register_hook" and op.inputs and op.location is not None:
            key = node_at(trace, op.inputs[0], op.index)
            if key in position:
                registrations.setdefault(key, (op, op.inputs[0]))
    if len(registrations) != 1:
        return None
    [(registration, tensor)] = registrations.values()
    making = made(trace, tensor)
    culprit = making if making is not None and making.location is not None else registration
    return tensor, culprit, ("hook-tensor", (registration, tensor, making, culprit is making))


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
