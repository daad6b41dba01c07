"""accumulated-graph: graphs kept alive by accident, growing with every iteration.

Reasons: `linked` (a side chain no backward runs links each iteration's backpropagated graph to what it
made before: `total_loss += loss`), `kept-apart` (each iteration's tensor outlives its backward whole:
losses appended to a list), `retained` (a loop carries a tensor into the next iteration and every
backward keeps the graph: each backward runs again through every earlier iteration)."""
from __future__ import annotations

import ast
import bisect
from typing import Dict, List, Optional, Tuple

from ...model import OpRecord, TraceData
from ...model.queries import ancestors
from ...source.alignment import Alignment
from ...source.index import parse_fresh, parse_statement
from ...source.rewrites import without_graph
from ...source.stores import handed_loop_values, storing_line
from ..findings import Finding, Words
from ..fixes import NO_ONE_LINE_FIX, REPLACE, accumulation_fix, code, kept_fix, line_ref, where
from ..wording import words


def accumulated_graphs(trace: TraceData, source) -> List[Finding]:
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
        f = _linked(trace, source, chains, chain)
        key = _line(f.op.location)
        if key in found:
            found[key].tids = tuple(dict.fromkeys(found[key].tids + f.tids))
        else:
            found[key] = f
    kept = _kept_apart(trace, source, chains)
    if kept is not None:
        key = _line(kept.at if kept.at is not None else kept.op.location)
        if key not in found:
            found[key] = kept
    return list(found.values())


def _line(at):
    return (at.filename, at.line) if at is not None else (None, None)


def _claim(trace: TraceData, tids, name: str) -> Optional[int]:
    """The tensor whose label a diagnosis that shows `name` shows (where it names one of its own)."""
    return next((t for t in tids if t in trace.tensors and trace.tensor_label(t) == name), None)


def _linked(trace: TraceData, source: Alignment, chains: "_SideChains", chain: int) -> Finding:
    op = chains.grew[chain][0 if chains.by_updates else 1] or trace.ops[chains.last[chain][0]]
    _, held = chains.steps(chains.last[chain])
    link = chains.link[chain]
    linked = link[1] if link is not None else None
    tids = tuple(t for t in (op.outputs[:1] + (linked,)) if t is not None)
    name = _assigned_name(trace, op) or trace.tensor_label(op.outputs[0] if op.outputs else None)
    return Finding("accumulated-graph", "linked", op=op, subject=_claim(trace, tids, name), tids=tids,
                   node_key=op.node, facts={"held": held, "linked": linked,
                                            "handed": handed_loop_values(source, op.location)})


@words("linked")
def _linked_words(trace: TraceData, f: Finding) -> Words:
    op, linked = f.op, f.facts["linked"]
    name = _assigned_name(trace, op) or trace.tensor_label(op.outputs[0] if op.outputs else None)
    linked_name = trace.tensors[linked].name if linked in trace.tensors else None
    message = (
        "`%s` holds the autograd graphs of %d iterations that were already backpropagated: %s adds "
        "%sa tensor still attached to its graph, so each iteration's whole graph stays linked into `%s`. "
        "Nothing will ever backpropagate through them, but none can be freed, so memory grows with every "
        "iteration." % (name, f.facts["held"], where(op), "`%s`, " % linked_name if linked_name else "", name))
    source = op.location.source if op.location else ""
    fix = accumulation_fix(source, linked_name)
    if REPLACE not in fix:
        detached = _detached_value(source, f.facts["handed"])
        if detached:
            fix = ("Keep the accumulated value without the graphs it links. %s\n%s\n"
                   "(or accumulate a Python number, `.item()`, if nothing reads it as a tensor)."
                   % (REPLACE, code(detached)))
    return Words(message, fix, name)


def _kept_apart(trace: TraceData, source: Alignment, chains: "_SideChains") -> Optional[Finding]:
    """Tensors each holding a backpropagated graph, kept past later backward calls (trace.kept), made
    again and again by the same code: at each backward call (and at the end), the steps before the
    current one whose graphs the kept tensors of one line still hold. Growing: the most ever held, two
    at least, is more than the most held by the time half as many steps had run. Tensors of
    different lines kept side by side (the variables of a program without a loop) are not
    iterations. A tensor whose graph later backward calls run again is a carried state
    (retained_history); a side chain already said is not said twice."""
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
        stored = _stored_at(source, makers[last_made])
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
    stored, detached, stored_as = _stored_at(source, op) or (None, "", "")
    assigned = _assigned_name(trace, op)
    name = trace.tensors[t_id].name or assigned or stored_as or trace.tensor_label(t_id)
    facts = {"kept": t_id, "peak": peak, "point": points[i], "stored": stored, "detached": detached,
             "assigned": assigned, "stored_as": stored_as}
    # The accumulation: where the tensors are kept, not where each was made.
    return Finding("accumulated-graph", "kept-apart", op=op, at=stored, subject=_claim(trace, group, name),
                   tids=tuple(group), node_key=op.node if op.node in nodes else None, facts=facts)


@words("kept-apart")
def _kept_apart_words(trace: TraceData, f: Finding) -> Words:
    facts, op, ops = f.facts, f.op, trace.ops
    t_id, peak, point, stored = facts["kept"], facts["peak"], facts["point"], facts["stored"]
    name = trace.tensors[t_id].name or facts["assigned"] or facts["stored_as"] or trace.tensor_label(t_id)
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
    return Words(message, kept_fix(name, facts["detached"]), name)


def retained_history(trace: TraceData, source) -> List[Finding]:
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
        first_node = ops[first_op].node
        label = _assigned_name(trace, op) or trace.tensor_label(op.outputs[0] if op.outputs else None)
        out.append(Finding("accumulated-graph", "retained", op=op, saved=ops[runs[-1]],
                           subject=_claim(trace, op.outputs[:1], label), tids=op.outputs[:1],
                           node_key=first_node if first_node in nodes else first_key,
                           facts={"first": ops[first_op], "runs": len(runs), "taken_in": taken_in,
                                  "state_read": _read_state(source, op)}))
    return out


@words("retained")
def _retained_words(trace: TraceData, f: Finding) -> Words:
    op, facts, last_backward = f.op, f.facts, f.saved
    name = _assigned_name(trace, op)
    label = name or trace.tensor_label(op.outputs[0] if op.outputs else None)
    message = (
        "`%s` carries the autograd graph of every earlier iteration into the next one, and the graph is "
        "kept with `retain_graph=True`: each backward() runs again through all earlier iterations. The "
        "nodes that %s made in its first execution were run by %d backward calls (the last at %s). Nothing "
        "raises, but every step is slower than the one before, memory grows with each iteration, and "
        "each step's gradients count the earlier iterations again." % (
            label, where(facts["first"]).replace("Line", "line", 1), facts["runs"], line_ref(last_backward)))
    # What the next iteration takes in: where the line reads it (`self.prev`), else its name.
    state = trace.tensors.get(facts["taken_in"])
    state = facts["state_read"] or (state.name if state is not None and state.name else name)
    if state and _is_expression(state):
        fix = ("%s detach the carried state at the start of each iteration (truncated backpropagation "
               "through time), so each backward runs only its own iteration's graph:\n%s\n"
               "then drop `retain_graph=True` from the backward call: it is needed only where two backward "
               "calls run through the same graph on purpose." % (
                   NO_ONE_LINE_FIX, code("%s = %s.detach()" % (state, state))))
    else:
        fix = ("%s detach the carried tensor (`.detach()`) at the start of each iteration and drop "
               "`retain_graph=True` from the backward call." % NO_ONE_LINE_FIX)
    return Words(message, fix, label)


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

def _stored_at(source: Alignment, op: OpRecord):
    """The statement that adds the tensor op made to a container (stores.storing_line), by the name the
    line that made it assigns."""
    return storing_line(source, op.location, _assigned_name(source.trace, op), op.name) if op.location is not None else None

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

def _read_state(source: Alignment, op: OpRecord) -> Optional[str]:
    """The one attribute or element the line reads that the file also assigns (`self.prev` in
    `h = torch.tanh(z + self.prev)`, with `self.prev = h` elsewhere): where the state is kept between
    iterations."""
    if op.location is None:
        return None
    line = parse_statement(op.location.source)
    if line is None:
        return None
    whole = source.index.tree(op.location.filename)
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
