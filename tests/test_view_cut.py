"""graph-cut in the view: the op that cut the chain is a node of its own (kind "cut"), between the
graph that fed it (ordinary edges) and what used its result (a broken "cut" edge); the loss says
it has no grad_fn; selecting the card selects the cut, and clicking the cut explains it."""
import pytest
import torch

import jupyter_autograd as ja
from jupyter_autograd.render import draw, layout
from jupyter_autograd.widget import AutogradWidget, static_bundle

XSS = "<img src=x onerror=alert(1)>"


def items_of(w):
    return {row[0]: row for row in w.scene["items"]}


def loss_from_item():
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3)
    with pytest.raises(RuntimeError, match="does not require grad"):
        with ja.capture() as trace:
            pred = (w * x).sum()
            loss = {"<u>x": torch.tensor(pred.item())}["<u>x"]
            loss.backward()
    return trace


def test_loss_rebuilt_from_a_number_shows_the_cut_between_pred_and_loss():
    trace = loss_from_item()
    (d,) = trace.diagnoses
    assert d.kind == "graph-cut" and d.tensor == "loss"
    w = AutogradWidget(trace)
    items = items_of(w)
    cut = layout.write_id(d.op_index)
    assert items[cut][1] == "cut" and "chain cut here" in items[cut][3] and items[cut][6] == 1
    assert items[cut][2].startswith('loss = {"<u>x": torch.tensor(') and '"<u>x"' in items[cut][5]  # as typed: JS uses textContent
    loss = "t%d" % d.tids[0]
    assert items[loss][2] == "loss" and "no grad_fn" in items[loss][3]
    pred_node = "fn%d" % trace.tensors[next(t for t, i in trace.tensors.items() if i.name == "pred")].node
    assert items[pred_node][2] == "pred"
    edges = {(u, v): kind for u, v, kind, *_ in w.scene["edges"]}
    assert edges[(loss, cut)] == "cut" and edges[(cut, pred_node)] == "next"
    assert not any(kind == "overwrote" for kind in edges.values())
    # The card selects the cut first; clicking it explains it.
    assert w.selected_diagnosis == 0 and w.highlight_nodes[0] == cut and w.selected == cut
    assert cut in w.scene["focus"] and pred_node in w.scene["focus"]
    rows = dict(map(tuple, w.details["rows"]))
    assert "backward from `loss` stops here" in rows["chain cut"] and rows["operation"].endswith("item")
    w.selected = loss
    assert dict(map(tuple, w.details["rows"]))["grad_fn"] == "None"


def test_the_cut_is_drawn_dashed_red_and_escaped_in_the_static_pictures():
    trace = loss_from_item()
    html = static_bundle(trace)["text/html"]
    assert "<u>" not in html and "<img" not in html and "{&quot;&lt;u&gt;x&quot;: torch.tensor(" in html
    scene = layout.build_scene(trace)
    svg = draw.to_svg(scene) if hasattr(draw, "to_svg") else html
    assert 'stroke-dasharray="5 3"' in svg  # the cut's box
    assert 'stroke="%s" stroke-width="2" stroke-dasharray="4 3"' % draw.PROBLEM in svg  # the broken edge
    assert draw.to_png(scene, opened=list(scene.boxes))[:4] == b"\x89PNG"


def test_a_detach_that_starves_a_parameter_breaks_the_edge_from_its_user():
    w = torch.randn(3, requires_grad=True)
    v = torch.randn(3, requires_grad=True)
    opt = torch.optim.SGD([w, v], lr=0.1)
    with ja.capture() as trace:
        h = w * 2
        out = (h.detach() * v).sum()
        out.backward()
        opt.step()
    (d,) = [d for d in trace.diagnoses if d.kind == "missing-grad"]
    assert d.tensor == "w" and d.source == "out = (h.detach() * v).sum()"
    wd = AutogradWidget(trace)
    items = items_of(wd)
    cut = layout.write_id(d.op_index)
    assert items[cut][1] == "cut"
    edges = [(u, v, kind) for u, v, kind, *_ in wd.scene["edges"]]
    broken = [(u, v) for u, v, kind in edges if kind == "cut"]
    h_node = "fn%d" % trace.tensors[next(t for t, i in trace.tensors.items() if i.name == "h")].node
    assert (cut, h_node, "next") in edges  # what fed the detach: h's graph, down to w
    (user, target), = broken
    assert target == cut and items[user][2].startswith("MulBackward")  # (h.detach() * v) got no edge back
    wd.selected = cut
    assert "chain cut" in dict(map(tuple, wd.details["rows"]))


def test_no_grad_loss_marks_the_loss_and_the_no_grad_line():
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        with ja.capture() as trace:
            with torch.no_grad():
                pred = w * 3
            loss = pred.sum()
            loss.backward()
    (d,) = trace.diagnoses
    wd = AutogradWidget(trace)
    items = items_of(wd)
    cut = layout.write_id(d.op_index)
    assert items[cut][1] == "cut" and items[cut][2] == "pred = w * 3"
    assert ["t%d" % d.tids[0], cut, "cut"] in [e[:3] for e in wd.scene["edges"]]
    assert "no grad_fn" in items["t%d" % d.tids[0]][3]


def test_a_write_is_still_a_write():
    x = torch.ones(2, requires_grad=True)
    with ja.capture() as trace:
        y = x.exp()
        y += 1
    kinds = {row[1] for row in AutogradWidget(trace).scene["items"]}
    assert "write" in kinds and "cut" not in kinds
