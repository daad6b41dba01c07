"""Errors torch raises inside the block about a property of a tensor or a call, named at what gave it
that property (diagnose/rules/causes.py), and a cut named where grad was switched off, a decorator
included (diagnose/rules/cuts.py).

Each program runs from a file of its own, plain and under capture(): PyTorch raises the same error in
both. The oracle for the line a diagnosis names is not the tool: the program changed at that line (the
decorator removed, the call given use_reentrant=False, the tensor made a leaf that requires grad, the
freeze removed) runs, and changing the line that raised does not do it where the cause is elsewhere.
Where the fix is a one-line replacement, the program with it applied runs too.
"""
import textwrap

import pytest
import torch

import jupyter_autograd as ja
from jupyter_autograd.diagnose import fixes

from .test_error_kinds import diagnosed, lines, run


def runs(path, source):
    """Whether the program, written at `path`, runs to its end without an exception (plain PyTorch)."""
    exc, _, _ = run(path, source, captured=False)
    return exc is None


def without_line(source, number):
    kept = textwrap.dedent(source).splitlines()
    del kept[number - 1]
    return "\n".join(kept) + "\n"


def with_line(source, number, text):
    kept = textwrap.dedent(source).splitlines()
    indent = kept[number - 1][:len(kept[number - 1]) - len(kept[number - 1].lstrip())]
    kept[number - 1] = indent + text
    return "\n".join(kept) + "\n"


def replacement(fix):
    head, sep, rest = fix.partition(fixes.REPLACE + "\n")
    if not sep:
        return None
    return textwrap.dedent("\n".join(line for line in rest.splitlines() if line.startswith("    ")))


# -- principle 3: the line of a cut is where grad was switched off --------------------------------

DECORATED_METHOD = """
    import torch
    from torch import nn


    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Linear(4, 3)

        @torch.no_grad()
        def features(self, x):
            return torch.relu(self.backbone(x))


    encoder = Encoder()
    loss = encoder.features(torch.randn(2, 4)).pow(2).sum()
    loss.backward()
"""


@pytest.mark.parametrize("decorator", ["@torch.no_grad()", "@torch.inference_mode()",
                                       "@torch.set_grad_enabled(False)"])
def test_a_decorator_on_a_method_is_the_cut_not_a_line_inside_it(tmp_path, decorator):
    source = DECORATED_METHOD.replace("@torch.no_grad()", decorator)
    d, path = diagnosed(tmp_path, source, "graph-cut")
    [line] = lines(path, decorator)
    assert d.line == line, (d.line, d.message)
    assert decorator in d.message and "features()" in d.message
    # The oracle: without the decorator the program trains; the line the old diagnosis named is the
    # function's body, which cannot be changed to make it run.
    assert runs(tmp_path / "fixed.py", without_line(source, line))


def test_a_decorated_helper_function_is_the_cut(tmp_path):
    source = """
        import torch
        from torch import nn

        encoder = nn.Linear(4, 3)


        @torch.no_grad()
        def encode(x):
            return encoder(x)


        z = encode(torch.randn(2, 4))
        loss = z.pow(2).mean()
        loss.backward()
    """
    d, path = diagnosed(tmp_path, source, "graph-cut")
    [line] = lines(path, "@torch.no_grad()")
    assert d.line == line
    assert runs(tmp_path / "fixed.py", without_line(source, line))


def test_a_with_block_in_the_same_function_still_names_the_line_inside_it(tmp_path):
    """No decorator: a `with` block around the op in its own function names the op's line (the line to
    move out of the block), as before."""
    source = """
        import torch
        from torch import nn

        lin = nn.Linear(4, 2)
        with torch.no_grad():
            out = lin(torch.randn(3, 4))
        out.sum().backward()
    """
    d, path = diagnosed(tmp_path, source, "graph-cut")
    assert d.line == lines(path, "out = lin(torch.randn(3, 4))")[0]


def test_a_hook_on_the_output_of_a_decorated_method_names_the_decorator(tmp_path):
    source = """
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 2, 3)

            @torch.no_grad()
            def forward(self, x):
                return self.conv(x)


        net = Net()
        out = net(torch.randn(1, 1, 5, 5))
        out.register_hook(lambda g: g)
    """
    d, path = diagnosed(tmp_path, source, "needs-grad")
    decorator, hook = lines(path, "@torch.no_grad()", "out.register_hook(lambda g: g)")
    assert (d.line, d.saved_line) == (decorator, hook), (d.line, d.saved_line)
    assert runs(tmp_path / "fixed.py", without_line(source, decorator))


# -- needs-grad ------------------------------------------------------------------------------------

def test_autograd_grad_of_detached_features_names_the_detach(tmp_path):
    source = """
        import torch
        from torch import nn

        frontend, encoder = nn.Linear(6, 4), nn.Linear(4, 2)
        wav = torch.randn(3, 6, requires_grad=True)
        feats = frontend(wav).detach()
        loss = encoder(feats).pow(2).mean()
        saliency, = torch.autograd.grad(loss, feats)
    """
    d, path = diagnosed(tmp_path, source, "needs-grad")
    cut, raising = lines(path, "feats = frontend(wav).detach()", "saliency, = torch.autograd.grad(loss, feats)")
    assert (d.line, d.saved_line, d.tensor) == (cut, raising, "feats")
    fixed = with_line(source, cut, replacement(d.fix))
    assert "detach" not in fixed and runs(tmp_path / "fixed.py", fixed)


def test_a_tensor_of_data_made_without_requires_grad_is_made_a_leaf_where_it_is_made(tmp_path):
    """A PINN-style derivative with respect to an input that was made without requires_grad."""
    source = """
        import torch
        from torch import nn

        net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
        x = torch.linspace(0, 1, 10).reshape(-1, 1)
        u = net(x)
        u_x, = torch.autograd.grad(u, x, grad_outputs=torch.ones_like(u), create_graph=True)
    """
    d, path = diagnosed(tmp_path, source, "needs-grad")
    made, raising = lines(path, "x = torch.linspace(0, 1, 10).reshape(-1, 1)",
                          "u_x, = torch.autograd.grad(u, x, grad_outputs=torch.ones_like(u), create_graph=True)")
    assert (d.line, d.saved_line, d.tensor) == (made, raising, "x")
    assert runs(tmp_path / "fixed.py", with_line(source, made, replacement(d.fix)))


def test_a_parameter_frozen_in_a_helper_is_named_where_it_was_frozen(tmp_path):
    source = """
        import torch
        from torch import nn


        def freeze(module):
            for p in module.parameters():
                p.requires_grad_(False)


        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        freeze(model[0])
        loss = model(torch.randn(2, 4)).sum()
        grads = torch.autograd.grad(loss, list(model.parameters()))
    """
    d, path = diagnosed(tmp_path, source, "needs-grad")
    frozen, raising = lines(path, "p.requires_grad_(False)",
                            "grads = torch.autograd.grad(loss, list(model.parameters()))")
    assert (d.line, d.saved_line, d.tensor) == (frozen, raising, "model.0.weight")
    assert runs(tmp_path / "fixed.py", with_line(source, frozen, "pass"))
    # The parameter's gradients asked for are the fix's example; they run.
    assert "[p for p in list(model.parameters()) if p.requires_grad]" in d.fix


def test_autograd_grad_for_an_input_made_without_requires_grad_names_where_it_was_made(tmp_path):
    """Before, the floor named the loss's line (backward-error): the cause is where `b` was made."""
    source = """
        import torch

        w, b = torch.randn(3, requires_grad=True), torch.randn(3)
        loss = (w * b).sum()
        torch.autograd.grad(loss, [w, b])
    """
    d, path = diagnosed(tmp_path, source, "needs-grad")
    made, raising = lines(path, "w, b = torch.randn(3, requires_grad=True), torch.randn(3)",
                          "torch.autograd.grad(loss, [w, b])")
    assert (d.line, d.saved_line, d.tensor) == (made, raising, "b")
    fixed = with_line(source, made, "w, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)")
    assert runs(tmp_path / "fixed.py", fixed)
    assert not runs(tmp_path / "floor.py", with_line(source, raising - 1, "loss = (w * b.detach()).sum()"))


def test_a_tensor_made_before_the_block_is_untraced_and_named_at_the_line_that_raised(tmp_path):
    path = tmp_path / "program.py"
    path.write_text("def hook_it(t):\n    t.register_hook(lambda g: g)\n")
    code = compile(path.read_text(), str(path), "exec")
    namespace = {}
    exec(code, namespace)
    features = torch.randn(3)  # made before the block: nothing recorded about it
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        with ja.capture() as trace:
            namespace["hook_it"](features)
    [d] = trace.diagnoses
    assert (d.kind, d.line) == ("needs-grad", 2)
    assert "could not trace" in d.message


def test_an_error_the_program_caught_gets_no_finding(tmp_path):
    source = """
        import torch
        from torch import nn

        lin = nn.Linear(3, 2)
        out = lin(torch.randn(4, 3))
        try:
            values = out.numpy()
        except RuntimeError:
            values = out.detach().numpy()
        out.sum().backward()
    """
    exc, trace, _ = run(tmp_path / "program.py", source, captured=True)
    assert exc is None and trace.diagnoses == []


# -- grad-to-numpy, nonleaf-copied, not-a-parameter ------------------------------------------------

def test_numpy_of_a_model_output_names_the_line_and_where_its_history_began(tmp_path):
    source = """
        import torch
        from torch import nn


        class Probe(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 2)

            def forward(self, x):
                return torch.sigmoid(self.lin(x))


        probe = Probe()
        scores = probe(torch.randn(3, 4))
        table = scores.numpy()
    """
    d, path = diagnosed(tmp_path, source, "grad-to-numpy")
    began, raising = lines(path, "scores = probe(torch.randn(3, 4))", "table = scores.numpy()")
    assert (d.line, d.saved_line, d.tensor) == (raising, began, "scores")
    assert replacement(d.fix) == "table = scores.detach().numpy()"
    assert runs(tmp_path / "fixed.py", with_line(source, raising, replacement(d.fix)))


def test_numpy_of_a_copy_to_another_device_or_dtype_names_the_tensor_copied(tmp_path):
    """`array.cpu().numpy()` of a tensor on a GPU hands NumPy a copy that `.cpu()` made (on the CPU,
    `.cpu()` returns the tensor itself): the copy holds the same values and history, so it is named
    as the tensor it copies, on every device. A dtype copy is that copy on this machine."""
    source = """
        import torch


        def plot(*arrays):
            for array in arrays:
                array = array%s.numpy()


        w = torch.randn(3, requires_grad=True)
        plot(w * 2, w + 1)
    """
    names = []
    for k, copy in enumerate(("", ".cpu()", ".double()", ".to(torch.float64).cpu()")):
        d, path = diagnosed(tmp_path, source % copy, "grad-to-numpy", name="program%d.py" % k)
        assert d.line == lines(path, "array = array%s.numpy()" % copy)[0]
        names.append(d.tensor)
    assert names == ["array"] * 4


def test_deepcopy_of_a_module_that_stored_its_output_names_the_store(tmp_path):
    source = """
        import copy

        import torch
        from torch import nn


        class Tracker(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(3, 3)

            def forward(self, x):
                y = self.lin(x)
                self.last = y
                return y


        tracker = Tracker()
        tracker(torch.randn(2, 3))
        ema = copy.deepcopy(tracker)
    """
    d, path = diagnosed(tmp_path, source, "nonleaf-copied")
    [store] = lines(path, "self.last = y")
    assert (d.line, d.tensor) == (store, "self.last")
    assert runs(tmp_path / "fixed.py", with_line(source, store, "self.last = y.detach()"))


def test_weight_norm_is_replaced_by_its_parametrization(tmp_path):
    source = """
        import copy
        import warnings

        import torch
        from torch import nn

        warnings.simplefilter("ignore")
        layer = nn.utils.weight_norm(nn.Linear(3, 2))
        twin = copy.deepcopy(layer)
    """
    d, path = diagnosed(tmp_path, source, "nonleaf-copied")
    [made] = lines(path, "layer = nn.utils.weight_norm(nn.Linear(3, 2))")
    assert d.line == made
    assert runs(tmp_path / "fixed.py", with_line(source, made, replacement(d.fix)))


def test_weight_norm_imported_by_its_own_name_is_replaced_by_its_parametrization(tmp_path):
    """The fix follows the op that made the weight (`torch._weight_norm`), not one spelling of the call:
    `from torch.nn.utils import weight_norm` gets the same fix as `nn.utils.weight_norm`, and it runs."""
    source = """
        import copy
        import warnings

        import torch
        from torch import nn
        from torch.nn.utils import weight_norm

        warnings.simplefilter("ignore")
        layer = weight_norm(nn.Linear(3, 2))
        twin = copy.deepcopy(layer)
    """
    d, path = diagnosed(tmp_path, source, "nonleaf-copied")
    [made] = lines(path, "layer = weight_norm(nn.Linear(3, 2))")
    assert d.line == made
    assert replacement(d.fix) == "layer = torch.nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))"
    assert runs(tmp_path / "fixed.py", with_line(source, made, replacement(d.fix)))


def test_weight_norm_recomputed_by_a_forward_still_points_to_its_parametrization(tmp_path):
    """After a forward, weight_norm's hook made the weight at the line that called the module: no line there
    to rewrite, but the fix still names the parametrization version, and the program that applies it copies."""
    source = """
        import copy
        import warnings

        import torch
        from torch import nn

        warnings.simplefilter("ignore")
        layer = nn.utils%s.weight_norm(nn.Linear(3, 2))
        y = layer(torch.randn(1, 3))
        twin = copy.deepcopy(layer)
    """
    d, path = diagnosed(tmp_path, source % "", "nonleaf-copied")
    assert d.line == lines(path, "y = layer(torch.randn(1, 3))")[0]
    assert "`torch.nn.utils.parametrizations.weight_norm`" in d.fix and replacement(d.fix) is None
    assert runs(tmp_path / "fixed.py", textwrap.dedent(source % ".parametrizations"))


def test_a_parameter_assigned_a_tensor_names_the_assignment_and_the_parameter(tmp_path):
    source = """
        import torch
        from torch import nn


        class Mixer(nn.Module):
            def __init__(self):
                super().__init__()
                self.mix = nn.Parameter(torch.ones(3))

            def forward(self, xs):
                self.mix = torch.softmax(self.mix, dim=0)
                return (self.mix[:, None] * xs).sum(0)


        Mixer()(torch.randn(3, 2))
    """
    d, path = diagnosed(tmp_path, source, "not-a-parameter", error=TypeError)
    made, assigned = lines(path, "self.mix = nn.Parameter(torch.ones(3))", "self.mix = torch.softmax(self.mix, dim=0)")
    assert (d.line, d.saved_line, d.tensor) == (assigned, made, "self.mix")
    assert fixes.NO_ONE_LINE_FIX in d.fix


# -- fp16-gradients, transform-unsupported, checkpoint-incompatible --------------------------------

def test_float16_parameters_under_grad_scaler_name_the_cast(tmp_path):
    source = """
        import torch
        from torch import nn

        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        model[1].half()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        loss = model[1](model[0](torch.randn(2, 4) * 0.1).half()).float().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
    """
    d, path = diagnosed(tmp_path, source, "fp16-gradients", error=ValueError)
    cast, raising = lines(path, "model[1].half()", "scaler.step(opt)")
    assert (d.line, d.saved_line) == (cast, raising)
    fixed = with_line(source, cast, "pass").replace(".half()).float()", ")")
    assert runs(tmp_path / "fixed.py", fixed)


def test_a_function_without_setup_context_under_vmap_names_its_forward(tmp_path):
    source = """
        import torch


        class Square(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            def backward(ctx, g):
                x, = ctx.saved_tensors
                return 2 * x * g


        y = torch.vmap(Square.apply)(torch.randn(3, 2))
    """
    d, path = diagnosed(tmp_path, source, "transform-unsupported")
    forward, applied = lines(path, "def forward(ctx, x):", "y = torch.vmap(Square.apply)(torch.randn(3, 2))")
    assert (d.line, d.saved_line) == (forward, applied)


def test_reentrant_checkpoint_under_autograd_grad_names_the_checkpoint(tmp_path):
    source = """
        import torch
        from torch import nn
        from torch.utils.checkpoint import checkpoint

        block = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        x = torch.randn(2, 3, requires_grad=True)
        y = checkpoint(block, x, use_reentrant=True)
        dx, = torch.autograd.grad(y.sum(), x)
    """
    d, path = diagnosed(tmp_path, source, "checkpoint-incompatible")
    ckpt, raising = lines(path, "y = checkpoint(block, x, use_reentrant=True)", "dx, = torch.autograd.grad(y.sum(), x)")
    assert (d.line, d.saved_line) == (ckpt, raising)
    assert replacement(d.fix) == "y = checkpoint(block, x, use_reentrant=False)"
    assert runs(tmp_path / "fixed.py", with_line(source, ckpt, replacement(d.fix)))


@pytest.mark.parametrize("transform", ["torch.func.grad(f)(x)", "torch.func.jvp(f, (x,), (x,))"])
def test_reentrant_checkpoint_under_a_transform_gets_a_fix_that_runs_under_it(tmp_path, transform):
    # The oracle: the fixed program runs under the same transform and gives the derivative of the
    # block without checkpointing. `use_reentrant=False` does not run under torch.func.grad (its
    # saved-tensor hooks are refused on every torch), nor under jvp before torch 2.11.
    source = """
        import torch
        from torch import nn
        from torch.utils.checkpoint import checkpoint

        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        x = torch.randn(3)

        def f(x):
            return checkpoint(block, x, use_reentrant=True).sum()

        out = %s
    """ % transform
    d, path = diagnosed(tmp_path, source, "transform-unsupported")
    [ckpt] = lines(path, "return checkpoint(block, x, use_reentrant=True).sum()")
    assert d.line == ckpt
    exc, _, fixed = run(tmp_path / "fixed.py", with_line(source, ckpt, replacement(d.fix)), captured=False)
    assert exc is None, (exc, d.fix)
    exc, _, plain = run(tmp_path / "plain.py", with_line(source, ckpt, "return block(x).sum()"), captured=False)
    assert exc is None
    assert all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(fixed["out"]),
                                                 torch.utils._pytree.tree_leaves(plain["out"])))


# -- a derivative without a graph ------------------------------------------------------------------

def test_a_derivative_taken_without_create_graph_is_the_cut_and_its_fix_runs(tmp_path):
    source = """
        import torch

        x = torch.randn(4, requires_grad=True)
        u = (x ** 3).sum()
        u_x, = torch.autograd.grad(u, x)
        u_xx, = torch.autograd.grad(u_x.sum(), x)
    """
    d, path = diagnosed(tmp_path, source, "graph-cut")
    [first] = lines(path, "u_x, = torch.autograd.grad(u, x)")
    assert d.line == first and "create_graph=True" in d.message
    assert replacement(d.fix) == "u_x, = torch.autograd.grad(u, x, create_graph=True)"
    assert runs(tmp_path / "fixed.py", with_line(source, first, replacement(d.fix)))


def test_a_constant_derivative_does_not_ask_for_create_graph_it_already_has(tmp_path):
    source = """
        import torch

        x = torch.tensor(1.0, requires_grad=True)
        g = torch.autograd.grad(3 * x, x, create_graph=True)[0]
        g2 = torch.autograd.grad(g, x)[0]
    """
    d, path = diagnosed(tmp_path, source, "graph-cut")
    assert d.line == lines(path, "g = torch.autograd.grad(3 * x, x, create_graph=True)[0]")[0]
    assert "constant" in d.message and replacement(d.fix) is None


def test_inf_gradients_of_float16_parameters_under_the_scaler_are_the_float16_problem_said_once(tmp_path):
    """The scaled loss overflows the float16 gradients to inf before the scaler refuses them: one
    diagnosis, the cast, not a NaN/Inf gradient besides."""
    source = """
        import torch
        from torch import nn

        model = nn.Linear(4, 2).half()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        loss = model(torch.randn(3, 4).half()).float().sum()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
    """
    d, path = diagnosed(tmp_path, source, "fp16-gradients", error=ValueError)
    cast, raising = lines(path, "model = nn.Linear(4, 2).half()", "scaler.unscale_(opt)")
    assert (d.line, d.saved_line) == (cast, raising)
    exc, _, namespace = run(tmp_path / "program.py", source, captured=False)
    assert not torch.isfinite(namespace["model"].weight.grad).all()  # the scaled float16 gradient overflowed


def test_an_optimizer_handed_a_moved_tensor_names_the_move_and_its_fix_runs(tmp_path):
    source = """
        import torch

        scale = torch.ones(3, requires_grad=True).to(torch.float64)
        opt = torch.optim.Adam([scale], lr=0.1)
        loss = (scale * 2).sum()
        loss.backward()
        opt.step()
    """
    d, path = diagnosed(tmp_path, source, "nonleaf-optimized", error=ValueError)
    moved, built = lines(path, "scale = torch.ones(3, requires_grad=True).to(torch.float64)",
                         "opt = torch.optim.Adam([scale], lr=0.1)")
    assert (d.line, d.saved_line, d.tensor) == (moved, built, "scale")
    fixed = with_line(source, moved, replacement(d.fix))
    exc, _, namespace = run(tmp_path / "fixed.py", fixed, captured=False)
    assert exc is None and namespace["scale"].grad is not None  # the optimizer now holds what trains
