"""The scene the graph view draws: module boxes, focus, one iteration, size, the first view; no
browser, no kernel."""
import functools
import gc
import tracemalloc

import networkx as nx
import pytest
import torch
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.render import draw, layout
from jupyter_autograd.widget import AutogradWidget

from . import notebook_cases


class Block(nn.Module):
    """A ResNet basic block: one ReLU module called twice (grouping it as one box made a cycle)."""

    def __init__(self, c, inplace=False):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=inplace)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


def resnet(blocks=4):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         *[Block(8) for _ in range(blocks)], nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def train(model, steps=1):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))
    with ja.capture(namespace={"model": model}) as trace:
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


@pytest.fixture(scope="module")
def gpt2_trace():
    import transformers  # a test dependency of the project

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 100, (2, 16))
    with ja.capture(namespace={"model": model}) as trace:
        out = model(ids, labels=ids)
        out.loss.backward()
    return trace


def every_box_acyclic(scene):
    lifted = scene.lifted_edges()
    for box in [layout.ROOT] + list(scene.boxes):
        g = nx.DiGraph()
        g.add_nodes_from(layout.children_of(scene, box))
        g.add_edges_from(lifted.get(box, ()))
        assert nx.is_directed_acyclic_graph(g), "cycle among the children of %r: %s" % (box, nx.find_cycle(g))


def parameter_boxes(trace, scene):
    """(parameter name, the module names of the boxes holding its AccumulateGrad node)."""
    out = []
    for key, node in trace.nodes.items():
        if node.variable is None:
            continue
        name = trace.tensor_label(node.variable)
        item = "fn%d" % key
        if item in scene.items:
            out.append((name, [scene.boxes[b].name for b in scene.ancestors(item) if scene.boxes[b].kind == "module"]))
    return out


def test_resnet_blocks_make_acyclic_boxes_one_per_module_call():
    trace = train(resnet())
    scene = layout.build_scene(trace)
    every_box_acyclic(scene)
    # The ReLU called twice in a block is two boxes, both inside their block's box.
    relu_calls = [b for b in scene.boxes.values() if b.name == "model.3.relu"]
    assert len(relu_calls) == 2 and {b.parent for b in relu_calls} == {"m:model.3"}
    # Nothing is drawn twice and every edge ends at something drawn.
    for u, v, _ in scene.edges:
        assert u in scene.items and v in scene.items


def test_parameters_sit_inside_their_module_box():
    trace = train(resnet())
    scene = layout.build_scene(trace)
    placed = parameter_boxes(trace, scene)
    assert len(placed) == sum(1 for _ in resnet().parameters())
    for name, modules in placed:
        owner = name.rsplit(".", 1)[0]
        assert modules and modules[0] == owner, (name, modules)
    # ... and no bucket of "inputs and parameters" next to the model.
    assert not [b for b in scene.boxes.values() if "param" in b.label.lower() or "input" in b.label.lower()]


def test_gpt2_tiny_boxes_params_and_first_view(gpt2_trace):
    scene = layout.build_scene(gpt2_trace)
    every_box_acyclic(scene)
    for name, modules in parameter_boxes(gpt2_trace, scene):
        owner = name.rsplit(".", 1)[0]
        assert modules[0] == owner or owner.startswith(modules[0] + "."), (name, modules)
    # Without a diagnosis the first view is the root and the model's first level, small.
    assert scene.open == ["m:model"]
    placed, stand = draw.visible(scene, set(scene.open))
    shown = {p.id for p in placed}
    assert {"m:model.transformer", "m:model.lm_head"} <= shown
    loss = next(i for i, x in scene.items.items() if x.sub.startswith("NllLossBackward0"))
    assert loss in shown and scene.focus == [loss]
    assert len(shown) < 20
    # Labels say which file a line is in when it is not the user's.
    # Ops inside transformers are named at the user's line that called into the library.
    assert not any("modeling_gpt2.py:" in x.sub for x in scene.items.values())


def test_a_diagnosis_opens_the_view_along_its_path():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.Sigmoid()), nn.Linear(4, 4),
                          nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Linear(4, 2))
    with ja.capture(namespace={"model": model}) as trace:
        h = model[:2](torch.randn(3, 4))
        h2 = h * 3
        h.mul_(2)  # the culprit: h (a sigmoid's output) was saved
        out = model[2:](h2)
        loss = out.sum()
    assert trace.diagnoses and trace.diagnoses[0].kind == "saved-tensor-modified"
    d = trace.diagnoses[0]
    scene = layout.build_scene(trace)
    every_box_acyclic(scene)
    write, tensor, saver = layout.write_id(d.op_index), "t%d" % d.tids[0], "fn%d" % d.node_key
    assert {write, tensor, saver} <= set(scene.focus)
    placed, stand = draw.visible(scene, set(scene.open))
    shown = {p.id for p in placed}
    for x in (write, tensor, saver):
        assert stand[x] == x, "%s is hidden in %s" % (x, stand[x])
    # The way to the root is highlighted and starts at the root (the loss).
    assert scene.path[-1] == saver and scene.items[scene.path[0]].label == "loss"
    assert stand[scene.path[0]] in shown
    # Everything else stays closed: the later layers are boxes, not their nodes.
    later = [i for i, x in scene.items.items() if "m:model.3" in scene.ancestors(i)]
    assert later and all(stand[i] != i and stand[i] in shown for i in later)


def test_training_loop_shows_one_iteration_and_folds_the_rest():
    one = layout.build_scene(train(resnet(1), steps=1))
    many = layout.build_scene(train(resnet(1), steps=12))
    assert many.shown_nodes <= one.shown_nodes + 2 and many.total_nodes > 5 * one.total_nodes
    assert len(many.items) <= len(one.items) + 2
    assert layout.FOLD in many.items and "12 backward calls" in many.note
    assert "folded" in many.note
    every_box_acyclic(many)
    w = AutogradWidget(train(resnet(1), steps=3))
    w.selected = layout.FOLD
    assert "folded" in w.details["title"] and "3 backward calls" in w.details["rows"][0][1]


def test_huge_graph_is_grouped_and_small_on_the_wire():
    x = torch.randn(4, requires_grad=True)
    with ja.capture() as trace:
        h = x
        for _ in range(12000):
            h = torch.tanh(h * 1.01)
    scene = layout.build_scene(trace)
    wire = scene.to_json()
    assert len(trace.nodes) > 24_000
    assert len(wire["items"]) + len(wire["boxes"]) <= layout.EAGER_ITEMS + layout.MAX_CHILDREN
    assert all(len(b.children) <= layout.MAX_CHILDREN for b in scene.boxes.values())
    every_box_acyclic(scene)
    del h


def test_text_is_at_least_11px_and_boxes_do_not_overlap():
    trace = train(resnet(2))
    scene = layout.build_scene(trace)
    placed = layout.place(scene, list(scene.boxes)).placed
    svg = draw.to_svg(scene, opened=list(scene.boxes))
    sizes = {int(s.split('"')[0]) for s in svg.split('font-size="')[1:]}
    assert min(sizes) >= 11
    by_parent = {}
    for p in placed:
        parent = scene.parent_of(p.id)
        by_parent.setdefault(parent, []).append(p)
    for siblings in by_parent.values():
        for i, a in enumerate(siblings):
            for b in siblings[i + 1:]:
                apart = a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
                assert apart, (a, b)


def small_cell():
    x = torch.ones(3, requires_grad=True)
    with ja.capture() as trace:
        y = x.exp()
        z = (y * 2).sum()
        y.add_(1)
    return trace


def test_fifty_small_widgets_hold_little_and_no_figure_or_graph():
    import matplotlib.figure

    AutogradWidget(small_cell())._repr_mimebundle_()  # imports and caches first
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = []
        for i in range(50):
            w = AutogradWidget(small_cell())
            if i % 5 == 0:  # drawing the PNG and the static SVG keeps nothing (slow under tracemalloc)
                w._repr_mimebundle_()
            kept.append(w)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    per_widget = grown / 50
    print("retained per small widget (trace included): %.1f KiB" % (per_widget / 1024))
    assert per_widget < 200 * 1024
    alive = gc.get_objects()
    assert not any(isinstance(o, matplotlib.figure.Figure) for o in alive)
    for w in kept[:3]:
        held = gc.get_referents(w.__dict__)
        assert not any(isinstance(o, (nx.Graph, layout.Scene)) for o in held)


# -- the first screen of four notebooks (tests/notebook_cases.py) -------------------------------------

# The graph pane of the first screen at 1400x1000 in JupyterLab: the widget's width less the
# source column, and the height left under the diagnosis card.
PANE_W, PANE_H = 860, 520


@functools.lru_cache(maxsize=None)
def case(name):
    return notebook_cases.run_in_shell(name)


@pytest.mark.parametrize("name", sorted(notebook_cases.CASES))
def test_each_notebook_is_diagnosed_in_the_cell_jupyter_names(name):
    trace = case(name)
    d = trace.diagnoses[0]
    cell, line = notebook_cases.CULPRIT[name]
    assert d.kind == notebook_cases.KINDS[name]
    assert trace.place(d.filename, d.line) == "In [%d], line %d" % (cell, line)


def rect_of(scene, placement, thing):
    stand = layout.stand_map(scene, scene.open, placement.by_id())
    p = placement.by_id()[stand[thing]]
    return p.x, p.y, p.x + p.w, p.y + p.h


@pytest.mark.parametrize("name", sorted(notebook_cases.CASES))
def test_first_view_shows_the_problem_its_path_and_readable_labels(name):
    """At 1400x1000 the problem's nodes, and the nodes just above them on the way to the loss,
    are inside the graph pane at the first zoom, off the overview map, with text of 11 px."""
    scene = layout.build_scene(case(name))
    placement = layout.place(scene, scene.open)
    x, y, k = layout.first_view(scene, scene.open, PANE_W, PANE_H)
    assert k * layout.SMALLEST_FONT >= 11
    svg = draw.to_svg(scene)
    assert min(int(s.split('"')[0]) for s in svg.split('font-size="')[1:]) >= layout.SMALLEST_FONT
    view = (x, y, x + PANE_W / k, y + PANE_H / k)
    minimap = (view[2] - (layout.MINIMAP_W + layout.MINIMAP_INSET) / k,
               view[3] - (layout.MINIMAP_H + layout.MINIMAP_INSET) / k, view[2], view[3])
    assert scene.core and scene.path
    near_problem = list(reversed(scene.path))[:3]
    for thing in scene.core + near_problem:
        r = rect_of(scene, placement, thing)
        assert view[0] <= r[0] and r[2] <= view[2] and view[1] <= r[1] and r[3] <= view[3], (thing, r, view)
        assert r[2] <= minimap[0] or r[3] <= minimap[1], "%s is under the overview map" % thing


def test_a_loop_draws_the_model_of_the_problem_iteration_beside_the_accumulation():
    trace = case("loop")
    scene = layout.build_scene(trace)
    assert layout.FOLD in scene.items and "150 backward calls" in scene.note
    names = {x.name for x in scene.items.values()}
    assert {"total_loss", "loss", "mlp.0.weight", "mlp.4.bias"} <= names
    assert scene.shown_nodes >= 15  # the model's graph: 3 linear layers, 2 ReLUs, the loss


@pytest.mark.parametrize("name", ["loop", "gpt2"])
def test_find_reaches_every_name_the_summary_lists(name):
    trace = case(name)
    w = AutogradWidget(trace)
    findable = {row[5] for row in w.scene["items"]} | {row[5] for row in w.scene["boxes"]}
    findable |= {n for n, _ in w.scene["names"]}
    leaves = [trace.tensor_label(n.variable) for n in trace.nodes.values() if n.variable is not None]
    assert leaves and set(leaves) <= findable, set(leaves) - findable
    assert "Leaves that get .grad: " + leaves[0] in w.summary


def test_cells_are_named_as_jupyter_names_them_and_the_loss_line_is_one_box():
    scene = layout.build_scene(case("gpt2"))
    texts = [x.sub for x in scene.items.values()] + [b.label for b in scene.boxes.values()]
    assert not [t for t in texts if "ipython-input" in t or ".py:" in t]
    write = next(x for x in scene.items.values() if x.kind == "write")
    assert write.label == "h *= self.scale" and write.sub.startswith("In [2], line 18")
    loss_line = next(b for b in scene.boxes.values() if b.kind == "line")
    assert loss_line.label.startswith("In [3], line 7: loss = ") and loss_line.count >= 3
    assert scene.items[scene.path[0]].name == "loss" and scene.path[0] in loss_line.children


def _curve_points(points, steps=12):
    out = []
    for (xa, ya), (xb, yb) in zip(points, points[1:]):
        dy = max(6.0, (yb - ya) / 2)
        for i in range(steps + 1):
            t = i / steps
            u = 1 - t
            if xa == xb or yb <= ya:
                out.append((xa + (xb - xa) * t, ya + (yb - ya) * t))
            else:
                out.append((u ** 3 * xa + 3 * u * u * t * xa + 3 * u * t * t * xb + t ** 3 * xb,
                            u ** 3 * ya + 3 * u * u * t * (ya + dy) + 3 * u * t * t * (yb - dy) + t ** 3 * yb))
    return out


@pytest.mark.parametrize("name", ["gpt2", "resnet", "rnn"])
def test_no_edge_runs_behind_a_node(name):
    """An edge that skips rows passes between the nodes of those rows (route points), so that
    no node seems to feed what the edge goes to."""
    scene = layout.build_scene(case(name))
    opened = [b for b in scene.boxes if b in scene.layers]
    placement = layout.place(scene, opened)
    at = placement.by_id()
    stand = layout.stand_map(scene, opened, at)
    solid = [p for p in placement.placed if not p.open]
    crossed = []
    for a, b, kind, _ in draw.edges_between(scene, stand):
        if at[b].y <= at[a].y:
            continue
        for px, py in _curve_points(draw.edge_path(scene, placement, a, b)):
            for p in solid:
                if p.id not in (a, b) and p.x + 2 < px < p.x + p.w - 2 and p.y + 2 < py < p.y + p.h - 2:
                    crossed.append((a, b, p.id))
    assert not crossed, sorted(set(crossed))[:10]


def test_edges_carry_the_shape_of_the_gradient_that_flows_along_them():
    trace = case("gpt2")
    w = AutogradWidget(trace)
    items = {row[0]: row for row in w.scene["items"]}
    tanh = next(i for i in w.scene["core"] if items[i][2] == "TanhBackward0")  # the adapter's
    into = [shape for u, v, kind, shape, _ in w.scene["edges"] if v == tanh and kind == "next"]
    assert into and set(into) == {"[2, 16, 16]"}
    assert any(edge[3] == "[2, 16, 100]" for edge in w.scene["edges"])  # the logits, into the loss's line


def test_two_things_of_one_name_say_which_is_which():
    x = torch.tensor([[1.0, 2.0]])
    w1 = torch.tensor([[2.0], [1.0]], requires_grad=True)
    w2 = torch.tensor([3.0], requires_grad=True)
    with pytest.raises(RuntimeError):
        with ja.capture() as trace:
            d = torch.matmul(x, w1)
            f = torch.matmul(d, w2)
            d[:] = 1
            f.backward()
    scene = layout.build_scene(trace)
    named_d = [x for x in scene.items.values() if x.name == "d"]
    assert len(named_d) == 2 and len({x.label for x in named_d}) == 2
    saved = next(x for x in named_d if x.kind == "saved")
    assert saved.label == "d (saved v0)" and "now v1" in saved.sub
