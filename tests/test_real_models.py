"""Real architectures (transformers' GPT-2 and BERT with tiny configs, torchvision-style ResNet and
DenseNet blocks with torch.utils.checkpoint, an LSTM language model, nn.TransformerEncoder), random
init: two training steps with SGD and with Adam, then a validation pass without no_grad, give no
diagnosis and no tool warning; the same models with one planted bug each give the right kind,
line and dotted name."""
import inspect
import sys
import warnings

import pytest
import torch

import jupyter_autograd as ja

from . import real_models
from .real_models import MODELS, train_steps


def _plain_and_captured(build, run):
    """Run `run(model, batch, loss_of)` plain and under capture from the same seed; return both
    models' parameters and buffers, and the trace."""
    results = []
    trace = None
    for captured in (False, True):
        model, batch, loss_of = build()
        torch.manual_seed(1)
        if captured:
            with ja.capture() as trace:
                out = run(model, batch, loss_of)
        else:
            out = run(model, batch, loss_of)
        results.append((out, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    return results, trace


@pytest.mark.parametrize("name", sorted(MODELS))
def test_capture_changes_no_result(name):
    """Losses, parameters and buffers (BatchNorm statistics, num_batches_tracked) after two Adam steps
    are identical with and without the capture: checkpointing is never re-run by the tool."""
    def run(model, batch, loss_of):
        return train_steps(model, batch, loss_of, torch.optim.Adam(model.parameters(), lr=1e-3))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the libraries' own warnings
        ((plain, plain_state), (captured, captured_state)), trace = _plain_and_captured(MODELS[name], run)
    assert plain == captured
    assert plain_state.keys() == captured_state.keys()
    for key in plain_state:
        assert torch.equal(plain_state[key], captured_state[key]), key
    assert trace.warnings == []


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_diagnosis_and_no_tool_warning(name, optimizer):
    model, batch, loss_of = MODELS[name]()
    opt = (torch.optim.SGD(model.parameters(), lr=0.05) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with ja.capture() as trace:
            train_steps(model, batch, loss_of, opt)
    assert trace.diagnoses == [], trace.report()
    assert trace.warnings == []
    assert len(trace.backward_calls()) == 2


def _line_of(function, text):
    lines, start = inspect.getsourcelines(function)
    return start + next(i for i, line in enumerate(lines) if text in line)


def epoch_summing_tensors(model, batch, loss_of, opt, n=3):
    running_loss = 0.0
    for _ in range(n):
        loss = loss_of(model, batch())
        opt.zero_grad()
        loss.backward()
        opt.step()
        running_loss += loss
    return running_loss.item() / n


def data_write_between_forward_and_backward(model, batch, loss_of, opt):
    loss = loss_of(model, batch())
    for p in model.parameters():
        p.data.mul_(0.5)
    loss.backward()


def hook_writes_saved_input(model, batch, loss_of, opt):
    module = next(m for m in model.modules() if type(m) in (torch.nn.Linear, torch.nn.Conv2d))

    def hook(mod, inputs, output):
        inputs[0].mul_(2)

    handle = module.register_forward_hook(hook)
    try:
        loss_of(model, batch()).backward()
    finally:
        handle.remove()


BUGGY = ["gpt2", "bert", "resnet", "densenet-checkpoint", "lstm-lm", "transformer-encoder"]


@pytest.mark.parametrize("name", BUGGY)
def test_planted_accumulation_in_an_epoch_function(name):
    model, batch, loss_of = MODELS[name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with ja.capture() as trace:
            epoch_summing_tensors(model, batch, loss_of, opt)
    kinds = [(d.kind, d.line, d.tensor) for d in trace.diagnoses]
    assert kinds == [("accumulated-graph", _line_of(epoch_summing_tensors, "running_loss += loss"),
                      "running_loss")], trace.report()


@pytest.mark.parametrize("name", BUGGY)
def test_planted_data_write_names_the_parameter(name):
    model, batch, loss_of = MODELS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with ja.capture() as trace:
            data_write_between_forward_and_backward(model, batch, loss_of, None)
    d = trace.diagnoses[0]
    assert d.kind == "silent-data-mutation"
    assert d.line == _line_of(data_write_between_forward_and_backward, "p.data.mul_")
    # Named after the call site of the model (`m(...)` in real_models.loss_of), or, where that is
    # not known for certain, its class or (from Python 3.13, PEP 667, whose function locals are
    # read) this test's `model`: never after an unrelated variable.
    roots = ("m.", type(model).__name__ + ".") + (("model.",) if sys.version_info >= (3, 13) else ())
    parameter_names = {root + n for root in roots for n, _ in model.named_parameters()}
    assert d.tensor in parameter_names, d.tensor
    assert all(a in parameter_names for a in d.also if not a.startswith("the "))


@pytest.mark.parametrize("name", BUGGY)
def test_planted_write_in_a_forward_hook(name):
    model, batch, loss_of = MODELS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(RuntimeError) as raised:
            with ja.capture() as trace:
                hook_writes_saved_input(model, batch, loss_of, None)
    assert "modified by an inplace operation" in str(raised.value)
    d = trace.diagnoses[0]
    assert d.kind == "saved-tensor-modified"
    assert d.line == _line_of(hook_writes_saved_input, "inputs[0].mul_(2)")
    assert "?" not in d.message and d.tensor != "self"
