"""Inside compiled code: the lines inside a torch.compile'd function or module are where cuts, NaN
gradients and writes are named, the view boxes a compiled region's call, and the user's backend
runs as chosen (the same graphs, no graph break of ours) with an identical outcome.

The oracle is PyTorch: each program is run compiled and plain (without torch.compile), each both
without and under capture(). The captured runs must end as the uncaptured ones do (exception,
gradients, `.grad` left None), and the compiled program must be diagnosed as the plain one is: the
same kind, tensor and line (the line is in the function that was compiled). Compiling costs seconds
per function, so each program is compiled once per way it runs, in module-scoped fixtures.
"""
import pathlib
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch
from torch._dynamo.utils import counters

import jupyter_autograd as ja
from jupyter_autograd.model import PROBLEM_KINDS
from jupyter_autograd.render.layout.build import build_scene

from . import scenario_runner as runner

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "scenarios"

# A parameter used only before a detach inside the compiled function (the eager program is the same
# without the decorator): `w` never gets a gradient, and nothing raises.
CUT = '''\
# expect: missing-grad tensor=w
# outcome: ok
import torch

torch.manual_seed(0)
w = torch.randn(4, 4, requires_grad=True)
b = torch.randn(4, requires_grad=True)
opt = torch.optim.SGD([w, b], lr=0.1)


@torch.compile
def f(x):
    h = x @ w
    h = h.detach()  # @culprit
    return (h + b).relu()


loss = f(torch.randn(2, 4)).sum()
opt.zero_grad()
loss.backward()
opt.step()
'''

# A write inside a compiled function into a tensor that autograd saved outside it; the compiled
# function runs on the aot_eager backend (the user's choice of backend is kept).
WRITE = '''\
# expect: saved-tensor-modified tensor=y
# outcome: raises RuntimeError
import torch


@torch.compile(backend="aot_eager")
def scale(y):
    y.mul_(2)  # @culprit
    return y + 1


torch.manual_seed(0)
x = torch.randn(3, requires_grad=True)
y = x.exp()  # @saved
z = scale(y)
(y.sum() + z.sum()).backward()
'''


def _decorated(name, anchor, decorator="@torch.compile"):
    """A scenario of tests/scenarios with `decorator` put on the def at line `anchor`."""
    source = (SCENARIOS / name).read_text()
    assert anchor in source, anchor
    indent = anchor[:len(anchor) - len(anchor.lstrip())]
    return source.replace(anchor, indent + decorator + "\n" + anchor, 1)


def _compiled_model(name, after):
    """A scenario with `model = torch.compile(model)` after the line `after`. `model` is then the
    compiled wrapper: its parameters are `model._orig_mod.<name>` (what torch calls them)."""
    source = (SCENARIOS / name).read_text()
    assert after in source, after
    return source.replace(after, after + "\nmodel = torch.compile(model)", 1).replace("tensor=model.",
                                                                                       "tensor=model._orig_mod.")


# (name, the compiled program): existing scenarios that fit in one function or module, compiled.
DIFFERENTIAL = {
    "cut_in_function": CUT,
    "write_inside": WRITE,
    "detach_in_compiled_model": _compiled_model("missing_grad_detach_in_forward.py", "model = Model()"),
    "argmax_in_compiled_forward": _decorated("argmax_choice_fed_to_a_second_model.py", "    def forward(self, x):",
                                             '@torch.compile(backend="aot_eager")'),
    "nan_in_compiled_function": _decorated("nan_norm_of_zero_vector.py", "def normalise(v):"),
}


def _plain(source):
    """The same program without torch.compile."""
    lines = [line for line in source.splitlines() if line.strip() not in ("@torch.compile",
                                                                         '@torch.compile(backend="aot_eager")')]
    return "\n".join(lines).replace("model = torch.compile(model)\n", "").replace("._orig_mod.", ".") + "\n"


class Run:
    """One program run without and under capture(), judged as the scenario runner judges it (the
    same outcome and gradients, no internal warning, the expected diagnosis at its marked line and
    nothing of another kind), with its trace and the graph breaks of its captured run."""

    def __init__(self, path):
        sc = self.scenario = runner.load(str(path))
        plain_exc, plain_grads, _ = runner.execute(sc.source, sc.path, captured=False)
        counters.clear()
        exc, self.grads, self.trace = runner.execute(sc.source, sc.path, captured=True, options=sc.options)
        self.graph_breaks = sum(counters["graph_break"].values())
        assert exc == plain_exc and runner.close(self.grads, plain_grads), "capture changed the outcome"
        assert self.trace.warnings == []
        problems = [d for d in self.trace.diagnoses if d.kind in PROBLEM_KINDS]
        assert {d.kind for d in problems} == {sc.kind}, [(d.kind, d.line) for d in problems]
        found = [d for d in problems if d.line == sc.culprit and d.filename == sc.path
                 and (not sc.saved or d.saved_line in sc.saved) and sc.tensor in (None, d.tensor)]
        assert len(found) == 1, ("wanted", sc.culprit, sc.tensor, [(d.line, d.saved_line, d.tensor) for d in problems])
        self.finding = found[0]


class Runs(dict):
    """name -> (the compiled program's Run, the plain program's Run), each program run once a way,
    when a test first asks for it."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def __missing__(self, name):
        source = DIFFERENTIAL[name]
        compiled, plain = self.folder / ("%s.py" % name), self.folder / ("%s_plain.py" % name)
        compiled.write_text(source)
        plain.write_text(_plain(source))
        self[name] = (Run(compiled), Run(plain))
        return self[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("compiled"))


def _same_grads(compiled, plain):
    """The same leaves got gradients, equal but for the float rounding of fused kernels."""
    compiled = {k.replace("._orig_mod.", "."): v for k, v in compiled.items()}
    return set(compiled) == set(plain) and all(
        len(compiled[k]) == len(plain[k]) and all(
            (x != x and y != y) or x == y or abs(x - y) <= 1e-5 * (1 + abs(y)) for x, y in zip(compiled[k], plain[k]))
        for k in plain)


@pytest.mark.parametrize("name", sorted(DIFFERENTIAL))
def test_the_compiled_program_is_diagnosed_as_the_plain_one(runs, name):
    compiled, plain = runs[name]
    d, e = compiled.finding, plain.finding
    assert (d.kind, d.tensor.replace("._orig_mod.", "."), d.source, d.saved_source) == (
        e.kind, e.tensor, e.source, e.saved_source)
    # Named inside the compiled code: the line of one of the ops recorded for a call of the region.
    trace = compiled.trace
    inside = {(op.location.filename, op.location.line) for call in trace.compiled
              for op in trace.ops[call.first_op:call.end_op] if op.location is not None}
    assert (d.filename, d.line) in inside, (d.line, inside)
    assert compiled.graph_breaks == 0  # the user's graphs, whole: none broken by the capture
    assert _same_grads(compiled.grads, plain.grads)  # compiled or not, the same gradients (NaN included)


def test_a_parameter_starved_inside_a_compiled_function_keeps_no_gradient(runs):
    compiled, _ = runs["cut_in_function"]
    assert "w" not in compiled.grads and "b" in compiled.grads  # w.grad is None, as without capture
    trace = compiled.trace
    assert "w" not in [trace.tensor_label(n.variable) for n in trace.nodes.values() if n.variable is not None]
    # The view boxes the call of `f`, with the cut at the detach inside it.
    scene = build_scene(trace)
    [box] = [b for b in scene.boxes.values() if b.sub.startswith("torch.compile")]
    assert box.label == "f"
    cuts = [i for i in scene.items.values() if i.kind == "cut"]
    assert [i.where[1] for i in cuts] == [compiled.finding.line] and all(i.parent == box.id for i in cuts)


def test_a_nan_made_inside_a_compiled_function_is_named_as_plain_pytorch_names_it(runs):
    compiled, plain = runs["nan_in_compiled_function"]
    assert compiled.scenario.options == {"check_nan": True}
    assert compiled.trace.nan_origin["name"] == plain.trace.nan_origin["name"] == "PowBackward0"
    assert compiled.trace.nan_origin["facts"] == plain.trace.nan_origin["facts"]
    assert "a power below 1 of 0 at 1 of 4 positions" in compiled.finding.message


def test_a_compiled_module_is_boxed_around_its_modules(runs):
    compiled, _ = runs["detach_in_compiled_model"]
    scene = build_scene(compiled.trace)
    [box] = [b for b in scene.boxes.values() if b.sub.startswith("torch.compile")]
    assert box.label == "Model.forward"
    inside = {scene.boxes[c].name for c in box.children if c in scene.boxes}
    # The model's own box (the module inside the compiled wrapper `model`), with its encoder and
    # decoder, is in the region's.
    assert inside == {"model._orig_mod"}
    [node] = [i for i in scene.items.values() if i.label == "CompiledFunctionBackward"]
    assert box.id in scene.ancestors(node.id)


def test_the_replay_of_a_compiled_region_keeps_no_tensor_alive():
    """With check_nan, a region's inputs are remembered by weak reference only."""
    @torch.compile(backend="aot_eager")
    def root_of_sum(v):
        return (v * v).sum(-1) ** 0.5

    v = torch.zeros(2, 3, requires_grad=True)
    with ja.capture(check_nan=True) as trace:
        root_of_sum(v).sum().backward()
    [d] = trace.diagnoses
    assert d.kind == "nan-gradient" and d.op_index is not None
    gone = weakref.ref(v)
    del v
    assert gone() is None


_FIRST_TRACE_IN_A_BLOCK = textwrap.dedent('''
    import torch
    from torch._dynamo.utils import counters
    import jupyter_autograd as ja

    @torch.compile(backend="aot_eager")
    def f(v):
        return (v ** 2).sum() ** 0.5 + 2 ** v.mean()

    v = torch.randn(3, requires_grad=True)
    with ja.capture():
        f(v)  # Dynamo traces for the first time in this process, inside the block
    g = torch.compile(lambda v: (v ** 3).sum() ** 0.5, backend="aot_eager")
    g(v)  # and after it
    print(sum(counters["graph_break"].values()))
''')


def test_the_first_trace_of_a_process_inside_a_block_breaks_no_graph():
    """Dynamo registers its handler of `has_torch_function` (which Tensor's `**` and reflected
    operators call) once per process: our stand-in for it must not take the place of torch's own."""
    out = subprocess.run([sys.executable, "-c", _FIRST_TRACE_IN_A_BLOCK], capture_output=True, text=True,
                         cwd=str(ROOT), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "0", out.stdout
