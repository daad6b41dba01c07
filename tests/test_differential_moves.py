"""Differential test on gradient flow: leaves moved after `requires_grad=True`, repeated backward
calls, retain_graph, detaches.

Random programs make two tensors with `requires_grad=True`, move some of them (`.double()`,
`.to(torch.float64)`, `.float()` on a float64 leaf, `.to("cpu", dtype=...)`, `.clone()`, chains of
these, and moves that change nothing, which return the leaf itself), then compute, detach,
and run backward from old and new losses, with and without retain_graph. Every loss uses every
parameter variable, so after a backward that raised nothing, a variable's `.grad` is None exactly
when the variable is not a leaf.

Each program runs plain and under capture(); the outcome must be identical, and:
- missing-grad is said for exactly the parameter variables whose `.grad` is None after a backward
  that raised nothing (the variable is the move's result, not the leaf);
- graph-freed is said exactly when a backward raises "backward through the graph a second time",
  from the checkpoint taken before that backward runs (`predicted`), naming that call's line;
- nothing else is said.
"""
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jupyter_autograd as ja

PARAMS = {"p": "torch.linspace(-1.0, 1.0, 4, requires_grad=True)",
          "q": "torch.linspace(0.5, 1.5, 4, dtype=torch.float64, requires_grad=True)"}
# Moves; those that change nothing (a float32 tensor's .float(), .to("cpu") on the CPU) return the
# leaf itself, which keeps its gradient.
MOVES = [".to(torch.float64)", ".double()", ".float()", '.to("cpu", dtype=torch.float64)',
         '.to("cpu", dtype=torch.float32)', ".clone()", '.to("cpu")', ".to(torch.float32)", ".double().float()",
         ".clone().double()"]
UNARY = ["{x}.exp()", "torch.tanh({x})", "{x} * 2", "{x} + 1", "{x}.pow(3)", "torch.sin({x})"]
BINARY = ["{x} * {y}", "{x} + {y}", "{x} / ({y} * {y} + 1)"]


@st.composite
def programs(draw):
    lines = ["import torch"]
    for name, make in PARAMS.items():
        move = draw(st.sampled_from(MOVES)) if draw(st.booleans()) else ""
        if move and draw(st.booleans()):
            lines += ["%s = %s" % (name, make), "%s = %s%s" % (name, name, move)]  # moved in a line of its own
        else:
            lines.append("%s = %s%s" % (name, make, move))
    params = " + ".join("%s.sum()" % p for p in PARAMS)
    pool, losses, made = list(PARAMS), [], 0
    for _ in range(draw(st.integers(3, 10))):
        what = draw(st.sampled_from(["op", "op", "loss", "loss", "backward", "backward", "detach"]))
        if what == "op" or len(pool) == len(PARAMS):
            x, y = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
            expr = draw(st.sampled_from(UNARY + BINARY)).format(x=x, y=y)
            name = "t%d" % made
            made += 1
            lines.append("%s = %s" % (name, expr))
            pool.append(name)
        elif what == "detach":
            name = draw(st.sampled_from(pool[len(PARAMS):]))
            lines.append("%s = %s.detach()" % (name, name))
        elif what == "loss":
            name = "loss%d" % len(losses)
            lines.append("%s = (%s).sum() + %s" % (name, draw(st.sampled_from(pool[len(PARAMS):])), params))
            losses.append(name)
        if what == "backward" and losses:
            retain = ", retain_graph=True" if draw(st.booleans()) else ""
            lines.append("%s.backward(%s)" % (draw(st.sampled_from(losses)), retain.lstrip(", ")))
    if losses and draw(st.booleans()):  # backward from a loss again
        lines.append("%s.backward()" % draw(st.sampled_from(losses)))
    else:
        lines.append("final = (%s).sum() + %s" % (pool[-1], params))
        lines.append("final.backward()")
    return "\n".join(lines) + "\n"


def run(source, capture):
    ns = {}
    code = compile(source, "<moves>", "exec")
    exc, trace, line = None, None, None
    try:
        if capture:
            with ja.capture() as trace:
                exec(code, ns)
        else:
            exec(code, ns)
    except RuntimeError as e:
        exc = str(e)
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == "<moves>":
                line = tb.tb_lineno
            tb = tb.tb_next
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading a non-leaf's .grad warns
        grads = {k: None if ns.get(k) is None or ns[k].grad is None else ns[k].grad.clone() for k in PARAMS}
    return exc, line, grads, trace


STATS = {"programs": 0, "graph-freed": 0, "missing-grad": 0, "moved": 0, "both": 0}


def check(source):
    exc, line, grads, _ = run(source, capture=False)
    captured_exc, captured_line, captured_grads, trace = run(source, capture=True)
    assert (captured_exc, captured_line) == (exc, line), "capture changed the outcome"
    for k in PARAMS:
        a, b = grads[k], captured_grads[k]
        assert (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b)), \
            "capture changed the gradients"
    assert exc is None or "backward through the graph a second time" in exc, exc
    ran = [op for op in trace.ops if op.is_backward and op.error is None]
    starved = {k for k, g in grads.items() if g is None} if ran else set()
    problems = trace.diagnoses
    freed = [d for d in problems if d.kind == "graph-freed"]
    missing = {d.tensor for d in problems if d.kind == "missing-grad"}
    assert {d.kind for d in problems} <= {"graph-freed", "missing-grad"}, (source, trace.report())
    assert bool(freed) == (exc is not None), (source, exc, trace.report())
    if freed:  # said from the checkpoint before the call that raised, and naming that call
        assert all(d.predicted for d in freed)
        assert any("a second time\" at line %d " % line in d.message for d in freed), (source, line, trace.report())
    assert missing == starved, (source, missing, starved, trace.report())
    return exc is not None, bool(starved), any(m in source for m in MOVES)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(programs())
def test_flow_diagnosis_agrees_with_pytorch(source):
    raised, starved, moved = check(source)
    STATS["programs"] += 1
    STATS["graph-freed"] += raised
    STATS["missing-grad"] += starved
    STATS["moved"] += moved
    STATS["both"] += raised and starved


def test_moves_sample_is_meaningful():
    if STATS["programs"] == 0:
        test_flow_diagnosis_agrees_with_pytorch()
    assert STATS["programs"] >= 100
    assert STATS["graph-freed"] >= 100 and STATS["missing-grad"] >= 100 and STATS["both"] >= 20, STATS
    assert STATS["programs"] - STATS["graph-freed"] >= 100 and STATS["programs"] - STATS["moved"] >= 100, STATS
    print("moves differential:", STATS)
