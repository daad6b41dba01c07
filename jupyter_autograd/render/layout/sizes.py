"""The one geometry of the view: how big each thing drawn is, computed here once and sent with the
scene (widget.js reads these numbers and has no sizing rules of its own; draw.py draws with them).

Text is measured with DejaVu Sans's advance widths (regular and bold, read from its font files):
the widest of the usual sans fonts, and what Debian's Chromium, JupyterLab on Linux and matplotlib
draw with, so a label fits its box in any of them. A character outside ASCII counts as a wide one
(an em for East Asian wide characters).

What a thing's size holds:
- a node: its label (12 px, bold but for grad_fn nodes) over its sublabel (11 px), TEXT_PAD on
  each side, at least MIN_W wide, NODE_H tall;
- a closed box: "+ label" (12 px bold) over its sublabel (11 px), BOX_H tall; a module with
  gradient-health data has its bar (BADGE_ZONE) at the right of the label's line;
- an open box: its title bar ("- label  sub", HEADER_H tall, the bar at its right end) over its
  contents, PAD around them: as wide as the wider of the two (`title_w` is the title's width).
"""
from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Dict, Tuple

# DejaVu Sans advance widths of ASCII 32..126, in font units (2048 to the em).
_REGULAR = (
    651, 821, 942, 1716, 1303, 1946, 1597, 563, 799, 799, 1024, 1716, 651, 739, 651, 690, 1303, 1303, 1303, 1303,
    1303, 1303, 1303, 1303, 1303, 1303, 690, 690, 1716, 1716, 1716, 1087, 2048, 1401, 1405, 1430, 1577, 1294, 1178,
    1587, 1540, 604, 604, 1343, 1141, 1767, 1532, 1612, 1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251,
    1403, 799, 690, 799, 1716, 1024, 1024, 1255, 1300, 1126, 1300, 1260, 721, 1300, 1298, 569, 569, 1186, 569, 1995,
    1298, 1253, 1300, 1300, 842, 1067, 803, 1298, 1212, 1675, 1212, 1212, 1075, 1303, 690, 1303, 1716)
_BOLD = (
    713, 934, 1067, 1716, 1425, 2052, 1786, 627, 936, 936, 1071, 1716, 778, 850, 778, 748, 1425, 1425, 1425, 1425,
    1425, 1425, 1425, 1425, 1425, 1425, 819, 819, 1716, 1716, 1716, 1188, 2048, 1585, 1561, 1503, 1700, 1399, 1399,
    1681, 1714, 762, 762, 1587, 1305, 2038, 1714, 1741, 1501, 1741, 1577, 1475, 1397, 1663, 1585, 2259, 1579, 1483,
    1485, 936, 748, 936, 1716, 1024, 1024, 1382, 1466, 1214, 1466, 1389, 891, 1466, 1458, 702, 702, 1362, 702, 2134,
    1458, 1407, 1466, 1466, 1010, 1219, 979, 1458, 1335, 1892, 1321, 1335, 1192, 1458, 748, 1458, 1716)
_EM = 2048
_OTHER = 1716            # a character outside ASCII (the font's arrows, minus sign, multiplication sign)

LABEL_FONT, SUB_FONT, EDGE_FONT = 12, 11, 11   # px: a label, a sublabel, a shape on an edge
NODE_H, BOX_H, HEADER_H, PAD = 36, 40, 22, 10  # a node's and a closed box's height, an open box's title and padding
GAP_X, GAP_Y, ROW_MAX = 16, 30, 8              # between things in a row, between rows; things in a row at most
ROUTE_W = 8                                    # the width a route point takes in its row
MIN_W, TEXT_PAD, TEXT_X = 64, 10, 8            # a node's least width; around a node's text; a box's text inset
# Where text sits, from the top of its thing: a node's label and sublabel, a closed box's, a title's.
LABEL_Y, SUB_Y, BOX_LABEL_Y, BOX_SUB_Y, TITLE_Y = 15, 29, 18, 33, 16
# The gradient-health bar of a module box: the room it takes at the right of the label's line (the
# "!" of a flagged module, the bar, the margin), the bar's size and its place from the box's
# top-right corner.
BADGE_ZONE, BADGE_BAR_W, BADGE_BAR_H, BADGE_RIGHT, BADGE_TOP = 44, 26, 8, 6, 6
EDGE_LABEL_PAD, EDGE_LABEL_H = 6, 14           # a shape on an edge: room around its text, its height

# The view: the smallest text is 11 px (sublabels, shapes on edges), so the first view starts at
# 100% (READABLE_ZOOM); MARGIN inside the pane. Fit goes down to FIT_MIN_ZOOM to show the whole
# graph (a map of it, labels at 6 px), FIT_MAX_ZOOM to show a small one; below TEXT_ZOOM text is
# not drawn at all. The overview map sits in a corner of the pane (MINIMAP_INSET from its edges;
# the first view keeps what it is about MINIMAP_GAP away from it).
SMALLEST_FONT, READABLE_ZOOM, MARGIN = 11, 1.0, 16
FIT_MIN_ZOOM, FIT_MAX_ZOOM, TEXT_ZOOM, MIN_ZOOM, MAX_ZOOM = 0.5, 2.0, 0.45, 0.05, 4.0
MINIMAP_W, MINIMAP_H, MINIMAP_INSET, MINIMAP_GAP = 96, 110, 6, 4
CUT_MARGIN = 3  # a pane's edge passes this far clear of a node's box, so that its outline is not cut either


@lru_cache(maxsize=65536)
def text_px(text: str, size: float = LABEL_FONT, bold: bool = False) -> float:
    """The width of `text` drawn at `size` px, in px."""
    table = _BOLD if bold else _REGULAR
    units = 0
    for c in text:
        o = ord(c)
        if 32 <= o < 127:
            units += table[o - 32]
        else:
            units += _EM if unicodedata.east_asian_width(c) in "WF" else _OTHER
    return units * size / _EM


def _up(px: float) -> float:
    """Whole pixels, rounded up: sizes are integers, so that Python and JavaScript add them alike."""
    return float(-int(-px // 1))


def node_size(kind: str, label: str, sub: str) -> Tuple[float, float]:
    text = max(text_px(label, LABEL_FONT, bold=kind != "fn"), text_px(sub, SUB_FONT))
    return max(MIN_W, _up(text + 2 * TEXT_PAD)), NODE_H


def box_sizes(label: str, sub: str, badge: bool) -> Tuple[float, float, float]:
    """(width, height) of a closed box and the width of its title when it is open."""
    right = BADGE_ZONE if badge else TEXT_PAD
    closed = max(TEXT_X + text_px("+ " + label, LABEL_FONT, bold=True) + right, TEXT_X + text_px(sub, SUB_FONT) + TEXT_PAD)
    title = TEXT_X + text_px("\u2212 " + label, LABEL_FONT, bold=True) + text_px("  " + sub, SUB_FONT) + right
    return max(MIN_W, _up(closed)), BOX_H, max(MIN_W, _up(title))


def edge_label_width(shape: str) -> float:
    return _up(text_px(shape, EDGE_FONT) + EDGE_LABEL_PAD) if shape else 0.0


def size_all(items, boxes, badges=()) -> None:
    """Give every item and box of a scene its size; a module named in `badges` (the modules with
    gradient-health data) gets room for its bar."""
    badges = set(badges)
    for x in items:
        x.w, x.h = node_size(x.kind, x.label, x.sub)
    for b in boxes:
        b.badge = b.kind == "module" and b.name in badges
        b.w, b.h, b.title_w = box_sizes(b.label, b.sub, b.badge)


def front_end() -> Dict[str, object]:
    """The numbers widget.js draws with, sent with the scene (it has no copy of them)."""
    return {
        "header_h": HEADER_H, "pad": PAD, "gap_x": GAP_X, "gap_y": GAP_Y, "route_w": ROUTE_W, "text_x": TEXT_X,
        "label_y": LABEL_Y, "sub_y": SUB_Y, "box_label_y": BOX_LABEL_Y, "box_sub_y": BOX_SUB_Y, "title_y": TITLE_Y,
        "badge": [BADGE_ZONE, BADGE_BAR_W, BADGE_BAR_H, BADGE_RIGHT, BADGE_TOP],
        "edge_label_h": EDGE_LABEL_H, "margin": MARGIN, "readable_zoom": READABLE_ZOOM,
        "fit_min_zoom": FIT_MIN_ZOOM, "fit_max_zoom": FIT_MAX_ZOOM, "text_zoom": TEXT_ZOOM, "min_zoom": MIN_ZOOM,
        "max_zoom": MAX_ZOOM, "minimap": [MINIMAP_W, MINIMAP_H, MINIMAP_INSET, MINIMAP_GAP], "cut_margin": CUT_MARGIN,
    }
