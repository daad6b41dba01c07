"""A clone with no ../shared beside it (issue 31): the tests that read the shared corpora skip and
say why, the rest run; in CI (CI=true) the missing corpora stay a failure.

The checkout (without .git and .venv) is copied to a directory whose parent has no `shared`, and
pytest runs there in a subprocess, on the files that read the corpora."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT

# The test files that read ../shared (tests/conftest.py: scenario_files, shared_scenario).
READERS = ["tests/test_report.py", "tests/test_fixes.py", "tests/test_scenarios.py", "tests/test_widget.py"]


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    where = tmp_path_factory.mktemp("fresh") / "clone"
    shutil.copytree(ROOT, where, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "test-artifacts", "build", "dist"))
    assert not (where.parent / "shared").exists()
    return where


def pytest_in(clone, *args, ci=False):
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(clone)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=600)


def test_the_tests_about_one_shared_case_skip_and_say_why(clone):
    proc = pytest_in(clone, "-rs", "tests/test_report.py", "-k", "second_line")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\b4 skipped\b", proc.stdout) and " failed" not in proc.stdout, proc.stdout[-3000:]
    assert "needs 04_data_alias_silent.py of the shared corpora, and ../shared is not beside this checkout" \
        in proc.stdout, proc.stdout[-3000:]


def test_the_official_checker_skips_and_says_why(clone):
    proc = pytest_in(clone, "-rs", "tests/test_scenarios.py::test_official_checker_script")
    assert proc.returncode == 0 and re.search(r"\b1 skipped\b", proc.stdout), proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "needs tools/check_scenarios.py of ../shared, and ../shared is not beside this checkout" in proc.stdout
    proc = pytest_in(clone, "tests/test_scenarios.py::test_official_checker_script", ci=True)
    assert proc.returncode not in (0, 5), proc.stdout[-3000:]  # a failure or an error, not a pass or nothing run


def test_every_reader_of_the_corpora_collects_without_them(clone):
    proc = pytest_in(clone, "--collect-only", "-q", *READERS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\d+ tests collected", proc.stdout), proc.stdout[-3000:]


def test_in_ci_the_missing_corpora_are_a_failure(clone):
    proc = pytest_in(clone, "--collect-only", "-q", "tests/test_report.py", ci=True)
    assert proc.returncode != 0
    assert "CI must run the shared scenario corpus" in proc.stdout + proc.stderr, proc.stdout[-3000:]
