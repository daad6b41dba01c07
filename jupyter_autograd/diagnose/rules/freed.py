"""graph-freed: a backward call runs into nodes an earlier backward ran without retain_graph, whose
saved tensors are gone: PyTorch raises "Trying to backward through the graph a second time". Found
from the checkpoint taken before the call, so it is said before the call runs.

Reasons: `again` (backward from the same root twice), `shared` (two backward calls through one
forward), `carried` (an earlier iteration's state used again: `h = cell(x, h)`), `reused` (a tensor
computed once, used again after a backward went through it)."""
from __future__ import annotations

from typing import List, Optional

from ...model import OpRecord, TraceData
from ...model.queries import at_caller, at_maker, engine_order, leading_to, node_at
from ..findings import Finding, Words
from ..fixes import NO_ONE_LINE_FIX, backward_outcome, code, line_ref, where
from ..wording import words
from .common import backward_checkpoints, name

_GRAPH_FREED_ERROR = "backward through the graph a second time"


def graph_freed(trace: TraceData, source) -> List[Finding]:
    out = []
    retained = {cp.op_index: cp.retain for cp in backward_checkpoints(trace)}
    for cp in backward_checkpoints(trace):
        freed_nodes = {s.node for s in cp.slots if s.freed}
        if not freed_nodes:
            continue
        order = engine_order(trace, cp)
        first = next((k for k in order if k in freed_nodes), None)
        if first is None:
            continue
        backward = trace.ops[cp.op_index]

        def freed_by(key: int) -> Optional[int]:
            node = trace.nodes.get(key)
            runs = [b for b in (node.consumed_by if node else ()) if b < cp.op_index and not retained.get(b, True)]
            return runs[0] if runs else None

        root_run = next((freed_by(r) for r in cp.roots if freed_by(r) is not None), None)
        made = None
        if root_run is not None:
            culprit, carried, earlier, reason = backward, backward.inputs[0] if backward.inputs else None, root_run, "again"
        else:
            link = _link_into_freed(trace, order, first, freed_by)
            if link is None:
                continue
            culprit, carried, earlier = link
            info = trace.tensors.get(carried) if carried is not None else None
            made = trace.ops[info.created_by] if info is not None and info.created_by is not None else None
            made_since = any(node.created_by is not None and earlier < node.created_by < cp.op_index
                             for node in map(trace.nodes.get, order) if node is not None)
            if culprit.index < earlier and not made_since:
                reason = "shared"  # one forward, two backward calls through it
            elif made is None or (made.location is not None and made.location == culprit.location):
                reason = "carried"  # `h = cell(x, h)`: the line that uses it made it, an iteration before
            else:
                reason = "reused"  # computed once, used again after a backward went through it
            # Inside a module the user wrote, a tensor computed once and used again is used where the
            # module was called with it: `D(fake)`, not the `self.net(x)` in D.forward; and it was made
            # where it was returned, `fake = G(z)`. A carried state stays at the line that carries it
            # (`hidden = self.cell(x, hidden)` in a forward).
            if reason == "reused":
                culprit = at_caller(trace, culprit, carried)
            made = at_maker(trace, carried, made)
        facts = {"backward": backward, "used": culprit, "made": made}
        if reason == "shared":
            culprit = backward
        out.append(Finding("graph-freed", reason, op=culprit, saved=trace.ops[earlier], subject=carried,
                           tids=tuple(t for t in (carried,) if t is not None), node_key=first, predicted=True,
                           facts=facts))
    return out


@words("again", "shared", "carried", "reused")
def _said(trace: TraceData, f: Finding) -> Words:
    backward, earlier, first, culprit = f.facts["backward"], f.saved, f.node_key, f.op
    carried, made = f.subject, f.facts["made"]
    # No input of the op leads there by itself when the state travels inside a structure (an LSTM's
    # (h, c) tuple): then say what it is, never "an unrecorded tensor".
    named = name(trace, carried)
    shown = "`%s`" % named if named else (trace.tensor_label(carried) if carried is not None
                                          else "the state it carries over (a tensor of an earlier iteration)")
    if f.reason == "again":
        what = ("%s runs backward from `%s` again, but the backward on %s already freed the buffers of its "
                "graph" % (where(backward), named or "the same tensor", line_ref(earlier)))
    elif f.reason == "shared":
        what = ("%s runs backward through a part of the graph that the backward on %s already ran and "
                "freed: both start from results of %s, which uses %s"
                % (where(backward), line_ref(earlier), line_ref(f.facts["used"]), shown))
    elif f.reason == "carried":
        what = ("%s uses %s, which is still attached to the graph of an earlier iteration; the backward "
                "on %s already ran that graph and freed its buffers, and this backward runs into it again"
                % (where(culprit), shown, line_ref(earlier)))
    else:
        what = ("%s uses %s, computed %sbefore the backward on %s ran through it and freed its graph's "
                "buffers; this backward runs into that graph again"
                % (where(culprit), shown, "on %s, " % line_ref(made) if made is not None else "", line_ref(earlier)))
    outcome = backward_outcome(backward.error, _GRAPH_FREED_ERROR, "PyTorch", "PyTorch stopped this backward")
    tensor = named or (trace.tensor_label(carried) if carried is not None else None)
    message = ("%s. %s \"Trying to backward through the graph a second time\" at %s (node %s, whose saved "
               "tensors were freed)." % (what, outcome, line_ref(backward), trace.nodes[first].name))
    if f.reason == "again":
        retained = _with_retain(earlier.location.source if earlier.location else "")
        fix = ("%s compute the forward pass again before the second backward. Only if both backward passes "
               "really need the same graph, pass `retain_graph=True` to the first one%s "
               "That keeps every buffer of the graph alive until the last backward (memory)."
               % (NO_ONE_LINE_FIX, ":\n" + code(retained) + "\n" if retained else "."))
    elif f.reason == "shared":
        retained = _with_retain(earlier.location.source if earlier.location else "")
        fix = ("%s call backward once for the losses that share this graph, on their sum: `sum(losses)."
               "backward()` or `(loss_a + loss_b).backward()` gives every parameter the same gradient as "
               "separate calls. If the calls must stay separate, pass `retain_graph=True` to every one but the "
               "last%s That keeps the graph's buffers alive until the last one (memory). Detaching would cut "
               "the shared part out of the gradient."
               % (NO_ONE_LINE_FIX, ":\n" + code(retained) + "\n" if retained else "."))
    elif f.reason == "reused":
        made_at = " (%s)" % line_ref(made) if made is not None else ""
        fix = ("%s compute %s again after the backward on %s, where it is used (inside the loop, if it is "
               "made before one%s), so that each backward has a graph of its own. If that backward did not "
               "need to go through it (a discriminator's loss on generated samples), detach it there instead "
               "(`.detach()` where that loss used it). Detaching it here would stop its gradient; "
               "`retain_graph=True` on the earlier backward only if both passes really need the same graph "
               "(its buffers stay alive)."
               % (NO_ONE_LINE_FIX, shown, line_ref(earlier), made_at))
    elif tensor and tensor.isidentifier():
        fix = ("%s detach the carried state at the start of each iteration (truncated backpropagation "
               "through time), so each backward runs only its own iteration's graph:\n%s\n"
               "Do not add `retain_graph=True` for this: it keeps every earlier iteration's graph alive and "
               "each backward runs through all of them again (memory and time grow every step)."
               % (NO_ONE_LINE_FIX, code("%s = %s.detach()" % (tensor, tensor))))
    else:
        fix = ("%s detach the carried tensor (`.detach()`) before reusing it in the next iteration, or "
               "compute it again; `retain_graph=True` would keep every earlier graph alive." % NO_ONE_LINE_FIX)
    return Words(message, fix, tensor)


def _link_into_freed(trace: TraceData, order: List[int], first: int, freed_by):
    """(op, carried tensor, freeing backward) for the edge where this call's own graph enters the
    freed one on the way to the first freed node backward meets: from a node made after the backward
    that freed it to one made before (an earlier iteration's state, also where that state's own node
    was never run, as an RNN's hidden state that the first loss did not use); failing that, from a
    node no backward ran to one that a backward freed (two losses on one forward)."""
    nodes = trace.nodes
    leads_to_first = leading_to(trace, order, [first])
    boundary = freed_by(first)

    def made_before(key):
        node = nodes.get(key)
        return node is not None and node.created_by is not None and node.created_by < boundary

    for crosses in ((lambda key, child: not made_before(key) and made_before(child)),
                    (lambda key, child: freed_by(child) is not None)):
        best = None
        for key in order:
            if freed_by(key) is not None or key < 0:
                continue
            for child in nodes[key].inputs:
                if child in leads_to_first and crosses(key, child):
                    op_index = nodes[key].created_by
                    if op_index is not None and (best is None or op_index > best[0].index):
                        op = trace.ops[op_index]
                        carried = next((t for t in op.inputs if node_at(trace, t, op_index) == child), None)
                        if carried is None:
                            carried = _output_of_maker(trace, op, child)
                        best = (op, carried, boundary)
        if best is not None:
            return best
    return None


def _output_of_maker(trace: TraceData, op: OpRecord, child: int) -> Optional[int]:
    """The input of `op` that the op which made node `child` returned, when it is the only one: an op
    with several outputs (an RNN's output and hidden state, chunk) is recorded with one node, so the
    node of each output is not known, but which op made it is."""
    maker = trace.nodes[child].created_by if child in trace.nodes else None
    if maker is None:
        return None
    candidates = [t for t in op.inputs if t in trace.ops[maker].outputs]
    return candidates[0] if len(candidates) == 1 else None


def _with_retain(source: str) -> str:
    if source.endswith(".backward()") and "retain_graph" not in source:
        return source[:-len(".backward()")] + ".backward(retain_graph=True)"
    return ""
