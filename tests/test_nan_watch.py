"""check_nan's watch (capture/nan_watch.py): the fast check in the hook and the device path, whose
flags are read once when the backward call ends, must find the same node and the same values."""
import torch

import jupyter_autograd as ja
from jupyter_autograd.capture import nan_watch
from jupyter_autograd.diagnose.flow import _CAUSES


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
            if self.recorder.nan_origin is None:
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
