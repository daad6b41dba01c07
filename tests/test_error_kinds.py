"""The errors PyTorch raises whose message names no line of the user's (diagnose/rules/: refused.py,
raised.py, ddp.py, floor.py).

Each program runs from a file of its own, plain and under capture(): the exception's type and
message must be the same. Then the diagnosis (kind, culprit line, saved line, tensor), the note
the exception carries (PEP 678), and, where the fix is a one-line change, the program with the
fix applied: it runs, the problem is gone, and its gradients are those of a reference written
independently of the fix text. The oracle for the error itself is PyTorch raising it.
"""
import json
import re
import socket
import sys
import textwrap
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import jupyter_autograd as ja
from jupyter_autograd.diagnose import fixes
from jupyter_autograd.model import is_description
from jupyter_autograd.render.text import exception_note

HAS_NOTES = sys.version_info >= (3, 11)


def run(path, source, captured):
    """(exception, trace, namespace) of a program run from `path` (its lines are read from there)."""
    path.write_text(textwrap.dedent(source))
    code = compile(path.read_text(), str(path), "exec")
    torch.manual_seed(0)
    namespace = {"__name__": "program"}
    exc = trace = None
    try:
        if captured:
            with ja.capture() as trace:
                exec(code, namespace)
        else:
            exec(code, namespace)
    except Exception as e:  # the program's own outcome, compared by the caller
        exc = e
    return exc, trace, namespace


def diagnosed(tmp_path, source, kind, error=RuntimeError, name="program.py"):
    """The one diagnosis of a program that raises `error`, with PyTorch's exception unchanged (a
    second program of a test goes in a file of another name: lines are read through linecache)."""
    path = tmp_path / name
    plain, _, _ = run(path, source, captured=False)
    exc, trace, _ = run(path, source, captured=True)
    assert isinstance(plain, error), plain
    assert type(exc) is type(plain) and str(exc) == str(plain)
    assert not trace.warnings, trace.warnings
    [d] = trace.diagnoses
    assert d.kind == kind, (d.kind, d.message)
    assert d.filename == str(path) and d.message and d.fix
    if HAS_NOTES:
        note = "\n".join(getattr(exc, "__notes__", ()))
        assert note == exception_note(trace), note
        assert "%s, line %d: %s" % (name, d.line, d.source) in note, note
        if d.tensor:  # a name in backticks, a description as it is
            assert (d.tensor if is_description(d.tensor) else "`%s`" % d.tensor) in note, note
    return d, path


def lines(path, *texts):
    """The numbers of the lines of `path` whose code is each text."""
    code = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return [code.index(text) + 1 for text in texts]


def replacement(fix):
    """The block that replaces the culprit line (the convention of diagnose/fixes/__init__.py), or None."""
    head, sep, rest = fix.partition(fixes.REPLACE + "\n")
    if not sep:
        return None
    block = []
    for line in rest.splitlines():
        if not line.startswith("    "):
            break
        block.append(line[4:])
    return block


def fixed_program(path, d):
    """The program with the diagnosis's one-line fix applied, run under capture."""
    block = replacement(d.fix)
    assert block is not None, d.fix
    source = path.read_text().splitlines()
    indent = source[d.line - 1][:len(source[d.line - 1]) - len(source[d.line - 1].lstrip())]
    source[d.line - 1:d.line] = [indent + line for line in block]
    exc, trace, namespace = run(path.with_name("fixed.py"), "\n".join(source) + "\n", captured=True)
    assert exc is None, exc
    assert trace.diagnoses == [], [(x.kind, x.line) for x in trace.diagnoses]
    return namespace


# -- nonscalar-backward ---------------------------------------------------------------------------

def test_a_loss_without_reduction_is_reduced_where_it_is_made(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch
        import torch.nn.functional as F

        def step(model, x, y):
            pred = model(x)
            loss = F.smooth_l1_loss(pred, y, reduction="none")
            loss.backward()

        model = torch.nn.Linear(3, 2)
        x, y = torch.randn(4, 3), torch.randn(4, 2)
        step(model, x, y)
    """, "nonscalar-backward")
    assert (d.line, d.saved_line) == tuple(lines(path, 'loss = F.smooth_l1_loss(pred, y, reduction="none")',
                                                 "loss.backward()"))
    assert d.tensor == "loss" and "shape (4, 2)" in d.message
    assert "`.sum()`" in d.fix and "if the sum was meant" in d.fix
    fixed = fixed_program(path, d)
    model, x, y = fixed["model"], fixed["x"], fixed["y"]
    reference = torch.autograd.grad(torch.nn.functional.smooth_l1_loss(model(x), y), model.weight)[0]
    assert torch.allclose(model.weight.grad, reference)


def test_a_weighted_loss_reduced_on_the_backward_line(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        class Weighted:
            def __init__(self, weights):
                self.weights = weights

            def backward(self, per_sample):
                (per_sample * self.weights).backward()

        w = torch.randn(3, requires_grad=True)
        per_sample = (torch.randn(5, 3) @ w) ** 2
        Weighted(torch.rand(5)).backward(per_sample)
    """, "nonscalar-backward")
    [line] = lines(path, "(per_sample * self.weights).backward()")
    assert d.line == d.saved_line == line
    fixed = fixed_program(path, d)
    assert fixed["w"].grad is not None and torch.isfinite(fixed["w"].grad).all()


def test_a_loss_module_of_the_users_is_reduced_inside_its_forward(tmp_path):
    """The non-scalar loss is made by a loss module the user wrote and called from a training step:
    the reduction goes on its own line (the innermost of the user's), not at the call."""
    d, path = diagnosed(tmp_path, """
        import torch
        from torch import nn
        from torch.nn import functional as F

        class RankLoss(nn.Module):
            def forward(self, scores1, scores2, target):
                p1 = F.softmax(scores1, dim=1).gather(1, target.view(-1, 1))
                p2 = F.softmax(scores2, dim=1).gather(1, target.view(-1, 1))
                return torch.clamp(p1 - p2 + 0.05, min=0)

        class Trainer:
            def __init__(self, model):
                self.model, self.rank = model, RankLoss()

            def step(self, x, target):
                scores = self.model(x)
                self.rank(scores, scores * 2, target).backward()

        model = nn.Linear(6, 4)
        x, target = torch.randn(4, 6), torch.tensor([0, 3, 1, 2])
        Trainer(model).step(x, target)
    """, "nonscalar-backward")
    assert (d.line, d.saved_line) == tuple(lines(path, "return torch.clamp(p1 - p2 + 0.05, min=0)",
                                                 "self.rank(scores, scores * 2, target).backward()"))
    # No name of the user's is certain for it (the call is no assignment): it is described.
    assert d.tensor.startswith("the float32 result of torch.clamp") and "shape (4, 1)" in d.tensor
    assert "has 4 values" in d.message
    fixed = fixed_program(path, d)
    model, x, target = fixed["model"], fixed["x"], fixed["target"]
    scores = model(x)
    picked = [F.softmax(s, dim=1).gather(1, target.view(-1, 1)) for s in (scores, scores * 2)]
    reference = torch.autograd.grad(torch.clamp(picked[0] - picked[1] + 0.05, min=0).mean(), model.weight)[0]
    assert torch.allclose(model.weight.grad, reference)


def test_a_loss_kept_in_a_dict_gets_no_replacement_of_the_dict(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch
        import torch.nn.functional as F

        def step(pred, target):
            losses = {"mse": F.mse_loss(pred, target, reduction="none")}
            losses["mse"].backward()

        step(torch.randn(3, 2, requires_grad=True), torch.zeros(3, 2))
    """, "nonscalar-backward")
    assert (d.line, d.saved_line) == tuple(lines(path, 'losses = {"mse": F.mse_loss(pred, target, reduction="none")}',
                                                 'losses["mse"].backward()'))
    # The line assigns a dict: neither its name nor `.mean()` on it is the tensor's.
    assert d.tensor != "losses" and replacement(d.fix) is None and fixes.NO_ONE_LINE_FIX in d.fix


def test_a_gradient_penalty_without_grad_outputs(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch
        from torch import nn

        def gradient_penalty(critic, real, fake):
            alpha = torch.rand(real.shape[0], 1)
            mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
            scores = critic(mixed)
            grads, = torch.autograd.grad(scores, mixed, create_graph=True)
            return ((grads.norm(2, dim=1) - 1) ** 2).mean()

        critic = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
        gradient_penalty(critic, torch.randn(6, 2), torch.randn(6, 2)).backward()
    """, "nonscalar-backward")
    assert (d.line, d.saved_line) == tuple(lines(path, "scores = critic(mixed)",
                                                 "grads, = torch.autograd.grad(scores, mixed, create_graph=True)"))
    assert d.tensor == "scores" and "grad_outputs=torch.ones_like(scores)" in d.fix
    assert replacement(d.fix) is None and fixes.NO_ONE_LINE_FIX in d.fix


# -- view-inplace ---------------------------------------------------------------------------------

def test_a_row_of_unbind_changed_in_place_in_a_loop(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        def normalise_rows(h):
            for row in h.unbind(0):
                row.div_(row.norm())
            return h

        x = torch.randn(3, 4, requires_grad=True)
        normalise_rows(x * 2).sum().backward()
    """, "view-inplace")
    assert (d.line, d.saved_line) == tuple(lines(path, "row.div_(row.norm())", "for row in h.unbind(0):"))
    assert "views that `Tensor.unbind` returned" in d.message
    assert replacement(d.fix) == ["row = row.div(row.norm())"]


def test_a_split_kept_in_a_list_and_written_through_an_index(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        class Heads:
            def __init__(self, sizes):
                self.sizes = sizes

            def __call__(self, h):
                parts = list(torch.split(h, self.sizes, dim=1))
                parts[0][:, 0] = 0
                return torch.cat(parts, dim=1)

        w = torch.randn(4, 5, requires_grad=True)
        Heads([2, 3])(torch.randn(2, 4) @ w).sum().backward()
    """, "view-inplace")
    assert (d.line, d.saved_line) == tuple(lines(path, "parts[0][:, 0] = 0",
                                                 "parts = list(torch.split(h, self.sizes, dim=1))"))
    assert replacement(d.fix) is None and fixes.NO_ONE_LINE_FIX in d.fix  # `parts[0]` cannot be rebound as a name


def test_a_view_taken_under_no_grad_and_written_after_it(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        def shift(x):
            with torch.no_grad():
                first = x[0]
            first.add_(1)

        shift(torch.randn(3, 2, requires_grad=True) * 2)
    """, "view-inplace")
    assert (d.line, d.saved_line) == tuple(lines(path, "first.add_(1)", "first = x[0]"))
    assert d.tensor == "first" and "taken under `torch.no_grad()`" in d.message


def test_a_view_taken_in_inference_mode_and_an_inference_tensor_written_outside(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        def update(cache, h):
            with torch.inference_mode():
                head = h[:1]
            head.mul_(0.5)

        update({}, torch.randn(3, 2, requires_grad=True) * 2)
    """, "view-inplace")
    assert (d.line, d.saved_line) == tuple(lines(path, "head.mul_(0.5)", "head = h[:1]"))
    assert "taken under `torch.inference_mode()`" in d.message
    d, path = diagnosed(tmp_path, """
        import torch

        def features(x):
            with torch.inference_mode():
                feats = x * 2
            feats.clamp_(min=0)
            return feats

        features(torch.randn(3))
    """, "view-inplace", name="features.py")
    assert (d.line, d.saved_line) == tuple(lines(path, "feats.clamp_(min=0)", "feats = x * 2"))
    assert "inference tensor" in d.message and replacement(d.fix) == ["feats = feats.clamp(min=0)"]


def test_the_fix_of_a_chunk_written_in_place_gives_the_out_of_place_gradients(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        class Gate:
            def __call__(self, h):
                gate, value = h.chunk(2, dim=-1)
                gate.sigmoid_()
                return gate * value

        w = torch.randn(3, 4, requires_grad=True)
        x = torch.randn(2, 3)
        Gate()(x @ w).sum().backward()
    """, "view-inplace")
    assert d.tensor == "gate" and replacement(d.fix) == ["gate = gate.sigmoid()"]
    fixed = fixed_program(path, d)
    w, x = fixed["w"], fixed["x"]
    gate, value = (x @ w).chunk(2, dim=-1)
    assert torch.allclose(w.grad, torch.autograd.grad((gate.sigmoid() * value).sum(), w)[0])


# -- inference-tensor-saved -----------------------------------------------------------------------

def test_features_of_a_decorated_inference_helper_flattened_outside_it(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch
        from torch import nn

        @torch.inference_mode()
        def embed(backbone, images):
            return backbone(images)

        def probe_step(backbone, head, images):
            feats = embed(backbone, images).flatten(1)
            return head(feats).sum()

        backbone, head = nn.Conv1d(2, 2, 3), nn.Linear(4, 1)
        probe_step(backbone, head, torch.randn(3, 2, 4)).backward()
    """, "inference-tensor-saved")
    # The line that ran under inference mode, not the flatten outside it (a view of an inference tensor).
    assert (d.line, d.saved_line) == tuple(lines(path, "return backbone(images)", "return head(feats).sum()"))
    assert "torch.no_grad()" in d.fix and fixes.NO_ONE_LINE_FIX in d.fix


def test_cloning_the_features_outside_inference_mode_is_what_the_fix_says(tmp_path):
    source = """
        import torch
        from torch import nn

        backbone, head = nn.Linear(3, 4), nn.Linear(4, 1)
        with torch.inference_mode():
            feats = backbone(torch.randn(2, 3))
        head(feats).sum().backward()
    """
    d, path = diagnosed(tmp_path, source, "inference-tensor-saved")
    assert d.tensor == "feats" and "    feats = feats.clone()" in d.fix.splitlines()
    clone_after = source.replace("        head(feats)", "        feats = feats.clone()\n        head(feats)")
    exc, trace, namespace = run(path.with_name("cloned.py"), clone_after, captured=True)
    assert exc is None and trace.diagnoses == [] and namespace["head"].weight.grad is not None


# -- nonleaf-requires-grad ------------------------------------------------------------------------

def test_a_perturbation_kept_on_an_object_and_made_a_leaf_again(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        class Attack:
            def __init__(self, shape):
                self.delta = torch.zeros(shape)

            def step(self, model, x):
                self.delta.requires_grad = True
                loss = model(x + self.delta).pow(2).sum()
                loss.backward()
                self.delta = self.delta + 0.1 * self.delta.grad.sign()

        model = torch.nn.Linear(3, 1)
        attack = Attack((2, 3))
        for _ in range(2):
            attack.step(model, torch.randn(2, 3))
    """, "nonleaf-requires-grad")
    assert (d.line, d.saved_line) == tuple(lines(path, "self.delta.requires_grad = True",
                                                 "self.delta = self.delta + 0.1 * self.delta.grad.sign()"))
    assert d.tensor == "self.delta" and "in the previous iteration of the loop" in d.message
    assert replacement(d.fix) == ["self.delta = self.delta.detach().requires_grad_()"]
    fixed = fixed_program(path, d)
    assert fixed["attack"].delta.grad is None  # the attack's last step made a new non-leaf, as in the program
    assert fixed["model"].weight.grad is not None


def test_requires_grad_false_on_a_non_leaf_is_fixed_by_detach(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        def target_of(net, x):
            target = net(x)
            target.requires_grad_(False)
            return target

        net = torch.nn.Linear(2, 2)
        x = torch.randn(3, 2)
        loss = (net(x) - target_of(net, x)).pow(2).mean()
        loss.backward()
    """, "nonleaf-requires-grad")
    assert (d.line, d.saved_line) == tuple(lines(path, "target.requires_grad_(False)", "target = net(x)"))
    assert replacement(d.fix) == ["target = target.detach()"]
    fixed = fixed_program(path, d)
    net, x = fixed["net"], fixed["x"]
    reference = torch.autograd.grad((net(x) - net(x).detach()).pow(2).mean(), net.weight)[0]
    assert torch.allclose(net.weight.grad, reference)


# -- not-differentiable and invalid-gradient ------------------------------------------------------

def test_an_op_without_derivative_is_found_by_the_node_backward_met(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        def run_lengths(x):
            values = torch.unique_consecutive(x.round())
            return values.sum()

        w = torch.randn(6, requires_grad=True)
        total = run_lengths(w * 3) + w.sum()
        total.backward()
    """, "not-differentiable", error=NotImplementedError)
    assert (d.line, d.saved_line) == tuple(lines(path, "values = torch.unique_consecutive(x.round())",
                                                 "total.backward()"))
    assert d.tensor == "values" and d.node == "UniqueConsecutiveBackward0"
    assert "`.detach()`" in d.fix and fixes.NO_ONE_LINE_FIX in d.fix


def test_a_function_returning_too_few_gradients_and_one_for_a_number(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, factor):
                ctx.factor = factor
                return x * factor

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.factor

        x = torch.randn(3, requires_grad=True)
        y = Scale.apply(x, 2.0)
        y.sum().backward()
    """, "invalid-gradient")
    assert (d.line, d.saved_line) == tuple(lines(path, "y = Scale.apply(x, 2.0)", "y.sum().backward()"))
    assert d.tensor == "y" and "returned 1 values" in d.message and "`Scale.backward`" in d.fix
    d, path = diagnosed(tmp_path, """
        import torch

        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, factor):
                ctx.factor = factor
                return x * factor

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.factor, grad

        x = torch.randn(3, requires_grad=True)
        y = Scale.apply(x, 2.0)
        y.sum().backward()
    """, "invalid-gradient", name="two.py")
    assert d.line == lines(path, "y = Scale.apply(x, 2.0)")[0] and "which is not a tensor" in d.message


def test_the_wrong_shape_names_the_input_it_was_for(tmp_path):
    d, path = diagnosed(tmp_path, """
        import torch

        class Affine(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, weight):
                ctx.save_for_backward(x, weight)
                return x @ weight

            @staticmethod
            def backward(ctx, grad):
                x, weight = ctx.saved_tensors
                return grad @ weight.t(), grad.t() @ x

        weight = torch.randn(3, 2, requires_grad=True)
        out = Affine.apply(torch.randn(4, 3), weight)
        out.pow(2).sum().backward()
    """, "invalid-gradient")
    assert d.tensor == "weight" and "input 1" in d.message and "shape (2, 3)" in d.message


# -- the forward line PyTorch's anomaly mode names -------------------------------------------------

def anomaly_line(path, source):
    """The line of `path` that PyTorch's own anomaly mode names for a program that raises in backward:
    the innermost line of the program in the forward traceback of the node that failed, or, for a node
    a backward made with create_graph=True, of the forward call that induced it. The oracle for where
    an error of backward comes from (anomaly mode is left off in the captured run)."""
    path.write_text(textwrap.dedent(source))
    code = compile(path.read_text(), str(path), "exec")
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=False):
                exec(code, {"__name__": "program"})
        except Exception:  # the program's own error: what anomaly mode said about it is what counts
            pass
    said = [str(w.message) for w in caught if "Traceback of forward call" in str(w.message)]
    assert said, [str(w.message) for w in caught]
    frames = re.findall(r'File "%s", line (\d+)' % re.escape(str(path)), said[-1])
    return int(frames[-1])


NO_DERIVATIVE = {
    "floor_divide in a module's forward": """
        import torch
        from torch import nn

        class Quantized(nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = nn.Linear(3, 4)
                self.head = nn.Linear(4, 2)

            def forward(self, x):
                h = torch.tanh(self.enc(x))
                h = torch.floor_divide(h, 0.25) * 0.25
                return self.head(h)

        model = Quantized()
        loss = model(torch.randn(5, 3)).pow(2).mean()
        loss.backward()
    """,
    "`//` in a helper, on a tensor kept in a dict": """
        import torch

        def snap(state, step):
            state["levels"] = state["h"] // step
            return state["levels"] * step

        w = torch.randn(4, 3, requires_grad=True)
        state = {"h": torch.randn(5, 4) @ w}
        out = snap(state, 0.5).sum() + w.sum()
        out.backward()
    """,
    "bincount with weights, after a floor_divide that is off the path": """
        import torch

        w = torch.randn(6, requires_grad=True)
        unused = torch.floor_divide(w, 2.0)
        codes = torch.tensor([0, 1, 1, 3, 2, 0])
        counts = torch.bincount(codes, weights=w * 2)
        (counts * torch.arange(4.0)).sum().backward()
    """,
    "two ops without derivative on the path: the engine meets one first": """
        import torch

        w = torch.randn(6, requires_grad=True)
        a = torch.floor_divide(w * 3, 0.5) * w
        b = torch.bincount(torch.tensor([0, 1, 1, 3, 2, 0]), weights=w.exp())
        (a.sum() + b.sum()).backward()
    """,
    # embedding_bag's backward has no derivative in any torch the suite runs on (cdist's has one
    # since 2.14); diagnosed() checks that plain PyTorch raises.
    "a second-order gradient through embedding_bag": """
        import torch
        import torch.nn.functional as F

        table = torch.randn(6, 3, requires_grad=True)
        bags = torch.tensor([0, 2, 1, 3, 5, 4])
        offsets = torch.tensor([0, 2, 4])
        energy = F.embedding_bag(bags, table, offsets, mode="sum").pow(2).sum()
        (grad,) = torch.autograd.grad(energy, table, create_graph=True)
        grad.pow(2).sum().backward()
    """,
    "a second-order gradient through scaled_dot_product_attention in a closure": """
        import torch
        import torch.nn.functional as F

        def attention(scale):
            def attend(q, k, v):
                return F.scaled_dot_product_attention(q * scale, k, v)
            return attend

        attend = attention(0.5)
        q = torch.randn(1, 2, 4, 8, requires_grad=True)
        kv = torch.randn(1, 2, 4, 8)
        inner = attend(q, kv, kv).pow(2).sum()
        (grad,) = torch.autograd.grad(inner, q, create_graph=True)
        grad.abs().sum().backward()
    """,
}


@pytest.mark.parametrize("case", sorted(NO_DERIVATIVE))
def test_an_op_without_derivative_is_named_at_the_forward_line_anomaly_mode_names(tmp_path, case):
    source = NO_DERIVATIVE[case]
    expected = anomaly_line(tmp_path / "oracle.py", source)
    d, path = diagnosed(tmp_path, source, "not-differentiable")
    code = path.read_text().splitlines()
    assert d.line == expected, (d.line, d.source, code[expected - 1].strip(), d.message)
    [backward] = [i for i, text in enumerate(code, 1) if ".backward()" in text]
    assert d.saved_line == backward


def test_a_second_order_gradient_says_which_backward_ran_the_op(tmp_path):
    d, path = diagnosed(tmp_path, NO_DERIVATIVE["a second-order gradient through embedding_bag"], "not-differentiable")
    inner = lines(path, "(grad,) = torch.autograd.grad(energy, table, create_graph=True)")[0]
    assert "embedding_bag`" in d.message and "line %d ran it with create_graph=True" % inner in d.message
    assert "the inner gradient on line %d without create_graph=True" % inner in d.fix


HOOKS = {
    "a tensor hook that sums the gradient, in a module's forward": """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = nn.Linear(3, 4)
                self.head = nn.Linear(4, 2)

            def forward(self, x):
                h = torch.tanh(self.enc(x))
                h.register_hook(lambda g: g.sum(0))
                return self.head(h)

        model = Net()
        loss = model(torch.randn(5, 3)).pow(2).mean()
        loss.backward()
    """,
    "a transposing hook on a tensor kept on a helper object": """
        import torch

        class Probe:
            def watch(self, t):
                self.seen = t
                self.seen.register_hook(self.flip)
                return t

            def flip(self, grad):
                return grad.t()

        w = torch.randn(3, 4, requires_grad=True)
        probe = Probe()
        feats = [torch.randn(2, 3) @ w]
        out = probe.watch(feats[0].relu()) * 2
        out.sum().backward()
    """,
    "a module's backward hook returning a gradient of another size": """
        import torch
        from torch import nn

        def feedback(module, grad_input, grad_output):
            if grad_input[1] is not None:
                return (grad_input[0], grad_output[0].mm(module.fixed)) + grad_input[2:]

        class FeedbackLinear(nn.Linear):
            def __init__(self, n_in, n_out, bias=True):
                super().__init__(n_in, n_out, bias=bias)
                self.register_buffer("fixed", torch.randn(n_out, n_in))
                self.register_backward_hook(feedback)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(6, 8)
                self.fc2 = FeedbackLinear(8, 3, bias=False)

            def forward(self, x):
                x = torch.relu(self.fc1(x))
                return self.fc2(x)

        net = Net()
        loss = nn.functional.cross_entropy(net(torch.randn(4, 6)), torch.tensor([0, 2, 1, 0]))
        loss.backward()
    """,
}


@pytest.mark.parametrize("case", sorted(HOOKS))
def test_a_hook_that_returns_what_does_not_fit_is_named_at_the_node_it_sits_on(tmp_path, case):
    source = HOOKS[case]
    expected = anomaly_line(tmp_path / "oracle.py", source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # register_backward_hook's, in both runs alike
        d, path = diagnosed(tmp_path, source, "backward-error")
    code = path.read_text().splitlines()
    assert d.line == expected, (d.line, d.source, code[expected - 1].strip(), d.message)
    assert d.saved_line == [i for i, text in enumerate(code, 1) if ".backward()" in text][0]
    assert "hook" in d.message and "return None" in d.fix


def test_a_tensor_hook_names_the_tensor_and_the_line_that_registered_it(tmp_path):
    d, path = diagnosed(tmp_path, HOOKS["a tensor hook that sums the gradient, in a module's forward"],
                        "backward-error")
    assert d.tensor == "h"
    assert "the hook that line %d registered on `h`" % lines(path, "h.register_hook(lambda g: g.sum(0))")[0] \
        in d.message


# -- DistributedDataParallel, one process ---------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def process_group():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.set_debug_level(dist.DebugLevel.OFF)
        dist.destroy_process_group()


MULTI_TASK = """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    class MultiTask(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(4, 8)
            self.head = nn.Linear(8, 1)
            self.aux_head = nn.Sequential(nn.ReLU(), nn.Linear(8, 2))

        def forward(self, x):
            h = self.trunk(x)
            aux = self.aux_head(h)
            return self.head(h), aux

    def train(steps):
        model = MultiTask()
        model = DDP(model)
        for _ in range(steps):
            out, aux = model(torch.randn(3, 4))
            out.pow(2).mean().backward()
"""


def test_ddp_names_the_parameters_a_rebound_model_left_without_gradient(tmp_path, process_group):
    d, path = diagnosed(tmp_path, MULTI_TASK + "\n    train(2)\n", "ddp-unused-parameters")
    assert d.line == lines(path, "out, aux = model(torch.randn(3, 4))")[0] and d.saved_line is None
    # `model = DDP(model)`: the user's code reaches the wrapped module as `model.module`.
    assert d.tensor == "model.module.aux_head.1.weight" and d.also == ("model.module.aux_head.1.bias",)
    assert "never reached the tensor backward ran from" in d.message  # used in the forward, left out of the loss
    assert "find_unused_parameters=True" in d.fix


def test_ddp_names_from_torch_debug_mode_agree_with_its_indices(tmp_path, process_group):
    dist.set_debug_level(dist.DebugLevel.INFO)
    d, path = diagnosed(tmp_path, MULTI_TASK + "\n    train(2)\n", "ddp-unused-parameters")
    assert d.tensor == "model.module.aux_head.1.weight"


def test_ddp_says_why_of_the_iteration_that_did_not_finish(tmp_path, process_group):
    d, path = diagnosed(tmp_path, """
        import torch
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel

        class WithAux(nn.Module):
            def __init__(self):
                super().__init__()
                self.main = nn.Linear(2, 1)
                self.aux = nn.Linear(2, 1)

            def forward(self, x, use_aux):
                return self.main(x) + (self.aux(x) if use_aux else 0)

        def train(net):
            ddp = DistributedDataParallel(net)
            for step in range(3):
                ddp(torch.randn(2, 2), use_aux=step == 0).sum().backward()

        train(WithAux())
    """, "ddp-unused-parameters")
    # Its first iteration called `aux`; the second, the one DDP could not finish, did not.
    assert d.tensor == "net.aux.weight" and "`net.aux`, the module that holds `net.aux.weight`, was never " \
        "called" in d.message


def test_ddp_parameter_order_is_the_reducers(process_group):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5, 4)
            self.frozen = nn.Linear(4, 4)
            self.skip = nn.Linear(4, 4)
            self.out = nn.Linear(4, 5, bias=False)
            self.out.weight = self.embed.weight  # tied: one parameter, counted once
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, ids):
            return self.out(self.frozen(self.embed(ids)) * self.scale)

    net = Net()
    net.frozen.requires_grad_(False)
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, ["skip.bias"])
    ddp = nn.parallel.DistributedDataParallel(net, find_unused_parameters=True)
    with ja.capture(namespace=locals()) as trace:  # the test's own names: `net` is what DDP wraps
        ddp(torch.tensor([1, 2])).sum().backward()
    names = {id(p): n for n, p in net.named_parameters()}
    reducers = [names[id(p)] for p in ddp._build_params_for_reducer()[0]]
    [model] = trace.distributed
    assert list(model.parameter_names) == reducers and "skip.bias" not in reducers
    assert model.name == "ddp" and model.module == "net" and model.find_unused_parameters


def test_ddp_ready_twice_names_the_checkpoint_and_its_fix_runs(tmp_path, process_group):
    d, path = diagnosed(tmp_path, """
        import torch
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.checkpoint import checkpoint

        class Tower(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

            def forward(self, x):
                for layer in self.layers:
                    x = checkpoint(layer, x, use_reentrant=True)
                return x

        tower = Tower()
        ddp = DistributedDataParallel(tower, find_unused_parameters=True)
        loss = ddp(torch.randn(2, 4, requires_grad=True)).sum()
        loss.backward()
    """, "ddp-ready-twice")
    assert (d.line, d.saved_line) == tuple(lines(path, "x = checkpoint(layer, x, use_reentrant=True)",
                                                 "loss.backward()"))
    assert d.tensor.startswith("tower.layers.")
    assert replacement(d.fix) == ["x = checkpoint(layer, x, use_reentrant=False)"]
    fixed = fixed_program(path, d)
    assert all(p.grad is not None for p in fixed["tower"].parameters())


# -- DistributedDataParallel, two processes -------------------------------------------------------

class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
        self.aux_head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def _train_two_heads(rank, steps):
    model = TwoHeads()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(steps):
        out = ddp(torch.randn(3, 4) + rank)
        opt.zero_grad()
        out.pow(2).mean().backward()
        opt.step()


def _ddp_rank(rank, port, out_dir):
    """One of two processes: trains under capture() and writes what its exception carried."""
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2)
    result = {"rank": rank}
    try:
        torch.manual_seed(0)
        with ja.capture() as trace:
            _train_two_heads(rank, 2)
    except RuntimeError as e:
        result.update(error=str(e), notes=list(getattr(e, "__notes__", ())),
                      diagnoses=[(d.kind, d.tensor, d.also, d.line) for d in trace.diagnoses])
    finally:
        dist.destroy_process_group()
        with open("%s/rank%d.json" % (out_dir, rank), "w") as f:
            json.dump(result, f)


def test_two_processes_name_the_unused_parameter_in_the_note_on_rank_0(tmp_path):
    import torch.multiprocessing as mp

    context = mp.start_processes(_ddp_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + 300
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two DDP processes did not finish")
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    assert "Parameter indices which did not receive grad for rank 0: 4 5" in rank0["error"]
    [line] = [i for i, text in enumerate(open(__file__).read().splitlines(), 1)
              if text.strip() == "out = ddp(torch.randn(3, 4) + rank)"]
    assert rank0["diagnoses"] == [["ddp-unused-parameters", "model.aux_head.weight", ["model.aux_head.bias"], line]]
    if HAS_NOTES:
        [note] = rank0["notes"]
        assert "(`model.aux_head.weight`)" in note and "test_error_kinds.py, line %d" % line in note
        said = " ".join(note.split())  # the note's prose is wrapped
        assert "`model.aux_head.weight`, `model.aux_head.bias` got no gradient: `model.aux_head`, the module that " \
            "holds `model.aux_head.weight`, was never called" in said


# -- the floor: any other error of backward -------------------------------------------------------

FLOOR = {
    "custom Function's backward raising": ("""
        import torch

        class Project(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad @ torch.ones(5, 5)

        x = torch.randn(3, requires_grad=True)
        Project.apply(x).sum().backward()
    """, "return grad @ torch.ones(5, 5)", RuntimeError),
    "tensor hook raising": ("""
        import torch

        def reject(grad):
            raise ValueError("no gradients today")

        w = torch.randn(3, requires_grad=True)
        h = w * 2
        h.register_hook(reject)
        h.sum().backward()
    """, 'raise ValueError("no gradients today")', ValueError),
    "node hook returning the wrong number of values": ("""
        import torch

        w = torch.randn(3, requires_grad=True)
        h = w.exp()
        h.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (grad_inputs[0], grad_inputs[0]))
        h.sum().backward()
    """, "h.sum().backward()", RuntimeError),  # the hook is the node's, which the message does not name
    "module backward hook returning a gradient for an input that needs none": ("""
        import torch
        from torch import nn

        layer = nn.Linear(3, 1)
        layer.register_full_backward_hook(lambda module, grad_in, grad_out: (torch.ones(2, 3),))
        out = layer(torch.randn(2, 3))
        out.sum().backward()
    """, "out.sum().backward()", RuntimeError),
    "anomaly mode finding a NaN": ("""
        import torch

        x = torch.zeros(3, requires_grad=True)
        with torch.autograd.detect_anomaly():
            root = x.sqrt()
            (root * 0).sum().backward()
    """, "root = x.sqrt()", RuntimeError),
    "a gradient of another shape given to backward": ("""
        import torch

        w = torch.randn(3, requires_grad=True)
        y = w * 2
        y.backward(torch.ones(4))
    """, "y = w * 2", RuntimeError),
    "a complex gradient for a real output": ("""
        import torch

        w = torch.randn(3, requires_grad=True)
        y = w * 2
        y.backward(torch.ones(3, dtype=torch.complex64))
    """, "y = w * 2", RuntimeError),
    "a backward returning a list": ("""
        import torch

        class Listy(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, grad):
                return [grad]

        x = torch.randn(3, requires_grad=True)
        Listy.apply(x).sum().backward()
    """, "Listy.apply(x).sum().backward()", RuntimeError),
    "gradcheck finding a wrong backward": ("""
        import torch

        class Doubled(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 3

        torch.autograd.gradcheck(Doubled.apply, (torch.randn(3, dtype=torch.double, requires_grad=True),))
    """, "torch.autograd.gradcheck(Doubled.apply, (torch.randn(3, dtype=torch.double, requires_grad=True),))",
        RuntimeError),
}


@pytest.mark.parametrize("case", sorted(FLOOR))
def test_every_other_backward_error_gets_a_line(tmp_path, case):
    source, culprit, error = FLOOR[case]
    d, path = diagnosed(tmp_path, source, "backward-error", error=error)
    assert d.line == lines(path, culprit)[0], (d.line, d.source, d.message)


def test_the_floor_names_the_node_and_its_tensor(tmp_path):
    d, path = diagnosed(tmp_path, FLOOR["anomaly mode finding a NaN"][0], "backward-error")
    assert d.node == "SqrtBackward0" and d.tensor == "root"
    assert d.saved_line == lines(path, "(root * 0).sum().backward()")[0]


def test_an_error_of_the_forward_pass_is_not_explained(tmp_path):
    path = tmp_path / "program.py"
    exc, trace, _ = run(path, """
        import torch

        w = torch.randn(3, 2, requires_grad=True)
        loss = (torch.randn(4, 3) @ w.t()).sum()
    """, captured=True)
    assert isinstance(exc, RuntimeError) and trace.diagnoses == [] and not getattr(exc, "__notes__", None)


def test_a_caught_backward_error_then_another_exception_gets_no_note(tmp_path):
    path = tmp_path / "program.py"
    exc, trace, _ = run(path, """
        import torch

        w = torch.randn(3, requires_grad=True)
        try:
            (w * 2).backward()
        except RuntimeError:
            pass
        raise KeyError("batch")
    """, captured=True)
    assert isinstance(exc, KeyError) and [d.kind for d in trace.diagnoses] == ["nonscalar-backward"]
    assert exception_note(trace) is None and not getattr(exc, "__notes__", None)


def test_a_quoted_error_is_escaped_in_html(tmp_path):
    from jupyter_autograd.widget import static_html

    path = tmp_path / "program.py"
    exc, trace, _ = run(path, """
        import torch

        def refuse(grad):
            raise ValueError("<img src=x onerror=alert(1)>")

        w = torch.randn(3, requires_grad=True)
        w.register_hook(refuse)
        (w * 2).sum().backward()
    """, captured=True)
    [d] = trace.diagnoses
    assert d.kind == "backward-error" and "<img src=x" in d.message
    page = static_html(trace)
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
