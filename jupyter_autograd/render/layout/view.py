"""The first view: where the view starts in a pane of a given size. widget.js's `firstView` and
`uncut` do the same, over the same placement (tests/test_browser_view.py compares them).

All of the graph when it fits at 100%. Else at 100% (the smallest text at 11 px): the core (the
problem's nodes) and, as far as there is room, the path from it up to the root and the focus
around it, centred, kept off the overview map in the pane's bottom right corner; then moved as
little as can be so that no node is cut by the pane's edges (each is wholly in sight or wholly
out of it), the core staying inside.
"""
from __future__ import annotations

import bisect
import math
from typing import Iterable, List, Optional, Sequence, Tuple

from .geometry import Placed, place, stand_map
from .scene import Scene
from .sizes import CUT_MARGIN, MARGIN, MINIMAP_GAP, MINIMAP_H, MINIMAP_INSET, MINIMAP_W, READABLE_ZOOM


def first_view(scene: Scene, opened: Iterable[str], width: float, height: float) -> Tuple[float, float, float]:
    """Where the first view starts in a pane of `width` x `height` pixels: (x, y, zoom), the
    graph's point at the pane's top left corner."""
    opened = set(opened)
    placement = place(scene, opened)
    at = placement.by_id()
    stand = stand_map(scene, opened, at)
    cw, ch = placement.width, placement.height
    k = READABLE_ZOOM
    view_w, view_h = width / k, height / k
    if cw <= width - 2 * MARGIN and ch <= height - 2 * MARGIN:
        return (cw - view_w) / 2, (ch - view_h) / 2, k

    def rect(ids: Iterable[str]):
        rs = [at[stand[i]] for i in ids if i in stand]
        if not rs:
            return None
        return [min(r.x for r in rs), min(r.y for r in rs), max(r.x + r.w for r in rs), max(r.y + r.h for r in rs)]

    def fits(r) -> bool:
        return r[2] - r[0] <= view_w - 2 * MARGIN and r[3] - r[1] <= view_h - 2 * MARGIN

    core = rect(scene.core[:1])
    box = core
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
        box = [top[0], 0, top[2], min(ch, view_h - 2 * MARGIN)]
    x = (box[0] + box[2]) / 2 - view_w / 2
    y = (box[1] + box[3]) / 2 - view_h / 2
    if fits(box):  # no empty band beyond the graph's edges where it can be avoided
        x = min(max(x, -MARGIN), max(-MARGIN, cw + MARGIN - view_w)) if cw + 2 * MARGIN > view_w else (cw - view_w) / 2
        x = min(x, box[0] - MARGIN)
        x = max(x, box[2] + MARGIN - view_w)
        y = min(max(y, -MARGIN), max(-MARGIN, ch + MARGIN - view_h)) if ch + 2 * MARGIN > view_h else (ch - view_h) / 2
        y = min(y, box[1] - MARGIN)
        y = max(y, box[3] + MARGIN - view_h)
        keep = box
    else:
        y = box[1] - MARGIN
        keep = core or box
    x, y, off_map = _clear_of_minimap(box, x, y, view_w, view_h, k)
    x, y = uncut(placement.placed, keep, x, y, view_w, view_h, off_map)
    return x, y, k


def _clear_of_minimap(box, x: float, y: float, view_w: float, view_h: float, k: float):
    """Move the view so that `box` is not under the overview map (bottom right), if it can.
    Returns x, y and what keeps it clear: ("x", least x) or ("y", least y), or None."""
    map_x = view_w - (MINIMAP_W + MINIMAP_INSET + MINIMAP_GAP) / k
    map_y = view_h - (MINIMAP_H + MINIMAP_INSET + MINIMAP_GAP) / k
    right, bottom = box[2] - x, box[3] - y
    if right <= map_x:
        return x, y, ("x", box[2] - map_x)
    if bottom <= map_y:
        return x, y, ("y", box[3] - map_y)
    if box[0] - x - (right - map_x) >= MARGIN / k:  # room on the left: slide the graph left
        return x + (right - map_x), y, ("x", box[2] - map_x)
    if box[1] - y - (bottom - map_y) >= MARGIN / k:  # else up
        return x, y + (bottom - map_y), ("y", box[3] - map_y)
    return x, y, None


def uncut(placed: Sequence[Placed], keep: Sequence[float], x: float, y: float, view_w: float, view_h: float,
          least: Optional[Tuple[str, float]] = None) -> Tuple[float, float]:
    """The view nearest (x, y) with no node or closed box cut by its edges, `keep` (a rect) inside
    it with MARGIN where it fits, and x or y not below `least` (what keeps `keep` off the overview
    map); see `snap` for where no such view is."""
    solid = [p for p in placed if not p.open]
    floor_x = least[1] if least is not None and least[0] == "x" else -math.inf
    floor_y = least[1] if least is not None and least[0] == "y" else -math.inf
    for axis in "xyx":
        if axis == "x":
            spans = [(p.x, p.x + p.w) for p in solid if p.y < y + view_h and y < p.y + p.h]
            x = snap(x, keep[2] + MARGIN - view_w, keep[0] - MARGIN, view_w, spans, floor_x)
        else:
            spans = [(p.y, p.y + p.h) for p in solid if p.x < x + view_w and x < p.x + p.w]
            y = snap(y, keep[3] + MARGIN - view_h, keep[1] - MARGIN, view_h, spans, floor_y)
    return x, y


def snap(want: float, lo: float, hi: float, size: float, spans: List[Tuple[float, float]],
         floor: float = -math.inf) -> float:
    """Where a window of `size` starts along one axis: the point nearest `want`, within [lo, hi]
    (what it must hold, with MARGIN), not below `floor`, at which neither of its edges falls inside
    a span or CUT_MARGIN from it. Where there is none: the same within MARGIN more room (what it
    must hold, without the margin); else, there, the point that cuts the fewest spans."""
    cuts = [(a - CUT_MARGIN, b + CUT_MARGIN) for a, b in spans]
    cuts += [(a - size, b - size) for a, b in cuts]
    starts, ends = sorted(a for a, _ in cuts), sorted(b for _, b in cuts)

    def cut(c: float) -> int:  # how many (a, b) hold c: those starting before it less those ended by it
        return bisect.bisect_left(starts, c) - bisect.bisect_right(ends, c)

    def candidates(lo: float, hi: float) -> List[float]:
        lo = max(lo, floor)
        if lo > hi:
            lo = hi = max(want, floor)
        start = min(max(want, lo), hi)
        out = {start, lo, hi} | {p for a, b in cuts for p in (a, b) if lo <= p <= hi}
        return sorted(out, key=lambda c: (abs(c - want), c))

    for room in (0.0, MARGIN):
        for c in candidates(lo - room, hi + room):
            if not cut(c):
                return c
    return min(candidates(lo - MARGIN, hi + MARGIN), key=lambda c: (cut(c), abs(c - want), c))
