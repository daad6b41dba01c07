"""graph-cut and missing-grad where the tool disagreed with PyTorch: what decides each is a fact
of the program, wherever the tensors live and however the cut is spelled.

Every case runs plain first, and an oracle from PyTorch alone says what is true: which parameters
the optimizer holds and whether their `.grad` is None, which parameters an op used with grad on
(a TorchFunctionMode watching the plain run), whether the weights after a step change when a term
of the loss is weighted 0. Under capture() the diagnoses must say exactly that.
"""
import functools
import inspect
import runpy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

import jupyter_autograd as ja


def _line_of(function, marker="# CULPRIT"):
    lines, first = inspect.getsourcelines(function)
    [at] = [i for i, line in enumerate(lines) if marker in line]
    return first + at


def _problems(trace):
    return [(d.kind, d.line, d.tensor) for d in trace.diagnoses]


class UsedWithGrad(TorchFunctionMode):
    """Notes every tensor an op took to make a result with a grad_fn: the uses through which a
    gradient could reach it (not `p.dim()`, not an initialisation, not an op under no_grad)."""

    def __init__(self):
        super().__init__()
        self.used = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if isinstance(result, torch.Tensor) and result.grad_fn is not None:
            for a in list(args) + list((kwargs or {}).values()):
                for t in (a if isinstance(a, (list, tuple)) else [a]):
                    if isinstance(t, torch.Tensor):
                        self.used.add(id(t))
        return result


def _held(opt):
    return [p for group in opt.param_groups for p in group["params"]]


# -- a parameter used only with grad off is not starved: it is not trained in this block ---------

class Backbone(nn.Module):
    def __init__(self, freeze):
        super().__init__()
        self.enc, self.head, self.freeze = nn.Linear(3, 4), nn.Linear(4, 2), freeze

    def forward(self, x):
        return self.head(torch.tanh(self.freeze(self.enc, x)))


def under_no_grad(layer, x):
    with torch.no_grad():
        return layer(x)


def under_set_grad_enabled(layer, x):
    with torch.set_grad_enabled(False):
        z = layer(x)
    return z


def under_inference_mode(layer, x):
    with torch.inference_mode():
        z = layer(x)
    return z.clone()


class Frozen:
    """A helper object that runs the layer it is given without a graph."""

    def __call__(self, layer, x):
        with torch.no_grad():
            out = layer(x)
        return out


def in_a_closure():
    def run(layer, x):
        def inner():
            with torch.no_grad():
                return layer(x)
        return inner()
    return run


@pytest.mark.parametrize("freeze", [under_no_grad, under_set_grad_enabled, under_inference_mode, Frozen(),
                                    in_a_closure()])
def test_a_parameter_used_only_with_grad_off_is_not_starved(freeze):
    def train():
        torch.manual_seed(0)
        model = Backbone(freeze)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # every parameter, the frozen backbone's too
        for _ in range(2):
            loss = F.mse_loss(model(torch.randn(5, 3)), torch.randn(5, 2))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return model, opt

    watch = UsedWithGrad()
    with watch:
        model, opt = train()
    assert id(model.enc.weight) in {id(p) for p in _held(opt)} and model.enc.weight.grad is None
    assert id(model.enc.weight) not in watch.used and id(model.head.weight) in watch.used
    with ja.capture() as trace:
        train()
    assert trace.diagnoses == [] and trace.warnings == [], trace.report()
    [note] = [n for n in trace.notes if "model.enc.weight" in n]
    assert "gradient recording off" in note and "model.enc.bias" in note


def test_a_parameter_used_with_grad_on_and_cut_is_still_starved():
    def train():
        torch.manual_seed(0)
        enc, head = nn.Linear(3, 4), nn.Linear(4, 2)
        opt = torch.optim.SGD([*enc.parameters(), *head.parameters()], lr=0.1)
        with torch.no_grad():  # a look at the features, not the forward
            enc(torch.randn(5, 3))
        z = enc(torch.randn(5, 3)).detach()  # CULPRIT
        loss = head(z).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return enc

    assert train().weight.grad is None
    with ja.capture() as trace:
        train()
    assert _problems(trace) == [("missing-grad", _line_of(train), "enc.weight")], trace.report()


# -- a leaf whose name is rebound to its moved copy, requires_grad set after it was made ---------
# The oracle: what the name holds at the end is not a leaf, and its `.grad` is None (PyTorch warns
# when it is read); the leaf that gets the gradient has no name left.

def inputs_rebound_to_a_cast(probe):
    torch.manual_seed(0)
    inputs = torch.randn(3, 5, dtype=torch.float64)
    targets = torch.tensor([1, 2, 3])
    inputs.requires_grad = True
    inputs = inputs.float()  # CULPRIT
    net = nn.Linear(5, 4)
    for i in range(2):
        F.cross_entropy(net(inputs), targets).backward()
        probe(inputs)
    return inputs


class Batch:
    def __init__(self):
        self.x = torch.randn(4, 3)
        self.x.requires_grad_()
        self.x = self.x.to(torch.float64)  # CULPRIT


def attribute_rebound_to_a_move(probe):
    torch.manual_seed(0)
    batch = Batch()
    w = torch.randn(3, 2, dtype=torch.float64)
    for _ in range(2):
        (batch.x @ w).pow(2).mean().backward()
        probe(batch.x)
    return batch.x


@pytest.mark.parametrize("case, name, where", [(inputs_rebound_to_a_cast, "inputs", inputs_rebound_to_a_cast),
                                               (attribute_rebound_to_a_move, "self.x", Batch.__init__)])
def test_a_leaf_given_requires_grad_after_it_was_made_then_moved(case, name, where):
    seen = []
    with pytest.warns(UserWarning, match="not a leaf Tensor"):
        held = case(lambda t: seen.append(t.grad))
    assert seen == [None, None] and not held.is_leaf
    with ja.capture() as trace:
        case(lambda t: None)
    assert _problems(trace) == [("missing-grad", _line_of(where), name)], trace.report()


_TUPLE_MOVE = """\
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
inputs = torch.randn(3, 5, dtype=torch.float64)
targets = torch.tensor([1, 2, 3])
inputs.requires_grad = True
inputs, targets = inputs.float(), targets.long()
net = nn.Linear(5, 4)
F.cross_entropy(net(inputs), targets).backward()
"""


def test_a_tuple_assignment_that_moves_the_leaf_gets_a_fix_that_runs(tmp_path):
    program = tmp_path / "moved.py"
    program.write_text(_TUPLE_MOVE)
    with ja.capture() as trace:
        done = runpy.run_path(str(program))
    assert not done["inputs"].is_leaf
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.tensor) == ("missing-grad", 9, "inputs"), trace.report()
    fixed_line = d.fix.splitlines()[-1].strip()
    assert fixed_line == "inputs, targets = inputs.float().detach().requires_grad_(), targets.long()"
    program.write_text(_TUPLE_MOVE.replace("inputs, targets = inputs.float(), targets.long()", fixed_line))
    done = runpy.run_path(str(program))
    assert done["inputs"].is_leaf and done["inputs"].grad is not None


# -- a loss whose backward reaches only a new leaf rebuilt from what the model computed ----------
# The oracle: backward raises nothing, and not one parameter the optimizer holds gets a gradient
# (the backward trains nothing). A leaf made from data alone, whose gradient is what the user
# wants (an input saliency, an attack on a frozen model), is no problem.

def loss_rebuilt_from_item(model, x, y):
    loss = F.mse_loss(model(x), y)
    loss = torch.tensor(loss.item(), requires_grad=True)  # CULPRIT
    return loss


def _binarised(pred):
    return torch.tensor((pred > 0.5).type(pred.dtype), requires_grad=True)  # CULPRIT


def loss_from_a_rewrapped_prediction(model, x, y):
    return F.mse_loss(_binarised(torch.sigmoid(model(x))), y)


class StageLosses:
    def __init__(self):
        self.parts = {}

    def total(self):
        return torch.tensor([v.item() for v in self.parts.values()], requires_grad=True).sum()  # CULPRIT


def loss_summed_from_stage_numbers(model, x, y):
    stages = StageLosses()
    out = model(x)
    stages.parts["fit"] = F.mse_loss(out, y)
    stages.parts["size"] = out.abs().mean()
    return stages.total()


def _train(make_loss):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        make_loss(model, torch.randn(5, 3), torch.rand(5, 2)).backward()
        opt.step()
    return opt


@pytest.mark.parametrize("make_loss, where", [(loss_rebuilt_from_item, loss_rebuilt_from_item),
                                              (loss_from_a_rewrapped_prediction, _binarised),
                                              (loss_summed_from_stage_numbers, StageLosses.total)])
def test_a_backward_that_reaches_only_a_rebuilt_leaf_is_one_graph_cut(make_loss, where):
    opt = _train(make_loss)
    assert all(p.grad is None for p in _held(opt))
    with ja.capture() as trace:
        _train(make_loss)
    assert [(kind, line) for kind, line, _ in _problems(trace)] == [("graph-cut", _line_of(where))], trace.report()


def saliency_of_a_copied_batch(model, x, y):
    x = x.clone().requires_grad_()
    model(x).sum().backward()
    return x.grad


def attack_on_a_frozen_model(model, x, y):
    model.requires_grad_(False)
    x_adv = x.clone().requires_grad_()
    for _ in range(2):
        grad, = torch.autograd.grad(F.mse_loss(model(x_adv), y), x_adv)
        x_adv = (x_adv + 0.1 * grad.sign()).detach().requires_grad_()
        F.mse_loss(model(x_adv), y).backward()
    return x_adv.grad


@pytest.mark.parametrize("case", [saliency_of_a_copied_batch, attack_on_a_frozen_model])
def test_a_leaf_made_from_data_alone_is_what_backward_is_for(case):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x, y = torch.randn(5, 3), torch.rand(5, 2)
    assert case(model, x, y) is not None
    with ja.capture() as trace:
        case(model, x, y)
    assert _problems(trace) == [], trace.report()


# -- a round trip through NumPy or Python numbers inside a helper: the link follows the value ----
# torch.from_numpy is not recorded: the tensor it makes is first seen where it is used, in the
# caller. The oracle: the parameter before the round trip ends with `.grad is None`.

def numpy_round_trip(t):
    return torch.from_numpy(t.detach().cpu().numpy())  # CULPRIT


class Featurizer:
    def encode(self, layer, inp):
        values = layer(inp).detach().numpy()  # CULPRIT
        return torch.as_tensor(values)


class RoundTripNet(nn.Module):
    def __init__(self, home):
        super().__init__()
        self.enc, self.head, self.home, self.featurizer = nn.Linear(3, 4), nn.Linear(4, 2), home, Featurizer()

    def forward(self, x):
        def encode():
            cut = torch.from_numpy(self.enc(x).detach().cpu().numpy())  # CULPRIT
            return cut
        if self.home == "function":
            z = numpy_round_trip(self.enc(x))
        elif self.home == "method":
            z = self.featurizer.encode(self.enc, x)
        else:
            z = encode()
        print_every = z.shape[0]  # noqa: F841 (a read of the shape between the round trip and the use)
        return self.head(torch.tanh(z))


def _round_trip_training(home):
    torch.manual_seed(0)
    model = RoundTripNet(home)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(torch.randn(5, 3)), torch.rand(5, 2)).backward()
        opt.step()
    return model


@pytest.mark.parametrize("home, where", [("function", numpy_round_trip), ("method", Featurizer.encode),
                                         ("closure", RoundTripNet.forward)])
def test_a_round_trip_inside_a_helper_starves_what_came_before(home, where):
    model = _round_trip_training(home)
    assert model.enc.weight.grad is None and model.head.weight.grad is not None
    with ja.capture() as trace:
        _round_trip_training(home)
    assert _problems(trace) == [("missing-grad", _line_of(where), "model.enc.weight")], trace.report()


# -- a module called inside a grad-off `with` in its caller: the cut is the call in that block ----
# The oracle: backward raises "does not require grad". The line named is the one of the `with`
# block that ran under grad off (the call of the module), as for an op written in the block.

class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(8, 4)), nn.Parameter(torch.randn(3, 8))

    def forward(self, x):
        return F.linear(F.relu(F.linear(x, self.w1)), self.w2)


class QueryLoss(nn.Module):
    def __init__(self, switch):
        super().__init__()
        self.net, self.switch = TwoLayer(), switch

    def forward(self, x, y):
        with self.switch():
            logits = self.net(x)  # CULPRIT
            loss = F.cross_entropy(logits, y)
        return loss


@pytest.mark.parametrize("switch", [torch.no_grad, functools.partial(torch.set_grad_enabled, False),
                                    torch.inference_mode])
def test_a_module_called_inside_a_grad_off_block_is_cut_at_its_call(switch):
    def train():
        torch.manual_seed(0)
        model = QueryLoss(switch)
        model(torch.randn(6, 4), torch.randint(0, 3, (6,))).backward()

    with pytest.raises(RuntimeError, match="does not require grad"):
        train()
    with ja.capture() as trace:
        with pytest.raises(RuntimeError, match="does not require grad"):
            train()
    assert [(kind, line) for kind, line, _ in _problems(trace)] == [("graph-cut", _line_of(QueryLoss.forward))], \
        trace.report()


# -- a parameter replaced by a new nn.Parameter after the optimizer was built ----------------------
# The oracle: the optimizer still holds the old parameter, which the module no longer holds, and
# whose `.grad` is None at the end; the module's parameter now is one the optimizer does not hold.

class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.mask = nn.Parameter(torch.ones(4, 3))
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x * self.mask.sum(0))

    def prune(self):
        with torch.no_grad():
            kept = (self.mask.abs() >= self.mask.abs().median()).float()
        self.mask = nn.Parameter(kept)  # CULPRIT


def replaced_by_a_method(model):
    model.prune()


def replaced_from_outside(model):
    model.mask = nn.Parameter(model.mask.detach() * 0.5)  # CULPRIT


@pytest.mark.parametrize("replace", [replaced_by_a_method, replaced_from_outside])
def test_a_parameter_replaced_after_the_optimizer_was_built(replace):
    def train():
        torch.manual_seed(0)
        model = Masked()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            opt.zero_grad()
            F.mse_loss(model(torch.randn(4, 3)), torch.rand(4, 2)).backward()
            opt.step()
            if step == 1:
                replace(model)
        return model, opt

    model, opt = train()
    [old] = [p for p in _held(opt) if p.shape == (4, 3)]
    assert old is not model.mask and old.grad is None and model.mask.grad is not None
    assert all(p is not model.mask for p in _held(opt))
    with ja.capture() as trace:
        train()
    where = Masked.prune if replace is replaced_by_a_method else replace
    assert [(kind, line) for kind, line, _ in _problems(trace)] == [("missing-grad", _line_of(where))], \
        trace.report()


# -- a term of the loss that trains nothing: computed from tensors that required grad, added with ---
# no path to any of them. The oracle: the weights after a step are the same with the term weighted 0.

def _agreement(logits, y):
    return (logits.argmax(1) == y).float().mean()  # CULPRIT


class Penalties:
    def __init__(self):
        self.terms = {}

    def add(self, name, value):
        self.terms[name] = torch.tensor(value.item())  # CULPRIT

    def total(self):
        return sum(self.terms.values())


def term_through_argmax(model, x, y, weight):
    logits = model(x)
    return F.cross_entropy(logits, y) + weight * (1 - _agreement(logits, y))


def term_kept_by_a_helper_object(model, x, y, weight):
    logits = model(x)
    penalties = Penalties()
    penalties.add("size", logits.pow(2).mean())
    return F.cross_entropy(logits, y) + weight * penalties.total()


def term_that_trains(model, x, y, weight):
    logits = model(x)
    return F.cross_entropy(logits, y) + weight * logits.pow(2).mean()


def term_from_data_alone(model, x, y, weight):
    return F.cross_entropy(model(x), y) + weight * torch.tensor(0.5)


def detached_baseline_in_a_product(model, x, y, weight):
    logits = model(x)
    logp = F.log_softmax(logits, 1).gather(1, y[:, None]).squeeze(1)
    baseline = logits.max(1).values.mean().detach()
    return -(logp * (1.0 - weight * baseline)).mean()


def _step_with(make_loss, weight):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(2):
        x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
        opt.zero_grad()
        make_loss(model, x, y, weight).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("make_loss, where", [(term_through_argmax, _agreement),
                                              (term_kept_by_a_helper_object, Penalties.add)])
def test_a_term_with_no_path_to_what_it_was_computed_from_is_cut(make_loss, where):
    assert all(torch.equal(a, b) for a, b in zip(_step_with(make_loss, 0.0), _step_with(make_loss, 1.0)))
    with ja.capture() as trace:
        _step_with(make_loss, 1.0)
    assert [(kind, line) for kind, line, _ in _problems(trace)] == [("graph-cut", _line_of(where))], trace.report()


@pytest.mark.parametrize("make_loss", [term_that_trains, term_from_data_alone, detached_baseline_in_a_product])
def test_a_term_that_trains_or_was_never_computed_from_the_model_is_fine(make_loss):
    trains = not all(torch.equal(a, b) for a, b in zip(_step_with(make_loss, 0.0), _step_with(make_loss, 1.0)))
    assert trains == (make_loss is not term_from_data_alone)
    with ja.capture() as trace:
        _step_with(make_loss, 1.0)
    assert _problems(trace) == [], trace.report()


def test_a_detached_term_of_what_the_step_trains_starves_it():
    # Issue 29, principle 2 (this test said the opposite before it): a term computed from the
    # parameters the step updates, detached, then added to the loss, changes no weight (the oracle:
    # weight 0 and 1 give the same step), though without the cut it would. The cross-entropy keeps the
    # loss connected; the cut is named at the detach (tests/test_starved.py has the family).
    def make_loss(model, x, y, weight):
        logits = model(x)
        return F.cross_entropy(logits, y) + weight * logits.pow(2).mean().detach()  # CULPRIT

    def without_the_cut(model, x, y, weight):
        logits = model(x)
        return F.cross_entropy(logits, y) + weight * logits.pow(2).mean()

    assert all(torch.equal(a, b) for a, b in zip(_step_with(make_loss, 0.0), _step_with(make_loss, 1.0)))
    assert not all(torch.equal(a, b) for a, b in zip(_step_with(without_the_cut, 0.0), _step_with(without_the_cut, 1.0)))
    with ja.capture() as trace:
        _step_with(make_loss, 1.0)
    assert [(kind, line) for kind, line, _ in _problems(trace)] == [("graph-cut", _line_of(make_loss))], trace.report()


# -- a cut that drops a graph, beside a model run with no graph on purpose ---------------------------

class _Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 3)


class _RewardModel:
    """Scores what the policy did; run under no_grad on purpose: its weights are no part of training."""

    def __init__(self):
        self.model = nn.Linear(1, 1)

    def score(self, action):
        with torch.no_grad():
            return torch.sigmoid(self.model(torch.tensor([[float(action)]]))).squeeze()  # NO GRAPH


def _policy_gradient(policy, rewarder, through_item):
    torch.manual_seed(0)
    loss = 0
    for _ in range(2):
        log_probs = F.log_softmax(policy.net(torch.randn(1, 4)), dim=1)
        reward = rewarder.score(1)
        if through_item:
            loss -= log_probs[0, 1].item() * reward  # CULPRIT
        else:
            loss -= log_probs[0, 1] * reward
    loss.backward()


def test_a_number_taken_out_of_the_graph_is_the_cut_not_a_model_run_without_one():
    torch.manual_seed(0)
    policy, rewarder = _Policy(), _RewardModel()
    _policy_gradient(policy, rewarder, through_item=False)  # the oracle: without .item() the policy trains
    assert policy.net.weight.grad is not None and rewarder.model.weight.grad is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        _policy_gradient(_Policy(), rewarder, through_item=True)
    with ja.capture() as trace:
        with pytest.raises(RuntimeError, match="does not require grad"):
            _policy_gradient(_Policy(), rewarder, through_item=True)
    [d] = trace.diagnoses
    assert (d.kind, d.line) == ("graph-cut", _line_of(_policy_gradient)), trace.report()
