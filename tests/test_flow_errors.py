"""The four flow kinds beyond the scenario corpora: what each says, what it must not say, and that
the tool never runs a saved-tensor hook (checkpointing, save_on_cpu, a user's own)."""
import re

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import jupyter_autograd as ja


def test_nan_without_check_nan_names_the_leaves_and_the_backward():
    w = torch.zeros(3, requires_grad=True)
    with ja.capture(namespace=locals()) as trace:  # a function's own variables are named when passed
        loss = w.sqrt().sum()
        loss.backward()  # d sqrt / dw at 0 is inf
    (d,) = trace.diagnoses
    assert d.kind == "nan-gradient" and d.tensor == "w"
    assert d.source == "loss.backward()  # d sqrt / dw at 0 is inf".split("  #")[0]
    assert "check_nan=True" in d.fix and "--nan" in d.fix


def test_check_nan_names_the_forward_line_and_the_values():
    emb = torch.zeros(2, 3, requires_grad=True)
    with ja.capture(check_nan=True) as trace:
        norm = (emb ** 2).sum(-1).sqrt()
        norm.sum().backward()
    (d,) = trace.diagnoses
    assert d.kind == "nan-gradient" and d.source == "norm = (emb ** 2).sum(-1).sqrt()"
    assert d.node == "SqrtBackward0" and "square root of 0 at 2 of 2 positions" in d.message
    assert "1e-12" in d.fix


def test_check_nan_hooks_are_gone_after_the_block():
    x = torch.zeros(3, requires_grad=True)
    with ja.capture(check_nan=True) as trace:
        y = x.sqrt()
        y.sum().backward(retain_graph=True)
    origin = trace.nan_origin
    assert origin is not None
    calls = []
    y.grad_fn.register_hook(lambda gi, go: calls.append(1))
    y.sum().backward()  # outside the block: only the user's hook runs, ours are removed
    assert calls == [1] and trace.nan_origin == origin
    assert not y.grad_fn._raw_saved_result.unpack_hook


def test_where_branch_gets_the_double_where_fix():
    x = torch.tensor([-1.0, 4.0], requires_grad=True)
    with ja.capture(check_nan=True) as trace:
        y = torch.where(x > 0, x.sqrt(), torch.zeros_like(x))
        y.sum().backward()
    (d,) = trace.diagnoses
    assert "double-where" in d.fix and "0 * inf" in d.message


def test_graph_freed_is_said_before_the_failing_backward_runs():
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="second time"):
        with ja.capture() as trace:
            loss = (w.exp() * 2).sum()
            loss.backward()
            loss.backward()
    (d,) = trace.diagnoses
    assert d.kind == "graph-freed" and d.predicted and d.source == "loss.backward()"
    assert "retain_graph=True" in d.fix and "memory" in d.fix


def test_retained_graph_used_twice_is_fine():
    w = torch.randn(3, requires_grad=True)
    with ja.capture() as trace:
        loss = (w.exp() * 2).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    assert trace.diagnoses == []


def test_graph_cut_says_what_requires_grad_true_would_do():
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        with ja.capture() as trace:
            loss = (w * 2).sum().detach()
            loss.backward()
    (d,) = trace.diagnoses
    assert d.kind == "graph-cut" and d.tensor == "loss" and d.source == "loss = (w * 2).sum().detach()"
    assert "requires_grad = True" in d.message and "train nothing" in d.message


def test_every_parameter_frozen_is_a_cut():
    model = nn.Linear(3, 1)
    model.requires_grad_(False)
    with pytest.raises(RuntimeError, match="does not require grad"):
        with ja.capture() as trace:
            loss = model(torch.randn(2, 3)).sum()
            loss.backward()
    (d,) = trace.diagnoses
    assert d.kind == "graph-cut" and "frozen" in d.message


def test_unused_parameters_are_information_not_a_problem():
    experts = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    with ja.capture() as trace:
        loss = experts[0](torch.randn(1, 2)).sum()
        loss.backward()
    assert trace.diagnoses == []


def test_missing_grad_from_data_in_a_forward():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 1)

        def forward(self, x):
            return self.b(x @ self.a.weight.data.t())

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with ja.capture() as trace:
        loss = net(torch.randn(4, 2)).sum()
        loss.backward()
        opt.step()
    kinds = [(d.kind, d.tensor) for d in trace.diagnoses]
    assert ("missing-grad", "net.a.weight") in kinds
    d = next(d for d in trace.diagnoses if d.tensor == "net.a.weight")
    assert d.source == "return self.b(x @ self.a.weight.data.t())"


# -- saved-tensor hooks are never run by the tool -------------------------------------------------

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.bn = nn.Linear(4, 4), nn.BatchNorm1d(4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.relu(self.bn(self.lin(x)))


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_forward_runs_as_often_as_without_the_tool(reentrant):
    def run(captured):
        torch.manual_seed(0)
        block, other = Block(), torch.zeros(3)
        x = torch.randn(5, 4, requires_grad=True)

        def body():
            out = checkpoint(block, x, use_reentrant=reentrant).sum()
            other.add_(1)  # an unrelated in-place write: makes the tool inspect the graph
            out.backward()

        if captured:
            with ja.capture() as trace:
                body()
            assert trace.diagnoses == [] and trace.warnings == []
        else:
            body()
        return block.calls, block.bn.num_batches_tracked.item(), block.bn.running_mean.clone(), x.grad.clone()

    plain, captured = run(False), run(True)
    assert plain[:2] == captured[:2] == (2, 2)
    assert torch.equal(plain[2], captured[2]) and torch.equal(plain[3], captured[3])


def test_single_use_unpack_hook_is_left_to_backward():
    store = {}

    def pack(t):
        store[len(store)] = t
        return len(store) - 1

    def unpack(key):
        return store.pop(key)  # a second unpack raises KeyError

    w = torch.randn(3, requires_grad=True)
    with ja.capture() as trace:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            y = (w.exp() * w).sum()
        w.detach().mul_(1)  # a write: the tool inspects the graph before backward
        y.backward()
    assert trace.warnings == [] and store == {}


def test_save_on_cpu_is_not_unpacked_by_the_tool():
    w = torch.randn(3, requires_grad=True)
    with ja.capture() as trace:
        with torch.autograd.graph.save_on_cpu():
            y = (w.exp() * w).sum()
        torch.zeros(1).add_(1)
        y.backward()
    assert trace.warnings == [] and trace.diagnoses == []
    assert any(s.hooked for n in trace.nodes.values() for s in n.saved)


def _tanh_step(carry, w):
    return torch.tanh(carry * w)


def test_a_backward_with_two_problems_says_which_one_raised():
    """The graph-freed node comes first in engine order (its graph was made after the stale
    tensor's), so PyTorch raises that one; the stale sigmoid output is named too, as the error
    that comes next once the first is fixed, never as the one that raised."""
    w = torch.ones(3, requires_grad=True)

    def train():
        gate = (w * 2).sigmoid()  # SigmoidBackward0 saves its output
        h = _tanh_step(torch.ones(3), w)
        h.sum().backward()  # frees h's graph
        h = _tanh_step(h, w)  # carries the freed graph
        with torch.no_grad():
            gate.mul_(2)
        (gate.sum() + h.sum()).backward()

    with pytest.raises(RuntimeError, match="second time"):
        with ja.capture() as trace:
            train()
    by_kind = {d.kind: d for d in trace.diagnoses}
    assert set(by_kind) == {"graph-freed", "saved-tensor-modified"}
    assert "PyTorch raised \"Trying to backward through the graph a second time\"" in by_kind["graph-freed"].message
    stale = by_kind["saved-tensor-modified"].message
    assert "backward() stopped at another error first; with that one fixed, it raises" in stale
    assert "backward() raised" not in stale


def test_the_other_order_an_optimizer_step_before_a_carried_graph():
    w1 = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    w2 = torch.linspace(0.5, 1.5, 4, requires_grad=True)
    opt = torch.optim.SGD([w1, w2], lr=0.1)

    def forward(x, state):
        h = torch.tanh(x * w1 + state)
        return (h.exp() * w2).sum(), h

    def train(steps):
        state = torch.zeros(4)
        for step in range(steps):
            loss, h = forward(torch.linspace(0.0, 1.0, 4) + step, state)
            state = h  # not detached: the next step runs into this step's freed graph
            opt.step()  # the first step has no gradients yet: it writes nothing
            loss.backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with ja.capture() as trace:
            train(2)
    by_kind = {d.kind: d for d in trace.diagnoses}
    assert set(by_kind) == {"graph-freed", "saved-tensor-modified"}
    assert "backward() raised" in by_kind["saved-tensor-modified"].message
    assert ("PyTorch stopped this backward at another error first; with that one fixed, it raises"
            in by_kind["graph-freed"].message)


# -- graph-freed: what the fix says depends on how the graph came to be run twice -------------------

class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.cls, self.reg = nn.Linear(8, 3), nn.Linear(8, 1)

    def forward(self, x):
        feats = self.trunk(x)
        return self.cls(feats), self.reg(feats)


def _freed(run):
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        with ja.capture() as trace:
            run()
    [diagnosis] = [d for d in trace.diagnoses if d.kind == "graph-freed"]
    return trace, diagnosis


def test_losses_sharing_a_trunk_are_summed_not_detached():
    def step(model, x):
        logits, value = model(x)
        losses = [logits.logsumexp(1).mean(), value.pow(2).mean()]
        for loss in losses:
            loss.backward()  # the second runs the freed trunk again

    trace, d = _freed(lambda: step(_TwoHeads(), torch.randn(5, 4)))
    assert trace.ops[[op.index for op in trace.ops if op.is_backward][1]].location.line == d.line
    assert "sum(losses).backward()" in d.fix and "retain_graph=True" in d.fix
    assert "Detaching would cut" in d.fix and ".detach()\n" not in d.fix
    assert "earlier iteration" not in d.message


def test_a_tensor_computed_once_before_the_loop_is_computed_again():
    def fit(weight, batches):
        protos = nn.functional.normalize(weight, dim=1)
        for x in batches:
            loss = (x @ protos.t()).logsumexp(1).mean()
            loss.backward()

    trace, d = _freed(lambda: fit(nn.Parameter(torch.randn(3, 5)), [torch.randn(4, 5) for _ in range(2)]))
    assert d.tensor == "protos" and "compute `protos` again after the backward" in d.fix
    assert "protos = protos.detach()" not in d.fix and "Detaching it here would stop its gradient" in d.fix


def test_a_generated_batch_shared_by_two_losses_is_detached_where_the_first_used_it():
    def gan_step(G, D, opt_d):
        fake = G(torch.randn(8, 4))
        d_loss = D(fake).mean()  # should be D(fake.detach())
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = -D(fake).mean()
        g_loss.backward()

    G, D = nn.Sequential(nn.Linear(4, 6), nn.Tanh()), nn.Linear(6, 1)
    trace, d = _freed(lambda: gan_step(G, D, torch.optim.SGD(D.parameters(), lr=0.1)))
    assert d.tensor == "fake" and "a discriminator's loss" in d.fix and "fake = fake.detach()" not in d.fix
    assert "earlier iteration" not in d.message


def test_an_unused_input_of_autograd_grad_quotes_pytorch_whole():
    def penalty(model, x, unused):
        out = model(x).sum()
        return torch.autograd.grad(out, [x, unused])

    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="appears to not have been used") as plain:
        penalty(nn.Linear(3, 1), x, torch.randn(2, requires_grad=True))
    # PyTorch's words (the index is in them from torch 2.11: "Tensor at index 1").
    said = re.search(r"differentiated Tensors? .*? in the graph", str(plain.value)).group(0)
    with pytest.raises(RuntimeError, match="appears to not have been used"):
        with ja.capture() as trace:
            penalty(nn.Linear(3, 1), x, torch.randn(2, requires_grad=True))
    [d] = [d for d in trace.diagnoses if d.kind == "missing-grad"]
    assert '"%s"' % said in d.message and "(input 1 of `torch.autograd.grad`)" in d.message, d.message
    assert " ifferentiated" not in d.message and '"ifferentiated' not in d.message


def test_a_loss_computed_from_an_inference_mode_result_is_cut_where_that_ran():
    @torch.inference_mode()  # the cut: every call of the helper runs under inference mode
    def predict(model, x):
        return model(x).softmax(-1)  # evaluation helper reused for training

    def step(model, x, y):
        probs = predict(model, x)
        loss = nn.functional.nll_loss(probs.log(), y)
        loss.backward()

    with pytest.raises(RuntimeError, match="does not require grad"):
        with ja.capture() as trace:
            step(nn.Sequential(nn.Linear(4, 3)), torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0]))
    [d] = trace.diagnoses
    assert d.kind == "graph-cut" and d.tensor == "loss"
    assert trace.source_line(d.filename, d.line).strip().startswith("@torch.inference_mode()")
    assert "inference" in d.message and trace.warnings == []


def test_a_model_built_and_frozen_in_the_block_is_said_to_be_frozen_where_that_happened():
    def fit(x, y):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        model.requires_grad_(False)  # meant for the backbone only
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return model

    with pytest.raises(RuntimeError, match="does not require grad"):
        with ja.capture() as trace:
            kept = fit(torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1]))  # noqa: F841 (alive at the end)
    [d] = trace.diagnoses
    assert d.kind == "graph-cut" and "every parameter it was computed from is frozen" in d.message
    assert trace.source_line(d.filename, d.line).strip().startswith("model.requires_grad_(False)")


def test_a_recurrent_state_carried_in_a_tuple_is_described_never_called_unrecorded():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lstm, self.head = nn.Embedding(11, 8), nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 11)

        def forward(self, tokens, state=None):
            out, state = self.lstm(self.emb(tokens), state)
            return self.head(out), state

    def train_epoch(model, batches):
        state = None
        for tokens in batches:
            logits, state = model(tokens, state)  # (h, c) carried without detach
            nn.functional.cross_entropy(logits.reshape(-1, 11), tokens.reshape(-1)).backward()

    trace, d = _freed(lambda: train_epoch(LM(), [torch.randint(0, 11, (2, 5)) for _ in range(2)]))
    assert "unrecorded" not in d.message and "the state it carries over" in d.message
    assert "earlier iteration" in d.message and ".detach()" in d.fix


def test_a_moved_leaf_returned_under_another_name_is_fixed_under_the_name_its_line_gives_it():
    def make():
        log_alpha = torch.zeros(1, requires_grad=True).to(torch.float64)
        return log_alpha

    def train():
        la = make()
        for _ in range(2):
            (-(la * torch.randn(8, dtype=torch.float64)).mean()).backward()
        return la

    with ja.capture() as trace:
        la = train()
    [d] = [d for d in trace.diagnoses if d.kind == "missing-grad"]
    assert d.source == "log_alpha = torch.zeros(1, requires_grad=True).to(torch.float64)"
    assert "so `log_alpha` is the leaf" in d.fix and "log_alpha = torch.zeros(1).to(torch.float64).requires_grad_()" in d.fix
    assert not la.is_leaf


class _MovedGate(nn.Module):
    """A gate wrapped as a Parameter and then moved: the move returns a plain tensor, never registered."""

    def __init__(self):
        super().__init__()
        self.expert = nn.Linear(4, 1)
        self.w_gate = nn.Parameter(torch.zeros(4, 1, dtype=torch.float64), requires_grad=True).to(torch.float32)

    def forward(self, x):
        return self.expert(x) * torch.sigmoid(x @ self.w_gate)


class _GateMovedFirst(_MovedGate):
    def __init__(self):
        super().__init__()
        self.w_gate = nn.Parameter(torch.zeros(4, 1, dtype=torch.float64).to(torch.float32), requires_grad=True)


def _train_gated(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4)).pow(2).mean().backward()
        opt.step()
    return model


def test_a_parameter_moved_after_it_was_made_gets_a_fix_that_makes_the_moved_tensor_the_parameter():
    fixed = _train_gated(_GateMovedFirst())  # the oracle: the module written so trains its gate
    assert "w_gate" in dict(fixed.named_parameters()) and fixed.w_gate.grad is not None
    broken = _train_gated(_MovedGate())
    assert "w_gate" not in dict(broken.named_parameters()) and broken.w_gate.grad is None
    with ja.capture() as trace:
        _train_gated(_MovedGate())
    [d] = [d for d in trace.diagnoses if d.kind == "missing-grad"]
    assert ("self.w_gate = nn.Parameter(torch.zeros(4, 1, dtype=torch.float64).to(torch.float32), "
            "requires_grad=True)") in d.fix, d.fix  # as _GateMovedFirst writes it


def test_a_moved_leaf_that_only_lives_on_an_object_is_named_by_the_attribute_that_holds_it():
    class Agent:
        def __init__(self):
            self.log_alpha = torch.zeros(1, requires_grad=True).to(torch.float64)

        def update(self, log_probs):
            (-(self.log_alpha * log_probs).mean()).backward()

    def train(agent):
        for _ in range(2):
            agent.update(torch.randn(8, dtype=torch.float64))

    with ja.capture() as trace:
        train(Agent())
    [d] = trace.diagnoses
    assert (d.kind, d.tensor) == ("missing-grad", "self.log_alpha")
    assert d.source == "self.log_alpha = torch.zeros(1, requires_grad=True).to(torch.float64)"
    assert "self.log_alpha = torch.zeros(1).to(torch.float64).requires_grad_()" in d.fix
