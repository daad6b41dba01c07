"""Drawing a View with matplotlib: a Figure (never pyplot's global state), to SVG or PNG.

Legend (shape and colour):
    rounded blue box     leaf tensor that requires grad (receives .grad)
    grey box             grad_fn node (a backward operation)
    orange ellipse       tensor saved for backward
    green box            a result tensor of the block
    red diamond          the in-place write that broke backward
    dashed white box     a group of nodes created on one line (click to expand)
    red outline          involved in a diagnosis

Every node is drawn with a gid "ja-<node id>" (its text "ja-<node id>-t"), so the SVG can be
made interactive by the front end without re-rendering.
"""
from __future__ import annotations

import io

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Ellipse, FancyArrowPatch, FancyBboxPatch, Polygon

from .layout import View

STYLE = {
    "leaf": dict(fc="#d0e4ff", ec="#1c5fb8", shape="round"),
    "fn": dict(fc="#ececec", ec="#6b6b6b", shape="box"),
    "saved": dict(fc="#ffe0b2", ec="#d9480f", shape="ellipse"),
    "tensor": dict(fc="#d3f9d8", ec="#2b8a3e", shape="box"),
    "write": dict(fc="#ffc9c9", ec="#c92a2a", shape="diamond"),
    "group": dict(fc="#ffffff", ec="#868e96", shape="dashed"),
}
PROBLEM_EDGE = "#e03131"
LEGEND = [("leaf (gets .grad)", "leaf"), ("grad_fn node", "fn"), ("saved tensor", "saved"),
          ("result tensor", "tensor"), ("in-place write", "write"), ("group (click)", "group")]
X_SPACING, Y_SPACING, BOX_W, BOX_H = 2.3, 1.25, 2.0, 0.62


def figure(view: View, title: str = "") -> Figure:
    width_in = min(max(7.0, view.width * 1.75 + 1.0), 80.0)
    height_in = min(max(3.2, view.depth * 0.95 + 1.2), 80.0)
    fig = Figure(figsize=(width_in, height_in))
    ax = fig.add_axes((0, 0, 1, 0.94 if title else 1.0))
    ax.set_axis_off()
    pos = {n.id: (n.x * X_SPACING, n.y * Y_SPACING) for n in view.nodes.values()}
    for u, v, kind in view.edges:
        if u not in pos or v not in pos:
            continue
        (x1, y1), (x2, y2) = pos[u], pos[v]
        bad = kind == "overwrote"
        if y1 == y2:  # side by side (a write next to the tensor it changed)
            sign = 1 if x2 > x1 else -1
            start, end = (x1 + sign * BOX_W / 2, y1), (x2 - sign * BOX_W / 2, y2)
        else:
            start, end = (x1, y1 - BOX_H / 2), (x2, y2 + BOX_H / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>",
                                     mutation_scale=9, lw=1.6 if bad else 0.8,
                                     color=PROBLEM_EDGE if bad else "#868e96",
                                     linestyle="--" if kind in ("saves", "overwrote") else "-", zorder=1))
    for node in view.nodes.values():
        _node(ax, node, pos[node.id])
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    ax.set_xlim(min(xs) - BOX_W, max(xs) + BOX_W)
    ax.set_ylim(min(ys) - BOX_H * 1.5, max(ys) + BOX_H * 1.5)
    handles = [Line2D([], [], marker={"round": "s", "box": "s", "ellipse": "o", "diamond": "D",
                                      "dashed": "s"}[STYLE[k]["shape"]], linestyle="", markersize=9,
                      markerfacecolor=STYLE[k]["fc"], markeredgecolor=STYLE[k]["ec"], label=label)
               for label, k in LEGEND if k != "group" or view.grouped]
    ax.legend(handles=handles, loc="upper left", fontsize=7, frameon=True, ncol=1, borderaxespad=0.2)
    if title:
        fig.suptitle(title, fontsize=9, x=0.01, ha="left", color="#c92a2a")
    return fig


def _node(ax, node, xy):
    style = STYLE.get(node.kind, STYLE["fn"])
    x, y = xy
    ec = PROBLEM_EDGE if node.problem else style["ec"]
    lw = 2.4 if node.problem else 1.0
    gid = "ja-" + node.id
    if style["shape"] == "ellipse":
        patch = Ellipse((x, y), BOX_W, BOX_H, fc=style["fc"], ec=ec, lw=lw)
    elif style["shape"] == "diamond":
        w, h = BOX_W / 2 + 0.1, BOX_H / 2 + 0.12
        patch = Polygon([(x - w, y), (x, y + h), (x + w, y), (x, y - h)], closed=True, fc=style["fc"], ec=ec, lw=lw)
    else:
        box = "round,pad=0.02,rounding_size=0.18" if style["shape"] == "round" else "square,pad=0.02"
        patch = FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H, boxstyle=box, fc=style["fc"], ec=ec,
                               lw=lw, linestyle="--" if style["shape"] == "dashed" else "-")
    patch.set_gid(gid)
    patch.set_zorder(2)
    ax.add_patch(patch)
    label = _short(node.label, 26)
    text = ax.text(x, y + (0.09 if node.sublabel else 0), label, ha="center", va="center", fontsize=7.2,
                   fontweight="bold" if node.kind in ("leaf", "tensor", "saved", "write") else "normal",
                   zorder=3, color="#c92a2a" if node.problem else "#212529")
    text.set_gid(gid + "-t")
    if node.sublabel:
        sub = ax.text(x, y - 0.16, _short(node.sublabel, 32), ha="center", va="center", fontsize=5.8,
                      color="#495057", zorder=3)
        sub.set_gid(gid + "-s")


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def to_svg(fig: Figure) -> str:
    import matplotlib

    buf = io.StringIO()
    # Text stays text (smaller, searchable); matplotlib escapes it for XML.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "jupyter-autograd"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def to_png(fig: Figure, max_pixels: int = 3000) -> bytes:
    w, h = fig.get_size_inches()
    dpi = max(30, min(110, max_pixels / max(w, h)))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    return buf.getvalue()
