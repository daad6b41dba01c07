"""What to draw: one iteration's autograd graph inside collapsible module boxes, as plain data.

The scene is computed here and drawn elsewhere (widget.js in the browser, draw.py for the
static SVG and PNG). It holds:

- items: the drawn nodes: grad_fn nodes (a named result shows its variable's name), leaves
  (AccumulateGrad, labelled with the parameter's name), the tensors and writes a diagnosis
  talks about;
- boxes: one per *call* of an nn.Module (a module called twice is two boxes), holding the
  items its forward created and the parameters it owns; large boxes are split into chunks
  of consecutive operations;
- layers: for each box laid out, its children in layers (networkx, longest path from the
  root down), so that the front end only places them;
- edges: from a node to what it needs in backward, between the deepest drawn things, with the
  shape of the tensor whose gradient flows along them;
- routes: an edge that skips layers of its box passes through route points, one per layer it
  crosses, placed among the children like narrow nodes, so that it runs between nodes and
  never behind one (the dummy nodes of a Sugiyama layout);
- core and path: what the first view must show (the nodes a diagnosis is about) and the way from
  there to the root; `first_view` says where the view starts for a pane of a given size, as
  widget.js computes it.

Runs of three or more nodes that one line of the user's code made outside any module
(`loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ...)`) share a box named by that line,
so the way from the loss to the model is one step, not five.

Why boxes never make cycles: backward edges run from a node to nodes made by earlier
operations, and every box (a module call, a chunk) holds one run of consecutive operations,
so between two boxes edges only run one way. Leaves and tensors are sinks and writes are
sources, so where they sit cannot close a cycle either.

Why one iteration: a training loop's graph repeats; the view shows the iteration with the
problem (or the last one) and folds the others into one box, so it does not grow with the
number of steps. An iteration starts where a forward pass starts (see `iteration_starts`), so
what a loop does after its backward call (the optimizer step, `total_loss += loss`) belongs to
the iteration whose loss it used.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

import networkx as nx

from ..model.queries import is_cut, node_at
from ..model import TraceData

MAX_CHILDREN = 40        # children of one box before its contents are chunked
FIRST_VIEW_ITEMS = 10    # the model's own levels open by themselves up to this many things shown
EAGER_ITEMS = 3000       # items laid out before the first screen; deeper boxes on request
ROOT = ""                # the id of the outermost box (the cell itself)
FOLD = "fold"            # the item standing for the iterations not shown

LINE_BOX_MIN = 3         # nodes one line made outside modules before they share a box
ROUTE = "~"              # the prefix of route points' ids

# Geometry shared by the static drawings (draw.py); widget.js uses the same numbers.
NODE_H, BOX_H, HEADER_H, PAD = 36, 40, 22, 10
GAP_X, GAP_Y, ROW_GAP, ROW_MAX = 16, 30, 12, 8
CHAR_W, MIN_W, MAX_W, MAX_CHARS = 7.0, 64, 250, 34
ROUTE_W = 8              # the width a route point takes in its row
# The first view: the smallest text is 11 px (sublabels, shapes on edges), so the view starts
# at 100% at most, never smaller (READABLE_ZOOM); MARGIN inside the pane; the overview map's
# box in the pane's bottom right corner (widget.css: .ja-minimap), which the first view keeps
# clear of what it is about.
SMALLEST_FONT, READABLE_ZOOM, MARGIN = 11, 1.0, 16
MINIMAP_W, MINIMAP_H, MINIMAP_INSET = 96, 110, 6


@dataclass(slots=True)
class Item:
    id: str
    kind: str              # fn, tensor (a named result's node), leaf, saved, write, cut, fold
    label: str
    sub: str = ""
    name: str = ""         # what find matches: the variable, the parameter's dotted name
    parent: str = ROOT
    pos: float = 0.0       # place in the operation order (boxes hold runs of it)
    problem: bool = False
    line: int = 0          # the line in the user's file that made it, 0 when elsewhere
    shape: str = ""        # the shape of what it made: edges into it carry a gradient of that shape
    where: Tuple[str, int] = ("", 0)  # the file and line that made it


@dataclass(slots=True)
class Box:
    id: str
    kind: str              # module, line (what one line made outside modules) or chunk
    label: str
    sub: str = ""
    name: str = ""
    parent: str = ROOT
    first: float = 0.0     # the run of operations it holds
    children: List[str] = field(default_factory=list)
    count: int = 0         # items inside, at any depth
    lines: Tuple[int, int] = (0, 0)  # first and last line of the user's file inside (chunks)


@dataclass
class Scene:
    items: Dict[str, Item] = field(default_factory=dict)
    boxes: Dict[str, Box] = field(default_factory=dict)
    edges: List[Tuple[str, str, str]] = field(default_factory=list)  # item to item, kind
    layers: Dict[str, List[List[str]]] = field(default_factory=dict)  # box id -> layers of child ids
    # box id -> [child u, child v, route points between them]: the long edges among its children
    routes: Dict[str, List[Tuple[str, str, List[str]]]] = field(default_factory=dict)
    route_index: Dict[Tuple[str, str], List[str]] = field(default_factory=dict)  # (u, v) -> its route points
    open: List[str] = field(default_factory=list)    # boxes open in the first view
    core: List[str] = field(default_factory=list)    # what the first view must show: the problem's nodes
    focus: List[str] = field(default_factory=list)   # what it shows around them, when there is room
    path: List[str] = field(default_factory=list)    # root ... problem node, to highlight
    names: Dict[str, str] = field(default_factory=dict)  # a tensor's name -> the item that stands for it
    problems: List[List[str]] = field(default_factory=list)  # per diagnosis, the items it is about
    note: str = ""
    total_nodes: int = 0   # grad_fn nodes in the whole trace
    shown_nodes: int = 0   # of them, in the iteration drawn
    _lifted: Optional[Dict[str, Set[Tuple[str, str]]]] = None
    _crossing: Optional[Dict[str, Set[Tuple[str, str]]]] = None
    _route_first: Dict[str, float] = field(default_factory=dict)  # route point -> its place in op order

    def new_route_point(self, first: float) -> str:
        point = "%s%d" % (ROUTE, len(self._route_first))
        self._route_first[point] = first
        return point

    # -- hierarchy helpers -----------------------------------------------------------------------
    def parent_of(self, node_id: str) -> Optional[str]:
        thing = self.items.get(node_id) or self.boxes.get(node_id)
        return None if thing is None else thing.parent

    def ancestors(self, node_id: str) -> List[str]:
        """Boxes holding `node_id`, innermost first (the root box not included)."""
        out = []
        parent = self.parent_of(node_id)
        while parent:
            out.append(parent)
            parent = self.boxes[parent].parent
        return out

    def _root_children(self) -> List[str]:
        return [i for i, x in self.items.items() if x.parent == ROOT] + [
            b for b, x in self.boxes.items() if x.parent == ROOT]

    def lifted_edges(self) -> Dict[str, Set[Tuple[str, str]]]:
        """For each box, the edges between its children that the item-level edges imply."""
        if self._lifted is None:
            self._lift()
        return self._lifted

    def crossings(self) -> Dict[str, Set[Tuple[str, str]]]:
        """For each box, its children that an edge leaves the box from, `(child, "")`, or enters
        it to, `("", child)`: their edges are routed down to the box's bottom or from its top."""
        if self._crossing is None:
            self._lift()
        return self._crossing

    def _lift(self) -> None:
        depth: Dict[str, int] = {ROOT: 0}

        def depth_of(x: str) -> int:
            d = depth.get(x)
            if d is None:
                d = depth[x] = depth_of(self.parent_of(x)) + 1
            return d

        out: Dict[str, Set[Tuple[str, str]]] = defaultdict(set)
        crossing: Dict[str, Set[Tuple[str, str]]] = defaultdict(set)
        for u, v, _ in self.edges:
            pu, pv = self.parent_of(u), self.parent_of(v)
            if pu == pv:  # the common case: two things in one box
                out[pu].add((u, v))
                continue
            du, dv = depth_of(u), depth_of(v)
            while du > dv:
                crossing[pu].add((u, ""))
                u, pu, du = pu, self.parent_of(pu), du - 1
            while dv > du:
                crossing[pv].add(("", v))
                v, pv, dv = pv, self.parent_of(pv), dv - 1
            while pu != pv:
                crossing[pu].add((u, ""))
                crossing[pv].add(("", v))
                u, pu = pu, self.parent_of(pu)
                v, pv = pv, self.parent_of(pv)
            if u != v:
                out[pu].add((u, v))
        self._lifted, self._crossing = out, crossing

    # -- what the front end receives -------------------------------------------------------------
    def to_json(self, laid_out: Optional[Iterable[str]] = None) -> Dict:
        """Plain lists for the synced trait (small: short keys, one list per thing)."""
        laid = set(self.layers if laid_out is None else laid_out)
        sent_boxes = [b for b in self.boxes.values() if b.parent in laid]
        sent_items = [x for x in self.items.values() if x.parent in laid]
        sent = {x.id for x in sent_items} | {b.id for b in sent_boxes}
        edges, seen = [], set()
        for u, v, kind in self.edges:
            a, b = self._deepest_sent(u, sent), self._deepest_sent(v, sent)
            if a is None or b is None or a == b or (a, b) in seen:
                continue
            seen.add((a, b))
            edges.append([a, b, kind, self.items[v].shape if v in self.items else ""])
        return {
            "items": [[x.id, x.kind, x.label, x.sub, x.parent, x.name, int(x.problem)] for x in sent_items],
            "boxes": [[b.id, b.kind, b.label, b.sub, b.parent, b.name, b.count, int(b.id in laid)]
                      for b in sent_boxes],
            "layers": {b: self.layers[b] for b in laid if b in self.layers},
            "routes": {b: self.routes[b] for b in laid if self.routes.get(b)},
            "edges": edges,
            "open": [b for b in self.open if b in laid],
            "core": list(self.core), "focus": list(self.focus), "path": list(self.path), "note": self.note,
            "names": [[name, target] for name, target in self.names.items()],
            "problems": [list(p) for p in self.problems],
        }

    def _deepest_sent(self, x: str, sent: Set[str]) -> Optional[str]:
        while x not in sent:
            x = self.parent_of(x)
            if not x:
                return None
        return x


# -- building the scene ------------------------------------------------------------------------------

def main_file(trace: TraceData) -> str:
    """The user's file (the cell): where a diagnosis points, else where code outside modules ran."""
    for d in trace.diagnoses:
        if d.filename:
            return d.filename
    return block_file(trace)


def block_file(trace: TraceData) -> str:
    """The file of the block itself (the `%%autograd` cell): where its last op outside any
    module ran (a block ends in its own code; its first ops may run in a model's __init__)."""
    for op in reversed(trace.ops):
        if op.location is not None and not op.module:
            return op.location.filename
    return next((op.location.filename for op in trace.ops if op.location is not None), "")


def write_id(op_index: int) -> str:
    return "op%d" % op_index


def build_scene(trace: TraceData, max_children: int = MAX_CHILDREN, eager_items: int = EAGER_ITEMS) -> Scene:
    """The scene of one trace, with the boxes of the first view laid out (others on request)."""
    scene = Scene(total_nodes=len(trace.nodes))
    keys, lo, hi, folded = _iteration(trace)
    scene.shown_nodes = len(keys)
    _items(trace, scene, keys, lo, folded)
    _boxes(trace, scene, max_children)
    _focus(trace, scene)
    laid = _eager(scene, eager_items)
    lift_edges = scene.lifted_edges()
    for box in laid:
        scene.layers[box] = layer_box(scene, box, lift_edges.get(box, ()))
    return scene


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


def _short_name(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else name


def clip(text: str, width: int = MAX_CHARS) -> str:
    """A label every picture can draw: one line of at most `width` characters (a name can be
    100,000 long), with what is not printable (ESC, NUL, a lone surrogate: XML cannot hold them,
    fonts have no glyph for them) written as Python writes it in a repr (`\\x1b`)."""
    if len(text) <= width and text.isprintable() and "  " not in text:
        return text
    text = " ".join(text.split())
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def _shape(trace: TraceData, tid: Optional[int]) -> str:
    info = trace.tensors.get(tid) if tid is not None else None
    if info is None:
        return ""
    return "[%s]" % ", ".join(str(s) for s in info.shape) if info.shape else "scalar"


def _node_shape(trace: TraceData, key: int) -> str:
    """The shape of what node `key` made (its gradient's shape), when that is one shape: the
    op's output for the node an op recorded as its own, the parameter's for a leaf."""
    n = trace.nodes[key]
    if n.variable is not None:
        return _shape(trace, n.variable)
    if n.created_by is None or not 0 <= n.created_by < len(trace.ops):
        return ""
    op = trace.ops[n.created_by]
    if op.node != key or not op.outputs:
        return ""  # one of several nodes of one op (an RNN's steps): which output is not known
    if len(op.outputs) == 1:
        return _shape(trace, op.outputs[0])
    shapes = {_shape(trace, tid) for tid in op.outputs}
    return shapes.pop() if len(shapes) == 1 else ""


def _short_label(trace: TraceData, tid: int) -> str:
    """A tensor's name, else what made it (`F.linear output`): tensor_label's description is a
    sentence, too long for a box."""
    info = trace.tensors.get(tid)
    if info is None or info.name:
        return trace.tensor_label(tid)
    if info.created_by is not None and 0 <= info.created_by < len(trace.ops):
        return "%s output" % trace.ops[info.created_by].name
    return "input " + _shape(trace, tid)


def _saved_state(d) -> str:
    """What a saved tensor's box adds to its name, so that it is not mistaken for the node of
    the same name: the version it was saved at, or that its graph was freed."""
    if d.kind == "graph-freed":
        return " (graph freed)"
    return " (saved v%d)" % d.saved_version if d.saved_version is not None else " (saved)"


def line_labeller(trace: TraceData):
    """`where(op_index)`: the line an op ran at, as the labels say it: `line 7` when the trace's
    lines are all in one file, else `In [2], line 7` (a cell) or `model.py, line 41`."""
    ops = trace.ops
    files = {op.location.filename for op in ops if op.location is not None}
    one_file = len(files) <= 1

    def where(op_index: Optional[int]) -> str:
        if op_index is None or not 0 <= op_index < len(ops) or ops[op_index].location is None:
            return ""
        loc = ops[op_index].location
        return "line %d" % loc.line if one_file else trace.place(loc.filename, loc.line)
    return where


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
            items[nid] = Item(nid, "leaf", clip(_short_name(full)), clip("AccumulateGrad " + _shape(trace, n.variable)),
                              full, pos=first_use.get(key, -1) - 0.5, problem=key in problem_keys
                              or n.variable in problem_tids, shape=_shape(trace, n.variable))
            items[nid].parent = "param:" + full if info is not None and "." in full else ""
            leaf_of[n.variable] = nid
            continue
        pos = float(n.created_by) if n.created_by is not None else first_use.get(key, -1) - 0.5
        sub = clip(" ".join(s for s in (n.name, where(n.created_by)) if s))
        shape = _node_shape(trace, key)
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
                    label = clip(_short_label(trace, tid), MAX_CHARS - 12) + _saved_state(d)
                    now = "now v%d" % d.current_version if d.current_version is not None else ""
                    sub = " ".join(s for s in ("tensor", _shape(trace, tid), now) if s)
                else:
                    label = clip(full)
                    sub = " ".join(s for s in ("tensor", _shape(trace, tid), "(no grad_fn)" if no_grad_fn else "")
                                   if s)
                items[tensor_item] = Item(tensor_item, "saved" if savers else "tensor", label, clip(sub), full,
                                          pos=float(at) if at is not None else -1.0, problem=True,
                                          shape=_shape(trace, tid))
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


def _boxes(trace: TraceData, scene: Scene, max_children: int) -> None:
    """One box per module call; items go into the box of the call that made them."""
    ops = trace.ops
    boxes = scene.boxes
    # Calls: an op whose module path shares a prefix with the previous op's is in the same calls.
    call_of_op: List[str] = [ROOT] * len(ops)
    stack: List[Tuple[str, str]] = []   # (module name, box id)
    calls = Counter()
    for op in ops:
        path = op.module
        keep = 0
        while keep < len(stack) and keep < len(path) and stack[keep][0] == path[keep]:
            keep += 1
        del stack[keep:]
        for name in path[keep:]:
            calls[name] += 1
            box_id = "m:" + name + ("#%d" % calls[name] if calls[name] > 1 else "")
            parent = stack[-1][1] if stack else ROOT
            cls = trace.modules.get(name, "")
            label = clip(name if parent == ROOT else _box_label(name))
            sub = clip(cls) + (" (call %d)" % calls[name] if calls[name] > 1 else "")
            boxes[box_id] = Box(box_id, "module", label, sub, name, parent, first=float(op.index))
            stack.append((name, box_id))
        call_of_op[op.index] = stack[-1][1] if stack else ROOT

    def call_chain(box: str) -> List[str]:
        out = []
        while box:
            out.append(box)
            box = boxes[box].parent
        return out

    for item in scene.items.values():
        hint = item.parent
        if hint.startswith("op:"):
            at = int(hint[3:])
            item.parent = call_of_op[at] if 0 <= at < len(ops) else ROOT
        elif hint.startswith("param:"):
            owner = hint[6:].rsplit(".", 1)[0]
            at = int(math.ceil(item.pos))
            item.parent = ROOT
            if 0 <= at < len(ops):
                for box in call_chain(call_of_op[at]):  # innermost first
                    name = boxes[box].name
                    if name == owner or owner.startswith(name + "."):
                        item.parent = box
                        break
        elif item.kind in ("fn", "tensor") and item.pos >= 0 and item.pos == int(item.pos) and item.pos < len(ops):
            item.parent = call_of_op[int(item.pos)]
        else:
            item.parent = ROOT
    # A saved tensor sits with the first node that saved it: edges into it then come from that
    # node's box or from boxes of later operations, as all edges between boxes do (no cycle).
    first_saver: Dict[str, str] = {}
    for u, v, kind in scene.edges:
        if kind == "saves" and v in scene.items and u in scene.items and (
                v not in first_saver or scene.items[u].pos < scene.items[first_saver[v]].pos):
            first_saver[v] = u
    for v, u in first_saver.items():
        scene.items[v].parent = scene.items[u].parent
    # A write sits beside the tensor it changed (it only points at it: no cycle can come of it).
    for u, v, kind in scene.edges:
        if kind == "overwrote" and v in scene.items:
            scene.items[u].parent = scene.items[v].parent
    # Keep only boxes that hold something; count what they hold.
    holding: Dict[str, List[str]] = defaultdict(list)
    for item in scene.items.values():
        holding[item.parent].append(item.id)
        for box in call_chain(item.parent):
            boxes[box].count += 1
    for box_id in [b for b, box in boxes.items() if box.count == 0]:
        del boxes[box_id]
    for box in boxes.values():
        holding[box.parent].append(box.id)
    for box_id, children in holding.items():
        if box_id and box_id in boxes:
            boxes[box_id].children = children
    scene.boxes = boxes
    holding[ROOT] = _line_boxes(trace, scene, holding[ROOT])
    _chunk(scene, ROOT, holding[ROOT], max_children)
    for box_id in list(boxes):
        if boxes[box_id].kind in ("module", "line"):
            _chunk(scene, box_id, boxes[box_id].children, max_children)
    for box in boxes.values():
        if box.kind == "module":
            box.sub = ", ".join(s for s in (box.sub, "%d nodes" % box.count) if s)


def _line_boxes(trace: TraceData, scene: Scene, children: List[str]) -> List[str]:
    """Runs of LINE_BOX_MIN or more consecutive nodes one line made outside any module go into a
    box named by that line. Only consecutive children (in op order) share a box, so a box still
    holds one run of operations (no cycles between boxes: see the module docstring)."""
    where = line_labeller(trace)
    ordered = sorted(children, key=lambda c: _first(scene, c))
    out: List[str] = []

    def line_of(child: str) -> Tuple[str, int]:
        item = scene.items.get(child)
        return item.where if item is not None and item.kind in ("fn", "tensor") else ("", 0)

    i = 0
    while i < len(ordered):
        j = i + 1
        key = line_of(ordered[i])
        while key[1] and j < len(ordered) and line_of(ordered[j]) == key:
            j += 1
        run = ordered[i:j]
        # (a run longer than a box may hold is a loop on one line: chunks say more about it)
        if key[1] and LINE_BOX_MIN <= len(run) <= MAX_CHILDREN and len(run) < len(ordered):
            first = scene.items[run[0]]
            source = trace.source_line(*key).strip()
            box_id = "l:%d" % int(first.pos)
            label = where(int(first.pos)) + (": " + source if source else "")
            scene.boxes[box_id] = Box(box_id, "line", clip(label), "%d nodes" % len(run), source or label, ROOT,
                                      first=first.pos, children=list(run), count=len(run),
                                      lines=(first.line, first.line))
            for c in run:
                scene.items[c].parent = box_id
            out.append(box_id)
        else:
            out.extend(run)
        i = j
    return out


def _box_label(name: str) -> str:
    """The end of a dotted module name; with the container's name when it is an index (`h.0`)."""
    parts = name.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def _first(scene: Scene, child: str) -> float:
    box = scene.boxes.get(child)
    if box is not None:
        return box.first
    item = scene.items.get(child)
    return item.pos if item is not None else scene._route_first[child]


def _chunk(scene: Scene, parent: str, children: List[str], max_children: int) -> None:
    """Too many children: split them into runs of consecutive operations, recursively."""
    if len(children) <= max_children:
        if parent:
            scene.boxes[parent].children = list(children)
        return
    ordered = sorted(children, key=lambda c: _first(scene, c))
    # At most max_children chunks, each of at least max_children things (no tiny chunks).
    n_chunks = min(max_children, int(math.ceil(len(ordered) / max_children)))
    size = int(math.ceil(len(ordered) / n_chunks))
    new_children = []
    for start in range(0, len(ordered), size):
        run = ordered[start:start + size]
        if len(run) == 1:
            new_children.extend(run)
            continue
        cid = "c:%s:%d" % (parent, start)
        count = sum(scene.boxes[c].count if c in scene.boxes else 1 for c in run)
        lines = sorted(set(_lines(scene, run)))
        kinds = Counter(scene.items[c].name.split(" ")[0] for c in run if c in scene.items
                        and scene.items[c].kind in ("fn", "tensor"))
        top = ", ".join("%s x%d" % (k, v) for k, v in kinds.most_common(2))
        label = ("lines %d-%d" % (lines[0], lines[-1]) if len(lines) > 1 else "line %d" % lines[0]) if lines else \
            "operations"
        first_op, last_op = int(_first(scene, run[0])) + 1, int(_first(scene, run[-1])) + 1
        label += ", ops %d-%d" % (max(first_op, 0), max(last_op, 0)) if last_op > first_op else ""
        scene.boxes[cid] = Box(cid, "chunk", "%s (%d nodes)" % (label, count), clip(top), label, parent,
                               first=_first(scene, run[0]), count=count,
                               lines=(lines[0], lines[-1]) if lines else (0, 0))
        for c in run:
            if c in scene.boxes:
                scene.boxes[c].parent = cid
            else:
                scene.items[c].parent = cid
        new_children.append(cid)
        _chunk(scene, cid, run, max_children)
    if parent:
        scene.boxes[parent].children = new_children
    if len(new_children) > max_children:
        _chunk(scene, parent, new_children, max_children)


def _lines(scene: Scene, run: List[str]) -> List[int]:
    out = []
    for c in run:
        if c in scene.items:
            out.append(scene.items[c].line)
        else:
            out.extend(scene.boxes[c].lines)
    return [x for x in out if x]


def children_of(scene: Scene, box: str) -> List[str]:
    if box:
        return scene.boxes[box].children
    return scene._root_children()


def _focus(trace: TraceData, scene: Scene) -> None:
    """What the first view must show (core: the first diagnosis's items), the way from there to
    the root (path), what it shows around them when there is room (focus), and the boxes open
    (those holding the problems and the nodes right above them; else the model's first level)."""
    items = scene.items
    preds: Dict[str, List[str]] = defaultdict(list)
    succs: Dict[str, List[str]] = defaultdict(list)
    if trace.diagnoses:  # (the neighbour lists cost a second on 100,000 nodes: only when needed)
        for u, v, _ in scene.edges:
            preds[v].append(u)
            succs[u].append(v)
    fed = {v for _, v, _ in scene.edges}
    roots = [i for i, x in items.items() if i not in fed and x.kind in ("fn", "tensor")]
    focus: List[str] = []
    to_open: List[str] = []
    for core in scene.problems[:3]:
        core = [c for c in core if c in items]
        if not scene.core:
            scene.core = list(core)
        focus.extend(core)
        to_open.extend(core)
        for c in core:  # a cut: what fed it and what it starved, around it
            if items[c].kind == "cut":
                around = [p for p in preds[c] + succs[c] if p in items]
                focus.extend(around)
                to_open.extend(around)
        start = next((c for c in core if c.startswith("fn")), None)
        if start is None:
            start = next((p for c in core for p in preds[c] if p.startswith("fn")), None)
        if start is None:
            continue
        # The way up to the root (the source made last: the loss, not a side result), drawn
        # through the closed boxes it crosses.
        back, queue, tops = {start: None}, deque([start]), []
        while queue:
            n = queue.popleft()
            if not preds[n]:
                tops.append(n)
            for p in preds[n]:
                if p not in back and p.startswith("fn"):
                    back[p] = n
                    queue.append(p)
        top = max(tops, key=lambda n: items[n].pos) if tops else start
        path, n = [], top
        while n is not None:
            path.append(n)
            n = back[n]
        if not scene.path:
            scene.path = path
        above = [p for p in preds[start] if p in items]
        focus.extend(above)
        to_open.extend(above)
        focus.append(top)
        # Affected leaves: the nearest parameters the broken node feeds.
        seen, queue, leaves = {start}, deque([start]), []
        while queue and len(leaves) < 4:
            for s in succs[queue.popleft()]:
                if s not in seen:
                    seen.add(s)
                    queue.append(s)
                    if items[s].kind == "leaf":
                        leaves.append(s)
        focus.extend(leaves)
    scene.focus = list(dict.fromkeys(focus))
    opened: List[str] = []
    for f in dict.fromkeys(to_open):
        opened.extend(reversed(scene.ancestors(f)))
    if not scene.focus:
        scene.focus = roots[:3]
    # A box holding most of the graph says nothing closed: open it until its parts show, as long
    # as the first view stays small enough to take in at once.
    box, shown = ROOT, len(children_of(scene, ROOT))
    total = max(1, len(items))
    while True:
        kids = [c for c in children_of(scene, box) if c in scene.boxes]
        big = [c for c in kids if scene.boxes[c].count > total / 2]
        if not big or (box != ROOT and shown + len(scene.boxes[big[0]].children) > FIRST_VIEW_ITEMS):
            break
        opened.append(big[0])
        shown += len(scene.boxes[big[0]].children)
        box = big[0]
    scene.open = list(dict.fromkeys(opened))


def _eager(scene: Scene, budget: int) -> List[str]:
    """The boxes laid out before the first screen: the open ones, then breadth first."""
    laid, used = [ROOT], len(children_of(scene, ROOT))
    for box in scene.open:
        if box not in laid:
            laid.append(box)
            used += len(scene.boxes[box].children)
    queue = deque(laid)
    while queue:
        box = queue.popleft()
        for c in children_of(scene, box):
            if c in scene.boxes and c not in laid:
                n = len(scene.boxes[c].children)
                if used + n > budget:
                    continue
                laid.append(c)
                used += n
                queue.append(c)
    return laid


def layer_box(scene: Scene, box: str, edges: Iterable[Tuple[str, str]]) -> List[List[str]]:
    """Layers of a box's children: longest path from the sources (networkx), route points for
    the edges that skip layers (scene.routes[box]), then fewer crossings."""
    kids = children_of(scene, box)
    g = nx.DiGraph()
    g.add_nodes_from(kids)
    g.add_edges_from(edges)
    if not nx.is_directed_acyclic_graph(g):  # never expected (see the module docstring); stay drawable
        cond = nx.condensation(g)
        members = cond.graph["mapping"]
        gens = list(nx.topological_generations(cond))
        layer_of = {scc: i for i, gen in enumerate(gens) for scc in gen}
        layers = [[] for _ in gens]
        for k in kids:
            layers[layer_of[members[k]]].append(k)
        g.remove_edges_from([(u, v) for u, v in list(g.edges) if layer_of[members[u]] >= layer_of[members[v]]])
    else:
        layers = [list(gen) for gen in nx.topological_generations(g)]
    # Sinks (leaves, parameters) go just under their last user, not at the bottom; sources that
    # feed one thing (a write, a cut) just above it, not at the top.
    layer_of = {k: i for i, layer in enumerate(layers) for k in layer}
    for k in kids:
        if g.out_degree(k) == 0 and g.in_degree(k) > 0:
            want = max(layer_of[p] for p in g.predecessors(k)) + 1
        elif g.in_degree(k) == 0 and g.out_degree(k) > 0 and k in scene.items and scene.items[k].kind in (
                "write", "cut"):
            want = min(layer_of[c] for c in g.successors(k)) - 1
        else:
            continue
        if want != layer_of[k]:
            layers[layer_of[k]].remove(k)
            layers[want].append(k)
            layer_of[k] = want
    routes = []
    bottom = max((i for i, layer in enumerate(layers) if layer), default=0)

    def lanes(u: str, v: str, lo: int, hi: int, first: float) -> None:
        """Route points in layers lo..hi-1 for the edge u -> v (either may be "": outside the box)."""
        if hi <= lo:
            return
        chain = [scene.new_route_point(first) for _ in range(lo, hi)]
        for at, point in zip(range(lo, hi), chain):
            layers[at].append(point)
            layer_of[point] = at
        if u and v:
            g.remove_edge(u, v)
        nx.add_path(g, ([u] if u else []) + chain + ([v] if v else []))
        routes.append((u, v, chain))
        scene.route_index[(u, v)] = chain

    for u, v in sorted(g.edges, key=lambda e: (layer_of[e[0]], _first(scene, e[0]))):
        if layer_of[v] - layer_of[u] > 1:
            lanes(u, v, layer_of[u] + 1, layer_of[v], (_first(scene, u) + _first(scene, v)) / 2)
    for u, v in sorted(scene.crossings().get(box, ()), key=lambda e: _first(scene, e[0] or e[1])):
        if u in layer_of:  # leaves the box: down to its bottom
            lanes(u, "", layer_of[u] + 1, bottom + 1, _first(scene, u) - 0.25)
        elif v in layer_of:  # enters it: from its top
            lanes("", v, 0, layer_of[v], _first(scene, v) + 0.25)
    scene.routes[box] = routes
    layers = [sorted(layer, key=lambda c: -_first(scene, c)) for layer in layers if layer]
    order = {k: i for layer in layers for i, k in enumerate(layer)}
    for _ in range(2):
        for layer in layers[1:]:
            def bary(k):
                ps = [order[p] for p in g.predecessors(k)]
                return sum(ps) / len(ps) if ps else order[k]
            layer.sort(key=bary)
            for i, k in enumerate(layer):
                order[k] = i
    return layers


# -- geometry (for the static drawings and the tests; widget.js places the same way) ------------------

@dataclass(slots=True)
class Placed:
    id: str
    x: float
    y: float
    w: float
    h: float
    is_box: bool
    open: bool = False


@dataclass
class Placement:
    """Where everything shown with some boxes open is: boxes and items (drawing order: a box
    before what it holds), route points (id -> the x of its lane and the top and bottom of its
    row), and the size of the whole."""
    placed: List[Placed]
    width: float
    height: float
    lanes: Dict[str, Tuple[float, float, float]]

    def by_id(self) -> Dict[str, Placed]:
        return {p.id: p for p in self.placed}


def text_width(label: str, sub: str = "") -> float:
    return max(MIN_W, min(MAX_W, max(len(label) * CHAR_W, len(sub) * CHAR_W * 0.9) + 20))


def rows_of(layers: List[List[str]]) -> List[List[str]]:
    """A layer wider than ROW_MAX things wraps into rows; route points do not count."""
    rows: List[List[str]] = []
    for layer in layers:
        row: List[str] = []
        count = 0
        for c in layer:
            real = not c.startswith(ROUTE)
            if real and count == ROW_MAX:
                rows.append(row)
                row, count = [], 0
            row.append(c)
            count += real
        rows.append(row)
    return rows


def place(scene: Scene, opened: Iterable[str]) -> Placement:
    """Positions of what shows with `opened` boxes open."""
    opened = set(opened)
    out: List[Placed] = []
    lanes: Dict[str, Tuple[float, float, float]] = {}
    sizes: Dict[str, Tuple[float, float]] = {}

    def size(x: str) -> Tuple[float, float]:
        if x in sizes:
            return sizes[x]
        if x.startswith(ROUTE):
            s = (ROUTE_W, 0.0)
        elif x in scene.items:
            it = scene.items[x]
            s = (text_width(it.label, it.sub), NODE_H)
        elif x in opened and x in scene.layers:
            w, h = content(x)
            b = scene.boxes[x]
            s = (max(w + 2 * PAD, text_width(b.label + "  " + b.sub)), h + HEADER_H + 2 * PAD)
        else:
            b = scene.boxes[x]
            s = (text_width(b.label + " +", b.sub), BOX_H)
        sizes[x] = s
        return s

    def content(box: str) -> Tuple[float, float]:
        width, height = 0.0, 0.0
        for r in rows_of(scene.layers.get(box, [])):
            width = max(width, sum(size(c)[0] for c in r) + GAP_X * (len(r) - 1))
            height += max(size(c)[1] for c in r) + GAP_Y
        return width, max(0.0, height - GAP_Y)

    def put(box: str, x0: float, y0: float, width: float) -> None:
        y = y0
        for r in rows_of(scene.layers.get(box, [])):
            row_w = sum(size(c)[0] for c in r) + GAP_X * (len(r) - 1)
            row_h = max(size(c)[1] for c in r)
            x = x0 + (width - row_w) / 2
            for c in r:
                w, h = size(c)
                if c.startswith(ROUTE):
                    lanes[c] = (x + w / 2, y, y + row_h)
                else:
                    is_box = c in scene.boxes
                    is_open = is_box and c in opened and c in scene.layers
                    out.append(Placed(c, x, y, w, h, is_box, is_open))
                    if is_open:
                        put(c, x + PAD, y + HEADER_H + PAD, w - 2 * PAD)
                x += w + GAP_X
            y += row_h + GAP_Y

    w, h = content(ROOT)
    put(ROOT, 0.0, 0.0, w)
    return Placement(out, w, h, lanes)


def stand_map(scene: Scene, opened: Iterable[str], shown: Iterable[str]) -> Dict[str, str]:
    """For every item and box, the thing on screen standing for it: itself, or the outermost
    closed box holding it (only those shown)."""
    opened = {b for b in opened if b in scene.layers}
    shown = set(shown)
    stand: Dict[str, str] = {}
    for thing in list(scene.items) + list(scene.boxes):
        top = None
        for box in reversed(scene.ancestors(thing)):  # outermost first
            if box not in opened:
                top = box
                break
        if top is None and thing in scene.boxes and thing not in opened:
            top = thing
        top = top or thing
        if top in shown:
            stand[thing] = top
    return stand


def edge_points(a: Placed, b: Placed, lanes: List[Tuple[float, float, float]]) -> List[Tuple[float, float]]:
    """The points an edge from `a` (above) to `b` passes: a's bottom, down each lane, b's top."""
    points = [(a.x + a.w / 2, a.y + a.h)]
    for x, top, bottom in lanes:
        points += [(x, top), (x, bottom)]
    points.append((b.x + b.w / 2, b.y))
    return points


def route_of(scene: Scene, a: str, b: str) -> List[str]:
    """The route points of the edge from the drawn thing `a` down to `b`: out of each open box
    holding `a`, between the two siblings holding them in the box holding both, into each open
    box holding `b`."""
    up_a = [a] + scene.ancestors(a)
    up_b = [b] + scene.ancestors(b)
    in_b = set(up_b)
    i = next((i for i, x in enumerate(up_a) if (scene.parent_of(x) or ROOT) in in_b or not scene.parent_of(x)), None)
    if i is None:
        return []
    sib_a = up_a[i]
    parent = scene.parent_of(sib_a) or ROOT
    j = next((j for j, y in enumerate(up_b) if (scene.parent_of(y) or ROOT) == parent), None)
    if j is None:
        return []
    chain: List[str] = []
    for x in up_a[:i]:
        chain += _route(scene, x, "")
    chain += _route(scene, sib_a, up_b[j])
    for y in reversed(up_b[:j]):
        chain += _route(scene, "", y)
    return chain


def _route(scene: Scene, u: str, v: str) -> List[str]:
    return list(scene.route_index.get((u, v), ()))


def first_view(scene: Scene, opened: Iterable[str], width: float, height: float) -> Tuple[float, float, float]:
    """Where the first view starts in a pane of `width` x `height` pixels: (x, y, zoom), the
    graph's point at the pane's top left corner. widget.js's firstView does the same.

    All of it when it fits at 100%. Else at 100% (the smallest text at 11 px): the core (the
    problem's nodes) and, as far as there is room, the path from it up to the root and the
    focus around it, centred, kept off the overview map in the bottom right corner."""
    placement = place(scene, opened)
    at = placement.by_id()
    stand = stand_map(scene, opened, at)
    cw, ch = placement.width, placement.height
    k = READABLE_ZOOM
    if cw <= width - 2 * MARGIN and ch <= height - 2 * MARGIN:
        return (cw - width / k) / 2, (ch - height / k) / 2, k

    def rect(ids: Iterable[str]):
        rs = [at[stand[i]] for i in ids if i in stand]
        if not rs:
            return None
        return [min(r.x for r in rs), min(r.y for r in rs), max(r.x + r.w for r in rs), max(r.y + r.h for r in rs)]

    def fits(r) -> bool:
        return r[2] - r[0] <= width / k - 2 * MARGIN and r[3] - r[1] <= height / k - 2 * MARGIN

    box = rect(scene.core[:1])
    if box is not None:
        for group in (scene.core[1:], list(reversed(scene.path)), scene.focus):
            for i in group:
                more = rect([i])
                if more is None:
                    continue
                grown = [min(box[0], more[0]), min(box[1], more[1]), max(box[2], more[2]), max(box[3], more[3])]
                if fits(grown):
                    box = grown
                elif group is not scene.focus:
                    break  # the path stays unbroken: what is nearer the problem comes first
    else:  # nothing wrong: the top of the graph, around the roots
        top = rect(scene.focus) or [0, 0, cw, 0]
        box = [top[0], 0, top[2], min(ch, height / k - 2 * MARGIN)]
    view_w, view_h = width / k, height / k
    x = (box[0] + box[2]) / 2 - view_w / 2
    y = (box[1] + box[3]) / 2 - view_h / 2
    if fits(box):  # no empty band beyond the graph's edges where it can be avoided
        x = min(max(x, -MARGIN), max(-MARGIN, cw + MARGIN - view_w)) if cw + 2 * MARGIN > view_w else (cw - view_w) / 2
        x = min(x, box[0] - MARGIN)
        x = max(x, box[2] + MARGIN - view_w)
        y = min(max(y, -MARGIN), max(-MARGIN, ch + MARGIN - view_h)) if ch + 2 * MARGIN > view_h else (ch - view_h) / 2
        y = min(y, box[1] - MARGIN)
        y = max(y, box[3] + MARGIN - view_h)
    else:
        y = box[1] - MARGIN
    x, y = _clear_of_minimap(box, x, y, view_w, view_h, k)
    return x, y, k


def _clear_of_minimap(box, x: float, y: float, view_w: float, view_h: float, k: float) -> Tuple[float, float]:
    """Move the view so that `box` is not under the overview map (bottom right), if it can."""
    map_x = view_w - (MINIMAP_W + MINIMAP_INSET + 4) / k
    map_y = view_h - (MINIMAP_H + MINIMAP_INSET + 4) / k
    right, bottom = box[2] - x, box[3] - y
    if right <= map_x or bottom <= map_y:
        return x, y
    if box[0] - x - (right - map_x) >= MARGIN / k:  # room on the left: slide the graph left
        return x + (right - map_x), y
    if box[1] - y - (bottom - map_y) >= MARGIN / k:  # else up
        return x, y + (bottom - map_y)
    return x, y
