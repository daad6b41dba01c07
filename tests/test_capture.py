"""The Python API: what is recorded, what is left behind, how failures degrade."""
import gc
import json
import subprocess
import sys
import threading
import weakref

import networkx as nx
import pytest
import torch
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.capture import mode as mode_module


def _torch_state():
    return (torch._C._len_torch_function_stack(), torch.is_grad_enabled(), torch.is_anomaly_enabled(),
            torch.autograd.function.Function.__dict__["apply"],
            torch.autograd.profiler.record_function.__dict__["__exit__"])


def test_import_pulls_in_neither_ipython_nor_ipywidgets():
    code = "import sys, jupyter_autograd; print('IPython' in sys.modules, 'ipywidgets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_records_ops_with_lines_versions_and_writes():
    x = torch.ones(3, requires_grad=True)
    with ja.capture() as trace:
        y = x * 2            # line A
        y += 1               # line B: writes y
        with torch.no_grad():
            y.mul_(3)        # a write under no_grad is recorded too
        z = y.sum()
        z.backward()
    names = [op.name for op in trace.ops]
    assert "Tensor.mul" in names and "Tensor.add_" in names and "Tensor.mul_" in names
    assert "Tensor.backward" in names and trace.backward_calls()
    add = next(op for op in trace.ops if op.name == "Tensor.add_")
    assert add.location.source == "y += 1               # line B: writes y".split("#")[0].strip()
    assert add.writes and add.versions_after[0] == add.versions_before[0] + 1
    mul_ = next(op for op in trace.ops if op.name == "Tensor.mul_")
    assert mul_.grad_enabled is False and mul_.writes
    info = trace.tensors[add.writes[0]]
    assert info.name == "y" and [v for _, v in info.versions] == [0, 1, 2]
    assert trace.diagnoses == []


def test_graph_has_leaves_saved_tensors_and_names():
    with ja.capture() as trace:
        inp = torch.ones(2, 2)
        w1 = torch.tensor(2.0, requires_grad=True)
        w2 = torch.tensor(3.0, requires_grad=True)
        l1 = inp * w1
        l2 = l1 * w2
        loss = l2.mean()
    g = trace.graph
    assert isinstance(g, nx.DiGraph)
    leaves = {d["label"] for _, d in g.nodes(data=True) if d["kind"] == "leaf"}
    assert leaves == {"w1", "w2"}
    fns = sorted(d["label"] for _, d in g.nodes(data=True) if d["kind"] == "fn")
    assert fns == ["AccumulateGrad", "AccumulateGrad", "MeanBackward0", "MulBackward0", "MulBackward0"]
    saved = {d["label"] for _, d in g.nodes(data=True) if d["kind"] == "saved"}
    assert {"l1", "inp"} <= saved
    assert nx.is_directed_acyclic_graph(g)
    json.dumps(trace.to_json())  # plain data all the way down


def test_module_parameters_get_dotted_names_and_module_line():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with ja.capture(namespace=locals()) as trace:  # inside a function, say where the names are
        out = net(torch.randn(5, 3))  # the line every op inside the model is attributed to
    lines = {op.location.source for op in trace.ops}
    assert lines == {"out = net(torch.randn(5, 3))  # the line every op inside the model is attributed to".split("  #")[0]}
    named = {trace.tensors[n.variable].name for n in trace.nodes.values() if n.variable is not None}
    assert named == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}


def test_user_module_forward_lines_are_inside_the_user_code():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            h = self.lin(x)
            return torch.sigmoid(h)

    block = Block()
    with ja.capture() as trace:
        block(torch.randn(1, 2))
    assert [op.location.source for op in trace.ops if op.name in ("F.linear", "torch.sigmoid")] == [
        "h = self.lin(x)", "return torch.sigmoid(h)"]


def test_no_user_tensor_outlives_its_variables():
    refs = []
    with ja.capture() as trace:
        a = torch.randn(100, requires_grad=True)
        b = a.exp()
        c = b * a
        c.sum().backward()
        d = a.sigmoid()      # a live graph with a saved output, never backpropagated
        d.data.mul_(2)       # a silent mutation: the diagnosis must not hold d either
    refs = [weakref.ref(t) for t in (a, b, c, d)]
    assert trace.diagnoses and trace.diagnoses[0].kind == "silent-data-mutation"
    del a, b, c, d
    gc.collect()
    assert [r() for r in refs] == [None, None, None, None]
    assert len(trace.ops) > 0 and trace.tensors  # the trace itself is intact


def test_state_restored_after_user_exception_and_exception_untouched():
    before = _torch_state()
    err = ValueError("mine")
    with pytest.raises(ValueError) as info:
        with ja.capture() as trace:
            torch.ones(2).sum()
            raise err
    assert info.value is err
    assert _torch_state() == before
    assert trace.error == "ValueError: mine" and trace.ops


def test_traceback_has_no_frame_of_ours():
    a = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError) as info:
        with ja.capture():
            a.add_(1)
    files = [tb.tb_frame.f_code.co_filename for tb in _walk(info.value.__traceback__)]
    assert not any("jupyter_autograd" + "/capture/" in f for f in files)
    assert files[-1] == __file__


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_keyboard_interrupt_propagates_and_restores_state():
    before = _torch_state()
    with pytest.raises(KeyboardInterrupt):
        with ja.capture():
            torch.ones(2) * 2
            raise KeyboardInterrupt
    assert _torch_state() == before


def test_grad_and_anomaly_mode_are_left_as_they_were():
    with torch.autograd.set_detect_anomaly(True, check_nan=False):
        with torch.no_grad():
            with ja.capture():
                torch.ones(2) * 2
            assert not torch.is_grad_enabled() and torch.is_anomaly_enabled()


def test_nested_capture_records_once():
    with ja.capture() as outer:
        x = torch.ones(2, requires_grad=True)
        with ja.capture() as inner:
            y = x * 3
        z = y.sum()
    assert [op.name for op in outer.ops].count("Tensor.mul") == 1
    assert [op.name for op in inner.ops].count("Tensor.mul") == 1
    assert torch._C._len_torch_function_stack() == 0


def test_internal_failure_never_reaches_the_user(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("bug in the tool")

    monkeypatch.setattr(mode_module.Recorder, "record", broken)
    x = torch.ones(3, requires_grad=True)
    with ja.capture() as trace:
        y = (x * 2).sum()
        y.backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    assert any("bug in the tool" in w for w in trace.warnings)


def test_analysis_failure_degrades_to_a_warning(monkeypatch):
    import jupyter_autograd.diagnose as diagnose_module

    monkeypatch.setattr(diagnose_module, "diagnose", lambda trace: 1 / 0)
    with ja.capture() as trace:
        y = torch.ones(2) * 2
    assert torch.equal(y, torch.full((2,), 2.0))
    with pytest.warns(RuntimeWarning, match="could not analyse"):  # the analysis runs on first read
        assert trace.warnings and trace.ops == []


def test_trace_is_built_on_first_read():
    with ja.capture() as trace:
        torch.ones(2) * 2
    assert "_pending" in trace.__dict__ and "ops" not in trace.__dict__
    assert [op.name for op in trace.ops] == ["torch.ones", "Tensor.mul"]
    assert "_pending" not in trace.__dict__


def test_other_threads_are_not_recorded():
    seen = []

    def work():
        seen.append(torch.ones(2) * 5)

    with ja.capture() as trace:
        t = threading.Thread(target=work)
        t.start()
        t.join()
        torch.ones(2) * 7
    assert len(seen) == 1
    assert sum(op.name == "Tensor.mul" for op in trace.ops) == 1


def test_names_inside_functions_come_from_assignments_without_leaking():
    def step(x):
        with ja.capture() as trace:
            hidden = x.exp()
            out = hidden * 2
        return trace, weakref.ref(hidden)

    trace, ref = step(torch.ones(2, requires_grad=True))
    gc.collect()
    assert ref() is None
    assert {t.name for t in trace.tensors.values()} >= {"hidden", "out"}


class _Doubler(nn.Module):
    """A module the user wrote: its ops run at the lines of this forward, none at the caller's."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, state=None):
        h = self.lin(x)
        return h * 2, h.tanh()


class _Holder:
    pass


def test_what_a_user_written_module_returns_is_named_at_the_line_that_called_it():
    def step(model, holder):
        with ja.capture() as trace:
            x = torch.randn(2, 3)
            out, holder.state = model(x, (x, x))
            holder.scale = out.sum() * 3
        return trace, weakref.ref(model)

    holder = _Holder()
    trace, model_ref = step(_Doubler(), holder)
    gc.collect()
    assert model_ref() is None  # the calls are kept as plain data: the module is not held
    names = {t.name for t in trace.tensors.values()}
    assert {"out", "holder.state", "holder.scale", "h"} <= names
    [call] = trace.calls
    assert call.location.source == "out, holder.state = model(x, (x, x))"
    assert call.module == ("model",) and call.columns is not None
    x = next(t.tid for t in trace.tensors.values() if t.name == "x")
    assert call.inputs == (x, x, x)
    assert [trace.tensors[t].name for t in call.outputs] == ["out", "holder.state"]
    assert all(call.first_op <= op.index < call.end_op for op in trace.ops if op.module)


def test_a_call_of_a_user_module_that_raises_leaves_no_call_open():
    class Broken(nn.Module):
        def forward(self, x):
            y = x * 2
            raise ValueError("inside forward")

    def step(model):
        with ja.capture() as trace:
            with pytest.raises(ValueError):
                model(torch.ones(2))
            z = torch.ones(2) + 1
        return trace

    trace = step(Broken())
    assert not trace.warnings and [call.outputs for call in trace.calls] == [()]
    assert trace.tensors[trace.ops[-1].outputs[0]].name == "z"


def test_bad_namespace_argument_says_what_to_do():
    with pytest.raises(TypeError, match="dict or a list of dicts"):
        ja.capture(namespace=42)


def test_custom_function_apply_is_recorded_and_restored():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    original = torch.autograd.function.Function.__dict__["apply"]
    with ja.capture() as trace:
        y = Double.apply(torch.ones(2, requires_grad=True))
    assert torch.autograd.function.Function.__dict__["apply"] is original
    assert "Double.apply" in [op.name for op in trace.ops]
    assert y.grad_fn.name() == "DoubleBackward"


def test_torch_compile_is_left_alone():
    def f(x):
        return torch.sin(x) * 2 + x

    compiled = torch.compile(f, backend="eager")
    x = torch.linspace(0, 1, 5)
    expected = f(x)
    with ja.capture():
        got = compiled(x)
    assert torch.allclose(got, expected)


def test_retain_graph_and_second_backward_are_fine():
    x = torch.randn(3, requires_grad=True)
    with ja.capture() as trace:
        y = (x.exp() * x).sum()
        y.backward(retain_graph=True)
        y.backward()
    assert trace.diagnoses == []
    assert len(trace.backward_calls()) == 2
    assert torch.allclose(x.grad, 2 * (x.exp() * x + x.exp()))


def test_report_names_both_lines_and_versions():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError):
        with ja.capture() as trace:
            y = x.exp()
            y += 1
            y.sum().backward()
    (d,) = trace.diagnoses
    assert (d.kind, d.tensor, d.node, d.saved_version, d.current_version) == (
        "saved-tensor-modified", "y", "ExpBackward0", 0, 1)
    assert d.source == "y += 1" and d.saved_source == "y = x.exp()"
    assert "y = y + 1" in d.fix
    report = trace.report()
    assert "line %d: y += 1" % d.line in report and "saved at 0, now 1" in report


def test_module_hooks_are_removed_and_survive_a_failing_forward():
    from torch.nn.modules import module as nn_module

    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("inside forward")

    net = nn.Sequential(nn.Linear(2, 2), Broken())
    lin = nn.Linear(2, 2)
    with ja.capture(namespace={"net": net, "lin": lin}) as trace:
        with pytest.raises(ValueError):
            net(torch.ones(1, 2))
        lin(torch.ones(1, 2))  # after the failure the module path is right again
    assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks
    assert [op.module for op in trace.ops if op.name == "F.linear"] == [("net", "net.0"), ("lin",)]


def test_backward_arguments_are_bound_as_signature_bind_binds_them():
    """The recorder binds backward()'s arguments without Signature.bind on well-formed calls:
    the same names, every way a call can pass them."""
    import inspect

    from jupyter_autograd.capture.backward import bind_backward as _bind_backward

    t, x = torch.ones(2), torch.ones(2)
    calls = [
        (torch.Tensor.backward, (t,), {}),
        (torch.Tensor.backward, (t,), dict(gradient=None, retain_graph=None, create_graph=False, inputs=None)),
        (torch.Tensor.backward, (t, x, True), {}),
        (torch.Tensor.backward, (t,), dict(retain_graph=True)),
        (torch.autograd.backward, ([t],), dict(grad_tensors=None, retain_graph=True)),
        (torch.autograd.backward, (), dict(tensors=[t], inputs=[x])),
        (torch.autograd.grad, ([t], [x]), dict(allow_unused=True)),
        (torch.autograd.grad, ([t],), dict(inputs=[x], create_graph=True)),
    ]
    for func, args, kwargs in calls:
        expected = dict(inspect.signature(func).bind(*args, **kwargs).arguments)
        assert _bind_backward(func, args, kwargs) == expected, (func, args, kwargs)
    # Malformed calls fall back to Signature.bind, which refuses them: backward itself will say so.
    assert _bind_backward(torch.Tensor.backward, (t,), dict(self=t)) == {}
    assert _bind_backward(torch.Tensor.backward, (t,), dict(bogus=1)) == {}
    assert _bind_backward(torch.Tensor.backward, (t, None, None, False, None, 1), {}) == {}


def test_a_view_whose_base_is_first_seen_through_it_keeps_every_row_its_own():
    # The base is registered while its view is: it must not take the row the view had reserved.
    w = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
        with ja.capture(namespace={"w": w}) as trace:
            w[0].mul_(2)
    base, view = trace.tensors[0], trace.tensors[1]
    assert (base.name, base.shape, base.is_leaf, base.base) == ("w", (3, 4), True, None)
    assert (view.shape, view.is_leaf, view.base) == ((4,), False, 0)
    assert [(d.kind, d.tensor) for d in trace.diagnoses] == [("leaf-inplace", "w")]


class _AddsOne(nn.Module):
    def forward(self, table):
        return table + 1


def test_globals_of_a_function_whose_first_call_is_a_user_module_still_name_its_tensors():
    """The first frame of a function met on the way to a user-written module's caller is code of
    the user's like any other: its globals name tensors (here the only name `table` has)."""
    space = {"net": _AddsOne(), "table": torch.ones(3, requires_grad=True)}
    exec(compile("def f():\n    return net(table)\n", "<user module>", "exec"), space)
    f = space.pop("f")
    with ja.capture(namespace={}) as trace:
        out = f()
    assert out.requires_grad
    assert "table" in {t.name for t in trace.tensors.values()}


def test_a_model_that_a_library_calls_is_not_named_after_the_call_into_the_library():
    """`out = checkpoint(net, x)` calls `checkpoint`, which calls the model: the line names the
    library's function, not the model (as `trainer.train()` does for a Trainer's model)."""
    from torch.utils.checkpoint import checkpoint

    def step():
        net = torch.nn.Sequential(torch.nn.Linear(3, 3))
        out = checkpoint(net, torch.randn(2, 3, requires_grad=True), use_reentrant=False)
        out.sum().backward()

    with ja.capture() as trace:
        step()
    names = {t.name for t in trace.tensors.values() if t.is_parameter}
    assert names and not any(n.startswith("checkpoint") for n in names), names
