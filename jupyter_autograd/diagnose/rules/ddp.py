"""DistributedDataParallel's errors, which count parameters by index or name them inside the wrapped
module: ddp-unused-parameters (parameters DDP waited for got no gradient, and the next forward raised)
and ddp-ready-twice (a parameter's gradient delivered twice in one backward).

Reasons: `ddp-unused`, `ddp-twice`."""
from __future__ import annotations

import re
from typing import List, Optional

from ...model import DistributedModel, OpRecord, TraceData
from ..findings import Finding, Words
from ..fixes import ddp_ready_twice_fix, ddp_unused_fix, line_ref, where
from ..wording import words
from .common import nodes_run, raised, shown

_UNFINISHED_REDUCTION = "Expected to have finished reduction in the prior iteration"
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank \d+: ([^\n]+)")
_READY_TWICE = "Expected to mark a variable ready only once"
_MARKED_TWICE = re.compile(r"Parameter at index (\d+)(?: with name ([\w.]+))? has been marked as ready twice")


def ddp_unused_parameters(trace: TraceData, source) -> List[Finding]:
    """DDP without find_unused_parameters, and parameters that got no gradient in an iteration: its
    reduction never finished, and the next forward raised. Culprit: that forward's line; tensor: the
    first such parameter, as the user's code reaches it."""
    error = trace.error or ""
    if _UNFINISHED_REDUCTION not in error or not trace.distributed:
        return []
    indices = _UNUSED_INDICES.search(error)
    named = _UNUSED_NAMES.search(error)
    model, tids = _ddp_parameters(trace.distributed, [int(i) for i in indices.group(1).split()] if indices else [],
                                  [n.strip() for n in named.group(1).split(",")] if named else [])
    if model is None or not tids:
        return []
    return [Finding("ddp-unused-parameters", "ddp-unused", at=trace.error_location, subject=tids[0], tids=tuple(tids),
                    facts={"model": model})]


@words("ddp-unused")
def _unused(trace: TraceData, f: Finding) -> Words:
    model, at, error = f.facts["model"], f.at, trace.error or ""
    names = [trace.tensor_label(t) for t in f.tids]
    why = _why_no_gradient(trace, model, f.tids[0])
    message = ("`%s` is wrapped in DistributedDataParallel (`%s`) without find_unused_parameters, so in every "
               "iteration DDP waits for a gradient for each of its parameters before it can finish reducing them "
               "across processes. In the last iteration %s got none: %s. DDP never finished that iteration, and the "
               "next forward%s raised: \"%s\"" % (model.module, model.name, _listing(names), why,
                                                   " (line %d)" % at.line if at else "", raised(error)))
    return Words(message, ddp_unused_fix(model.module, names, why), names[0], tuple(names[1:]))


def _ddp_parameters(models: List[DistributedModel], indices: List[int], names: List[str]):
    """(the DDP model, the tids) that an error's indices or names point to; (None, []) if none fits."""
    for model in models:
        # By index first: in the reducer's order, the model's (the names come in another).
        if indices and all(i < len(model.parameters) for i in indices) and not (
                names and not all(n in model.parameter_names for n in names)):
            return model, [model.parameters[i] for i in indices]
        if names and all(n in model.parameter_names for n in names):
            return model, [model.parameters[model.parameter_names.index(n)] for n in names]
    return None, []


def _why_no_gradient(trace: TraceData, model: DistributedModel, tid: int) -> str:
    """Why a parameter of a DDP model got no gradient in the last iteration, from the ops of its forward."""
    inside = model.parameter_names[model.parameters.index(tid)]
    owner = inside.rpartition(".")[0]
    # The last iteration: the forward before the last backward call, after the one before it.
    backward = [op.index for op in trace.ops if op.is_backward]
    since, until = (backward[-2] if len(backward) > 1 else -1), (backward[-1] if backward else len(trace.ops))
    forward = [op for op in trace.ops[since + 1:until] if op.module and op.module[0] == model.name]
    uses = [op for op in forward if tid in op.inputs]
    said = shown(trace.tensor_label(tid))
    if not uses:
        owner_ran = owner and any(len(op.module) > 1 and "%s.%s" % (op.module[1], owner) in op.module
                                  for op in forward)
        if owner and not owner_ran:
            return "`%s.%s`, the module that holds %s, was never called in the forward pass" % (
                model.module, owner, said)
        return "%s was never used in the forward pass" % said
    if not any(op.grad_enabled for op in uses):
        return "%s was used only without recording a graph (under no_grad), on %s" % (said, line_ref(uses[-1]))
    return ("%s was used on %s, but what it computed never reached the tensor backward ran from (an output the "
            "loss leaves out, or a path cut on the way)" % (said, line_ref(uses[-1])))


def ddp_ready_twice(trace: TraceData, source) -> List[Finding]:
    """DDP's hook for one parameter fired twice in a backward: a reentrant backward (checkpointing
    with use_reentrant=True) ran it again, with find_unused_parameters=True, or the parameter was used
    outside the DDP's forward. Culprit: the checkpoint call; saved: the backward call."""
    out = []
    for op in trace.ops:
        if not op.is_backward or not op.error or _READY_TWICE not in op.error:
            continue
        m = _MARKED_TWICE.search(op.error)
        model, tids = (None, [])
        if m is not None:
            model, tids = _ddp_parameters(trace.distributed, [] if m.group(2) else [int(m.group(1))],
                                          [m.group(2)] if m.group(2) else [])
        tid = tids[0] if tids else None
        culprit, why = _ran_twice_by(trace, op, model, tid)
        out.append(Finding("ddp-ready-twice", "ddp-twice", op=culprit or op, saved=op if culprit is not None else None,
                           subject=tid, tids=tuple(t for t in (tid,) if t is not None),
                           facts={"model": model, "why": why, "backward": op, "culprit": culprit,
                                  "named": m.group(2) if m is not None else None}))
    return out


@words("ddp-twice")
def _twice(trace: TraceData, f: Finding) -> Words:
    op, model, culprit, tid = f.facts["backward"], f.facts["model"], f.facts["culprit"], f.subject
    name = trace.tensor_label(tid) if tid is not None else f.facts["named"]
    message = ("%s. DistributedDataParallel%s counts each parameter's gradient once per backward; the backward "
               "on %s delivered %s twice. PyTorch raised: \"%s\""
               % (_why_twice(trace, f.facts["why"], tid), " (`%s`, find_unused_parameters=True)" % model.name
                  if model is not None and model.find_unused_parameters else "", line_ref(op),
                  shown(name) if name else "a parameter", raised(op.error)))
    fix = ddp_ready_twice_fix(culprit.location.source if culprit is not None and culprit.location else "",
                              culprit is not None and culprit.name.endswith(".apply"))
    return Words(message, fix, name)


def _ran_twice_by(trace: TraceData, backward: OpRecord, model: Optional[DistributedModel], tid: Optional[int]):
    """(the op that made the backward deliver a parameter's gradient twice, why: "reentrant" or "outside"),
    or (None, None). A custom Function whose forward ran the parameter without a graph and whose
    backward runs one of its own (reentrant checkpointing): the first such Function applied after that
    use, on this backward's path. Else a use of the parameter outside the DDP's forward."""
    on_path = {trace.nodes[k].created_by for k in nodes_run(trace, backward) if trace.nodes[k].created_by is not None}
    parameters = [tid] if tid is not None else list(model.parameters) if model is not None else []
    for index in sorted(on_path):
        applied = trace.ops[index]
        if not applied.name.endswith(".apply"):
            continue
        if any(not op.grad_enabled and any(t in op.inputs for t in parameters) for op in trace.ops[:index]):
            return applied, ("reentrant", applied)
    if tid is not None and model is not None:
        outside = [op for op in trace.ops[:backward.index] if tid in op.inputs and op.grad_enabled
                   and not op.is_backward and not (op.module and op.module[0] == model.name)]
        if outside:
            return outside[-1], ("outside", outside[-1])
    return None, None


def _why_twice(trace: TraceData, why, tid: Optional[int]) -> str:
    if why is None:
        return "Some parameter's gradient was delivered twice in one backward"
    how, op = why
    if how == "reentrant":
        return ("%s applies `%s`, which ran its part of the model without recording a graph and recomputes it in a "
                "backward of its own (reentrant checkpointing). DDP, told that some parameters may go unused, found "
                "no path to that part's parameters in the graph and marked them ready; then the inner backward "
                "delivered their gradients again" % (where(op), op.name[:-len(".apply")]))
    return ("%s uses %s outside the DDP module's forward, so its gradient arrives through a second path DDP does "
            "not expect" % (where(op), shown(trace.tensor_label(tid))))


def _listing(names: List[Optional[str]]) -> str:
    said = [shown(n) for n in names[:8] if n]
    return ", ".join(said) + (" and %d more" % (len(names) - 8) if len(names) > 8 else "")
