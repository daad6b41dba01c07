"""The pytest plugin on a small project of its own, run by pytest in a subprocess as a user's CI would."""
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

from .conftest import ROOT

PROJECT = {
    "test_model.py": """
        import pytest
        import torch


        def test_a_clean_training_step():
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            net(torch.randn(16, 4)).pow(2).mean().backward()
            opt.step()


        def test_sigmoid_gradient_is_computed():
            a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
            out = a.sigmoid()
            out.data.zero_()  # silently corrupts the gradient: no error, a.grad is all zeros
            out.sum().backward()
            assert a.grad is not None


        @pytest.mark.autograd_ok
        def test_that_means_to_write_through_data():
            a = torch.tensor([1.0, 2.0], requires_grad=True)
            out = a.exp()
            out.data.fill_(1.0)
            out.sum().backward()


        def test_backward_after_an_inplace_write():
            y = torch.ones(3, requires_grad=True).exp()
            y += 1
            y.sum().backward()
        """,
    "test_fixture.py": """
        import torch


        def test_trace_of_my_own_code(autograd_trace):
            w = torch.ones(3, requires_grad=True)
            (w * 2).sum().backward()
            assert len(autograd_trace.backward_calls()) == 1 and not autograd_trace.diagnoses
            assert "w" in [t.name for t in autograd_trace.tensors.values()]


        def test_fixture_sees_the_problem(autograd_trace):
            a = torch.tensor([1.0, 2.0], requires_grad=True)
            out = a.sigmoid()
            out.data.zero_()
            out.sum().backward()
            assert [d.kind for d in autograd_trace.diagnoses] == ["silent-data-mutation"]
        """,
}


def run_pytest(tmp_path, *args, **env_extra):
    for name, source in PROJECT.items():
        (tmp_path / name).write_text(textwrap.dedent(source).lstrip())
    installed = any(ep.value == "jupyter_autograd.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    # Where this checkout is not installed with its entry point, load the plugin the way it would.
    load = [] if installed else ["-p", "jupyter_autograd.pytest_plugin"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")  # the short summary's lines are cut to the width
    env.pop("CI", None)
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *load, *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    outcomes = {test: outcome for outcome, test in re.findall(r"^(PASSED|FAILED) test_\w+\.py::(\w+)",
                                                              proc.stdout, re.M)}
    return proc, outcomes


def test_the_entry_point_names_the_plugin():
    with open(ROOT / "pyproject.toml", "rb") as f:
        entry_points = tomllib.load(f)["project"]["entry-points"]["pytest11"]
    assert list(entry_points.values()) == ["jupyter_autograd.pytest_plugin"]


def test_without_the_flag_the_silent_corruption_passes(tmp_path):
    proc, outcomes = run_pytest(tmp_path)
    assert outcomes == {"test_a_clean_training_step": "PASSED", "test_sigmoid_gradient_is_computed": "PASSED",
                        "test_that_means_to_write_through_data": "PASSED",
                        "test_backward_after_an_inplace_write": "FAILED",
                        "test_trace_of_my_own_code": "PASSED", "test_fixture_sees_the_problem": "PASSED"}, proc.stdout


def test_with_the_flag_the_silent_corruption_fails_with_the_report(tmp_path):
    proc, outcomes = run_pytest(tmp_path, "--autograd")
    assert outcomes == {"test_a_clean_training_step": "PASSED", "test_sigmoid_gradient_is_computed": "FAILED",
                        "test_that_means_to_write_through_data": "PASSED",
                        "test_backward_after_an_inplace_write": "FAILED",
                        "test_trace_of_my_own_code": "PASSED", "test_fixture_sees_the_problem": "FAILED"}, proc.stdout
    assert proc.returncode == 1
    failure = proc.stdout.split("test_sigmoid_gradient_is_computed ___", 1)[1].split("\n___", 1)[0]
    assert "the test's code breaks autograd" in failure
    # Each line with its file, as pytest names the test's own (test_model.py:16).
    assert "[silent-data-mutation]" in failure and "culprit: test_model.py, line 16: out.data.zero_()" in failure
    assert "saved:   test_model.py, line 15: out = a.sigmoid()" in failure
    # The test that raised keeps its own error, with the diagnosis under its traceback.
    raised = proc.stdout.split("test_backward_after_an_inplace_write ___", 1)[1].split("\n___", 1)[0]
    assert "RuntimeError: one of the variables needed for gradient computation" in raised
    if sys.version_info >= (3, 11):
        assert "jupyter-autograd: A tensor saved for backward was modified in place (`y`)" in raised
        # There is no `trace` in a test: the note points at what pytest shows, the whole report below it.
        assert "trace.report()" not in raised
        assert 'the whole report is in the "Captured autograd call" section below' in raised, raised
    section = raised.split("Captured autograd call", 1)[1]
    assert "1. [saved-tensor-modified]" in section and "version: saved at 0, now 1" in section, raised


def test_the_short_summary_names_the_kind_and_the_line(tmp_path):
    """Not "Failed: the t...": the line of the short test summary says what broke autograd and where,
    as pytest writes a place (test_model.py:16), for a test that passed and one that raised."""
    proc, _ = run_pytest(tmp_path, "--autograd")
    summary = proc.stdout.split("short test summary info", 1)[1]
    lines = {line.split(" - ", 1)[0]: line.split(" - ", 1)[1] for line in summary.splitlines() if " - " in line}
    assert lines["FAILED test_model.py::test_sigmoid_gradient_is_computed"] == (
        "[silent-data-mutation] test_model.py:16 Silent gradient corruption through .data (`out`)"), summary
    assert lines["FAILED test_model.py::test_backward_after_an_inplace_write"].startswith(
        "[saved-tensor-modified] test_model.py:31 A tensor saved for backward was modified in place (`y`); "
        "RuntimeError: one of the variables"), summary
    assert lines["FAILED test_fixture.py::test_fixture_sees_the_problem"] == (
        "[silent-data-mutation] test_fixture.py:14 Silent gradient corruption through .data (`out`)"), summary
    # The failure itself starts with the same line.
    failure = proc.stdout.split("test_sigmoid_gradient_is_computed ___", 1)[1]
    assert failure.lstrip("_ \n").startswith(
        "[silent-data-mutation] test_model.py:16 Silent gradient corruption through .data (`out`)\n"), failure[:500]
    # In CI, pytest writes the whole message: still one line.
    ci, _ = run_pytest(tmp_path, "--autograd", "-k", "sigmoid_gradient", CI="true", COLUMNS="80")
    line = "FAILED test_model.py::test_sigmoid_gradient_is_computed - [silent-data-mutation] test_model.py:16 Silent"
    assert line in ci.stdout and "the test's code breaks autograd" not in ci.stdout.split(line, 1)[1], ci.stdout
