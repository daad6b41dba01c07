"""Run annotated scenario files in-process: plain, then under capture(); compare and judge.

Same format and the same checks as ../shared/tools/check_scenarios.py (see DOMAIN.md), so our own
scenarios in tests/scenarios/ and the shared corpus are held to one standard.
"""
from __future__ import annotations

import ast
import re
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

import torch

import jupyter_autograd as ja

from jupyter_autograd.model import PROBLEM_KINDS  # noqa: E402
PREDICTABLE = {"saved-tensor-modified", "silent-data-mutation"}


@dataclass
class Scenario:
    path: str
    source: str
    kind: Optional[str]
    tensor: Optional[str]
    outcome: List[str]
    culprit: Optional[int]
    saved: Set[int] = field(default_factory=set)
    options: Dict[str, object] = field(default_factory=dict)  # `# capture: NAME=VALUE ...`


def load(path: str) -> Scenario:
    src = open(path).read()
    expect, outcome, culprit, saved = None, None, None, set()
    for i, line in enumerate(src.splitlines(), 1):
        m = re.match(r"#\s*expect:\s*(.*)", line)
        if m:
            expect = m.group(1).split()
        m = re.match(r"#\s*outcome:\s*(.*)", line)
        if m:
            outcome = m.group(1).split()
        if "# @" in line:
            tags = line.split("# @", 1)[1]
            if "culprit" in tags:
                culprit = i
            if "saved" in tags:
                saved.add(i)
    kind = None if not expect or expect[0] == "none" else expect[0]
    opts = dict(x.split("=", 1) for x in (expect or [])[1:] if "=" in x)
    options = {}
    m = re.search(r"^#\s*capture:\s*(.*)$", src, re.M)
    if m:
        options = {k: ast.literal_eval(v) for k, v in (x.split("=", 1) for x in m.group(1).split() if "=" in x)}
    return Scenario(path, src, kind, opts.get("tensor"), outcome or [], culprit, saved, options)


def without_final_backward(sc: Scenario) -> Optional[str]:
    lines = sc.source.splitlines()
    keep = [l for i, l in enumerate(lines, 1)
            if not (i > (sc.culprit or 0) and not l[:1].isspace() and ".backward(" in l)]
    return "\n".join(keep) + "\n" if len(keep) < len(lines) else None


def grads(ns: dict) -> Dict[str, list]:
    out, seen = {}, set()

    def put(name, t):
        if isinstance(t, torch.Tensor) and t.is_leaf and t.grad is not None and id(t) not in seen:
            seen.add(id(t))
            out[name] = t.grad.detach().reshape(-1).tolist()

    for k, v in list(ns.items()):
        put(k, v)
        if isinstance(v, torch.nn.Module):
            for pn, p in v.named_parameters():
                put(k + "." + pn, p)
    return out


def execute(source: str, filename: str, captured: bool, options: Optional[dict] = None):
    torch.manual_seed(1234)
    ns = {"__name__": "__main__", "__file__": filename}
    code = compile(source, filename, "exec")
    exc, trace = None, None
    try:
        if captured:
            with ja.capture(**(options or {})) as trace:
                exec(code, ns)
        else:
            exec(code, ns)
    except Exception as e:  # the scenario's own outcome, compared below
        exc = (type(e).__name__, str(e))
        let_collectives_finish(source)
    return exc, grads(ns), trace


def let_collectives_finish(source: str) -> None:
    """Plain PyTorch deadlocks, now and then, when a program's DDP reducer is freed (with the exception
    that holds it) right after the program destroyed its process group while a gloo worker thread
    still finishes a collective: the worker waits for the GIL to release the work's thread-local
    state, and the main thread holds the GIL while the group's destructor joins that worker. Let the
    workers run before the exception goes (it hung 1 run in 5 of a raising DDP scenario, plain)."""
    if "torch.distributed" in source:
        time.sleep(0.05)


def close(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(
        len(a[k]) == len(b[k]) and all(same_number(x, y) for x, y in zip(a[k], b[k])) for k in a)


def same_number(x: float, y: float) -> bool:
    """Equal within float noise; two NaNs, or two infinities of one sign, count as equal."""
    if x != x or y != y:
        return x != x and y != y
    if abs(x) == float("inf") or abs(y) == float("inf"):
        return x == y
    return abs(x - y) <= 1e-6 * (1 + abs(y))


def judge(sc: Scenario, source: Optional[str] = None, expect_no_exception: bool = False) -> str:
    """Raise AssertionError with a reason, or return a short description of what was found."""
    source = source or sc.source
    plain_exc, plain_grads, _ = execute(source, sc.path, captured=False)
    exc, got_grads, trace = execute(source, sc.path, captured=True, options=sc.options)
    assert exc == plain_exc, "capture changed the outcome: plain=%s captured=%s" % (plain_exc, exc)
    assert close(got_grads, plain_grads), "capture changed the gradients"
    if expect_no_exception:
        assert exc is None, "without backward it still raised %s" % (exc,)
    assert not trace.warnings, "internal warnings: %s" % trace.warnings
    problems = [d for d in trace.diagnoses if d.kind in PROBLEM_KINDS]
    if sc.kind is None:
        assert not problems, "false alarm: %s" % [(d.kind, d.line, d.tensor) for d in problems]
        return "none"
    others = [d for d in problems if d.kind != sc.kind]
    assert not others, "also reported %s" % [(d.kind, d.line) for d in others]
    for d in problems:
        if d.line == sc.culprit and d.filename == sc.path and (not sc.saved or d.saved_line in sc.saved) \
                and (sc.tensor is None or d.tensor == sc.tensor):
            assert d.message and d.fix, "diagnosis without message or fix"
            return "%s at line %s" % (d.kind, d.line)
    raise AssertionError("wanted %s@%s(saved@%s, %s); got %s" % (
        sc.kind, sc.culprit, sorted(sc.saved), sc.tensor,
        [(d.kind, d.line, d.saved_line, d.tensor) for d in problems]))
