"""The scene: what the view draws, as plain data (items, module boxes, edges, the layers of each
box laid out, the route points of long edges), and what the front end receives (`Scene.to_json`)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from .sizes import ROW_MAX, edge_label_width, front_end

MAX_CHILDREN = 40        # children of one box before its contents are chunked
EAGER_ITEMS = 3000       # items laid out before the first screen; deeper boxes on request
ROOT = ""                # the id of the outermost box (the cell itself)
FOLD = "fold"            # the item standing for the iterations not shown
ROUTE = "~"              # the prefix of route points' ids


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
    w: float = 0.0         # its size (sizes.node_size)
    h: float = 0.0


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
    badge: bool = False    # a module with gradient-health data: its bar is drawn on the box
    w: float = 0.0         # its size closed, and the width of its title open (sizes.box_sizes)
    h: float = 0.0
    title_w: float = 0.0


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
    badges: Set[str] = field(default_factory=set)  # the modules whose boxes carry a gradient-health bar
    _lifted: Optional[Dict[str, Set[Tuple[str, str]]]] = None
    _crossing: Optional[Dict[str, Set[Tuple[str, str]]]] = None
    _route_first: Dict[str, float] = field(default_factory=dict)  # route point -> its place in op order

    def new_route_point(self, first: float) -> str:
        point = "%s%d" % (ROUTE, len(self._route_first))
        self._route_first[point] = first
        return point

    def route_first(self, point: str) -> float:
        """The place in op order of a route point (it sorts among the children it runs between)."""
        return self._route_first[point]

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
        """Plain lists for the synced trait (small: short keys, one list per thing).

        The geometry comes with them (sizes.py): each item's width and height, each box's size
        closed, its title's width open and whether it has a gradient-health bar, the rows of each
        box laid out (its layers wrapped), the width of the shape written on each edge, and the
        numbers the front end places and draws with (`geometry`)."""
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
            shape = self.items[v].shape if v in self.items else ""
            edges.append([a, b, kind, shape, edge_label_width(shape)])
        return {
            "items": [[x.id, x.kind, x.label, x.sub, x.parent, x.name, int(x.problem), x.w, x.h] for x in sent_items],
            "boxes": [[b.id, b.kind, b.label, b.sub, b.parent, b.name, b.count, int(b.id in laid), b.w, b.h, b.title_w,
                       int(b.badge)] for b in sent_boxes],
            "rows": {b: rows_of(self.layers[b]) for b in laid if b in self.layers},
            "routes": {b: self.routes[b] for b in laid if self.routes.get(b)},
            "edges": edges,
            "open": [b for b in self.open if b in laid],
            "core": list(self.core), "focus": list(self.focus), "path": list(self.path), "note": self.note,
            "names": [[name, target] for name, target in self.names.items()],
            "problems": [list(p) for p in self.problems],
            "geometry": front_end(),
        }

    def _deepest_sent(self, x: str, sent: Set[str]) -> Optional[str]:
        while x not in sent:
            x = self.parent_of(x)
            if not x:
                return None
        return x


def write_id(op_index: int) -> str:
    return "op%d" % op_index


def children_of(scene: Scene, box: str) -> List[str]:
    if box:
        return scene.boxes[box].children
    return scene._root_children()


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
