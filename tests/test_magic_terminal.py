"""%%autograd in terminal IPython, in a real pseudo-terminal (issue 31): a terminal has no view, so it
gets the text report and is told so; the report of a cell that raised comes after the traceback,
not above 40 lines of torch frames; a cell with nothing to show gets one line; the traceback has no
`1 '%%autograd'` line."""
import os
import re
import sys

import pytest

from .conftest import ROOT

pexpect = pytest.importorskip("pexpect")

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]|\r")

BROKEN = ["import torch", "x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)", "y = x.exp()", "y += 1",
          "y.sum().backward()"]


class Terminal:
    """`ipython` in a pty, typed into as a person types: a cell magic's cell ends with two Enters."""

    def __init__(self, tmp_path):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   IPYTHONDIR=str(tmp_path / "ipython"), TERM="xterm")
        self.child = pexpect.spawn(sys.executable, [
            "-m", "IPython", "--no-banner", "--colors=nocolor", "--HistoryManager.hist_file=:memory:",
            "--TerminalInteractiveShell.term_title=False", "--TerminalInteractiveShell.autoindent=False",
            "--TerminalInteractiveShell.confirm_exit=False"], env=env, encoding="utf-8", timeout=180,
            dimensions=(50, 200))
        self.count = 1
        self.child.expect(r"In \[1\]:")

    def run(self, *lines):
        """Type a cell; what the terminal shows until the next prompt, without its escape codes."""
        for line in lines:
            self.child.sendline(line)
        if lines[0].startswith("%%"):
            self.child.sendline("")
            self.child.sendline("")
        self.count += 1
        self.child.expect(r"In \[%d\]:" % self.count)
        return ESCAPES.sub("", self.child.before)

    def close(self):
        self.child.sendline("exit")
        self.child.expect(pexpect.EOF)


@pytest.fixture(scope="module")
def terminal(tmp_path_factory):
    term = Terminal(tmp_path_factory.mktemp("terminal"))
    try:
        out = term.run("%load_ext jupyter_autograd")
        assert "Error" not in out, out
        yield term
    finally:
        term.child.close(force=True)


def test_a_terminal_gets_the_text_report_after_the_traceback(terminal):
    out = terminal.run("%%autograd", *BROKEN)
    assert "interactive view" not in out, out
    error = out.index("RuntimeError: one of the variables needed for gradient computation")
    report = out.index("jupyter-autograd: 1 problem found")
    assert error < report, out
    assert "culprit: In [2], line 5: y += 1" in out[report:]
    # The last words before the next prompt: what a terminal has, and how to get the view.
    assert out.rstrip().endswith("`%%autograd -o tr` then `tr.save_html('report.html')` writes it to a file)"), out
    assert "(a terminal shows the text report;" in out[report:]


def test_text_flag_puts_the_report_after_the_traceback(terminal):
    out = terminal.run("%%autograd --text", *BROKEN)
    assert out.index("RuntimeError: one of the variables") < out.index("jupyter-autograd: 1 problem found"), out
    assert "a terminal shows" not in out  # asked for text: no word about a view
    assert out.rstrip().endswith("Leaves that get .grad: x."), out


def test_a_cell_that_raised_a_name_error_gets_one_line_after_its_traceback(terminal):
    out = terminal.run("%%autograd", "x = 1", "print(undefined_name)")
    tail = out[out.index("NameError: name 'undefined_name' is not defined"):]
    assert tail.strip().splitlines()[-1] == (
        "jupyter-autograd: the cell raised NameError before any tensor operation ran: nothing to check."), out
    assert "----> 3 print(undefined_name)" in out
    assert "'%%autograd'" not in out and "%%autograd\n" not in out.split("Traceback", 1)[1]
    assert "No problems found" not in out and "no problems found" not in out


def test_a_report_of_a_cell_that_did_not_raise_comes_before_its_result(terminal):
    out = terminal.run("%%autograd", "import torch", "w = torch.ones(2, requires_grad=True)", "h = w.exp()",
                       "h += 1", "41 + 1")
    assert out.index("jupyter-autograd: 1 problem found") < out.index("(a terminal shows the text report") \
        < out.index("Out[") < out.index("42"), out


def test_trace_show_and_a_trace_as_a_cells_value_say_what_a_terminal_has(terminal):
    """trace.show() and a Trace as a cell's value in a terminal: the text report and the magic's
    words about the view, not a line about an "interactive view" the terminal never shows."""
    terminal.run("%%autograd -q -o kept", "import torch", "w = torch.ones(2, requires_grad=True)",
                 "h = w.exp()", "h += 1")
    for typed in ("kept.show()", "kept"):
        out = terminal.run(typed)
        assert "interactive view" not in out, out
        assert "jupyter-autograd: 1 problem found" in out and "culprit: In [" in out, out
        assert out.rstrip().endswith("(a terminal shows the text report; in Jupyter the same cell draws the graph, "
                                     "and `trace.save_html('report.html')` writes it to a file)"), out
        assert out.count("1 problem found") == 1, out
