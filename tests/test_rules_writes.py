"""Rules for writes and cuts, wherever the tensor lives and however the write or cut is spelled:
the user's names for tensors made inside functions (a torch.compile output among them).

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


@torch.compile
def features(x, w):
    return torch.sigmoid(x @ w)


def compiled_step(x, w):
    out = features(x, w)  # <names-compiled-call>
    out *= 2  # <names-compiled-write>
    out.sum().backward()


def test_a_compiled_functions_output_is_the_callers_name_and_its_save_the_call():
    torch.manual_seed(0)
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(5, 4)
    plain, _ = run_plain(compiled_step, x, w)
    assert "modified by an inplace operation" in str(plain)  # the oracle
    trace, error, _ = run_captured(compiled_step, x, w)
    assert str(error) == str(plain)
    [d] = trace.diagnoses
    assert (d.kind, d.line, d.saved_line, d.tensor) == (
        "saved-tensor-modified", line_of("names-compiled-write"), line_of("names-compiled-call"), "out")
    assert "out = out * 2" in d.fix
