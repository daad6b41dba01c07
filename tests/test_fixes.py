"""Every fix a diagnosis suggests is code that runs (the convention is in jupyter_autograd/diagnose/fixes/__init__.py).

Over every scenario of both shared corpora and ours: each code block of each fix compiles, uses
only names the user's program has (or torch, nn, F), and names only methods that exist. Where
the fix is a drop-in replacement of the culprit line, it is applied to the scenario: the problem
is then gone, and backward gives the gradients of the clean program, which for each kind is
made independently of the fix text:

* saved-tensor-modified: the program itself, each tensor copied when autograd saves it
  (`torch.autograd.graph.saved_tensors_hooks`: backward sees the saved values). PyTorch's own
  remedy, `allow_mutation_on_saved_tensors()`, is meant for one forward and backward: over a
  training loop it gives a second step the copy made in the first while that graph is alive
  (a MoCo queue written each step: other gradients than the write moved after the backward);
* silent-data-mutation: the same, with `.data` taken as `.detach()` so PyTorch sees the write;
* leaf-inplace: the culprit line run with grad mode off (`torch.set_grad_enabled(False)`);
* accumulated-graph: the program itself (keeping the graphs alive changes no gradient).

A kind with no clean program here (the ones added later) still has to run without an exception
and without the problem, and give finite gradients (or, with torch.autograd.grad, finite results).
"""
import ast
import builtins
import math
import os
import pathlib
import re
import textwrap

import pytest
import torch
from torch import nn

import jupyter_autograd as ja
from jupyter_autograd.diagnose import fixes
from jupyter_autograd.source import rewrites
from jupyter_autograd.model import PROBLEM_KINDS

from . import scenario_runner as runner
from .conftest import OWN_SCENARIOS, scenario_files

FILES = scenario_files()
_RUNS = {}


def captured(path):
    """The scenario and its captured run, once per file for this module."""
    if path not in _RUNS:
        sc = runner.load(str(path))
        exc, grads, trace = runner.execute(sc.source, sc.path, captured=True)
        _RUNS[path] = sc, exc, grads, trace
    return _RUNS[path]


# -- reading a fix by the convention -----------------------------------------------------------

def code_blocks(fix):
    """[(the prose line before the block, the block dedented)] for each run of 4-space lines."""
    blocks, intro, current = [], "", None
    for line in fix.splitlines():
        if line.startswith("    "):
            current = current if current is not None else []
            current.append(line)
            continue
        if current is not None:
            blocks.append((intro, textwrap.dedent("\n".join(current))))
            current = None
        intro = line
    if current is not None:
        blocks.append((intro, textwrap.dedent("\n".join(current))))
    return blocks


def replacement(fix):
    """The block that replaces the culprit line, or None when the fix is not a one-line change."""
    found = [block for intro, block in code_blocks(fix) if intro.rstrip().endswith(fixes.REPLACE)]
    assert len(found) <= 1, "two replacements of the same line:\n" + fix
    return found[0] if found else None


LINE_REPLACEMENT = re.compile(re.escape(fixes.REPLACE_LINE).replace("%d", r"(\d+)").replace("%s", "(.+)") + "$")


def line_replacement(fix):
    """(line, file label, block) of a fix that replaces a line other than the culprit, or None."""
    found = [(int(m.group(1)), m.group(2), block) for intro, block in code_blocks(fix)
             for m in [LINE_REPLACEMENT.search(intro.rstrip())] if m]
    assert len(found) <= 1, "two replacements in one fix:\n" + fix
    return found[0] if found else None


LINES_REPLACEMENT = re.compile(re.escape(fixes.REPLACE_LINES).replace("%d", r"(\d+)").replace("%s", "(.+)") + "$")


def lines_replacement(fix):
    """(first line, last line, file label, block) of a fix that replaces a run of lines, or None."""
    found = [(int(m.group(1)), int(m.group(2)), m.group(3), block) for intro, block in code_blocks(fix)
             for m in [LINES_REPLACEMENT.search(intro.rstrip())] if m]
    assert len(found) <= 1, "two replacements in one fix:\n" + fix
    return found[0] if found else None


def apply_fix(d, source, path):
    """The program with the fix's one-line change made, or None when the fix is not one."""
    block = replacement(d.fix)
    if block is not None and d.filename == str(path) and d.line:
        return _replace_line(source, d.line, block.splitlines())
    other = line_replacement(d.fix)
    if other is not None:
        line, label, block = other
        assert label == os.path.basename(str(path)), "%s: the fix replaces a line of %s" % (path, label)
        return _replace_line(source, line, block.splitlines())
    run_of_lines = lines_replacement(d.fix)
    if run_of_lines is not None:
        first, last, label, block = run_of_lines
        assert label == os.path.basename(str(path)), "%s: the fix replaces lines of %s" % (path, label)
        return _replace_line(source, first, block.splitlines(), last)
    return None


MODULES = {"torch": torch, "nn": nn, "F": torch.nn.functional}
# The dicts and lists user code keeps tensors in: a fix that rewrites the user's own line keeps its
# calls (`running[name] = (running.get(name, 0.0) + value).detach()`).
OWNERS = (torch.Tensor, nn.Module, torch.optim.Optimizer, dict, list)


def bound_names(source):
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add("." + node.attr)  # an attribute the program sets (`self.criterion = ...`): its own
    return names


def dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


def torch_imports(source):
    """alias -> dotted path for what the program imports from torch (`from torch import autograd`,
    `import torch.nn.functional as fn`): a fix may call them as the program does."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch" and not node.level:
            for alias in node.names:
                found[alias.asname or alias.name] = "%s.%s" % (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch" and alias.asname:
                    found[alias.asname] = alias.name
    return found


def check_module_path(parts, where):
    obj = MODULES[parts[0]]
    for i, part in enumerate(parts[1:], 1):
        assert hasattr(obj, part), "%s: `%s` does not exist" % (where, ".".join(parts[:i + 1]))
        obj = getattr(obj, part)


def check_method(name, where):
    assert any(callable(getattr(owner, name, None)) for owner in OWNERS), (
        "%s: no method `%s` on torch.Tensor, nn.Module, an optimizer, a dict or a list" % (where, name))


def check_code(block, user_names, where, imported=None):
    # A replacement for a line of a function may end it (`return output`): compile it as one.
    source = block if not re.search(r"^return\b", block, re.M) else "def _replaced():\n" + textwrap.indent(block, "    ")
    try:
        tree = ast.parse(source)
        compile(source, "<fix>", "exec")
    except SyntaxError as e:
        raise AssertionError("%s: the fix's code does not compile (%s):\n%s" % (where, e, block))
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            assert node.id in user_names | assigned | set(MODULES) or hasattr(builtins, node.id), (
                "%s: the fix uses `%s`, which the program does not have:\n%s" % (where, node.id, block))
        if isinstance(node, ast.Attribute):
            parts = dotted(node)
            if parts and parts[0] in MODULES and parts[0] not in user_names - set(MODULES):
                check_module_path(parts, where)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            parts = dotted(node.func)
            if parts and parts[0] in (imported or {}) and parts[0] not in MODULES:  # `autograd.grad(...)`
                check_module_path(imported[parts[0]].split(".") + parts[1:], where)
            elif not (parts and parts[0] in MODULES) and "." + node.func.attr not in user_names:
                check_method(node.func.attr, where)


def check_prose(fix, where, user_names=frozenset()):
    """Names in backticks are real: `.item()`, `x.detach()`, `torch.autograd.graph....()`, or the
    program's own (a quoted line calling `self.main(x)`, an attribute the program sets)."""
    for span in re.findall(r"`([^`\n]+)`", fix):
        for chain in re.findall(r"(?<![\w.])((?:torch|nn|F)(?:\.\w+)+)", span):
            check_module_path(chain.split("."), where)
        for method in re.findall(r"(?<!torch)(?<!nn)(?<!\bF)\.(\w+)\(", span):
            if not re.search(r"(?:torch|nn|F)(?:\.\w+)*\.%s\(" % re.escape(method), span) and \
                    "." + method not in user_names:
                check_method(method, where)


def problems(trace):
    return [d for d in trace.diagnoses if d.kind in PROBLEM_KINDS]


# -- the clean program, per kind, made without the fix text ------------------------------------

def _replace_line(source, line, new_lines, last=None):
    lines = source.splitlines()
    indent = re.match(r"\s*", lines[line - 1]).group(0)
    lines[line - 1:last or line] = [indent + l if l else l for l in new_lines]
    return "\n".join(lines) + "\n"


def run(source, path, captured=False):
    """runner.execute, keeping the program's variables: (exception, gradients, tensors, trace).

    The tensors a program ends with are compared too: `torch.autograd.grad` leaves no `.grad`, and a
    training loop that ends with `zero_grad()` leaves none either, but its models' weights (and
    buffers) carry every step's gradients."""
    torch.manual_seed(1234)
    ns = {"__name__": "__main__", "__file__": str(path)}
    code = compile(source, str(path), "exec")
    exc, trace = None, None
    try:
        if captured:
            with ja.capture() as trace:
                exec(code, ns)
        else:
            exec(code, ns)
    except Exception as e:  # the program's own outcome, compared by the caller
        exc = (type(e).__name__, str(e))
        runner.let_collectives_finish(source)
    tensors = {k: v.detach().reshape(-1).tolist() for k, v in ns.items()
               if isinstance(v, torch.Tensor) and not k.startswith("_")}
    for k, v in list(ns.items()):
        if isinstance(v, nn.Module) and not k.startswith("_"):
            tensors.update(("%s.%s" % (k, n), t.detach().reshape(-1).tolist()) for n, t in v.state_dict().items())
    return exc, runner.grads(ns), tensors, trace


def saved_values_kept():
    """Backward sees the values the forward pass saved, whatever is written to them later."""
    return torch.autograd.graph.saved_tensors_hooks(lambda saved: saved.clone(), lambda copy: copy)


def _leaf_writes_unrecorded(sc, line):
    """The program with the culprit line, and every next line whose write into a leaf PyTorch then
    refuses too (the second of two edits of one weight), run with grad mode off."""
    source = sc.source
    for _ in range(20):
        stripped = source.splitlines()[line - 1].strip().split("#")[0].strip()
        # An `out=` call run with grad off also clears its out tensor's requires_grad (PyTorch's rule for
        # out=): the unrecorded write that keeps the leaf trainable goes through `.data`.
        stripped = re.sub(r"\bout=([\w.]+)", r"out=\1.data", stripped)
        source = _replace_line(source, line, ["torch.set_grad_enabled(False); %s; torch.set_grad_enabled(True)"
                                              % stripped])
        line = _line_refused_as_leaf_write(source, sc.path)
        if line is None:
            return source
    raise AssertionError(sc.path + ": too many writes into leaves")


LEAF_ERRORS = ("a leaf Variable that requires grad is being used in an in-place operation",
               "a view of a leaf Variable that requires grad is being used in an in-place operation")


def _line_refused_as_leaf_write(source, path):
    """The line of the program where PyTorch refuses a write into a leaf, or None."""
    torch.manual_seed(1234)
    try:
        exec(compile(source, str(path), "exec"), {"__name__": "__main__", "__file__": str(path)})
    except Exception as e:  # the program's own outcome
        if any(m in str(e) for m in LEAF_ERRORS):
            frames = [f for f in __import__("traceback").extract_tb(e.__traceback__) if f.filename == str(path)]
            return frames[-1].lineno if frames else None
    return None


def clean_source(sc, diag):
    """The program rewritten without the problem, where that is a rewrite of its text (not for a
    program that is its own clean program, run another way)."""
    if diag.kind == "silent-data-mutation":
        return re.sub(r"\.data\b", ".detach()", sc.source)
    if diag.kind == "leaf-inplace":
        return _leaf_writes_unrecorded(sc, diag.line)
    return None


def clean_run(sc, diag):
    """(exception, gradients, tensors) of the clean program, or None where there is none for the kind."""
    if diag.kind in ("saved-tensor-modified", "accumulated-graph"):
        source = sc.source
    elif diag.kind in ("silent-data-mutation", "leaf-inplace"):
        source = clean_source(sc, diag)
    else:
        return None
    if diag.kind in ("saved-tensor-modified", "silent-data-mutation"):
        with saved_values_kept():
            return run(source, sc.path)[:3]
    return run(source, sc.path)[:3]


# -- the tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", FILES, ids=[p.parent.name + "/" + p.name for p in FILES])
def test_every_fix_is_valid_code_naming_real_methods(path):
    sc, _, _, trace = captured(path)
    user_names = bound_names(sc.source)
    for d in problems(trace):
        where = "%s line %s (%s)" % (path.name, d.line, d.kind)
        assert d.fix.strip(), where + ": empty fix"
        check_prose(d.fix, where, user_names)
        for _, block in code_blocks(d.fix):
            check_code(block, user_names, where, torch_imports(sc.source))
        block = replacement(d.fix) or line_replacement(d.fix) or lines_replacement(d.fix)
        assert block is not None or fixes.NO_ONE_LINE_FIX in d.fix or d.filename != sc.path or not d.line or \
            not code_blocks(d.fix), "%s: code that is neither a replacement nor marked as no one-line fix:\n%s" % (
                where, d.fix)


ONE_LINE = []
for _path in FILES:
    _sc = runner.load(str(_path))
    if _sc.kind is not None:
        ONE_LINE.append(_path)


@pytest.mark.parametrize("path", ONE_LINE, ids=[p.parent.name + "/" + p.name for p in ONE_LINE])
def test_one_line_fix_removes_the_problem_and_gives_the_clean_gradients(path):
    sc, _, _, trace = captured(path)
    applied = 0
    for d in problems(trace):
        fixed = apply_fix(d, sc.source, sc.path)
        if fixed is None:
            continue  # not a one-line change (the fix says so): checked as code above
        exc, grads, tensors, after = run(fixed, sc.path, captured=True)
        # Each fix removes its own problem; another problem of the program, with a fix of its own, may
        # stay (known by its kind and its line's code: a fix of several lines moves the lines after it).
        def code_of(p, program, t):  # the program's own text: a trace of the same file name may read another
            lines = program.splitlines()
            text = lines[p.line - 1] if p.filename == sc.path and p.line and p.line <= len(lines) else \
                t.source_line(p.filename, p.line)
            return p.kind, text.strip()
        others = {code_of(p, sc.source, trace) for p in problems(trace)} - {code_of(d, sc.source, trace)}
        rewritten = clean_source(sc, d)
        # What the clean program, rewritten without the fix, has too is not the fix's doing: past a write
        # that raised, the program runs on into lines the tool had not seen run (known by kind and tensor).
        also_clean = {(p.kind, p.tensor) for p in problems(run(rewritten, sc.path, captured=True)[3])} \
            if rewritten is not None else set()
        assert {code_of(p, fixed, after) for p in problems(after) if (p.kind, p.tensor) not in also_clean} <= others, \
            "%s: after the fix still %s\n%s" % (
            path.name, [(p.kind, p.line) for p in problems(after)], fixed)
        # A program with several problems, each with a fix of its own (two residual `x +=` of one
        # block), still raises from the others: their fixes too, then the program is the clean one.
        for _ in range(len(others)):
            if exc is None or not problems(after):
                break
            refixed = apply_fix(problems(after)[0], fixed, sc.path)
            if refixed is None:
                break
            fixed = refixed
            exc, grads, tensors, after = run(fixed, sc.path, captured=True)
        clean = clean_run(sc, d)
        if clean is None:
            assert exc is None, "%s: the fixed program raises %s" % (path.name, exc)
            # Gradients taken by torch.autograd.grad leave no .grad: then what the program ends with, made
            # from them (an adversarial image), has to be there and finite.
            ends_with = grads or tensors
            assert ends_with and all(math.isfinite(v) for g in ends_with.values() for v in g), (
                "%s: the fixed program's gradients are missing or not finite: %s" % (path.name, ends_with))
        else:
            clean_exc, clean_grads, clean_tensors = clean
            assert exc == clean_exc, "%s: fixed program: %s; clean program: %s" % (path.name, exc, clean_exc)
            assert runner.close(grads, clean_grads), (
                "%s: the fix gives other gradients than the clean program:\nfixed %s\nclean %s\n%s"
                % (path.name, grads, clean_grads, fixed))
            # Without any .grad (torch.autograd.grad), compare what the programs end with. (With
            # them, a write meant only for an alias may differ: the fix keeps it off the saved tensor.)
            shared = set(tensors) & set(clean_tensors) if not clean_grads else set()
            assert grads or shared, path.name + ": nothing to compare"
            assert runner.close({k: tensors[k] for k in shared}, {k: clean_tensors[k] for k in shared}), (
                "%s: the fixed program ends with other values than the clean one:\nfixed %s\nclean %s"
                % (path.name, tensors, clean_tensors))
            # A fix that holds leaves no NaN or Inf where the clean program has none: in the gradients and in
            # every tensor both programs end with (the loss among them). A write moved to a copy can let a
            # masked -inf reach a loss that the in-place write kept out of it.
            for label, mine, theirs in (("gradient", grads, clean_grads), ("value", tensors, clean_tensors)):
                for key in set(mine) & set(theirs):
                    assert not (all(map(math.isfinite, theirs[key])) and not all(map(math.isfinite, mine[key]))), (
                        "%s: the fixed program's %s `%s` holds NaN/Inf; the clean program's is finite\n%s"
                        % (path.name, label, key, fixed))
        applied += 1
    if sc.kind in ("saved-tensor-modified", "leaf-inplace", "accumulated-graph") and applied == 0:
        # Say which scenarios have no one-line fix, so a change in that set is seen in review.
        assert path.name in NO_ONE_LINE_FIX_EXPECTED, "%s: no one-line fix any more:\n%s" % (
            path.name, "\n".join(d.fix for d in problems(trace)))


# Scenarios where no single line is the fix, and the fix text says so.
NO_ONE_LINE_FIX_EXPECTED = {
    "gan_step_between_backwards.py",      # the optimizer step must move, or the forward be run again
    "retained_history_in_recurrent_loop.py",  # a detach at the loop's start, and retain_graph dropped
    "losses_kept_in_a_list_then_stepped.py",  # every backward before the step, or a forward per step
    "losses_kept_in_a_trainer_history.py",    # the list that keeps them is not a recorded line
    "retained_totals_kept_in_a_list.py",      # the same: keep `.item()` where the list is filled
    "names_in_a_policy_gradient_loss.py",  # a write through a view is meant for its base: no copy of the view
    "gan_discriminator_stepped_before_generator_backward.py",  # the step must move, or the forward run again
    "sac_critic_stepped_before_policy_loss_backward.py",  # the same, an actor-critic's critic step
    # The state write stays; the copy belongs where the states are read, neither the culprit's line
    # nor the saving one.
    "stateful_lstm_assigns_states_it_saved.py",
}


def test_fixes_seen_cover_every_kind_that_was_diagnosed():
    kinds = {d.kind for path in FILES for d in problems(captured(path)[3])}
    assert {"leaf-inplace", "saved-tensor-modified", "silent-data-mutation", "accumulated-graph"} <= kinds


@pytest.mark.parametrize("method", sorted(n for n in dir(torch.Tensor) if n.endswith("_") and not n.startswith("_")))
def test_out_of_place_form_of_every_inplace_method_exists(method):
    for args in ("", "0", "z", "0, 1"):
        for line in ("y.%s(%s)" % (method, args), "out = y.%s(%s)" % (method, args)):
            rewritten = rewrites.out_of_place(line)
            if rewritten is None:
                continue
            check_code(rewritten, {"y", "z", "out"}, line)
            assert re.match(r"(out = )?y = ", rewritten), (line, rewritten)


def test_rewrites_compute_what_the_inplace_line_computed():
    torch.manual_seed(0)
    z = torch.randn(3)
    for line in ("y.zero_()", "y.fill_(2.5)", "y.copy_(z)", "y.add_(z)", "y.mul_(z)", "y += z", "y @= torch.eye(3)",
                 "y.clamp_(min=0)", "y[1:] = 0", "y *= z + 1", "y -= z - 1", "y **= 2", "y.masked_fill_(y > 0, 1.0)", "out = y.sub_(z)"):
        plain = {"torch": torch, "y": torch.randn(3), "z": z}
        fixed = dict(plain, y=plain["y"].clone())
        exec(line, plain)
        rewritten = rewrites.out_of_place(line) or rewrites.copy_before_write(line)
        assert rewritten, line
        exec(rewritten, fixed)
        assert torch.equal(plain["y"], fixed["y"]), (line, rewritten)
        if "out" in plain:
            assert torch.equal(plain["out"], fixed["out"]), (line, rewritten)


def test_sampling_rewrites_have_the_distribution_asked_for():
    y = torch.empty(200_000)
    ns = {"torch": torch, "y": y}
    exec(rewrites.out_of_place("y.normal_(3.0, 0.5)"), ns)
    assert abs(ns["y"].mean().item() - 3.0) < 0.01 and abs(ns["y"].std().item() - 0.5) < 0.01
    exec(rewrites.out_of_place("y.uniform_(-2, 4)"), ns)
    assert ns["y"].min() >= -2 and ns["y"].max() <= 4 and abs(ns["y"].mean().item() - 1.0) < 0.02


def test_no_rewrite_where_rebinding_would_change_the_meaning():
    # Rebinding a module's attribute, an element, or a call's result is not the in-place write.
    for line in ("net.weight.mul_(2)", "x[0].add_(1)", "f(x).zero_()", "self.h += 1", "y.random_()"):
        assert rewrites.out_of_place(line) is None, line


def test_allow_mutation_remedy_named_in_the_fix_gives_the_clean_gradients():
    """PyTorch's own remedy, as the fix words it, on a write that would make backward raise."""
    path = next(p for p in FILES if p.name == "09_exp_output_incremented.py") if any(
        p.name == "09_exp_output_incremented.py" for p in FILES) else OWN_SCENARIOS / "sigmoid_then_mul_inplace.py"
    sc, exc, _, trace = captured(path)
    assert exc is not None and exc[0] == "RuntimeError"
    (d,) = problems(trace)
    assert "torch.autograd.graph.allow_mutation_on_saved_tensors()" in d.fix
    with torch.autograd.graph.allow_mutation_on_saved_tensors():
        exc, grads, _ = runner.execute(sc.source, sc.path, captured=False)
    fixed = _replace_line(sc.source, d.line, replacement(d.fix).splitlines())
    assert exc is None and runner.close(grads, runner.execute(fixed, sc.path, captured=False)[1])


def test_a_parameter_fix_uses_code_not_its_dotted_name():
    assert rewrites.as_code("net.2.weight") == "net[2].weight"
    assert rewrites.as_code("encoder.layers.10.linear1.bias") == "encoder.layers[10].linear1.bias"
    assert "net[2].weight" in fixes.accumulation_fix("", "net.2.weight")


def _fix_of_write_in(source):
    """The fix of the one diagnosis of a program defined in a file of its own (its lines are read)."""
    path = pathlib.Path(__import__("tempfile").mkdtemp()) / "program.py"
    path.write_text(textwrap.dedent(source))
    namespace = {"__name__": "program"}
    with pytest.raises(RuntimeError):
        with ja.capture() as trace:
            exec(compile(path.read_text(), str(path), "exec"), namespace)
    [diagnosis] = trace.diagnoses
    return diagnosis.fix


def test_a_copy_of_an_argument_is_said_to_be_returned():
    fix = _fix_of_write_in("""
        import torch
        from torch import nn

        def ablate(module, inputs, output):
            output[:, :2] = 0

        model = nn.Sequential(nn.Linear(5, 6), nn.Sigmoid(), nn.Linear(6, 1))
        model[1].register_forward_hook(ablate)
        model(torch.randn(3, 5)).sum().backward()
    """)
    assert "    output = output.clone()\n    output[:, :2] = 0\n    return output\n" in fix  # the replacement
    assert "`output` is an argument of `ablate()`" in fix


def test_a_copy_of_an_argument_before_more_lines_is_no_one_line_fix():
    fix = _fix_of_write_in("""
        import torch
        from torch import nn

        def ablate(module, inputs, output):
            output[:, :2] = 0
            print("ablated")

        model = nn.Sequential(nn.Linear(5, 6), nn.Sigmoid(), nn.Linear(6, 1))
        model[1].register_forward_hook(ablate)
        model(torch.randn(3, 5)).sum().backward()
    """)
    assert fixes.NO_ONE_LINE_FIX in fix and "Return the copy" in fix and "`output` is an argument of `ablate()`" in fix


def test_a_copy_of_a_local_needs_no_return():
    fix = _fix_of_write_in("""
        import torch

        def forward(x, w):
            hidden = torch.sigmoid(x @ w)
            hidden[:, 0] = 0
            return hidden

        forward(torch.randn(2, 3), torch.randn(3, 4, requires_grad=True)).sum().backward()
    """)
    assert "hidden = hidden.clone()" in fix and "argument" not in fix and "return" not in fix


# -- fixes that keep the program's meaning ------------------------------------------------------

def _program(tmp_path, source, name="program.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path.read_text(), path


def _the_fix(source, path):
    """(the one problem's diagnosis, the program's outcome) of a captured run."""
    exc, grads, tensors, trace = run(source, path, captured=True)
    (d,) = problems(trace)
    return d, (exc, grads, tensors)


def _clean(source, path):
    """The program with backward seeing the values the forward pass saved."""
    with saved_values_kept():
        return run(source, path)[:3]


def _assert_same(fixed, clean, what):
    assert fixed[0] is None and clean[0] is None, (fixed[0], clean[0])
    assert runner.close(fixed[1], clean[1]), "%s: other gradients\nfixed %s\nclean %s" % (what, fixed[1], clean[1])
    shared = set(fixed[2]) & set(clean[2])
    assert runner.close({k: fixed[2][k] for k in shared}, {k: clean[2][k] for k in shared}), what


INPLACE_MODULE = """
    import torch
    from torch import nn


    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.gate = nn.Sigmoid()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            h = self.gate(self.fc(x))
            return self.act(h)


    torch.manual_seed(0)
    head = Head()
    head(torch.randn(2, 4)).sum().backward()
"""


def test_an_inplace_module_is_fixed_on_the_line_that_builds_it(tmp_path):
    source, path = _program(tmp_path, INPLACE_MODULE, "model.py")
    d, _ = _the_fix(source, path)
    assert d.kind == "saved-tensor-modified" and d.line == 14  # the forward's line that ran the ReLU
    line, label, block = line_replacement(d.fix)
    assert (line, label, block) == (10, "model.py", "self.act = nn.ReLU(inplace=False)"), d.fix
    fixed = apply_fix(d, source, path)
    exc, grads, tensors, after = run(fixed, path, captured=True)
    assert not problems(after)
    _assert_same((exc, grads, tensors), _clean(source, path), "model.py")


def test_an_inplace_layer_of_a_sequential_built_from_a_list_is_fixed_in_the_list():
    path = pathlib.Path(__file__).parent / "corpus" / "vqa_classifier_inplace_dropout_after_relu.py"
    sc = runner.load(str(path))
    d, _ = _the_fix(sc.source, sc.path)
    line, label, block = line_replacement(d.fix)
    assert sc.source.splitlines()[line - 1].strip() == "nn.Dropout(dropout, inplace=True),"
    assert block == "nn.Dropout(dropout, inplace=False),"
    exc, grads, tensors, after = run(apply_fix(d, sc.source, sc.path), sc.path, captured=True)
    assert not problems(after)
    _assert_same((exc, grads, tensors), _clean(sc.source, sc.path), path.name)


def test_an_inplace_module_whose_input_is_read_again_is_no_one_line_fix(tmp_path):
    source, path = _program(tmp_path, INPLACE_MODULE.replace("return self.act(h)", "y = self.act(h)\n"
                                                              "            return y * h"), "model.py")
    d, _ = _the_fix(source, path)
    assert fixes.NO_ONE_LINE_FIX in d.fix and line_replacement(d.fix) is None
    assert "On line 10 of model.py:\n    self.act = nn.ReLU(inplace=False)" in d.fix and "`h`" in d.fix, d.fix


BN_SYNC = """
    import torch
    from torch import nn

    world_size = 2


    def sync_running_stats(model):
        # dist.all_reduce(buf); buf /= world_size, in one process: the other rank's statistics are ones.
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                for buf in (m.running_mean, m.running_var):
                    buf.add_(torch.ones_like(buf))
                    buf /= world_size


    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    bn = net[1]
    for step in range(2):
        net(torch.randn(16, 4)).pow(2).mean().backward()
        loss = net(torch.randn(16, 4)).pow(2).mean()
        sync_running_stats(net)
        loss.backward()
    running_mean, running_var = bn.running_mean, bn.running_var
"""


def test_a_write_through_another_name_for_a_buffer_is_not_rebound(tmp_path):
    source, path = _program(tmp_path, BN_SYNC)
    d, outcome = _the_fix(source, path)
    assert outcome[0] is not None and "modified by an inplace operation" in outcome[0][1]
    assert d.kind == "saved-tensor-modified" and d.tensor == "net.1.running_mean" and d.line == 12
    # Rebinding `buf` would silence the error and leave the running statistics as they were: the
    # fix must not say it (the oracle below shows what it would do).
    assert replacement(d.fix) is None and line_replacement(d.fix) is None and "buf = buf" not in d.fix
    assert fixes.NO_ONE_LINE_FIX in d.fix and "`net.1.running_mean`, held by the module `net.1`" in d.fix
    assert "after the backward on line 23" in d.fix and "before line 21" in d.fix, d.fix
    clean = _clean(source, path)
    rebound = run(_replace_line(source, d.line, ["buf = buf.add(torch.ones_like(buf))"]), path)[:3]
    assert rebound[0] is None and not runner.close(
        {"running_var": rebound[2]["running_var"]}, {"running_var": clean[2]["running_var"]})
    # What the fix says to do, done: the sync moved after the backward.
    moved = source.replace("    sync_running_stats(net)\n    loss.backward()\n",
                           "    loss.backward()\n    sync_running_stats(net)\n")
    exc, grads, tensors, after = run(moved, path, captured=True)
    assert not problems(after)
    _assert_same((exc, grads, tensors), clean, "sync after backward")


def test_an_inplace_functional_call_still_changes_its_input():
    F_ = torch.nn.functional
    for line in ("F.relu(y, inplace=True)", "out = F.relu(y, inplace=True)", "y = F.relu(y, inplace=True)",
                 "out = F.dropout(y, 0.5, True, inplace=True)"):
        plain = {"F": F_, "y": torch.randn(5)}
        fixed = dict(plain, y=plain["y"].clone())
        torch.manual_seed(0)
        exec(line, plain)
        rewritten = rewrites.out_of_place(line)
        assert "inplace=False" in rewritten, line
        torch.manual_seed(0)
        exec(rewritten, fixed)
        assert torch.equal(plain["y"], fixed["y"]), (line, rewritten)
        if "out" in plain:
            assert torch.equal(plain["out"], fixed["out"]), (line, rewritten)


ITEM_CUT = """
    import torch
    from torch import nn


    class Scaler(nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(3))
            self.bias = nn.Parameter(torch.zeros(3))

        def forward(self, x):
            scale = torch.tensor(self.gain.mean().item())
            return x * scale + self.bias


    torch.manual_seed(0)
    model = Scaler()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).pow(2).sum().backward()
    opt.step()
    gain_grad = model.gain.grad
"""


def test_a_parameter_starved_by_item_is_told_to_stop_using_item(tmp_path):
    source, path = _program(tmp_path, ITEM_CUT)
    d, outcome = _the_fix(source, path)
    assert outcome[0] is None and d.kind == "missing-grad" and d.tensor == "model.gain" and d.line == 12
    assert "`.item()` on line 12" in d.fix, d.fix
    assert replacement(d.fix) == "scale = self.gain.mean()"
    exc, grads, tensors, after = run(apply_fix(d, source, path), path, captured=True)
    assert exc is None and not problems(after)
    assert "model.gain" in grads or "gain_grad" in tensors
    plain = {}
    exec(compile(apply_fix(d, source, path), str(path), "exec"), plain)
    assert plain["gain_grad"] is not None and torch.isfinite(plain["gain_grad"]).all()


def test_a_value_kept_without_its_graph_may_be_a_number_when_handed_in():
    # A meter's update(value, n) is fed `loss.item()` and loss tensors alike.
    assert rewrites.without_graph("total += ", "value * n", "") == "total += (value * n).detach()"
    block = rewrites.without_graph("history.append(", "value * n", ")", frozenset({"value", "n"}))
    for value in (2.0, torch.tensor(2.0, requires_grad=True) * 1):
        ns = {"torch": torch, "value": value, "n": 3, "history": []}
        exec(block, ns)
        (kept,) = ns["history"]
        assert kept == 6.0 and type(kept) is type(value) and getattr(kept, "grad_fn", None) is None, block


FREEZE_A_MIX = """
    import torch
    from torch import nn


    def freeze(tensors):
        for t in tensors.values():
            t.requires_grad = False


    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    x = torch.ones(3, requires_grad=True)
    feats = {"w": net.weight, "b": net.bias, "scaled": x * 2}
    freeze(feats)
    frozen = torch.tensor([p.requires_grad for p in net.parameters()])
"""


def test_a_flag_set_by_a_line_that_also_sets_it_on_leaves_is_not_rebound(tmp_path):
    source, path = _program(tmp_path, FREEZE_A_MIX)
    exc, _, _, trace = run(source, path, captured=True)
    assert exc is not None and "leaf variables" in exc[1]
    (d,) = problems(trace)
    assert d.kind == "nonleaf-requires-grad" and d.line == 7
    assert replacement(d.fix) is None and fixes.NO_ONE_LINE_FIX in d.fix and "`scaled`" not in d.fix, d.fix
    # Rebinding `t` runs, but takes the change away from the leaves it was meant for ...
    rebound = run(_replace_line(source, 7, ["t = t.detach()"]), path)
    assert rebound[0] is None and rebound[2]["frozen"] == [True, True]
    # ... which handing the helper a leaf, as the fix says, keeps.
    handed = run(source.replace('"scaled": x * 2', '"scaled": (x * 2).detach()'), path)
    assert handed[0] is None and handed[2]["frozen"] == [False, False]


MEMORY_BANK = """
    import torch
    from torch import nn


    class Memory(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 3)
            self.register_buffer("bank", torch.randn(3, 5))

        @torch.no_grad()
        def decay(self):
            self.bank.mul_(0.9)

        def forward(self, x):
            scores = self.proj(x) @ self.bank
            self.decay()
            return scores


    torch.manual_seed(0)
    memory = Memory()
    opt = torch.optim.SGD(memory.parameters(), lr=0.1)
    for step in range(3):
        loss = memory(torch.randn(2, 3)).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_buffer_the_forward_updates_is_read_as_a_copy_where_it_is_saved(tmp_path):
    source, path = _program(tmp_path, MEMORY_BANK, "memory.py")
    d, outcome = _the_fix(source, path)
    assert outcome[0] is not None and d.kind == "saved-tensor-modified" and d.line == 13
    line, label, block = line_replacement(d.fix)
    assert (line, label, block) == (16, "memory.py", "scores = self.proj(x) @ self.bank.clone()"), d.fix
    exc, grads, tensors, after = run(apply_fix(d, source, path), path, captured=True)
    assert not problems(after)
    # The oracle: the decay moved after each backward, where no graph needs the old values.
    moved = source.replace("        self.decay()\n", "").replace("    opt.step()\n", "    opt.step()\n    memory.decay()\n")
    assert "self.decay()" not in moved and "memory.decay()" in moved
    _assert_same((exc, grads, tensors), run(moved, path)[:3], "memory.py")
    assert "memory.bank" in tensors


TWO_EDITS = """
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    before = net.weight.detach().clone()
    emb = torch.randn(3)
    net.weight[0].add_(emb)
    net.weight[1] = -emb
    net(torch.ones(3)).sum().backward()
"""


def test_edits_of_one_leaf_on_lines_in_a_row_go_under_no_grad_together(tmp_path):
    source, path = _program(tmp_path, TWO_EDITS, "edit.py")
    d, outcome = _the_fix(source, path)
    assert outcome[0] is not None and d.kind == "leaf-inplace" and d.line == 8
    assert lines_replacement(d.fix)[:3] == (8, 9, "edit.py"), d.fix
    exc, grads, tensors, after = run(apply_fix(d, source, path), path, captured=True)
    assert exc is None and not problems(after)
    before, emb = torch.tensor(tensors["before"]).reshape(2, 3), torch.tensor(tensors["emb"])
    edited = torch.stack([before[0] + emb, -emb]).reshape(-1).tolist()
    assert runner.close({"w": tensors["net.weight"]}, {"w": edited})
    # d(sum(W x + b))/dW is x in every row, whatever W holds: the weight is still a trained leaf.
    assert runner.close({"w": grads["net.weight"]}, {"w": [1.0] * 6})


TALLIES = """
    import torch
    from torch import nn


    class Tally:
        def __init__(self):
            self.total = 0.0

        def add(self, value):
            self.total += value * 2


    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    tallies = [Tally(), Tally()]
    for step in range(4):
        loss = net(torch.randn(5, 3)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        for tally, value in zip(tallies, [loss.item(), loss]):
            tally.add(value)
    number, tensor = tallies[0].total, tallies[1].total
"""


def test_an_accumulator_fed_from_a_container_keeps_numbers_and_tensors(tmp_path):
    source, path = _program(tmp_path, TALLIES, "tally.py")
    d, _ = _the_fix(source, path)
    assert d.kind == "accumulated-graph" and d.line == 10, (d.kind, d.line)
    fixed = apply_fix(d, source, path)
    assert not problems(run(fixed, path, captured=True)[3])
    ends = []
    for program in (source, fixed):
        torch.manual_seed(0)
        ns = {"__name__": "__main__"}
        exec(compile(program, str(path), "exec"), ns)
        ends.append(ns)
    plain, after = ends
    assert type(after["number"]) is float and after["number"] == plain["number"]
    assert after["tensor"].grad_fn is None and torch.equal(after["tensor"], plain["tensor"].detach())
