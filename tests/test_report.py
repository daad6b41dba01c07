"""The plain-text report and the note a script's traceback gets (PEP 678), as a user meets them."""
import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import jupyter_autograd as ja
from jupyter_autograd.render.text import exception_note, explaining_diagnosis

from . import scenario_runner as runner
from .conftest import ROOT, shared_scenario
from .test_fixes import FILES

HAS_NOTES = sys.version_info >= (3, 11)

SCRIPT = """\
import torch
import jupyter_autograd as ja

x = torch.tensor([[1.0, 2.0]])
w1 = torch.tensor([[2.0], [1.0]], requires_grad=True)
w2 = torch.tensor([3.0], requires_grad=True)
with ja.capture() as trace:
    d = torch.matmul(x, w1)
    f = torch.matmul(d, w2)
    d[:] = 1
    f.backward()
"""


def run_script(tmp_path, source, name="train.py"):
    script = tmp_path / name
    script.write_text(source)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_script_that_raises_shows_the_diagnosis_under_its_traceback(tmp_path):
    proc = run_script(tmp_path, SCRIPT)
    assert proc.returncode == 1
    err = proc.stderr
    assert "RuntimeError: one of the variables needed for gradient computation has been modified" in err
    if not HAS_NOTES:
        assert "jupyter-autograd" not in err
        return
    note = err[err.index("Hint: enable anomaly detection"):]
    assert "jupyter-autograd: A tensor saved for backward was modified in place (`d`)" in note
    assert "culprit: train.py, line 10: d[:] = 1" in note
    assert "saved:   train.py, line 9: f = torch.matmul(d, w2)" in note
    assert "fix: Write to a copy" in note and "d = d.clone()" in note
    assert len(note.strip().splitlines()) <= 10, note  # a few lines, not the whole report


def test_the_note_changes_neither_the_exception_type_nor_its_message(tmp_path):
    compare = SCRIPT.replace("with ja.capture() as trace:", "def block():") + textwrap.dedent("""
        import json
        def outcome(captured):
            global x, w1, w2
            x = torch.tensor([[1.0, 2.0]])
            w1 = torch.tensor([[2.0], [1.0]], requires_grad=True)
            w2 = torch.tensor([3.0], requires_grad=True)
            try:
                if captured:
                    with ja.capture():
                        block()
                else:
                    block()
            except Exception as e:
                return [type(e).__name__, str(e), getattr(e, "__notes__", [])]
        print(json.dumps([outcome(False), outcome(True)]))
        """)
    proc = run_script(tmp_path, compare)
    assert proc.returncode == 0, proc.stderr
    plain, captured = json.loads(proc.stdout)
    assert captured[:2] == plain[:2] and plain[2] == []
    assert len(captured[2]) == (1 if HAS_NOTES else 0)


RAISING = [p for p in FILES if "raises" in runner.load(str(p)).outcome]


@pytest.mark.parametrize("path", RAISING, ids=[p.parent.name + "/" + p.name for p in RAISING])
def test_every_scenario_that_raises_gets_the_note_of_its_diagnosis(path):
    """Over all corpora: where the expected diagnosis is found, its exception carries it."""
    sc = runner.load(str(path))
    exc, _, trace = runner.execute(sc.source, sc.path, captured=True)
    assert exc is not None and trace.error.startswith(exc[0])
    found = [d for d in trace.diagnoses if d.kind == sc.kind and d.line == sc.culprit]
    note = exception_note(trace)
    explains = explaining_diagnosis(trace)  # the diagnosis the note is about (pytest --autograd's summary)
    assert (explains is None) == (note is None)
    if found:  # kinds not diagnosed yet have no note to give
        assert note and note.startswith("jupyter-autograd: " + found[0].title), note
        assert explains in trace.diagnoses and note.startswith("jupyter-autograd: " + explains.title + "\n")
        assert re.search(r"culprit(?::| and %s:) +%s, line %d: " % (found[0].saved_label, re.escape(path.name),
                                                                 sc.culprit), note), note


def test_no_note_on_an_exception_that_no_diagnosis_explains():
    a = torch.ones(3, requires_grad=True)
    try:
        with ja.capture() as trace:
            y = a.exp()
            y += 1  # a problem, but the block fails for another reason before backward
            raise ValueError("bad batch")
    except ValueError as e:
        assert not getattr(e, "__notes__", None)
    assert trace.diagnoses and exception_note(trace) is None and explaining_diagnosis(trace) is None


def test_no_note_without_an_exception():
    with ja.capture() as trace:
        (torch.ones(2, requires_grad=True) * 2).sum().backward()
    assert exception_note(trace) is None and explaining_diagnosis(trace) is None


def test_a_block_that_stops_before_any_tensor_op_says_so():
    try:
        with ja.capture() as trace:
            undefined_name.sum()  # noqa: F821
    except NameError:
        pass
    report = trace.report()
    assert report.startswith("jupyter-autograd: the block stopped before any tensor operation ran "
                             "(NameError: name 'undefined_name' is not defined)")
    assert "no problems found" not in report and "0 operations" not in report


def test_counts_of_one_are_singular():
    from jupyter_autograd.model import GraphNode, TraceData
    from jupyter_autograd.render.text import graph_summary

    w = torch.ones(2, requires_grad=True)
    with ja.capture() as trace:
        y = w * 2  # noqa: F841  (kept, so its graph is there at the end)
    summary = trace.report().split("\n\n")[-1]
    assert summary.startswith("1 operation recorded, 0 backward calls.\n"), summary
    assert ", 1 saved tensor." in summary, summary
    one_node = TraceData(nodes={1: GraphNode(key=1, name="MulBackward0")})
    assert graph_summary(one_node).splitlines()[1] == "Graph: 1 node (MulBackward0), 0 saved tensors."
    # Every count in the report: a 1 never goes with a plural.
    assert not re.search(r"(?<![\d.])1 (operations|nodes|backward calls|saved tensors|problems)\b",
                         trace.report() + graph_summary(one_node))


def test_a_one_line_cell_shows_its_line_once(tmp_path):
    line = "a = torch.ones(3, requires_grad=True); y = a.exp(); y += 1; y.sum().backward()"
    proc = run_script(tmp_path, "import torch\nimport jupyter_autograd as ja\ntry:\n    with ja.capture() as t:\n"
                      "        " + line + "\nexcept RuntimeError:\n    print(t.report())\n")
    assert proc.returncode == 0, proc.stderr
    report = proc.stdout
    assert "[saved-tensor-modified]" in report and "culprit and saved: train.py, line 5: " + line in report
    assert report.count("y = a.exp()") == 1, report


def test_code_in_a_fix_is_printed_as_code_not_wrapped():
    a = torch.ones(3, requires_grad=True)
    try:
        with ja.capture() as trace:
            very_long_variable_name_for_the_activation = a.exp()
            very_long_variable_name_for_the_activation += 1
            very_long_variable_name_for_the_activation.sum().backward()
    except RuntimeError:
        pass
    report = trace.report()
    code = ("very_long_variable_name_for_the_activation = very_long_variable_name_for_the_activation + 1")
    assert "\n         %s\n" % code in report, report


# -- the README's examples are what the code prints ----------------------------------------------

README = (ROOT / "README.md").read_text()


def _readme_block(after):
    """The first fenced block after the given text, as lines."""
    rest = README[README.index(after) + len(after):]
    start = rest.index("```")
    body = rest[rest.index("\n", start) + 1:]
    return body[:body.index("```")].rstrip("\n").splitlines()


def _shown_in(sample, printed):
    """Every line of the sample is a line printed (a line ending in "..." starts one)."""
    real = [line.rstrip() for line in printed.splitlines()]
    for line in sample:
        if line.endswith("..."):
            assert any(r.startswith(line[:-3].rstrip()) for r in real), "README line not printed:\n" + line
        else:
            assert line.rstrip() in real, "README line not printed:\n%s\n\nprinted:\n%s" % (line, printed)


def test_readme_sample_report_is_what_its_example_cell_prints(shell):
    from IPython.utils.capture import capture_output

    cell = "\n".join(_readme_block("## Quickstart: two cells\n\n```python\n%load_ext jupyter_autograd\n```"))
    assert cell.startswith("%%autograd\nimport torch\n"), cell
    with capture_output() as cap:
        # As in a notebook: the README's first cell loads the extension, the example is In [2].
        shell.run_cell("%load_ext jupyter_autograd", store_history=True)
        shell.run_cell(cell.replace("%%autograd", "%%autograd --text", 1), store_history=True)
    printed = "\n".join([cap.stdout] + [o.data.get("text/plain", "") for o in cap.outputs])
    _shown_in(_readme_block("`%%autograd --text` prints the report instead:"), printed)


def test_readme_sample_note_is_what_a_script_prints(tmp_path):
    proc = run_script(tmp_path, SCRIPT)
    sample = _readme_block("that dies in `backward()` says which line did it")
    # The sample's first line is PyTorch's own message as the torch of the README's runs words it; the
    # internal node's name and the hint differ between versions (Fill3 or FillBackward2; the hint's
    # check_nan=False). The script prints this torch's message unchanged (plain PyTorch, the oracle),
    # and the README's from the start of the message to the internal node's name.
    plain = run_script(tmp_path, SCRIPT.replace("with ja.capture() as trace:", "if True:"), name="plain.py")
    theirs = [line for line in proc.stderr.splitlines() if line.startswith("RuntimeError: ")]
    assert theirs and theirs == [line for line in plain.stderr.splitlines() if line.startswith("RuntimeError: ")]
    sample = [line.split(" which is output 0 of ")[0] + "..." if line.startswith("RuntimeError: ") else line
              for line in sample]
    if HAS_NOTES:
        _shown_in(sample, proc.stderr)


# -- where a line is, and what the second line is, in every output ---------------------------------

MODEL_FILE = """\
import torch


def forward(x, w):
    h = torch.sigmoid(x @ w)
    h.mul_(2)
    return h
"""

TRAIN_FILE = """\
import torch
import model


def step():
    w = torch.randn(3, 3, requires_grad=True)
    out = model.forward(torch.randn(2, 3), w)
    out.sum().backward()
"""


def _import(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def two_files(tmp_path, monkeypatch):
    """A training step in train.py whose write is in model.py: the lines are in another file than the block."""
    (tmp_path / "model.py").write_text(MODEL_FILE)
    (tmp_path / "train.py").write_text(TRAIN_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "model", raising=False)
    train = _import(tmp_path / "train.py")
    with pytest.raises(RuntimeError) as raised:
        with ja.capture() as trace:
            train.step()
    return trace, raised.value


def test_every_output_names_the_file_of_each_line(two_files):
    from jupyter_autograd.widget.widget import _diagnosis_dict, static_html

    trace, exc = two_files
    (d,) = trace.diagnoses
    assert (d.line, d.saved_line) == (6, 5)
    culprit, saved = "model.py, line 6: h.mul_(2)", "model.py, line 5: h = torch.sigmoid(x @ w)"
    report = trace.report()
    assert "culprit: " + culprit in report and "saved:   " + saved in report, report
    if HAS_NOTES:
        assert "culprit: " + culprit in exc.__notes__[0]
    card = _diagnosis_dict(trace, d)  # what the widget's card prints
    assert (card["place"], card["saved_place"], card["saved_label"]) == ("model.py, line 6", "model.py, line 5", "saved")
    page = static_html(trace)  # what save_html and a notebook without a kernel show
    assert "model.py, line 6: <code>h.mul_(2)</code>" in page and "saved: model.py, line 5: <code>" in page, page


def test_files_with_the_same_base_name_are_told_apart():
    from jupyter_autograd import Trace

    trace = Trace(sources={"/src/a/model.py": [], "/src/b/model.py": [], "/src/train.py": [], "<stdin>": []})
    assert trace.place("/src/a/model.py", 3) == "a/model.py, line 3"
    assert trace.file_label("/src/b/model.py") == "b/model.py"
    assert trace.file_label("/src/train.py") == "train.py" and trace.file_label("<stdin>") == "<stdin>"
    nested = Trace(sources={"/x/pkg/a/model.py": [], "/y/pkg/a/model.py": []})
    assert nested.file_label("/x/pkg/a/model.py") == "x/pkg/a/model.py"


SECOND_LINES = {  # a scenario of each kind that has a second line, and the words the report must label it with
    "20_hidden_state_not_detached.py": ("graph-freed", "freed by"),
    "24_sqrt_at_zero.py": ("nan-gradient", "in the backward"),
    "09_exp_output_incremented.py": ("saved-tensor-modified", "saved"),
    "04_data_alias_silent.py": ("silent-data-mutation", "saved"),
}


@pytest.mark.parametrize("name", sorted(SECOND_LINES))
def test_the_second_line_says_what_it_is(name):
    from jupyter_autograd.widget.widget import _diagnosis_dict, static_html

    path = shared_scenario(name)
    sc = runner.load(str(path))
    _, _, trace = runner.execute(sc.source, sc.path, captured=True, options=sc.options)
    kind, label = SECOND_LINES[name]
    d = next(d for d in trace.diagnoses if d.kind == kind)
    assert d.saved_line and (not sc.saved or d.saved_line in sc.saved)
    where = "%s, line %d: %s" % (path.name, d.saved_line, d.saved_source)
    report = trace.report()
    assert re.search(r"\n   %s: +%s\n" % (re.escape(label), re.escape(where)), report), report
    if label != "saved":
        assert "saved: " not in report, report
    assert _diagnosis_dict(trace, d)["saved_label"] == label
    assert "%s: %s, line %d: <code>" % (label, path.name, d.saved_line) in static_html(trace)


# -- a name is said once -------------------------------------------------------------------------

class _Cell(torch.nn.Module):
    """A recurrent cell that keeps its state on itself and writes it in place after saving it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        self.h1 = torch.sigmoid(self.lin(x))
        self.h1.mul_(2)
        return self.h1


def _unroll(steps):
    cell = _Cell()
    x = torch.randn(2, 3)
    for _ in range(steps):
        x = cell(x)
    x.sum().backward()


def test_a_write_in_a_cell_called_in_a_loop_names_its_tensor_once():
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with ja.capture() as trace:
            _unroll(5)
    (d,) = trace.diagnoses
    assert d.tensor == "self.h1" and d.kind == "saved-tensor-modified"
    assert "`self.h1`, `self.h1`" not in trace.report()
    assert "in 4 more runs of this line" in d.message, d.message
    assert d.also == ()  # no other tensor: the same one, made again by each call


def _two_layers():
    enc = torch.nn.Linear(4, 4)
    dec = torch.nn.Linear(4, 1)
    y = dec(torch.relu(enc(torch.randn(2, 4))))
    y.sum().backward()
    return enc, dec


def _layers_in_a_loop():
    layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    x = torch.randn(2, 4)
    for layer in layers:
        x = layer(x)
    x.sum().backward()
    return layers


def _leaf_names(trace):
    return [trace.tensor_label(n.variable) for n in trace.nodes.values() if n.variable is not None]


def test_two_layers_of_one_class_made_in_a_function_go_by_their_own_names():
    with ja.capture() as trace:
        enc, dec = _two_layers()
    assert sorted(_leaf_names(trace)) == ["dec.bias", "dec.weight", "enc.bias", "enc.weight"]
    # The oracle: each name is the parameter of the layer it says.
    by_name = {trace.tensors[n.variable].name: n.variable for n in trace.nodes.values() if n.variable is not None}
    assert trace.tensors[by_name["dec.weight"]].shape == tuple(dec.weight.shape) == (1, 4)


def test_layers_called_from_one_line_are_told_apart():
    with ja.capture() as trace:
        layers = _layers_in_a_loop()
    names = _leaf_names(trace)
    assert len(set(names)) == len(names) == 4, names
    summary = trace.summary()
    leaves = summary.split("Leaves that get .grad: ", 1)[1]
    assert len(set(leaves.rstrip(".\n").split(", "))) == 4, summary
