"""The widget in a real browser: JupyterLab 4 and Notebook 7, driven by Playwright in Chromium.

A real server on 127.0.0.1 runs one notebook: a small %%autograd cell that breaks backward
(with an XSS payload in a string and a comment), the four notebooks of tests/notebook_cases.py
(GPT-2 tiny with the bug in a module of an earlier cell, a ResNet with an in-place ReLU, a
150-step loop with total_loss += loss, a carried RNN state) and a trace shown with
display_trace. For each of the four, the first screen at 1400x1000 (the widget scrolled to
the top of the notebook) must show the problem: its nodes inside the visible graph area, with
nothing over them, the culprit's cell and line in the source panel (In [N]), every label of
the graph at 11 px or more. The small cell is then clicked (a round trip through the kernel),
stepped through on the timeline, zoomed, panned, fitted and driven by keyboard; a module is
opened and closed; find reaches a parameter in a closed box and one the summary lists in a
folded loop; JupyterLab Dark's contrast; Notebook 7's output height; a reload without the
kernel shows the static picture. A saved HTML file is opened from disk without any server.

Screenshots go to test-artifacts/ only: the tests never write tracked files (the README's
pictures in docs/ are retaken by scripts/screenshot.py). A screenshot waits for what it is of:
the widgets' own ready marker (data-ready) and the kernel idle.
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

from . import notebook_cases

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
STATIC_CELL = """import torch
import jupyter_autograd as ja
from jupyter_autograd.widget import display_trace
v = torch.ones(2, requires_grad=True)
with ja.capture() as tr:
    e = v.exp()
    e += 1
display_trace(tr)"""
CASES = ["gpt2", "resnet", "loop", "rnn"]
KNOWN_PAGE_ERRORS = ("Cannot read properties of undefined (reading 'schema')",)  # Notebook 7.6, not ours


def notebook_cells():
    """The notebook's code cells, in order, and for each case the index of its widget among the
    widgets on the page and the number Jupyter gives its culprit's cell (In [N])."""
    cells = [(notebook_cases.LOAD, False), (BROKEN_CELL, True)]
    widgets, culprit_cell = ["small"], {}
    for case in CASES:
        first = len(cells)
        case_cells = notebook_cases.CASES[case][1:]
        for i, cell in enumerate(case_cells):
            cells.append((cell, i == len(case_cells) - 1 and notebook_cases.KINDS[case] != "accumulated-graph"))
        cell, _ = notebook_cases.CULPRIT[case]
        culprit_cell[case] = first + cell - 1  # In [N]: the N-th cell run, counted from 1
        widgets.append(case)
    cells.append((STATIC_CELL, False))
    widgets.append("static")
    return cells, widgets, culprit_cell


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
    nb.cells = [nbformat.v4.new_code_cell(cell, metadata={"tags": ["raises-exception"]} if raises else {})
                for cell, raises in notebook_cells()[0]]
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

# What the first screen shows of one widget scrolled to the top of the notebook: the graph
# pane's part inside the notebook's visible area, the overview map, every problem node (its box
# and what is on top of its middle), the smallest label drawn in sight (font size x zoom), the
# source panel's tab and marked lines.
FIRST_SCREEN_JS = """(root) => {
  let scroller = null;  // the notebook's scrolling panel: the outermost ancestor that scrolls
  for (let p = root.parentElement; p && p !== document.body; p = p.parentElement) {
    if (['auto', 'scroll'].includes(getComputedStyle(p).overflowY)) scroller = p;
  }
  const seen = scroller ? scroller.getBoundingClientRect() : { left: 0, top: 0, right: innerWidth, bottom: innerHeight };
  const clip = (r, c) => ({ left: Math.max(r.left, c.left, 0), top: Math.max(r.top, c.top, 0),
                            right: Math.min(r.right, c.right, innerWidth), bottom: Math.min(r.bottom, c.bottom, innerHeight) });
  const pane = root.querySelector('.ja-graph');
  const area = clip(pane.getBoundingClientRect(), seen);
  const mini = root.querySelector('.ja-minimap');
  const map = mini.style.display === 'none' ? null : mini.getBoundingClientRect().toJSON();
  const svg = root.querySelector('.ja-svg');
  const zoom = pane.clientWidth / svg.viewBox.baseVal.width;
  const problems = [...root.querySelectorAll('.ja-node.ja-problem')].map((g) => {
    const r = g.querySelector('rect').getBoundingClientRect();
    const hits = [[0.5, 0.5], [0.15, 0.3], [0.85, 0.7]].map(([fx, fy]) => {
      const hit = document.elementFromPoint(r.left + r.width * fx, r.top + r.height * fy);
      const owner = hit && hit.closest('[data-id]');
      return owner ? owner.dataset.id : (hit ? hit.tagName + '.' + hit.getAttribute('class') : null);
    });
    return { id: g.dataset.id, kind: [...g.classList].join(' '), rect: r.toJSON(), hits };
  });
  let smallest = 99, counted = 0;
  for (const t of svg.querySelectorAll('text')) {
    const r = t.getBoundingClientRect();
    if (!r.width || r.right < area.left || r.left > area.right || r.bottom < area.top || r.top > area.bottom) continue;
    if (getComputedStyle(t).display === 'none') continue;
    smallest = Math.min(smallest, parseFloat(getComputedStyle(t).fontSize) * zoom);
    counted += 1;
  }
  const tab = root.querySelector('.ja-source-tab.ja-active');
  const src = root.querySelector('.ja-source').getBoundingClientRect();
  const marked = [...root.querySelectorAll('.ja-src-highlight')].map((row) => {
    const r = row.getBoundingClientRect();
    return [Number(row.dataset.line), r.top >= Math.max(src.top, seen.top) - 1 && r.bottom <= Math.min(src.bottom, seen.bottom) + 1];
  });
  return { area, map, zoom, problems, smallest, counted, tab: tab ? tab.textContent : '', marked,
           ready: root.dataset.ready, scroller: scroller ? scroller.className : 'window' };
}"""


def inside(r, area):
    return r["left"] >= area["left"] - 0.5 and r["right"] <= area["right"] + 0.5 and \
        r["top"] >= area["top"] - 0.5 and r["bottom"] <= area["bottom"] + 0.5


def apart(r, other):
    return other is None or r["right"] <= other["left"] or other["right"] <= r["left"] or \
        r["bottom"] <= other["top"] or other["bottom"] <= r["top"]


def check_first_screen(page, root, case, cell, app):
    """The first screen of one case: see FIRST_SCREEN_JS. Leaves a screenshot in test-artifacts/."""
    root.evaluate("n => n.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    seen = root.evaluate(FIRST_SCREEN_JS)
    label = "%s (%s)" % (case, app)
    assert seen["ready"] == "1", label
    assert seen["problems"], "%s: no problem node drawn" % label
    for node in seen["problems"]:
        assert inside(node["rect"], seen["area"]), "%s: %s is outside the visible graph area %s (in %s): %s" % (
            label, node["id"], seen["area"], seen["scroller"], node["rect"])
        assert apart(node["rect"], seen["map"]), "%s: the overview map covers %s" % (label, node["id"])
        assert node["hits"] == [node["id"]] * 3, "%s: something lies over %s: %s" % (label, node["id"], node["hits"])
    assert seen["counted"] > 5 and seen["smallest"] >= 11 - 1e-6, "%s: labels at %.1f px" % (label, seen["smallest"])
    line = notebook_cases.CULPRIT[case][1]
    assert seen["tab"].startswith("In [%d]" % cell), "%s: the source panel shows %r" % (label, seen["tab"])
    assert [line, True] in seen["marked"], "%s: line %d of In [%d] is not marked in sight: %s" % (
        label, line, cell, seen["marked"])
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / ("first-screen-%s-%s.png" % (case, app))))
    return seen


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
    _, widgets, culprit_cell = notebook_cells()
    page.wait_for_function("(n) => document.querySelectorAll('.ja-root[data-ready=\"1\"]').length >= n",
                           arg=len(widgets), timeout=240_000)
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    roots = page.locator(".ja-root")
    by_name = {name: roots.nth(i) for i, name in enumerate(widgets)}
    small = by_name["small"]
    assert small.get_attribute("data-lm-suppress-shortcuts") is not None

    # -- the first screen of each notebook shows its problem ------------------------------------------
    first = {case: check_first_screen(page, by_name[case], case, culprit_cell[case], app) for case in CASES}

    # -- the small broken cell: diagnosis, clicks through the kernel, timeline -------------------
    small.evaluate("n => n.scrollIntoView({block: 'start'})")
    card = small.locator(".ja-diagnosis").first
    text = card.inner_text()
    assert "`d`" in text and "line %d" % CULPRIT_LINE in text and "d[:] = 1" in text, text
    assert small.locator(".ja-src-highlight").count() == 2
    assert small.locator('.ja-node[data-id^="op"]').count() == 1  # the write, drawn next to what it broke
    labels = small.locator(".ja-node").evaluate_all("ns => ns.map(n => n.querySelector('.ja-node-label').textContent)")
    assert "d" in labels and "d (saved v0)" in labels  # the node named d and the value it saved, told apart
    error = small.locator(".ja-error")
    assert error.evaluate("n => n.getBoundingClientRect().height") < 24 and "explained below" in error.inner_text()
    small.locator('.ja-node[data-id^="fn-"]').first.click()
    wait_text(page, "document.querySelector('.ja-root .ja-details-title')", "w")
    rows = small.locator(".ja-details").inner_text()
    assert "AccumulateGrad into .grad" in rows and "shape" in rows  # a parameter: the tensor, not its node
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
    # One slider over the whole timeline: with no step chosen its thumb waits at the problem's step.
    assert slider.input_value() == "5" and "The problem is at step 6" in small.locator(".ja-step").inner_text()
    slider.fill("3")  # step 4: d = torch.matmul(x, w1), on line 7
    page.wait_for_function("() => document.querySelector('.ja-src-current')"
                           " && document.querySelector('.ja-src-current').dataset.line === '7'", timeout=30_000)
    slider.fill("5")  # step 6: d[:] = 1
    page.wait_for_function("() => document.querySelector('.ja-src-current')"
                           " && document.querySelector('.ja-src-current').dataset.line === '%d'" % CULPRIT_LINE,
                           timeout=30_000)
    assert "d v1" in small.locator(".ja-step").inner_text()
    assert small.locator(".ja-title").evaluate("n => n.getBoundingClientRect().height") < 24  # one line
    # The fix wraps between words; its code line is whole.
    fix = small.locator(".ja-diag-fix")
    assert fix.locator(".ja-fix-code").first.evaluate("n => getComputedStyle(n).whiteSpace") == "pre"
    assert fix.locator(".ja-fix-text").first.evaluate("n => getComputedStyle(n).wordBreak") == "normal"
    ARTIFACTS.mkdir(exist_ok=True)
    small.screenshot(path=str(ARTIFACTS / ("widget-%s.png" % app)))

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

    # -- a ResNet: open and close a module, find a parameter in a closed box, Fit stays readable ----------
    big = by_name["resnet"]
    big.evaluate("n => n.scrollIntoView({block: 'start'})")
    assert big.locator(".ja-box.ja-open").count() >= 1  # the modules with the problem are open
    assert float(big.get_attribute("data-zoom")) >= 0.999  # 100%: labels at 12 px, sublabels at 11 px
    first_ms = float(big.get_attribute("data-first-render-ms"))
    closed = big.locator(".ja-box.ja-closed").first
    box_id = closed.get_attribute("data-id")
    count = big.locator("[data-id]").count()
    closed.click()
    widget_js = "document.querySelectorAll('.ja-root')[%d]" % widgets.index("resnet")
    page.wait_for_function("([id]) => %s.querySelector(`.ja-box.ja-open[data-id=\"${id}\"]`)" % widget_js,
                           arg=[box_id], timeout=10_000)
    opened = big.locator("[data-id]").count()
    open_ms = float(big.get_attribute("data-render-ms"))
    assert opened > count
    big.locator('.ja-box-title[data-id="%s"]' % box_id).click(position={"x": 20, "y": 8}, force=True)
    page.wait_for_function("([id]) => %s.querySelector(`.ja-box.ja-closed[data-id=\"${id}\"]`)" % widget_js,
                           arg=[box_id], timeout=10_000)
    close_ms = float(big.get_attribute("data-render-ms"))
    assert big.locator("[data-id]").count() == count
    find = big.locator(".ja-find")
    hidden = "model.backbone.encoder.stages.1.layers.0.shortcut.convolution.weight"
    find.fill(hidden)
    page.wait_for_function("() => %s.querySelector('.ja-found')" % widget_js, timeout=10_000)
    assert big.locator(".ja-found").get_attribute("data-id").startswith("fn-")
    assert "1/1" in big.locator(".ja-find-info").inner_text()
    big.locator(".ja-btn-fit").click()  # the whole graph down to half size, else the problem's part
    fitted = big.evaluate(FIRST_SCREEN_JS)
    assert float(big.get_attribute("data-zoom")) >= 0.5 and all(inside(n["rect"], fitted["area"]) for n in fitted["problems"])

    # -- the 150-step loop: find what the summary lists, the timeline by iteration -------------------------
    loop = by_name["loop"]
    loop.evaluate("n => n.scrollIntoView({block: 'start'})")
    assert "mlp.0.weight" in loop.locator(".ja-summary").text_content()  # the summary lists it: find must too
    loop.locator(".ja-find").fill("mlp.0.weight")
    loop_js = "document.querySelectorAll('.ja-root')[%d]" % widgets.index("loop")
    page.wait_for_function("() => %s.querySelector('.ja-found')" % loop_js, timeout=10_000)
    assert "not found" not in loop.locator(".ja-find-info").inner_text()
    assert loop.locator(".ja-iter-label").inner_text() == "iteration 150 of 150"
    # The thumb waits at the problem's step (total_loss += loss); the step before it is the optimizer's.
    at = int(loop.locator(".ja-slider").input_value())
    loop.locator(".ja-slider").fill(str(at - 1))
    page.wait_for_function("() => %s.querySelector('.ja-step .ja-chip')" % loop_js, timeout=30_000)
    step = loop.locator(".ja-step").inner_text()
    assert "opt.step()" in step and "6 parameters updated" in step and "tensor#" not in step, step

    # -- GPT-2 tiny ---------------------------------------------------------------------------------------
    gpt = by_name["gpt2"]
    assert gpt.locator('.ja-box[data-id="m:model.gpt"]').count() == 1
    gpt_ms = float(gpt.get_attribute("data-first-render-ms"))

    # -- Notebook 7 shows the failing model cell's widget and traceback at full height ----------------
    # (scrollHeight counts overflowing decorations too: compare with the outputs' own heights.)
    area = big.evaluate("n => { const a = n.closest('.jp-Cell-outputArea'); let sum = 0;"
                        " for (const c of a.querySelectorAll(':scope > .jp-OutputArea-child')) sum += c.offsetHeight;"
                        " return [sum, a.clientHeight, getComputedStyle(a).overflowY]; }")
    assert area[0] <= area[1] + 4 or area[2] == "visible", "the output area scrolls: %s" % (area,)
    assert area[0] > 800  # the widget and the traceback, both at full height

    # -- JupyterLab Dark: every text readable ----------------------------------------------------------
    if app == "lab":
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        page.wait_for_timeout(500)
        ratios = page.evaluate(CONTRAST_JS, [
            ["node", ".ja-kind-fn .ja-node-label", "fill", ".ja-kind-fn .ja-node-rect", "fill"],
            ["leaf", ".ja-kind-leaf .ja-node-label", "fill", ".ja-kind-leaf .ja-node-rect", "fill"],
            ["box", ".ja-box-label", "fill", ".ja-graph", "backgroundColor"],
            ["shape", ".ja-edge-label", "fill", ".ja-graph", "backgroundColor"],
            ["source", ".ja-src-current .ja-code", "color", ".ja-src-current", "backgroundColor"],
            ["highlight", ".ja-src-highlight .ja-code", "color", ".ja-src-highlight", "backgroundColor"],
            ["details", ".ja-details td", "color", ".ja-graph", "backgroundColor"],
            ["diagnosis", ".ja-diag-message", "color", ".ja-diagnosis", "backgroundColor"],
            ["legend", ".ja-legend-entry", "color", ".ja-graph", "backgroundColor"],
        ])
        assert all(v is not None and v >= 4.5 for v in ratios.values()), ratios
        assert page.evaluate("() => getComputedStyle(document.querySelector('.ja-graph')).backgroundColor") not in (
            "rgb(255, 255, 255)",)
        small.evaluate("n => n.scrollIntoView({block: 'start'})")
        small.screenshot(path=str(ARTIFACTS / "widget-dark.png"))
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")

    # Nothing from the cells is interpreted as HTML.
    assert XSS in small.locator(".ja-source").inner_text()
    assert page.locator(".ja-root img").count() == 0
    assert not dialogs, dialogs

    unexpected = [e for e in errors if not any(k in e for k in KNOWN_PAGE_ERRORS)]
    assert not unexpected, unexpected
    print("browser test (%s): %.1f s; ResNet view: first render %.0f ms, open %.0f ms, close %.0f ms; "
          "GPT-2 first render %.0f ms; smallest label on the first screens: %s" % (
              app, time.time() - started, first_ms, open_ms, close_ms, gpt_ms,
              ", ".join("%s %.1f px" % (c, first[c]["smallest"]) for c in CASES)))

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
    flagged = {"name": "model.1", "norms": [1e-12], "flags": ["vanishing"], "ratio": 1e-12, "parameters": []}
    trace.diagnoses  # built first: the build fills the trace's fields, and would drop the stand-in below
    trace.grad_stats = lambda: {"steps": [], "parameters": [], "modules": [flagged], "thresholds": {}}
    path = save_html(trace, tmp_path / "report.html")
    del trace.grad_stats
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1'] .ja-root [data-id]", timeout=30_000)
    root = page.locator(".ja-root")
    assert "A tensor saved for backward was modified in place" in root.locator(".ja-diagnosis").inner_text()
    root.locator(".ja-find").fill("model.0.weight")  # in a closed box: find opens it
    page.wait_for_selector('.ja-found[data-id^="fn-"]', timeout=5_000)
    root.locator(".ja-found").click()
    page.wait_for_function("() => document.querySelector('.ja-details-title').textContent === 'model.0.weight'")
    assert "AccumulateGrad into .grad" in root.locator(".ja-details").inner_text()
    # The legend says what the graph draws; shapes ride on edges; the flagged module's bar is red.
    legend = root.locator(".ja-legend").inner_text()
    assert "parameter (gets .grad)" in legend and "gradient health" in legend
    assert root.locator(".ja-edge-label").count() > 0
    bar = root.locator('.ja-box[data-id="m:model.1"] .ja-health-flagged, .ja-box-title[data-id="m:model.1"] .ja-health-flagged')
    assert bar.count() == 1 and "vanishing" in bar.locator("title").text_content()
    # An open box's title stays in sight when the box's left edge is panned out of view.
    title = root.locator('.ja-box-title[data-id="m:model.1"]')
    left = float(root.locator('.ja-box.ja-open[data-id="m:model.1"] .ja-box-rect').get_attribute("x"))
    root.locator(".ja-graph").click(position={"x": 3, "y": 3})
    for _ in range(20):
        if float(root.locator("svg.ja-svg").get_attribute("viewBox").split()[0]) > left + 30:
            break
        page.keyboard.press("ArrowRight")
    view_x = float(root.locator("svg.ja-svg").get_attribute("viewBox").split()[0])
    assert view_x > left + 30 and float(title.locator(".ja-box-label").get_attribute("x")) >= view_x
    root.locator(".ja-find").fill("loss")
    page.wait_for_selector(".ja-found", timeout=5_000)
    root.locator(".ja-slider").fill("1")
    page.wait_for_selector(".ja-src-current", timeout=5_000)
    assert page.locator("img").count() == 0
    assert all(u.startswith(("file:", "blob:", "data:")) for u in requests), requests
    assert not errors, errors
