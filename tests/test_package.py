"""The package a user installs and the source distribution a packager takes: complete metadata,
the license in both, the widget's front-end files in the wheel, and in the sdist everything the
test suite needs besides the package (its scripts, benchmarks, notebooks, Binder files)."""
import email
import pathlib
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out),
                           str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return wheel, sdist


def wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(name)), z.namelist()


def test_wheel_metadata_is_complete(dists):
    meta, names = wheel_metadata(dists[0])
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert "LICENSE" in meta.get_all("License-File")
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Repository", "Issues"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())
    versions = {c.rsplit(" :: ", 1)[1] for c in meta.get_all("Classifier") if c.startswith("Programming Language :: Python :: 3.")}
    assert "3.11" in versions
    low = re.fullmatch(r">=\s*3\.(\d+)", meta["Requires-Python"]).group(1)
    assert min(int(v.split(".")[1]) for v in versions) == int(low), "the classifiers start where Requires-Python does"
    assert meta["Summary"] and meta["Description-Content-Type"] == "text/markdown"
    assert any(r.startswith("torch") for r in meta.get_all("Requires-Dist"))


def test_wheel_carries_the_widget_front_end_and_no_tests(dists):
    _, names = wheel_metadata(dists[0])
    assert "jupyter_autograd/widget/widget.js" in names and "jupyter_autograd/widget/widget.css" in names
    assert not any(n.startswith(("tests/", "notebooks/")) for n in names)


def test_sdist_holds_what_the_tests_need(dists):
    with tarfile.open(dists[1]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:  # not a git checkout (the unpacked sdist itself): compare with the files here
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    needed = [f for f in tracked if f.split("/")[0] in {"jupyter_autograd", "tests", "scripts", "benchmarks",
                                                        "notebooks", "binder", "docs"}
              or f in {"README.md", "LICENSE", "pyproject.toml"}]
    missing = sorted(set(needed) - names)
    assert not missing, "not in the sdist: %s" % missing[:20]
    assert not any(n.startswith("test-artifacts/") or "__pycache__" in n for n in names)
    # The README's pictures and links into the tree resolve inside the sdist.
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\((?!https?://|#)([^)\s]+)\)", readme):
        assert target.split("#")[0] in names, target
