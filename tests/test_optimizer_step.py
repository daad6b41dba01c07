"""A torch.optim step is recorded as one op at the user's `opt.step()` line, with every parameter
and state tensor it wrote (recorder.begin_step): what it changes is what the diagnosis needs,
and its own calls (ten per parameter for Adam) were most of what capture cost per training step.
Steps that can do more than write their parameters are still recorded call by call."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.capture import recorder as recorder_module


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _train(model, opt, steps):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(steps):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()  # STEP
    return [p.detach().clone() for p in model.parameters()]


def _step_ops(trace):
    return [op for op in trace.ops if op.name.endswith(".step")]


def _line_of(marker):
    import inspect
    lines, start = inspect.getsourcelines(_train)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def test_each_step_is_one_op_at_the_users_line_with_what_it_wrote():
    for make in (lambda ps: torch.optim.Adam(ps, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                 lambda ps: torch.optim.AdamW(ps, lr=0.1)):
        plain_model = _model()
        plain = _train(plain_model, make(plain_model.parameters()), 3)
        model = _model()
        opt = make(model.parameters())
        with ja.capture(namespace={"model": model}) as trace:
            captured = _train(model, opt, 3)
        assert all(torch.equal(a, b) for a, b in zip(plain, captured))
        steps = _step_ops(trace)
        assert len(steps) == 3, [op.name for op in trace.ops]
        assert {op.location.line for op in steps} == {_line_of("# STEP")}
        assert steps[0].name == "%s.step" % type(opt).__name__
        params = {t.tid for t in trace.tensors.values() if t.name and t.name.startswith("model.")}
        assert len(params) == 4
        for op in steps:
            assert params <= set(op.writes)  # every parameter, plus the optimizer's state tensors
            assert len(op.write_ranges) == len(op.writes)
        # None of the optimizer's own calls is recorded as an op of its own.
        assert not [op for op in trace.ops if op.name in ("Tensor.addcdiv_", "Tensor.lerp_", "Tensor.add_")]
        assert trace.diagnoses == [] and trace.warnings == []


def test_the_step_is_still_the_culprit_for_a_graph_that_needs_the_old_weights():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    raised = None
    with ja.capture(namespace={"model": model}) as trace:
        loss = model(x).sum()
        loss.backward(retain_graph=True)
        opt.step()
        try:
            loss.backward()
        except RuntimeError as exc:
            raised = exc
    assert raised is not None and "modified by an inplace operation" in str(raised)
    [found] = trace.diagnoses
    assert found.kind == "saved-tensor-modified" and found.source == "opt.step()"
    assert found.tensor == "model.2.weight" and found.predicted


def test_a_step_that_raises_leaves_recording_on():
    emb = nn.Embedding(10, 3, sparse=True)
    opt = torch.optim.Adam(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with ja.capture(namespace={}) as trace:
        recorder = recorder_module._state.recorder
        try:
            opt.step()  # Adam refuses sparse gradients, from inside its step
        except RuntimeError as exc:
            assert "sparse" in str(exc)
        w = torch.ones(3, requires_grad=True)
        y = w.exp()
        y.add_(1)  # BUG
        try:
            y.sum().backward()
        except RuntimeError:
            pass
    assert recorder.off is not None  # inert after the block, as always
    assert [op.name for op in _step_ops(trace)] == ["Adam.step"]
    assert [(d.kind, d.source) for d in trace.diagnoses] == [("saved-tensor-modified", "y.add_(1)")]
    assert trace.warnings == []


def test_a_step_with_a_closure_records_the_forward_and_backward_inside_it():
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=2)
    x, y = torch.randn(8, 4), torch.randn(8, 1)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with ja.capture(namespace={"model": model}) as trace:
        opt.step(closure)
    assert _step_ops(trace) == []
    sources = {op.location.source for op in trace.ops if op.location is not None}
    assert {"loss = F.mse_loss(model(x), y)", "loss.backward()"} <= sources
    assert sum(op.is_backward for op in trace.ops) >= 2
    assert any(op.writes for op in trace.ops)  # LBFGS writes the parameters, call by call


class _HandWritten(torch.optim.Optimizer):
    """A user's own optimizer: its step may write anything, so it is recorded call by call."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])
        return None


def test_an_optimizer_with_its_own_step_is_recorded_call_by_call():
    model = _model()
    with ja.capture(namespace={"model": model}) as trace:
        _train(model, _HandWritten(model.parameters(), 0.1), 2)
    assert _step_ops(trace) == []
    writes = [op for op in trace.ops if op.name == "Tensor.add_" and op.writes]
    assert len(writes) == 8 and {op.location.source for op in writes} == {'p.add_(p.grad, alpha=-group["lr"])'}


def test_a_differentiable_optimizer_is_recorded_call_by_call():
    """Its step runs with grad mode on and can make graph nodes: no summary. (Plain tensors, as
    a differentiable step may not write a leaf that requires grad.)"""
    weights = [torch.zeros(3), torch.zeros(2)]
    for w in weights:
        w.grad = torch.ones_like(w)
    opt = torch.optim.SGD(weights, lr=0.1, differentiable=True)
    with ja.capture(namespace={}) as trace:
        opt.step()
    assert _step_ops(trace) == []
    assert len([op for op in trace.ops if op.writes and op.location.source == "opt.step()"]) == 2
    assert torch.equal(weights[0], torch.full((3,), -0.1))


class _Wrapping(torch.optim.SGD):
    """A step that runs another optimizer's step inside its own (torch's own step code for both)."""

    def __init__(self, params, inner):
        super().__init__(params, lr=0.1)
        self.inner = inner

    def step(self, closure=None):
        self.inner.step()
        return super().step(closure)

    step.__module__ = "torch.optim.sgd"  # as if torch's: the outer step is summarised too


def test_a_step_inside_another_ends_only_its_own():
    model = _model()
    first, second = list(model.parameters())[:2], list(model.parameters())[2:]
    opt = _Wrapping(first, torch.optim.Adam(second, lr=0.1))
    x = torch.randn(3, 4)
    with ja.capture(namespace={"model": model}) as trace:
        model(x).sum().backward()
        opt.step()
        after = torch.ones(2) * 3  # recorded as usual once the outer step is over
    steps = _step_ops(trace)
    assert [op.name for op in steps] == ["_Wrapping.step"]
    assert {trace.tensors[t].name for t in steps[0].writes if trace.tensors[t].name} >= {
        "model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"}
    assert [op.location.source for op in trace.ops][-1] == "after = torch.ones(2) * 3"
    assert trace.diagnoses == [] and trace.warnings == []
