"""The widget in a real browser: JupyterLab 4 and Notebook 7, driven by Playwright in Chromium.

A real server on 127.0.0.1 runs a notebook with four cells: a small %%autograd cell that breaks
backward (with an XSS payload in a string and a comment), a ResNet-style model whose blocks
break backward, GPT-2 tiny (transformers), and a trace shown with display_trace. The test
checks the diagnosis, clicks on SVG nodes (a round trip through the kernel), the timeline,
zoom, pan, fit, the keyboard, opening and closing a module, find, JupyterLab Dark's contrast,
Notebook 7's output height, and that a reload without the kernel shows the static picture.
A saved HTML file is opened from disk without any server. Screenshots go to test-artifacts/
(and the focused view of the model to docs/).
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
MODEL_CELL = """%%autograd
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = torch.sigmoid(self.bn2(self.conv2(out)))
        out += x  # sigmoid saved its output: backward breaks here
        return self.relu(out)

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      *[Block(16) for _ in range(6)], nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
loss = nn.functional.cross_entropy(model(x), y)
loss.backward()"""
MODEL_CULPRIT_LINE = 17
GPT2_CELL = """%%autograd
import torch
import transformers
transformers.utils.logging.set_verbosity_error()
torch.manual_seed(0)
gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100,
                                                           n_positions=32, bos_token_id=0, eos_token_id=0))
ids = torch.randint(0, 100, (2, 16))
gpt(ids, labels=ids).loss.backward()"""
STATIC_CELL = """import torch
import jupyter_autograd as ja
from jupyter_autograd.widget import display_trace
v = torch.ones(2, requires_grad=True)
with ja.capture() as tr:
    e = v.exp()
    e += 1
display_trace(tr)"""
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
                nbformat.v4.new_code_cell(BROKEN_CELL, metadata={"tags": ["raises-exception"]}),
                nbformat.v4.new_code_cell(MODEL_CELL, metadata={"tags": ["raises-exception"]}),
                nbformat.v4.new_code_cell(GPT2_CELL),
                nbformat.v4.new_code_cell(STATIC_CELL)]
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
    # Every cell rendered, also off screen (the default skips them: their text reads empty).
    notebook_settings = settings.parent / "notebook-extension"
    notebook_settings.mkdir()
    (notebook_settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
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


KERNEL_IDLE = ("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
               " && window.jupyterapp.shell.currentWidget.sessionContext"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'")
DOCS = ROOT / "docs"


def view_box(widget):
    return [float(v) for v in widget.locator("svg.ja-svg").get_attribute("viewBox").split()]


def wait_text(page, selector_js, text, timeout=30_000):
    page.wait_for_function("([t]) => { const n = %s; return n && n.textContent.includes(t); }" % selector_js,
                           arg=[text], timeout=timeout)


CONTRAST_JS = """(pairs) => {
  function rgba(s) { const m = s.match(/[\\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; }
  function lum([r, g, b]) {
    const c = [r, g, b].map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  }
  function over(top, base) { const a = top[3]; return [0, 1, 2].map((i) => top[i] * a + base[i] * (1 - a)); }
  function ratio(a, b) { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); }
  const page = rgba(getComputedStyle(document.querySelector('.ja-graph')).backgroundColor);
  const out = {};
  for (const [name, textSel, textProp, bgSel, bgProp] of pairs) {
    const t = document.querySelector(textSel), b = document.querySelector(bgSel);
    if (!t || !b) { out[name] = null; continue; }
    const fg = rgba(getComputedStyle(t)[textProp]);
    const bg = over(rgba(getComputedStyle(b)[bgProp]), page);
    out[name] = ratio(over(fg, bg), bg);
  }
  return out;
}"""


def test_widget_in_a_real_browser(server, page):
    app, url = server
    started = time.time()
    errors, dialogs = [], []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_function(KERNEL_IDLE, timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    roots = page.locator(".ja-root")
    page.wait_for_function("() => document.querySelectorAll('.ja-root').length >= 4", timeout=180_000)
    small, big, gpt, shown = roots.nth(0), roots.nth(1), roots.nth(2), roots.nth(3)
    assert small.get_attribute("data-lm-suppress-shortcuts") is not None

    # -- the small broken cell: diagnosis, clicks through the kernel, timeline -------------------
    card = small.locator(".ja-diagnosis").first
    text = card.inner_text()
    assert "`d`" in text and "line %d" % CULPRIT_LINE in text and "d[:] = 1" in text, text
    assert small.locator(".ja-src-highlight").count() == 2
    assert small.locator('.ja-node[data-id^="op"]').count() == 1  # the write, drawn next to what it broke
    small.locator('.ja-node[data-id^="fn-"]').first.click()
    wait_text(page, "document.querySelector('.ja-root .ja-details-title')", "AccumulateGrad")
    assert "accumulates into" in small.locator(".ja-details").inner_text()
    stale = small.locator('.ja-node.ja-problem[data-id^="fn"]:not([data-id^="fn-"])')
    for i in range(stale.count()):
        stale.nth(i).click()
        try:
            wait_text(page, "document.querySelector('.ja-root .ja-details')", "STALE", timeout=3_000)
            break
        except Exception:
            continue
    assert "STALE" in small.locator(".ja-details").inner_text()
    assert small.locator(".ja-graph .ja-selected").count() == 1
    details = small.locator(".ja-details")
    assert details.evaluate("n => n.scrollWidth <= n.clientWidth + 1"), "the details table is cut off"
    slider = small.locator(".ja-slider")
    assert slider.input_value() == "-1"  # no step selected: the thumb sits before the first step
    slider.fill("3")  # step 4: d = torch.matmul(x, w1), on line 7
    page.wait_for_function("() => document.querySelector('.ja-src-current')"
                           " && document.querySelector('.ja-src-current').dataset.line === '7'", timeout=30_000)
    slider.fill("5")  # step 6: d[:] = 1
    page.wait_for_function("() => document.querySelector('.ja-src-current')"
                           " && document.querySelector('.ja-src-current').dataset.line === '%d'" % CULPRIT_LINE,
                           timeout=30_000)
    assert "d v1" in small.locator(".ja-step").inner_text()
    assert small.locator(".ja-title").evaluate("n => n.getBoundingClientRect().height") < 24  # one line
    if app == "lab":
        DOCS.mkdir(exist_ok=True)
        small.screenshot(path=str(DOCS / "widget.png"))

    # -- zoom, pan, fit, keyboard -----------------------------------------------------------------
    pane = small.locator(".ja-graph")
    before = view_box(small)
    small.locator(".ja-btn-in").click()
    zoomed = view_box(small)
    assert zoomed[2] < before[2] * 0.9 and zoomed[3] < before[3] * 0.9
    box = pane.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + 120, box["y"] + box["height"] / 2 + 40, steps=5)
    page.mouse.up()
    panned = view_box(small)
    assert panned[0] < zoomed[0] - 50 and panned[1] < zoomed[1] - 10
    small.locator(".ja-btn-fit").click()
    fitted = view_box(small)
    assert fitted[0] <= 0 and fitted[1] <= 0  # the whole graph is inside the view
    pane.click(position={"x": 5, "y": 5})  # focus the pane (on empty space)
    active = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.activeCellIndex")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    assert view_box(small)[1] > fitted[1]  # the arrow keys pan the graph...
    assert page.evaluate("() => window.jupyterapp.shell.currentWidget.content.activeCellIndex") == active  # ...only

    # -- a real model, focused on its problem -------------------------------------------------------
    text = big.locator(".ja-diagnosis").first.inner_text()
    assert "line %d" % MODEL_CULPRIT_LINE in text and "out += x" in text, text
    write = big.locator('.ja-node[data-id^="op"]')
    assert write.count() >= 1 and write.first.is_visible()
    assert big.locator(".ja-box.ja-open").count() >= 1  # the block with the problem is open
    assert float(big.get_attribute("data-zoom")) >= 0.999  # 100%: labels at 12 px, sublabels at 11 px
    first_ms = float(big.get_attribute("data-first-render-ms"))
    if app == "lab":
        DOCS.mkdir(exist_ok=True)
        big.locator(".ja-main").screenshot(path=str(DOCS / "view-focused.png"))
    # Open a closed module box and close it again, in the browser only.
    closed = big.locator(".ja-box.ja-closed").first
    box_id = closed.get_attribute("data-id")
    count = big.locator("[data-id]").count()
    closed.click()
    page.wait_for_function("([id]) => document.querySelectorAll('.ja-root')[1]"
                           ".querySelector(`.ja-box.ja-open[data-id=\"${id}\"]`)", arg=[box_id], timeout=10_000)
    opened = big.locator("[data-id]").count()
    open_ms = float(big.get_attribute("data-render-ms"))
    assert opened > count
    header = big.locator('.ja-box.ja-open[data-id="%s"] .ja-box-header' % box_id)
    header.click(position={"x": 20, "y": 8}, force=True)  # its label lies on top; the click reaches the box
    page.wait_for_function("([id]) => document.querySelectorAll('.ja-root')[1]"
                           ".querySelector(`.ja-box.ja-closed[data-id=\"${id}\"]`)", arg=[box_id], timeout=10_000)
    close_ms = float(big.get_attribute("data-render-ms"))
    assert big.locator("[data-id]").count() == count
    # Find a parameter hidden in a closed box: its boxes open and it is marked.
    find = big.locator(".ja-find")
    find.fill("model.7.conv2.weight")
    page.wait_for_function("() => document.querySelectorAll('.ja-root')[1].querySelector('.ja-found')", timeout=10_000)
    assert big.locator(".ja-found").get_attribute("data-id").startswith("fn-")
    assert "1/1" in big.locator(".ja-find-info").inner_text()
    find.fill("model.4")
    page.wait_for_function("() => { const f = document.querySelectorAll('.ja-root')[1].querySelector('.ja-found');"
                           " return f && f.dataset.id === 'm:model.4'; }", timeout=10_000)

    # -- GPT-2 tiny -----------------------------------------------------------------------------------
    assert gpt.locator('.ja-box[data-id="m:model.transformer"], .ja-box[data-id="m:gpt.transformer"]').count() == 1
    gpt_ms = float(gpt.get_attribute("data-first-render-ms"))

    # -- Notebook 7 shows the failing model cell's widget and traceback at full height ----------------
    # (scrollHeight counts overflowing decorations too: compare with the outputs' own heights.)
    area = big.evaluate("n => { const a = n.closest('.jp-Cell-outputArea'); let sum = 0;"
                        " for (const c of a.querySelectorAll(':scope > .jp-OutputArea-child')) sum += c.offsetHeight;"
                        " return [sum, a.clientHeight, getComputedStyle(a).overflowY]; }")
    assert area[0] <= area[1] + 4 or area[2] == "visible", "the output area scrolls: %s" % (area,)
    assert area[0] > 1000  # the widget and the traceback, both at full height

    # -- JupyterLab Dark: every text readable ----------------------------------------------------------
    if app == "lab":
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        page.wait_for_timeout(500)
        ratios = page.evaluate(CONTRAST_JS, [
            ["node", ".ja-kind-fn .ja-node-label", "fill", ".ja-kind-fn .ja-node-rect", "fill"],
            ["leaf", ".ja-kind-leaf .ja-node-label", "fill", ".ja-kind-leaf .ja-node-rect", "fill"],
            ["box", ".ja-box-label", "fill", ".ja-graph", "backgroundColor"],
            ["source", ".ja-src-current .ja-code", "color", ".ja-src-current", "backgroundColor"],
            ["highlight", ".ja-src-highlight .ja-code", "color", ".ja-src-highlight", "backgroundColor"],
            ["details", ".ja-details td", "color", ".ja-graph", "backgroundColor"],
            ["diagnosis", ".ja-diag-message", "color", ".ja-diagnosis", "backgroundColor"],
        ])
        assert all(v is not None and v >= 4.5 for v in ratios.values()), ratios
        assert page.evaluate("() => getComputedStyle(document.querySelector('.ja-graph')).backgroundColor") not in (
            "rgb(255, 255, 255)",)
        small.screenshot(path=str(ARTIFACTS / "widget-dark.png")) if ARTIFACTS.mkdir(exist_ok=True) is None else None
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")

    # Nothing from the cells is interpreted as HTML.
    assert XSS in small.locator(".ja-source").inner_text()
    assert page.locator(".ja-root img").count() == 0
    assert not dialogs, dialogs

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / ("page-%s.png" % app)))
    unexpected = [e for e in errors if not any(k in e for k in KNOWN_PAGE_ERRORS)]
    assert not unexpected, unexpected
    print("browser test (%s): %.1f s; model view: first render %.0f ms, open %.0f ms, close %.0f ms; "
          "GPT-2 tiny first render %.0f ms" % (app, time.time() - started, first_ms, open_ms, close_ms, gpt_ms))

    # -- saved, kernel shut down, reloaded: the static picture stands in for the widget ------------------
    assert page.locator(".ja-static").first.is_hidden()  # hidden while the widget lives
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.shutdown()")
    page.wait_for_timeout(1000)
    page.reload()
    page.wait_for_selector(".ja-static", state="attached", timeout=90_000)
    static_cells = page.locator(".jp-CodeCell", has=page.locator(".ja-static"))
    # The widget manager gives up on the missing model and says so: that message must not show,
    # under any cell (every %%autograd cell and display_trace output has its static picture).
    static_cells.first.get_by_text("model not found").first.wait_for(state="attached", timeout=60_000)
    for i in range(static_cells.count()):
        cell = static_cells.nth(i)
        messages = cell.get_by_text("model not found")
        assert all(messages.nth(j).is_hidden() for j in range(messages.count()))
        assert cell.locator(".ja-static").first.is_visible()
    static_cell = static_cells.filter(has_text="A tensor saved for backward was modified in place").first
    assert static_cell.locator(".ja-static svg").count() == 1
    static_cell.screenshot(path=str(ARTIFACTS / ("reloaded-%s.png" % app)))


def test_saved_html_works_from_disk_without_a_server(page, tmp_path):
    import torch
    from torch import nn

    import jupyter_autograd as ja
    from jupyter_autograd.widget import save_html

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8), nn.Sigmoid()), nn.Linear(8, 2))
    with ja.capture(namespace={"model": model}) as trace:
        h = model[0](torch.randn(3, 4))
        s = model[1](h)
        s += 1  # "<img src=x onerror=alert(1)>"
        loss = model[2](s).sum()
    path = save_html(trace, tmp_path / "report.html")
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1'] .ja-root [data-id]", timeout=30_000)
    root = page.locator(".ja-root")
    assert "A tensor saved for backward was modified in place" in root.locator(".ja-diagnosis").inner_text()
    root.locator('.ja-node[data-id^="fn-"]').first.click()
    page.wait_for_function("() => document.querySelector('.ja-details-title').textContent.length > 0")
    assert "accumulates into" in root.locator(".ja-details").inner_text()
    root.locator(".ja-find").fill("loss")
    page.wait_for_selector(".ja-found", timeout=5_000)
    root.locator(".ja-slider").fill("1")
    page.wait_for_selector(".ja-src-current", timeout=5_000)
    assert page.locator("img").count() == 0
    assert all(u.startswith(("file:", "blob:", "data:")) for u in requests), requests
    assert not errors, errors
