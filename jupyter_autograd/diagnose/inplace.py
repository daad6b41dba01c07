"""The in-place family: leaf-inplace, saved-tensor-modified, silent-data-mutation, accumulated-graph.

The facts these rules rely on were established by the capture with PyTorch's own checks (a
saved slot is `stale` exactly when backward would raise), so the rules only have to find *which*
recorded write did it, and whether a backward will ever run into it, and say so in the user's terms.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

from ..fixes import (NO_ONE_LINE_FIX, accumulation_fix, also_changed, backward_outcome, code, counted, data_fix,
                     describe_write, inplace_fix, leaf_fix, line_ref, where)
from ..model import Checkpoint, Diagnosis, OpRecord, SavedSlot, Trace
from .paths import engine_order, reachable

_LEAF_ERRORS = ("leaf Variable that requires grad is being used in an in-place operation",)
_INPLACE_ERROR = "modified by an inplace operation"


# -- leaf-inplace ---------------------------------------------------------------------------------

def _leaf_inplace(trace: Trace) -> List[Diagnosis]:
    out = []
    for op in trace.ops:
        if not op.error or not any(e in op.error for e in _LEAF_ERRORS):
            continue
        target = _leaf_input(trace, op)
        name = trace.tensor_label(target) if target is not None else None
        loc = op.location
        view = "a view of a leaf" in op.error
        text = loc.source if loc else ""
        message = (
            "`%s` is a leaf tensor that requires grad: backward() will store its gradient in `%s.grad`. "
            "%s changes %s in place (%s), which PyTorch forbids while it records the graph, because the "
            "gradient must be computed with respect to the value the tensor had when it was used. "
            "PyTorch raised: \"%s\"" % (name, name, where(op), "a view of it" if view else "it",
                                         describe_write(op), op.error.split(": ", 1)[-1].split("\n")[0]))
        fix = leaf_fix(text, name)
        out.append(_diag(trace, "leaf-inplace", op, message, fix, tensor=name,
                         tids=(target,) if target is not None else ()))
    return out


def _leaf_input(trace: Trace, op: OpRecord) -> Optional[int]:
    for t_id in op.inputs:
        info = trace.tensors.get(t_id)
        if info is None:
            continue
        if info.is_leaf and info.requires_grad:
            return t_id
        base = trace.tensors.get(info.base) if info.base is not None else None
        if base is not None and base.is_leaf and base.requires_grad:
            return info.base  # the leaf whose view is written: the one the user must leave alone
    return op.inputs[0] if op.inputs else None


# -- saved-tensor-modified and silent-data-mutation -----------------------------------------------

def _saved_tensor_writes(trace: Trace, ranks: Dict[int, tuple]) -> List[Diagnosis]:
    """A stale or overwritten saved tensor is a problem where a backward runs (or ran) its node:
    the nodes of each backward call, and at the end of the block only graphs never
    backpropagated. `ranks` gets, per diagnosis, when backward meets it (checkpoint, engine step)."""
    found: Dict[Tuple, Diagnosis] = {}
    write_index = _WriteIndex(trace)
    for cp_number, cp in enumerate(trace.checkpoints):
        if cp.kind == "backward":
            position = {key: i for i, key in enumerate(engine_order(trace, cp))}
        else:  # the graphs of live tensors that no backward ran from
            position = {key: -key for key in reachable(trace, [r for r in cp.roots if r in trace.nodes
                                                                and not trace.nodes[r].consumed_by])}
        for slot in cp.slots:
            if slot.freed or slot.byte_range is None or slot.node not in position:
                continue
            node = trace.nodes.get(slot.node)
            saved_op = node.created_by if node is not None else None
            if saved_op is None and not slot.stale:
                continue  # cannot order the writes against the save: say nothing rather than guess
            # PyTorch checks versions per counter, and every view of a tensor shares its base's
            # counter: a write to h[t + 1] makes a saved h[t] stale though their bytes differ.
            root = _root(trace, slot.tid) if slot.stale else None
            writes = _WriteIndex.between(trace, write_index, slot.byte_range, -1 if saved_op is None else saved_op,
                                         cp.op_index, root)
            if slot.stale:
                counted = [w for w in writes if not _is_data_alias(trace, w[1])]
                culprit = (counted or writes or [None])[0]
                kind = "saved-tensor-modified"
            elif writes:
                through_data = [w for w in writes if _is_data_alias(trace, w[1])]
                culprit = (through_data or writes)[0]
                kind = "silent-data-mutation"
            else:
                continue
            affected = slot.tid if slot.tid is not None else (culprit[1] if culprit else None)
            key = (kind, culprit[0].index if culprit else None, affected if affected is not None else slot.node)
            rank = (cp_number, position[slot.node])
            if key in found and ranks[id(found[key])] <= rank:
                continue
            found[key] = _saved_diagnosis(trace, kind, cp, slot, node, saved_op, culprit, affected)
            ranks[id(found[key])] = rank
    return _merge_same_write(trace, list(found.values()), ranks)


def _merge_same_write(trace: Trace, diagnoses: List[Diagnosis], ranks: Dict[int, tuple]) -> List[Diagnosis]:
    """One line that breaks many saved tensors (optimizer.step() on a whole model, a write in a
    loop) is one problem: name the tensor backward meets first and list the others."""
    by_write: Dict[Tuple, List[Diagnosis]] = {}
    for d in diagnoses:
        # Per line, not per op: optimizer.step() writes each parameter with an op of its own.
        key = (d.kind, d.filename, d.line) if d.line is not None else (d.kind, id(d))
        by_write.setdefault(key, []).append(d)
    merged = []
    for group in by_write.values():
        group.sort(key=lambda d: ranks[id(d)])
        first = group[0]
        others = [d.tensor or trace.tensor_label(d.tids[0] if d.tids else None) for d in group[1:]]
        if others:
            first.message += " The same write also changed %s." % also_changed(
                first.tensor or trace.tensor_label(first.tids[0] if first.tids else None), others)
            first.also = tuple(name for name, _ in counted(others) if name != first.tensor)
            first.tids = tuple(dict.fromkeys(first.tids + tuple(t for d in group[1:] for t in d.tids)))
        merged.append(first)
    return merged


class _WriteIndex(list):
    """The ops that wrote something, in order: slots look up only those (graphs have 100,000
    saved tensors and ops; writes are few)."""

    def __init__(self, trace: Trace):
        super().__init__(op for op in trace.ops if op.writes)
        self.positions = [op.index for op in self]

    @staticmethod
    def between(trace: Trace, index: "_WriteIndex", byte_range, after: int, before: int,
                root: Optional[int] = None) -> List[Tuple[OpRecord, int]]:
        """Writes in ops after..before that overlap the bytes, or (with root) share its version counter."""
        lo, hi = byte_range
        hits = []
        start = bisect.bisect_right(index.positions, after)
        stop = bisect.bisect_left(index.positions, before)
        for op in index[start:stop]:
            for t_id, rng in zip(op.writes, op.write_ranges):
                if (rng is not None and rng[0] < hi and lo < rng[1]) or (
                        root is not None and _root(trace, t_id) == root and not _is_data_alias(trace, t_id)):
                    hits.append((op, t_id))
                    break
        return hits


def _root(trace: Trace, t_id: Optional[int]) -> Optional[int]:
    """The tensor whose version counter a view shares: the end of its chain of bases."""
    seen = set()
    while t_id is not None and t_id not in seen:
        seen.add(t_id)
        info = trace.tensors.get(t_id)
        if info is None or info.base is None:
            return t_id
        t_id = info.base
    return t_id


def _is_data_alias(trace: Trace, t_id: int) -> bool:
    seen = set()
    while t_id is not None and t_id not in seen:
        seen.add(t_id)
        info = trace.tensors.get(t_id)
        if info is None:
            return False
        if info.data_alias_of is not None:
            return True
        t_id = info.base
    return False


def _saved_diagnosis(trace, kind, cp: Checkpoint, slot: SavedSlot, node, saved_op, culprit, affected):
    name = trace.tensor_label(affected) if affected is not None else "a saved tensor"
    save = trace.ops[saved_op] if saved_op is not None else None
    node_name = node.name if node is not None else "a grad_fn node"
    saved_at = ("on %s (`%s`)" % (line_ref(save), save.location.source)
                if save is not None and save.location else "before the recorded block")
    error = trace.ops[cp.op_index].error if cp.kind == "backward" and _backward_failed(trace, cp) else None
    after = backward_outcome(error, _INPLACE_ERROR, "backward()", "backward() stopped")
    if kind == "saved-tensor-modified":
        if culprit is not None:
            what = "%s then changed it in place with %s" % (where(culprit[0]), describe_write(culprit[0]))
        else:
            what = "it was then changed in place outside the recorded code"
        message = (
            "`%s` was saved for backward by %s, created %s, at version %s. %s, so it is now at version %s. "
            "%s \"one of the variables needed for gradient computation has been modified by an inplace "
            "operation\": the gradient needs the value `%s` had when it was saved."
            % (name, node_name, saved_at, slot.saved_version, what, slot.current_version, after, name))
        fix = inplace_fix(trace, culprit[0] if culprit else None, name, save, culprit[1] if culprit else None)
    else:
        alias = trace.tensor_label(culprit[1]) if culprit is not None else "an alias"
        message = (
            "`%s` was saved for backward by %s, created %s. %s then overwrote its memory through `%s`, "
            "an alias made with `.data`, which has a version counter of its own: PyTorch cannot see the write, "
            "so backward() raises no error but computes the gradients from the new values. The gradients "
            "are silently wrong." % (name, node_name, saved_at, where(culprit[0]), alias))
        fix = data_fix(trace, culprit, name, save)
    diag = _diag(trace, kind, culprit[0] if culprit else None, message, fix, tensor=(
        trace.tensors[affected].name if affected is not None and affected in trace.tensors else None),
        tids=tuple(t for t in (affected, culprit[1] if culprit else None) if t is not None))
    if save is not None and save.location is not None:
        diag.saved_line, diag.saved_filename, diag.saved_source = (save.location.line, save.location.filename,
                                                                    save.location.source)
    diag.saved_op_index = saved_op
    diag.node, diag.node_key = node_name, slot.node
    diag.saved_version, diag.current_version = slot.saved_version, slot.current_version
    diag.predicted = True
    return diag


def _backward_failed(trace: Trace, cp: Checkpoint) -> bool:
    return 0 <= cp.op_index < len(trace.ops) and trace.ops[cp.op_index].error is not None


# -- accumulated-graph ---------------------------------------------------------------------------

def _accumulated_graphs(trace: Trace) -> List[Diagnosis]:
    """A line that, again and again, links a graph some backward already consumed into a tensor
    that chains the previous links and that no backward consumes: `total_loss += loss`. Found in
    the op stream when it happens, so it is seen inside a function whose tensor is gone by the
    end. Sharing leaves with a consumed graph (a validation pass) is not accumulation, and
    neither is a retained graph that a later backward consumes (two losses on one trunk)."""
    nodes = trace.nodes
    consumed_at = {k: min(n.consumed_by) for k, n in nodes.items() if n.consumed_by and n.variable is None}
    if not consumed_at:
        return []
    consumed = set(consumed_at)
    current: Dict[int, int] = {}        # tid -> key of its grad_fn now, as the ops run
    links: Dict[object, list] = {}       # location -> [(op, linked tid, consumed key)]
    made_at: Dict[int, tuple] = {}       # tid -> (line id, execution) of the op that made or wrote it
    chained: Dict[int, int] = {}         # line id -> uses of what an earlier execution of the line made
    # Lines as small ints: ops of one line share one Location object, and comparing ints is what
    # makes this pass linear in practice (a dataclass __eq__ per input costs a long loop seconds).
    line_ids: Dict[int, int] = {}
    by_value: Dict[object, int] = {}
    execution, previous = 0, None
    for op in trace.ops:
        loc = op.location
        if op.is_backward or loc is None:
            continue
        lid = line_ids.get(id(loc))
        if lid is None:
            lid = line_ids[id(loc)] = by_value.setdefault(loc, len(by_value))
        if lid != previous:  # consecutive ops of one line are one execution of it
            execution, previous = execution + 1, lid
        # The accumulator: what an earlier execution of this line made, itself never backpropagated
        # (a carried state that each backward consumes is another story: graph-freed).
        for t in op.inputs:
            made = made_at.get(t)
            if made is not None and made[0] == lid and made[1] < execution and current.get(t) not in consumed:
                chained[lid] = chained.get(lid, 0) + 1
                break
        if op.node is not None and op.node not in consumed:
            for t_id in op.inputs:
                key = current.get(t_id)
                if key is not None and key in consumed_at and consumed_at[key] < op.index:
                    links.setdefault(loc, []).append((op, t_id, key))
                    break
        for t_id in op.outputs + op.writes:
            made_at[t_id] = (lid, execution)
            if op.node is not None:
                current[t_id] = op.node
    out = []
    for loc, found in links.items():
        runs = {consumed_at[key] for _, _, key in found}
        if chained.get(by_value[loc], 0) < 1 or len(runs) < 2:
            continue
        op, linked, key = found[-1]
        name = _assigned_name(trace, op) or trace.tensor_label(op.outputs[0] if op.outputs else None)
        linked_name = trace.tensors[linked].name if linked in trace.tensors and trace.tensors[linked].name else "the loss"
        message = (
            "`%s` holds the autograd graphs of %d iterations that were already backpropagated: %s adds "
            "`%s`, a tensor still attached to its graph, so each iteration's whole graph stays linked into `%s`. "
            "Nothing will ever backpropagate through them, but none can be freed, so memory grows with every "
            "iteration." % (name, len(runs), where(op), linked_name, name))
        fix = accumulation_fix(op.location.source if op.location else "", linked_name, linked_name != "the loss")
        diag = _diag(trace, "accumulated-graph", op, message, fix, tensor=name,
                     tids=tuple(t for t in (op.outputs[:1] + (linked,)) if t is not None))
        diag.node_key, diag.node = op.node, nodes[op.node].name if op.node in nodes else None
        out.append(diag)
    return out


def _retained_history(trace: Trace) -> List[Diagnosis]:
    """The usual wrong fix for "backward through the graph a second time": a loop carries a
    tensor from one iteration into the next (`h = cell(x, h)`) and every backward keeps the graph
    (`retain_graph=True`). Nothing raises, but each backward runs again through every earlier
    iteration. Seen in the graph: a node made by a line is run by three or more backward calls,
    and the same line ran again between those calls, making nodes that later calls run again
    too. Two or three losses on one trunk re-run its nodes within one iteration, with no new
    execution of the trunk's lines in between: not this."""
    nodes = trace.nodes
    made_by_line: Dict[object, List[Tuple[int, int]]] = {}
    for key, node in nodes.items():
        if node.variable is not None or node.created_by is None or len(node.consumed_by) < 2:
            continue
        op = trace.ops[node.created_by]
        if op.location is not None and not op.is_backward:
            made_by_line.setdefault(op.location, []).append((node.created_by, key))
    out = []
    for loc, made in made_by_line.items():
        made.sort()
        first_op, first_key = made[0]
        runs = sorted(nodes[first_key].consumed_by)
        if len(runs) < 3:
            continue
        again = [(i, k) for i, k in made if runs[0] < i < runs[-1] and len(nodes[k].consumed_by) >= 2]
        if len({nodes[k].consumed_by[0] for _, k in again}) < 2:
            continue  # the line ran again, but its new nodes were not re-run across iterations
        if runs[-1] != max(max(nodes[k].consumed_by) for _, k in made):
            continue  # the history is cut somewhere (a detach every k steps): it does not grow
        op = trace.ops[again[-1][0]]
        last_backward = trace.ops[runs[-1]]
        name = _assigned_name(trace, op)
        label = name or trace.tensor_label(op.outputs[0] if op.outputs else None)
        message = (
            "`%s` carries the autograd graph of every earlier iteration into the next one, and the graph is "
            "kept with `retain_graph=True`: each backward() runs again through all earlier iterations. The "
            "nodes that %s made in its first execution were run by %d backward calls (the last at %s). Nothing "
            "raises, but every step is slower than the one before, memory grows with each iteration, and "
            "each step's gradients count the earlier iterations again." % (
                label, where(trace.ops[first_op]).replace("Line", "line", 1), len(runs), line_ref(last_backward)))
        if name and all(part.isidentifier() for part in name.split(".")):
            fix = ("%s detach the carried state at the start of each iteration (truncated backpropagation "
                   "through time), so each backward runs only its own iteration's graph:\n%s\n"
                   "then drop `retain_graph=True` from the backward call: it is needed only where two backward "
                   "calls run through the same graph on purpose." % (
                       NO_ONE_LINE_FIX, code("%s = %s.detach()" % (name, name))))
        else:
            fix = ("%s detach the carried tensor (`.detach()`) at the start of each iteration and drop "
                   "`retain_graph=True` from the backward call." % NO_ONE_LINE_FIX)
        diag = _diag(trace, "accumulated-graph", op, message, fix, tensor=label,
                     tids=op.outputs[:1])
        if last_backward.location is not None:
            diag.saved_line, diag.saved_filename, diag.saved_source = (
                last_backward.location.line, last_backward.location.filename, last_backward.location.source)
        diag.saved_op_index = last_backward.index
        first_node = trace.ops[first_op].node
        diag.node_key = first_node if first_node in nodes else first_key
        diag.node = nodes[diag.node_key].name
        out.append(diag)
    return out


def _assigned_name(trace: Trace, op: OpRecord) -> Optional[str]:
    """The name a line assigns to (`running_loss += loss` -> running_loss), from its source."""
    import ast

    text = op.location.source if op.location else ""
    try:
        stmt = ast.parse(text).body[0]
    except (SyntaxError, IndexError):
        return None
    target = getattr(stmt, "target", None) or (stmt.targets[0] if isinstance(stmt, ast.Assign) else None)
    return ast.unparse(target) if isinstance(target, (ast.Name, ast.Attribute)) else None


# -- wording -----------------------------------------------------------------------------------

def _diag(trace, kind, op, message, fix, tensor=None, tids=()) -> Diagnosis:
    loc = op.location if op is not None else None
    return Diagnosis(kind=kind, message=message, fix=fix, filename=loc.filename if loc else None,
                     line=loc.line if loc else None, source=loc.source if loc else "", tensor=tensor,
                     op_index=op.index if op is not None else None, tids=tuple(tids))
