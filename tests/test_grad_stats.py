"""trace.grad_stats(): gradient health per parameter and per module, on real models, against the
gradients PyTorch left in `.grad` (read here after the block, not by the tool)."""
import json
import math

import pytest
import torch
from torch import nn

import jupyter_autograd as ja


def mlp(depth, activation, width=64, init=None, seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layer = nn.Linear(width, width)
        if init is not None:
            init(layer)
        layers += [layer, activation()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def train(model, steps=1, lr=0.1, x=None):
    x = torch.randn(32, model[0].in_features) if x is None else x
    y = torch.randn(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
    return opt


def by_name(stats):
    return {p["name"]: p for p in stats["parameters"]}


def module(stats, name):
    return next(m for m in stats["modules"] if m["name"] == name)


def own_ratio(p):
    return (p.grad.norm() / p.norm()).item()


def test_norms_are_the_gradients_pytorch_left():
    model = mlp(3, nn.Tanh)
    with ja.capture() as trace:
        train(model)
    stats = trace.grad_stats()
    assert len(stats["steps"]) == 1 and trace.ops[stats["steps"][0]["op_index"]].is_backward
    params = by_name(stats)
    for name, p in model.named_parameters():
        entry = params["model." + name]
        assert entry["norms"][0] == pytest.approx(p.grad.norm().item(), rel=1e-5)
        assert entry["param_norm"] == pytest.approx(p.norm().item(), rel=1e-5)
        assert entry["ratio"] == pytest.approx(own_ratio(p), rel=1e-5)
        assert entry["module"] == "model." + name.rpartition(".")[0] and entry["shape"] == list(p.shape)
    # A module's norm is its parameters' gradients taken as one tensor.
    layer = module(stats, "model.2")
    assert layer["cls"] == "Linear" and layer["parameters"] == ["model.2.weight", "model.2.bias"]
    together = torch.cat([model[2].weight.grad.flatten(), model[2].bias.grad.flatten()]).norm().item()
    assert layer["norms"][0] == pytest.approx(together, rel=1e-5)
    assert module(stats, "model")["parameters"] == [n for n in params]


def test_a_healthy_model_has_no_flags():
    model = mlp(3, nn.ReLU)
    with ja.capture() as trace:
        train(model, steps=3)
    stats = trace.grad_stats()
    assert [p["flags"] for p in stats["parameters"]] == [[]] * 8
    assert all(not m["flags"] for m in stats["modules"])


def test_a_deep_sigmoid_network_has_vanishing_gradients_in_its_first_layers():
    model = mlp(12, nn.Sigmoid)
    with ja.capture() as trace:
        train(model)
    params = by_name(trace.grad_stats())
    # The oracle: the first layer's |g| / |p| is orders of magnitude below the last one's.
    assert own_ratio(model[0].weight) * 1e6 < own_ratio(model[-1].weight)
    assert "vanishing" in params["model.0.weight"]["flags"]
    assert "vanishing" not in params["model.24.weight"]["flags"]
    assert "vanishing" in module(trace.grad_stats(), "model.0")["flags"]
    assert all("exploding" not in p["flags"] for p in params.values())


def test_a_bad_initialisation_has_exploding_gradients():
    def wide(layer):
        nn.init.normal_(layer.weight, std=1.0)

    model = mlp(6, nn.ReLU, init=wide)
    with ja.capture() as trace:
        train(model, lr=1e-3)
    params = by_name(trace.grad_stats())
    exploding = {name for name, p in params.items() if "exploding" in p["flags"]}
    truly = {"model." + n for n, p in model.named_parameters() if own_ratio(p) > 100}
    assert truly and exploding == truly
    assert "exploding" in module(trace.grad_stats(), "model")["flags"]


def test_a_nan_gradient_is_marked_where_it_appeared():
    model = mlp(2, nn.Tanh)
    with ja.capture() as trace:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            out = model(torch.randn(8, 64))
            if step == 2:
                out = out - out.detach()  # exactly zero: sqrt's gradient at 0 is infinite
            out.pow(2).sum().sqrt().backward()
    stats = trace.grad_stats()
    assert len(stats["steps"]) == 3
    entry = by_name(stats)["model.0.weight"]
    assert not math.isfinite(entry["norms"][2]) and all(math.isfinite(n) for n in entry["norms"][:2])
    assert entry["nonfinite_at"] == 2 and "nan-or-inf" in entry["flags"]
    assert not torch.isfinite(model[0].weight.grad).all()  # the oracle
    assert any(d.kind == "nan-gradient" for d in trace.diagnoses)  # the check it replaced still holds


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
        self.aux_head = nn.Linear(4, 1)  # never used in forward

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def test_a_parameter_never_updated_is_marked():
    torch.manual_seed(0)
    model = TwoHeads()
    with ja.capture() as trace:
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    params = by_name(trace.grad_stats())
    assert model.aux_head.weight.grad is None  # the oracle
    assert params["model.aux_head.weight"]["flags"] == ["never-updated"]
    assert params["model.aux_head.weight"]["norms"] == [None]
    assert params["model.head.weight"]["flags"] == []
    assert module(trace.grad_stats(), "model.aux_head")["flags"] == ["never-updated"]


def test_norms_follow_the_checked_backward_calls_and_their_change():
    model = mlp(2, nn.Tanh)
    with ja.capture() as trace:
        train(model, steps=6)
    stats = trace.grad_stats()
    backwards = [op.index for op in trace.backward_calls()]
    # Calls 1, 2, 4 and the last (6) are read: the same passes as the NaN check.
    assert [s["op_index"] for s in stats["steps"]] == [backwards[i] for i in (0, 1, 3, 5)]
    entry = by_name(stats)["model.0.weight"]
    assert entry["norms"][-1] == pytest.approx(model[0].weight.grad.norm().item(), rel=1e-5)
    assert entry["change"] == pytest.approx(entry["norms"][-1] / entry["norms"][0])


def test_no_backward_no_stats_and_to_json_carries_them():
    model = mlp(1, nn.Tanh)
    with ja.capture() as trace:
        model(torch.randn(2, 64))
    assert trace.grad_stats()["steps"] == [] and trace.grad_stats()["parameters"] == []
    with ja.capture() as trace:
        train(model)
    carried = trace.to_json()["grad_stats"]
    assert json.loads(json.dumps(carried)) == trace.grad_stats()
