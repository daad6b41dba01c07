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


def test_cell_without_tensors(shell):
    result, cap = run(shell, "%%autograd --text\nwords = ['no', 'tensors']\nlen(words)")
    assert result.success and result.result == 2
    assert "no problems found" in cap.stdout and "0 operations recorded" in cap.stdout


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
        result, _ = run(shell, "%%autograd --text\nimport torch\nq = torch.ones(1) + 1\nq.item()")
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
        result, cap = run(shell, "%%autograd --text\nraise KeyError('mine')")
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
