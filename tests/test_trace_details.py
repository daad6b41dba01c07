"""Details of the trace that were wrong on real code: complex gradients, nested tensors in JSON,
slots that were never saved, one node count everywhere, names that are certain or descriptions."""
import json
import warnings

import torch
from torch import nn

import jupyter_autograd as ja


def test_complex_gradient_is_summarised():
    z = torch.randn(3, dtype=torch.complex64, requires_grad=True)
    with ja.capture() as trace:
        loss = (z * z.conj()).real.sum()
        loss.backward()
    assert trace.warnings == []
    info = next(t for t in trace.tensors.values() if t.grad)
    assert "j" in info.grad


def test_nested_tensors_serialise_to_json():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with ja.capture() as trace:
            nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged,
                                            requires_grad=True)
            (nt * 2).values().sum().backward()
    text = json.dumps(trace.to_json())
    assert "tensors" in json.loads(text) and trace.warnings == []


def test_a_slot_never_saved_is_not_called_freed():
    w = torch.randn(3, requires_grad=True)
    c = torch.randn(3)
    with ja.capture() as trace:
        y = (c * w).sum()  # saves c (for w's gradient); w itself needs no saving
        y.backward()
    slots = [s for n in trace.nodes.values() for s in n.saved]
    assert slots and not any(s.freed for s in slots)


def test_one_node_count_everywhere():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with ja.capture() as trace:
        model(torch.randn(2, 3)).sum().backward()
    from jupyter_autograd.widget import AutogradWidget

    n = len(trace.nodes)
    assert "Graph: %d nodes" % n in trace.report()
    assert AutogradWidget(trace).node_count == n
    fn_nodes = [k for k, v in trace.graph.nodes(data=True) if v["kind"] == "fn"]
    assert len(fn_nodes) == n


def test_no_question_marks_in_any_diagnosis():
    def step():
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        loss = model(torch.randn(2, 3)).sum()
        for p in model.parameters():
            p.data.mul_(0.5)
        loss.backward()

    with ja.capture() as trace:
        step()
    assert trace.diagnoses
    for d in trace.diagnoses:
        assert "`?`" not in d.message and "?" not in (d.tensor or "") and all("?" not in a for a in d.also)


def test_meta_tensors_are_never_matched_by_memory():
    with torch.device("meta"):
        a = torch.randn(4, requires_grad=True)
        b = torch.randn(4)
    with ja.capture() as trace:
        y = (a * b).sum()
        b.data.add_(1)
    assert trace.diagnoses == []


def test_the_op_that_made_each_node_is_the_one_op_of_seq_finds():
    """build._made_by walks sorted keys and ranges together; it must agree with the recorder's
    bisect, including when a custom Function's inner calls are recorded before it."""
    import importlib

    build = importlib.import_module("jupyter_autograd.capture.build")
    capture_state = importlib.import_module("jupyter_autograd.capture.state")

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    for custom in (False, True):
        w = torch.ones(3, requires_grad=True)
        with ja.capture(namespace={}):
            recorder = capture_state.thread_state.recorder
            h = w
            for _ in range(20):
                h = (Double.apply(h) if custom else h * 2).tanh() + 1
            h.sum().backward()
            expected = {k: recorder.node_ranges.op_of_seq(k) for k in recorder.graph.nodes if k >= 0}
            made = build._made_by(recorder)
        assert len(expected) > 40
        assert made == {k: v for k, v in expected.items() if v is not None}


def test_made_by_falls_back_to_bisecting_when_ranges_are_out_of_order():
    import importlib

    build = importlib.import_module("jupyter_autograd.capture.build")
    mode = importlib.import_module("jupyter_autograd.capture.mode")
    records = importlib.import_module("jupyter_autograd.capture.records")
    stub = mode.Recorder()
    rows = [(4, 6, 1), (2, 8, 2), (9, 10, 3)]  # an outer call recorded after an inner one
    stub.node_ranges = records.NodeRanges(rows)
    stub.graph.nodes = {k: None for k in (-1, 2, 3, 4, 5, 7, 9, 11)}
    assert not stub.node_ranges.in_order()
    assert build._made_by(stub) == {k: v for k in stub.graph.nodes if k >= 0
                                    if (v := stub.node_ranges.op_of_seq(k)) is not None}
    stub.node_ranges = records.NodeRanges(sorted(rows))
    assert stub.node_ranges.in_order()
    assert build._made_by(stub) == {k: v for k in stub.graph.nodes if k >= 0
                                    if (v := stub.node_ranges.op_of_seq(k)) is not None}


def test_the_node_a_tensor_had_at_an_op_is_the_grad_fn_pytorch_gave_it():
    """model.queries.node_at, read against PyTorch's own grad_fn at each point of the program: a write
    under no_grad keeps the node a tensor had (a weight's AccumulateGrad, a result's MulBackward0),
    and a result of a node-making op that needs no grad (max's indices) has none."""
    from jupyter_autograd.model.queries import node_at

    w = torch.randn(4, requires_grad=True)
    seen = {}
    with ja.capture(namespace={"w": w}) as trace:
        h = w * 2
        with torch.no_grad():
            h.add_(1)
            w.mul_(0.5)
        seen["h"] = h.grad_fn.name()
        values, indices = h.max(0)
        seen["indices"] = indices.grad_fn
        z = (h * w).sum() + indices.float()
        z.backward()
    use = next(op for op in trace.ops if op.name == "Tensor.mul" and len(op.inputs) == 2)
    h_tid, w_tid = use.inputs
    assert trace.nodes[node_at(trace, h_tid, use.index)].name == seen["h"] == "MulBackward0"
    assert node_at(trace, w_tid, use.index) == -1 - w_tid and trace.nodes[-1 - w_tid].name == "AccumulateGrad"
    cast = next(op for op in trace.ops if op.name == "Tensor.float")
    assert seen["indices"] is None and node_at(trace, cast.inputs[0], cast.index) is None


def _run_order(root):
    """Hooks on every node of root's graph that note, as backward runs them, each node's name and
    sequence number (None for a leaf's AccumulateGrad, which has none of its own)."""
    ran, seen, stack = [], set(), [root.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        acc = type(node) is torch._C._functions.AccumulateGrad

        def note(grad_outputs, node=node, acc=acc):
            ran.append((node.name().rpartition("::")[2], None if acc else node._sequence_nr()))
        node.register_prehook(note)
        stack.extend(child for child, _ in node.next_functions)
    return ran


def test_engine_order_is_the_order_pytorchs_engine_runs_the_nodes():
    """queries.engine_order against PyTorch itself: a pre-hook on each node notes when the engine runs
    it (one CPU thread), on graphs with skip connections, shared inputs, a node feeding another twice
    and leaves met at several depths."""
    from jupyter_autograd.model.queries import engine_order
    torch.manual_seed(0)

    def branches(w, b, x):
        h = torch.tanh(x @ w)
        return ((h * h).sum() + (h + b).relu().mean() + (x @ w).sum()) * 2

    def residual(w, b, x):
        h = x
        for _ in range(3):
            h = h + torch.relu(h @ w + b)  # the skip connection and the block meet again
        return h.pow(2).sum()

    def shared(w, b, x):
        y = w * w  # one node feeding the next twice
        return (y.exp() * y.sin()).sum() + (b * w.sum()).sum()

    for build in (branches, residual, shared):
        w = torch.randn(4, 4, requires_grad=True)
        b = torch.randn(4, requires_grad=True)
        x = torch.randn(3, 4)
        with ja.capture() as trace:
            loss = build(w, b, x)
            ran = _run_order(loss)
            loss.backward()
        cp = next(cp for cp in trace.checkpoints if cp.kind == "backward")
        predicted = [(trace.nodes[k].name, None if k < 0 else k) for k in engine_order(trace, cp)]
        # The leaves' AccumulateGrad nodes have no number: among several ready at once, either may go first.
        assert [r for r in ran if r[1] is not None] == [p for p in predicted if p[1] is not None], build.__name__
        assert [i for i, r in enumerate(ran) if r[1] is None] == [i for i, p in enumerate(predicted) if p[1] is None]
