"""Which tensors with autograd history outlive the backward call that follows them.

A tensor that is still alive at a backward call, having been made before the one before it, was
kept past a backward by something: a variable, a list, an attribute, a helper object. Whatever
holds it, the weak reference says it is alive, and the tensor keeps its graph alive with it. That
is what the accumulated-graph rule needs for tensors no op links together (a list of losses on a
helper object): which were kept, and from when to when.

At each backward call the tensors registered before the previous one are looked at once; those
alive with a grad_fn are looked at again at every later backward call, until they are gone. A
training loop pays one weak-reference call per tensor it makes, and one per kept tensor per step.
"""
from __future__ import annotations

from array import array


class KeptTensors:
    __slots__ = ("looked", "pending", "alive", "seen")

    def __init__(self):
        self.looked = 0       # tids below this were looked at
        self.pending = 0      # tids registered before the last look: the next look takes them
        self.alive = array("q")  # tids kept and alive at the last look
        self.seen = {}        # tid -> [op index of the first look that found it kept, of the last]

    def look(self, refs, op_index):
        """At op `op_index` (a backward call about to run, or the block's end): which tensors made
        before the previous look are alive now. Reads `requires_grad` and `is_leaf`, which callers
        keep hidden from `__torch_function__` subclasses."""
        seen = self.seen
        if self.alive:  # (a training loop that keeps nothing allocates nothing here)
            still = array("q")
            for t_id in self.alive:
                if refs[t_id]() is not None:
                    seen[t_id][1] = op_index
                    still.append(t_id)
            self.alive = still
        for t_id in range(self.looked, self.pending):
            t = refs[t_id]()
            try:
                kept = t is not None and t.requires_grad and not t.is_leaf
            except RuntimeError:  # a view whose base was written under no_grad (FSDP's flat
                continue          # parameters): reading its grad_fn raises, and so would any backward
            if kept:
                seen[t_id] = [op_index, op_index]
                self.alive.append(t_id)
        self.looked, self.pending = self.pending, len(refs)

    def shifted(self, start, end):
        """For a capture nested in this one, whose op indices start again at 0 at op `start`."""
        part = KeptTensors()
        part.seen = {t_id: [first - start, last - start] for t_id, (first, last) in self.seen.items()
                     if start <= first and last < end}
        part.looked = part.pending = self.pending
        return part
