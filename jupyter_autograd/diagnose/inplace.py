"""The in-place family: leaf-inplace, saved-tensor-modified, silent-data-mutation, accumulated-graph.

The facts these rules rely on were established by the capture with PyTorch's own checks (a
saved slot is `stale` exactly when backward would raise), so the rules only have to find *which*
recorded write did it, and whether a backward will ever run into it, and say so in the user's terms.
"""
from __future__ import annotations

import ast
import bisect
from typing import Dict, List, Optional, Tuple

from ..model import DATA_SWAP, Checkpoint, Diagnosis, OpRecord, SavedSlot, TraceData
from ..model.queries import ancestors, engine_order, leading_to, reachable
from ..source.index import SourceIndex, parse_fresh, parse_statement
from ..source.rewrites import without_graph, writes_after
from .fixes import (NO_ONE_LINE_FIX, REPLACE, accumulation_fix, also_changed, backward_outcome, code, counted,
                    data_fix, data_swap_fix, describe_write, inplace_fix, kept_fix, leaf_fix, line_ref, where)
from ..source.stores import handed_loop_values, storing_line

_LEAF_ERRORS = ("leaf Variable that requires grad is being used in an in-place operation",)
# A call given `out=` refuses to run when any argument requires grad: a write into a leaf when the out
# tensor is one (an input that requires grad is another mistake).
_OUT_ERROR = "functions with out=... arguments don't support automatic differentiation"
_INPLACE_ERROR = "modified by an inplace operation"


# -- leaf-inplace ---------------------------------------------------------------------------------

def _leaf_inplace(trace: TraceData) -> List[Diagnosis]:
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
        following = writes_after(trace.sources.get(loc.filename, []), loc.line) if loc else []
        fix = leaf_fix(text, name, following, (loc.line, trace.file_label(loc.filename)) if loc else (0, ""))
        out.append(_diag(trace, "leaf-inplace", op, message, fix, tensor=name,
                         tids=(target,) if target is not None else ()))
    return out


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

def _saved_tensor_writes(trace: TraceData, ranks: Dict[int, tuple]) -> List[Diagnosis]:
    """A stale or overwritten saved tensor is a problem where a backward runs (or ran) its node:
    the nodes of each backward call, and at the end of the block only graphs that no backward ran
    from and that one still could (_runnable_roots). `ranks` gets, per diagnosis, when backward
    meets it (checkpoint, engine step)."""
    found: Dict[Tuple, Diagnosis] = {}
    write_index = _WriteIndex(trace)
    for cp_number, cp in enumerate(trace.checkpoints):
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
            writes = _WriteIndex.between(trace, write_index, slot.byte_range, -1 if saved_op is None else saved_op,
                                         cp.op_index, root, held)
            if slot.stale:
                counted = [w for w in writes if not _is_data_alias(trace, w[1]) and w[0].name != DATA_SWAP]
                culprit = (counted or writes or [None])[0]
                kind = "saved-tensor-modified"
            elif writes:
                through_data = [w for w in writes if _is_data_alias(trace, w[1]) or w[0].name == DATA_SWAP]
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


def _merge_same_write(trace: TraceData, diagnoses: List[Diagnosis], ranks: Dict[int, tuple]) -> List[Diagnosis]:
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
        # The same tensor object saved again (by the next call of a forward) is not one more tensor.
        others = [d.tensor or trace.tensor_label(d.tids[0] if d.tids else None) for d in group[1:]
                  if not (d.tids and first.tids and d.tids[0] == first.tids[0])]
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
    elif culprit is not None and culprit[0].name == DATA_SWAP:
        message = (
            "`%s` was saved for backward by %s, created %s. %s then swapped the memory behind it with `.data =`: "
            "the tensor object the graph saved now holds other values, and its version counter did not move, "
            "so PyTorch cannot see the change: backward() raises no error but computes the gradients from the "
            "new values. The gradients are silently wrong." % (name, node_name, saved_at, where(culprit[0])))
        fix = data_swap_fix(trace, culprit[0])
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


def _backward_failed(trace: TraceData, cp: Checkpoint) -> bool:
    return 0 <= cp.op_index < len(trace.ops) and trace.ops[cp.op_index].error is not None


# -- accumulated-graph ---------------------------------------------------------------------------

def _accumulated_graphs(trace: TraceData) -> List[Diagnosis]:
    """A tensor still alive at some point, kept by anything, whose history chains graphs that a
    backward already ran, more of them with every iteration. Two ways to keep them:

    * linked: ops that no backward runs (a side chain: `total_loss += loss`, an AverageMeter's
      `self.sum += val * n`, an average kept as a tensor, a dict of running sums) link each
      iteration's backpropagated graph to what they made before: their latest result holds the
      graphs of more iterations than their first, and they ran in more than one iteration;
    * kept apart: each iteration's tensor outlives its backward whole (losses appended to a list on
      a helper object): at later backward calls, the tensors of more and more earlier iterations
      are still alive (the capture's weak references say so, whatever holds them).

    An iteration is a training step: the ops between two updates of a leaf that requires grad (an
    optimizer step, an update by hand, after a backward call) or, in a block that updates none,
    between two backward calls. What one step keeps (micro-batch losses summed for logging, reset
    every step), and a bounded number of graphs (the previous step's loss), do not grow: not this."""
    chains = _SideChains(trace)
    found = {}
    for chain in chains.growing():
        diag = _linked_diagnosis(trace, chains, chain)
        key = (diag.filename, diag.line)
        if key in found:
            found[key].tids = tuple(dict.fromkeys(found[key].tids + diag.tids))
        else:
            found[key] = diag
    kept = _kept_apart(trace, chains)
    if kept is not None and (kept.filename, kept.line) not in found:
        found[(kept.filename, kept.line)] = kept
    return list(found.values())


class _SideChains:
    """One walk of the ops in order: the training step of each op, and the side chains, with the
    steps whose backpropagated graphs each of their tensors holds (bit s of an int for step s,
    counted in updates and in backward calls: which one is the step is known at the end)."""

    def __init__(self, trace: TraceData):
        self.trace = trace
        nodes, ops, tensors = trace.nodes, trace.ops, trace.tensors
        self.consumed = {k for k, n in nodes.items() if k >= 0 and n.consumed_by}
        self.updates: List[int] = []     # op indices of updates of trained leaves
        self.backwards: List[int] = []   # op indices of backward calls
        self.written: Dict[int, OpRecord] = {}  # tid -> the op with a node that last wrote it in place
        self.held: Dict[int, tuple] = {}  # tid -> (steps in updates, in backward calls, chain) of side chains
        self.parent: List[int] = []      # chains, merged where one op extends two
        self.first: List[tuple] = []     # per chain: (op index, step u, step b, bits u, bits b) of its first op
        self.last: List[tuple] = []      # ... of its latest op
        self.link: List[Optional[tuple]] = []  # per chain: (op, tid) where it last linked a backpropagated graph
        self.grew: List[list] = []       # per chain: [op, op] that last took in more steps (in updates, in backward calls)
        consumed, held, written = self.consumed, self.held, self.written
        trained = {}
        for op in ops:
            if op.is_backward:
                self.backwards.append(op.index)
                continue
            # An update needs a gradient: writes before the first backward call initialise.
            if op.writes and op.error is None and self.backwards and any(
                    trained[t] if t in trained else trained.setdefault(t, _trains(trace, t)) for t in op.writes):
                self.updates.append(op.index)
            key = op.node
            if key is None or op.error is not None:
                continue
            if key in consumed or not op.outputs:  # run by a backward (a folded op's were, by a freeing one)
                for t in op.writes:
                    written[t] = op
                    held.pop(t, None)
                continue
            bits_u = bits_b = 0
            chain, linked, extended = None, None, []
            for t in op.inputs:
                entry = held.get(t)
                if entry is not None:
                    bits_u |= entry[0]
                    bits_b |= entry[1]
                    chain = entry[2] if chain is None else self._merge(chain, entry[2])
                    extended.append(entry)
                    continue
                maker = written.get(t)
                if maker is None:
                    info = tensors.get(t)
                    maker = ops[info.created_by] if info is not None and info.created_by is not None else None
                if maker is not None and maker.node is not None and (maker.node in consumed or not maker.outputs):
                    bits_u |= 1 << bisect.bisect_right(self.updates, maker.index)
                    bits_b |= 1 << bisect.bisect_right(self.backwards, maker.index)
                    linked = t
            for t in op.writes:
                written[t] = op
            if not bits_u:
                for t in op.outputs:
                    held.pop(t, None)
                continue
            version = (op.index, len(self.updates), len(self.backwards), bits_u, bits_b)
            if chain is None:
                chain = len(self.parent)
                self.parent.append(chain)
                self.first.append(version)
                self.last.append(version)
                self.link.append(None)
                self.grew.append([None, None])
            else:
                chain = self._root(chain)
                self.last[chain] = version
                # Where it took in more steps than any chain it extends held: the accumulation itself
                # (`self.sum += val * n`), not a later read of it (`self.sum / self.count`).
                if all(bits_u != e[0] for e in extended):
                    self.grew[chain][0] = op
                if all(bits_b != e[1] for e in extended):
                    self.grew[chain][1] = op
            if linked is not None:
                self.link[chain] = (op, linked)
            entry = (bits_u, bits_b, chain)
            for t in op.outputs:
                held[t] = entry
        self.by_updates = bool(self.updates)

    def _root(self, chain: int) -> int:
        parent = self.parent
        while parent[chain] != chain:
            parent[chain] = parent[parent[chain]]
            chain = parent[chain]
        return chain

    def _merge(self, a: int, b: int) -> int:
        a, b = self._root(a), self._root(b)
        if a != b:
            keep, gone = (a, b) if self.first[a][0] <= self.first[b][0] else (b, a)
            self.parent[gone] = keep
            if self.last[gone][0] > self.last[keep][0]:
                self.last[keep] = self.last[gone]
            link_gone, link_keep = self.link[gone], self.link[keep]
            if link_gone is not None and (link_keep is None or link_gone[0].index > link_keep[0].index):
                self.link[keep] = link_gone
            for unit in (0, 1):
                grew_gone, grew_keep = self.grew[gone][unit], self.grew[keep][unit]
                if grew_gone is not None and (grew_keep is None or grew_gone.index > grew_keep.index):
                    self.grew[keep][unit] = grew_gone
            a = keep
        return a

    def steps(self, version: tuple) -> Tuple[int, int]:
        """(the step its op ran in, the number of steps whose graphs it holds)."""
        if self.by_updates:
            return version[1], version[3].bit_count()
        return version[2], version[4].bit_count()

    def step_of(self, op_index: int) -> int:
        """The step op `op_index` ran in: the updates (or backward calls) before it."""
        return bisect.bisect_left(self.updates if self.by_updates else self.backwards, op_index)

    def bits(self, entry: tuple) -> int:
        return entry[0] if self.by_updates else entry[1]

    def growing(self) -> List[int]:
        """The chains whose ops ran in several steps and whose latest result holds the graphs of more
        steps (two at least) than their first."""
        out = []
        for chain, parent in enumerate(self.parent):
            if parent != chain:
                continue
            (first_step, first_held), (last_step, last_held) = self.steps(self.first[chain]), self.steps(self.last[chain])
            if last_step > first_step and last_held > first_held and last_held >= 2:
                out.append(chain)
        self.flagged = set(out)
        return out

    def in_flagged(self, t_id: int) -> bool:
        entry = self.held.get(t_id)
        return entry is not None and self._root(entry[2]) in self.flagged


def _trains(trace: TraceData, t_id: int) -> bool:
    """Whether a write to this tensor updates a leaf that requires grad (itself, or what it views or
    aliases through `.data`): a training step."""
    root = t_id
    seen = set()
    while root is not None and root not in seen:
        seen.add(root)
        info = trace.tensors.get(root)
        if info is None:
            return False
        following = info.base if info.base is not None else info.data_alias_of
        if following is None:
            return info.is_leaf and info.first_requires_grad
        root = following
    return False


def _linked_diagnosis(trace: TraceData, chains: _SideChains, chain: int) -> Diagnosis:
    nodes = trace.nodes
    op = chains.grew[chain][0 if chains.by_updates else 1] or trace.ops[chains.last[chain][0]]
    _, held = chains.steps(chains.last[chain])
    link = chains.link[chain]
    linked = link[1] if link is not None else None
    name = _assigned_name(trace, op) or trace.tensor_label(op.outputs[0] if op.outputs else None)
    linked_name = trace.tensors[linked].name if linked in trace.tensors else None
    message = (
        "`%s` holds the autograd graphs of %d iterations that were already backpropagated: %s adds "
        "%sa tensor still attached to its graph, so each iteration's whole graph stays linked into `%s`. "
        "Nothing will ever backpropagate through them, but none can be freed, so memory grows with every "
        "iteration." % (name, held, where(op), "`%s`, " % linked_name if linked_name else "", name))
    source = op.location.source if op.location else ""
    fix = accumulation_fix(source, linked_name)
    if REPLACE not in fix:
        detached = _detached_value(source, handed_loop_values(trace, op.location))
        if detached:
            fix = ("Keep the accumulated value without the graphs it links. %s\n%s\n"
                   "(or accumulate a Python number, `.item()`, if nothing reads it as a tensor)."
                   % (REPLACE, code(detached)))
    diag = _diag(trace, "accumulated-graph", op, message, fix, tensor=name,
                 tids=tuple(t for t in (op.outputs[:1] + (linked,)) if t is not None))
    diag.node_key, diag.node = op.node, nodes[op.node].name if op.node in nodes else None
    return diag


def _detached_value(source: str, arguments=frozenset()) -> Optional[str]:
    """`self.sum += val * n` -> `self.sum += (val * n).detach()`, `self.avg.mul_(m).add_(x)` ->
    `self.avg.mul_(m).add_(x.detach())`: what a side chain assigns or adds in place, without
    the graphs it links (no backward runs through it, so no gradient changes); see fixes.without_graph
    for a value read from an argument."""
    tree = parse_fresh(source)
    if tree is None or len(tree.body) != 1:
        return None
    stmt = tree.body[0]
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
            and stmt.value.func.attr.endswith("_") and len(stmt.value.args) == 1:
        # `self.avg.mul_(m).add_(x * (1 - m))`: the in-place method takes the value it links in
        added = stmt.value.args[0]
        if isinstance(added, ast.Constant) or arguments & {n.id for n in ast.walk(added) if isinstance(n, ast.Name)}:
            return None
        stmt.value.args = [ast.Call(func=ast.Attribute(value=added, attr="detach", ctx=ast.Load()), args=[],
                                    keywords=[])]
        return ast.unparse(stmt)
    if not (isinstance(stmt, ast.AugAssign) or (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1)):
        return None
    if isinstance(stmt.value, ast.Constant):
        return None
    text = ast.unparse(stmt)
    value = ast.unparse(stmt.value)
    if not text.endswith(value):
        return None
    return without_graph(text[:-len(value)], value, "", arguments) or None


def _kept_apart(trace: TraceData, chains: _SideChains) -> Optional[Diagnosis]:
    """Tensors each holding a backpropagated graph, kept past later backward calls (trace.kept), made
    again and again by the same code: at each backward call (and at the end), the steps before the
    current one whose graphs the kept tensors of one line still hold. Growing: the most ever held, two
    at least, is more than the most held by the time half as many steps had run. Tensors of
    different lines kept side by side (the variables of a program without a loop) are not
    iterations. A tensor whose graph later backward calls run again is a carried state
    (_retained_history); a side chain already said is not said twice."""
    if not trace.kept:
        return None
    ops, nodes, tensors = trace.ops, trace.nodes, trace.tensors
    points = chains.backwards + [len(ops)]
    if len(points) < 3:
        return None
    at = {p: i for i, p in enumerate(points)}
    current = [chains.step_of(p) for p in chains.backwards]
    current.append(current[-1])  # at the end: the step of the last backward
    by_line: Dict[object, List[tuple]] = {}  # the line that made them -> [(tid, first point, last point, steps held)]
    makers: Dict[int, OpRecord] = {}
    # What a side chain already said was computed from is kept alive by that chain's graph (the
    # inputs an accumulated statistic was computed from): the same cause, not another.
    flagged = [t for t in chains.held if chains.in_flagged(t)]
    linked_into_flagged = ancestors(trace, flagged, len(ops)) if flagged else set()
    for t_id, (first, last) in trace.kept.items():
        if first not in at or last not in at or chains.in_flagged(t_id) or t_id in linked_into_flagged:
            continue
        entry = chains.held.get(t_id)
        maker = chains.written.get(t_id)
        if maker is None:
            info = tensors.get(t_id)
            maker = ops[info.created_by] if info is not None and info.created_by is not None else None
        if entry is not None:
            bits = chains.bits(entry)
        elif maker is not None and maker.node in chains.consumed and len(nodes[maker.node].consumed_by) < 2:
            bits = 1 << chains.step_of(nodes[maker.node].consumed_by[0])  # the step whose backward ran it
        elif maker is not None and maker.node is not None and not maker.outputs:
            bits = 1 << chains.step_of(maker.index)  # folded: a freeing backward ran it, in its step
        else:
            continue
        makers[t_id] = maker
        by_line.setdefault(maker.location, []).append((t_id, at[first], at[last], bits))
    best = None
    end = len(points) - 1
    for kept in by_line.values():
        spans = _held_steps(kept, current)
        if spans and spans[-1] < 0:
            continue  # a window (a deque with maxlen): it let an earlier step's graph go, and keeps later ones
        peak = max(spans)
        i = max(j for j, span in enumerate(spans) if span == peak)
        before = max((span for span, step in zip(spans, current) if step <= current[i] // 2), default=0)
        if peak <= before or not peak:
            continue
        last_made = max(kept, key=lambda entry: makers[entry[0]].index)[0]
        stored = _stored_at(trace, makers[last_made], last_made)
        # One earlier graph kept is a previous loss, unless each iteration's tensor goes into one
        # container (two iterations of `history.append(loss)`) that, if still alive at the end, holds
        # two graphs or more then.
        # (Each kept past the backward of its own iteration: losses collected first, each backpropagated
        # in a later step, are a queue, not this.)
        alive_at_end = [bits for _, first, last, bits in kept if first <= end <= last]
        held_at_end = sum(1 << step for bits in alive_at_end for step in _bit_positions(bits)).bit_count()
        queued = any(chains.step_of(makers[t_id].index) < bits.bit_length() - 1 for t_id, _, _, bits in kept)
        if peak < 2 and (stored is None or queued or alive_at_end and held_at_end < 2):
            continue
        # Of lines that grow alike, the last one's tensors: a kept tensor keeps its history alive (the
        # activations its graph saved), not the other way round.
        rank = (peak, makers[last_made].index)
        if best is None or rank > best[0]:
            best = (rank, i, kept)
    if best is None:
        return None
    (peak, _), i, kept = best
    group = [t_id for t_id, first, last, bits in kept if first <= i <= last and bits & ((1 << current[i]) - 1)]
    t_id = max(group, key=lambda t: makers[t].index)
    op = makers[t_id]
    stored, detached, stored_as = _stored_at(trace, op, t_id) or (None, "", "")
    name = trace.tensors[t_id].name or _assigned_name(trace, op) or stored_as or trace.tensor_label(t_id)
    point = points[i]
    moment = "the end of the block" if point == len(ops) else "the backward call on " + line_ref(ops[point])
    message = (
        "`%s`, made %s, is kept alive past its iteration: at %s, the `%s` of %s still alive, %s attached to the "
        "graph that a backward already ran. %s; nothing will backpropagate through those graphs again, but none "
        "can be freed, so memory grows with every iteration." % (
            name, where(op).replace("Line", "on line", 1), moment, name,
            "1 earlier iteration was" if peak == 1 else "%d earlier iterations were" % peak,
            "still" if peak == 1 else "each still",
            "Line %d (`%s`) stores each of them" % (stored.line, stored.source) if stored is not None else
            "Something holds them (a list, an attribute, a helper object)"))
    fix = kept_fix(name, detached)
    diag = _diag(trace, "accumulated-graph", op, message, fix, tensor=name, tids=tuple(group))
    if stored is not None:  # the accumulation: where the tensors are kept, not where each was made
        diag.filename, diag.line, diag.source = stored.filename, stored.line, stored.source
    if op.node in nodes:
        diag.node_key, diag.node = op.node, nodes[op.node].name
    return diag


def _stored_at(trace: TraceData, op: OpRecord, t_id: int):
    """The statement that adds the tensor to a container (stores.storing_line), by the name the
    line that made it assigns."""
    return storing_line(trace, op.location, _assigned_name(trace, op), op.name) if op.location is not None else None


def _held_steps(kept: List[tuple], current: List[int]) -> List[int]:
    """Per point, how many steps before the current one the kept tensors alive there hold graphs of.
    A single -1 when they hold a sliding window instead: a step's graph was let go while a later
    step's was still kept (what grows keeps every step it took in; a new total holds the old one's)."""
    starts: Dict[int, List[int]] = {}
    ends: Dict[int, List[int]] = {}
    for _, first, last, bits in kept:
        steps = _bit_positions(bits)
        starts.setdefault(first, []).extend(steps)
        ends.setdefault(last, []).extend(steps)
    active: Dict[int, int] = {}  # step -> how many kept tensors alive now hold its graph
    spans = []
    for i, now in enumerate(current):
        for step in starts.get(i, ()):
            active[step] = active.get(step, 0) + 1
        # Kept tensors are older than the point: only the current step's can be among them.
        spans.append(len(active) - (now in active))
        gone = []
        for step in ends.get(i, ()):
            active[step] -= 1
            if not active[step]:
                del active[step]
                gone.append(step)
        if gone and active and min(gone) < max(active):
            return [-1]
    return spans


def _bit_positions(bits: int) -> List[int]:
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


def _retained_history(trace: TraceData) -> List[Diagnosis]:
    """The usual wrong fix for "backward through the graph a second time": a loop carries a
    tensor from one iteration into the next (`h = cell(x, h)`) and every backward keeps the graph
    (`retain_graph=True`). Nothing raises, but each backward runs again through every earlier
    iteration. Seen in the graph from the second backward call on: a line made a node that a
    backward keeping its graph ran; the line ran again, and its new nodes reach the old one, which
    the next backward runs again with them: each iteration's graph holds the one before
    (_carried). A line whose old nodes are run again only because a carried state holds them
    (`z = self.enc(x)`: its new nodes do not reach them) carries nothing. The lines of one
    recurrence are one problem, named at the first of them in an iteration: the line that takes in
    what the iteration before left (`h = torch.tanh(z + self.prev)`, before `self.prev = h.clone()`).

    Not this: two losses on one trunk (its nodes run again with no new execution of its line in
    between), a backward that builds a graph of its own (create_graph: MAML's inner steps
    differentiate through on purpose), a history cut now and then (a detach every k steps: the
    first execution's nodes are not run by the last backward calls)."""
    nodes, ops = trace.nodes, trace.ops
    keeping = {cp.op_index for cp in trace.checkpoints if cp.kind == "backward" and cp.retain}
    building = {n.created_by for n in nodes.values() if n.created_by is not None and ops[n.created_by].is_backward}
    failed = {op.index for op in ops if op.is_backward and op.error is not None}
    made_by_line: Dict[object, List[Tuple[int, int]]] = {}
    for key, node in nodes.items():
        if node.variable is not None or node.created_by is None or not node.consumed_by:
            continue
        op = ops[node.created_by]
        if op.location is not None and not op.is_backward:
            made_by_line.setdefault(op.location, []).append((node.created_by, key))
    carried: Dict[object, Tuple[int, List[int], int]] = {}  # line -> _carried
    for loc, made in made_by_line.items():
        made.sort()
        if max(nodes[made[0][1]].consumed_by) != max(max(nodes[k].consumed_by) for _, k in made):
            continue  # the history is cut somewhere (a detach every k steps): it does not grow
        found = _carried(trace, made, keeping - building, failed)
        if found is not None:
            carried[loc] = found
    out = []
    for group in _recurrences(trace, carried):
        loc = min(group, key=lambda line: nodes[carried[line][0]].created_by)
        old, new, taken_in = carried[loc]
        made = made_by_line[loc]
        first_op, first_key = made[0]
        runs = sorted(nodes[first_key].consumed_by)
        op = ops[max(nodes[k].created_by for k in new)]
        last_backward = ops[runs[-1]]
        name = _assigned_name(trace, op)
        label = name or trace.tensor_label(op.outputs[0] if op.outputs else None)
        message = (
            "`%s` carries the autograd graph of every earlier iteration into the next one, and the graph is "
            "kept with `retain_graph=True`: each backward() runs again through all earlier iterations. The "
            "nodes that %s made in its first execution were run by %d backward calls (the last at %s). Nothing "
            "raises, but every step is slower than the one before, memory grows with each iteration, and "
            "each step's gradients count the earlier iterations again." % (
                label, where(ops[first_op]).replace("Line", "line", 1), len(runs), line_ref(last_backward)))
        # What the next iteration takes in: where the line reads it (`self.prev`), else its name.
        state = trace.tensors.get(taken_in)
        state = _read_state(trace, op) or (state.name if state is not None and state.name else name)
        if state and _is_expression(state):
            fix = ("%s detach the carried state at the start of each iteration (truncated backpropagation "
                   "through time), so each backward runs only its own iteration's graph:\n%s\n"
                   "then drop `retain_graph=True` from the backward call: it is needed only where two backward "
                   "calls run through the same graph on purpose." % (
                       NO_ONE_LINE_FIX, code("%s = %s.detach()" % (state, state))))
        else:
            fix = ("%s detach the carried tensor (`.detach()`) at the start of each iteration and drop "
                   "`retain_graph=True` from the backward call." % NO_ONE_LINE_FIX)
        diag = _diag(trace, "accumulated-graph", op, message, fix, tensor=label,
                     tids=op.outputs[:1])
        if last_backward.location is not None:
            diag.saved_line, diag.saved_filename, diag.saved_source = (
                last_backward.location.line, last_backward.location.filename, last_backward.location.source)
        diag.saved_op_index = last_backward.index
        first_node = ops[first_op].node
        diag.node_key = first_node if first_node in nodes else first_key
        diag.node = nodes[diag.node_key].name
        out.append(diag)
    return out


def _read_state(trace: TraceData, op: OpRecord) -> Optional[str]:
    """The one attribute or element the line reads that the file also assigns (`self.prev` in
    `h = torch.tanh(z + self.prev)`, with `self.prev = h` elsewhere): where the state is kept between
    iterations."""
    if op.location is None:
        return None
    line = parse_statement(op.location.source)
    if line is None:
        return None
    whole = SourceIndex(trace.sources).tree(op.location.filename)
    if whole is None:
        return None
    kinds = (ast.Attribute, ast.Subscript)
    assigned = {ast.unparse(n) for n in ast.walk(whole) if isinstance(n, kinds) and isinstance(n.ctx, ast.Store)}
    inner = {id(n.value) for n in ast.walk(line) if isinstance(n, kinds)}  # `self.states` in `self.states[-1]`
    read = {ast.unparse(n): ast.get_source_segment(op.location.source, n) for n in ast.walk(line)
            if isinstance(n, kinds) and isinstance(n.ctx, ast.Load) and id(n) not in inner}
    found = [written for normal, written in read.items() if normal in assigned]
    return found[0] if len(found) == 1 else None  # as the user wrote it


def _is_expression(text: str) -> bool:
    """A name, an attribute or an element (`h`, `self.prev`, `memory["prev"]`): what `x = x.detach()` can rebind."""
    tree = parse_statement(text, mode="eval")
    return tree is not None and isinstance(tree.body, (ast.Name, ast.Attribute, ast.Subscript))


def _carried(trace: TraceData, made: List[Tuple[int, int]], keeping: set, failed: set) -> Optional[Tuple[int, List[int], Optional[int]]]:
    """(old node, new nodes, the tensor the new ones took in) when the line's nodes chain iterations:
    its earliest node run again (by a backward that kept the graph and built none) is run by the next
    backward together with nodes the line made in between, which reach it; the edge where they reach
    into the earlier graph starts at the tensor carried over. One walk over one iteration's graph,
    from the line's first node run again only: a line that carries does so from its first iteration."""
    nodes, ops = trace.nodes, trace.ops
    for _, old in made:
        runs = sorted(nodes[old].consumed_by)
        if len(runs) >= 2:
            break
    else:
        return None
    first, again = runs[0], runs[1]
    if first not in keeping or again in failed:
        return None
    new = [k for i, k in made if first < i < again and again in nodes[k].consumed_by]
    reaching, taken_in = [], None
    for key in new:
        between = _reach(trace, [key], old)
        if old not in between:
            continue
        reaching.append(key)
        if taken_in is None:
            edge = next((j for k in between if nodes[k].created_by is not None and nodes[k].created_by > first
                         for j in nodes[k].inputs if j in between and nodes[j].created_by is not None
                         and nodes[j].created_by < first), None)
            made_it = ops[nodes[edge].created_by] if edge is not None else None
            taken_in = made_it.outputs[0] if made_it is not None and made_it.outputs else None
    return (old, reaching, taken_in) if reaching else None


def _reach(trace: TraceData, starts: List[int], floor: int) -> set:
    """The nodes reachable from `starts`, made no earlier than node `floor` (node keys grow as
    nodes are made, and a node's inputs are older than it): the part of the graph between them."""
    nodes = trace.nodes
    seen: set = set()
    stack = [k for k in starts if k in nodes]
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        stack.extend(k for k in nodes[key].inputs if k >= floor and k in nodes and k not in seen)
    return seen


def _recurrences(trace: TraceData, carried: Dict[object, tuple]) -> List[List[object]]:
    """The carrying lines grouped by recurrence: two lines are one when each one's new nodes reach
    the other's old node (a state and its copy; two layers that each carry their own state are two)."""
    lines = list(carried)
    group = {line: i for i, line in enumerate(lines)}
    for a_index, a in enumerate(lines):
        for b in lines[a_index + 1:]:
            if group[a] == group[b]:
                continue
            (old_a, new_a, _), (old_b, new_b, _) = carried[a], carried[b]
            if old_b in _reach(trace, new_a, old_b) and old_a in _reach(trace, new_b, old_a):
                merged, gone = group[a], group[b]
                for line in lines:
                    if group[line] == gone:
                        group[line] = merged
    out: Dict[int, List[object]] = {}
    for line in lines:
        out.setdefault(group[line], []).append(line)
    return list(out.values())


def _assigned_name(trace: TraceData, op: OpRecord) -> Optional[str]:
    """The name a line assigns to (`running_loss += loss` -> running_loss; `sums[k] = ...` ->
    sums[k]), from its source."""
    text = op.location.source if op.location else ""
    tree = parse_statement(text)
    if tree is None or not tree.body:
        return None
    stmt = tree.body[0]
    target = getattr(stmt, "target", None) or (stmt.targets[0] if isinstance(stmt, ast.Assign) else None)
    return ast.unparse(target) if isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)) else None


# -- wording -----------------------------------------------------------------------------------

def _diag(trace, kind, op, message, fix, tensor=None, tids=()) -> Diagnosis:
    loc = op.location if op is not None else None
    return Diagnosis(kind=kind, message=message, fix=fix, filename=loc.filename if loc else None,
                     line=loc.line if loc else None, source=loc.source if loc else "", tensor=tensor,
                     op_index=op.index if op is not None else None, tids=tuple(tids))
