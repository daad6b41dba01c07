"""A torch.optim step is recorded as one op at the user's `opt.step()` line, with every parameter
it wrote and the state tensors it wrote that the block used (capture/steps.py): what it changes
is what the diagnosis needs,
and its own calls (ten per parameter for Adam) were most of what capture cost per training step.
Steps that can do more than write their parameters are still recorded call by call."""
from __future__ import annotations

import contextlib
import signal
import sys

import torch
import torch.nn.functional as F
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.capture import mode, steps
from jupyter_autograd.capture import state as capture_state


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
            assert params <= set(op.writes)  # every parameter
            assert len(op.write_ranges) == len(op.writes)
        # None of the optimizer's own calls is recorded as an op of its own.
        assert not [op for op in trace.ops if op.name in ("Tensor.addcdiv_", "Tensor.lerp_", "Tensor.add_")]
        assert trace.diagnoses == [] and trace.warnings == []


def test_state_tensors_no_op_of_the_block_used_are_not_tracked():
    """Adam's moments, written by every step but read by no op of the user's: no row, no write of the
    step's op (half the tensors of a real training step, and what the block's end checks one by one)."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    _train(model, opt, 1)  # the state exists before the block
    with ja.capture(namespace={"model": model}) as trace:
        _train(model, opt, 3)
    moments = {id(v) for state in opt.state.values() for k, v in state.items() if k.startswith("exp_avg")}
    assert len(moments) == 8
    used = {t for op in trace.ops if not op.name.endswith(".step") for t in op.inputs + op.outputs}
    assert all(t in used or info.is_parameter for t, info in trace.tensors.items()), \
        [info.shape for t, info in trace.tensors.items() if t not in used and not info.is_parameter]
    params = {t.tid for t in trace.tensors.values() if t.is_parameter}
    assert all(set(op.writes) == params for op in _step_ops(trace))


def test_a_state_tensor_the_graph_saved_is_still_written_by_the_step():
    """Used by the user's own graph (a loss reading Adam's first moment), the moment the step then
    changes in place is what PyTorch's backward refuses: the step is the culprit, at its line."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    _train(model, opt, 1)
    weight = model[2].weight

    def before_step():
        penalty = (weight * opt.state[weight]["exp_avg"]).sum()
        model(torch.randn(3, 4)).sum().backward()
        return penalty

    trace, raised = _backward_after_step(opt, {"model": model, "opt": opt}, before_step)
    assert raised is not None and "modified by an inplace operation" in str(raised)
    [found] = trace.diagnoses
    assert found.kind == "saved-tensor-modified" and found.source == "opt.step()"


def test_the_step_is_still_the_culprit_for_a_graph_that_needs_the_old_weights():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)

    def before_step():
        loss = model(x).sum()
        loss.backward(retain_graph=True)
        return loss

    trace, raised = _backward_after_step(opt, {"model": model}, before_step)
    assert raised is not None and "modified by an inplace operation" in str(raised)
    [found] = trace.diagnoses
    assert found.kind == "saved-tensor-modified" and found.source == "opt.step()"
    assert found.tensor == "model.2.weight" and found.predicted


def _backward_after_step(opt, namespace, before_step):
    """Under capture: `before_step()` (it returns a loss), `opt.step()`, then that loss's backward.
    (The trace, what that backward raised or None.)"""
    raised = None
    with ja.capture(namespace=namespace) as trace:
        loss = before_step()
        opt.step()
        try:
            loss.backward()
        except RuntimeError as exc:
            raised = exc
    return trace, raised


def _an_inplace_bug():
    """A real bug after a caught failure: it must be recorded and diagnosed at its line."""
    w = torch.ones(3, requires_grad=True)
    y = w.exp()
    y.add_(1)  # BUG
    try:
        y.sum().backward()
    except RuntimeError:
        pass


def test_a_step_that_raises_leaves_recording_on():
    emb = nn.Embedding(10, 3, sparse=True)
    opt = torch.optim.Adam(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with ja.capture(namespace={}) as trace:
        recorder = capture_state.thread_state.recorder
        try:
            opt.step()  # Adam refuses sparse gradients, from inside its step
        except RuntimeError as exc:
            assert "sparse" in str(exc)
        _an_inplace_bug()
    assert recorder.has_ended()  # inert after the block, as always
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


def _calls_reaching_the_mode(monkeypatch):
    calls = []
    original = mode.Recorder.__torch_function__

    def counting(self, func, types, args=(), kwargs=None):
        calls.append(func)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(mode.Recorder, "__torch_function__", counting)
    return calls


def test_a_step_runs_with_our_mode_off_the_stack(monkeypatch):
    """A torch.optim step's own calls (property reads included, a hundred for a small SGD step)
    never reach our mode: it leaves the stack in the step's pre-hook and comes back in its
    post-hook. The step is still one op, with what it wrote."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    seen_in_step = []
    opt.register_step_post_hook(lambda *args: seen_in_step.append(torch._C._len_torch_function_stack()))
    with ja.capture(namespace={"model": model}) as trace:
        depth = torch._C._len_torch_function_stack()
        F.mse_loss(model(x), y).backward()
        calls = _calls_reaching_the_mode(monkeypatch)
        opt.step()
        during = list(calls)
        after = torch._C._len_torch_function_stack()
        (model(x) * 2).sum()  # recorded again
    # Only the profiler scope that torch opens around the step, before its pre-hook and after its post-hook.
    assert during == [steps.PROFILER_ENTER, steps.PROFILER_EXIT]
    assert seen_in_step == [depth - 1] and after == depth
    [step] = _step_ops(trace)
    # The parameters: its first step makes the momentum buffers rather than writing them.
    assert step.name == "SGD.step" and len(step.writes) == 4
    assert trace.ops[-1].name == "Tensor.sum" and trace.warnings == []


def test_a_step_under_a_mode_of_the_users_is_seen_by_it_as_without_us():
    """With a mode of the user's above ours, ours stays where it is (taking it out from under
    theirs would reorder the stack): their mode sees the step's calls exactly as in a plain run."""
    from torch.overrides import TorchFunctionMode

    class Counting(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    def run(captured):
        model = _model()
        opt = torch.optim.Adam(model.parameters())
        F.mse_loss(model(torch.ones(2, 4)), torch.zeros(2, 1)).backward()
        mode = Counting()
        with ja.capture(namespace={}) if captured else contextlib.nullcontext() as trace:
            with mode:
                opt.step()
        return mode.names, [p.detach().clone() for p in model.parameters()], trace

    plain_names, plain_params, _ = run(False)
    names, params, trace = run(True)
    assert names == plain_names and len(names) > 10
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params))
    assert [op.name for op in _step_ops(trace)] == ["Adam.step"] and trace.warnings == []


def test_a_step_whose_post_hook_raises_puts_our_mode_back():
    """The step's own post-hook runs before ours: when it raises, the step leaves through its
    profiler scope, where our mode goes back on the stack. The bug after the caught failure is
    recorded and diagnosed."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def refuse(*args):
        raise ValueError("no step today")

    opt.register_step_post_hook(refuse)
    F.mse_loss(model(torch.ones(2, 4)), torch.zeros(2, 1)).backward()
    with ja.capture(namespace={}) as trace:
        depth = torch._C._len_torch_function_stack()
        try:
            opt.step()
        except ValueError:
            pass
        restored = torch._C._len_torch_function_stack()
        _an_inplace_bug()
    assert restored == depth
    assert [op.name for op in _step_ops(trace)] == ["SGD.step"]
    assert [(d.kind, d.source) for d in trace.diagnoses] == [("saved-tensor-modified", "y.add_(1)")]
    assert trace.warnings == []


def test_a_failed_step_missed_by_its_scope_is_met_at_the_next_module_call(monkeypatch):
    """Should the step's profiler scope not be recognised (another torch's name for it), the
    next module call finds the step still open: our mode goes back there, and the trace says
    that the calls in between were not recorded."""
    monkeypatch.setattr(steps, "STEP_SCOPE", "no such scope")
    emb = nn.Embedding(10, 3, sparse=True)
    opt = torch.optim.Adam(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    model = _model()
    with ja.capture(namespace={}) as trace:
        try:
            opt.step()  # Adam refuses sparse gradients, from inside its step
        except RuntimeError:
            pass
        torch.ones(2) * 3  # not recorded
        out = model(torch.ones(2, 4))
        out.exp_()  # recorded again
    assert [op.name for op in _step_ops(trace)] == ["Adam.step"]
    assert "Tensor.exp_" in [op.name for op in trace.ops] and "Tensor.mul" not in [op.name for op in trace.ops]
    [warning] = trace.warnings
    assert "optimizer step" in warning and "were not recorded" in warning


def test_an_interrupt_at_any_call_in_the_steps_hooks_leaves_nothing():
    """A SIGINT at every function entry inside our step hooks (where Python delivers a real
    one: it runs a signal's handler when a function starts, after a call, or on a loop's jump),
    one run each: the step stops, the block ends, and nothing of ours is left on the stack, in
    torch's hooks or in its torch-function state."""
    from tests.test_invisible import _interrupt_at_each_point

    codes = {fn.__code__ for fn in (steps.before_optimizer_step, steps.after_optimizer_step,
                                    steps.leaving_profiler_scope, steps.OptimizerSteps.note_parameters,
                                    steps.OptimizerSteps.begin, steps.OptimizerSteps.end, mode.Recorder.add_op)}
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def tracer(hit):
        def trace(frame, event, arg):  # function entries only, under one of our hooks
            f = frame
            while f is not None and f.f_code not in codes:
                f = f.f_back
            if f is not None:
                hit()
            return None
        return trace

    def block():
        with ja.capture():
            F.mse_loss(model(x), y).backward()
            opt.step()
            (model(x) * 2).sum()

    target, delivered, covered = _interrupt_at_each_point(block, tracer, 2000)
    print("interrupts aimed at the step's hooks: %d, delivered: %d" % (target - 1, delivered))
    assert covered and target > 20 and delivered >= target - 2
