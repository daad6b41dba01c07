"""Building the scene of a trace: the iteration drawn, its items and edges, what a diagnosis
talks about (the saved tensor, the write, the cut), then the boxes and the first layers."""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict, deque
from typing import Dict, Iterable, List, Set

from ...model import TraceData
from ...model.queries import is_cut, node_at
from .grouping import boxes_of, eager, focus_of, layer_box
from .labels import (MAX_CHARS, clip, line_labeller, main_file, node_shape, saved_state, shape_of,
                     short_label, short_name)
from .sizes import size_all
from .scene import EAGER_ITEMS, FOLD, MAX_CHILDREN, Item, Scene, children_of, write_id


def build_scene(trace: TraceData, max_children: int = MAX_CHILDREN, eager_items: int = EAGER_ITEMS,
                badges: Iterable[str] = ()) -> Scene:
    """The scene of one trace, with the boxes of the first view laid out (others on request).

    `badges`: the modules (by name) with gradient-health data, whose boxes carry its bar."""
    scene = Scene(total_nodes=len(trace.nodes), badges=set(badges))
    keys, lo, hi, folded = _iteration(trace)
    scene.shown_nodes = len(keys)
    _items(trace, scene, keys, lo, folded)
    boxes_of(trace, scene, max_children)
    focus_of(trace, scene)
    laid = eager(scene, eager_items)
    lift_edges = scene.lifted_edges()
    for box in laid:
        scene.layers[box] = layer_box(scene, box, lift_edges.get(box, ()))
    _size_children(scene, laid)
    return scene


def _size_children(scene: Scene, boxes: Iterable[str]) -> None:
    """Size what the boxes laid out hold: what is sent to the front end and placed (a box not laid
    out shows closed, and what it holds is sized when it is)."""
    kids = [c for box in boxes for c in children_of(scene, box)]
    size_all([scene.items[c] for c in kids if c in scene.items], [scene.boxes[c] for c in kids if c in scene.boxes],
             scene.badges)


def lay_out(scene: Scene, boxes: Iterable[str]) -> List[str]:
    """Lay out more boxes (opened in the front end before they were sent); returns the new ones."""
    wanted = []
    for box in boxes:
        if box in scene.boxes and box not in scene.layers:
            wanted.extend(b for b in reversed(scene.ancestors(box)) if b not in scene.layers)
            wanted.append(box)
    wanted = list(dict.fromkeys(wanted))
    if wanted:
        lift_edges = scene.lifted_edges()
        for box in wanted:
            scene.layers[box] = layer_box(scene, box, lift_edges.get(box, ()))
        _size_children(scene, wanted)
    return wanted


def iteration_starts(trace: TraceData) -> List[int]:
    """The op index where each iteration of the block starts: 0, then, after each backward call,
    the first op that begins a forward pass (its grad_fn reaches a leaf through nodes made since
    that backward). What runs between a backward and the next forward (the optimizer step,
    logging, `total_loss += loss`) belongs to the iteration that just ran backward, and a block
    that only does such things after its last backward has no iteration of its own there."""
    backward = [op.index for op in trace.ops if op.is_backward]
    if not backward:
        return [0]
    nodes = trace.nodes
    made_by: Dict[int, List[int]] = defaultdict(list)
    for key, n in nodes.items():
        if n.created_by is not None:
            made_by[n.created_by].append(key)
    starts = [0]
    bounds = backward + [len(trace.ops)]
    for after, end in zip(bounds, bounds[1:]):
        fresh: Set[int] = set()
        for op_index in range(after + 1, end):
            for key in made_by.get(op_index, ()):
                if any(nodes[c].variable is not None or c in fresh for c in nodes[key].inputs if c in nodes):
                    fresh.add(key)
            if fresh:
                starts.append(op_index)
                break
    return starts


def iteration_of(starts: List[int], op_index: int) -> int:
    """The iteration (0-based) that op `op_index` belongs to."""
    return max(0, bisect.bisect_right(starts, op_index) - 1)


def _iteration(trace: TraceData):
    """The grad_fn nodes of the iteration to draw: the one a diagnosis points at, else the last.

    Returns the node keys, the iteration's first and last op index, and how many nodes of other
    iterations were left out.
    """
    nodes = trace.nodes
    starts = iteration_starts(trace)
    per_iteration = Counter(iteration_of(starts, n.created_by) for n in nodes.values() if n.created_by is not None)
    if len(per_iteration) <= 1:
        return set(nodes), -1, len(trace.ops), 0
    chosen = None
    for d in trace.diagnoses:
        at = d.op_index
        if at is None and d.node_key in nodes:
            at = nodes[d.node_key].created_by
        if at is not None:
            chosen = iteration_of(starts, at)
            break
    if chosen is None or chosen not in per_iteration:
        chosen = max(per_iteration)
    lo = starts[chosen]
    hi = starts[chosen + 1] - 1 if chosen + 1 < len(starts) else len(trace.ops)
    start = [k for k, n in nodes.items() if n.created_by is not None and lo <= n.created_by <= hi]
    keep, queue = set(start), deque(start)
    while queue:  # what this iteration's nodes lead to: leaves and nodes from before the block
        for child in nodes[queue.popleft()].inputs:
            n = nodes.get(child)
            if n is not None and child not in keep and (n.created_by is None or lo <= n.created_by <= hi):
                keep.add(child)
                queue.append(child)
    folded = sum(1 for k, n in nodes.items() if k not in keep)
    return keep, lo, hi, folded


def _items(trace: TraceData, scene: Scene, keys: Set[int], lo: int, folded: int) -> None:
    nodes, ops, items = trace.nodes, trace.ops, scene.items
    named: Dict[int, str] = {}
    for info in trace.tensors.values():
        if info.name and info.node is not None and not info.is_leaf:
            named[info.node] = info.name
    problem_keys = {d.node_key for d in trace.diagnoses if d.node_key is not None}
    problem_tids = {t for d in trace.diagnoses for t in d.tids}
    first_use: Dict[int, int] = {}
    for key in keys:
        n = nodes[key]
        at = n.created_by if n.created_by is not None else -1
        for child in n.inputs:
            if child in keys and (child not in first_use or at < first_use[child]):
                first_use[child] = at
    where = line_labeller(trace)
    here = main_file(trace)

    leaf_of: Dict[int, str] = {}
    for key in keys:
        n = nodes[key]
        nid = "fn%d" % key
        if n.variable is not None:
            info = trace.tensors.get(n.variable)
            full = trace.tensor_label(n.variable)
            items[nid] = Item(nid, "leaf", clip(short_name(full)), clip("AccumulateGrad " + shape_of(trace, n.variable)),
                              full, pos=first_use.get(key, -1) - 0.5, problem=key in problem_keys
                              or n.variable in problem_tids, shape=shape_of(trace, n.variable))
            items[nid].parent = "param:" + full if info is not None and "." in full else ""
            leaf_of[n.variable] = nid
            continue
        pos = float(n.created_by) if n.created_by is not None else first_use.get(key, -1) - 0.5
        sub = clip(" ".join(s for s in (n.name, where(n.created_by)) if s))
        shape = node_shape(trace, key)
        if key in named:
            items[nid] = Item(nid, "tensor", clip(named[key]), sub, named[key], pos=pos, problem=key in problem_keys,
                              shape=shape)
        else:
            items[nid] = Item(nid, "fn", clip(n.name), clip(where(n.created_by)), n.name, pos=pos,
                              problem=key in problem_keys, shape=shape)
        op = ops[n.created_by] if n.created_by is not None and 0 <= n.created_by < len(ops) else None
        if op is not None and op.location is not None:
            items[nid].where = (op.location.filename, op.location.line)
            if op.location.filename == here:
                items[nid].line = op.location.line
    for key in keys:
        n = nodes[key]
        for child in n.inputs:
            if child in keys:
                scene.edges.append(("fn%d" % key, "fn%d" % child, "next"))
    if folded:
        pos_fold = float(lo) - 1
        items[FOLD] = Item(FOLD, "fold", "%d nodes of other iterations" % folded,
                           "folded: the view shows one iteration", pos=pos_fold)
        for key in keys:
            if any(c in nodes and c not in keys for c in nodes[key].inputs):
                scene.edges.append(("fn%d" % key, FOLD, "next"))
        n_runs = sum(1 for op in ops if op.is_backward) + 1
        scene.note = ("One iteration shown; the repeats are folded: %d of %d nodes drawn, %d folded (%d backward "
                      "calls)." % (len(keys), len(nodes), folded, n_runs - 1))
    # What a diagnosis talks about: the tensor it names, the write that changed it.
    for d in trace.diagnoses:
        targets: List[str] = []
        wid = None
        for tid in d.tids:
            if tid in leaf_of:
                targets.append(leaf_of[tid])
                continue
            tensor_item = "t%d" % tid
            savers = ["fn%d" % n.key for n in (nodes[k] for k in keys) for s in n.saved if s.tid == tid]
            info = trace.tensors.get(tid)
            own_node = "fn%d" % info.node if info is not None and info.node is not None else None
            if not savers and own_node in items:  # the tensor is drawn already: its grad_fn, by its name
                items[own_node].problem = True
                targets.append(own_node)
                continue
            if tensor_item not in items:
                full = trace.tensor_label(tid)
                at = info.created_by if info is not None and info.created_by is not None else None
                if at is None:  # made before the block: it sits where it is first used
                    at = next((op.index for op in ops if tid in op.inputs), None)
                no_grad_fn = d.kind == "graph-cut" and info is not None and info.node is None
                if savers:  # the value a node saved, beside the node that holds the tensor now (same name)
                    label = clip(short_label(trace, tid), MAX_CHARS - 12) + saved_state(d)
                    now = "now v%d" % d.current_version if d.current_version is not None else ""
                    sub = " ".join(s for s in ("tensor", shape_of(trace, tid), now) if s)
                else:
                    label = clip(full)
                    sub = " ".join(s for s in ("tensor", shape_of(trace, tid), "(no grad_fn)" if no_grad_fn else "")
                                   if s)
                items[tensor_item] = Item(tensor_item, "saved" if savers else "tensor", label, clip(sub), full,
                                          pos=float(at) if at is not None else -1.0, problem=True,
                                          shape=shape_of(trace, tid))
                if info is not None and info.is_leaf and info.name and "." in info.name:  # a module's parameter
                    items[tensor_item].parent = "param:" + full
                elif at is not None:
                    items[tensor_item].parent = "op:%d" % at
                for s in savers:
                    scene.edges.append((s, tensor_item, "saves"))
            targets.append(tensor_item)
        if d.node_key is not None and "fn%d" % d.node_key in items:
            targets.append("fn%d" % d.node_key)
        if d.op_index is not None and 0 <= d.op_index < len(ops):
            wid = write_id(d.op_index)
            if wid not in items:
                op = ops[d.op_index]
                text = (op.location.source if op.location else "") or op.name
                cut = _cut_here(trace, d, op)
                items[wid] = Item(wid, "cut" if cut else "write", clip(text), clip(
                    where(d.op_index) + (": chain cut here" if cut else " " + d.kind)), text,
                                  pos=float(d.op_index), problem=True)
                if op.location is not None:
                    items[wid].where = (op.location.filename, op.location.line)
                items[wid].parent = "op:%d" % d.op_index
                if cut:
                    _cut_edges(trace, scene, op, wid, targets)
                elif targets:
                    scene.edges.append((wid, targets[0], "overwrote"))
        found = list(dict.fromkeys(targets + ([wid] if wid in items else [])))
        found.sort(key=lambda i: items[i].kind != "cut")  # a cut is what its card is about: first
        scene.problems.append(found)
    _names(trace, scene, keys)


def _names(trace: TraceData, scene: Scene, keys: Set[int]) -> None:
    """Every name of the trace that find should reach, to the item standing for it: a named
    result's node, a parameter's leaf; a tensor of a folded iteration, the folded box."""
    items = scene.items
    drawn_names = {x.name for x in items.values()}
    accumulator = {n.variable: k for k, n in trace.nodes.items() if n.variable is not None}
    for info in trace.tensors.values():
        if not info.name or info.name in drawn_names or info.name in scene.names:
            continue
        key = accumulator.get(info.tid) if info.is_leaf else info.node
        if key is None or key not in trace.nodes:
            continue
        if "fn%d" % key in items:
            scene.names[info.name] = "fn%d" % key
        elif FOLD in items and key not in keys:
            scene.names[info.name] = FOLD


def _cut_here(trace: TraceData, d, op) -> bool:
    """The diagnosis names the op where the chain to the parameters was cut (graph-cut, or a
    parameter starved by a cut), not the backward call or a move."""
    if op.is_backward:
        return False
    return d.kind == "graph-cut" or (d.kind == "missing-grad" and is_cut(trace, op))


def _cut_edges(trace: TraceData, scene: Scene, op, cut_id: str, targets: List[str]) -> None:
    """The cut op between what fed it and what used it: ordinary edges to the graph nodes of its
    inputs, and a broken one ("cut") from each node made from its result, or, when nothing with a
    graph was (`torch.tensor(x.item())`), from the tensor the diagnosis names (the loss)."""
    items = scene.items
    for tid in op.inputs:
        key = node_at(trace, tid, op.index)
        if key is not None and "fn%d" % key in items:
            scene.edges.append((cut_id, "fn%d" % key, "next"))
    made = set(op.outputs)
    users = []
    for later in trace.ops[op.index + 1:]:
        if made.intersection(later.inputs) and later.node is not None and "fn%d" % later.node in items:
            users.append("fn%d" % later.node)
    for user in dict.fromkeys(users or [t for t in targets[:1] if not t.startswith("fn-")]):
        scene.edges.append((user, cut_id, "cut"))
