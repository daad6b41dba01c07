"""Rules for writes and cuts, wherever the tensor lives and however the write or cut is spelled:
silent-data-mutation through `.data =`, graph-cut at a grad-mode switch left behind, leaf-inplace
through every spelling of a write (`out=` included), and the user's names for tensors made inside
functions (a torch.compile output among them).

Each program is shaped like real code (helpers, classes, training loops) and keeps the tensor where
real code keeps it: a local, an attribute, a list element, a dict value, a closure, a helper object.
Each test asserts the diagnosis (kind, culprit line, saved line, name) and an oracle from plain
PyTorch: the same exception without the tool, or gradients against a reference program that makes
a copy where the program swaps memory. Lines are found by the `# <marker>` comment they carry.
"""
import contextlib
import pathlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jupyter_autograd as ja

SOURCE = pathlib.Path(__file__).read_text().splitlines()


def line_of(marker):
    """The line of this file that ends with `# <marker>`."""
    hits = [i for i, text in enumerate(SOURCE, 1) if text.rstrip().endswith("# <%s>" % marker)]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def run_captured(program, *args):
    """(trace, exception or None, what the program returned), the program run under capture()."""
    result, error = None, None
    try:
        with ja.capture() as trace:
            result = program(*args)
    except Exception as exc:  # the program's own outcome, compared by the test
        error = exc
    return trace, error, result


def run_plain(program, *args):
    try:
        return None, program(*args)
    except Exception as exc:
        return exc, None


def gradients(leaves):
    return [None if t.grad is None else t.grad.clone() for t in leaves]


def same(a, b):
    """Equal lists of gradients (None where a tensor got none)."""
    return len(a) == len(b) and all(x is y if x is None or y is None else torch.allclose(x, y) for x, y in zip(a, b))


# -- silent-data-mutation: `t.data = new` after a graph saved `t` itself -----------------------------
# Each program has a reference twin that gives the new values a tensor of their own (a copy, or the
# same swap after backward): the gradients the program should have had.

def swap_local():
    x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    gain = torch.full((4,), 2.0)
    y = x * gain  # <local-saved>
    gain.data = torch.full((4,), 5.0)  # <local-swap>
    y.sum().backward()
    return [x]


def copy_local():
    x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    gain = torch.full((4,), 2.0)
    y = x * gain
    gain = torch.full((4,), 5.0)
    y.sum().backward()
    return [x]


class Tempered(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.temperature = torch.ones(1)

    def forward(self, x):
        return self.lin(x) / self.temperature  # <attr-saved>

    def anneal(self):
        self.temperature.data = self.temperature.data * 0.5  # <attr-swap>

    def anneal_by_copy(self):
        self.temperature = self.temperature * 0.5


def swap_attribute_in_a_training_loop(anneal="anneal"):
    torch.manual_seed(0)
    model = Tempered()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        loss = model(torch.randn(8, 4)).logsumexp(-1).mean()
        getattr(model, anneal)()  # annealed between the forward and the backward
        opt.zero_grad()
        loss.backward()
        opt.step()
    return list(model.parameters())


def swap_list_element():
    x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    scales = [torch.full((4,), 2.0), torch.full((4,), 3.0)]
    y = x * scales[0] + x.exp() * scales[1]  # <list-saved>
    scales[0].data = torch.zeros(4)  # <list-swap>
    y.sum().backward()
    return [x]


def copy_list_element():
    x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    scales = [torch.full((4,), 2.0), torch.full((4,), 3.0)]
    y = x * scales[0] + x.exp() * scales[1]
    scales[0] = torch.zeros(4)
    y.sum().backward()
    return [x]


def swap_dict_value(spelling="swap"):
    torch.manual_seed(0)
    w = torch.randn(3, 4, requires_grad=True)
    state = {"u": F.normalize(torch.randn(3), dim=0)}
    sigma = torch.dot(state["u"], w @ torch.ones(4))  # <dict-saved>
    if spelling == "swap":
        setattr(state["u"], "data", F.normalize(torch.randn(3), dim=0))  # <dict-swap>
    else:
        state["u"] = F.normalize(torch.randn(3), dim=0)
    sigma.backward()
    return [w]


def make_scaler():
    scale = torch.full((4,), 2.0)

    def apply(x):
        return x * scale  # <closure-saved>

    def set_scale(value):
        scale.data = value  # <closure-swap>

    return apply, set_scale


def make_rebinding_scaler():
    scale = torch.full((4,), 2.0)

    def apply(x):
        return x * scale

    def set_scale(value):
        nonlocal scale
        scale = value

    return apply, set_scale


def swap_closure(make=make_scaler):
    apply, set_scale = make()
    x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    y = apply(x)
    set_scale(torch.full((4,), 7.0))
    y.sum().backward()
    return [x]


class Slot:
    """A helper object that owns a tensor and reloads it from a checkpoint."""

    def __init__(self, tensor):
        self.tensor = tensor

    def load(self, values):
        self.tensor.data = values  # <helper-swap>

    def load_by_copy(self, values):
        self.tensor = values


def swap_helper_object(load="load"):
    torch.manual_seed(0)
    bias = Slot(torch.randn(4))
    x = torch.randn(4, requires_grad=True)
    y = (x * bias.tensor).tanh()  # <helper-saved>
    getattr(bias, load)(torch.zeros(4))
    y.sum().backward()
    return [x]


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(4, 8) * 0.5)
        self.w2 = nn.Parameter(torch.randn(8, 2) * 0.5)

    def forward(self, x):
        h = torch.tanh(x @ self.w1)
        return h @ self.w2  # <sam-saved>


@contextlib.contextmanager
def perturbed(module, radius):
    originals = {name: p.data for name, p in module.named_parameters()}
    try:
        for name, p in module.named_parameters():
            p.data = p.data + radius * torch.sign(p.data)
        yield
    finally:
        for name, p in module.named_parameters():
            p.data = originals[name]  # <sam-restore>


def sharpness_step(backward_inside=False):
    torch.manual_seed(0)
    model = TwoLayer()
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    with perturbed(model, 0.05):
        loss = F.mse_loss(model(x), y)
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    return list(model.parameters())


class PowerNormalized(nn.Module):
    """Divides a layer's weight by its largest singular value, estimated by one step of power
    iteration per call; the vector is kept between calls."""

    def __init__(self, layer, rebind=False):
        super().__init__()
        self.layer, self.rebind = layer, rebind
        self.register_buffer("u", F.normalize(torch.randn(layer.out_features), dim=0))

    def forward(self, x):
        w = self.layer.weight
        v = F.normalize(w.t() @ self.u, dim=0)  # <sn-saved-mv>
        u = F.normalize(w @ v, dim=0)
        sigma = torch.dot(self.u, w @ v)  # <sn-saved-dot>
        if self.rebind:
            self.u = u.detach()
        else:
            self.u.data = u.detach()  # <sn-swap>
        return F.linear(x, w / sigma, self.layer.bias)


def critic_step(rebind=False):
    torch.manual_seed(0)
    critic = PowerNormalized(nn.Linear(6, 4), rebind)
    real, fake = torch.randn(8, 6), torch.randn(8, 6)
    loss = critic(fake).sum() - critic(real).sum()  # two calls, one backward
    loss.backward()
    return list(critic.parameters())


SWAPS = {
    "local": (swap_local, copy_local, "local-swap", {"local-saved"}, "gain"),
    "attribute, training loop": (swap_attribute_in_a_training_loop, lambda: swap_attribute_in_a_training_loop(
        "anneal_by_copy"), "attr-swap", {"attr-saved"}, "self.temperature"),
    "list element": (swap_list_element, copy_list_element, "list-swap", {"list-saved"}, "scales[0]"),
    "dict value, setattr": (swap_dict_value, lambda: swap_dict_value("copy"), "dict-swap", {"dict-saved"},
                            'state["u"]'),
    "closure": (swap_closure, lambda: swap_closure(make_rebinding_scaler), "closure-swap", {"closure-saved"},
                "scale"),
    "helper object": (swap_helper_object, lambda: swap_helper_object("load_by_copy"), "helper-swap",
                      {"helper-saved"}, "self.tensor"),
    "parameters restored by a context manager": (sharpness_step, lambda: sharpness_step(backward_inside=True),
                                                 "sam-restore", {"sam-saved"}, "model.w2"),
    "power iteration between two calls": (critic_step, lambda: critic_step(rebind=True), "sn-swap",
                                          {"sn-saved-mv", "sn-saved-dot"}, "self.u"),
}


@pytest.mark.parametrize("case", list(SWAPS), ids=list(SWAPS))
def test_a_swap_of_memory_a_graph_saved_is_silent_data_mutation(case):
    program, reference, culprit, saved, name = SWAPS[case]
    torch.manual_seed(0)
    expected = gradients(reference())
    torch.manual_seed(0)
    plain = gradients(program())
    assert not same(plain, expected), "the oracle: the swap changes the gradients, and nothing raises"
    torch.manual_seed(0)
    trace, error, leaves = run_captured(program)
    assert error is None and same(gradients(leaves), plain), "the captured program runs as the plain one"
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.tensor) == ("silent-data-mutation", line_of(culprit), name)
    assert d.saved_line in {line_of(m) for m in saved}
    assert "swapped the memory behind it with `.data =`" in d.message and "There is no one-line fix" in d.fix


def test_the_rebinding_example_of_the_fix_gives_the_reference_gradients():
    trace, _, _ = run_captured(critic_step)
    [d] = trace.diagnoses
    assert "    self.u = u.detach()" in d.fix.splitlines()  # what critic_step(rebind=True) runs
    torch.manual_seed(0)
    assert not same(gradients(critic_step()), gradients(critic_step(rebind=True)))


def linear_weights_swapped_and_restored(backward_inside=False):
    """nn.Linear saves `weight.t()`, a view with the memory the weight had: restoring `.data` before
    backward changes nothing the graph reads."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    with perturbed(model, 0.05):
        loss = F.mse_loss(model(x), y)
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    return list(model.parameters())


def output_swapped():
    """A saved output is kept by the graph as a tensor of its own: swapping the user's is harmless."""
    x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    y = x.exp()
    y.data = torch.zeros(4)
    y.sum().backward()
    return [x]


def output_copied():
    x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    y = x.exp()
    y.sum().backward()
    return [x]


def averaged_weights_swapped_in_after_the_step():
    """Evaluating with averaged weights: swapped in after the step, when no graph needs them."""
    torch.manual_seed(0)
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    average = [p.detach().clone() for p in model.parameters()]
    for step in range(2):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        for a, p in zip(average, model.parameters()):
            a.mul_(0.9).add_(p.detach(), alpha=0.1)
    backup = [p.data for p in model.parameters()]
    for a, p in zip(average, model.parameters()):
        p.data = a
    with torch.no_grad():
        model(torch.randn(8, 4))
    for b, p in zip(backup, model.parameters()):
        p.data = b
    return list(model.parameters())


@pytest.mark.parametrize("program, reference", [
    (linear_weights_swapped_and_restored, lambda: linear_weights_swapped_and_restored(backward_inside=True)),
    (output_swapped, output_copied),
    (averaged_weights_swapped_in_after_the_step, averaged_weights_swapped_in_after_the_step),
], ids=["views of the weights saved", "a saved output", "after the step"])
def test_a_swap_the_graph_does_not_read_is_fine(program, reference):
    torch.manual_seed(0)
    expected = gradients(reference())
    torch.manual_seed(0)
    assert same(gradients(program()), expected), "the oracle: the gradients are right"
    torch.manual_seed(0)
    trace, error, _ = run_captured(program)
    assert error is None and trace.diagnoses == []
    assert any(op.name == "Tensor.data =" and op.writes for op in trace.ops)  # seen, and judged harmless


def test_a_swap_that_fails_raises_as_without_the_tool():
    def load(p):
        p.data = torch.zeros(2, dtype=torch.int64).numpy()  # not a tensor  # <bad-swap>

    p = nn.Parameter(torch.ones(2))
    plain, _ = run_plain(load, p)
    trace, captured, _ = run_captured(load, p)
    assert type(captured) is type(plain) and str(captured) == str(plain)
    frames = [f.filename for f in __import__("traceback").extract_tb(captured.__traceback__)]
    assert not any("jupyter_autograd" in f for f in frames), frames
    assert [d for d in trace.diagnoses] == []


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.save_for_backward(s)
        return x * s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return grad * s, None


def swap_saved_by_a_custom_function(swap=True):
    x = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    s = torch.full((4,), 2.0)
    y = Scale.apply(x, s)  # <custom-saved>
    if swap:
        s.data = torch.zeros(4)  # <custom-swap>
    else:
        s = torch.zeros(4)
    y.sum().backward()
    return [x]


def swap_late_in_a_long_loop(steps=3200, swap=True):
    """Long enough that the early steps are folded (their details dropped) before the swap."""
    w = torch.ones(4, requires_grad=True)
    gain = torch.full((4,), 2.0)
    for step in range(steps):
        y = (w * gain).tanh().sum()  # <long-saved>
        if step == steps - 2:
            if swap:
                gain.data = torch.full((4,), 3.0)  # <long-swap>
            else:
                gain = torch.full((4,), 3.0)
        y.backward()
    return [w]


@pytest.mark.parametrize("program, reference, culprit, saved, name", [
    (swap_saved_by_a_custom_function, lambda: swap_saved_by_a_custom_function(swap=False), "custom-swap",
     "custom-saved", "s"),
    (swap_late_in_a_long_loop, lambda: swap_late_in_a_long_loop(swap=False), "long-swap", "long-saved", "gain"),
], ids=["saved by a custom Function", "late in a long loop"])
def test_a_swap_is_found_in_a_custom_function_and_after_folding(program, reference, culprit, saved, name):
    assert not same(gradients(program()), gradients(reference()))  # the oracle
    trace, error, _ = run_captured(program)
    assert error is None
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.saved_line, d.tensor) == ("silent-data-mutation", line_of(culprit), line_of(saved), name)
    if program is swap_late_in_a_long_loop:
        assert any("were folded" in note for note in trace.notes)


def test_a_swap_is_predicted_before_backward_runs():
    torch.manual_seed(0)
    model = TwoLayer()
    x = torch.randn(16, 4)
    with ja.capture() as trace:
        with perturbed(model, 0.05):
            loss = model(x).pow(2).mean()
    [d] = trace.diagnoses  # no backward ran: the graph of `loss` will read the restored values
    assert (d.kind, d.line, d.tensor, d.predicted) == ("silent-data-mutation", line_of("sam-restore"), "model.w2", True)
    del loss


# -- saved-tensor-modified at the block's end: only in a graph a backward could still run -------------
# The end of the block predicts what a backward not yet called will meet. A kept output whose graph
# shares a part that an earlier backward ran and freed (the class output of a second pass that only the
# domain loss used, DANN's `_, domain_output = net(t_img)`) is a graph no backward can run: its
# staleness after the step is no problem. The oracle, from plain PyTorch: without the step, a backward
# from that output raises "backward through the graph a second time".

class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 6)
        self.cls = nn.Linear(6, 3)
        self.dom = nn.Linear(6, 2)

    def forward(self, x):
        feature = torch.relu(self.trunk(x))
        return self.cls(feature), self.dom(feature)


class Keeper:
    last = None


def second_pass_output_discarded(keep, step=True):
    """(what the program keeps, the model): the class output of the target pass is kept by `keep`
    ("local", "dict", "attribute"), never backpropagated; the step changes the weights it saved."""
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    keeper, outputs, kept = Keeper(), {}, None
    for _ in range(2):
        source, target = torch.randn(5, 4), torch.randn(5, 4)
        cls_out, dom_out = model(source)
        if keep == "local":
            kept, dom_target = model(target)
        elif keep == "dict":
            outputs["cls"], dom_target = model(target)
        else:
            keeper.last, dom_target = model(target)
        loss = F.cross_entropy(cls_out, torch.zeros(5, dtype=torch.long)) + (dom_out - dom_target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if step:
            opt.step()
    return {"local": kept, "dict": outputs.get("cls"), "attribute": keeper.last}[keep], model


@pytest.mark.parametrize("keep", ["local", "dict", "attribute"])
def test_a_stale_output_whose_graph_a_backward_freed_is_fine(keep):
    kept, _ = second_pass_output_discarded(keep, step=False)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        kept.sum().backward()  # the oracle: no backward can run this graph, step or not
    trace, error, (kept, model) = run_captured(second_pass_output_discarded, keep)
    assert error is None and trace.warnings == []
    assert trace.diagnoses == [], trace.report()
    assert model.cls.weight._version > 0  # the step did change what its graph saved


def test_a_stale_output_never_backpropagated_is_still_predicted():
    """The same step after a forward whose graph no backward ran: a backward from it would raise."""
    def evaluated_before_the_step():
        torch.manual_seed(0)
        model = TwoHeads()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(5, 4)
        cls_out, dom_out = model(x)
        val_out, _ = model(torch.randn(5, 4))  # <kept-val>
        (cls_out.pow(2).mean() + dom_out.pow(2).mean()).backward()
        opt.step()  # <val-stepped>
        return val_out

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        evaluated_before_the_step().sum().backward()
    trace, error, val_out = run_captured(evaluated_before_the_step)
    assert error is None
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.predicted) == ("saved-tensor-modified", line_of("val-stepped"), True)


# -- graph-cut: grad recording switched off and left off -------------------------------------------

class Evaluator:
    """Evaluation helpers that switch grad off for the thread: each forgets to switch it back."""

    def __init__(self, model):
        self.model = model

    def accuracy(self, x, y):
        torch.set_grad_enabled(False)  # <cut-global>
        return (self.model(x).argmax(-1) == y).float().mean().item()

    def loss_logged(self, x, y, log=False):
        torch.autograd.set_grad_enabled(False)  # <cut-wrong-path>
        value = F.cross_entropy(self.model(x), y).item()
        if log:
            torch.autograd.set_grad_enabled(True)
        return value

    def begin(self):
        torch.no_grad().__enter__()  # <cut-enter>


def train_then_evaluate(evaluate):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    helper = Evaluator(model)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    try:
        for step in range(3):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            evaluate(helper, x, y)
    finally:
        torch.set_grad_enabled(True)  # the mode is global: leave the process as it was


def features_from(model, batches, mode):
    with mode():  # <cut-generator>
        for x, y in batches:
            yield model(x), y


def train_on_features(mode):
    torch.manual_seed(0)
    backbone, head = nn.Linear(4, 8), nn.Linear(8, 3)
    batches = [(torch.randn(16, 4), torch.randint(0, 3, (16,))) for _ in range(2)]
    stats = {}
    for feat, y in features_from(backbone, batches, mode):
        stats["loss"] = F.cross_entropy(head(feat.clone()), y)
        stats["loss"].backward()


class Trainer:
    def __init__(self):
        self.model = nn.Linear(4, 1)

    def step_under_the_callers_no_grad(self, x, y):
        with torch.no_grad():  # <cut-with-around-call>
            self.loss = self.compute_loss(x, y)
        self.loss.backward()

    def compute_loss(self, x, y):
        return F.mse_loss(self.model(x), y)


@torch.no_grad()  # <cut-decorated>
def predict(model, x):
    return model(x)


def train_with_predict():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    losses = [F.mse_loss(predict(model, torch.randn(8, 4)), torch.randn(8, 1))]
    losses[-1].backward()


CUTS = {
    "set_grad_enabled(False) in a helper method": (
        lambda: train_then_evaluate(lambda h, x, y: h.accuracy(x, y)), "cut-global", "loss"),
    "autograd.set_grad_enabled, switched back on another path": (
        lambda: train_then_evaluate(lambda h, x, y: h.loss_logged(x, y)), "cut-wrong-path", "loss"),
    "no_grad().__enter__() on a helper object": (
        lambda: train_then_evaluate(lambda h, x, y: h.begin()), "cut-enter", "loss"),
    "a generator suspended inside no_grad, dict value": (
        lambda: train_on_features(torch.no_grad), "cut-generator", 'stats["loss"]'),
    "a generator suspended inside inference_mode, dict value": (
        lambda: train_on_features(torch.inference_mode), "cut-generator", 'stats["loss"]'),
    "with no_grad around the call of the loss function, attribute": (
        lambda: Trainer().step_under_the_callers_no_grad(torch.randn(8, 4), torch.randn(8, 1)),
        "cut-with-around-call", "self.loss"),
    "a decorated helper: cut at its decorator, list element": (train_with_predict, "cut-decorated", None),
}


@pytest.mark.parametrize("case", list(CUTS), ids=list(CUTS))
def test_a_cut_is_named_where_grad_was_switched_off(case):
    program, culprit, name = CUTS[case]
    plain, _ = run_plain(program)
    assert isinstance(plain, RuntimeError) and "does not require grad" in str(plain)  # the oracle
    assert torch.is_grad_enabled()
    trace, error, _ = run_captured(program)
    assert torch.is_grad_enabled()
    assert type(error) is RuntimeError and str(error) == str(plain)
    [d] = trace.diagnoses
    assert (d.kind, d.line) == ("graph-cut", line_of(culprit))
    if name is not None:
        assert d.tensor == name
    else:  # `losses[-1]` was never assigned a name: described, never misnamed `losses`
        assert d.tensor.startswith("the float32 result of F.mse_loss")
    if culprit != "cut-decorated":
        assert "switched gradient recording off" in d.message and "There is no one-line fix" in d.fix


def test_a_with_block_around_the_loss_in_the_same_function_stays_at_the_op():
    def step(model, x):
        with torch.no_grad():
            pred = model(x)  # <cut-inside-with>
        pred.sum().backward()

    trace, error, _ = run_captured(step, nn.Linear(3, 1), torch.randn(4, 3))
    assert "does not require grad" in str(error)
    [d] = trace.diagnoses
    assert (d.kind, d.line) == ("graph-cut", line_of("cut-inside-with"))
    assert d.tensor.startswith("the float32 result of Tensor.sum")  # `pred.sum()`: no name of its own


def test_evaluation_under_a_balanced_switch_is_fine():
    def fit(model, opt, x, y):
        for step in range(3):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            previous = torch.is_grad_enabled()
            torch.set_grad_enabled(False)
            F.mse_loss(model(x), y).item()
            torch.set_grad_enabled(previous)
            with torch.inference_mode():
                model(x).sum().item()

    model = nn.Linear(4, 1)
    trace, error, _ = run_captured(fit, model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 4),
                                   torch.randn(8, 1))
    assert error is None and trace.diagnoses == []
    assert model.weight.grad is not None  # the oracle: every step trained


def test_inference_mode_hooks_are_gone_after_the_block():
    enter, exit_ = torch.inference_mode.__enter__, torch.inference_mode.__exit__
    with ja.capture():
        with torch.inference_mode():
            y = torch.ones(2) * 2
    assert torch.inference_mode.__enter__ is enter and torch.inference_mode.__exit__ is exit_
    assert y.is_inference() and torch.is_grad_enabled()


# -- leaf-inplace: every write into a leaf that requires grad --------------------------------------

class Rotary(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.freq = nn.Parameter(torch.empty(dim))

    def reset(self):
        torch.arange(self.freq.numel(), out=self.freq)  # <leaf-out-attr>


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 3)
        self.gate = nn.Parameter(torch.ones(3))


def zero_padding_row(model):
    model.emb.weight[0].fill_(0)  # <leaf-subscript>


def scale_in_place(params):
    params[0].add_(1.0)  # <leaf-list>


def reset_state(state):
    state["w"].zero_()  # <leaf-dict>


def make_loader(w):
    def load(values):
        w.copy_(values)  # <leaf-closure>
    return load


class Bank:
    def __init__(self):
        self.weight = nn.Parameter(torch.zeros(3))


class Holder:
    def __init__(self):
        self.bank = Bank()

    def bump(self):
        self.bank.weight += 1  # <leaf-augmented>


def rectify(model):
    F.relu(model.gate, inplace=True)  # <leaf-inplace-kw>


def set_first(model):
    model.gate[0] = 0.0  # <leaf-setitem>


def out_into_local():
    w = torch.zeros(3, requires_grad=True)
    torch.mul(torch.ones(3), 2.0, out=w)  # <leaf-out-local>


LEAF_WRITES = {
    "out= into a parameter attribute": (lambda: Rotary(4).reset(), "leaf-out-attr", "self.freq"),
    "out= into a local": (out_into_local, "leaf-out-local", "w"),
    "a subscripted view, inside a function": (lambda: zero_padding_row(Tagger()), "leaf-subscript",
                                              "model.emb.weight"),
    "a list element": (lambda: scale_in_place([nn.Parameter(torch.ones(2))]), "leaf-list", "params[0]"),
    "a dict value": (lambda: reset_state({"w": torch.ones(2, requires_grad=True)}), "leaf-dict", 'state["w"]'),
    "copy_ into a closure variable": (lambda: make_loader(torch.ones(2, requires_grad=True))(torch.zeros(2)),
                                      "leaf-closure", "w"),
    "+= on a helper object's parameter": (lambda: Holder().bump(), "leaf-augmented", "self.bank.weight"),
    "inplace=True": (lambda: rectify(Tagger()), "leaf-inplace-kw", "model.gate"),
    "an indexed assignment": (lambda: set_first(Tagger()), "leaf-setitem", "model.gate"),
}


@pytest.mark.parametrize("case", list(LEAF_WRITES), ids=list(LEAF_WRITES))
def test_every_write_into_a_leaf_is_leaf_inplace(case):
    program, culprit, name = LEAF_WRITES[case]
    plain, _ = run_plain(program)
    assert isinstance(plain, RuntimeError)  # the oracle: PyTorch refuses the write
    trace, error, _ = run_captured(program)
    assert type(error) is RuntimeError and str(error) == str(plain)
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.tensor) == ("leaf-inplace", line_of(culprit), name)
    assert str(plain).split("\n")[0] in d.message


def test_the_out_fix_keeps_the_parameter_trainable():
    trace, _, _ = run_captured(lambda: Rotary(4).reset())
    [d] = trace.diagnoses
    assert "self.freq.copy_(torch.arange(self.freq.numel()))" in d.fix
    rotary = Rotary(4)
    with torch.no_grad():
        rotary.freq.copy_(torch.arange(rotary.freq.numel()))  # the fix, as it reads
    assert rotary.freq.requires_grad and rotary.freq.tolist() == [0.0, 1.0, 2.0, 3.0]
    with torch.no_grad():
        torch.arange(4, out=rotary.freq)  # the usual remedy for an in-place write...
    assert not rotary.freq.requires_grad  # ...would have frozen it (the oracle for the wording)


def test_out_with_an_input_that_requires_grad_is_not_a_leaf_write():
    def program():
        w = torch.ones(3, requires_grad=True)
        buffer = torch.zeros(3)
        torch.mul(w, 2.0, out=buffer)

    plain, _ = run_plain(program)
    assert "out=" in str(plain)
    trace, error, _ = run_captured(program)
    assert str(error) == str(plain)
    assert not [d for d in trace.diagnoses if d.kind == "leaf-inplace"]


def test_out_into_a_leaf_under_no_grad_is_fine():
    def program():
        rotary = Rotary(4)
        with torch.no_grad():
            torch.arange(4, out=rotary.freq)
        return rotary

    trace, error, rotary = run_captured(program)
    assert error is None and trace.diagnoses == [] and rotary.freq.tolist() == [0.0, 1.0, 2.0, 3.0]


# -- names of tensors made inside functions ------------------------------------------------------

class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, obs):
        return torch.distributions.Categorical(logits=self.body(obs))


def reinforce_loss(policy, obs, actions, returns):
    dist = policy(obs)
    log_prob = dist.log_prob(
        actions
    ).squeeze(-1)
    regulariser = 0.01 * (log_prob ** 2).mean()  # <names-saved>
    first = log_prob[:1]
    first.zero_()  # <names-write>
    return -(log_prob * returns).mean() + regulariser


def policy_training(episodes=2):
    torch.manual_seed(0)
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    for episode in range(episodes):
        loss = reinforce_loss(policy, torch.randn(6, 4), torch.randint(0, 3, (6,)), torch.linspace(1.0, 0.5, 6))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_statement_over_several_lines_names_what_it_assigns():
    plain, _ = run_plain(policy_training)
    assert "modified by an inplace operation" in str(plain)  # the oracle
    trace, error, _ = run_captured(policy_training)
    assert str(error) == str(plain)
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.saved_line, d.tensor) == (
        "saved-tensor-modified", line_of("names-write"), line_of("names-saved"), "log_prob")
    squeezed = [op for op in trace.ops if op.name == "Tensor.squeeze" and op.location.function == "reinforce_loss"]
    assert [trace.tensors[op.outputs[0]].name for op in squeezed] == [None, "log_prob"]  # the inner one is not


class Sharpen(nn.Module):
    def forward(self, x):
        return torch.sigmoid(4 * x)  # <names-user-layer>


class DepthNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Conv2d(3, 4, 3, padding=1)
        self.decoder = nn.Sequential(nn.Conv2d(4, 1, 3, padding=1), Sharpen())
        self.refine = Sharpen()

    def forward(self, image):
        feat = self.encoder(image)
        disp = self.decoder(feat)  # <names-sequential>
        refined = self.refine(
            disp
        )
        refined[refined < 0.01] = 0.01  # <names-depth-write>
        return disp, refined


def depth_step():
    torch.manual_seed(0)
    disp, refined = DepthNet()(torch.randn(1, 3, 8, 8))
    (disp.mean() + refined.mean()).backward()


def test_a_sub_models_output_is_named_by_the_call_and_nothing_else_is():
    plain, _ = run_plain(depth_step)
    assert "modified by an inplace operation" in str(plain)  # the oracle
    trace, error, _ = run_captured(depth_step)
    assert str(error) == str(plain)
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.saved_line, d.tensor) == (
        "saved-tensor-modified", line_of("names-depth-write"), line_of("names-user-layer"), "refined")
    by_name = {}
    for info in trace.tensors.values():
        by_name.setdefault(info.name, []).append(info)
    [disp] = by_name["disp"]  # the Sequential's last layer returned it; its conv did not
    assert trace.ops[disp.created_by].name == "torch.sigmoid"
    assert trace.ops[disp.created_by].index < trace.ops[by_name["refined"][0].created_by].index


def _features(x, w):
    return torch.sigmoid(x @ w)  # <names-compiled-save>


features = torch.compile(_features)


def compiled_step(x, w, features=features):
    out = features(x, w)  # <names-compiled-call>
    out *= 2  # <names-compiled-write>
    out.sum().backward()


def test_a_compiled_functions_output_is_the_callers_name_and_its_save_the_line_inside():
    torch.manual_seed(0)
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(5, 4)
    plain, _ = run_plain(compiled_step, x, w)
    assert "modified by an inplace operation" in str(plain)  # the oracle
    trace, error, _ = run_captured(compiled_step, x, w)
    assert str(error) == str(plain)
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.saved_line, d.tensor) == (
        "saved-tensor-modified", line_of("names-compiled-write"), line_of("names-compiled-save"), "out")
    assert "out = out * 2" in d.fix
    # The same program without torch.compile is diagnosed the same: the save is the sigmoid inside.
    eager, _, _ = run_captured(compiled_step, x, w, _features)
    [e] = eager.diagnoses
    assert (e.kind, e.line, e.saved_line, e.tensor) == (d.kind, d.line, d.saved_line, d.tensor)


# -- a functional that writes what it is given without an inplace= flag ------------------------------

class _EntityScorer(nn.Module):
    """An embedding with max_norm renormalises the rows it looks up in place (PyTorch's documentation
    of nn.Embedding says so): the whole table, used before the lookup, was saved as it was."""

    def __init__(self):
        super().__init__()
        self.entity = nn.Embedding(3, 5, max_norm=True)
        self.W = nn.Parameter(torch.randn(7, 5))

    def forward(self, idx):
        a = self.entity.weight @ self.W.t()  # SAVED
        b = self.entity(idx) @ self.W.t()
        return a.unsqueeze(0) + b.unsqueeze(1)


class _EntityScorerReadingACopy(_EntityScorer):
    def forward(self, idx):
        a = self.entity.weight.clone() @ self.W.t()
        b = self.entity(idx) @ self.W.t()
        return a.unsqueeze(0) + b.unsqueeze(1)


def test_a_lookup_that_renormalises_the_saved_table_gets_the_documented_copy_on_the_saving_line():
    import inspect

    torch.manual_seed(0)
    _EntityScorerReadingACopy()(torch.tensor([1, 2])).sum().backward()  # the oracle: the copy runs
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _EntityScorer()(torch.tensor([1, 2])).sum().backward()
    torch.manual_seed(0)
    with ja.capture() as trace:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            _EntityScorer()(torch.tensor([1, 2])).sum().backward()
    [d] = trace.diagnoses
    assert d.kind == "saved-tensor-modified" and "inplace=True" not in d.fix + d.message, d.fix
    lines, first = inspect.getsourcelines(_EntityScorer.forward)
    saved = first + next(i for i, line in enumerate(lines) if "# SAVED" in line)
    assert "Replace line %d" % saved in d.fix and "a = self.entity.weight.clone() @ self.W.t()" in d.fix, d.fix
