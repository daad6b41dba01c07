"""trace.show() where there is no Jupyter: a script or a terminal, and a marimo notebook."""
import os
import subprocess
import sys
import textwrap

from .conftest import ROOT

BLOCK = """\
import torch
import jupyter_autograd as ja

with ja.capture() as trace:
    a = torch.ones(3, requires_grad=True)
    y = a.exp()
    y += 1
trace.show()
"""

TITLE = "A tensor saved for backward was modified in place (`y`)"


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT))


def test_outside_ipython_show_prints_the_text_report(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BLOCK)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("jupyter-autograd: 1 problem found\n"), out[:500]
    assert "1. [saved-tensor-modified] " + TITLE in out and "culprit: train.py, line 7: y += 1" in out
    assert "image/png" not in out and "text/html" not in out and "AutogradWidget" not in out, out[:500]


def test_in_marimo_show_gives_the_static_report_then_the_widget(tmp_path):
    notebook = tmp_path / "notebook.py"
    notebook.write_text("import marimo\n\napp = marimo.App()\n\n\n@app.cell\ndef _():\n"
                        + textwrap.indent(BLOCK, "    ") + "    return\n")
    out = tmp_path / "notebook.html"
    proc = subprocess.run([sys.executable, "-m", "marimo", "export", "html", str(notebook), "-o", str(out)],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The cell's outputs are JSON in the page, with `<` and `>` written as \u003C and \u003E.
    page = out.read_text().replace("\\u003C", "<").replace("\\u003E", ">")
    static = page.find('<div class=\\"ja-static\\"')
    widget = page.find("<marimo-anywidget")
    assert static >= 0, "the static report is not HTML in the marimo output"
    assert widget > static, "no widget after the static report in the marimo output"
    assert "jupyter-autograd: 1 problem found" in page[static:widget] and TITLE in page[static:widget]
    # Not a raw mimebundle (marimo shows one with a picker, and carries the PNG and the text along).
    assert "marimo-mime-renderer" not in page and "image/png" not in page
