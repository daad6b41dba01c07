"""check_nan's watch (capture/nan_watch.py): the fast check in the hook and the device path, whose
flags are read once when the backward call ends, must find the same node and the same values."""
import weakref

import torch
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.capture import nan_watch
from jupyter_autograd.diagnose.rules.nan import _CAUSES


def sqrt_at_zero():
    emb = torch.zeros(2, 3, requires_grad=True)
    w = torch.ones(3, requires_grad=True)
    with ja.capture(check_nan=True) as trace:
        norm = ((emb * w) ** 2).sum(-1).sqrt()
        loss = (norm * 2).sum()
        loss.backward()
    return trace


def test_flags_read_after_the_call_find_what_the_hook_finds(monkeypatch):
    direct = sqrt_at_zero()
    deferred = []
    real_defer = nan_watch.NanWatch._defer

    def defer_everything(self, fn):  # every node takes the device path, as on a GPU
        def hook(grad_inputs, grad_outputs):
            if self.origin is None:
                deferred.append(fn.name())
                real_defer(self, fn, grad_inputs)
        return hook

    monkeypatch.setattr(nan_watch.NanWatch, "_hook_for", defer_everything)
    via_flags = sqrt_at_zero()
    assert "SqrtBackward0" in deferred and "MulBackward0" in deferred  # the nodes before it were read too
    def without_key(origin):  # node keys are sequence numbers, which go on from run to run
        return {k: v for k, v in origin.items() if k != "node"}

    assert without_key(via_flags.nan_origin) == without_key(direct.nan_origin)
    assert via_flags.nodes[via_flags.nan_origin["node"]].name == "SqrtBackward0"
    assert direct.nan_origin["name"] == "SqrtBackward0" and direct.nan_origin["facts"]["result"]["zeros"] == 2
    assert [d.message for d in via_flags.diagnoses] == [d.message for d in direct.diagnoses]
    assert "square root of 0 at 2 of 2 positions" in direct.diagnoses[0].message


def test_a_sum_that_overflows_is_not_a_nan():
    x = torch.full((4,), 3e38, requires_grad=True)  # finite values whose float32 sum is inf
    with ja.capture(check_nan=True) as trace:
        y = x * 1.0
        y.backward(torch.full((4,), 3e38))
    assert trace.nan_origin is None and trace.diagnoses == []


def test_inf_from_finite_is_found_in_float64_and_half():
    for dtype in (torch.float64, torch.float16):
        x = torch.tensor([0.0, 1.0], dtype=dtype, requires_grad=True)
        with ja.capture(check_nan=True) as trace:
            y = x.log()
            y.sum().backward()
        assert trace.nan_origin["name"] == "LogBackward0", dtype
        assert "log of 0 at 1 of 2 positions" in trace.diagnoses[0].message


def test_fact_nodes_cover_the_causes_the_diagnosis_explains():
    assert set(_CAUSES) <= nan_watch.FACT_NODES


def test_the_always_on_leaf_flag_on_cpu_reads_a_sum_and_confirms_an_overflow():
    """Without check_nan, a CPU float leaf gradient is summed when backward returns; a sum that
    overflowed is checked element by element, so only a real NaN or Inf is reported."""
    big = torch.full((4,), 3e38, requires_grad=True)
    bad = torch.tensor([0.0, 4.0], requires_grad=True)
    with ja.capture(namespace={"big": big, "bad": bad}) as trace:
        (big * 1.0).backward(torch.full((4,), 3e38))  # a finite gradient whose float32 sum is inf
        bad.sqrt().sum().backward()  # SQRT: the gradient at 0 is inf
    assert [d.kind for d in trace.diagnoses] == ["nan-gradient"]
    assert trace.diagnoses[0].tensor == "bad"


def _chain_with_a_sqrt_at(step_of_sqrt, steps=2000):
    """A recurrent chain whose step `step_of_sqrt` takes the square root of 0 (finite, but its
    gradient is inf); every node's gradient is small, so they are read in batches."""
    torch.manual_seed(0)
    w = torch.full((4,), 0.5, requires_grad=True)
    xs = torch.randn(steps, 4)
    with ja.capture(check_nan=True) as trace:
        h = torch.zeros(4)
        for t in range(steps):
            h = torch.tanh(h * w + xs[t])
            if t == step_of_sqrt:
                h = h + (h * 0).sqrt()
        h.sum().backward()
    return trace


def test_a_nan_deep_in_a_batched_chain_is_found_where_the_direct_read_finds_it(monkeypatch):
    batched = _chain_with_a_sqrt_at(300)
    monkeypatch.setattr(nan_watch, "_BATCHED_NUMEL", -1)  # every gradient read in its own hook
    direct = _chain_with_a_sqrt_at(300)
    assert batched.nan_origin["name"] == direct.nan_origin["name"] == "SqrtBackward0"
    assert batched.nan_origin["facts"] == direct.nan_origin["facts"]
    assert batched.nan_origin["facts"]["result"]["zeros"] == 4
    origin = batched.nodes[batched.nan_origin["node"]]
    assert batched.ops[origin.created_by].location.source == "h = h + (h * 0).sqrt()"
    assert [d.message for d in batched.diagnoses] == [d.message for d in direct.diagnoses]


def test_a_batched_node_comes_before_a_large_one_that_is_also_not_finite():
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    big = torch.ones(10_000, requires_grad=True)
    with ja.capture(check_nan=True) as trace:
        first = x.sqrt()  # SQRT: its gradient at 0 is inf, a small gradient, batched
        spread = (big * first.sum()).sum()  # the inf reaches a 10,000-element gradient after it
        spread.backward()
    assert trace.nan_origin["name"] == "SqrtBackward0"


def test_an_overflowing_batch_sum_is_not_a_nan():
    x = torch.full((64,), 3e38, requires_grad=True)
    with ja.capture(check_nan=True) as trace:
        y = (x * 1.0) * 1.0
        y.backward(torch.full((64,), 3e38))  # finite gradients whose float32 sums overflow
    assert trace.nan_origin is None and trace.diagnoses == []


def test_a_failure_in_a_hook_never_reaches_the_users_backward(monkeypatch):
    def broken(self):
        raise ValueError("planted")

    monkeypatch.setattr(nan_watch.NanWatch, "_flush", broken)
    def grad_of(length, capture):
        w = torch.ones(3, requires_grad=True)
        with capture as trace:
            y = w * 0.5
            for _ in range(length):
                y = y.sin()
            y.sum().backward()
        return w.grad, trace

    import contextlib
    for length in (1, 600):  # read when the backward call ends; read from inside a hook
        plain, _ = grad_of(length, contextlib.nullcontext())
        captured, trace = grad_of(length, ja.capture(check_nan=True))
        assert torch.equal(captured, plain)
        assert any("planted" in warning for warning in trace.warnings)


def test_nodes_that_only_move_gradients_get_no_hook_and_the_origin_is_still_found():
    """A view, a transpose, a ReLU or a plain addition cannot make a NaN out of finite values:
    they are not watched, and the first node that made the NaN is still the one reported."""
    torch.manual_seed(0)
    x = torch.tensor([[0.0, 4.0], [1.0, 9.0]], requires_grad=True)
    hooked = []
    real_hook_for = nan_watch.NanWatch._hook_for

    def counting(self, fn):
        hooked.append(fn.name())
        return real_hook_for(self, fn)

    import pytest
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nan_watch.NanWatch, "_hook_for", counting)
        with ja.capture(check_nan=True) as trace:
            root = x.sqrt()  # SQRT: inf gradient at 0
            y = (root.t().relu() + root.view(2, 2).t()) * 2.0
            y.sum().backward()
    assert trace.nan_origin["name"] == "SqrtBackward0"
    assert set(hooked) == {"SqrtBackward0", "MulBackward0", "SumBackward0"}
    a = torch.ones(2, requires_grad=True)
    assert not nan_watch._passes_through(torch.add(a, a, alpha=3.0).grad_fn)  # scales: watched
    assert nan_watch._passes_through((a + a).grad_fn)


# -- the always-on leaf check in training code: what zero_grad, clipping and nesting do --

class _Net(nn.Module):
    """A linear layer, and a gain whose square root is taken: its gradient is inf where it is 0."""

    def __init__(self, gain):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.gain = nn.Parameter(torch.full((2,), gain))

    def forward(self, x):
        return (self.lin(x) * self.gain.sqrt()).sum()


def _train_step(model, opt, x):
    opt.zero_grad()
    loss = model(x)
    loss.backward()
    opt.step()
    return loss.item()


def _epoch(model, opt, inputs, set_to_none):
    """Backward calls with zero_grad between them, and no step (a step would spread the NaN)."""
    for x in inputs:
        opt.zero_grad(set_to_none=set_to_none)
        model(x).backward()


def test_gradients_are_read_before_zero_grad_drops_or_zeroes_them():
    """The NaN of the first backward only: the next calls would find nothing. A check at the end
    of the block alone would find zeros, or the gradients of the last call."""
    for set_to_none in (True, False):
        torch.manual_seed(0)
        model = _Net(1.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        inputs = [torch.zeros(4, 3), torch.ones(4, 3), torch.ones(4, 3)]
        with torch.no_grad():
            model.gain.zero_()  # sqrt at 0 for the first call
        with ja.capture() as trace:
            with torch.no_grad():
                model.gain[:] = 0.0
            _epoch(model, opt, inputs[:1], set_to_none)
            with torch.no_grad():
                model.gain.fill_(1.0)  # finite from now on
            _epoch(model, opt, inputs[1:], set_to_none)
        kinds = [(d.kind, d.tensor) for d in trace.diagnoses]
        assert ("nan-gradient", "model.gain") in kinds, (set_to_none, kinds)
        assert model.gain.grad is not None and torch.isfinite(model.gain.grad).all()


def test_a_gradient_zero_grad_dropped_is_not_kept_alive_by_the_tool():
    model = _Net(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ja.capture():
        model(torch.ones(4, 3)).backward()
        first = weakref.ref(model.gain.grad)
        opt.zero_grad()  # p.grad = None: nothing of the tool's holds the gradient
        assert first() is None
        model(torch.ones(4, 3)).backward()
    second = weakref.ref(model.gain.grad)
    opt.zero_grad()
    assert second() is None  # after the block the tool holds weak references only


def test_clip_grad_norm_after_a_nan_does_not_spread_the_blame():
    """clip_grad_norm_ multiplies every gradient by a NaN coefficient: read after it, every leaf
    would be blamed. The gradients are read when backward returns."""
    class GainNeverUsed(_Net):
        def forward(self, x):
            return self.lin(x).sum() + (self.gain.sqrt() * 0).sum()  # its gradient: 0 * inf, NaN

    model = GainNeverUsed(0.0)
    with ja.capture() as trace:
        model(torch.randn(4, 3)).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert torch.isnan(model.lin.weight.grad).all()  # the clip did spread it
    (d,) = trace.diagnoses
    assert d.kind == "nan-gradient" and d.tensor == "model.gain"
    assert "model.lin" not in d.message


def test_a_model_made_and_dropped_inside_a_function_has_its_gradients_read():
    def train_fresh_model():
        model = _Net(0.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return _train_step(model, opt, torch.randn(4, 3))

    with ja.capture() as trace:
        train_fresh_model()
    assert [d.kind for d in trace.diagnoses] == ["nan-gradient"]


def test_a_trace_read_inside_another_capture_adds_nothing_to_it():
    model = _Net(0.0)
    with ja.capture() as first:
        model(torch.randn(4, 3)).backward()
    with ja.capture() as second:
        assert [d.kind for d in first.diagnoses] == ["nan-gradient"]  # built here
    assert second.ops == []


def test_a_nested_capture_reads_the_gradients_of_its_own_backward():
    model = _Net(0.0)
    with ja.capture() as outer:
        with ja.capture() as inner:
            model(torch.randn(4, 3)).backward()
        model.lin(torch.ones(1, 3)).sum()
    assert [d.kind for d in inner.diagnoses] == ["nan-gradient"]
    assert [d.kind for d in outer.diagnoses] == ["nan-gradient"]


def test_a_nested_capture_is_not_blamed_for_a_nan_of_the_outer_block():
    model = _Net(0.0)
    with ja.capture() as outer:
        model(torch.randn(4, 3)).backward()  # NaN, before the inner block
        model.zero_grad()
        with torch.no_grad():
            model.gain.fill_(1.0)
        with ja.capture() as inner:
            model(torch.randn(4, 3)).backward()  # finite
    assert [d.kind for d in outer.diagnoses] == ["nan-gradient"]
    assert inner.diagnoses == []


def test_a_finite_forward_pass_is_read_not_assumed():
    """A NaN gradient is "from a finite forward pass" only where the loss was finite: the tensors each
    checked backward starts from are read (a NaN loss makes NaN gradients with no derivative at fault)."""
    trace = sqrt_at_zero()
    (d,) = trace.diagnoses
    assert d.kind == "nan-gradient" and "The forward pass was finite" in d.message
    assert list(trace.roots_finite.values()) == [True]

    x = torch.tensor([0.0, 1.0], requires_grad=True)
    for check_nan in (False, True):
        with ja.capture(check_nan=check_nan) as trace:
            logs = torch.log(x * 0)  # the forward's first value that is not finite
            loss = (logs * 0).sum()
            loss.backward()
        assert not torch.isfinite(loss) and not torch.isfinite(x.grad).all()  # PyTorch's own values
        (d,) = trace.diagnoses
        assert d.kind == "nan-gradient" and d.source.startswith("logs = torch.log(x * 0)")
        assert "was finite" not in d.message
        # With check_nan the node's own cause is said (log of 0), with the forward pass's part in it.
        assert ("The forward pass first made NaN or Inf there too" in d.message and "log of 0" in d.message
                if check_nan else "already held NaN or Inf" in d.message)
        assert list(trace.roots_finite.values()) == [False]
        x.grad = None


def test_a_loss_that_is_nan_where_the_tool_cannot_read_it_is_said_to_be_unread():
    """Off the CPU the values are not read inside the block (a sync): the loss's finiteness comes with
    the norms at the end, and where the tensors of the forward pass are gone by then the first
    non-finite forward line is not found; the words then say where the loss was made and how to find
    that line."""
    from jupyter_autograd.diagnose.rules.nan import nan_gradient
    from jupyter_autograd.diagnose.wording import worded

    x = torch.tensor([0.0, 1.0], requires_grad=True)
    with ja.capture() as trace:
        logs = torch.log(x * 0)
        loss = (logs * 0).sum()
        loss.backward()
    trace.nonfinite_forward.clear()  # as on a GPU
    (f,) = nan_gradient(trace, None)
    assert f.reason == "nan-in-forward" and f.op.location.source == "loss = (logs * 0).sum()"
    words = worded(trace, f)
    assert "torch.isfinite" in words.fix and "already held NaN or Inf" in words.message


def test_off_the_cpu_a_nan_loss_is_traced_to_its_forward_line_when_the_block_ends(monkeypatch):
    """On a GPU the loss's norm stays a device tensor until the block ends (reading it inside would
    synchronise): the first forward line that left the finite numbers is then looked for among the
    tensors still alive, and is the line named on the CPU, where it is read at once (the scenario's
    own culprit, checked by judge)."""
    import pathlib

    from tests import scenario_runner as runner

    original = nan_watch._norms

    def as_on_a_gpu(grads):  # norms kept as 0-d tensors, as a device's are
        return [(tid, torch.tensor(norm, dtype=torch.float64) if type(norm) is float else norm)
                for tid, norm in original(grads)]

    sc = runner.load(str(pathlib.Path(__file__).parent / "scenarios" / "nan_loss_from_a_masked_class.py"))
    on_cpu = runner.judge(sc)
    monkeypatch.setattr(nan_watch, "_norms", as_on_a_gpu)
    assert runner.judge(sc) == on_cpu == "nan-gradient at line 15"
