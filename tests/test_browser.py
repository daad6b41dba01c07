"""The widget in a real browser: JupyterLab 4 and Notebook 7, driven by Playwright in Chromium.

A real server on 127.0.0.1 runs a notebook whose %%autograd cell breaks backward (and carries
an XSS payload in a string and a comment). The test checks that the widget renders, that the
diagnosis names the variable and the line, that a click on a node *in the SVG* updates the
details panel (a round trip through the kernel), that the timeline moves the highlighted
source line, and that nothing from the cell is interpreted as HTML. Screenshots go to
test-artifacts/.
"""
import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
XSS = "<img src=x onerror=alert(1)>"
BROKEN_CELL = """%%autograd
import torch
label = "<img src=x onerror=alert(1)>"  # <img src=x onerror=alert(1)>
x = torch.tensor([[1.0, 2.0]])
w1 = torch.tensor([[2.0], [1.0]], requires_grad=True)
w2 = torch.tensor([3.0], requires_grad=True)
d = torch.matmul(x, w1)
f = torch.matmul(d, w2)
d[:] = 1
f.backward()"""
CULPRIT_LINE = 9  # `d[:] = 1`, counting the %%autograd line as line 1
KNOWN_PAGE_ERRORS = ("Cannot read properties of undefined (reading 'schema')",)  # Notebook 7.6, not ours


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    assert os.path.exists(CHROMIUM), "Chromium is required for the browser tests: apt-get install -y chromium"
    return {**browser_type_launch_args, "executable_path": CHROMIUM,
            "args": ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync"]}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["lab", "notebook"])
def server(request, tmp_path):
    app = request.param
    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("%load_ext jupyter_autograd"),
                nbformat.v4.new_code_cell(BROKEN_CELL, metadata={"tags": ["raises-exception"]})]
    nbformat.write(nb, root / "demo.ipynb")
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        path = tmp_path / name.lower()
        path.mkdir()
        env[name] = str(path)
    settings = tmp_path / "jupyter_config_dir" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    port, token = _free_port(), secrets.token_hex(16)
    module, expose = ("jupyterlab", "--LabApp.expose_app_in_browser=True") if app == "lab" else (
        "notebook", "--JupyterNotebookApp.expose_app_in_browser=True")
    cmd = [sys.executable, "-m", module, "--no-browser", "--port=%d" % port, "--ServerApp.ip=127.0.0.1",
           "--ServerApp.port_retries=0", "--IdentityProvider.token=" + token, "--ServerApp.root_dir=" + str(root),
           "--ServerApp.allow_root=True", expose]
    if app == "lab":
        cmd += ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = "http://127.0.0.1:%d" % port
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, "server exited: " + (tmp_path / "server.log").read_text()[-3000:]
            try:
                req = urllib.request.Request(base + "/api/status", headers={"Authorization": "token " + token})
                urllib.request.urlopen(req, timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    raise AssertionError("server not up in 60 s: " + (tmp_path / "server.log").read_text()[-3000:])
                time.sleep(0.25)
        url = ("%s/lab/tree/demo.ipynb?token=%s&reset" if app == "lab" else "%s/notebooks/demo.ipynb?token=%s") % (
            base, token)
        yield app, url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def test_widget_in_a_real_browser(server, page):
    app, url = server
    started = time.time()
    errors, dialogs = [], []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
                           timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    widget = page.locator(".ja-root")
    widget.wait_for(timeout=90_000)

    # The diagnosis names the variable and the line.
    card = widget.locator(".ja-diagnosis").first
    card.wait_for()
    text = card.inner_text()
    assert "`d`" in text and "line %d" % CULPRIT_LINE in text and "d[:] = 1" in text, text
    assert widget.locator(".ja-src-highlight").count() == 2

    # A click on a node of the picture goes to the kernel and back into the details panel.
    details = widget.locator(".ja-details")
    accumulate = widget.locator('.ja-graph [id^="ja-fn-"]').first
    accumulate.click()
    page.wait_for_function("() => document.querySelector('.ja-details-title')"
                           " && document.querySelector('.ja-details-title').textContent === 'AccumulateGrad'",
                           timeout=30_000)
    assert "accumulates into" in details.inner_text()
    stale = widget.locator('.ja-graph [id^="ja-fn"]:not([id^="ja-fn-"])')
    for i in range(stale.count()):
        stale.nth(i).click()
        try:
            page.wait_for_function("() => document.querySelector('.ja-details').textContent.includes('STALE')",
                                   timeout=3_000)
            break
        except Exception:
            continue
    assert "STALE" in details.inner_text()
    assert widget.locator(".ja-graph .ja-selected").count() == 1

    # The timeline moves the highlighted source line.
    slider = widget.locator(".ja-slider")
    slider.fill("3")  # step 4: d = torch.matmul(x, w1), on line 7
    page.wait_for_function("() => document.querySelector('.ja-src-current')"
                           " && document.querySelector('.ja-src-current').dataset.line === '7'", timeout=30_000)
    slider.fill("5")  # step 6: d[:] = 1
    page.wait_for_function("() => document.querySelector('.ja-src-current')"
                           " && document.querySelector('.ja-src-current').dataset.line === '%d'" % CULPRIT_LINE,
                           timeout=30_000)
    assert "d v1" in widget.locator(".ja-step").inner_text()  # the version as it was after that step

    # Nothing from the cell is interpreted as HTML: the payload shows as text, no <img> appears.
    assert XSS in widget.locator(".ja-source").inner_text()
    assert page.locator(".ja-root img").count() == 0
    assert not dialogs, dialogs

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / ("page-%s.png" % app)))
    page.set_viewport_size({"width": 1400, "height": 2400})  # the whole widget, not a stitched scroll
    widget.scroll_into_view_if_needed()
    widget.screenshot(path=str(ARTIFACTS / ("widget-%s.png" % app)))
    unexpected = [e for e in errors if not any(k in e for k in KNOWN_PAGE_ERRORS)]
    assert not unexpected, unexpected
    print("browser test (%s): %.1f s" % (app, time.time() - started))
