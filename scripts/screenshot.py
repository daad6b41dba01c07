"""Retake docs/widget.png: the README's example cell, run in a real JupyterLab, in Chromium.

    .venv/bin/python scripts/screenshot.py [OUTPUT.png]

Needs what the browser tests need (Chromium at /usr/bin/chromium, Playwright's Python
library). The cell is read from the README, so the picture shows what the README shows; a
saved tensor of the failing node is clicked, so the details panel has something to say.
"""
import json
import os
import pathlib
import re
import secrets
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
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def readme_cell():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"```python\n(%%autograd\n.*?)```", readme, re.S)
    return match.group(1).rstrip("\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(output):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="ja-screenshot-"))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("%load_ext jupyter_autograd"), nbformat.v4.new_code_cell(readme_cell())]
    nbformat.write(nb, tmp / "example.ipynb")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (tmp / name.lower()).mkdir()
        env[name] = str(tmp / name.lower())
    settings = tmp / "jupyter_config_dir" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    port, token = free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--port=%d" % port, "--ServerApp.ip=127.0.0.1",
         "--ServerApp.port_retries=0", "--IdentityProvider.token=" + token, "--ServerApp.root_dir=" + str(tmp),
         "--ServerApp.allow_root=True", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        base = "http://127.0.0.1:%d" % port
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(base + "/api/status",
                                                              headers={"Authorization": "token " + token}), timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("JupyterLab did not start")
                time.sleep(0.25)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto("%s/lab/tree/example.ipynb?token=%s&reset" % (base, token))
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
                                   " === 'idle'", timeout=90_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            widget = page.locator(".ja-root")
            widget.wait_for(timeout=90_000)
            widget.locator(".ja-diagnosis").first.wait_for()
            stale = widget.locator('.ja-graph [id^="ja-fn"]:not([id^="ja-fn-"])')
            for i in range(stale.count()):
                stale.nth(i).click()
                try:
                    page.wait_for_function("() => document.querySelector('.ja-details').textContent"
                                           ".includes('STALE')", timeout=3_000)
                    break
                except Exception:
                    continue
            page.set_viewport_size({"width": 1400, "height": 2400})
            widget.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            widget.screenshot(path=str(output))
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    print("wrote", output)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "widget.png")
