import atexit
import os
import pathlib
import signal

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_SCENARIOS = ROOT.parent / "shared" / "scenarios"
SHARED_ERROR_SCENARIOS = ROOT.parent / "shared" / "scenarios-errors"
OWN_SCENARIOS = ROOT / "tests" / "scenarios"
REAL_CASES = ROOT / "tests" / "corpus"  # reduced from public bug reports (tests/corpus/SOURCES.md)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def scenario_files(real_cases=True):
    """Our scenarios, the real cases of tests/corpus (unless `real_cases` is false) and the shared corpora."""
    files = sorted(OWN_SCENARIOS.glob("*.py")) + (sorted(REAL_CASES.glob("*.py")) if real_cases else [])
    for corpus in (SHARED_SCENARIOS, SHARED_ERROR_SCENARIOS):
        if corpus.is_dir():
            files += sorted(corpus.glob("*.py"))
        elif IN_CI:
            raise RuntimeError("CI must run the shared scenario corpus, but %s does not exist" % corpus)
    return files


def shared_scenario(name):
    """The file `name` of the shared corpora, for a test about that one case. Where ../shared is not
    beside the checkout (a fresh clone), the test skips and says why; in CI that is a failure, as
    for the corpora themselves, and so is a file the shared corpora do not have (a renamed case)."""
    for corpus in (SHARED_SCENARIOS, SHARED_ERROR_SCENARIOS):
        if (corpus / name).is_file():
            return corpus / name
    if IN_CI or SHARED_SCENARIOS.is_dir():
        pytest.fail("%s is not in the shared corpora (%s, %s)" % (name, SHARED_SCENARIOS, SHARED_ERROR_SCENARIOS))
    pytest.skip("needs %s of the shared corpora, and ../shared is not beside this checkout" % name)


def shared_file(relative):
    """The file `relative` of ../shared (`tools/check_scenarios.py`), for a test that runs it: where
    ../shared is not beside the checkout (a fresh clone), the test skips and says why; in CI, or
    where ../shared is there without that file, it fails."""
    path = SHARED_SCENARIOS.parent / relative
    if path.is_file():
        return path
    if IN_CI or SHARED_SCENARIOS.parent.is_dir():
        pytest.fail("%s is not in %s" % (relative, SHARED_SCENARIOS.parent))
    pytest.skip("needs %s of ../shared, and ../shared is not beside this checkout" % relative)


@pytest.fixture
def shell():
    """A fresh InteractiveShell per test, with the extension loaded."""
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_autograd")
    ip.run_line_magic("colors", "nocolor")
    yield ip
    ip.run_line_magic("unload_ext", "jupyter_autograd")
    # Each shell registers its exit work with atexit: at pytest's exit that would reset every test's
    # shell, each with a full gc.collect over the suite's heap (minutes). Close its history now.
    atexit.unregister(ip.atexit_operations)
    if ip.history_manager is not None:
        ip.history_manager.end_session()
        ip.history_manager.close()
    InteractiveShell.clear_instance()


def pytest_configure(config):
    """A suite started as a background job inherits an ignored SIGINT, and the tests that
    interrupt a cell would then wait forever: give the session Python's own handler, before
    anything reads it."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(session, config, items):
    """The browser tests last: pytest-playwright keeps its sync API's asyncio loop running for
    the rest of the session, and IPython's top-level await (tests/test_magic_invisible.py) would
    then find that loop already running."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)
