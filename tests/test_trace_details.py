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
