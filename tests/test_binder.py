"""Binder: the requirements resolve and install into a fresh virtual environment, postBuild
installs the project, and the demo notebooks run there (torch from the local CPU wheel here)."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.notebooks

ROOT = pathlib.Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"


def test_binder_files_are_what_repo2docker_expects():
    post = (BINDER / "postBuild").read_text()
    assert post.startswith("#!/bin/bash\n") and "set -e" in post and os.access(BINDER / "postBuild", os.X_OK)
    reqs = (BINDER / "requirements.txt").read_text()
    assert "download.pytorch.org/whl/cpu" in reqs and re.search(r"^torch==", reqs, re.M)
    assert re.fullmatch(r"python-3\.\d+\s*", (BINDER / "runtime.txt").read_text())
    readme = (ROOT / "README.md").read_text()
    badge = re.search(r"mybinder\.org/v2/gh/[^)\s]+urlpath=lab/tree/(notebooks/01_[\w]+\.ipynb)", readme)
    assert badge and (ROOT / badge.group(1)).exists()


def binder_python():
    """The Python Binder builds with (binder/runtime.txt): this one when it is that version (the
    local CPU wheel of torch is for it), else that version's interpreter on PATH."""
    version = re.fullmatch(r"python-(3\.\d+)\s*", (BINDER / "runtime.txt").read_text()).group(1)
    if "%d.%d" % sys.version_info[:2] == version:
        return sys.executable
    found = shutil.which("python" + version)
    if found is None:
        pytest.skip("Binder builds with Python %s (binder/runtime.txt), which this machine does not have" % version)
    return found


@pytest.mark.timeout(1800)
def test_binder_environment_installs_and_runs_the_notebooks(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([binder_python(), "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    env = dict(os.environ, PATH=str(bin_dir) + os.pathsep + os.environ["PATH"], VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)

    def run(*cmd, cwd=ROOT, timeout=1200):
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, "%s failed:\n%s\n%s" % (cmd, proc.stdout[-3000:], proc.stderr[-3000:])
        return proc.stdout

    # The CPU index of PyTorch is not reachable from this machine (each lookup there stalls):
    # install from the same list without it, so torch==2.13.0 comes from the local CPU wheel.
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("".join(line for line in (BINDER / "requirements.txt").read_text().splitlines(True)
                            if not line.startswith("--extra-index-url")))
    run(str(bin_dir / "python"), "-m", "pip", "install", "-q", "-r", str(reqs))
    run("bash", str(BINDER / "postBuild"))
    info = json.loads(run(str(bin_dir / "python"), "-c",
                          "import json, torch, jupyter_autograd, jupyterlab; "
                          "print(json.dumps([torch.__version__, jupyter_autograd.__file__]))",
                          cwd=tmp_path))  # not the checkout, which would shadow the installed package
    assert info[0].startswith("2.13.0") and "+cpu" in info[0]
    assert str(venv) in info[1], "postBuild must install the project into the Binder environment"
    out = tmp_path / "executed"
    run(str(bin_dir / "jupyter"), "nbconvert", "--to", "notebook", "--execute", "--output-dir", str(out),
        "--ExecutePreprocessor.timeout=300", "--ExecutePreprocessor.kernel_name=python3",
        *sorted(str(p) for p in (ROOT / "notebooks").glob("*.ipynb")), cwd=tmp_path)
    executed = sorted(out.glob("*.ipynb"))
    assert len(executed) == len(list((ROOT / "notebooks").glob("*.ipynb")))
    quickstart = json.loads(executed[0].read_text())
    kinds = [o.get("data", {}) for c in quickstart["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert any("application/vnd.jupyter.widget-view+json" in d for d in kinds)
