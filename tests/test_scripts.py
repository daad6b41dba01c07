"""The README's commands, run as a newcomer runs them: the demo opens (as root too), the test
script sets up only what is out of date, installs Chromium only for the browser tests and says
what it leaves out; compat.sh takes a torch version."""
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
import time
import urllib.request

import pytest

from .conftest import ROOT

SCRIPTS = ROOT / "scripts"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, token, timeout=5):
    req = urllib.request.Request(url, headers={"Authorization": "token " + token})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return response.status, response.read()


@pytest.mark.timeout(300)
def test_demo_opens_the_quickstart_as_root_or_not(tmp_path):
    """`bash scripts/demo.sh` as the README says (root here: Jupyter refuses root without a flag)."""
    env = dict(os.environ, VENV=sys.prefix, SETUP="no", PYTHONPATH=str(ROOT))
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (tmp_path / name.lower()).mkdir()
        env[name] = str(tmp_path / name.lower())
    port, token = _free_port(), secrets.token_hex(16)
    log_path = tmp_path / "demo.log"
    # No allow_root here: demo.sh has to add it itself when it runs as root.
    cmd = ["bash", str(SCRIPTS / "demo.sh"), "--no-browser", "--port=%d" % port, "--ServerApp.ip=127.0.0.1",
           "--ServerApp.port_retries=0", "--IdentityProvider.token=" + token, "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        base = "http://127.0.0.1:%d" % port
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, "demo.sh exited (uid %d):\n%s" % (os.getuid(), log_path.read_text()[-3000:])
            try:
                _get(base + "/api/status", token, timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "no server after 120 s:\n" + log_path.read_text()[-3000:]
                time.sleep(0.25)
        # Jupyter serves the folder of the notebook it was given (all six demos).
        status, body = _get(base + "/api/contents/01_quickstart.ipynb", token)
        notebook = json.loads(body)
        assert status == 200 and notebook["type"] == "notebook"
        assert any("%load_ext jupyter_autograd" in "".join(c["source"]) for c in notebook["content"]["cells"])
        status, page = _get(base + "/lab/tree/01_quickstart.ipynb", token)
        assert status == 200 and b"JupyterLab" in page
        # The link Jupyter prints (for a machine where no browser opens) goes to the notebook, not
        # to the Launcher.
        printed = re.findall(r"http://127\.0\.0\.1:%d/\S*" % port, log_path.read_text())
        assert printed and all("/lab/tree/01_quickstart.ipynb?token=" in url for url in printed), log_path.read_text()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode is not None


# -- test.sh and setup.sh, with a stand-in Python, apt-get and sudo that only log their calls ------

FAKE = """#!/bin/bash
echo "$(basename "$0") $*" >> "{log}"
[ "$1" = - ] && cat > /dev/null
exit 0
"""


@pytest.fixture
def fresh_clone(tmp_path):
    """The scripts and pyproject.toml in a directory with no ../shared, a .venv whose python only
    logs what it is asked, and a bin/ with apt-get and sudo that log too."""
    repo = tmp_path / "clone"
    shutil.copytree(SCRIPTS, repo / "scripts")
    shutil.copy(ROOT / "pyproject.toml", repo)
    (repo / "tests").mkdir()
    log = tmp_path / "calls.log"
    log.touch()
    fakes = tmp_path / "bin"
    fakes.mkdir()
    (repo / ".venv" / "bin").mkdir(parents=True)
    for path in (repo / ".venv" / "bin" / "python", fakes / "apt-get", fakes / "sudo"):
        path.write_text(FAKE.format(log=log))
        path.chmod(0o755)
    env = {"PATH": "%s:/usr/bin:/bin" % fakes, "HOME": str(tmp_path), "CHROMIUM": str(tmp_path / "no-chromium")}

    def run(script, *args, **extra):
        log.write_text("")
        proc = subprocess.run(["bash", str(repo / "scripts" / script), *args], cwd=repo, capture_output=True,
                              text=True, env=dict(env, **extra), timeout=60)
        return proc, log.read_text().splitlines()

    run.repo, run.fakes = repo, fakes
    return run


def test_setup_runs_once_and_again_only_when_pyproject_changes(fresh_clone):
    proc, calls = fresh_clone("setup.sh")
    assert proc.returncode == 0, proc.stderr
    assert any("pip install -q torch==2.13.0" in c for c in calls) and any("-e ." in c for c in calls)
    proc, calls = fresh_clone("setup.sh")
    assert proc.returncode == 0 and calls == [], "an up-to-date setup ran again: %s" % calls
    pyproject = fresh_clone.repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"networkx>=3"', '"networkx>=3.1"'))
    proc, calls = fresh_clone("setup.sh")
    assert proc.returncode == 0 and any("pip install" in c for c in calls)


def test_test_script_installs_chromium_only_for_the_browser_tests(fresh_clone):
    fresh_clone("setup.sh")
    for args in (["-m", "not browser"], ["tests/test_capture.py"], ["-m", "not browser and not notebooks"]):
        if args[0].startswith("tests/"):
            (fresh_clone.repo / args[0]).write_text("")
        proc, calls = fresh_clone("test.sh", *args)
        assert proc.returncode == 0, proc.stderr
        assert not [c for c in calls if c.startswith(("apt-get", "sudo"))], (args, calls)
        assert calls[-1] == "python -m pytest " + " ".join(args)
    proc, calls = fresh_clone("test.sh")
    assert proc.returncode == 0, proc.stderr
    assert any(c.startswith(("apt-get install", "sudo apt-get install")) and "chromium" in c for c in calls), calls
    assert calls[-1] == "python -m pytest"


def test_test_script_without_apt_says_what_to_do(fresh_clone):
    fresh_clone("setup.sh")
    (fresh_clone.fakes / "apt-get").unlink()
    # A system without apt-get: only the tools the scripts use are on the PATH.
    tools = fresh_clone.fakes.parent / "tools"
    tools.mkdir()
    for tool in ("bash", "cat", "sha256sum", "cut", "mktemp", "rm", "realpath", "id", "dirname", "basename", "grep"):
        (tools / tool).symlink_to(shutil.which(tool))
    proc, calls = fresh_clone("test.sh", "tests", PATH="%s:%s" % (fresh_clone.fakes, tools))
    assert proc.returncode == 0
    assert "no apt-get" in proc.stderr and '-m "not browser"' in proc.stderr
    assert calls[-1] == "python -m pytest tests"


def test_test_script_says_once_that_the_shared_corpora_are_not_run(fresh_clone):
    fresh_clone("setup.sh")
    proc, _ = fresh_clone("test.sh", "-m", "not browser")
    assert proc.stdout.count("the shared scenario corpora (../shared/scenarios, ../shared/scenarios-errors) are not run") == 1, proc.stdout
    proc, calls = fresh_clone("test.sh", "-m", "not browser", CI="true")
    assert proc.returncode != 0 and "CI must run the shared scenario corpus" in proc.stderr
    assert not any("pytest" in c for c in calls)


LOUD = """#!/bin/bash
echo "$(basename "$0") $*" >> "{log}"
echo "RUNNING $(basename "$0") $*"
[ "$1" = - ] && cat > /dev/null
exit 0
"""


def test_demo_says_what_it_installs_and_opens_the_quickstart(fresh_clone):
    """demo.sh on a fresh machine, with a python and a jupyter that only say what they were asked:
    a line before each install step (pip runs quietly, for minutes), and JupyterLab started on the
    quickstart notebook as its default page (the link it prints goes there, not to the Launcher)."""
    bin_dir = fresh_clone.repo / ".venv" / "bin"
    for name in ("python", "jupyter"):
        (bin_dir / name).write_text(LOUD.format(log=fresh_clone.repo.parent / "calls.log"))
        (bin_dir / name).chmod(0o755)
    proc, calls = fresh_clone("demo.sh", "--no-browser")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    pip = [i for i, line in enumerate(out) if line.startswith("RUNNING python -m pip install")]
    assert len(pip) == 3, out
    for step, at in zip(("1/3 torch 2.13.0", "2/3 JupyterLab", "3/3 jupyter-autograd"), pip):
        said = [i for i, line in enumerate(out) if step in line]
        assert said and said[0] < at and not [i for i in pip if said[0] < i < at], (step, out)
    assert any(re.fullmatch(r"setup \(\.venv\): done in \d+s", line) for line in out), out
    jupyter = calls[-1].split()
    assert jupyter[:2] == ["jupyter", "lab"] and jupyter[-1] == "--no-browser", calls
    assert "--ServerApp.root_dir=notebooks" in jupyter and "--LabApp.default_url=/lab/tree/01_quickstart.ipynb" in jupyter
    assert not [a for a in jupyter[2:] if a.endswith(".ipynb") and not a.startswith("--")], jupyter  # no file argument
    assert ("--allow-root" in jupyter) == (os.getuid() == 0)
    assert "01_quickstart.ipynb open" in proc.stdout and proc.stdout.index("01_quickstart.ipynb open") < proc.stdout.index(
        "RUNNING jupyter lab")
    # Set up: the next run says nothing of installing.
    proc, calls = fresh_clone("demo.sh")
    assert "setup (" not in proc.stdout and [c.split()[:2] for c in calls] == [["jupyter", "lab"]], (proc.stdout, calls)


def test_compat_needs_a_version(fresh_clone):
    proc, calls = fresh_clone("compat.sh")
    assert proc.returncode == 2 and "usage: bash scripts/compat.sh TORCH_VERSION" in proc.stderr and not calls
