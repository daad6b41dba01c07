"""Static pictures of a scene's first view: an SVG string (for text/html) and a PNG (matplotlib).

Both draw what `layout.place` positions, so they show what the widget shows when it opens.

Legend (shape and colour; LEGEND below, drawn under the picture and by widget.js):
    grey box             grad_fn node (a backward operation)
    green box            the grad_fn of a named result (`loss`, `out`)
    blue rounded box     leaf that gets .grad (AccumulateGrad, named by its parameter)
    orange box           a tensor a diagnosis talks about (saved for backward)
    red box              the line that broke backward (the write)
    red dashed box       the line that cut the chain to the parameters (detach, no_grad, .item())
    dashed box           a module call, or what one line made (open: its contents; closed: click to open)
    red outline          involved in a diagnosis
    red dashed edge      a written tensor, or the link a cut broke (no gradient flows back along it)
    red edge             the way from the problem up to the loss
    [2, 16, 64] on edge  the shape of the tensor whose gradient flows along it

Every string from the trace is escaped here (SVG) or drawn as typed (matplotlib, no mathtext), clipped
and with what is not printable written out (layout.clip).
"""
from __future__ import annotations

import html
import io
import warnings
from typing import Dict, List, Optional, Tuple

from .layout import ROOT, Placed, Scene, clip, edge_points, place, route_of, stand_map
from .layout.sizes import BOX_LABEL_Y, BOX_SUB_Y, LABEL_FONT, LABEL_Y, SUB_FONT, SUB_Y, TEXT_X, TITLE_Y, text_px

# Colours: the light theme's, used where no JupyterLab CSS variable applies (PNG, GitHub).
STYLE = {
    "fn": ("#f1f3f5", "#868e96"),
    "tensor": ("#d3f9d8", "#2b8a3e"),
    "leaf": ("#d0e4ff", "#1c5fb8"),
    "saved": ("#ffe0b2", "#d9480f"),
    "write": ("#ffc9c9", "#c92a2a"),
    "cut": ("#ffc9c9", "#c92a2a"),
    "fold": ("#ffffff", "#868e96"),
    "box": ("#f8f9fa", "#adb5bd"),
}
PROBLEM = "#e03131"
TEXT, SUBTEXT = "#212529", "#495057"
TITLE_CHARS = 120  # per line of the title; the scene's labels are clipped where they are made
TITLE_LINE_H, TITLE_CHAR_W = 20, 7.6  # bold 12 px DejaVu Sans
# In HTML the theme's variables win where they exist (JupyterLab, Notebook 7, light or dark).
CSS_VAR = {"fn": "--jp-layout-color2", "box": "--jp-layout-color1", "fold": "--jp-layout-color0"}
# What each colour and line means, for the kinds a scene holds: (kind, label).
LEGEND = [("tensor", "named result"), ("fn", "backward op"), ("leaf", "parameter (gets .grad)"),
          ("saved", "tensor saved for backward"), ("write", "the line that broke it"),
          ("cut", "the line that cut the chain"), ("fold", "other iterations"), ("box", "module / line: click to open"),
          ("path", "way to the loss"), ("shape", "shape of the gradient")]


def legend(scene: Scene) -> List[Tuple[str, str]]:
    """The entries of LEGEND that this scene draws."""
    kinds = {x.kind for x in scene.items.values()}
    if scene.boxes:
        kinds.add("box")
    if scene.path:
        kinds.add("path")
    if any(x.shape for x in scene.items.values()):
        kinds.add("shape")
    return [(k, label) for k, label in LEGEND if k in kinds]


def visible(scene: Scene, opened) -> Tuple[List[Placed], Dict[str, str]]:
    """What shows and, for every item and box, the thing standing for it (itself or its closed box)."""
    placement = place(scene, opened)
    return placement.placed, stand_map(scene, opened, (p.id for p in placement.placed))


def edges_between(scene: Scene, stand: Dict[str, str]) -> List[Tuple[str, str, str, str]]:
    """The edges drawn: (from, to, kind, shape) between the things standing for their ends."""
    out, seen = [], set()
    for u, v, kind in scene.edges:
        a, b = stand.get(u), stand.get(v)
        if a is None or b is None or a == b or (a, b) in seen:
            continue
        seen.add((a, b))
        out.append((a, b, kind, scene.items[v].shape if v in scene.items else ""))
    return out


def edge_path(scene: Scene, placement, a: str, b: str) -> List[Tuple[float, float]]:
    """The points of the edge from `a` to `b`, through the route points between them."""
    at = placement.by_id()
    lanes = [placement.lanes[p] for p in route_of(scene, a, b) if p in placement.lanes]
    return edge_points(at[a], at[b], lanes)


def to_svg(scene: Scene, opened=None, title: str = "", max_width: Optional[int] = None) -> str:
    """The first view as one SVG element; every string escaped."""
    opened = scene.open if opened is None else opened
    titles = title_lines(title)
    placement = place(scene, set(opened))
    placed, width, height = placement.placed, placement.width, placement.height
    stand = stand_map(scene, set(opened), (p.id for p in placed))
    margin = 8
    top = TITLE_LINE_H * len(titles) + 4 if titles else 0
    w, h = max(width, title_width(titles)) + 2 * margin, height + 2 * margin + top
    esc = html.escape
    out = ['<svg xmlns="http://www.w3.org/2000/svg" class="ja-static-svg" width="%d" height="%d" viewBox="0 0 %d %d"'
           ' font-family="DejaVu Sans, Arial, sans-serif" font-size="12" role="img">' % (w, h, w, h)]
    for i, line in enumerate(titles):
        out.append('<text x="%d" y="%d" font-weight="bold" fill="%s">%s</text>'
                   % (margin, 16 + TITLE_LINE_H * i, PROBLEM, esc(line)))
    out.append('<g transform="translate(%d,%d)">' % (margin, margin + top))
    for p in placed:
        if p.is_box:
            box = scene.boxes[p.id]
            fill, stroke = STYLE["box"]
            out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="6" fill="var(--jp-layout-color1, %s)"'
                       ' stroke="%s" stroke-dasharray="5 3"/>' % (p.x, p.y, p.w, p.h, fill, stroke))
            label = ("\u2212 " if p.open else "+ ") + box.label
            y = p.y + (TITLE_Y if p.open else BOX_LABEL_Y)
            out.append('<text x="%.1f" y="%.1f" fill="var(--jp-ui-font-color1, %s)" font-weight="bold">%s'
                       '<tspan fill="var(--jp-ui-font-color2, %s)" font-weight="normal"> %s</tspan></text>'
                       % (p.x + TEXT_X, y, TEXT, esc(label), SUBTEXT, esc(box.sub) if p.open else ""))
            if not p.open:
                out.append('<text x="%.1f" y="%.1f" fill="var(--jp-ui-font-color2, %s)" font-size="11">%s</text>'
                           % (p.x + TEXT_X, p.y + BOX_SUB_Y, SUBTEXT, esc(box.sub)))
    for a, b, kind, _ in edges_between(scene, stand):
        red = kind in ("overwrote", "cut")
        out.append('<path d="%s" fill="none" stroke="%s" stroke-width="%s"%s/>'
                   % (_curve(edge_path(scene, placement, a, b)), PROBLEM if red else "#868e96", "2" if red else "1.2",
                      ' stroke-dasharray="4 3"' if kind in ("saves", "overwrote", "cut") else ""))
    for p in placed:
        if p.is_box:
            continue
        item = scene.items[p.id]
        fill, stroke = STYLE.get(item.kind, STYLE["fn"])
        var = CSS_VAR.get(item.kind)
        fill_css = "var(%s, %s)" % (var, fill) if var else fill
        out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="%d" fill="%s" stroke="%s" '
                   'stroke-width="%s"%s/>' % (p.x, p.y, p.w, p.h, 10 if item.kind == "leaf" else 3, fill_css,
                                               PROBLEM if item.problem else stroke, "2.5" if item.problem else "1",
                                               ' stroke-dasharray="5 3"' if item.kind == "cut" else ""))
        dark = item.kind not in ("fn", "fold")  # fixed light fills keep dark text in every theme
        color = TEXT if dark else "var(--jp-ui-font-color1, %s)" % TEXT
        out.append('<text x="%.1f" y="%.1f" text-anchor="middle" fill="%s"%s>%s</text>'
                   % (p.x + p.w / 2, p.y + LABEL_Y, color, ' font-weight="bold"' if item.kind != "fn" else "",
                      esc(item.label)))
        if item.sub:
            out.append('<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11" fill="%s">%s</text>'
                       % (p.x + p.w / 2, p.y + SUB_Y, SUBTEXT if dark else "var(--jp-ui-font-color2, %s)" % SUBTEXT,
                          esc(item.sub)))
    out.append("</g></svg>")
    return "".join(out)


def title_lines(title: str) -> List[str]:
    """A title's lines, each clipped (a diagnosis's title holds the user's name, of any length)."""
    return [clip(line, TITLE_CHARS) for line in title.splitlines() if line.strip()]


def title_width(lines: List[str]) -> float:
    return max((len(line) * TITLE_CHAR_W for line in lines), default=0.0)


def _curve(points: List[Tuple[float, float]]) -> str:
    """Straight down each lane, smooth between rows (vertical tangents), as widget.js draws."""
    (x1, y1) = points[0]
    out = ["M%.1f %.1f" % (x1, y1)]
    for (xa, ya), (xb, yb) in zip(points, points[1:]):
        if xa == xb or yb <= ya:
            out.append("L%.1f %.1f" % (xb, yb))
        else:
            dy = max(6.0, (yb - ya) / 2)
            out.append("C%.1f %.1f %.1f %.1f %.1f %.1f" % (xa, ya + dy, xb, yb - dy, xb, yb))
    return "".join(out)


def to_png(scene: Scene, opened=None, title: str = "", max_pixels: int = 2400) -> bytes:
    """The first view with matplotlib, text drawn as typed (no mathtext, no TeX)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch, PathPatch
    from matplotlib.path import Path

    opened = scene.open if opened is None else opened
    titles = title_lines(title)
    placement = place(scene, set(opened))
    placed, width, height = placement.placed, placement.width, placement.height
    stand = stand_map(scene, set(opened), (p.id for p in placed))
    top = TITLE_LINE_H * len(titles) + 6 if titles else 0
    w_px, h_px = max(width, title_width(titles)) + 16, height + 16 + top
    scale = min(1.0, max_pixels / max(w_px, h_px))
    dpi = 100
    fig = Figure(figsize=(max(w_px * scale, 200) / dpi, max(h_px * scale, 60) / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    ax.set_xlim(-8, max(w_px, 200 / scale) - 8)
    ax.set_ylim(max(h_px, 60 / scale) - 8 - top, -8 - top)  # y grows downwards, as in the SVG
    font = 12 * scale * 72 / dpi  # 12 px text, in points
    text_kw = dict(usetex=False, parse_math=False, fontfamily="DejaVu Sans")
    for i, line in enumerate(titles):
        ax.text(0, -top + 16 + TITLE_LINE_H * i, line, fontsize=font, color=PROBLEM, fontweight="bold", **text_kw)
    for p in placed:
        if not p.is_box:
            continue
        box = scene.boxes[p.id]
        fill, stroke = STYLE["box"]
        ax.add_patch(FancyBboxPatch((p.x, p.y), p.w, p.h, boxstyle="round,pad=0,rounding_size=6", fc=fill, ec=stroke,
                                    lw=1, linestyle="--", zorder=1))
        label = ("\u2212 " if p.open else "+ ") + box.label
        ax.text(p.x + TEXT_X, p.y + (TITLE_Y - 1 if p.open else BOX_LABEL_Y - 1), label, fontsize=font, color=TEXT,
                fontweight="bold", zorder=4, **text_kw)
        if p.open:  # the sublabel after the title, where the scene's title width has room for it
            ax.text(p.x + TEXT_X + text_px(label + "  ", LABEL_FONT, bold=True), p.y + TITLE_Y - 1, box.sub,
                    fontsize=font * SUB_FONT / LABEL_FONT, color=SUBTEXT, zorder=4, **text_kw)
        else:
            ax.text(p.x + TEXT_X, p.y + BOX_SUB_Y, box.sub, fontsize=font * SUB_FONT / LABEL_FONT, color=SUBTEXT,
                    zorder=4, **text_kw)
    for a, b, kind, _ in edges_between(scene, stand):
        points = edge_path(scene, placement, a, b)
        vertices, codes = [points[0]], [Path.MOVETO]
        for (xa, ya), (xb, yb) in zip(points, points[1:]):
            dy = max(6.0, (yb - ya) / 2)
            vertices += [(xa, ya + dy), (xb, yb - dy), (xb, yb)]
            codes += [Path.CURVE4] * 3
        path = Path(vertices, codes)
        red = kind in ("overwrote", "cut")
        ax.add_patch(PathPatch(path, fc="none", ec=PROBLEM if red else "#868e96", lw=1.6 if red else 0.9,
                               linestyle="--" if kind in ("saves", "overwrote", "cut") else "-", zorder=2))
    for p in placed:
        if p.is_box:
            continue
        item = scene.items[p.id]
        fill, stroke = STYLE.get(item.kind, STYLE["fn"])
        ax.add_patch(FancyBboxPatch((p.x, p.y), p.w, p.h, boxstyle="round,pad=0,rounding_size=%d"
                                    % (10 if item.kind == "leaf" else 3), fc=fill,
                                    ec=PROBLEM if item.problem else stroke, lw=2.2 if item.problem else 0.9,
                                    linestyle="--" if item.kind == "cut" else "-", zorder=3))
        ax.text(p.x + p.w / 2, p.y + LABEL_Y, item.label, ha="center", va="baseline", fontsize=font, color=TEXT,
                fontweight="normal" if item.kind == "fn" else "bold", zorder=4, **text_kw)
        if item.sub:
            ax.text(p.x + p.w / 2, p.y + SUB_Y, item.sub, ha="center", va="baseline", fontsize=font * 0.9,
                    color=SUBTEXT, zorder=4, **text_kw)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # A glyph the font lacks (a name in Chinese) is drawn as a box; the warning would be
        # printed under the user's cell.
        warnings.simplefilter("ignore")
        fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


__all__ = ["to_svg", "to_png", "visible", "edges_between", "ROOT"]
