"""Benchmark of the graph view: how long until the first screen, and opening or closing a module.

    python benchmarks/view.py            # the budgets of the issue "The graph view for real models"
    python benchmarks/view.py --quick    # smaller graphs, for a smoke run

For each workload it measures, in this process:
  - build: AutogradWidget(trace): the scene (module boxes, layers) and the synced lists;
  - static: the text/html SVG and the PNG fallback drawn when the widget is displayed;
and in Chromium (headless, the saved HTML file, so the same widget.js without a server):
  - draw: widget.js placing and drawing the first view (its own performance.now() timing);
  - open/close: a click on a closed module box and a click on its title again.
"First render" is build + draw: what the user waits for before the first screen. The
budgets are goals printed next to the numbers, never assertions.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.widget import AutogradWidget, save_html, static_bundle

CHROMIUM = "/usr/bin/chromium"


def gpt2_tiny():
    import transformers

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, 100, (2, 16))
    with ja.capture(namespace={"model": model}) as trace:
        model(ids, labels=ids).loss.backward()
    return trace


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)


def resnet_step(blocks=8):
    """A ResNet-18-sized training step: a stem, `blocks` basic blocks, a head, SGD."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          *[Block(16) for _ in range(blocks)], nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    with ja.capture(namespace={"model": model}) as trace:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return trace


def mlp_loop(steps=150):
    """A plain training loop with no bug: the view must not grow with the number of steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with ja.capture(namespace={"model": model}) as trace:
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


def chain(nodes):
    x = torch.randn(4, requires_grad=True)
    with ja.capture() as trace:
        h = x
        for _ in range(nodes // 2):
            h = torch.tanh(h * 1.01)
    _ = trace.nodes  # the lazy build is the capture's cost, not the view's
    return trace, h


def median_ms(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def in_browser(trace, tmp):
    """widget.js timings from the saved HTML file in headless Chromium, or None without one."""
    if not os.path.exists(CHROMIUM):
        return None
    from playwright.sync_api import sync_playwright

    path = save_html(trace, os.path.join(tmp, "view.html"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(path.as_uri())
            page.wait_for_selector("body[data-ready='1'] .ja-root [data-id]", timeout=120_000)
            root = page.locator(".ja-root")
            out = {"draw": float(root.get_attribute("data-first-render-ms"))}
            closed = root.locator(".ja-box.ja-closed")
            opens, closes = [], []
            for i in range(min(3, closed.count())):
                box = closed.nth(0)
                box_id = box.get_attribute("data-id")
                box.click(force=True)
                page.wait_for_selector('.ja-box.ja-open[data-id="%s"]' % box_id, timeout=30_000)
                opens.append(float(root.get_attribute("data-render-ms")))
                root.locator('.ja-box.ja-open[data-id="%s"] .ja-box-header' % box_id).click(
                    position={"x": 12, "y": 8}, force=True)
                page.wait_for_selector('.ja-box.ja-closed[data-id="%s"]' % box_id, timeout=30_000)
                closes.append(float(root.get_attribute("data-render-ms")))
            out["open"] = statistics.median(opens) if opens else None
            out["close"] = statistics.median(closes) if closes else None
            return out
        finally:
            browser.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller graphs (a smoke run)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    big, huge = (2_000, 10_000) if args.quick else (10_000, 100_000)
    workloads = [("GPT-2 tiny step", gpt2_tiny, 300), ("ResNet-style step (8 blocks)", resnet_step, 300),
                 ("MLP loop, %d steps (folded)" % (40 if args.quick else 150), lambda: mlp_loop(40 if args.quick
                                                                                     else 150), 300)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make, budget in workloads:
            trace = make()
            _ = trace.nodes
            build = median_ms(lambda: AutogradWidget(trace).close(), 5)
            static = median_ms(lambda: static_bundle(trace), 3)  # small graphs: the scene is built again
            js = in_browser(trace, tmp)
            rows.append((name, len(trace.nodes), build, static, js, budget))
        for nodes, budget in ((big, 1000), (huge, 5000)):
            trace, keep = chain(nodes)
            build = median_ms(lambda: AutogradWidget(trace).close(), 1 if nodes > 50_000 else 3)
            widget = AutogradWidget(trace)
            static = median_ms(widget.static_bundle, 1)  # the widget's scene, as when it is displayed
            widget.close()
            js = in_browser(trace, tmp)
            rows.append(("chain of %d nodes (grouped)" % len(trace.nodes), len(trace.nodes), build, static, js,
                         budget))
            del keep
    print("jupyter-autograd graph view (%s, torch %s, 1 thread)" % (sys.platform, torch.__version__))
    print("%-34s %7s %9s %9s %9s %11s %9s %7s  %s" % ("workload", "nodes", "build ms", "draw ms", "first ms",
                                                    "budget ms", "ratio", "static", "goal"))
    results = []
    for name, n, build, static, js, budget in rows:
        draw = js["draw"] if js else float("nan")
        first = build + (draw if js else 0.0)
        ratio = first / budget
        met = "met" if ratio <= 1 else "MISSED"
        print("%-34s %7d %9.1f %9.1f %9.1f %11d %8.2fx %6.0fms  %s" % (name, n, build, draw, first, budget, ratio,
                                                                     static, met))
        results.append((name, js))
    print()
    print("opening / closing a module in the browser (budget 100 ms):")
    for name, js in results:
        if js and js.get("open") is not None:
            for what in ("open", "close"):
                ratio = js[what] / 100
                print("  %-34s %-6s %7.1f ms  %5.2fx  %s" % (name, what, js[what], ratio,
                                                            "met" if ratio <= 1 else "MISSED"))
    print()
    print("build: AutogradWidget(trace) in Python; draw: widget.js's first drawing in Chromium; first = build + draw;"
          "\nstatic: the text/html SVG and the PNG drawn when the widget is displayed (not part of the first screen"
          " budget, but the cell waits for it).")


if __name__ == "__main__":
    main()
