"""Every output of the tool stays right when the input is odd (issue 21, output side): flags
IPython cannot read, names Python reads otherwise than typed, names no picture can hold, a disk
that fills up, an empty cell. Each output says so when the analysis is incomplete, and an
interrupt during the report never turns a finished cell into an interrupted one."""
import html
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings
import xml.etree.ElementTree as ElementTree

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import jupyter_autograd as ja
from jupyter_autograd.render import draw, layout
from jupyter_autograd.widget import save_html, static_bundle

from .conftest import ROOT


def run(shell, cell):
    with capture_output() as cap:
        result = shell.run_cell(cell)
    return result, cap


def broken_trace(name):
    """A saved tensor modified in place, the tensor known by `name` (any string: a dict's key)."""
    namespace = {}
    x = torch.ones(3, requires_grad=True)
    with ja.capture(namespace=[namespace]) as trace:
        namespace[name] = x.exp()
        namespace[name] += 1
    assert trace.diagnoses and trace.diagnoses[0].tensor == name
    return trace


def png_texts(draw_it, monkeypatch):
    """Every string drawn in the PNGs that `draw_it()` makes."""
    from matplotlib.figure import Figure

    figures, savefig = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: (figures.append(self),
                                                                        savefig(self, *args, **kwargs))[1])
    draw_it()
    monkeypatch.setattr(Figure, "savefig", savefig)
    return [text.get_text() for figure in figures for axes in figure.axes for text in axes.texts]


def drawn_texts(scene, title, monkeypatch):
    """Every string the PNG draws, and every text of the SVG (which must parse as XML)."""
    png = png_texts(lambda: draw.to_png(scene, opened=list(scene.boxes), title=title), monkeypatch)
    svg = ElementTree.fromstring(draw.to_svg(scene, opened=list(scene.boxes), title=title))
    return png, ["".join(node.itertext()) for node in svg.iter("{http://www.w3.org/2000/svg}text")]


# -- flags and cells IPython would refuse ----------------------------------------------------------

def test_a_flag_with_an_unclosed_quote_is_a_usage_error(shell):
    result, cap = run(shell, "%%autograd -o 'abc\nimport torch\nx = torch.ones(2)\n")
    error = result.error_before_exec or result.error_in_exec
    assert isinstance(error, UsageError) and "quotation" in str(error)
    assert "magic.py" not in cap.stdout + cap.stderr and "Traceback" not in cap.stdout + cap.stderr
    assert "x" not in shell.user_ns  # as for any bad flag: the cell does not run


def test_the_trace_is_stored_under_the_name_python_reads(shell):
    """Python reads identifiers in NFKC: `ｘｙ` typed in the cell is the variable `xy`."""
    result, _ = run(shell, "%%autograd -q -o ｘｙ\nimport torch\nx = torch.ones(2, requires_grad=True) * 2\n")
    assert result.success
    assert isinstance(shell.user_ns.get("xy"), ja.Trace) and "ｘｙ" not in shell.user_ns
    result, _ = run(shell, "ｘｙ is xy")
    assert result.result is True


@pytest.mark.parametrize("cell", ["%%autograd\n", "%%autograd", "%%autograd -q\n   \n\n"])
def test_an_empty_cell_is_a_usage_error_as_for_ipythons_own_cell_magics(shell, cell):
    result, _ = run(shell, cell)
    error = result.error_before_exec or result.error_in_exec
    assert isinstance(error, UsageError), error
    assert "%%autograd is a cell magic, but the cell body is empty" in str(error)
    reference, _ = run(shell, "%%capture\n")  # IPython's own words for its own cell magics
    assert str(reference.error_before_exec or reference.error_in_exec).startswith(
        "%%capture is a cell magic, but the cell body is empty")


# -- names no picture can hold as they are ---------------------------------------------------------

def test_a_huge_name_is_clipped_wherever_it_is_drawn(monkeypatch):
    name = "v" * 100_000
    trace = broken_trace(name)
    scene = layout.build_scene(trace)
    png, svg = drawn_texts(scene, trace.diagnoses[0].title, monkeypatch)
    assert any(text.startswith("vvvv") for text in png) and any("vvvv" in text for text in svg)
    assert max(map(len, png + svg)) <= 200
    widget_labels = [row[2] for row in scene.to_json()["items"]] + [row[3] for row in scene.to_json()["items"]]
    assert max(map(len, widget_labels)) <= 200
    bundle = static_bundle(trace)  # the title drawn in the PNG is the diagnosis's, clipped too
    svg_in_html = re.search(r"<svg.*?</svg>", bundle["text/html"], re.S).group(0)
    assert max(map(len, re.findall(r">([^<]*)<", svg_in_html))) <= 200


@pytest.mark.parametrize("name", ["a\x1bb", "nul\x00here", "bell\x07\x7f", "c1\x80\x9f", "lone\ud800half", "損失"])
def test_control_characters_in_a_name_never_reach_a_picture(name, monkeypatch):
    trace = broken_trace(name)
    scene = layout.build_scene(trace)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph 27 missing from font" printed under the cell
        png, svg = drawn_texts(scene, trace.diagnoses[0].title, monkeypatch)
        bundle = static_bundle(trace)
    assert "image/png" in bundle
    drawn = png + svg + [row[2] for row in scene.to_json()["items"]]
    assert all(text.isprintable() for text in drawn), [t for t in drawn if not t.isprintable()]
    shown = repr(name)[1:-1]  # what it is, written as Python writes it
    assert any(shown[:8] in text for text in png) and any(shown[:8] in text for text in svg)
    svg_in_html = re.search(r"<svg.*?</svg>", bundle["text/html"], re.S).group(0)
    ElementTree.fromstring(svg_in_html)  # well-formed XML


# -- files --------------------------------------------------------------------------------------------

def test_save_html_on_a_full_disk_keeps_the_previous_file(tmp_path):
    """A real write failure (the file size limit, as a full disk fails a write): the file that
    was there stays whole, and no partial file is left beside it."""
    report = tmp_path / "report.html"
    report.write_text("the previous report")
    script = textwrap.dedent("""
        import resource, signal, sys
        import torch
        import jupyter_autograd as ja
        from jupyter_autograd.widget import save_html

        x = torch.ones(3, requires_grad=True)
        with ja.capture() as trace:
            y = x.exp()
            y += 1
        trace.diagnoses
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            save_html(trace, sys.argv[1])
        except OSError as exc:
            print("raised", exc.errno)
        """)
    proc = subprocess.run([sys.executable, "-c", script, str(report)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "raised 27", proc.stdout + proc.stderr  # EFBIG, said to the caller
    assert report.read_text() == "the previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_save_html_replaces_the_file_whole_and_keeps_the_usual_permissions(tmp_path):
    trace = broken_trace("y")
    report = tmp_path / "report.html"
    report.write_text("the previous report")
    save_html(trace, report)
    text = report.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    umask = os.umask(0)
    os.umask(umask)
    fresh = tmp_path / "fresh.html"
    save_html(trace, fresh)
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.html", "report.html"]


# -- an analysis that failed in part says so in every output ---------------------------------------

BROKEN_CELL = "import torch\nx = torch.ones(3, requires_grad=True)\ny = x.exp()\ny += 1\n"


@pytest.fixture
def a_rule_fails(monkeypatch):
    """A fault in one part of the analysis: the NaN rule raises."""
    from jupyter_autograd.diagnose import registry

    def fails(trace, source):
        raise RuntimeError("injected fault in the NaN rule")

    monkeypatch.setattr(registry, "RULES", [rule._replace(find=fails) if rule.find.__name__ == "nan_gradient" else rule
                                            for rule in registry.RULES])


def html_text(page):
    """What a reader of the HTML sees (the SVG's labels and the styles left out)."""
    page = re.sub(r"<(svg|style)\b.*?</\1>", "", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def says_incomplete(text, warnings_said):
    """The output says the analysis is incomplete and what was lost, and never a bare "no problems
    found" (only "no problems found in what was analysed")."""
    lowered = " ".join(text.split()).lower()
    return ("the analysis is incomplete" in lowered and all(w.lower() in lowered for w in warnings_said)
            and not re.search(r"no problems found(?! in what was analysed)", lowered))


def test_every_output_says_the_analysis_is_incomplete(a_rule_fails, monkeypatch, tmp_path):
    from jupyter_autograd.widget import AutogradWidget

    x = torch.ones(3, requires_grad=True)
    with ja.capture() as trace:
        y = x.exp()
        y += 1
    assert trace.warnings and any("injected fault" in w for w in trace.warnings)
    lost = [" ".join(w.split()) for w in trace.warnings]
    assert says_incomplete(trace.report(), lost), trace.report()
    bundles = []
    png = png_texts(lambda: bundles.append(static_bundle(trace)), monkeypatch)
    assert "image/png" in bundles[0] and any("the analysis is incomplete" in text for text in png), png
    assert says_incomplete(bundles[0]["text/plain"], lost), bundles[0]["text/plain"]
    assert says_incomplete(html_text(bundles[0]["text/html"]), lost), bundles[0]["text/html"]
    widget = AutogradWidget(trace)  # widget.js draws them (tests/test_browser_robust.py)
    assert [" ".join(w.split()) for w in widget.warnings] == lost
    saved = save_html(trace, tmp_path / "report.html").read_text()
    assert says_incomplete(html_text(saved.split('<script type="application/json"')[0]), lost)


def test_the_magic_says_it_in_every_mode(shell, a_rule_fails):
    for flags in ("--text", "", "-q"):
        result, cap = run(shell, "%%autograd " + flags + "\n" + BROKEN_CELL)
        assert result.success
        shown = cap.stdout + "\n".join(o.data.get("text/plain", "") + o.data.get("text/html", "")
                                       for o in cap.outputs)
        words = " ".join(shown.split())  # the text report wraps its lines
        assert "the analysis is incomplete" in words and "injected fault in the NaN rule" in words, (flags, shown)
        assert not re.search(r"no problems found(?! in what was analysed)", shown.lower()), (flags, shown)


def test_the_pytest_plugin_says_it(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.fixture(autouse=True)
        def a_rule_fails(monkeypatch):
            from jupyter_autograd.diagnose import registry

            def fails(trace, source):
                raise RuntimeError("injected fault in the NaN rule")

            monkeypatch.setattr(registry, "RULES", [rule._replace(find=fails) if rule.find.__name__ == "nan_gradient"
                                                    else rule for rule in registry.RULES])
        """))
    (tmp_path / "test_step.py").write_text(textwrap.dedent("""
        import torch

        def test_silent_corruption():
            a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
            out = a.sigmoid()
            out.data.zero_()
            out.sum().backward()
        """))
    installed = any(ep.value == "jupyter_autograd.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    load = [] if installed else ["-p", "jupyter_autograd.pytest_plugin"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *load, "-rA", "--autograd"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    text = " ".join(proc.stdout.split())
    assert "the analysis is incomplete" in text and "injected fault in the NaN rule" in text, proc.stdout


# -- an interrupt during the report --------------------------------------------------------------

REPORT_STAGES = [  # (module, function): the report's own work, in the order it runs
    ("jupyter_autograd.diagnose", "diagnose"),      # the trace is built when the report first reads it
    ("jupyter_autograd.render.layout", "build_scene"),
    ("jupyter_autograd.render.draw", "to_png"),
    ("jupyter_autograd.widget.widget", "static_html"),
]


@pytest.fixture
def interrupts_for_the_cell_only():
    """SIGINT raises KeyboardInterrupt only while a cell runs: one that came late never stops pytest."""
    import signal

    in_cell = [False]

    def handler(signum, frame):
        if in_cell[0]:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield in_cell
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted_in(monkeypatch, module, function):
    """When `function` is called, a real SIGINT from another thread, as Jupyter's interrupt button
    sends; the call waits for it to land."""
    import importlib
    import signal
    import threading

    target = importlib.import_module(module)
    original = getattr(target, function)
    reached = threading.Event()

    def press():
        if reached.wait(60):
            os.kill(os.getpid(), signal.SIGINT)

    def running(*args, **kwargs):
        reached.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the interrupt lands here, as the stage starts
            time.sleep(0.001)
        return original(*args, **kwargs)

    monkeypatch.setattr(target, function, running)
    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    return presser


@pytest.mark.parametrize("flags, module, function",
                         [("", module, function) for module, function in REPORT_STAGES]
                         + [("--text -o kept", "jupyter_autograd.diagnose", "diagnose")],
                         ids=[f for _, f in REPORT_STAGES] + ["text-diagnose"])
def test_an_interrupt_during_the_report_leaves_the_finished_cell_finished(
        shell, monkeypatch, interrupts_for_the_cell_only, flags, module, function):
    shell.run_cell("import torch")
    presser = interrupted_in(monkeypatch, module, function)
    interrupts_for_the_cell_only[0] = True
    try:
        result, cap = run(shell, ("%%autograd " + flags).strip() + "\nx = torch.ones(3, requires_grad=True)\n"
                                  "y = x.exp()\ny += 1\nfinished = True\ny.detach() * 2\n")
    finally:
        interrupts_for_the_cell_only[0] = False
    presser.join(5)
    assert not presser.is_alive(), "the report never reached %s" % function
    shown = cap.stdout + cap.stderr
    assert result.error_in_exec is None and result.success, shown
    assert shell.user_ns["finished"] is True
    assert torch.equal(result.result, shell.user_ns["y"].detach() * 2) and "Out[" in shown  # its value, shown
    assert "KeyboardInterrupt" not in shown and "Traceback" not in shown and "magic.py" not in shown, shown
    said = shown + "\n".join(o.data.get("text/plain", "") for o in cap.outputs)
    assert "report was interrupted" in said, said
    assert shell.magics_manager.registry["AutogradMagics"]._value is None  # nothing of the cell kept


def test_the_widget_watch_is_installed_once_and_removed_with_the_extension(shell):
    from jupyter_autograd import widget

    def watchers():
        return [callback for callback in shell.events.callbacks["pre_run_cell"]
                if type(getattr(callback, "__self__", None)).__name__ == "_WidgetsOfCells"]

    assert len(watchers()) == 1 and len(widget.made) == 1
    shell.run_line_magic("reload_ext", "jupyter_autograd")
    assert len(watchers()) == 1 and len(widget.made) == 1
    shell.run_line_magic("unload_ext", "jupyter_autograd")
    assert watchers() == [] and widget.made == []
    shell.run_line_magic("load_ext", "jupyter_autograd")  # as the fixture expects to find it
