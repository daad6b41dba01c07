"""Placement: where everything shown goes with some boxes open, from the sizes the scene carries
(sizes.py). widget.js's `place` is this function written in JavaScript, over the same sizes and
rows (tests/test_browser_view.py compares what it draws with what this places).

A box's children go in rows (its layers, wrapped at ROW_MAX), each row centred in the box, GAP_X
between things and GAP_Y between rows; a row is as tall as its tallest thing. A closed box or an
item has the size the scene gives it; an open box is its title bar (HEADER_H) over its contents
with PAD around them, and as wide as the wider of its contents and its title."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple

from .scene import ROOT, ROUTE, Scene, rows_of
from .sizes import GAP_X, GAP_Y, HEADER_H, PAD, ROUTE_W


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


def place(scene: Scene, opened: Iterable[str]) -> Placement:
    """Positions of what shows with `opened` boxes open."""
    opened = set(opened)
    out: List[Placed] = []
    lanes: Dict[str, Tuple[float, float, float]] = {}
    sizes: Dict[str, Tuple[float, float]] = {}
    rows: Dict[str, List[List[str]]] = {}

    def rows_in(box: str) -> List[List[str]]:
        if box not in rows:
            rows[box] = rows_of(scene.layers.get(box, []))
        return rows[box]

    def size(x: str) -> Tuple[float, float]:
        if x in sizes:
            return sizes[x]
        if x.startswith(ROUTE):
            s = (ROUTE_W, 0.0)
        elif x in scene.items:
            it = scene.items[x]
            s = (it.w, it.h)
        elif x in opened and x in scene.layers:
            w, h = content(x)
            s = (max(w + 2 * PAD, scene.boxes[x].title_w), h + HEADER_H + 2 * PAD)
        else:
            b = scene.boxes[x]
            s = (b.w, b.h)
        sizes[x] = s
        return s

    def content(box: str) -> Tuple[float, float]:
        width, height = 0.0, 0.0
        for r in rows_in(box):
            width = max(width, sum(size(c)[0] for c in r) + GAP_X * (len(r) - 1))
            height += max(size(c)[1] for c in r) + GAP_Y
        return width, max(0.0, height - GAP_Y)

    def put(box: str, x0: float, y0: float, width: float) -> None:
        y = y0
        for r in rows_in(box):
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
