"""accumulated-graph and missing-grad as properties of the graph, wherever the tensors live.

Each case trains the way real code does: helper objects, classes, closures, dicts and lists,
functions whose tensors are gone when the block ends. It runs twice. Plain, an oracle from PyTorch
alone says what is true: the number of grad_fn nodes reachable from what the program keeps grows
with the iterations and includes nodes an earlier backward ran (accumulation), or `.grad is None`
on a parameter the optimizer holds (a missing gradient). Under capture(), the diagnosis must say
exactly that, at the line marked `# CULPRIT` in the case, with the user's name for the tensor; the
fine look-alikes, which the oracle clears, must get none.
"""
import collections
import gc
import inspect
import weakref

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import jupyter_autograd as ja
from jupyter_autograd.capture import folding
from jupyter_autograd.capture import state as capture_state


def _line_of(function, marker="# CULPRIT"):
    lines, first = inspect.getsourcelines(function)
    [at] = [i for i, line in enumerate(lines) if marker in line]
    return first + at


def _problems(trace):
    return [(d.kind, d.line, d.tensor) for d in trace.diagnoses]


# -- the accumulation oracle: graph growth, from PyTorch alone ------------------------------------

class GraphProbe:
    """Called after each iteration with what the program keeps: counts the grad_fn nodes reachable
    from it through next_functions, and how many of them a backward already ran (every backward
    call is wrapped to note the nodes it is about to run; the node objects are held, so that the
    same node is the same object later)."""

    def __init__(self):
        self.sizes, self.already_run, self.ran = [], [], set()

    def __call__(self, kept):
        nodes = _reachable(_tensors_in(kept))
        self.sizes.append(len(nodes))
        self.already_run.append(len(nodes & self.ran))

    def run(self, case, *args):
        original = torch.Tensor.backward

        def noting(tensor, *a, **k):
            self.ran |= _reachable([tensor])
            return original(tensor, *a, **k)

        torch.Tensor.backward = noting
        try:
            return case(*args, probe=self)
        finally:
            torch.Tensor.backward = original

    def grows(self):
        """After iteration 3 more nodes than after iteration 1, some of them run by a backward."""
        return self.sizes[2] > self.sizes[0] and self.already_run[2] > 0 and self.sizes[-1] > self.sizes[2]

    def grows_from_the_second(self):
        """After each iteration more nodes than after the one before, some of them run by a backward."""
        return all(b > a for a, b in zip(self.sizes, self.sizes[1:])) and self.already_run[1] > 0

    def bounded(self):
        return max(self.sizes) == max(self.sizes[:3])


def _tensors_in(kept):
    if isinstance(kept, torch.Tensor):
        return [kept]
    if isinstance(kept, dict):
        kept = list(kept.values())
    if isinstance(kept, (list, tuple, collections.deque)):
        return [t for item in kept for t in _tensors_in(item)]
    return []


def _reachable(tensors):
    seen, stack = set(), [t.grad_fn for t in tensors if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return seen


def _ignore(kept):
    return None


def _accumulates(case, *args, growth=GraphProbe.grows):
    """The oracle says it grows; the capture says accumulated-graph. Returns the diagnosis."""
    probe = GraphProbe()
    probe.run(case, *args)
    assert growth(probe), probe.sizes
    with ja.capture() as trace:
        case(*args, probe=_ignore)
    assert trace.warnings == []
    [d] = trace.diagnoses
    assert d.kind == "accumulated-graph" and d.message and d.fix, trace.report()
    return d


def _fine(case, *args):
    probe = GraphProbe()
    probe.run(case, *args)
    assert probe.bounded(), probe.sizes
    with ja.capture() as trace:
        case(*args, probe=_ignore)
    assert trace.diagnoses == [] and trace.warnings == [], trace.report()
    return trace


def _data(n=6, batch=4):
    torch.manual_seed(0)
    return [(torch.randn(batch, 3), torch.randn(batch, 1)) for _ in range(n)]


# -- accumulated-graph: kept by anything, linked or apart ------------------------------------------

class AverageMeter:
    """The helper of many training scripts, fed the loss tensor instead of loss.item()."""

    def __init__(self):
        self.sum, self.count = 0, 0

    def update(self, val, n=1):
        self.sum += val * n  # CULPRIT
        self.count += n

    @property
    def avg(self):
        return self.sum / self.count


def meter_in_a_training_function(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = AverageMeter()
    for x, y in data:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.update(loss, x.shape[0])
        probe(losses.sum)
    return float(losses.avg)


def test_an_average_meter_fed_the_loss_tensor_inside_a_training_function():
    d = _accumulates(meter_in_a_training_function, _data())
    assert (d.line, d.tensor) == (_line_of(AverageMeter.update), "self.sum")
    assert "self.sum += (val * n).detach()" in d.fix


class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.history = []

    def step(self, x, y):
        loss = F.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.history.append(loss)  # CULPRIT: kept whole: nothing links them, the list holds them
        return loss


def history_on_a_trainer(data, probe):
    torch.manual_seed(0)
    trainer = Trainer(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)))
    for x, y in data:
        trainer.step(x, y)
        probe(trainer.history)
    return len(trainer.history)


def test_losses_appended_to_a_list_on_a_helper_object_that_is_gone_by_the_end():
    d = _accumulates(history_on_a_trainer, _data())
    assert (d.line, d.tensor) == (_line_of(Trainer.step), "loss")
    assert "self.history.append(loss.detach())" in d.fix and ".item()" in d.fix


def retained_totals_in_a_list(data, probe):
    torch.manual_seed(0)
    trunk, head_a, head_b = nn.Linear(3, 4), nn.Linear(4, 1), nn.Linear(4, 1)
    opt = torch.optim.SGD([*trunk.parameters(), *head_a.parameters(), *head_b.parameters()], lr=0.1)
    totals = []
    for x, y in data:
        features = trunk(x)
        total = F.mse_loss(head_a(features), y) + head_b(features).abs().mean()
        opt.zero_grad()
        total.backward(retain_graph=True)
        opt.step()
        totals.append(total)  # CULPRIT
        probe(totals)


def test_a_list_that_keeps_every_iterations_retained_total():
    d = _accumulates(retained_totals_in_a_list, _data())
    assert (d.line, d.tensor) == (_line_of(retained_totals_in_a_list), "total")


def tensor_accumulator_from_zero(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def epoch():
        total = torch.tensor(0.)
        for x, y in data:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total = total + loss  # CULPRIT
            probe(total)
        return total.item() / len(data)

    return epoch()


def test_an_accumulator_started_as_a_zero_tensor_inside_a_function():
    d = _accumulates(tensor_accumulator_from_zero, _data())
    assert (d.line, d.tensor) == (_line_of(tensor_accumulator_from_zero), "total")
    assert "total = total + loss.detach()" in d.fix


def dict_of_running_sums(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sums = {}
    for x, y in data:
        out = model(x)
        losses = {"mse": F.mse_loss(out, y), "l1": F.l1_loss(out, y)}
        opt.zero_grad()
        (losses["mse"] + losses["l1"]).backward()
        opt.step()
        for key, value in losses.items():
            sums[key] = sums.get(key, 0) + value  # CULPRIT
        probe(sums)
    return {key: value.item() for key, value in sums.items()}


def test_a_dict_of_running_sums():
    d = _accumulates(dict_of_running_sums, _data())
    assert (d.line, d.tensor) == (_line_of(dict_of_running_sums), "sums[key]")


def logger_closure(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def make_logger():
        state = [torch.zeros(())]

        def log(value):
            state[0] = torch.add(state[0], value)  # CULPRIT
            return state

        return log

    log = make_logger()
    for x, y in data:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        probe(log(loss))


def test_a_list_element_in_a_closure():
    d = _accumulates(logger_closure, _data())
    assert (d.line, d.tensor) == (_line_of(logger_closure), "state[0]")


class Smoother:
    def __init__(self):
        self.ema = None

    def __call__(self, loss):
        self.ema = loss if self.ema is None else 0.9 * self.ema + 0.1 * loss  # CULPRIT
        return self.ema


def ema_on_an_attribute(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    smooth = Smoother()
    for x, y in data:  # no optimizer: each backward call is an iteration
        loss = F.mse_loss(model(x), y)
        loss.backward()
        probe(smooth(loss))


def test_an_exponential_average_kept_on_an_attribute_without_an_optimizer():
    d = _accumulates(ema_on_an_attribute, _data())
    assert (d.line, d.tensor) == (_line_of(Smoother.__call__), "self.ema")


class Evaluator:
    def __init__(self):
        self.outputs = []

    def add(self, out):
        self.outputs.append(out)  # CULPRIT


def outputs_kept_for_epoch_metrics(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    evaluator = Evaluator()
    for x, y in data:
        out = model(x)
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        evaluator.add(out)
        probe(evaluator.outputs)
    return torch.cat(evaluator.outputs).detach().mean().item()


def test_model_outputs_kept_for_an_epoch_metric():
    d = _accumulates(outputs_kept_for_epoch_metrics, _data())
    assert (d.line, d.tensor) == (_line_of(Evaluator.add), "out")
    assert "self.outputs.append(out.detach())" in d.fix


class StepModule(nn.Module):
    """A Lightning-like module: its training step returns what it computed, the loss inside a dict
    or a tuple, and the loop that calls it decides what to keep."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)

    def training_step(self, x, y):
        pred = self.net(x)
        return {"loss": F.mse_loss(pred, y) + 0.1 * pred.abs().mean(), "metrics": {"size": len(x)}}

    def validation_like_step(self, x, y):
        loss = F.mse_loss(self.net(x), y)
        return loss, len(x)


def step_outputs_kept_for_the_epoch_end(data, as_numbers, probe):
    torch.manual_seed(0)
    module = StepModule()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    outputs = []
    for x, y in data:
        opt.zero_grad()
        output = module.training_step(x, y)
        output["loss"].backward()
        opt.step()
        if as_numbers:
            outputs.append({"loss": output["loss"].item(), "metrics": output["metrics"]})
        else:
            outputs.append(output)  # CULPRIT
        probe(outputs)
    return len(outputs)


def test_a_dict_a_step_returns_kept_by_its_caller_is_named_where_it_is_kept():
    d = _accumulates(step_outputs_kept_for_the_epoch_end, _data(), False)
    assert (d.line, d.tensor) == (_line_of(step_outputs_kept_for_the_epoch_end), 'output["loss"]')
    fixed = 'outputs.append({**output, "loss": output["loss"].detach()})'
    assert fixed in d.fix
    exec(compile(fixed, "fix", "exec"), {"outputs": [], "output": {"loss": torch.ones(1, requires_grad=True) * 2}})


def test_a_dict_a_step_returns_kept_as_numbers_is_fine():
    _fine(step_outputs_kept_for_the_epoch_end, _data(), True)


def step_results_kept_whole(data, probe):
    torch.manual_seed(0)
    module = StepModule()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    results = []
    for x, y in data:
        opt.zero_grad()
        result = module.validation_like_step(x, y)
        result[0].backward()
        opt.step()
        results.append(result)  # CULPRIT
        probe(results)
    return len(results)


def test_a_tuple_a_step_returns_kept_by_its_caller_is_named_where_it_is_kept():
    d = _accumulates(step_results_kept_whole, _data())
    assert (d.line, d.tensor) == (_line_of(step_results_kept_whole), "loss")  # by its own name


# -- accumulated-graph: the line that keeps them, from the second iteration on ----------------------

class LossLog:
    def __init__(self):
        self.values = []

    def update(self, value):
        self.values.append(value)  # APPENDED


def _step(model, opt, x, y):
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def _trained(data):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), data


def losses_in_a_list(iterations, data, probe):
    model, opt, data = _trained(data)
    history = []
    for x, y in data[:iterations]:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss)  # APPENDED
        probe(history)


def losses_in_a_dict_of_lists(iterations, data, probe):
    model, opt, data = _trained(data)
    logs = {}
    for x, y in data[:iterations]:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        logs.setdefault("loss", []).append(loss)  # APPENDED
        probe(logs)


def losses_given_to_a_helper(iterations, data, probe):
    model, opt, data = _trained(data)
    meter = LossLog()
    for x, y in data[:iterations]:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        meter.update(loss)
        probe(meter.values)


def losses_returned_by_a_step(iterations, data, probe):
    model, opt, data = _trained(data)
    history = []
    for x, y in data[:iterations]:
        loss = _step(model, opt, x, y)
        history.append(loss)  # APPENDED
        probe(history)


def probabilities_appended_as_computed(iterations, data, probe):
    model, opt, data = _trained(data)
    probabilities = []
    for x, y in data[:iterations]:
        logits = model(x)
        loss = F.mse_loss(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        probabilities.append(torch.sigmoid(logits))  # APPENDED
        probe(probabilities)


@pytest.mark.parametrize("iterations", [2, 5])
@pytest.mark.parametrize("case,marked,stored", [
    (losses_in_a_list, losses_in_a_list, "loss"), (losses_in_a_dict_of_lists, losses_in_a_dict_of_lists, "loss"),
    (losses_given_to_a_helper, LossLog.update, "value"), (losses_returned_by_a_step, losses_returned_by_a_step, "loss")])
def test_losses_stored_in_a_container_are_named_where_they_are_stored(case, marked, stored, iterations):
    """The accumulation is the statement that stores each loss, wherever it is (in the function
    that made the loss, a helper it is passed to, the caller it is returned to), and two
    iterations are enough: the container holds two graphs at the end, one after the first."""
    d = _accumulates(case, iterations, _data(), growth=GraphProbe.grows_from_the_second)
    assert (d.line, d.tensor) == (_line_of(marked, "# APPENDED"), "loss")
    assert ".append(%s.detach())" % stored in d.fix


@pytest.mark.parametrize("iterations", [3, 5])
def test_results_appended_as_they_are_computed(iterations):
    """A result with no name of its own, stored by the line that computes it. (From the third
    iteration: a tensor made after the last backward call is looked at only when the block ends,
    and by then the function that kept it has returned.)"""
    d = _accumulates(probabilities_appended_as_computed, iterations, _data(), growth=GraphProbe.grows_from_the_second)
    assert d.line == _line_of(probabilities_appended_as_computed, "# APPENDED")
    assert "probabilities.append(torch.sigmoid(logits).detach())" in d.fix


def previous_loss_for_two_iterations(data, probe):
    """Two iterations, the earlier loss kept by a variable: never two graphs."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    previous = None
    for x, y in data[:2]:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if previous is not None:
            print("improved by", (previous - loss).item())
        previous = loss
        probe(previous)


def a_deque_of_one_for_two_iterations(data, probe, last=collections.deque(maxlen=1)):
    """Two iterations, each loss appended to a deque of one that outlives the block: the
    container the loss goes into never holds two graphs."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    last.clear()
    for x, y in data[:2]:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        last.append(loss)
        probe(last)


@pytest.mark.parametrize("case", [previous_loss_for_two_iterations, a_deque_of_one_for_two_iterations])
def test_one_previous_loss_is_not_accumulation(case, capsys):
    _fine(case, _data())


# -- accumulated-graph: a carried state that every backward(retain_graph=True) runs again ---------

class CarriedState(nn.Module):
    """A recurrent state carried across training iterations without .detach(), kept where real code
    keeps it, each backward keeping the graph (the usual wrong fix for "backward through the graph a
    second time"): every backward runs again through every earlier iteration."""

    def __init__(self, keep):
        super().__init__()
        self.enc, self.head, self.keep = nn.Linear(3, 4), nn.Linear(4, 1), keep
        self.prev, self.memory, self.states = torch.zeros(4, 4), {"prev": torch.zeros(4, 4)}, [torch.zeros(4, 4)]

    def forward(self, x):
        z = self.enc(x)  # run again only because the state holds it: its new nodes never reach its old ones
        if self.keep == "attribute":
            h = torch.tanh(z + 0.5 * self.prev)  # CARRIED attribute
            self.prev = h
        elif self.keep == "dict, as a copy":
            h = torch.tanh(z + 0.5 * self.memory["prev"])  # CARRIED dict, as a copy
            self.memory["prev"] = h.clone()
        else:
            h = torch.tanh(z + 0.5 * self.states[-1])  # CARRIED list
            self.states.append(h)
        return self.head(h)

    def kept(self):
        return {"attribute": self.prev, "dict, as a copy": self.memory["prev"], "list": self.states}[self.keep]


def carried_with_retained_graphs(keep, iterations, data, probe):
    torch.manual_seed(0)
    model = CarriedState(keep)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data[:iterations]:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward(retain_graph=True)
        opt.step()
        probe(model.kept())


@pytest.mark.parametrize("iterations", [2, 5])
@pytest.mark.parametrize("keep,state", [("attribute", "self.prev"), ("dict, as a copy", 'self.memory["prev"]'),
                                        ("list", "h")])
def test_a_carried_state_whose_graph_every_backward_runs_again(keep, state, iterations):
    """Seen from the second backward call on, and said once: at the line that takes the state in, not
    at `z = self.enc(x)`; the fix detaches the state the next iteration reads."""
    d = _accumulates(carried_with_retained_graphs, keep, iterations, _data(), growth=GraphProbe.grows_from_the_second)
    assert (d.line, d.tensor) == (_line_of(CarriedState.forward, "# CARRIED " + keep), "h")
    assert "%d backward calls" % iterations in d.message
    assert "%s = %s.detach()" % (state, state) in d.fix and "retain_graph=True" in d.fix


def second_order_inner_steps(data, probe):
    """MAML's inner steps: each gradient is taken with create_graph, and the outer backward runs
    through every inner step on purpose."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        weight, bias = model.weight, model.bias
        for _ in range(3):
            inner = F.mse_loss(F.linear(x, weight, bias), y)
            grad_weight, grad_bias = torch.autograd.grad(inner, (weight, bias), create_graph=True)
            weight, bias = weight - 0.1 * grad_weight, bias - 0.1 * grad_bias
        outer = F.mse_loss(F.linear(x, weight, bias), y)
        opt.zero_grad()
        outer.backward()
        opt.step()
        probe(outer)


# -- accumulated-graph: fine look-alikes -----------------------------------------------------------

def losses_as_numbers(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history, running = [], 0.0
    for x, y in data:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
        running = 0.9 * running + 0.1 * loss.item()
        probe(loss)
    return running


def microbatch_sum_reset_every_step(data, probe):
    """Gradient accumulation: a backward per micro-batch, their sum logged with .item() and reset
    at every optimizer step (the tool used to call this accumulation)."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(len(data) // 3):
        opt.zero_grad()
        step_loss = 0
        for x, y in data[3 * step:3 * step + 3]:
            loss = F.mse_loss(model(x), y) / 3
            loss.backward()
            step_loss = step_loss + loss
        opt.step()
        probe(step_loss)
        print("step", step, step_loss.item())


def stacked_losses_backpropagated(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        losses = [F.mse_loss(model(x[i:i + 2]), y[i:i + 2]) for i in range(0, len(x), 2)]
        loss = torch.stack(losses).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        probe(losses)


def previous_loss_and_a_short_window(data, probe):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    previous, window = None, collections.deque(maxlen=3)
    for x, y in data:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if previous is not None:
            print("improved by", (previous - loss).item())
        previous = loss
        window.append(loss)
        print("smoothed", (sum(window) / len(window)).item())
        probe([previous, *window])


def truncated_bptt_with_detach(data, probe):
    torch.manual_seed(0)
    cell, head = nn.RNNCell(3, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.05)
    h = torch.zeros(4, 4)
    for x, y in data:
        h = cell(x, h.detach())
        loss = F.mse_loss(head(h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        probe(h)


def two_losses_on_one_trunk(data, probe):
    torch.manual_seed(0)
    trunk, head_a, head_b = nn.Linear(3, 4), nn.Linear(4, 1), nn.Linear(4, 1)
    opt = torch.optim.SGD([*trunk.parameters(), *head_a.parameters(), *head_b.parameters()], lr=0.1)
    for x, y in data:
        features = trunk(x)
        loss_a, loss_b = F.mse_loss(head_a(features), y), head_b(features).abs().mean()
        opt.zero_grad()
        loss_a.backward(retain_graph=True)
        loss_b.backward()
        opt.step()
        total = loss_a + loss_b
        print(total.item())
        probe(total)


@pytest.mark.parametrize("case", [losses_as_numbers, microbatch_sum_reset_every_step, stacked_losses_backpropagated,
                                  previous_loss_and_a_short_window, truncated_bptt_with_detach, two_losses_on_one_trunk,
                                  second_order_inner_steps])
def test_what_does_not_grow_is_not_accumulation(case, capsys):
    _fine(case, _data(9))


# -- accumulated-graph in a loop long enough to fold ------------------------------------------------

# A step here is about 5 recorded ops: with a 512-op folding window, 500 steps fold many of them.
_WINDOW = 512


def _long(steps, keep):
    def train():
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 3), torch.randn(4, 1)
        total, history = 0.0, []
        for _ in range(steps):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if keep == "sum":
                total += loss  # SUMMED
            elif keep == "list":
                history.append(loss)  # APPENDED
            else:
                total += loss.item()
        return float(total) + len(history)

    return train


@pytest.mark.parametrize("keep", ["sum", "list", "number"])
def test_a_folded_training_loop(keep, monkeypatch):
    monkeypatch.setattr(folding, "FOLD_EVERY", _WINDOW)
    train = _long(500, keep)
    with ja.capture() as trace:
        recorder = capture_state.thread_state.recorder
        train()
    assert recorder.folding.count > 100 and trace.warnings == []
    if keep == "number":
        assert trace.diagnoses == []
        return
    [d] = trace.diagnoses
    marker = "# SUMMED" if keep == "sum" else "# APPENDED"
    assert (d.kind, d.line, d.tensor) == ("accumulated-graph", _line_of(train, marker), "total" if keep == "sum" else "loss")
    assert "500 iterations" in d.message if keep == "sum" else "earlier iterations" in d.message


def test_kept_tensors_are_weak_facts():
    """What the capture notes about kept tensors holds no tensor: the losses the trainer's list kept
    are freed with the trainer, when its function returns; the trace says which tensors were kept
    past a backward, from when (the backward call after the one that followed each) to when (the
    last backward call: the end of the block found them gone)."""
    refs = []

    def note(history):
        refs[:] = [weakref.ref(t) for t in history]

    with ja.capture() as trace:
        count = history_on_a_trainer(_data(), note)
    gc.collect()
    assert len(refs) == count and all(ref() is None for ref in refs)
    kept = sorted((first, last) for t, (first, last) in trace.kept.items() if trace.tensors[t].name == "loss")
    backward_calls = [op.index for op in trace.ops if op.is_backward]
    assert kept == [(b, backward_calls[-1]) for b in backward_calls[1:]]


# -- missing-grad: the oracle is `.grad is None` on what the optimizer holds ------------------------

def _starved(case):
    """Plain: the named parameter, which the optimizer holds and which requires grad, ends with
    `.grad is None`. Captured: one missing-grad diagnosis names it. Returns it."""
    name, param, opt = case()
    held = {id(p) for group in opt.param_groups for p in group["params"]}
    assert id(param) in held and param.requires_grad and param.grad is None, name
    # On Python 3.13 (PEP 667) the locals of the frame that enters the block name tensors too: this
    # test's own `param`, the same tensor in a model built before the block, is not the user's name.
    del param, opt
    with ja.capture() as trace:
        case()
    assert trace.warnings == []
    [d] = trace.diagnoses
    assert d.kind == "missing-grad" and (d.tensor == name or name in d.also), trace.report()
    return d


class Selector(nn.Module):
    def __init__(self):
        super().__init__()
        self.scorer = nn.Linear(4, 3)
        self.table = nn.Embedding(3, 2)

    def forward(self, x):
        chosen = torch.max(self.scorer(x), 1)[1]  # CULPRIT
        return self.table(chosen)


def max_indices_in_a_forward():
    torch.manual_seed(0)
    model = Selector()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(5, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return "model.scorer.weight", model.scorer.weight, opt


def test_the_indices_of_torch_max_fed_to_an_embedding():
    d = _starved(max_indices_in_a_forward)
    assert d.line == _line_of(Selector.forward)
    assert "indices" in d.message and "model.scorer.bias" in d.also


def argmax_to_a_second_model():
    torch.manual_seed(0)
    policy, decoder = nn.Linear(4, 3), nn.Embedding(3, 2)

    def train(batches):
        opt = torch.optim.Adam([*policy.parameters(), *decoder.parameters()], lr=0.01)
        for x in batches:
            actions = policy(x).argmax(dim=-1)  # CULPRIT
            loss = decoder(actions).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return opt

    opt = train([torch.randn(5, 4) for _ in range(2)])
    return "policy.weight", policy.weight, opt


def topk_indices():
    torch.manual_seed(0)
    scorer, table = nn.Linear(4, 6), nn.Embedding(6, 3)
    opt = torch.optim.SGD([*scorer.parameters(), *table.parameters()], lr=0.1)
    top = scorer(torch.randn(5, 4)).topk(2, dim=-1)  # CULPRIT
    loss = table(top.indices).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return "scorer.weight", scorer.weight, opt


def integer_codes():
    torch.manual_seed(0)
    quantizer, head = nn.Linear(4, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*quantizer.parameters(), *head.parameters()], lr=0.1)
    codes = quantizer(torch.randn(5, 4)).to(torch.int64)  # CULPRIT
    loss = head(codes.float()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return "quantizer.weight", quantizer.weight, opt


def comparison_mask():
    torch.manual_seed(0)
    gate, head = nn.Linear(4, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*gate.parameters(), *head.parameters()], lr=0.1)
    x = torch.randn(5, 4)
    keep = (gate(x) > 0).float()  # CULPRIT
    loss = head(x * keep).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return "gate.weight", gate.weight, opt


def bucketized_scores():
    torch.manual_seed(0)
    scorer, table = nn.Linear(4, 1), nn.Embedding(5, 3)
    opt = torch.optim.SGD([*scorer.parameters(), *table.parameters()], lr=0.1)
    bins = torch.tensor([-1.0, -0.3, 0.3, 1.0])
    ids = torch.bucketize(scorer(torch.randn(6, 4)).squeeze(-1), bins)  # CULPRIT
    loss = table(ids).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return "scorer.weight", scorer.weight, opt


@pytest.mark.parametrize("case", [argmax_to_a_second_model, topk_indices, integer_codes, comparison_mask,
                                  bucketized_scores])
def test_a_path_through_an_op_with_no_gradient(case):
    d = _starved(case)
    assert d.line == _line_of(case)
    assert "gumbel_softmax" in d.fix


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class Checkpointed(nn.Module):
    def __init__(self, reentrant=True):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 1)
        self.reentrant = reentrant

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)  # CULPRIT
        return self.head(x)


def _checkpointed(model, inputs_require_grad):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        x = torch.randn(2, 4, requires_grad=inputs_require_grad)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return opt


torch.manual_seed(0)
_PREBUILT = Checkpointed()


def checkpoint_of_a_prebuilt_model():
    opt = _checkpointed(_PREBUILT, False)
    return "model.blocks.0.fc1.weight", _PREBUILT.blocks[0].fc1.weight, opt


def checkpoint_of_a_model_built_in_the_block():
    torch.manual_seed(0)
    model = Checkpointed()
    opt = _checkpointed(model, False)
    return "model.blocks.0.fc1.weight", model.blocks[0].fc1.weight, opt


@pytest.mark.parametrize("case", [checkpoint_of_a_prebuilt_model, checkpoint_of_a_model_built_in_the_block])
def test_reentrant_checkpoint_whose_inputs_do_not_require_grad(case):
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        d = _starved(case)
    assert d.line == _line_of(Checkpointed.forward)
    assert "use_reentrant=False" in d.fix and "CheckpointFunction" in d.message


def rebuilt_from_numbers():
    torch.manual_seed(0)
    stage1, stage2 = nn.Linear(4, 1), nn.Linear(4, 1)
    opt = torch.optim.SGD([*stage1.parameters(), *stage2.parameters()], lr=0.1)
    l1 = stage1(torch.randn(5, 4)).pow(2).mean()
    l2 = stage2(torch.randn(5, 4)).abs().mean()
    loss = torch.tensor([l1.item(), l2.item()], requires_grad=True).sum()  # CULPRIT
    opt.zero_grad()
    loss.backward()
    opt.step()
    return "stage1.weight", stage1.weight, opt


def test_a_loss_rebuilt_as_a_fresh_leaf_from_per_stage_losses():
    # The backward reaches only the fresh leaf, so it trains nothing: one graph-cut at the rebuild
    # (the loss's chain cut and hidden by requires_grad=True), not also each parameter starved.
    name, param, opt = rebuilt_from_numbers()
    assert param.grad is None and all(p.grad is None for group in opt.param_groups for p in group["params"])
    with ja.capture() as trace:
        rebuilt_from_numbers()
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.tensor) == ("graph-cut", _line_of(rebuilt_from_numbers), "loss"), trace.report()


# `.grad` read on a name rebound to a cast or a view of the leaf: PyTorch only warns. The oracle is
# the leaf-ness of what the name holds, and its `.grad`.

def cast_rebound(probe):
    torch.manual_seed(0)
    w = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    w = w.type(torch.float)  # CULPRIT
    x = torch.randn(4, 3)
    for _ in range(2):
        loss = (x @ w).pow(2).mean()
        loss.backward()
        probe(w)
    return w


class Scaler:
    def __init__(self):
        self.scale = torch.ones(6, requires_grad=True)
        self.scale = self.scale.view(2, 3)  # CULPRIT

    def loss(self, x):
        return (x * self.scale).sum()


def view_rebound_on_an_object(probe):
    torch.manual_seed(0)
    scaler = Scaler()
    for _ in range(2):
        scaler.loss(torch.randn(2, 3)).backward()
        probe(scaler.scale)
    return scaler.scale


@pytest.mark.parametrize("case, name, where", [(cast_rebound, "w", cast_rebound),
                                               (view_rebound_on_an_object, "self.scale", Scaler.__init__)])
def test_a_name_rebound_to_a_cast_or_a_view_of_its_leaf(case, name, where):
    seen = []
    with pytest.warns(UserWarning, match="not a leaf Tensor"):
        case(lambda t: seen.append(t.grad))
    assert seen == [None, None]
    with ja.capture() as trace:
        case(_ignore)
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.tensor) == ("missing-grad", _line_of(where), name)
    assert ".detach().requires_grad_()" in d.fix


# -- missing-grad: fine look-alikes ----------------------------------------------------------------

def _nothing_starved(case):
    """Plain: every parameter the optimizer holds gets a gradient, but those frozen on purpose or
    unused by design. Captured: no diagnosis."""
    unused_by_design, opt = case()
    for group in opt.param_groups:
        for p in group["params"]:
            assert p.grad is not None or not p.requires_grad or any(p is q for q in unused_by_design)
    with ja.capture() as trace:
        case()
    assert trace.diagnoses == [] and trace.warnings == [], trace.report()
    return trace


def frozen_encoder():
    torch.manual_seed(0)
    encoder, head = nn.Linear(4, 4), nn.Linear(4, 1)
    encoder.requires_grad_(False)
    opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
    loss = head(encoder(torch.randn(5, 4))).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return [], opt


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.router = nn.Linear(4, 2)

    def forward(self, x):
        weights = self.router(x).softmax(-1)
        choice = int(weights.mean(0).argmax())
        return self.experts[choice](x) * weights[:, choice:choice + 1]


def unrouted_expert():
    torch.manual_seed(0)
    model = Experts()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(3, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return list(model.experts.parameters()), opt


def argmax_for_metrics_only():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    correct = 0
    for _ in range(2):
        x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        correct += (logits.argmax(dim=1) == y).long().sum().item()
    return [], opt


def checkpoint_with_an_input_that_requires_grad():
    torch.manual_seed(0)
    model = Checkpointed()
    return [], _checkpointed(model, True)


def non_reentrant_checkpoint():
    torch.manual_seed(0)
    model = Checkpointed(reentrant=False)
    return [], _checkpointed(model, False)


def target_network_detached():
    torch.manual_seed(0)
    online, target = nn.Linear(4, 2), nn.Linear(4, 2)
    opt = torch.optim.SGD([*online.parameters(), *target.parameters()], lr=0.1)
    target.requires_grad_(False)
    q = online(torch.randn(5, 4)).max(1).values
    q_next = target(torch.randn(5, 4)).max(1).values.detach()
    loss = F.smooth_l1_loss(q, 1.0 + 0.9 * q_next)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return [], opt


def half_precision_copy_of_a_kept_leaf():
    torch.manual_seed(0)
    w = torch.randn(4, 2, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    w_half = w.to(torch.float64)
    loss = (torch.randn(3, 4, dtype=torch.float64) @ w_half).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return [], opt


@pytest.mark.parametrize("case", [frozen_encoder, unrouted_expert, argmax_for_metrics_only,
                                  checkpoint_with_an_input_that_requires_grad, non_reentrant_checkpoint,
                                  target_network_detached, half_precision_copy_of_a_kept_leaf])
def test_what_is_not_starved_is_not_missing_grad(case):
    _nothing_starved(case)


def test_a_view_under_a_name_of_its_own_leaves_the_leaf_its_name():
    x = torch.randn(6, requires_grad=True)
    with ja.capture() as trace:
        shaped = x.view(2, 3)
        (shaped * torch.randn(2, 3)).sum().backward()
    assert x.grad is not None and trace.diagnoses == []


def test_missing_grad_in_a_folded_training_loop(monkeypatch):
    monkeypatch.setattr(folding, "FOLD_EVERY", _WINDOW)

    def train(steps):
        torch.manual_seed(0)
        policy, decoder = nn.Linear(4, 3), nn.Embedding(3, 2)
        opt = torch.optim.SGD([*policy.parameters(), *decoder.parameters()], lr=0.01)
        x = torch.randn(5, 4)
        for _ in range(steps):
            actions = policy(x).argmax(dim=-1)  # CULPRIT
            loss = decoder(actions).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return policy

    with ja.capture() as trace:
        recorder = capture_state.thread_state.recorder
        policy = train(400)
    assert recorder.folding.count > 100 and policy.weight.grad is None
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.tensor) == ("missing-grad", _line_of(train), "policy.weight")


# -- a sliding window is bounded ----------------------------------------------------------------

class RecentLosses:
    """A meter that keeps the last few loss tensors (a deque with maxlen), for a smoothed value."""

    def __init__(self, window):
        from collections import deque

        self.recent = deque(maxlen=window)

    def push(self, loss):
        self.recent.append(loss * 1.0)


def train_with_a_window(window, probe, steps=6):
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    smoothing = RecentLosses(window)
    for _ in range(steps):
        loss = net(torch.randn(4, 3)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        smoothing.push(loss)
        probe(list(smoothing.recent))
    return smoothing


@pytest.mark.parametrize("window, steps", [(3, 5), (4, 8)])
def test_a_window_of_recent_losses_is_bounded_and_fine(window, steps):
    """A window's graphs stop growing once it is full, however few steps ran past that."""
    sizes = []
    train_with_a_window(window, lambda kept: sizes.append(len(_reachable(kept))), steps)
    assert sizes[window - 1] == sizes[-1] > sizes[0], sizes  # the oracle: the graph it holds stops growing
    with ja.capture() as trace:
        train_with_a_window(window, _ignore, steps)
    assert [p for p in _problems(trace) if p[0] == "accumulated-graph"] == [], trace.report()


# -- a chain of in-place methods writes one tensor: its first receiver -------------------------------

class RunningNorm(nn.Module):
    """A batch norm of one's own that updates its buffer from the batch's mean without detaching it."""

    def __init__(self, features, momentum=0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(features))

    def forward(self, x):
        self.running_mean.mul_(1 - self.momentum).add_(x.mean(0) * self.momentum)  # CULPRIT
        return x - x.mean(0)


def running_norm_training(data, probe):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RunningNorm(3), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        probe(model[1].running_mean)
    return model


def test_a_chain_of_in_place_methods_names_the_tensor_it_writes():
    d = _accumulates(running_norm_training, _data())
    assert (d.line, d.tensor) == (_line_of(RunningNorm.forward), "self.running_mean")


def test_a_chain_of_in_place_methods_gets_a_fix_that_detaches_what_it_adds():
    d = _accumulates(running_norm_training, _data())
    assert "self.running_mean.mul_(1 - self.momentum).add_((x.mean(0) * self.momentum).detach())" in d.fix, d.fix
    assert "the loss" not in d.message + d.fix  # a value with no name is not called the loss


class InputStatistic(nn.Module):
    """Keeps its latest input and a second-moment statistic of all inputs seen, fed with the graph."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.last_input, self.s = None, None

    def forward(self, x):
        self.last_input = x
        update = torch.einsum("ij,ik->jk", x, x)
        if self.s is None:
            self.s = update
        else:
            self.s += update  # CULPRIT
        return self.layer(x)


def statistic_of_hidden_inputs(data, probe):
    torch.manual_seed(0)
    first, stat = nn.Linear(3, 4), InputStatistic()
    opt = torch.optim.SGD(list(first.parameters()) + list(stat.parameters()), lr=0.1)
    for x, y in data:
        loss = F.mse_loss(stat(F.relu(first(x))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        probe(stat.s)
    return stat


def test_inputs_a_side_chain_was_computed_from_are_not_a_second_accumulation():
    d = _accumulates(statistic_of_hidden_inputs, _data())  # exactly one diagnosis
    assert (d.line, d.tensor) == (_line_of(InputStatistic.forward), "self.s")
