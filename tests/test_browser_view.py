"""The graph view on real models, in JupyterLab at 1400x1000 (Chromium, Playwright): a GAN (D and
G in one cell, an in-place write after a save) and a ResNet-like model with residual blocks (three
steps that keep their graphs), both with gradient-health badges on their module boxes
(tests/view_cases.py).

For each, on the first screen and after Fit:
- one geometry: every node's and box's x, y, w, h as the widget drew them (read from the SVG)
  are those Python's `layout.place` computes for the same open boxes (asked of the kernel), and the
  view starts where `layout.first_view` says for the pane's size;
- every node in sight is clickable: what lies at its centre is that node, not a module's title;
- nothing is cut off at the pane's edges (a node is wholly inside the pane or wholly outside);
- the problem's nodes and the fix are on the first screen, off the overview map; the fix's optional
  ways (allow_mutation_on_saved_tensors) folded;
- the source panel shows whole lines; the timeline's slider and its iteration agree.
"""
import json

import pytest

from . import view_cases
from .test_browser import ARTIFACTS, KERNEL_IDLE, browser_type_launch_args  # noqa: F401  (Debian's Chromium)
from .test_browser_robust import lab_with  # noqa: F401  (a JupyterLab server on one notebook)

pytestmark = pytest.mark.browser

# The first cell keeps every widget made, so that the test can ask Python about what it drew.
REGISTER = """%load_ext jupyter_autograd
import json as _json
import jupyter_autograd.widget.widget as _ja_widget
from jupyter_autograd.render import layout as _layout
SHOWN = []
_ja_widget.made.append(SHOWN.append)


def _scene_of(i):
    return SHOWN[i].view_scene()


def _placed(i, opened):
    scene = _scene_of(i)
    _layout.lay_out(scene, opened)
    p = _layout.place(scene, opened)
    print(_json.dumps({q.id: [q.x, q.y, q.w, q.h] for q in p.placed}))


def _first_view(i, width, height):
    scene = _scene_of(i)
    print(_json.dumps(_layout.first_view(scene, scene.open, width, height)))"""
ORDER = ["gan", "resnet"]
_FIT_MIN_ZOOM = 0.5  # layout.FIT_MIN_ZOOM: Fit shows the problem's neighbourhood where the whole needs less

# Ask the kernel: run code, return what it printed (or the error it raised).
KERNEL_RUN = """async (code) => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const future = kernel.requestExecute({ code, store_history: false });
  let text = '';
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === 'stream') text += msg.content.text;
    if (msg.header.msg_type === 'error') text += 'ERROR ' + msg.content.ename + ': ' + msg.content.evalue;
  };
  await future.done;
  return text;
}"""

# What the widget drew: each node's and box's rectangle in graph units (the SVG's attributes), the
# open boxes, the viewBox and the pane's size.
DRAWN_JS = """(root) => {
  const rect = (r) => ['x', 'y', 'width', 'height'].map((a) => parseFloat(r.getAttribute(a)));
  const out = { nodes: {}, boxes: {}, open: [] };
  for (const g of root.querySelectorAll('.ja-svg .ja-node')) out.nodes[g.dataset.id] = rect(g.querySelector('.ja-node-rect'));
  for (const g of root.querySelectorAll('.ja-svg .ja-box')) {
    out.boxes[g.dataset.id] = rect(g.querySelector('.ja-box-rect'));
    if (g.classList.contains('ja-open')) out.open.push(g.dataset.id);
  }
  const pane = root.querySelector('.ja-graph');
  out.viewBox = root.querySelector('svg.ja-svg').getAttribute('viewBox').split(' ').map(Number);
  out.pane = [pane.clientWidth, pane.clientHeight];
  return out;
}"""

# On screen: the visible part of the graph pane (inside the notebook's scrolling panel and the
# window), the overview map, and for every node and closed box its box on screen and what lies
# at its centre and near its corners; the fix of the selected card.
SCREEN_JS = """(root) => {
  let scroller = null;
  for (let p = root.parentElement; p && p !== document.body; p = p.parentElement) {
    if (['auto', 'scroll'].includes(getComputedStyle(p).overflowY)) scroller = p;
  }
  const seen = scroller ? scroller.getBoundingClientRect() : { left: 0, top: 0, right: innerWidth, bottom: innerHeight };
  const clip = (r, c) => ({ left: Math.max(r.left, c.left, 0), top: Math.max(r.top, c.top, 0),
                            right: Math.min(r.right, c.right, innerWidth), bottom: Math.min(r.bottom, c.bottom, innerHeight) });
  const pane = root.querySelector('.ja-graph');
  const outer = pane.getBoundingClientRect();  // the graph's area: inside the pane's border
  const paneRect = { left: outer.left + pane.clientLeft, top: outer.top + pane.clientTop,
                     right: outer.left + pane.clientLeft + pane.clientWidth, bottom: outer.top + pane.clientTop + pane.clientHeight };
  const area = clip(paneRect, seen);
  const mini = root.querySelector('.ja-minimap');
  const map = getComputedStyle(mini).display === 'none' ? null : mini.getBoundingClientRect().toJSON();
  const things = [];
  const solid = [...root.querySelectorAll('.ja-svg .ja-node')].map((g) => [g, g.querySelector('.ja-node-rect')])
    .concat([...root.querySelectorAll('.ja-svg .ja-box.ja-closed')].map((g) => [g, g.querySelector('.ja-box-rect')]));
  for (const [g, rect] of solid) {
    const r = rect.getBoundingClientRect();
    const hits = [];
    if (r.left >= area.left && r.right <= area.right && r.top >= area.top && r.bottom <= area.bottom) {
      for (const [fx, fy] of [[0.5, 0.5], [0.1, 0.2], [0.9, 0.8]]) {
        const hit = document.elementFromPoint(r.left + r.width * fx, r.top + r.height * fy);
        const owner = hit && hit.closest('[data-id]');
        hits.push(owner ? owner.dataset.id + (owner.classList.contains('ja-box-title') ? ' (title)' : '')
                        : (hit ? hit.tagName + '.' + hit.getAttribute('class') : null));
      }
    }
    things.push({ id: g.dataset.id, problem: g.classList.contains('ja-problem'), rect: r.toJSON(), hits });
  }
  const fix = root.querySelector('.ja-diagnosis.ja-active .ja-diag-fix');
  const card = root.querySelector('.ja-diagnosis.ja-active');
  return { area, pane: paneRect, map, things, seen: seen.toJSON ? seen.toJSON() : seen,
           fix: fix ? fix.getBoundingClientRect().toJSON() : null, card: card ? card.getBoundingClientRect().toJSON() : null,
           window: [innerWidth, innerHeight], zoom: Number(root.dataset.zoom) };
}"""

# The closed module box holding the most nodes (its sublabel ends in "N nodes"): in the ResNet its
# residual blocks (`layers`), then one of them.
LARGEST_CLOSED_JS = """(root) => {
  let best = null, most = -1;
  for (const g of root.querySelectorAll('.ja-svg .ja-box.ja-closed.ja-box-module')) {
    const m = (g.querySelector('.ja-box-sub').textContent.match(/(\\d+) nodes$/) || [0, 0])[1];
    if (Number(m) > most) { most = Number(m); best = g.dataset.id; }
  }
  return best;
}"""

SOURCE_JS = """(root) => {
  const src = root.querySelector('.ja-source');
  const rows = [...src.querySelectorAll('.ja-src-line')];
  const wide = rows.filter((row) => { const c = row.querySelector('.ja-code'); return c && c.getBoundingClientRect().right > src.getBoundingClientRect().right + 1; });
  return { overflowing: src.scrollWidth > src.clientWidth + 1, cut: wide.map((r) => Number(r.dataset.line)),
           width: src.clientWidth };
}"""

TIMELINE_JS = """(root) => {
  const slider = root.querySelector('.ja-slider');
  return { value: Number(slider.value), min: Number(slider.min), max: Number(slider.max),
           label: root.querySelector('.ja-iter-label').textContent,
           step: root.querySelector('.ja-step').textContent };
}"""


def inside(r, area, slack=0.5):
    return r["left"] >= area["left"] - slack and r["right"] <= area["right"] + slack and \
        r["top"] >= area["top"] - slack and r["bottom"] <= area["bottom"] + slack


def meets(r, area, slack=0.5):
    return r["left"] < area["right"] - slack and area["left"] < r["right"] - slack and \
        r["top"] < area["bottom"] - slack and area["top"] < r["bottom"] - slack


def apart(r, other):
    return other is None or not meets(r, other)


def kernel(page, code):
    out = page.evaluate(KERNEL_RUN, code)
    assert not out.startswith("ERROR"), out
    return json.loads(out)


def view_cases_fix(page, index):
    """The whole fix of the widget's first diagnosis, as Python wrote it."""
    return kernel(page, "print(_json.dumps(SHOWN[%d].diagnoses[0]['fix']))" % index)


def same_placement(page, root, index, label):
    """The widget drew what Python placed, for the boxes the widget has open."""
    drawn = root.evaluate(DRAWN_JS)
    python = kernel(page, "_placed(%d, %s)" % (index, json.dumps(drawn["open"])))
    shown = {**drawn["nodes"], **drawn["boxes"]}
    assert set(shown) == set(python), "%s: drawn %s, placed %s" % (
        label, sorted(set(shown) - set(python))[:5], sorted(set(python) - set(shown))[:5])
    wrong = {i: (shown[i], python[i]) for i in shown if any(abs(a - b) > 0.51 for a, b in zip(shown[i], python[i]))}
    assert not wrong, "%s: drawn != placed for %d of %d: %s" % (label, len(wrong), len(shown), list(wrong.items())[:4])
    return drawn


def check_clickable(screen, label):
    """What lies on every node in sight is that node (no title bar, no other node)."""
    looked = 0
    for t in screen["things"]:
        if t["hits"]:
            looked += 1
            assert t["hits"] == [t["id"]] * 3, "%s: something lies over %s: %s" % (label, t["id"], t["hits"])
    assert looked >= 3, "%s: only %d nodes in sight" % (label, looked)


def check_nothing_cut(screen, label):
    cut = [t for t in screen["things"] if meets(t["rect"], screen["area"]) and not inside(t["rect"], screen["area"])]
    assert not cut, "%s: cut off at the edges of the pane in sight %s (the pane: %s): %s" % (
        label, screen["area"], screen["pane"], ["%s at %s" % (t["id"], t["rect"]) for t in cut])


def check_problem_in_sight(screen, label):
    problems = [t for t in screen["things"] if t["problem"]]
    assert problems, "%s: no problem node drawn" % label
    for t in problems:
        assert inside(t["rect"], screen["area"]), "%s: %s is outside the graph pane in sight %s: %s" % (
            label, t["id"], screen["area"], t["rect"])
        assert apart(t["rect"], screen["map"]), "%s: the overview map covers %s" % (label, t["id"])


def test_gan_and_resnet_views_in_jupyterlab(lab_with, page):
    import nbformat

    cells = [nbformat.v4.new_code_cell(REGISTER)]
    for case in ORDER:
        raises = view_cases.KINDS[case] != "accumulated-graph"
        cells.append(nbformat.v4.new_code_cell(view_cases.CASES[case],
                                               metadata={"tags": ["raises-exception"]} if raises else {}))
    url = lab_with(cells)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_function(KERNEL_IDLE, timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function("(n) => document.querySelectorAll('.ja-root[data-ready=\"1\"]').length >= n",
                           arg=len(ORDER), timeout=240_000)
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    roots = page.locator(".ja-root")
    for index, case in enumerate(ORDER):
        root = roots.nth(index)
        label = case
        root.evaluate("n => n.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)

        # -- one geometry: the first view is placed and positioned as Python says -----------------------
        drawn = same_placement(page, root, index, label + ", first view")
        x, y, k = kernel(page, "_first_view(%d, %d, %d)" % (index, drawn["pane"][0], drawn["pane"][1]))
        want = [x, y, drawn["pane"][0] / k, drawn["pane"][1] / k]
        assert all(abs(a - b) < 1 for a, b in zip(drawn["viewBox"], want)), (label, drawn["viewBox"], want)
        badges = root.locator(".ja-health")
        assert badges.count() > 0, "%s: no gradient-health badge drawn" % label

        # -- the first screen: the problem and its fix in sight, every node clickable, nothing cut ------
        screen = root.evaluate(SCREEN_JS)
        check_problem_in_sight(screen, label + ", first screen")
        assert screen["fix"] and screen["fix"]["bottom"] <= min(screen["window"][1], screen["seen"]["bottom"]) + 0.5, \
            "%s: the fix is below the first screen: %s (window %s)" % (label, screen["fix"], screen["window"])
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / ("view-%s-first-screen.png" % case)))
        check_clickable(screen, label + ", first screen")
        check_nothing_cut(screen, label + ", first screen")
        # The optional ways to fix it (PyTorch's copy-keeping context manager) are one click away.
        fix = root.locator(".ja-diagnosis.ja-active .ja-diag-fix")
        optional = "allow_mutation_on_saved_tensors" in view_cases_fix(page, index)
        assert optional or case != "gan"  # the in-place write's fix offers it
        if optional:
            assert "allow_mutation_on_saved_tensors" not in fix.inner_text(), "%s: the other ways are not folded" % label
            fix.locator("summary").click()
            assert "allow_mutation_on_saved_tensors" in fix.inner_text()
            fix.locator("summary").click()

        # -- panned down (open boxes' tops above the view): titles still cover nothing --------------------
        root.locator(".ja-graph").click(position={"x": 3, "y": 3})
        for _ in range(3):
            page.keyboard.press("ArrowDown")
        check_clickable(root.evaluate(SCREEN_JS), label + ", panned")
        root.screenshot(path=str(ARTIFACTS / ("view-%s-panned.png" % case)))

        # -- Fit: the whole graph or the problem's neighbourhood, nothing cut off -------------------------
        root.locator(".ja-btn-fit").click()
        screen = root.evaluate(SCREEN_JS)
        root.screenshot(path=str(ARTIFACTS / ("view-%s-fit.png" % case)))
        check_nothing_cut(screen, label + ", after Fit")
        check_problem_in_sight(screen, label + ", after Fit")
        check_clickable(screen, label + ", after Fit")
        everything = all(inside(t["rect"], screen["area"]) for t in screen["things"])
        assert everything or screen["zoom"] >= _FIT_MIN_ZOOM, "%s: Fit shows part of the graph at %s" % (
            label, screen["zoom"])

        # -- the largest closed module opened, then a module inside it: placed as Python places them ------
        for _ in range(2):
            box_id = root.evaluate(LARGEST_CLOSED_JS)
            assert box_id, "%s: no closed module to open" % label
            root.locator('.ja-box.ja-closed[data-id="%s"]' % box_id).dispatch_event("click")  # (may be out of view)
            root.locator('.ja-box.ja-open[data-id="%s"]' % box_id).wait_for(state="attached", timeout=10_000)
            same_placement(page, root, index, label + ", %s opened" % box_id)
            check_clickable(root.evaluate(SCREEN_JS), label + ", %s opened" % box_id)

        # -- the source panel: whole lines ------------------------------------------------------------------
        source = root.evaluate(SOURCE_JS)
        assert not source["overflowing"] and not source["cut"], "%s: source lines cut at %d px: %s" % (
            label, source["width"], source["cut"][:10])

        # -- the timeline: the slider sits in the iteration its label names ------------------------------------
        timeline = root.evaluate(TIMELINE_JS)
        iterations = kernel(page, "print(_json.dumps([SHOWN[%d].iterations, SHOWN[%d].n_steps]))" % (index, index))
        firsts, n_steps = iterations
        shown, of = [int(w) for w in timeline["label"].split() if w.isdigit()] or [1, 1]
        assert of == len(firsts)
        assert timeline["min"] <= 0 and timeline["max"] == n_steps - 1, (label, timeline, n_steps)
        at = max(i for i, first in enumerate(firsts) if first <= max(timeline["value"], 0))
        assert at + 1 == shown, "%s: the slider is at step %s (iteration %d) but says %r" % (
            label, timeline["value"], at + 1, timeline["label"])
    assert not errors, errors
