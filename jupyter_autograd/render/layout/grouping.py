"""Grouping and layers: one box per module call, runs of one line outside modules, chunks of
large boxes, what the first view opens and lays out, and the layers of a box's children."""
from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from typing import Dict, Iterable, List, Tuple

import networkx as nx

from ...model import TraceData
from .labels import clip, line_labeller
from .scene import MAX_CHILDREN, ROOT, Box, Scene, children_of

FIRST_VIEW_ITEMS = 10    # the model's own levels open by themselves up to this many things shown
LINE_BOX_MIN = 3         # nodes one line made outside modules before they share a box


def boxes_of(trace: TraceData, scene: Scene, max_children: int) -> None:
    """One box per module call, and per call of a torch.compile region (around the modules it ran);
    items go into the box of the call that made them."""
    ops = trace.ops
    boxes = scene.boxes
    # Calls: an op whose module path shares a prefix with the previous op's is in the same calls.
    call_of_op: List[str] = [ROOT] * len(ops)
    stack: List[Tuple[str, str]] = []   # (module name, box id)
    calls = Counter()
    compiled = _compiled_paths(trace)
    for op in ops:
        path = compiled.get(op.index, op.module)
        keep = 0
        while keep < len(stack) and keep < len(path) and stack[keep][0] == path[keep]:
            keep += 1
        del stack[keep:]
        for name in path[keep:]:
            if isinstance(name, tuple):  # a compiled region's call: a box named for its function
                call = trace.compiled[name[1]]
                box_id = "c:%d" % name[1]
                parent = stack[-1][1] if stack else ROOT
                boxes[box_id] = Box(box_id, "module", clip(call.name), "torch.compile", call.name, parent,
                                    first=float(op.index))
                stack.append((name, box_id))
                continue
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


def _compiled_paths(trace: TraceData) -> Dict[int, tuple]:
    """op index -> its module path with the call of the compiled region it ran in, ("compiled", k),
    after the modules that were running at that call."""
    out: Dict[int, tuple] = {}
    for k, call in enumerate(trace.compiled):
        for index in range(call.first_op, min(call.end_op, len(trace.ops))):
            path = trace.ops[index].module
            out[index] = path[:call.depth] + (("compiled", k),) + path[call.depth:]
    return out


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
    return item.pos if item is not None else scene.route_first(child)


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


def focus_of(trace: TraceData, scene: Scene) -> None:
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


def eager(scene: Scene, budget: int) -> List[str]:
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
