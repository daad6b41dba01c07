"""The outputs in a real browser (Chromium, Playwright) when things go wrong: a widget whose
analysis failed in part says so; in JupyterLab, "Run All" runs the cell after a failing
%%autograd cell of a fresh kernel."""
import pytest

from .test_browser import browser_type_launch_args  # noqa: F401  (Debian's Chromium)

pytestmark = pytest.mark.browser


def test_the_widget_says_its_analysis_is_incomplete(page, tmp_path, monkeypatch):
    import torch

    import jupyter_autograd as ja
    from jupyter_autograd.diagnose import registry
    from jupyter_autograd.widget import save_html

    def fails(trace, source):
        raise RuntimeError("injected fault in the NaN rule")

    monkeypatch.setattr(registry, "RULES", [rule._replace(find=fails) if rule.find.__name__ == "nan_gradient" else rule
                                            for rule in registry.RULES])
    x = torch.ones(3, requires_grad=True)
    with ja.capture() as trace:
        y = x.exp()
        y += 1
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(save_html(trace, tmp_path / "report.html").as_uri())
    page.wait_for_selector("body[data-ready='1'] .ja-root", timeout=30_000)
    root = page.locator(".ja-root")
    lost = root.locator(".ja-warnings")
    assert lost.is_visible()
    said = " ".join(lost.inner_text().split())
    assert said.startswith("The analysis is incomplete:") and "injected fault in the NaN rule" in said, said
    verdict = root.locator(".ja-diagnoses").inner_text()
    assert "No problems found." not in verdict  # never the all-clear next to a failed analysis
    assert root.locator(".ja-diagnosis").count() or "in what was analysed" in verdict, verdict
    assert not errors, errors


@pytest.fixture
def lab_with(tmp_path):
    """Start JupyterLab on a notebook of the given cells; yields the URL that opens it."""
    import json
    import os
    import secrets
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    import nbformat

    from .test_browser import _free_port

    started = []

    def start(cells):
        root = tmp_path / "root"
        root.mkdir()
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = cells
        nbformat.write(nb, root / "cells.ipynb")
        env = dict(os.environ)
        for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
            (tmp_path / name.lower()).mkdir()
            env[name] = str(tmp_path / name.lower())
        settings = tmp_path / "jupyter_config_dir" / "lab" / "user-settings" / "@jupyterlab"
        (settings / "apputils-extension").mkdir(parents=True)
        (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
        (settings / "notebook-extension").mkdir()
        (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
            json.dumps({"windowingMode": "none"}))  # every cell rendered, also off screen
        port, token = _free_port(), secrets.token_hex(16)
        log = open(tmp_path / "server.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--port=%d" % port, "--ServerApp.ip=127.0.0.1",
             "--ServerApp.port_retries=0", "--IdentityProvider.token=" + token, "--ServerApp.root_dir=" + str(root),
             "--ServerApp.allow_root=True", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started.append((proc, log))
        base = "http://127.0.0.1:%d" % port
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, "server exited: " + (tmp_path / "server.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(urllib.request.Request(base + "/api/status",
                                                              headers={"Authorization": "token " + token}), timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "server not up in 60 s: " + (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(0.25)
        return "%s/lab/tree/cells.ipynb?token=%s&reset" % (base, token)

    yield start
    for proc, log in started:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def test_run_all_runs_the_cell_after_the_first_failing_autograd_cell(lab_with, page):
    """JupyterLab's "Run All" on a fresh kernel: the first %%autograd cell fails (tagged
    raises-exception, so that "Run All" goes past it); its report shows and the next cell runs."""
    import nbformat

    from .test_browser import KERNEL_IDLE

    url = lab_with([
        nbformat.v4.new_code_cell("%load_ext jupyter_autograd"),
        nbformat.v4.new_code_cell("%%autograd\n" + "import torch\nx = torch.ones(2, requires_grad=True)\ny = x.exp()\n"
                                  "y += 1\ny.sum().backward()", metadata={"tags": ["raises-exception"]}),
        # Slow on purpose: the queued cell is still running when the failing one has replied.
        nbformat.v4.new_code_cell("import time\ntime.sleep(2)\nprint('the next cell ran')"),
    ])
    page.goto(url)
    page.wait_for_function(KERNEL_IDLE, timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # When a cell of "Run All" fails, JupyterLab marks every cell not yet replied to as idle, also those
    # the kernel has still to run: a cell's state says nothing then. Its reply sets its execution count
    # (an aborted request's reply has none, and the wait runs out).
    cells = page.locator(".jp-CodeCell")
    states = "() => window.jupyterapp.shell.currentWidget.content.widgets.map(" \
             "(c) => [c.model.executionCount, c.model.executionState, c.model.outputs.length])"
    try:
        page.wait_for_function("() => window.jupyterapp.shell.currentWidget.content.widgets"
                               ".every((c) => c.model.executionCount != null)", timeout=180_000)
    except Exception as error:
        raise AssertionError("cells not replied to: %s" % (page.evaluate(states),)) from error
    assert "RuntimeError" in cells.nth(1).locator(".jp-OutputArea").inner_text()
    cells.nth(1).locator(".ja-root .ja-diagnosis").first.wait_for(timeout=30_000)  # the report, drawn
    assert "the next cell ran" in cells.nth(2).locator(".jp-OutputArea").inner_text(), page.evaluate(states)
