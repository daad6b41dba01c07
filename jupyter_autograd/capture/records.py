"""The recorder's own records: the layout of an op record, and the compact columns that keep the
graph nodes each op made and those folding dropped (a training loop adds rows at every step).
"""
from __future__ import annotations

import bisect
from array import array
from typing import NamedTuple

# An op record is a flat tuple (cheap to build, invisible to the cyclic GC's hot lists):
# (function id (Recorder.funcs), code, lineno, input tids, versions before, versions after, output tids,
#  (first, end) sequence numbers of the grad_fn nodes it made or None, written byte ranges or None,
#  grad enabled, error or None)
# An error is (type name, message), with the tids given as `out=` after them when there were some.
# A write is (tid, byte range): its version counter moved, or (`t.data = new`) its memory was swapped.
# A version is None for an inference tensor, which has no version counter.
OP_FUNC, OP_CODE, OP_LINE, OP_IN, OP_VB, OP_VA, OP_OUT, OP_SEQ, OP_WR, OP_GRAD, OP_ERR = range(11)


class Snapshot(NamedTuple):
    """A walk of the graph (graph.take): before a backward call ("backward") or at the block's end ("end")."""
    op_index: int       # the backward call's op index, or the number of ops at the end
    kind: str
    roots: list         # node keys it started from
    slots: tuple        # the saved-tensor slots it met (SLOT_*)
    inputs: list        # (tid, node key) of the tensors a backward call differentiates for
    retain: bool        # whether that call keeps the graph's buffers


# A saved-tensor slot of a snapshot is a flat tuple (a walk makes thousands):
# (node key, slot name, tid, shape, dtype, saved version, current version, stale, freed, byte range or None,
#  is a saved output, packed by a saved-tensor hook)
(SLOT_NODE, SLOT_NAME, SLOT_TID, SLOT_SHAPE, SLOT_DTYPE, SLOT_SAVED_VERSION, SLOT_VERSION, SLOT_STALE, SLOT_FREED,
 SLOT_RANGE, SLOT_IS_OUTPUT, SLOT_HOOKED) = range(12)

# A node of GraphRecord.nodes: [name, child keys, leaf tid or None, backward op indices that ran it,
# op index of the last snapshot that saw it] (a list for a leaf's AccumulateGrad, else a tuple).
NODE_NAME, NODE_CHILDREN, NODE_LEAF, NODE_RUNS, NODE_SEEN = range(5)


class NodeRanges:
    """The grad_fn sequence numbers [first, end) each op made, with the op's index, in op order:
    three columns of machine ints (24 bytes an op, where a tuple of three ints cost about 150; a
    training loop adds several per step, for the whole block)."""

    __slots__ = ("firsts", "ends", "indices")

    def __init__(self, rows=()):
        self.firsts, self.ends, self.indices = array("q"), array("q"), array("q")
        for first, end, index in rows:
            self.add(first, end, index)

    def add(self, first, end, index):
        self.firsts.append(first)
        self.ends.append(end)
        self.indices.append(index)

    def __len__(self):
        return len(self.indices)

    def drop_last(self, index):
        """Drop the last range, if op `index` made it."""
        if len(self.indices) and self.indices[-1] == index:
            self.firsts.pop()
            self.ends.pop()
            self.indices.pop()

    def __iter__(self):
        return zip(self.firsts, self.ends, self.indices)

    def op_of_seq(self, seq):
        """The op during which the node with this sequence number was made, or None (the last
        range starting at or before it, if it holds it)."""
        firsts = self.firsts
        i = bisect.bisect_right(firsts, seq) - 1
        if i >= 0 and seq < self.ends[i]:
            return self.indices[i]
        return None

    def of_op(self, index):
        """(first, end) of the nodes op `index` made, or None."""
        indices = self.indices
        i = bisect.bisect_left(indices, index)
        if i < len(indices) and indices[i] == index:
            return (self.firsts[i], self.ends[i])
        return None

    def in_order(self):
        """Whether the ranges are sorted by first sequence number (a custom Function records its
        inner calls first, then its own range around them)."""
        firsts = self.firsts
        return all(firsts[i] <= firsts[i + 1] for i in range(len(firsts) - 1))


class FoldedNodes:
    """Key ranges [first, end) of graph nodes that _fold dropped, with the backward calls that ran
    them, in key order: columns of machine ints (a training loop adds one range per step), the
    calls as one index where one call ran them (almost always), else in `several`."""

    __slots__ = ("firsts", "ends", "ran_by", "several")

    def __init__(self, rows=()):
        self.firsts, self.ends, self.ran_by, self.several = array("q"), array("q"), array("q"), {}
        for first, end, ran_by in rows:
            self.add(first, end, ran_by)

    def add(self, first, end, ran_by):
        """Add a range; one that continues the last with the same calls extends it."""
        n = len(self.firsts)
        if n and self.ends[n - 1] == first and self._runs(n - 1) == ran_by:
            self.ends[n - 1] = end
            return
        at = n if not n or self.firsts[n - 1] <= first else bisect.bisect_right(self.firsts, first)
        if at < n:  # an outer custom Function's range, dropped after its inner ones': keep key order
            self.several = {(i + 1 if i >= at else i): runs for i, runs in self.several.items()}
        self.firsts.insert(at, first)
        self.ends.insert(at, end)
        if len(ran_by) == 1:
            self.ran_by.insert(at, ran_by[0])
        else:
            self.ran_by.insert(at, -1)
            self.several[at] = ran_by

    def _runs(self, i):
        single = self.ran_by[i]
        return (single,) if single >= 0 else self.several[i]

    def __len__(self):
        return len(self.firsts)

    def __iter__(self):
        return ((self.firsts[i], self.ends[i], self._runs(i)) for i in range(len(self.firsts)))

    def runs_of(self, key):
        """The backward calls that ran the dropped node `key`, or () for any other node."""
        i = bisect.bisect_right(self.firsts, key) - 1
        if i >= 0 and key < self.ends[i]:
            return self._runs(i)
        return ()


# In the record of a folded op that made nodes: its range is in node_ranges (NodeRanges.of_op), so
# that the record itself can be shared by every folded op of its line.
NODES_IN_RANGES = (-1, -1)


def lost_part(what, exc, lost):
    """The trace's warning for a part of the analysis that failed: what failed, why, what is missing."""
    return "%s failed (%s: %s): %s" % (what, type(exc).__name__, exc, lost)
