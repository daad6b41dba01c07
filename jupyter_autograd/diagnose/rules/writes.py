"""The in-place family's writes: leaf-inplace (a write into a leaf that requires grad, which PyTorch
refuses), saved-tensor-modified (a tensor saved for backward changed in place: backward raises) and
silent-data-mutation (changed through `.data` or swapped with `.data =`: backward computes wrong
gradients and raises nothing).

The facts these rules rely on were established by the capture with PyTorch's own checks (a saved
slot is `stale` exactly when backward would raise), so the rules only have to find *which* recorded
write did it, and whether a backward will ever run into it, and say so in the user's terms.

Reasons: `leaf-write`, `saved-stale`, `saved-swapped` (`.data =`), `saved-through-data`."""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

from ...model import DATA_SWAP, Checkpoint, OpRecord, TraceData
from ...model.queries import engine_order, leading_to, reachable
from ...source.rewrites import writes_after
from ..findings import Finding, Words
from ..fixes import (also_changed, backward_outcome, counted, data_fix, data_swap_fix, describe_write, inplace_fix,
                     leaf_fix, line_ref, where)
from ..wording import words

_LEAF_ERRORS = ("leaf Variable that requires grad is being used in an in-place operation",)
# A call given `out=` refuses to run when any argument requires grad: a write into a leaf when the out
# tensor is one (an input that requires grad is another mistake).
_OUT_ERROR = "functions with out=... arguments don't support automatic differentiation"
_INPLACE_ERROR = "modified by an inplace operation"


# -- leaf-inplace ---------------------------------------------------------------------------------

def leaf_inplace(trace: TraceData, source) -> List[Finding]:
    """Every write into a leaf that requires grad, however spelled (an in-place method, `t[i] = v`,
    `+=`, `copy_`, `inplace=True`, `out=`): PyTorch refuses it, naming neither the tensor nor the line."""
    out = []
    for op in trace.ops:
        if not op.error:
            continue
        if any(e in op.error for e in _LEAF_ERRORS):
            target = _leaf_input(trace, op)
        elif _OUT_ERROR in op.error:
            target = next((leaf for leaf in (_leaf_of(trace, t) for t in op.out) if leaf is not None), None)
            if target is None:
                continue
        else:
            continue
        out.append(Finding("leaf-inplace", "leaf-write", op=op, subject=target,
                           tids=(target,) if target is not None else ()))
    return out


@words("leaf-write")
def _leaf_write(trace: TraceData, f: Finding) -> Words:
    op, target = f.op, f.subject
    tensor = trace.tensor_label(target) if target is not None else None
    loc = op.location
    view = "a view of a leaf" in op.error
    text = loc.source if loc else ""
    message = (
        "`%s` is a leaf tensor that requires grad: backward() will store its gradient in `%s.grad`. "
        "%s changes %s in place (%s), which PyTorch forbids while it records the graph, because the "
        "gradient must be computed with respect to the value the tensor had when it was used. "
        "PyTorch raised: \"%s\"" % (tensor, tensor, where(op), "a view of it" if view else "it",
                                     describe_write(op), op.error.split(": ", 1)[-1].split("\n")[0]))
    following = writes_after(trace.sources.get(loc.filename, []), loc.line) if loc else []
    fix = leaf_fix(text, tensor, following, (loc.line, trace.file_label(loc.filename)) if loc else (0, ""))
    return Words(message, fix, tensor)


def _leaf_input(trace: TraceData, op: OpRecord) -> Optional[int]:
    for t_id in op.inputs:
        leaf = _leaf_of(trace, t_id)
        if leaf is not None:
            return leaf
    return op.inputs[0] if op.inputs else None


def _leaf_of(trace: TraceData, t_id: int) -> Optional[int]:
    """The leaf that requires grad a write into `t_id` writes: the tensor itself, or the leaf whose view
    it is (the one the user must leave alone); else None."""
    info = trace.tensors.get(t_id)
    if info is None:
        return None
    if info.is_leaf and (info.requires_grad or info.first_requires_grad):
        return t_id
    base = trace.tensors.get(info.base) if info.base is not None else None
    if base is not None and base.is_leaf and (base.requires_grad or base.first_requires_grad):
        return info.base
    return None


# -- saved-tensor-modified and silent-data-mutation -----------------------------------------------

def saved_tensor_writes(trace: TraceData, source) -> List[Finding]:
    """A stale or overwritten saved tensor is a problem where a backward runs (or ran) its node:
    the nodes of each backward call, and at the end of the block only graphs that no backward ran
    from and that one still could (_runnable_roots). A finding's rank says when backward meets it
    (checkpoint, engine step)."""
    found: Dict[Tuple, Finding] = {}
    write_index = _WriteIndex(trace)
    for cp_number, cp in enumerate(trace.checkpoints):
        windows = _Windows(write_index, cp.op_index, _earliest_save(trace, cp))
        if cp.kind == "backward":
            position = {key: i for i, key in enumerate(engine_order(trace, cp))}
        else:  # the graphs of live tensors that a backward not yet called could run
            position = {key: -key for key in reachable(trace, _runnable_roots(trace, cp))}
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
            # A slot that holds the tensor object itself (not a copy or a view made inside the op) reads
            # whatever memory that object has when backward runs: `t.data = new` swaps it.
            held = slot.tid if not slot.is_output else None
            after = -1 if saved_op is None else saved_op
            if root is None:
                writes = windows.between(slot.byte_range, after, held)
            else:
                writes = _WriteIndex.between(trace, write_index, slot.byte_range, after, cp.op_index, root, held)
            if slot.stale:
                counted_writes = [w for w in writes if not _is_data_alias(trace, w[1]) and w[0].name != DATA_SWAP]
                culprit = (counted_writes or writes or [None])[0]
                kind, reason = "saved-tensor-modified", "saved-stale"
            elif writes:
                through_data = [w for w in writes if _is_data_alias(trace, w[1]) or w[0].name == DATA_SWAP]
                culprit = (through_data or writes)[0]
                kind = "silent-data-mutation"
                reason = "saved-swapped" if culprit[0].name == DATA_SWAP else "saved-through-data"
            else:
                continue
            affected = slot.tid if slot.tid is not None else (culprit[1] if culprit else None)
            key = (kind, culprit[0].index if culprit else None, affected if affected is not None else slot.node)
            rank = (cp_number, position[slot.node])
            if key in found and found[key].rank <= rank:
                continue
            named = affected is not None and affected in trace.tensors and trace.tensors[affected].name is not None
            found[key] = Finding(
                kind, reason, op=culprit[0] if culprit else None,
                saved=trace.ops[saved_op] if saved_op is not None else None, subject=affected if named else None,
                tids=tuple(t for t in (affected, culprit[1] if culprit else None) if t is not None),
                node_key=slot.node, saved_version=slot.saved_version, current_version=slot.current_version,
                predicted=True, rank=rank,
                facts={"affected": affected, "written": culprit[1] if culprit else None, "node": node.name if node
                       is not None else "a grad_fn node", "backward": cp.op_index if cp.kind == "backward" and 0 <= cp.op_index < len(trace.ops) else None,
                       "others": []})
    return _merge_same_write(trace, list(found.values()))


def _merge_same_write(trace: TraceData, findings: List[Finding]) -> List[Finding]:
    """One line that breaks many saved tensors (optimizer.step() on a whole model, a write in a loop)
    is one problem: name the tensor backward meets first and list the others."""
    by_write: Dict[Tuple, List[Finding]] = {}
    for f in findings:
        # Per line, not per op: optimizer.step() writes each parameter with an op of its own.
        at = f.op.location if f.op is not None else None
        key = (f.kind, at.filename, at.line) if at is not None else (f.kind, id(f))
        by_write.setdefault(key, []).append(f)
    merged = []
    for group in by_write.values():
        group.sort(key=lambda f: f.rank)
        first = group[0]
        # The same tensor object saved again (by the next call of a forward) is not one more tensor.
        others = [f.tids[0] if f.tids else None for f in group[1:]
                  if not (f.tids and first.tids and f.tids[0] == first.tids[0])]
        if others:
            first.facts["others"] = others
            first.tids = tuple(dict.fromkeys(first.tids + tuple(t for f in group[1:] for t in f.tids)))
        merged.append(first)
    return merged


@words("saved-stale", "saved-swapped", "saved-through-data")
def _saved(trace: TraceData, f: Finding) -> Words:
    facts = f.facts
    affected, written, save = facts["affected"], facts["written"], f.saved
    name = trace.tensor_label(affected) if affected is not None else "a saved tensor"
    node_name = facts["node"]
    saved_at = ("on %s (`%s`)" % (line_ref(save), save.location.source)
                if save is not None and save.location else "before the recorded block")
    backward = trace.ops[facts["backward"]] if facts["backward"] is not None else None
    error = backward.error if backward is not None and backward.error is not None else None
    after = backward_outcome(error, _INPLACE_ERROR, "backward()", "backward() stopped")
    culprit = f.op
    if f.reason == "saved-stale":
        if culprit is not None:
            what = "%s then changed it in place with %s" % (where(culprit), describe_write(culprit))
        else:
            what = "it was then changed in place outside the recorded code"
        message = (
            "`%s` was saved for backward by %s, created %s, at version %s. %s, so it is now at version %s. "
            "%s \"one of the variables needed for gradient computation has been modified by an inplace "
            "operation\": the gradient needs the value `%s` had when it was saved."
            % (name, node_name, saved_at, f.saved_version, what, f.current_version, after, name))
        fix = inplace_fix(trace, culprit, name, save, written)
    elif f.reason == "saved-swapped":
        message = (
            "`%s` was saved for backward by %s, created %s. %s then swapped the memory behind it with `.data =`: "
            "the tensor object the graph saved now holds other values, and its version counter did not move, "
            "so PyTorch cannot see the change: backward() raises no error but computes the gradients from the "
            "new values. The gradients are silently wrong." % (name, node_name, saved_at, where(culprit)))
        fix = data_swap_fix(trace, culprit)
    else:
        alias = trace.tensor_label(written) if culprit is not None else "an alias"
        message = (
            "`%s` was saved for backward by %s, created %s. %s then overwrote its memory through `%s`, "
            "an alias made with `.data`, which has a version counter of its own: PyTorch cannot see the write, "
            "so backward() raises no error but computes the gradients from the new values. The gradients "
            "are silently wrong." % (name, node_name, saved_at, where(culprit), alias))
        fix = data_fix(trace, (culprit, written) if culprit is not None else None, name, save)
    tensor = trace.tensors[affected].name if affected is not None and affected in trace.tensors else None
    also = ()
    others = [trace.tensor_label(t) for t in facts["others"]]
    if others:
        message += " The same write also changed %s." % also_changed(
            tensor or trace.tensor_label(f.tids[0] if f.tids else None), others)
        also = tuple(other for other, _ in counted(others) if other != tensor)
    return Words(message, fix, tensor, also)


def _runnable_roots(trace: TraceData, cp: Checkpoint) -> List[int]:
    """The roots, at the block's end, of graphs that no backward ran from and that a backward could
    still run: not those reaching a node whose saved tensors an earlier backward freed (the class
    output of a second pass whose trunk the loss backpropagated, `_, domain_output = net(t_img)`).
    Nothing can backpropagate through such a graph, so what a later write did to it harms nobody."""
    nodes = trace.nodes
    roots = [r for r in cp.roots if r in nodes and not nodes[r].consumed_by]
    freed = {slot.node for slot in cp.slots if slot.freed}
    if not roots or not freed:
        return roots
    dead = leading_to(trace, reachable(trace, roots), freed)
    return [r for r in roots if r not in dead]


class _WriteIndex(list):
    """The ops that wrote something, in order: slots look up only those (graphs have 100,000
    saved tensors and ops; writes are few)."""

    def __init__(self, trace: TraceData):
        super().__init__(op for op in trace.ops if op.writes)
        self.positions = [op.index for op in self]

    @staticmethod
    def between(trace: TraceData, index: "_WriteIndex", byte_range, after: int, before: int,
                root: Optional[int] = None, held: Optional[int] = None) -> List[Tuple[OpRecord, int]]:
        """Writes in ops after..before that overlap the bytes, or (with root) share its version counter;
        a swap of memory (`t.data = new`) only where it swapped the very tensor object a slot holds
        (`held`): views, copies and other tensors keep the memory they had."""
        lo, hi = byte_range
        hits = []
        start = bisect.bisect_right(index.positions, after)
        stop = bisect.bisect_left(index.positions, before)
        for op in index[start:stop]:
            if op.name == DATA_SWAP:
                if held is not None and held in op.writes:
                    hits.append((op, held))
                continue
            for t_id, rng in zip(op.writes, op.write_ranges):
                if (rng is not None and rng[0] < hi and lo < rng[1]) or (
                        root is not None and _root(trace, t_id) == root and not _is_data_alias(trace, t_id)):
                    hits.append((op, t_id))
                    break
        return hits


class _Windows:
    """The writes before one checkpoint, by the bytes they changed: a slot looks up the writes that
    overlap its bytes (sorted by start address, with a bound on their length) instead of every write
    after its save. The same answers as _WriteIndex.between without a root (a ResNet step: 500 slots
    against 300 writes each, 60 ms, before this)."""

    _LONG = 1 << 20  # bytes: writes longer than this (a flat buffer, a whole model's step) are checked one by one

    def __init__(self, index: "_WriteIndex", before: int, earliest: int):
        self.index, self.before, self.earliest = index, before, earliest
        self.built = False

    def _build(self) -> None:
        index = self.index
        start = bisect.bisect_right(index.positions, self.earliest)
        stop = bisect.bisect_left(index.positions, self.before)
        events, long, swaps = [], [], {}
        for op in index[start:stop]:
            if op.name == DATA_SWAP:
                for t_id in op.writes:
                    swaps.setdefault(t_id, []).append(op)
                continue
            for order, (t_id, rng) in enumerate(zip(op.writes, op.write_ranges)):
                if rng is None:
                    continue
                event = (rng[0], rng[1], op.index, order, op, t_id)
                (long if rng[1] - rng[0] > self._LONG else events).append(event)
        events.sort(key=lambda e: e[0])
        self.starts = [e[0] for e in events]
        self.events, self.long, self.swaps = events, long, swaps
        self.longest = max((e[1] - e[0] for e in events), default=0)
        self.built = True

    def between(self, byte_range, after: int, held: Optional[int]) -> List[Tuple[OpRecord, int]]:
        if not self.built:  # once, from the checkpoint's earliest save: a later save only narrows the window
            self._build()
        lo, hi = byte_range
        first = bisect.bisect_right(self.starts, lo - self.longest)
        last = bisect.bisect_left(self.starts, hi)
        hits = {}  # op index -> (order of the tensor it wrote, op, tid): its first written tensor that overlaps
        for events in (self.events[first:last], self.long):
            for start, end, position, order, op, t_id in events:
                if start < hi and lo < end and position > after and (
                        position not in hits or order < hits[position][0]):
                    hits[position] = (order, op, t_id)
        if held is not None:
            for op in self.swaps.get(held, ()):
                if op.index > after:
                    hits[op.index] = (-1, op, held)
        return [(op, t_id) for _, (_, op, t_id) in sorted(hits.items())]


def _earliest_save(trace: TraceData, cp: Checkpoint) -> int:
    """The first op that saved a tensor of the checkpoint's slots that are looked up by their bytes."""
    earliest = cp.op_index
    for slot in cp.slots:
        if not slot.freed and slot.byte_range is not None:
            node = trace.nodes.get(slot.node)
            if node is not None and node.created_by is not None and node.created_by < earliest:
                earliest = node.created_by
    return earliest


def _root(trace: TraceData, t_id: Optional[int]) -> Optional[int]:
    """The tensor whose version counter a view shares: the end of its chain of bases."""
    seen = set()
    while t_id is not None and t_id not in seen:
        seen.add(t_id)
        info = trace.tensors.get(t_id)
        if info is None or info.base is None:
            return t_id
        t_id = info.base
    return t_id


def _is_data_alias(trace: TraceData, t_id: int) -> bool:
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
