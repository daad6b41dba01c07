"""One geometry (issue 27): the sizes of what the view draws are computed once, in Python, and sent
with the scene; widget.js places them and keeps no sizing rules of its own. No browser here
(tests/test_browser_view.py compares what the widget draws with `layout.place`)."""
import functools
import pathlib
import re

import pytest
import torch
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.render import layout
from jupyter_autograd.render.layout import sizes
from jupyter_autograd.widget import AutogradWidget
from jupyter_autograd.widget.widget import fix_parts

from . import notebook_cases, view_cases

WIDGET_JS = pathlib.Path(layout.__file__).resolve().parents[2] / "widget" / "widget.js"
PANE_W, PANE_H = 860, 520  # the graph pane of the first screen at 1400x1000 (tests/test_view_layout.py)


@functools.lru_cache(maxsize=None)
def view_case(name):
    return view_cases.run_in_shell(name)


@functools.lru_cache(maxsize=None)
def notebook_case(name):
    return notebook_cases.run_in_shell(name)


def nested_trace():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8), nn.Sigmoid()), nn.Linear(8, 2))
    with ja.capture(namespace={"model": model}) as trace:
        loss = model(torch.randn(3, 4)).sum()
        loss.backward()
    return trace


def shown_solid(placement):
    return [p for p in placement.placed if not p.open]


# -- the scene carries the sizes --------------------------------------------------------------------

def test_the_scene_sent_to_the_front_end_carries_every_size_and_number_it_draws_with():
    scene = layout.build_scene(nested_trace())
    wire = scene.to_json()
    for row in wire["items"]:
        item = scene.items[row[0]]
        assert row[7:9] == [item.w, item.h] and item.w >= sizes.MIN_W and item.h == sizes.NODE_H
    for row in wire["boxes"]:
        box = scene.boxes[row[0]]
        assert row[8:12] == [box.w, box.h, box.title_w, int(box.badge)] and box.w > 0 and box.title_w > 0
    # The rows of each box laid out (its layers wrapped at ROW_MAX), not the layers: no wrapping rule in JS.
    assert set(wire["rows"]) == set(scene.layers)
    assert all(wire["rows"][b] == layout.rows_of(scene.layers[b]) for b in scene.layers)
    # The shape written on an edge comes with its width.
    assert all(len(e) == 5 and (e[4] > 0) == bool(e[3]) for e in wire["edges"])
    geometry = wire["geometry"]
    assert geometry == sizes.front_end()
    assert {"header_h", "pad", "gap_x", "gap_y", "route_w", "badge", "margin", "minimap"} <= set(geometry)


def test_every_label_fits_its_node_and_every_title_its_box():
    scene = layout.build_scene(view_case("resnet"))
    for item in scene.items.values():
        label = sizes.text_px(item.label, sizes.LABEL_FONT, bold=item.kind != "fn")
        assert label + 2 * sizes.TEXT_PAD <= item.w and sizes.text_px(item.sub, sizes.SUB_FONT) + 2 * sizes.TEXT_PAD <= item.w
    for box in scene.boxes.values():
        assert sizes.TEXT_X + sizes.text_px("+ " + box.label, sizes.LABEL_FONT, bold=True) + sizes.TEXT_PAD <= box.w
        title = sizes.text_px("\u2212 " + box.label, sizes.LABEL_FONT, bold=True) + sizes.text_px("  " + box.sub, sizes.SUB_FONT)
        assert sizes.TEXT_X + title <= box.title_w
    # A long name: the box is as wide as its text, never capped below it.
    long = "x" * 30 + "W" * 4
    assert sizes.node_size("tensor", long, "")[0] >= sizes.text_px(long, sizes.LABEL_FONT, bold=True) + 2 * sizes.TEXT_PAD


def test_text_is_measured_with_the_fonts_widths():
    assert sizes.text_px("iiii") < sizes.text_px("MMMM") < sizes.text_px("MMMM", bold=True)
    assert sizes.text_px("mean", 12) == pytest.approx(sizes.text_px("mean", 24) / 2)
    assert sizes.text_px("\u640d\u5931") == 2 * 12  # wide East Asian characters: an em each


def test_a_module_with_gradient_health_data_has_room_for_its_bar():
    trace = nested_trace()
    plain = layout.build_scene(trace)
    badged = layout.build_scene(trace, badges={"model.1", "model.0"})
    for box_id, box in badged.boxes.items():
        other = plain.boxes[box_id]
        if box.name in ("model.1", "model.0"):
            # The bar sits at the right of the label's line: that line is longer by its room.
            label_line = sizes.TEXT_X + sizes.text_px("+ " + box.label, sizes.LABEL_FONT, bold=True) + sizes.BADGE_ZONE
            assert box.badge and box.w >= other.w and box.w >= label_line
            assert box.title_w == other.title_w + sizes.BADGE_ZONE - sizes.TEXT_PAD
        else:
            assert not box.badge and (box.w, box.title_w) == (other.w, other.title_w)
    assert badged.boxes["m:model.0"].w > plain.boxes["m:model.0"].w  # its label's line is the longer one
    # The widget gives the boxes of the modules it has health data for their room.
    trace.grad_stats = lambda: {"steps": [], "parameters": [], "thresholds": {}, "modules": [
        {"name": "model.1", "norms": [1e-12], "flags": ["vanishing"], "ratio": 1e-12, "parameters": []}]}
    try:
        w = AutogradWidget(trace)
    finally:
        del trace.grad_stats
    rows = {row[5]: row for row in w.scene["boxes"]}
    assert rows["model.1"][11] == 1 and rows["model.0"][11] == 0
    assert w.view_scene().boxes[rows["model.1"][0]].badge


# -- placement: titles cover nothing ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gan", "resnet"])
def test_an_open_box_title_never_overlaps_what_the_box_holds(name):
    trace = view_case(name)
    w = AutogradWidget(trace)
    scene = w.view_scene()
    assert any(b.badge for b in scene.boxes.values())
    opened = [b for b in scene.boxes if b in scene.layers]
    placement = layout.place(scene, opened)
    at = placement.by_id()
    for p in placement.placed:
        if not p.open:
            continue
        box = scene.boxes[p.id]
        assert box.title_w <= p.w, "the title of %s is wider than its box" % p.id
        bar = (p.x, p.y, p.x + p.w, p.y + sizes.HEADER_H)
        inside = [at[c] for c in at if p.id in scene.ancestors(c)]
        assert inside
        for q in inside:
            apart = q.y >= bar[3] or q.y + q.h <= bar[1] or q.x >= bar[2] or q.x + q.w <= bar[0]
            assert apart, "the title of %s lies over %s" % (p.id, q.id)
            assert p.x <= q.x and q.x + q.w <= p.x + p.w and p.y <= q.y and q.y + q.h <= p.y + p.h


def test_siblings_never_overlap_with_every_box_open():
    scene = AutogradWidget(view_case("resnet")).view_scene()
    placement = layout.place(scene, list(scene.layers))
    by_parent = {}
    for p in placement.placed:
        by_parent.setdefault(scene.parent_of(p.id), []).append(p)
    for siblings in by_parent.values():
        for i, a in enumerate(siblings):
            for b in siblings[i + 1:]:
                assert a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y, (a, b)


# -- the first view cuts no node ------------------------------------------------------------------------

@pytest.mark.parametrize("source,name", [("view", "gan"), ("view", "resnet")] +
                         [("notebook", n) for n in sorted(notebook_cases.CASES)])
def test_the_first_view_cuts_no_node_at_the_panes_edges(source, name):
    trace = view_case(name) if source == "view" else notebook_case(name)
    scene = AutogradWidget(trace).view_scene()
    x, y, k = layout.first_view(scene, scene.open, PANE_W, PANE_H)
    view = (x, y, x + PANE_W / k, y + PANE_H / k)
    placement = layout.place(scene, scene.open)
    cut = []
    for p in shown_solid(placement):
        meets = p.x < view[2] and view[0] < p.x + p.w and p.y < view[3] and view[1] < p.y + p.h
        inside = view[0] <= p.x and p.x + p.w <= view[2] and view[1] <= p.y and p.y + p.h <= view[3]
        if meets and not inside:
            cut.append(p.id)
    assert not cut, "%s: cut by the edges of %s: %s" % (name, view, cut)
    stand = layout.stand_map(scene, scene.open, placement.by_id())
    for thing in scene.core:
        p = placement.by_id()[stand[thing]]
        assert view[0] <= p.x and p.x + p.w <= view[2] and view[1] <= p.y and p.y + p.h <= view[3]


def test_snap_moves_the_window_as_little_as_it_must():
    m, margin = sizes.CUT_MARGIN, sizes.MARGIN
    assert layout.snap(0, -100, 100, 50, [(100, 140)]) == 0           # nothing cut: it stays
    assert layout.snap(0, -100, 100, 50, [(40, 80)]) == -10 - m        # its right edge cut a node: left of it
    assert layout.snap(50, -100, 100, 50, [(40, 80)]) == 40 - m       # its left edge did: the node wholly in
    assert layout.snap(0, 0, 0, 50, [(40, 80)]) == -10 - m             # no room: within MARGIN more
    assert layout.snap(0, -100, 100, 50, [(40, 80)], floor=0) == 80 + m - 50  # never below the floor
    dense = [(x, x + 30) for x in range(-200, 200, 33)]               # no way to cut none: the fewest

    def cuts(at):
        return sum(a - m < e < b + m for a, b in dense for e in (at, at + 50))
    at = layout.snap(0, 0, 0, 50, dense)
    assert -margin <= at <= margin and cuts(at) == min(cuts(c / 2) for c in range(-2 * margin, 2 * margin + 1))


# -- widget.js has no second copy of the sizing rules -----------------------------------------------------

def test_widget_js_keeps_no_sizing_rules():
    js = WIDGET_JS.read_text()
    for name in ("NODE_H", "BOX_H", "HEADER_H", "CHAR_W", "MIN_W", "MAX_W", "BADGE_W", "ROW_MAX", "textWidth",
                 "rowsOf", "MINIMAP_W", "READABLE_ZOOM"):
        assert not re.search(r"\b%s\b" % name, js), name
    assert not re.search(r"\.length \* \d", js), "a text width estimated from its length"
    css = (WIDGET_JS.parent / "widget.css").read_text()
    minimap = re.search(r"\.ja-minimap \{[^}]*\}", css).group(0)
    assert "width" not in minimap and "height" not in minimap  # set from the scene's geometry


# -- the fix card: what to do, then the other ways (folded) ------------------------------------------------

def test_a_fix_is_split_into_what_to_do_and_the_other_ways():
    trace = view_case("gan")
    fix = trace.diagnoses[0].fix
    main, more = fix_parts(fix)
    assert main.rstrip().endswith("    fake = fake.clamp(-0.9, 0.9)") and main + "\n" + more == fix
    assert "allow_mutation_on_saved_tensors" in more and "allow_mutation_on_saved_tensors" not in main
    card = AutogradWidget(trace).diagnoses[0]
    assert (card["fix_main"], card["fix_more"]) == (main, more) and card["fix"] == fix
    assert fix_parts("No code here.\nOr another way.") == ("No code here.", "Or another way.")
    assert fix_parts("One paragraph.") == ("One paragraph.", "")
