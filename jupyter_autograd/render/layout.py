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
- edges: from a node to what it needs in backward, between the deepest drawn things.

Why boxes never make cycles: backward edges run from a node to nodes made by earlier
operations, and every box (a module call, a chunk) holds one run of consecutive operations,
so between two boxes edges only run one way. Leaves and tensors are sinks and writes are
sources, so where they sit cannot close a cycle either.

Why one iteration: a training loop's graph repeats; the view shows the iteration with the
problem (or the last one) and folds the others into one box, so it does not grow with the
number of steps.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

import networkx as nx

from ..diagnose.paths import is_cut, node_at
from ..model import Trace

MAX_CHILDREN = 40        # children of one box before its contents are chunked
FIRST_VIEW_ITEMS = 10    # the model's own levels open by themselves up to this many things shown
EAGER_ITEMS = 3000       # items laid out before the first screen; deeper boxes on request
ROOT = ""                # the id of the outermost box (the cell itself)
FOLD = "fold"            # the item standing for the iterations not shown

# Geometry shared by the static drawings (draw.py); widget.js uses the same numbers.
NODE_H, BOX_H, HEADER_H, PAD = 36, 40, 22, 10
GAP_X, GAP_Y, ROW_GAP, ROW_MAX = 16, 30, 12, 8
CHAR_W, MIN_W, MAX_W, MAX_CHARS = 7.0, 64, 250, 34


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


@dataclass(slots=True)
class Box:
    id: str
    kind: str              # module or chunk
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
    open: List[str] = field(default_factory=list)    # boxes open in the first view
    focus: List[str] = field(default_factory=list)   # what the first view centres on
    path: List[str] = field(default_factory=list)    # root ... problem node, to highlight
    note: str = ""
    total_nodes: int = 0   # grad_fn nodes in the whole trace
    shown_nodes: int = 0   # of them, in the iteration drawn
    _lifted: Optional[Dict[str, Set[Tuple[str, str]]]] = None

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
        if self._lifted is not None:
            return self._lifted
        depth: Dict[str, int] = {ROOT: 0}

        def depth_of(x: str) -> int:
            d = depth.get(x)
            if d is None:
                d = depth[x] = depth_of(self.parent_of(x)) + 1
            return d

        out: Dict[str, Set[Tuple[str, str]]] = defaultdict(set)
        for u, v, _ in self.edges:
            pu, pv = self.parent_of(u), self.parent_of(v)
            if pu == pv:  # the common case: two things in one box
                out[pu].add((u, v))
                continue
            du, dv = depth_of(u), depth_of(v)
            while du > dv:
                u, pu, du = pu, self.parent_of(pu), du - 1
            while dv > du:
                v, pv, dv = pv, self.parent_of(pv), dv - 1
            while pu != pv:
                u, pu = pu, self.parent_of(pu)
                v, pv = pv, self.parent_of(pv)
            if u != v:
                out[pu].add((u, v))
        self._lifted = out
        return out

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
            edges.append([a, b, kind])
        return {
            "items": [[x.id, x.kind, x.label, x.sub, x.parent, x.name, int(x.problem)] for x in sent_items],
            "boxes": [[b.id, b.kind, b.label, b.sub, b.parent, b.name, b.count, int(b.id in laid)]
                      for b in sent_boxes],
            "layers": {b: self.layers[b] for b in laid if b in self.layers},
            "edges": edges,
            "open": [b for b in self.open if b in laid],
            "focus": list(self.focus), "path": list(self.path), "note": self.note,
        }

    def _deepest_sent(self, x: str, sent: Set[str]) -> Optional[str]:
        while x not in sent:
            x = self.parent_of(x)
            if not x:
                return None
        return x


# -- building the scene ------------------------------------------------------------------------------

def main_file(trace: Trace) -> str:
    """The user's file (the cell): where a diagnosis points, else where code outside modules ran."""
    for d in trace.diagnoses:
        if d.filename:
            return d.filename
    files = Counter(op.location.filename for op in trace.ops if op.location and not op.module)
    files = files or Counter(op.location.filename for op in trace.ops if op.location)
    return files.most_common(1)[0][0] if files else ""


def write_id(op_index: int) -> str:
    return "op%d" % op_index


def build_scene(trace: Trace, max_children: int = MAX_CHILDREN, eager_items: int = EAGER_ITEMS) -> Scene:
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


def _iteration(trace: Trace):
    """The grad_fn nodes of the iteration to draw: the one a diagnosis points at, else the last.

    Iterations are the runs of operations between backward calls. Returns the node keys,
    the run's first and last op index, and how many nodes of other iterations were left out.
    """
    backward = [op.index for op in trace.ops if op.is_backward]
    nodes = trace.nodes
    if not backward:
        return set(nodes), -1, len(trace.ops), 0

    def run_of(op_index: int) -> int:
        lo, hi = 0, len(backward)
        while lo < hi:  # the number of backward calls before op_index
            mid = (lo + hi) // 2
            if backward[mid] < op_index:
                lo = mid + 1
            else:
                hi = mid
        return lo

    per_run = Counter(run_of(n.created_by) for n in nodes.values() if n.created_by is not None)
    if len(per_run) <= 1:
        return set(nodes), -1, len(trace.ops), 0
    chosen = None
    for d in trace.diagnoses:
        at = d.op_index
        if at is None and d.node_key in nodes:
            at = nodes[d.node_key].created_by
        if at is not None:
            chosen = run_of(at)
            break
    if chosen is None or chosen not in per_run:
        chosen = max(per_run)
    lo = backward[chosen - 1] + 1 if chosen > 0 else 0
    hi = backward[chosen] if chosen < len(backward) else len(trace.ops)
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


def _shape(trace: Trace, tid: Optional[int]) -> str:
    info = trace.tensors.get(tid) if tid is not None else None
    if info is None:
        return ""
    return "[%s]" % ", ".join(str(s) for s in info.shape) if info.shape else "scalar"


def _items(trace: Trace, scene: Scene, keys: Set[int], lo: int, folded: int) -> None:
    nodes, ops, items = trace.nodes, trace.ops, scene.items
    here = main_file(trace)
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

    def where(op_index: Optional[int]) -> str:
        if op_index is None or not 0 <= op_index < len(ops) or ops[op_index].location is None:
            return ""
        loc = ops[op_index].location
        if loc.filename == here:
            return "line %d" % loc.line
        return "%s:%d" % (loc.filename.replace("\\", "/").rsplit("/", 1)[-1], loc.line)

    leaf_of: Dict[int, str] = {}
    for key in keys:
        n = nodes[key]
        nid = "fn%d" % key
        if n.variable is not None:
            info = trace.tensors.get(n.variable)
            full = trace.tensor_label(n.variable)
            items[nid] = Item(nid, "leaf", clip(_short_name(full)), clip("AccumulateGrad " + _shape(trace, n.variable)),
                              full, pos=first_use.get(key, -1) - 0.5, problem=key in problem_keys
                              or n.variable in problem_tids)
            items[nid].parent = "param:" + full if info is not None and "." in full else ""
            leaf_of[n.variable] = nid
            continue
        pos = float(n.created_by) if n.created_by is not None else first_use.get(key, -1) - 0.5
        sub = clip(" ".join(s for s in (n.name, where(n.created_by)) if s))
        if key in named:
            items[nid] = Item(nid, "tensor", clip(named[key]), sub, named[key], pos=pos, problem=key in problem_keys)
        else:
            items[nid] = Item(nid, "fn", clip(n.name), clip(where(n.created_by)), n.name, pos=pos,
                              problem=key in problem_keys)
        op = ops[n.created_by] if n.created_by is not None and 0 <= n.created_by < len(ops) else None
        if op is not None and op.location is not None and op.location.filename == here:
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
        targets = []
        for tid in d.tids:
            if tid in leaf_of:
                targets.append(leaf_of[tid])
                continue
            tensor_item = "t%d" % tid
            savers = ["fn%d" % n.key for n in (nodes[k] for k in keys) for s in n.saved if s.tid == tid]
            if tensor_item not in items:
                info = trace.tensors.get(tid)
                full = trace.tensor_label(tid)
                at = info.created_by if info is not None and info.created_by is not None else None
                if at is None:  # made before the block: it sits where it is first used
                    at = next((op.index for op in ops if tid in op.inputs), None)
                no_grad_fn = d.kind == "graph-cut" and info is not None and info.node is None
                items[tensor_item] = Item(tensor_item, "saved" if savers else "tensor", clip(full),
                                          clip(" ".join(s for s in ("saved" if savers else "tensor",
                                                                     _shape(trace, tid),
                                                                     "(no grad_fn)" if no_grad_fn else "") if s)),
                                          full, pos=float(at) if at is not None else -1.0, problem=True)
                if "." in full:
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
                items[wid].parent = "op:%d" % d.op_index
                if cut:
                    _cut_edges(trace, scene, op, wid, targets)
                elif targets:
                    scene.edges.append((wid, targets[0], "overwrote"))


def _cut_here(trace: Trace, d, op) -> bool:
    """The diagnosis names the op where the chain to the parameters was cut (graph-cut, or a
    parameter starved by a cut), not the backward call or a move."""
    if op.is_backward:
        return False
    return d.kind == "graph-cut" or (d.kind == "missing-grad" and is_cut(trace, op))


def _cut_edges(trace: Trace, scene: Scene, op, cut_id: str, targets: List[str]) -> None:
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


def _boxes(trace: Trace, scene: Scene, max_children: int) -> None:
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
    _chunk(scene, ROOT, holding[ROOT], max_children)
    for box_id in list(boxes):
        if boxes[box_id].kind == "module":
            _chunk(scene, box_id, boxes[box_id].children, max_children)
    for box in boxes.values():
        if box.kind == "module":
            box.sub = ", ".join(s for s in (box.sub, "%d nodes" % box.count) if s)


def _box_label(name: str) -> str:
    """The end of a dotted module name; with the container's name when it is an index (`h.0`)."""
    parts = name.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def _first(scene: Scene, child: str) -> float:
    box = scene.boxes.get(child)
    return box.first if box is not None else scene.items[child].pos


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


def _focus(trace: Trace, scene: Scene) -> None:
    """Open what the problem is about, with the way to the root; else the model's first level."""
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
    for d in trace.diagnoses[:3]:
        core = ["t%d" % t for t in d.tids] + (["fn%d" % d.node_key] if d.node_key is not None else [])
        core += [write_id(d.op_index)] if d.op_index is not None else []
        core = [c for c in core if c in items]
        core += [i for i, x in items.items() if x.kind == "leaf" and x.problem and i not in core][:4]
        focus.extend(core)
        for c in core:  # a cut: what fed it and what it starved, around it
            if items[c].kind == "cut":
                focus.extend(p for p in preds[c] + succs[c] if p in items)
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
        focus.append(top)
        focus.extend(p for p in preds[start] if p in items)
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
    for f in scene.focus:
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
    """Layers of a box's children: longest path from the sources (networkx), then fewer crossings."""
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
    else:
        layers = [list(gen) for gen in nx.topological_generations(g)]
    # Sinks (leaves, parameters) go just under their first user, not at the bottom.
    layer_of = {k: i for i, layer in enumerate(layers) for k in layer}
    for k in kids:
        if g.out_degree(k) == 0 and g.in_degree(k) > 0:
            want = max(layer_of[p] for p in g.predecessors(k)) + 1
            if want != layer_of[k]:
                layers[layer_of[k]].remove(k)
                layers[want].append(k)
                layer_of[k] = want
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


# -- geometry (for the static drawings; widget.js places the same way) --------------------------------

@dataclass(slots=True)
class Placed:
    id: str
    x: float
    y: float
    w: float
    h: float
    is_box: bool
    open: bool = False


def text_width(label: str, sub: str = "") -> float:
    return max(MIN_W, min(MAX_W, max(len(label) * CHAR_W, len(sub) * CHAR_W * 0.9) + 20))


def place(scene: Scene, opened: Iterable[str]) -> Tuple[List[Placed], float, float]:
    """Positions of what shows with `opened` boxes open: a list of boxes and items, width, height."""
    opened = set(opened)
    out: List[Placed] = []
    sizes: Dict[str, Tuple[float, float]] = {}

    def size(x: str) -> Tuple[float, float]:
        if x in sizes:
            return sizes[x]
        if x in scene.items:
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

    def rows(box: str) -> List[List[str]]:
        out_rows = []
        for layer in scene.layers.get(box, []):
            for i in range(0, len(layer), ROW_MAX):
                out_rows.append(layer[i:i + ROW_MAX])
        return out_rows

    def content(box: str) -> Tuple[float, float]:
        width, height = 0.0, 0.0
        for r in rows(box):
            width = max(width, sum(size(c)[0] for c in r) + GAP_X * (len(r) - 1))
            height += max(size(c)[1] for c in r) + GAP_Y
        return width, max(0.0, height - GAP_Y)

    def put(box: str, x0: float, y0: float, width: float) -> None:
        y = y0
        for r in rows(box):
            row_w = sum(size(c)[0] for c in r) + GAP_X * (len(r) - 1)
            row_h = max(size(c)[1] for c in r)
            x = x0 + (width - row_w) / 2
            for c in r:
                w, h = size(c)
                is_box = c in scene.boxes
                is_open = is_box and c in opened and c in scene.layers
                out.append(Placed(c, x, y, w, h, is_box, is_open))
                if is_open:
                    put(c, x + PAD, y + HEADER_H + PAD, w - 2 * PAD)
                x += w + GAP_X
            y += row_h + GAP_Y

    w, h = content(ROOT)
    put(ROOT, 0.0, 0.0, w)
    return out, w, h
