"""Retake the README's pictures: docs/widget.png and docs/view-focused.png, in a real JupyterLab,
in Chromium, at 1400x1000.

    .venv/bin/python scripts/screenshot.py [OUTPUT_DIR]     # default: docs/

widget.png is the README's example cell (read from the README, so the picture shows what the
README shows) with a saved tensor of the failing node clicked, so the details panel has
something to say; view-focused.png is the first screen of the ResNet notebook of
tests/notebook_cases.py (a real model whose in-place ReLU breaks backward). Each picture is
taken once the widget says it is drawn (its data-ready marker) and the kernel is idle.

The tests never write these files (their screenshots go to test-artifacts/); a person runs this
script when the view changes. Needs what the browser tests need (Chromium at
/usr/bin/chromium, or $CHROMIUM, and Playwright's Python library).
"""
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import nbformat
from playwright.sync_api import sync_playwright

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import notebook_cases  # noqa: E402  (the ResNet notebook the browser tests run)

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
KERNEL_IDLE = ("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
               " && window.jupyterapp.shell.currentWidget.sessionContext"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'")


def readme_cell():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"```python\n(%%autograd\n.*?)```", readme, re.S)
    return match.group(1).rstrip("\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(folder):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (folder / name.lower()).mkdir()
        env[name] = str(folder / name.lower())
    settings = folder / "jupyter_config_dir" / "lab" / "user-settings" / "@jupyterlab"
    (settings / "apputils-extension").mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    (settings / "notebook-extension").mkdir()  # every cell rendered, also off screen
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port, token = free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--port=%d" % port, "--ServerApp.ip=127.0.0.1",
         "--ServerApp.port_retries=0", "--IdentityProvider.token=" + token, "--ServerApp.root_dir=" + str(folder),
         "--ServerApp.allow_root=True", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = "http://127.0.0.1:%d" % port
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(base + "/api/status",
                                                          headers={"Authorization": "token " + token}), timeout=2)
            return server, "%s/lab/tree/example.ipynb?token=%s&reset" % (base, token)
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                stop(server)
                raise SystemExit("JupyterLab did not start")
            time.sleep(0.25)


def stop(server):
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def main(out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="ja-screenshot-"))
    resnet = notebook_cases.CASES["resnet"][-1]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(notebook_cases.LOAD),
                nbformat.v4.new_code_cell(readme_cell(), metadata={"tags": ["raises-exception"]}),
                nbformat.v4.new_code_cell(resnet, metadata={"tags": ["raises-exception"]})]
    nbformat.write(nb, folder / "example.ipynb")
    server, url = start_lab(folder)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.wait_for_function(KERNEL_IDLE, timeout=90_000)
            # The file browser takes 250 px that the pictures do not need.
            page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function("() => document.querySelectorAll('.ja-root[data-ready=\"1\"]').length >= 2",
                                   timeout=180_000)
            page.wait_for_function(KERNEL_IDLE, timeout=90_000)
            example, model = page.locator(".ja-root").nth(0), page.locator(".ja-root").nth(1)
            stale = example.locator('.ja-node.ja-problem[data-id^="fn"]:not([data-id^="fn-"])')
            for i in range(stale.count()):
                stale.nth(i).click()
                try:
                    page.wait_for_function("() => document.querySelector('.ja-details').textContent.includes('STALE')",
                                           timeout=3_000)
                    break
                except Exception:
                    continue
            page.wait_for_function(KERNEL_IDLE, timeout=30_000)
            example.evaluate("n => n.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(300)
            example.screenshot(path=str(out_dir / "widget.png"))
            model.evaluate("n => n.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(300)
            model.locator(".ja-main").screenshot(path=str(out_dir / "view-focused.png"))
            browser.close()
    finally:
        stop(server)
        shutil.rmtree(folder, ignore_errors=True)
    print("wrote", out_dir / "widget.png", "and", out_dir / "view-focused.png")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs")
