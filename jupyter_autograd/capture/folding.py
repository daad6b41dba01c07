"""Bounded memory for long loops: the details of old ops that can no longer matter are folded.

Folded: ops in a window at least one window behind the newest op (never the first window: the
first and the last iterations of a loop stay whole) that wrote nothing, raised nothing, whose
tensors are all gone, and whose autograd nodes, if any, were all run by a backward call that freed
them (no retain_graph), so no later backward or check can need their tensors. Such an op keeps its
slot (indices stay valid) and one record shared by every folded op of its line (its node range
stays in node_ranges). A tensor it made keeps a row shared by all equal rows and loses its weak
reference. The saved-tensor slots of backward calls that found nothing are dropped too. What was
folded is said in the trace.
"""
from __future__ import annotations

import bisect
from array import array

import torch

from .records import (NODE_RUNS, NODES_IN_RANGES, OP_CODE, OP_ERR, OP_FUNC, OP_GRAD, OP_IN, OP_LINE, OP_OUT, OP_SEQ,
                      OP_VA, OP_VB, OP_WR, SLOT_FREED, SLOT_NODE, SLOT_RANGE, SLOT_STALE, FoldedNodes)

FOLD_EVERY = 4096  # ops between two folding passes; the first and the latest such window stay whole
# Ops whose records folding never drops (`.data`, backward calls): the first function ids of every
# recorder's function table (Recorder.funcs).
KEPT_FUNCS = (torch.Tensor.data.__get__, torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


class Folding:
    __slots__ = ("count", "upto", "at", "write_positions", "checkpoints_done", "backwards", "nodes", "records",
                 "shared_tuples")

    def __init__(self):
        self.count = 0                 # ops whose details were dropped
        self.upto = FOLD_EVERY         # ops before this index have been looked at
        self.at = 3 * FOLD_EVERY       # the next pass: one window at a time, one window behind
        self.write_positions = []      # op indices that wrote, in order, up to `upto` (see _fold_checkpoints)
        self.checkpoints_done = 1      # checkpoints before this position were looked at by _fold_checkpoints
        self.backwards = 0             # backward calls whose saved-tensor slots were dropped
        # Made by the first pass (most blocks never fold; every block would pay for them):
        self.nodes = ()                # FoldedNodes: key ranges of nodes dropped, with the calls that ran them
        self.records = {}              # (func, code, line, grad, made nodes) -> the record folded ops share
        self.shared_tuples = {}        # equal tuples of tids in kept records (see _shared)

    def node_runs(self, key):
        """The backward calls that ran a node folding dropped, or () for any other node."""
        if key < 0 or not self.nodes:
            return ()
        return self.nodes.runs_of(key)

    def fold(self, recorder, newest):
        """A pass over the ops of the window one window behind op `newest`."""
        upto = newest - FOLD_EVERY
        if type(self.nodes) is not FoldedNodes:  # the first pass
            self.nodes = FoldedNodes()
        ops, tensors, shared = recorder.ops, recorder.tensors, self.records
        refs, tuples = tensors.refs, self.shared_tuples
        modules, nodes, freeing = recorder.modules, recorder.graph.nodes, recorder.backward.freeing
        kept_funcs = len(KEPT_FUNCS)
        folded, droppable = 0, []
        for index in range(self.upto, upto):
            rec = ops[index]
            if rec[OP_WR] is not None and rec[OP_ERR] is None and rec[OP_SEQ] is None:
                # A write keeps its record, but an optimizer writes the same parameters at every
                # step: the tuples naming them are shared between steps, the versions packed.
                ops[index] = rec[:3] + (_shared(tuples, rec[OP_IN]), _packed(rec[OP_VB]), _packed(rec[OP_VA]),
                                        _shared(tuples, rec[OP_OUT]), None, _shared(tuples, rec[OP_WR])) + rec[9:]
                continue
            if rec[OP_WR] is not None or rec[OP_ERR] is not None or rec[OP_FUNC] < kept_funcs:
                continue
            outs = rec[OP_OUT]
            if any(refs[t]() is not None for t in outs):
                continue
            seq = rec[OP_SEQ]
            if seq is not None:
                entries = [nodes.get(key) for key in range(seq[0], seq[1])]
                if not all(e is not None and any(b in freeing for b in e[NODE_RUNS]) for e in entries):
                    continue
                ran_by = tuple(entries[0][NODE_RUNS])
                if all(tuple(e[NODE_RUNS]) == ran_by for e in entries):
                    droppable.append((seq, ran_by))
            key = (rec[OP_FUNC], rec[OP_CODE], rec[OP_LINE], rec[OP_GRAD], seq is not None)
            small = shared.get(key)
            if small is None:
                small = shared[key] = (rec[OP_FUNC], rec[OP_CODE], rec[OP_LINE], (), (), (), (),
                                       None if seq is None else NODES_IN_RANGES, None, rec[OP_GRAD], None)
            ops[index] = small
            modules.forget_op(index)
            for t in outs:
                tensors.fold(t)
            folded += 1
        self.count += folded
        emptied = self._fold_checkpoints(recorder, upto)
        for seq, ran_by in droppable:
            # Nodes that only freeing backward calls ran, all of which found nothing, made by an
            # op whose tensors are gone: only a later walk can meet them again (a carried graph),
            # and all it needs to know is which calls ran them. One key range per step is kept.
            if all(b in emptied for b in ran_by):
                recorder.graph.forget(seq[0], seq[1])
                self.nodes.add(seq[0], seq[1], ran_by)
        if emptied:
            _forget_leaf_runs(nodes, emptied)
        tensors.forget_gone_ids()
        self.upto = upto
        self.at = upto + 2 * FOLD_EVERY

    def _fold_checkpoints(self, recorder, upto):
        """Drop the saved-tensor slots of backward calls before `upto` that found nothing: the
        call freed its graph, no slot was stale or freed, and no write since the slots' nodes
        were made overlaps a slot's bytes (a silent `.data` write). Such slots can never take
        part in a diagnosis; the call keeps its roots, inputs and retain flag. The first
        backward of the block stays whole, like the first window of ops."""
        ops, backward = recorder.ops, recorder.backward
        cps, freeing, writes = backward.checkpoints, backward.freeing, self.write_positions
        op_of_seq = recorder.node_ranges.op_of_seq
        for index in range(self.upto, upto):
            if ops[index][OP_WR] is not None:
                writes.append(index)
        at = self.checkpoints_done
        emptied = set()
        while at < len(cps) and cps[at][0] < upto:
            cp = cps[at]
            at += 1
            slots = cp.slots
            if not slots or cp.op_index not in freeing or any(s[SLOT_STALE] or s[SLOT_FREED] for s in slots):
                continue
            made = [op_of_seq(s[SLOT_NODE]) if s[SLOT_NODE] >= 0 else None for s in slots]
            since = 0 if None in made else min(made)
            ranges = [s[SLOT_RANGE] for s in slots if s[SLOT_RANGE] is not None]
            first = bisect.bisect_left(writes, since)
            last = bisect.bisect_left(writes, cp.op_index)
            if ranges and any(w[1] is not None and any(w[1][0] < hi and lo < w[1][1] for lo, hi in ranges)
                              for index in writes[first:last] for w in ops[index][OP_WR]):
                continue
            backward.empty_checkpoint(at - 1)
            emptied.add(cp.op_index)
        self.checkpoints_done = at
        self.backwards += len(emptied)
        return emptied

    def shifted(self, start):
        """As a capture nested in this block sees it: nothing more is folded into it."""
        part = Folding()
        part.upto = part.at = 1 << 62
        part.nodes = FoldedNodes((first, end, tuple(b - start for b in ran_by if b >= start))
                                 for first, end, ran_by in (self.nodes or ()))
        return part


def _forget_leaf_runs(nodes, emptied):
    """A leaf's AccumulateGrad is run by every backward of a loop: its list of runs would grow
    by one per step for every parameter. Runs by calls whose slots were dropped (they found
    nothing) are forgotten, all but the first (what a freed-graph diagnosis names)."""
    for key, entry in nodes.items():
        if key >= 0:
            continue
        runs = entry[NODE_RUNS]
        if len(runs) > 1 and any(b in emptied for b in runs[1:]):
            runs[1:] = [b for b in runs[1:] if b not in emptied]


def _packed(versions):
    """Version counters of a kept record as machine ints (an optimizer step lists every
    parameter and state tensor: as a tuple, each version above 256 is an object of its own)."""
    if len(versions) < 4 or None in versions:
        return versions
    return array("q", versions)


def _shared(cache, value):
    """One tuple for equal tuples of tids (folding keeps equal records once)."""
    if not value:
        return value
    return cache.setdefault(value, value)
