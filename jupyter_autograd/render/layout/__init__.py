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
  widget.js computes it;
- geometry (one copy, sizes.py): the size of every item and box (closed; its title's width open;
  room for a module's gradient-health bar), the rows each box's layers wrap into, and the numbers
  the front end places and draws with. widget.js has no sizing rules of its own: `place`
  (geometry.py) and its JavaScript twin put these sizes in rows the same way.

The modules: scene (the data and its wire format), labels (the words on things), build (a trace's
scene), grouping (boxes, chunks, focus, layers), sizes (the geometry's rules), geometry
(placement), view (the first view). They import only ..model (and networkx).

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

from .build import build_scene, iteration_of, iteration_starts, lay_out
from .geometry import Placed, Placement, edge_points, place, route_of, stand_map
from .grouping import FIRST_VIEW_ITEMS, LINE_BOX_MIN, layer_box
from .labels import MAX_CHARS, block_file, clip, line_labeller, main_file, node_shape
from .scene import EAGER_ITEMS, FOLD, MAX_CHILDREN, ROOT, ROUTE, Box, Item, Scene, children_of, rows_of, write_id
from .sizes import (BADGE_ZONE, BOX_H, FIT_MIN_ZOOM, GAP_X, GAP_Y, HEADER_H, MARGIN, MIN_W, MINIMAP_H, MINIMAP_INSET,
                    MINIMAP_W, NODE_H, PAD, READABLE_ZOOM, ROUTE_W, ROW_MAX, SMALLEST_FONT, box_sizes, front_end,
                    node_size, text_px)
from .view import first_view, snap, uncut

__all__ = [
    "build_scene",
    "iteration_of",
    "iteration_starts",
    "lay_out",
    "Placed",
    "Placement",
    "edge_points",
    "place",
    "route_of",
    "stand_map",
    "FIRST_VIEW_ITEMS",
    "LINE_BOX_MIN",
    "layer_box",
    "MAX_CHARS",
    "block_file",
    "clip",
    "line_labeller",
    "main_file",
    "node_shape",
    "EAGER_ITEMS",
    "FOLD",
    "MAX_CHILDREN",
    "ROOT",
    "ROUTE",
    "Box",
    "Item",
    "Scene",
    "children_of",
    "rows_of",
    "write_id",
    "BADGE_ZONE",
    "BOX_H",
    "FIT_MIN_ZOOM",
    "GAP_X",
    "GAP_Y",
    "HEADER_H",
    "MARGIN",
    "MIN_W",
    "MINIMAP_H",
    "MINIMAP_INSET",
    "MINIMAP_W",
    "NODE_H",
    "PAD",
    "READABLE_ZOOM",
    "ROUTE_W",
    "ROW_MAX",
    "SMALLEST_FONT",
    "box_sizes",
    "front_end",
    "node_size",
    "text_px",
    "first_view",
    "snap",
    "uncut",
]
