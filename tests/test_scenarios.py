"""The scenario corpora: ours (tests/scenarios/) and the shared one (../shared/scenarios/)."""
import os
import subprocess
import sys

import pytest

from . import scenario_runner as runner
from .conftest import SHARED_ERROR_SCENARIOS, SHARED_SCENARIOS, scenario_files, shared_file

FILES = scenario_files()


@pytest.mark.parametrize("path", FILES, ids=lambda p: "%s/%s" % (p.parent.name, p.stem))
def test_scenario(path):
    sc = runner.load(str(path))
    runner.judge(sc)


PREDICT = [p for p in FILES if runner.load(str(p)).kind in runner.PREDICTABLE
           and runner.without_final_backward(runner.load(str(p)))]


@pytest.mark.parametrize("path", PREDICT, ids=lambda p: "%s/%s" % (p.parent.name, p.stem))
def test_scenario_predicted_before_backward(path):
    sc = runner.load(str(path))
    runner.judge(sc, runner.without_final_backward(sc), expect_no_exception=True)


def test_corpus_covers_every_kind():
    kinds = {runner.load(str(p)).kind for p in FILES}
    assert kinds >= set(runner.PROBLEM_KINDS) | {None}


def test_official_checker_script():
    """The project's contract as the shared tool checks it, in fresh processes."""
    script = shared_file("tools/check_scenarios.py")
    env = dict(os.environ, SCENARIO_PYTHON=sys.executable)
    corpora = [str(c) for c in (SHARED_SCENARIOS, SHARED_ERROR_SCENARIOS) if c.is_dir()]
    proc = subprocess.run([sys.executable, str(script), "--predict", *corpora],
                          capture_output=True, text=True, env=env, timeout=900)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0 and " 0 failed" in last, proc.stdout[-3000:] + proc.stderr[-2000:]
