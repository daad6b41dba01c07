"""The first view: where the view starts in a pane of a given size."""
from __future__ import annotations

from typing import Iterable, Tuple

from .geometry import place, stand_map
from .scene import Scene

# The first view: the smallest text is 11 px (sublabels, shapes on edges), so the view starts
# at 100% at most, never smaller (READABLE_ZOOM); MARGIN inside the pane; the overview map's
# box in the pane's bottom right corner (widget.css: .ja-minimap), which the first view keeps
# clear of what it is about.
SMALLEST_FONT, READABLE_ZOOM, MARGIN = 11, 1.0, 16
MINIMAP_W, MINIMAP_H, MINIMAP_INSET = 96, 110, 6


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
