"""Differential test: predictions made before backward against what backward then does.

Random small programs of tensor ops and in-place writes are run three ways:
- plain, with backward: does PyTorch raise "modified by an inplace operation"?
- plain, with every saved tensor cloned when it is saved (a pack hook): the gradients backward
  would give from the values the forward actually used. A difference from the plain gradients
  means a write corrupted them silently.
- under capture(), with the final backward removed: the prediction.
`saved-tensor-modified` must be predicted exactly when backward raises, and
`silent-data-mutation` exactly when the gradients differ from the clean re-run.

The ops are ones whose gradient depends on the saved values continuously. For abs, relu or
maximum it depends only on signs or order, so an overwrite of saved memory (which we report)
may leave the gradients unchanged and the oracle could not tell. For the same reason every write
changes the values it writes (no constant written twice), and `a` does not sum to 0 (outer
products of a symmetric `a` cancel the effect of a write): with random seeds, both made writes
that the tool rightly reports look harmless to the oracle.
"""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jupyter_autograd as ja

UNARY = ["{x}.exp()", "torch.sigmoid({x})", "torch.tanh({x})", "{x} * 2", "{x} * {x}", "{x}.pow(3)"]
BINARY = ["{x} * {y}", "{x} + {y}", "{x} / ({y} * {y} + 1)", "torch.sin({x}) * {y}", "torch.outer({x}, {y}).sum(1)"]
WRITES = ["{t}.add_(0.5)", "{t}.mul_(1.5)", "{t}[0] = 3.0", "{t}.data.add_(0.5)", "{t}.detach().mul_(1.5)",
          "with torch.no_grad(): {t}.add_(0.5)", "{t}.data[1:] = {t}.data[1:] * 2.0 + 0.5", "{t} += 1", "{t}_alias = {t}.data; {t}_alias.mul_(3)"]


@st.composite
def programs(draw):
    lines = ["import torch",
             "a = torch.linspace(-1.0, 1.3, 4, requires_grad=True)",
             "b = torch.linspace(0.5, 1.5, 4, requires_grad=True)"]
    pool = ["a", "b"]
    made = []
    for _ in range(draw(st.integers(2, 7))):
        if made and draw(st.booleans()):
            target = draw(st.sampled_from(made))
            lines.append(draw(st.sampled_from(WRITES)).format(t=target))
        else:
            name = "t%d" % len(made)
            if draw(st.booleans()):
                expr = draw(st.sampled_from(UNARY)).format(x=draw(st.sampled_from(pool)))
            else:
                expr = draw(st.sampled_from(BINARY)).format(x=draw(st.sampled_from(pool)), y=draw(st.sampled_from(pool)))
            lines.append("%s = %s" % (name, expr))
            pool.append(name)
            made.append(name)
    lines.append("loss = " + " + ".join("%s.sum()" % t for t in made))
    return "\n".join(lines) + "\n", "loss.backward()\n"


def run(source, hooks=False, capture=False):
    ns = {}
    code = compile(source, "<generated>", "exec")
    exc, trace = None, None
    try:
        if capture:
            with ja.capture() as trace:
                exec(code, ns)
        elif hooks:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
                exec(code, ns)
        else:
            exec(code, ns)
    except RuntimeError as e:
        exc = str(e)
    grads = [None if ns.get(k) is None or ns[k].grad is None else ns[k].grad.clone() for k in ("a", "b")]
    return exc, grads, trace


def same(g1, g2):
    return all((x is None and y is None) or (x is not None and y is not None and torch.allclose(x, y, rtol=1e-5, atol=1e-6))
               for x, y in zip(g1, g2))


STATS = {"programs": 0, "raises": 0, "silent": 0}


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(programs())
def test_prediction_agrees_with_backward(program):
    forward, backward = program
    exc, plain_grads, _ = run(forward + backward)
    raises = exc is not None and "modified by an inplace operation" in exc
    assert exc is None or raises, exc

    _, _, predicted = run(forward, capture=True)
    kinds = {d.kind for d in predicted.diagnoses}
    assert not predicted.warnings
    assert ("saved-tensor-modified" in kinds) == raises, (forward, kinds, exc)

    captured_exc, captured_grads, _ = run(forward + backward, capture=True)
    assert captured_exc == exc and same(captured_grads, plain_grads), "capture changed the outcome"

    STATS["programs"] += 1
    if raises:
        STATS["raises"] += 1
        return
    _, clean_grads, _ = run(forward + backward, hooks=True)
    silent = not same(plain_grads, clean_grads)
    STATS["silent"] += silent
    assert ("silent-data-mutation" in kinds) == silent, (forward, kinds, plain_grads, clean_grads)
    assert kinds <= {"silent-data-mutation"}, kinds


def test_differential_sample_is_meaningful():
    """The generated programs exercise every outcome (runs after the property test in this module)."""
    if STATS["programs"] == 0:
        test_prediction_agrees_with_backward()
    assert STATS["programs"] >= 100
    assert STATS["raises"] >= 10 and STATS["silent"] >= 10, STATS
    print("differential:", STATS)
