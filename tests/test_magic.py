"""%%autograd in a real InteractiveShell."""
import os
import re
import signal
import threading

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from jupyter_autograd import Trace

BROKEN = """import torch
x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
y = x.exp()
y += 1
y.sum().backward()
"""


def state():
    return torch._C._len_torch_function_stack(), torch.is_grad_enabled(), torch.is_anomaly_enabled()


class Shown:
    def __init__(self, cap):
        texts = [o.data.get("text/plain", "") for o in cap.outputs]
        self.stdout = cap.stdout + "\n".join(texts) + cap.stderr
        self.outputs = cap.outputs


def run(shell, cell):
    with capture_output() as cap:
        result = shell.run_cell(cell)
    return result, Shown(cap)


def test_user_exception_passes_through_unchanged(shell):
    shell.user_ns["err"] = ValueError("the user's own")
    before = state()
    result, cap = run(shell, "%%autograd --text\nimport torch\nt = torch.ones(2) * 2\nraise err")
    assert result.error_in_exec is shell.user_ns["err"]
    assert "ValueError: the user's own" in cap.stdout
    assert state() == before
    assert shell.user_ns["t"].tolist() == [2.0, 2.0]


def test_pytorch_error_is_the_same_as_without_the_magic(shell):
    plain, _ = run(shell, BROKEN)
    result, cap = run(shell, "%%autograd --text -o tr\n" + BROKEN)
    assert type(result.error_in_exec) is type(plain.error_in_exec)
    assert str(result.error_in_exec) == str(plain.error_in_exec)
    assert "jupyter_autograd/capture/" not in cap.stdout  # no frame of ours in the traceback
    tr = shell.user_ns["tr"]
    (d,) = tr.diagnoses
    # Line numbers are the notebook cell's: the magic is line 1, `y += 1` is line 5.
    assert (d.kind, d.tensor, d.line, d.saved_line, d.source) == ("saved-tensor-modified", "y", 5, 4, "y += 1")
    assert "y = y + 1" in cap.stdout and "saved at 0, now 1" in cap.stdout
    # Each line with the cell Jupyter shows it in.
    assert re.search(r"culprit: In \[\d+\], line 5: y \+= 1\n", cap.stdout), cap.stdout


def test_output_flag_stores_the_trace(shell):
    result, _ = run(shell, "%%autograd -q -o my_trace\nimport torch\na = torch.ones(2, requires_grad=True)\nb = (a * a).sum()")
    assert result.success
    assert isinstance(shell.user_ns["my_trace"], Trace)
    assert shell.user_ns["my_trace"].nodes


def test_last_expression_is_still_the_result(shell):
    result, _ = run(shell, "%%autograd -q\nimport torch\nv = torch.arange(3.0)\nv.sum().item() + 1")
    assert result.result == 4.0
    assert shell.user_ns["_"] == 4.0


# -- cells with nothing to show: one line, not the widget (issue 31) ----------------------------------

NOTHING_TO_SHOW = {  # the cell's body -> the one line %%autograd shows for it
    "words = ['no', 'tensors']\nlen(words)":
        "jupyter-autograd: no tensor operation ran: nothing to check.",
    "import torch\nt = torch.ones(3) * 2\nt.sum()":
        "jupyter-autograd: 3 tensor operations, no autograd graph (no input that requires grad, or grad mode off): "
        "nothing to check.",
    "x = 1\nprint(undefined_name)":
        "jupyter-autograd: the cell raised NameError before any tensor operation ran: nothing to check.",
    "import torch\nw = torch.ones(2, requires_grad=True)\nloss = (w * 3).sum()\nprint(undefined_name)":
        "jupyter-autograd: no autograd problem found; the cell raised NameError (3 tensor operations, "
        "3 graph nodes recorded).",
}


@pytest.mark.parametrize("flags", ["", "--text"])
@pytest.mark.parametrize("body", NOTHING_TO_SHOW, ids=["no tensors", "no graph", "NameError first",
                                                       "NameError after a graph"])
def test_a_cell_with_nothing_to_show_gets_one_line(shell, body, flags):
    result, cap = run(shell, ("%%autograd " + flags).strip() + "\n" + body)
    (output,) = cap.outputs  # no widget, no picture: one output
    assert output.data == {"text/plain": NOTHING_TO_SHOW[body]}
    assert "no problems found" not in cap.stdout.lower()
    if "undefined_name" in body:
        assert isinstance(result.error_in_exec, NameError)
        # The traceback reads as without the magic: no line 1 `'%%autograd'` in it.
        assert "%%autograd" not in cap.stdout and re.search(r"----> \d+ print\(undefined_name\)", cap.stdout)
    else:
        assert result.success


def test_a_cell_with_nothing_to_show_says_where_its_trace_is(shell):
    _, cap = run(shell, "%%autograd -o tr\nx = 1")
    (output,) = cap.outputs
    assert output.data["text/plain"] == "jupyter-autograd: no tensor operation ran: nothing to check; `tr` keeps the trace."
    assert isinstance(shell.user_ns["tr"], Trace)
    _, cap = run(shell, "%%autograd -q\nx = 1\nprint(undefined_name)")
    assert cap.outputs == []  # -q: nothing unless a problem


def test_a_graph_without_problems_still_gets_the_widget(shell):
    result, cap = run(shell, "%%autograd\nimport torch\nw = torch.ones(2, requires_grad=True)\n(w * 2).sum().backward()")
    assert result.success
    assert any("application/vnd.jupyter.widget-view+json" in o.data for o in cap.outputs)


def test_the_kept_trace_shows_the_cell_as_typed(shell):
    run(shell, "%%autograd -q -o tr\nimport torch\nw = torch.ones(2, requires_grad=True)\n(w * 2).sum().backward()")
    tr = shell.user_ns["tr"]
    (lines,) = [lines for name, lines in tr.sources.items() if tr.source_names.get(name, "").startswith("In [")]
    assert lines[0] == "%%autograd -q -o tr\n" and lines[1] == "import torch\n"


# -- a terminal: no view, the text report, after the traceback ----------------------------------------

@pytest.fixture
def terminal(shell):
    """The shell as IPython's terminal sets it up: text/plain is the only format it shows."""
    shell.display_formatter.active_types = ["text/plain"]
    return shell


def test_a_terminal_gets_the_text_report_not_a_view(terminal):
    result, cap = run(terminal, "%%autograd\n" + BROKEN)
    assert isinstance(result.error_in_exec, RuntimeError)
    assert "interactive view" not in cap.stdout
    assert not any("application/vnd.jupyter.widget-view+json" in o.data for o in cap.outputs)
    (output,) = cap.outputs
    report = output.data["text/plain"]
    assert report.startswith("jupyter-autograd: 1 problem found") and "y = y + 1" in report
    assert report.endswith("(a terminal shows the text report; in Jupyter the same cell draws the graph, and "
                           "`%%autograd -o tr` then `tr.save_html('report.html')` writes it to a file)")


@pytest.mark.parametrize("flags", ["", "--text"])
def test_a_text_report_of_a_cell_that_raised_comes_after_its_traceback(terminal, flags):
    with capture_output(display=False) as cap:  # the display printed to stdout too: all in the order read
        terminal.run_cell(("%%autograd " + flags).strip() + "\n" + BROKEN, store_history=True)
    out = cap.stdout
    assert out.index("Traceback (most recent call last)") < out.index("RuntimeError: one of the variables") \
        < out.index("jupyter-autograd: 1 problem found"), out


def test_a_text_report_of_a_cell_that_did_not_raise_comes_before_its_result(shell):
    with capture_output(display=False) as cap:
        shell.run_cell("%%autograd --text\nimport torch\nw = torch.ones(2, requires_grad=True)\n"
                       "y = w.exp()\ny += 1\n42", store_history=True)
    assert cap.stdout.index("jupyter-autograd: 1 problem found") < cap.stdout.index("Out["), cap.stdout


def test_a_cell_run_outside_a_shell_cell_shows_its_report_at_once(shell):
    """run_cell_magic called by code, with no cell around it (no post_run_cell to wait for)."""
    with capture_output(display=False) as cap:
        with pytest.raises(RuntimeError):
            shell.run_cell_magic("autograd", "--text", BROKEN)
    assert "jupyter-autograd: 1 problem found" in cap.stdout


def test_help_and_question_mark(shell):
    _, cap = run(shell, "%%autograd -h\n1")
    assert "-o NAME" in cap.stdout and "Run the cell exactly as usual" in cap.stdout
    _, cap = run(shell, "%%autograd?")
    assert "Run the cell exactly as usual" in cap.stdout
    # A cell magic's usage has two %: the line `%autograd -o NAME` does not exist.
    for shown in (run(shell, "%%autograd -h\n1")[1].stdout, cap.stdout):
        assert re.search(r"(?<!%)%autograd\b", shown) is None, shown
        assert "%%autograd [-o NAME] [-q] [--text] [--nan]" in shown, shown


def test_unknown_flag_is_a_usage_error(shell):
    result, cap = run(shell, "%%autograd --bogus\n1")
    assert isinstance(result.error_in_exec, UsageError)
    assert "unrecognized arguments: --bogus" in cap.stdout
    assert "Traceback" not in cap.stdout
    result, _ = run(shell, "%%autograd -o 3x\n1")
    assert isinstance(result.error_in_exec, UsageError)


def test_state_restored_after_an_exception(shell):
    before = state()
    result, _ = run(shell, "%%autograd --text\nimport torch\nw = torch.ones(2, requires_grad=True)\nw.add_(1)")
    assert isinstance(result.error_in_exec, RuntimeError)
    assert state() == before
    apply = torch.autograd.function.Function.__dict__["apply"]  # a classmethod before torch 2.14, not after
    assert getattr(apply, "__func__", apply).__name__ == "apply"


def test_keyboard_interrupt_stops_the_cell(shell):
    before = state()
    # A real SIGINT while the cell is busy, as the Jupyter kernel sends on "interrupt".
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result, _ = run(shell, "%%autograd -q\nimport torch, time\nfor i in range(200):\n"
                               "    torch.ones(4) * i\n    time.sleep(0.05)\nfinished = True")
    finally:
        timer.cancel()
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "finished" not in shell.user_ns
    assert state() == before


def test_ipython_syntax_inside_the_cell(shell):
    result, _ = run(shell, "%%autograd -q\nimport torch\nn = %env HOME\nz = torch.zeros(1)")
    assert result.success and shell.user_ns["n"] == os.environ["HOME"]


def test_display_failure_degrades_to_a_warning(shell, monkeypatch):
    import jupyter_autograd.render.text as text

    monkeypatch.setattr(text, "text_report", lambda trace: 1 / 0)
    with pytest.warns(RuntimeWarning, match="could not display"):
        result, _ = run(shell, "%%autograd --text\nimport torch\nq = torch.ones(1, requires_grad=True) + 1\nq.item()")
    assert result.result == 2.0


def test_load_twice_and_unload(shell):
    shell.run_line_magic("load_ext", "jupyter_autograd")
    shell.run_line_magic("reload_ext", "jupyter_autograd")
    assert "autograd" in shell.magics_manager.magics["cell"]
    shell.run_line_magic("unload_ext", "jupyter_autograd")
    assert "autograd" not in shell.magics_manager.magics["cell"]
    shell.run_line_magic("load_ext", "jupyter_autograd")


def test_our_warning_never_replaces_the_users_exception(shell, monkeypatch):
    import warnings

    import jupyter_autograd.render.text as text

    monkeypatch.setattr(text, "text_report", lambda trace: 1 / 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a user who turned every warning into an error
        result, cap = run(shell, "%%autograd --text\nimport torch\nx = torch.ones(2, requires_grad=True)\n"
                                 "y = x.exp()\ny += 1\nraise KeyError('mine')")
    assert isinstance(result.error_in_exec, KeyError)
    assert "could not display" in cap.stdout


def test_default_display_is_the_widget_with_static_fallbacks(shell):
    result, cap = run(shell, "%%autograd\n" + BROKEN)
    assert isinstance(result.error_in_exec, RuntimeError)
    static, widget = cap.outputs  # the picture that stands in wherever the widget cannot live, then the widget
    assert {"text/html", "image/png", "text/plain"} <= set(static.data)
    assert "application/vnd.jupyter.widget-view+json" in widget.data
    assert "y = y + 1" in static.data["text/plain"]


def test_quiet_shows_nothing_when_all_is_well(shell):
    result, cap = run(shell, "%%autograd -q\nimport torch\nk = torch.ones(2, requires_grad=True)\n(k * 2).sum().backward()")
    assert result.success and cap.outputs == []


def test_cells_are_named_as_jupyter_names_them(shell):
    """A culprit inside a function defined in an earlier cell is placed in that cell, by the name
    Jupyter shows for it (`In [1]`), not by the hashed file IPython compiled it under."""
    shell.run_cell("import torch\n\ndef step(x, w):\n    h = torch.sigmoid(x @ w)\n    h.mul_(2)\n    return h.sum()\n",
                   store_history=True)
    defined_in = shell.execution_count - 1
    result, _ = run(shell, "%%autograd -q -o tr\nw = torch.ones(2, 2, requires_grad=True)\n"
                           "loss = step(torch.ones(1, 2), w)\nloss.backward()")
    (d,) = shell.user_ns["tr"].diagnoses
    tr = shell.user_ns["tr"]
    assert d.kind == "saved-tensor-modified" and d.line == 5
    assert tr.file_label(d.filename) == "In [%d]" % defined_in
    assert tr.place(d.filename, d.line) == "In [%d], line 5" % defined_in
    from jupyter_autograd.session import file_namers
    shell.run_line_magic("unload_ext", "jupyter_autograd")
    assert not [n for n in file_namers if getattr(n, "shell", None) is shell]
    shell.run_line_magic("load_ext", "jupyter_autograd")
