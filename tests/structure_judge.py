"""Oracles from plain PyTorch for the programs of structure_programs.py, and the verdict on what
the tool said about them (for tests/test_differential_structure.py).

Each program runs up to four times:
- plain: the outcome (exception, its traceback lines, warnings, every value left in the program's
  namespace: parameters, gradients, optimizer state, kept tensors and numbers);
- captured, under jupyter_autograd.capture(): the outcome must be identical, and the diagnoses are
  judged against what the other runs say;
- observed (only when plain raised nothing): the same program with a probe at the end of every
  iteration and Tensor.backward wrapped, to read the graph: which grad_fn nodes each kept tensor
  reaches through `next_functions`, which nodes each backward ran, which parameters an op used
  with grad enabled (a TorchFunctionMode) and which got a gradient;
- reference (only when plain raised nothing): every saved tensor cloned when it is saved
  (saved_tensors_hooks) and every `.data =` swap made a copy, so the gradients are those of the
  values the forward actually used.

What the tool must say, from those runs alone:
- plain raised: the kind that matches PyTorch's message (ERRORS), at a line the generator marked
  as a right culprit for it, and nothing else;
- else: silent-data-mutation <=> the reference values differ; accumulated-graph <=> a kept tensor
  (grouped by where it is kept: a list counts as one holder) reaches more nodes after the last
  iteration than after the first, among them nodes a backward of an earlier iteration ran;
  graph-cut <=> a backward ran from a root that reaches no parameter the optimizer holds;
  otherwise missing-grad <=> a parameter the optimizer holds, that requires grad and that an op
  used with grad enabled, never had a `.grad` after a backward; saved-tensor-modified <=> a graph
  still kept that no backward ran would raise "modified by an inplace operation" if one did;
  nan-gradient <=> a gradient is not finite.
"""
from __future__ import annotations

import itertools
import linecache
import math
import traceback
import types
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode

import jupyter_autograd as ja

from .structure_programs import Program

# PyTorch's message -> the kind the tool must give (first match wins).
ERRORS = [
    ("modified by an inplace operation", "saved-tensor-modified"),
    ("a leaf Variable that requires grad", "leaf-inplace"),
    ("arguments don't support automatic differentiation", "leaf-inplace"),
    ("is a view and is being modified inplace", "view-inplace"),
    ("A view was created in no_grad mode", "view-inplace"),
    ("A view was created in inference mode", "view-inplace"),
    ("Inference tensors cannot be saved for backward", "inference-tensor-saved"),
    ("you can only change requires_grad flags of leaf variables", "nonleaf-requires-grad"),
    ("grad can be implicitly created only for scalar outputs", "nonscalar-backward"),
    ("returned an invalid gradient", "invalid-gradient"),
    ("returned an incorrect number of gradients", "invalid-gradient"),
    ("is not implemented", "not-differentiable"),
    ("backward through the graph a second time", "graph-freed"),
    ("does not require grad and does not have a grad_fn", "graph-cut"),
]
_BACKWARD = torch.Tensor.backward
_FILES = itertools.count()


class GeneratorError(Exception):
    """A program failed in a way no oracle covers: a bug of the generator, not of the tool."""


# ----------------------------------------------------------------------------------------------
# Reading what a program left behind


def _reachable(roots: Dict[str, object]):
    """(path, value) for every tensor and plain number reachable from `roots` through containers,
    objects' attributes, modules, optimizers' state and closures. Deterministic order."""
    seen: Set[int] = set()
    stack = [(name, value) for name, value in reversed(list(roots.items()))
             if not name.startswith("_")]
    while stack:
        path, value = stack.pop()
        if isinstance(value, torch.Tensor):
            yield path, value
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            yield path, value
            continue
        if id(value) in seen or isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType)):
            continue
        seen.add(id(value))
        if isinstance(value, (list, tuple)):
            items = [("%s[%d]" % (path, i), item) for i, item in enumerate(value)]
        elif isinstance(value, dict):
            items = [("%s[%r]" % (path, k) if isinstance(k, (str, int)) else "%s[#%d]" % (path, i), item)
                     for i, (k, item) in enumerate(value.items())]
        elif isinstance(value, torch.optim.Optimizer):
            items = [("%s.state[%d]" % (path, i), s) for i, s in enumerate(value.state.values())]
        elif isinstance(value, types.FunctionType):
            cells = value.__closure__ or ()
            items = [("%s.<%s>" % (path, name), cell.cell_contents)
                     for name, cell in zip(value.__code__.co_freevars, cells) if _filled(cell)]
        elif isinstance(value, torch.nn.Module):
            items = [("%s.%s" % (path, k), item) for k, item in vars(value).items()
                     if k in ("_parameters", "_buffers", "_modules") or not k.startswith("_")]
        elif hasattr(value, "__dict__"):
            items = [("%s.%s" % (path, k), item) for k, item in vars(value).items()]
        else:
            continue
        stack.extend(reversed(items))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def snapshot(roots: Dict[str, object]) -> Dict[str, object]:
    """Every value the program left: tensors as (dtype, shape, requires_grad, values), and the
    gradients of leaves."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path, value in _reachable(roots):
            if isinstance(value, torch.Tensor):
                out[path] = _tensor_value(value)
                if value.is_leaf and value.grad is not None:
                    out[path + ".grad"] = _tensor_value(value.grad)
            else:
                out[path] = value
    return out


def _tensor_value(t: torch.Tensor):
    return (str(t.dtype), tuple(t.shape), t.requires_grad, t.detach().reshape(-1).tolist())


def _same_number(a, b, exact: bool) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if exact or math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= 1e-6 + 1e-5 * abs(b)
    return a == b


def same_values(a: Dict[str, object], b: Dict[str, object], exact: bool) -> Optional[str]:
    """None if equal, else the first path that differs."""
    if a.keys() != b.keys():
        return "paths differ: %s" % sorted(set(a) ^ set(b))[:5]
    for path in a:
        x, y = a[path], b[path]
        if isinstance(x, tuple) and isinstance(y, tuple):
            if x[:3] != y[:3] or len(x[3]) != len(y[3]) or \
                    not all(_same_number(p, q, exact) for p, q in zip(x[3], y[3])):
                return path
        elif not _same_number(x, y, exact):
            return path
    return None


# ----------------------------------------------------------------------------------------------
# Running


@dataclass
class Run:
    namespace: Dict[str, object]
    error: Optional[Tuple[str, str]] = None          # (type name, message)
    error_lines: Tuple[int, ...] = ()                 # the program's lines in its traceback
    in_backward: bool = False                         # raised inside a backward call
    warnings: List[Tuple[str, str, int]] = field(default_factory=list)
    values: Dict[str, object] = field(default_factory=dict)
    trace: object = None
    capture_error: Optional[str] = None               # the capture itself failed


def execute(program: Program, variant: str, filename: str, captured: bool = False,
            observer: "Observer" = None) -> Run:
    source = program.source(variant)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec")
    ns: Dict[str, object] = {"__name__": "__main__"}
    if observer is not None:
        ns["_probe"] = observer.probe
        observer.globals = ns
    run = Run(ns)
    grad_mode, warn_always = torch.is_grad_enabled(), torch.is_warn_always_enabled()
    torch.manual_seed(0)
    # Some of PyTorch's C++ warnings (float() of a tensor that requires grad) are given once per
    # process: without this, only the first of the runs compared would see them.
    torch.set_warn_always(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if captured:
                with ja.capture() as run.trace:
                    exec(code, ns)
            elif variant == "reference":
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
                    exec(code, ns)
            elif observer is not None:
                with observer:
                    exec(code, ns)
            else:
                exec(code, ns)
        except Exception as e:  # the program's own outcome, compared and judged
            run.error = (type(e).__name__, str(e))
            frames = traceback.extract_tb(e.__traceback__)
            run.error_lines = tuple(f.lineno for f in frames if f.filename == filename)
            run.in_backward = any(f.name in ("backward", "_engine_run_backward") and "torch" in f.filename
                                  for f in frames)
        finally:
            torch.set_grad_enabled(grad_mode)
            torch.set_warn_always(warn_always)
    run.warnings = [(w.category.__name__, str(w.message), w.lineno if w.filename == filename else 0)
                    for w in caught]
    run.values = snapshot(ns)
    return run


# ----------------------------------------------------------------------------------------------
# The observed run: graph growth, used parameters, gradients


def graph_nodes(roots) -> Dict[int, object]:
    """grad_fn nodes reachable from `roots` through next_functions, by id (the dict keeps them
    alive, so an id stays theirs)."""
    found: Dict[int, object] = {}
    stack = [r for r in roots if r is not None]
    while stack:
        node = stack.pop()
        if id(node) in found:
            continue
        found[id(node)] = node
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return found


def _is_accumulate(node) -> bool:
    return type(node).__name__ == "AccumulateGrad"


def _holder(path: str) -> str:
    """Where a tensor is kept, with list positions folded: a list that grows is one holder."""
    out, depth = [], 0
    for ch in path:
        if ch == "[":
            depth += 1
        if depth and ch.isdigit():
            continue
        if ch == "]":
            depth -= 1
        out.append(ch)
    return "".join(out)


def _tensors(value):
    for item in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(item, torch.Tensor):
            yield item


class _UsedWithGrad(TorchFunctionMode):
    """Records the leaves that require grad which an op took to make a result with a grad_fn:
    the uses through which a gradient could reach them (not `p.dim()`, not an op under no_grad)."""

    def __init__(self, used: Dict[int, torch.Tensor]):
        super().__init__()
        self.used = used

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if any(out.grad_fn is not None for out in _tensors(result)):
            for value in itertools.chain(args, kwargs.values()):
                for t in _tensors(value):
                    if t.is_leaf and t.requires_grad:
                        self.used[id(t)] = t
        return result


class Observer:
    def __init__(self):
        self.used: Dict[int, torch.Tensor] = {}
        self.had_grad: Set[int] = set()
        self.backward_roots_reach: List[Set[int]] = []   # per backward that ran: ids of leaves it reaches
        self.backpropagated: Dict[int, object] = {}      # every node a backward ran
        self.probes: List[Dict[str, Dict[int, object]]] = []
        self.backpropagated_at_probe: List[Set[int]] = []
        self._mode = _UsedWithGrad(self.used)
        self.globals: Dict[str, object] = {}   # the program's namespace, set by execute()

    def __enter__(self):
        observer = self

        def backward(tensor, *args, **kwargs):
            with torch._C.DisableTorchFunction():  # the mode would send Tensor.backward here again
                nodes = graph_nodes([tensor.grad_fn])
                _BACKWARD(tensor, *args, **kwargs)
            observer.backpropagated.update(nodes)
            observer.backward_roots_reach.append(
                {id(n.variable) for n in nodes.values() if _is_accumulate(n)})
            observer.had_grad.update(k for k, t in observer.used.items() if t.grad is not None)

        torch.Tensor.backward = backward
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        torch.Tensor.backward = _BACKWARD
        return False

    def probe(self, scope: dict) -> None:
        """At the end of an iteration: the nodes each kept tensor reaches, by holder."""
        held: Dict[str, Dict[int, object]] = {}
        with torch._C.DisableTorchFunction(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            roots = dict(self.globals)
            if scope is not self.globals:  # inside a function: its locals too
                roots.update({"local " + k: v for k, v in scope.items()})
            for path, value in _reachable(roots):
                if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                    held.setdefault(_holder(path), {}).update(graph_nodes([value.grad_fn]))
        self.probes.append(held)
        self.backpropagated_at_probe.append(set(self.backpropagated))

    def accumulated(self) -> List[str]:
        """Holders whose graph grew from the first iteration to the last through nodes that a
        backward of an earlier iteration ran."""
        if len(self.probes) < 2:
            return []
        first, last, ran_before = self.probes[0], self.probes[-1], self.backpropagated_at_probe[-2]
        return [holder for holder, nodes in last.items()
                if len(nodes) > len(first.get(holder, {}))
                and any(k in ran_before and not _is_accumulate(n) for k, n in nodes.items())]


def stale_graph_left(values_ns: Dict[str, object], observer: Observer) -> bool:
    """Would a backward from a kept tensor whose graph no backward ran raise "modified by an
    inplace operation"? (What the tool predicts at the block's end.) Run last: it changes .grad."""
    for path, value in list(_reachable(values_ns)):
        if isinstance(value, torch.Tensor) and value.grad_fn is not None and value.is_floating_point() \
                and id(value.grad_fn) not in observer.backpropagated:
            try:
                _BACKWARD(value.sum(), retain_graph=True)
            except RuntimeError as e:
                if "modified by an inplace operation" in str(e):
                    return True
    return False


def optimizer_parameters(ns: Dict[str, object]) -> List[torch.Tensor]:
    params, seen = [], set()
    stack = [v for k, v in ns.items() if not k.startswith("_")]
    objects = set()
    while stack:
        value = stack.pop()
        if id(value) in objects:
            continue
        objects.add(id(value))
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
        elif hasattr(value, "__dict__") and not isinstance(value, (types.ModuleType, type, types.FunctionType,
                                                                    torch.nn.Module, torch.Tensor)):
            stack.extend(vars(value).values())
    return params


# ----------------------------------------------------------------------------------------------
# The verdict


@dataclass
class Verdict:
    program: Program
    expected: Set[str]
    said: List[Tuple[str, Optional[int], Optional[str]]]    # (kind, line, tensor)
    mismatches: List[Tuple[str, str]]                         # (class key, detail)
    plain_error: Optional[Tuple[str, str]]
    report: str = ""
    facts: Dict[str, object] = field(default_factory=dict)

    def message(self) -> str:
        lines = ["%s: %s" % m for m in self.mismatches]
        lines += ["program: " + self.program.summary(),
                  "PyTorch: %s" % (("raised %s: %s" % self.plain_error) if self.plain_error else "raised nothing"),
                  "expected: %s" % (sorted(self.expected) or "no problem"),
                  "culprit lines: %s" % {k: sorted(self.program.culprit_lines(k)) for k in sorted(self.expected)},
                  "said: %s" % (self.said or "nothing"),
                  "facts: %s" % self.facts,
                  self.program.listing(), "--- the tool's report ---", self.report]
        return "\n".join(lines)


def expected_for_error(run: Run) -> str:
    message = run.error[1]
    for words, kind in ERRORS:
        if words in message:
            return kind
    if run.in_backward:
        return "backward-error"
    raise GeneratorError("the program raised an error no oracle covers: %s: %s" % run.error)


def judge(program: Program) -> Verdict:
    """The captured run against the plain one, and the diagnoses against the oracles."""
    filename = "<structure-%d>" % next(_FILES)
    try:
        plain, expected, facts = _oracle(program, filename)
        captured = execute(program, "plain", filename, captured=True)
        return _verdict(program, filename, plain, captured, expected, facts)
    finally:
        linecache.cache.pop(filename, None)


def expected_kinds(program: Program) -> Set[str]:
    """What the tool must say about a program, from plain PyTorch alone."""
    filename = "<structure-%d>" % next(_FILES)
    try:
        return _oracle(program, filename)[1]
    finally:
        linecache.cache.pop(filename, None)


def _oracle(program: Program, filename: str) -> Tuple[Run, Set[str], Dict[str, object]]:
    plain = execute(program, "plain", filename)
    facts: Dict[str, object] = {}
    if plain.error is not None:
        return plain, {expected_for_error(plain)}, facts
    expected: Set[str] = set()
    observer = Observer()
    observed = execute(program, "observed", filename, observer=observer)
    if observed.error is not None:
        raise GeneratorError("the observed run raised %s where the plain run did not" % (observed.error,))
    params = optimizer_parameters(observed.namespace)
    param_ids = {id(p) for p in params}
    cut_roots = [reach for reach in observer.backward_roots_reach if not reach & param_ids]
    missing = [p for p in params if p.requires_grad and id(p) in observer.used and id(p) not in observer.had_grad]
    accumulated = observer.accumulated()
    facts.update(accumulated=accumulated, missing=len(missing), cut_roots=len(cut_roots))
    if cut_roots:
        expected.add("graph-cut")
    elif missing and observer.backward_roots_reach:
        expected.add("missing-grad")
    if accumulated:
        expected.add("accumulated-graph")
    if any(path.endswith(".grad") and any(isinstance(v, float) and not math.isfinite(v) for v in value[3])
           for path, value in plain.values.items()):
        expected.add("nan-gradient")
    reference = execute(program, "reference", filename)
    if reference.error is not None:
        raise GeneratorError("the reference run raised %s where the plain run did not" % (reference.error,))
    silent = same_values(plain.values, reference.values, exact=False)
    facts["reference differs at"] = silent
    if silent is not None:
        expected.add("silent-data-mutation")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if stale_graph_left(observed.namespace, observer):
            expected.add("saved-tensor-modified")
    return plain, expected, facts


def _verdict(program: Program, filename: str, plain: Run, captured: Run, expected: Set[str],
             facts: Dict[str, object]) -> Verdict:
    mismatches: List[Tuple[str, str]] = []
    # The captured run is the plain run.
    if (captured.error, captured.error_lines) != (plain.error, plain.error_lines):
        mismatches.append(("outcome changed", "plain %s at %s, captured %s at %s" % (
            plain.error, plain.error_lines, captured.error, captured.error_lines)))
    if captured.warnings != plain.warnings:
        mismatches.append(("outcome changed", "warnings: plain %s, captured %s" % (plain.warnings, captured.warnings)))
    differs = same_values(plain.values, captured.values, exact=True)
    if differs is not None:
        mismatches.append(("outcome changed", "values differ at %s" % differs))
    try:
        diagnoses = list(captured.trace.diagnoses)
        report = captured.trace.report()
        tool_warnings = list(captured.trace.warnings)
    except Exception as e:  # the tool's own failure is a disagreement like any other
        diagnoses, report, tool_warnings = [], "", []
        mismatches.append(("tool failed", "%s: %s" % (type(e).__name__, e)))
    if tool_warnings:
        mismatches.append(("tool warned", "; ".join(tool_warnings)))

    said = [(d.kind, d.line, d.tensor) for d in diagnoses]
    kinds = {d.kind for d in diagnoses}
    for kind in sorted(expected - kinds):
        mismatches.append(("missed " + kind, "PyTorch says %s, the tool says nothing of that kind" % kind))
    for kind in sorted(kinds - expected):
        mismatches.append(("false " + kind, "the tool says %s, PyTorch does not" % kind))
    for kind in sorted(expected & kinds):
        right = program.culprit_lines(kind)
        wrong = [d.line for d in diagnoses if d.kind == kind and
                 (d.line is None or d.filename != filename or (right and d.line not in right))]
        if wrong:
            mismatches.append(("wrong line " + kind, "said at line %s, the culprit is at %s" % (wrong, sorted(right))))
    return Verdict(program, expected, said, mismatches, plain.error, report, facts)


# ----------------------------------------------------------------------------------------------
# Many programs, none stopping the others


@dataclass
class Sweep:
    seed: int
    programs: int = 0
    fine: int = 0
    failing: int = 0
    cpu_seconds: float = 0.0
    kinds: Dict[str, int] = field(default_factory=dict)          # expected kind -> programs
    disagreements: Dict[str, int] = field(default_factory=dict)  # class of disagreement -> programs
    smallest: Dict[str, Verdict] = field(default_factory=dict)   # class -> its smallest program's verdict

    def add(self, verdict: Verdict, classify) -> None:
        self.programs += 1
        self.fine += not verdict.expected
        self.failing += bool(verdict.mismatches)
        for kind in verdict.expected:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
        for name in {classify(verdict, key, detail) for key, detail in verdict.mismatches}:
            self.disagreements[name] = self.disagreements.get(name, 0) + 1
            if name not in self.smallest or len(verdict.program.lines) < len(self.smallest[name].program.lines):
                self.smallest[name] = verdict

    def summary(self) -> str:
        lines = ["seed %d: %d programs (%d fine) in %.1f s of CPU; %d disagree with PyTorch" % (
            self.seed, self.programs, self.fine, self.cpu_seconds, self.failing),
            "  expected: " + ", ".join("%s %d" % kv for kv in sorted(self.kinds.items()))]
        by_count = sorted(self.disagreements.items(), key=lambda kv: (-kv[1], kv[0]))
        lines += ["  %5d  %s" % (n, name) for name, n in by_count]
        return "\n".join(lines)


def sweep(seed: int, programs: int, classify=lambda verdict, key, detail: key) -> Sweep:
    """`programs` random programs drawn with the generator's weights, each judged."""
    import random
    import time

    from .structure_programs import random_program

    rng = random.Random(seed)
    result = Sweep(seed)
    started = time.process_time()
    for _ in range(programs):
        result.add(judge(random_program(rng)), classify)
    result.cpu_seconds = time.process_time() - started
    return result


def survey(seeds: List[int], programs: int, show: str, out) -> Dict[str, int]:
    """Sweeps with each seed; prints each, then the classes of all (failure_class) with their
    counts, and the smallest program of the classes whose name contains `show`."""
    total: Dict[str, int] = {}
    smallest: Dict[str, Verdict] = {}
    for s in seeds:
        result = sweep(s, programs, failure_class)
        print(result.summary(), file=out, flush=True)
        for name, n in result.disagreements.items():
            total[name] = total.get(name, 0) + n
            if name not in smallest or len(result.smallest[name].program.lines) < len(smallest[name].program.lines):
                smallest[name] = result.smallest[name]
    print("all seeds:", file=out)
    for name, n in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])):
        print("  %5d  %s" % (n, name), file=out)
    for name in sorted(total):
        if show and show in name:
            print("\n=== %s\n%s" % (name, smallest[name].message()), file=out)
    return total


NEW_KINDS = ("view-inplace", "inference-tensor-saved", "nonleaf-requires-grad", "nonscalar-backward",
             "not-differentiable", "invalid-gradient", "backward-error")
GRAD_MODE_CUTS = ("torch.no_grad()", "set_grad_enabled(False) block", "set_grad_enabled helpers", "inference_mode()")
HELPERS = ("closure", "helper method", "helper function")


def failure_class(verdict: Verdict, key: str, detail: str) -> str:
    """The principle a disagreement belongs to, read off the program's description (for the
    survey's counts; the test itself fails on every disagreement). A disagreement no principle
    below covers is shown with its key and its feature's description."""
    d = verdict.program.description
    family = d.get("family")
    get = lambda label: str(d.get(label, ""))  # noqa: E731
    if key.startswith("missed ") and key[len("missed "):] in NEW_KINDS:
        return "%s: no rule yet for this new kind" % key
    appended = "list" in get("accumulate.in") or get("accumulate.helper") == "list keeper" or get("carry.in") == "list"
    if key == "missed accumulated-graph" and appended:
        return "missed accumulated-graph: tensors kept by appending them to a list (a list, a dict of lists, " \
               "a helper's list, a carried state appended each step) are not seen"
    if key == "missed accumulated-graph" and family == "carry" and "retain_graph" in get("carry.backward"):
        return "missed accumulated-graph: a carried state that every backward(retain_graph=True) runs again " \
               "is seen only from the 4th iteration"
    if key == "wrong line accumulated-graph" and family == "carry":
        return "wrong line accumulated-graph: a retained carried state is also named at the line before it, " \
               "whose result is not carried (z = self.enc(x))"
    if key == "missed silent-data-mutation" and get("write.spelling").startswith((".data =", ".data swapped")):
        return "missed silent-data-mutation: a `.data =` assignment (the memory under a saved tensor swapped, " \
               "or swapped for a forward and restored) is not seen"
    if key == "false missing-grad" and get("cut.spelling") in GRAD_MODE_CUTS and get("cut.where") == "encoder output":
        return "false missing-grad: a parameter used only with grad off (no_grad, set_grad_enabled(False), " \
               "inference_mode) is said to be starved"
    rebuilt_leaf = get("cut.spelling") == ".item() rebuilt with requires_grad"
    if key in ("false missing-grad", "missed graph-cut") and rebuilt_leaf:
        return "graph-cut called missing-grad: a loss rebuilt as a new leaf, " \
               "torch.tensor(loss.item(), requires_grad=True)"
    if key == "wrong line graph-cut" and "left off" in get("cut.spelling"):
        return "wrong line graph-cut: grad mode switched off by set_grad_enabled(False) in a helper and left " \
               "off is named at an op that later ran without grad, not at that call"
    if key == "missed missing-grad" and get("cut.spelling") == "torch.max index":
        return "missed missing-grad: indices from torch.max(y, 1)[1] fed on are not seen as a cut (argmax is)"
    if key in ("missed missing-grad", "wrong line graph-cut") and get("cut.spelling") == "from_numpy" \
            and get("cut.by") in HELPERS:
        return "cut not seen: a torch.from_numpy round trip inside a helper (function, method, closure); " \
               "missing-grad missed, graph-cut named at a later line"
    if key == "missed leaf-inplace" and get("write.spelling") == "out=":
        return "missed leaf-inplace: an out= write into a parameter outside no_grad"
    if key == "outcome changed" and detail.startswith("warnings"):
        return "outcome changed: a warning the program raises (float() of a tensor that requires grad) " \
               "is swallowed by the capture"
    detail_of = {k: v for k, v in d.items() if k.startswith(str(family) + ".")}
    return "%s | unclassified: %s %s" % (key, family, ", ".join("%s=%s" % (k.split(".", 1)[1], v)
                                                               for k, v in detail_of.items()))
