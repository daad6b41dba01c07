"""pytest plugin (entry point `pytest11`): a project's own tests, run under capture().

    pytest --autograd         # fail every test whose code breaks autograd, with the report

With `--autograd`, each test's body runs under `jupyter_autograd.capture()`; a test that passed
but whose code produced a problem diagnosis (a silent write through `.data`, an in-place write
to a saved tensor, graphs kept alive across iterations, ...) fails with the plain-text report.
A test that raised keeps its own failure, whose traceback carries the diagnosis as a note; the
whole report is then a section of the failure ("Captured autograd call").
`@pytest.mark.autograd_ok` exempts a test that means to do it. A test that passed while a part of
the analysis failed gets an `AnalysisIncomplete` warning saying what was not checked.

The `autograd_trace` fixture gives a test the Trace of its own code, with or without the flag:

    def test_training_step(autograd_trace):
        train_one_step(model, batch)
        assert not autograd_trace.diagnoses, autograd_trace.report()

Recording starts before the test's body and stops when the trace is first read (or when the
test ends): read it after the code it is about.
"""
from __future__ import annotations

import os

import pytest

# jupyter_autograd (and torch) are imported when a test needs them, not when pytest starts.


def pytest_addoption(parser):
    group = parser.getgroup("autograd", "jupyter-autograd")
    group.addoption("--autograd", action="store_true", default=False,
                    help="run each test under jupyter_autograd.capture() and fail the tests whose code breaks "
                         "autograd (silent .data writes, in-place writes to saved tensors, ...), with the report")


def pytest_configure(config):
    config.addinivalue_line("markers", "autograd_ok: the test means to break autograd; --autograd does not fail it")


class AnalysisIncomplete(UserWarning):
    """A part of the analysis of a test's code failed: the test passed, but only what was analysed
    was checked (`-W error::jupyter_autograd.pytest_plugin.AnalysisIncomplete` fails it)."""


class LiveTrace:
    """The Trace of the running test. The first read stops the recording and builds it."""

    def __init__(self, namespace=None):
        from jupyter_autograd import capture

        # The note that capture() puts on an exception ends "trace.report() has ...": a test has
        # no `trace`. pytest_runtest_call puts its own, which says where the report is.
        self._capture = capture(namespace=namespace, note_exceptions=False)
        self._trace = self._capture.__enter__()
        self._running = True

    def stop(self, exc=None):
        if self._running:
            self._running = False
            self._capture.__exit__(type(exc) if exc is not None else None, exc,
                                   exc.__traceback__ if exc is not None else None)
        return self._trace

    def __getattr__(self, name):
        return getattr(self.stop(), name)

    def __repr__(self):
        return repr(self.stop())


def _namespace(item):
    module = getattr(item, "module", None)
    return [vars(module)] if module is not None else None


@pytest.fixture
def autograd_trace(request):
    """The Trace of this test's code (recorded until it is first read)."""
    live = LiveTrace(_namespace(request.node))
    yield live
    live.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not item.config.getoption("autograd") or item.get_closest_marker("autograd_ok"):
        return (yield)
    funcargs = getattr(item, "funcargs", {})
    live = funcargs.get("autograd_trace") if isinstance(funcargs.get("autograd_trace"), LiveTrace) else None
    live = live or LiveTrace(_namespace(item))
    try:
        result = yield
    except BaseException as exc:
        _explain(item, exc, live.stop(exc))  # the test failed on its own: its traceback gets the diagnosis
        raise
    from jupyter_autograd.model import PROBLEM_KINDS

    trace = live.stop()
    problems = [d for d in trace.diagnoses if d.kind in PROBLEM_KINDS]
    if problems:
        summary = _summary(item, trace, problems[0], len(problems) - 1)
        item.stash[_SUMMARY] = summary
        pytest.fail(summary + "\nthe test's code breaks autograd (pytest --autograd; mark it autograd_ok if it means "
                    "to)\n\n" + trace.report(), pytrace=False)
    if trace.warnings:  # passed, but only what was analysed: said in the warnings summary
        item.warn(AnalysisIncomplete(trace.report()))
    return result


def _explain(item, exc, trace):
    """The diagnosis that explains the test's exception as a note under its traceback (PEP 678), and
    the whole report as a section of the failure, which the note points to. Never raises: the
    test's own failure matters more."""
    if not isinstance(exc, Exception) or not hasattr(exc, "add_note"):
        return
    try:
        from jupyter_autograd.render.text import exception_note, explaining_diagnosis

        note = exception_note(trace, '(the whole report is in the "Captured autograd call" section below)')
        if note:
            exc.add_note(note)
            item.add_report_section("call", "autograd", trace.report())
            explains = explaining_diagnosis(trace)
            if explains is not None:
                error = (trace.error or "").split("\n", 1)[0]
                item.stash[_SUMMARY] = _summary(item, trace, explains, 0) + ("; " + error if error else "")
    except Exception:
        pass


# The short summary line of a test that --autograd failed, or whose exception a diagnosis explains:
# `[saved-tensor-modified] tests/test_model.py:16 A tensor saved for backward was modified in place (`y`)`.
_SUMMARY = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The line pytest's short test summary shows for the test (and junitxml's failure message) names
    the kind and the culprit line, not the first words of the report ("Failed: the t...")."""
    report = yield
    summary = item.stash.get(_SUMMARY, None)
    crash = getattr(report.longrepr, "reprcrash", None)
    if summary and report.when == "call" and report.failed and crash is not None:
        try:
            crash.message = summary
        except Exception:  # another pytest's report: its own line stays
            pass
    return report


def _summary(item, trace, d, more):
    """`[kind] path:line title`, the path as pytest writes the test's own (relative to its rootdir)."""
    where = ""
    if d.line is not None and d.filename:
        path = d.filename
        try:
            relative = os.path.relpath(path, str(item.config.rootpath))
            path = relative if not relative.startswith(os.pardir) else trace.file_label(path)
        except ValueError:  # another drive (Windows)
            path = trace.file_label(path)
        where = " %s:%d" % (path, d.line)
    tail = " (and %d more problem%s)" % (more, "" if more == 1 else "s") if more else ""
    return "[%s]%s %s%s" % (d.kind, where, d.title, tail)
